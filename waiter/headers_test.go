package waiter_test

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/waiter"
)

// badLog records what TransportHooks.BadHeader was called with.
type badLog struct {
	mu  sync.Mutex
	got []*waiter.HeaderError
}

func (l *badLog) hook(_ *http.Request, _ int, err *waiter.HeaderError) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, err)
}

// String returns the calls as "Header: problem" joined by "; ", "" for none.
func (l *badLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var s []string
	for _, e := range l.got {
		s = append(s, fmt.Sprintf("%s: %v", e.Header, e.Problem))
	}
	return strings.Join(s, "; ")
}

// check fails the test unless BadHeader got want ("Header: problem; …") and every
// HeaderError that says a pause was set all the same says pause.
func (l *badLog) check(t *testing.T, want string, pause time.Duration) {
	t.Helper()
	if got := l.String(); got != want {
		t.Errorf("BadHeader got %q, want %q", got, want)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.got {
		switch e.Problem {
		case "longer than the cap", "too far from the local clock":
			if e.Pause != pause {
				t.Errorf("%v: Pause %v, want %v, the pause set", e, e.Pause, pause)
			}
		default:
			if e.Pause != 0 {
				t.Errorf("%v: Pause %v, want 0 (nothing was paused)", e, e.Pause)
			}
		}
	}
}

// headerCase is one answer and what the transport must make of it, on a clock stopped
// at t0 + clock.
type headerCase struct {
	name   string
	status int
	header map[string]string
	pause  time.Duration // 0: Pause not called
	bad    string        // what BadHeader gets, as badLog.String
	clock  time.Duration // the local clock, from t0
}

// run sends one request, answered c, through a transport with opts over a Reserver
// that can pause, and checks the pause and the reports.
func (c headerCase) run(t *testing.T, opts ...waiter.TransportOption) {
	t.Helper()
	r := &fakePauser{}
	var bad badLog
	var paused []time.Duration
	opts = append(opts, waiter.WithTransportClock(stoppedClock(t0.Add(c.clock))),
		waiter.WithTransportHooks(waiter.TransportHooks{
			BadHeader: func(req *http.Request, status int, err *waiter.HeaderError) {
				if status != c.status {
					t.Errorf("BadHeader got status %d, want %d", status, c.status)
				}
				bad.hook(req, status, err)
			},
			Paused: func(_ *http.Request, _ int, d time.Duration) { paused = append(paused, d) },
		}))
	resp, err := waiter.NewTransport(r, answer(c.status, c.header), opts...).RoundTrip(newRequest(t, context.Background(), nil))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resp.StatusCode, c.status; got != want {
		t.Fatalf("status %d, want %d as the server answered", got, want)
	}
	var want []time.Duration
	if c.pause > 0 {
		want = []time.Duration{c.pause}
	}
	if got := r.pauses(); !reflect.DeepEqual(got, want) {
		t.Errorf("paused %v, want %v", got, want)
	}
	if !reflect.DeepEqual(paused, want) {
		t.Errorf("Paused hook got %v, want %v", paused, want)
	}
	bad.check(t, c.bad, c.pause)
	if got, want := r.reserves(), 1; got != want {
		t.Errorf("%d reservations, want %d", got, want)
	}
}

// Whatever a server sends, the transport neither panics nor pauses beyond the cap, and
// each report names a header and a known problem. Seeded with the tables' hostile values.
func FuzzTransportHeaders(f *testing.F) {
	for _, s := range []struct {
		status         int
		name, v, date  string
		remain, resetV string
	}{
		{429, "Retry-After", "2.0", "", "", ""},
		{429, "Retry-After", "-1.5", "", "", ""},
		{503, "Retry-After", "99999999999999999999.5", "", "", ""},
		{429, "Retry-After", "Fri, 31 Dec 9999 23:59:59 GMT", "Mon, 01 Jan 0001 00:00:00 GMT", "", ""},
		{403, "Retry-After", "0.0000000001", "", "0", "1767323045"},
		{200, "X-Ratelimit-Reset-Requests", "99999999999999999h", "", "0", ""},
		{200, "X-Ratelimit-Reset", "99999999999999", "", "0", "1.5"},
		{200, "Anthropic-Ratelimit-Requests-Reset", "9999-12-31T23:59:59Z", "", "0", ""},
		{200, "Ratelimit", `"a";r=0;t=99999999999999999999999, "b";r=-1`, "", "", ""},
		{200, "X-Ratelimit-Reset-Tokens", "1d1d1d", "", "", ""},
	} {
		f.Add(s.status, s.name, s.v, s.date, s.remain, s.resetV)
	}
	const maxPause = 5 * time.Minute
	problems := map[string]bool{"missing": true, "unreadable": true, "in the past": true,
		"longer than the cap": true, "too far from the local clock": true}
	f.Fuzz(func(t *testing.T, status int, name, v, date, remaining, reset string) {
		if status < 100 || status > 999 {
			return
		}
		h := map[string]string{name: v, "Date": date}
		for _, n := range []string{"X-RateLimit-Remaining", "X-RateLimit-Remaining-Requests", "Anthropic-RateLimit-Requests-Remaining", "X-RateLimit-Remaining-Tokens"} {
			if n != http.CanonicalHeaderKey(name) {
				h[n] = remaining
			}
		}
		for _, n := range []string{"X-RateLimit-Reset", "X-RateLimit-Reset-Requests", "Anthropic-RateLimit-Requests-Reset", "X-RateLimit-Reset-Tokens"} {
			if n != http.CanonicalHeaderKey(name) {
				h[n] = reset
			}
		}
		r := &fakePauser{}
		var bad badLog
		tr := waiter.NewTransport(r, answer(status, h), waiter.WithRateLimitHeaders(1), waiter.WithMaxPause(maxPause),
			waiter.WithTransportClock(stoppedClock(t0)),
			waiter.WithTransportHooks(waiter.TransportHooks{BadHeader: bad.hook}))
		if _, err := tr.RoundTrip(newRequest(t, context.Background(), nil)); err != nil {
			t.Fatal(err)
		}
		for _, d := range r.pauses() {
			if d <= 0 || d > maxPause {
				t.Errorf("paused %v, want within (0, %v]", d, maxPause)
			}
		}
		bad.mu.Lock()
		defer bad.mu.Unlock()
		for _, e := range bad.got {
			if e.Header == "" || !problems[e.Problem] ||
				e.Pause < 0 || e.Pause > maxPause || e.Error() == "" {
				t.Errorf("malformed report %#v", e)
			}
		}
	})
}
