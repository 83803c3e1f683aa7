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
		case waiter.HeaderTooLong, waiter.HeaderDateSkewed:
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

// run sends one request through a transport with opts, over a Gate answering c, and
// checks the pause, the hold and the reports.
func (c headerCase) run(t *testing.T, opts ...waiter.TransportOption) {
	t.Helper()
	r := &fakeGate{}
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
	if got := r.holds(); !reflect.DeepEqual(got, want) {
		t.Errorf("held %v, want %v (each pause holds this process first)", got, want)
	}
	if !reflect.DeepEqual(paused, want) {
		t.Errorf("Paused hook got %v, want %v", paused, want)
	}
	bad.check(t, c.bad, c.pause)
	if got, want := r.reserves(), 1; got != want {
		t.Errorf("%d reservations, want %d", got, want)
	}
}
