package waiter_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
)

const ms = time.Millisecond

// t0 is the fixed time the Retry-After table runs at.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// ---- unit tests: no Redis ----

// How each answer's Retry-After turns into a pause (or none) and what BadHeader is
// told, on a Reserver that can pause and a clock stopped at t0 (plus clock).
func TestTransportRetryAfter(t *testing.T) {
	date := func(d time.Duration) string { return t0.Add(d).Format(http.TimeFormat) }
	const (
		tooLong = "Retry-After: longer than the cap"
		past    = "Retry-After: in the past"
		invalid = "Retry-After: unreadable"
		skewed  = "Date: too far from the local clock"
	)
	for _, c := range []headerCase{
		{name: "seconds", status: 429, header: map[string]string{"Retry-After": "120"}, pause: 120 * time.Second},
		{name: "seconds on 503", status: 503, header: map[string]string{"Retry-After": "7"}, pause: 7 * time.Second},
		{name: "seconds with spaces and zeros", status: 429, header: map[string]string{"Retry-After": " 007 "}, pause: 7 * time.Second},
		{name: "zero: retry now", status: 429, header: map[string]string{"Retry-After": "0"}},
		{name: "seconds at the cap", status: 429, header: map[string]string{"Retry-After": "300"}, pause: 5 * time.Minute},
		{name: "seconds above the cap", status: 429, header: map[string]string{"Retry-After": "301"}, pause: 5 * time.Minute, bad: tooLong},
		{name: "seconds overflowing", status: 503, header: map[string]string{"Retry-After": "99999999999999999999999"}, pause: 5 * time.Minute, bad: tooLong},
		{name: "negative", status: 429, header: map[string]string{"Retry-After": "-5"}, bad: past},
		{name: "minus zero: retry now", status: 429, header: map[string]string{"Retry-After": "-0"}},
		{name: "decimal (Shopify)", status: 429, header: map[string]string{"Retry-After": "2.0"}, pause: 2 * time.Second},
		{name: "fraction", status: 429, header: map[string]string{"Retry-After": "1.5"}, pause: 1500 * ms},
		{name: "fraction below a nanosecond rounds up", status: 429, header: map[string]string{"Retry-After": "0.0000000001"}, pause: 1},
		{name: "fraction above the cap", status: 429, header: map[string]string{"Retry-After": "300.0000000001"}, pause: 5 * time.Minute, bad: tooLong},
		{name: "decimal zero", status: 429, header: map[string]string{"Retry-After": "0.000"}},
		{name: "negative decimal", status: 429, header: map[string]string{"Retry-After": "-1.5"}, bad: past},
		{name: "decimal overflowing", status: 429, header: map[string]string{"Retry-After": "99999999999999999999.5"}, pause: 5 * time.Minute, bad: tooLong},
		{name: "trailing dot", status: 429, header: map[string]string{"Retry-After": "1."}, bad: invalid},
		{name: "leading dot", status: 429, header: map[string]string{"Retry-After": ".5"}, bad: invalid},
		{name: "two dots", status: 429, header: map[string]string{"Retry-After": "1.2.3"}, bad: invalid},
		{name: "exponent", status: 429, header: map[string]string{"Retry-After": "1e3"}, bad: invalid},
		{name: "NaN", status: 429, header: map[string]string{"Retry-After": "NaN"}, bad: invalid},
		{name: "infinity", status: 429, header: map[string]string{"Retry-After": "-Inf"}, bad: invalid},
		{name: "comma", status: 429, header: map[string]string{"Retry-After": "1,5"}, bad: invalid},
		{name: "plus sign", status: 429, header: map[string]string{"Retry-After": "+5"}, bad: invalid},
		{name: "words", status: 429, header: map[string]string{"Retry-After": "soon"}, bad: invalid},
		{name: "empty", status: 429, header: map[string]string{"Retry-After": ""}, bad: invalid},
		{name: "missing on 429", status: 429, bad: "Retry-After: missing"},
		{name: "missing on 503", status: 503, bad: "Retry-After: missing"},
		{name: "date from the clock", status: 429, header: map[string]string{"Retry-After": date(90 * time.Second)}, pause: 90 * time.Second},
		{name: "Date agrees: from the clock, finer than Date", status: 429, clock: 700 * ms, // Date cuts the 700ms off
			header: map[string]string{"Retry-After": date(30 * time.Second), "Date": date(0)}, pause: 29300 * ms},
		{name: "Date a second ahead agrees", status: 429,
			header: map[string]string{"Retry-After": date(30 * time.Second), "Date": date(time.Second)}, pause: 30 * time.Second},
		{name: "server clock 5s ahead: from its Date", status: 429,
			header: map[string]string{"Retry-After": date(35 * time.Second), "Date": date(5 * time.Second)}, pause: 30 * time.Second},
		{name: "server clock 10s behind: from its Date", status: 429,
			header: map[string]string{"Retry-After": date(20 * time.Second), "Date": date(-10 * time.Second)}, pause: 30 * time.Second},
		{name: "Date 11s ahead: from the clock", status: 429,
			header: map[string]string{"Retry-After": date(41 * time.Second), "Date": date(11 * time.Second)}, pause: 41 * time.Second, bad: skewed},
		{name: "Date an hour ahead: a valid date still counts", status: 429,
			header: map[string]string{"Retry-After": date(30 * time.Second), "Date": date(time.Hour)}, pause: 30 * time.Second, bad: skewed},
		{name: "Date an hour behind: 2s stays 2s", status: 503,
			header: map[string]string{"Retry-After": date(2 * time.Second), "Date": date(-time.Hour)}, pause: 2 * time.Second, bad: skewed},
		{name: "Date an hour ahead, date with it: cut to the cap", status: 429,
			header: map[string]string{"Retry-After": date(time.Hour + 30*time.Second), "Date": date(time.Hour)}, pause: 5 * time.Minute, bad: skewed + "; " + tooLong},
		{name: "Date far off, delay-seconds: Date not read", status: 429,
			header: map[string]string{"Retry-After": "3", "Date": date(-24 * time.Hour)}, pause: 3 * time.Second},
		{name: "unparsable Date: from the clock", status: 429,
			header: map[string]string{"Retry-After": date(40 * time.Second), "Date": "yesterday"}, pause: 40 * time.Second},
		{name: "RFC 850 date", status: 429, header: map[string]string{"Retry-After": t0.Add(time.Minute).Format(time.RFC850)}, pause: time.Minute},
		{name: "asctime date", status: 503, header: map[string]string{"Retry-After": t0.Add(2 * time.Minute).Format(time.ANSIC)}, pause: 2 * time.Minute},
		{name: "date now", status: 429, header: map[string]string{"Retry-After": date(0)}},
		{name: "date in the past", status: 429, header: map[string]string{"Retry-After": date(-time.Minute)}, bad: past},
		{name: "date before the response's Date", status: 429,
			header: map[string]string{"Retry-After": date(3 * time.Second), "Date": date(5 * time.Second)}, bad: past},
		{name: "date above the cap", status: 429, header: map[string]string{"Retry-After": date(24 * time.Hour)}, pause: 5 * time.Minute, bad: tooLong},
		{name: "date far away", status: 429, header: map[string]string{"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, pause: 5 * time.Minute, bad: tooLong},
		{name: "403 with Retry-After (GitHub's secondary limit)", status: 403, header: map[string]string{"Retry-After": "60"}, pause: time.Minute},
		{name: "403 with a bad Retry-After", status: 403, header: map[string]string{"Retry-After": "later"}, bad: invalid},
		{name: "403 without: an ordinary answer", status: 403},
		{name: "200 is not a throttle", status: 200, header: map[string]string{"Retry-After": "10"}},
		{name: "500 is not a throttle", status: 500, header: map[string]string{"Retry-After": "10"}},
		{name: "301 with Retry-After", status: 301, header: map[string]string{"Retry-After": "10"}},
		{name: "401 with Retry-After", status: 401, header: map[string]string{"Retry-After": "10"}},
		{name: "200 without Retry-After", status: 200},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t) })
	}
}

// WithMaxPause moves the cap; WithPermits sets what each request takes.
func TestTransportOptions(t *testing.T) {
	r := &fakePauser{}
	var bad *waiter.HeaderError
	tr := waiter.NewTransport(r, answer(429, map[string]string{"Retry-After": "3"}),
		waiter.WithMaxPause(2500*ms), waiter.WithPermits(3),
		waiter.WithTransportHooks(waiter.TransportHooks{BadHeader: func(_ *http.Request, _ int, err *waiter.HeaderError) { bad = err }}))
	if _, err := tr.RoundTrip(newRequest(t, context.Background(), nil)); err != nil {
		t.Fatal(err)
	}
	if got, want := r.pauses(), []time.Duration{2500 * ms}; !reflect.DeepEqual(got, want) {
		t.Errorf("paused %v, want %v", got, want)
	}
	want := &waiter.HeaderError{Header: "Retry-After", Value: "3", Problem: "longer than the cap", Pause: 2500 * ms}
	if !reflect.DeepEqual(bad, want) {
		t.Errorf("BadHeader got %#v, want %#v", bad, want)
	}
	if got, want := bad.Error(), `waiter: Retry-After "3": longer than the cap; paused 2.5s`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if got, want := r.ns(), []int{3}; !reflect.DeepEqual(got, want) {
		t.Errorf("reserved %v permits, want %v", got, want)
	}
}

// A Reserver that cannot pause: responses pass through, hooks still report bad
// headers; a Pause that fails is reported and changes nothing in the response.
func TestTransportWithoutPause(t *testing.T) {
	t.Run("not a Pauser", func(t *testing.T) {
		r := &fakeReserver{}
		var bad badLog
		tr := waiter.NewTransport(r, answer(429, map[string]string{"Retry-After": "soon"}),
			waiter.WithTransportHooks(waiter.TransportHooks{
				BadHeader: bad.hook,
				Paused:    func(*http.Request, int, time.Duration) { t.Error("Paused called, want no pause") },
			}))
		resp, err := tr.RoundTrip(newRequest(t, context.Background(), nil))
		if err != nil || resp.StatusCode != 429 {
			t.Fatalf("RoundTrip: %v %v, want the 429", resp, err)
		}
		bad.check(t, "Retry-After: unreadable", 0)
		tr = waiter.NewTransport(r, answer(429, map[string]string{"Retry-After": "5"}))
		if resp, err := tr.RoundTrip(newRequest(t, context.Background(), nil)); err != nil || resp.StatusCode != 429 {
			t.Fatalf("RoundTrip: %v %v, want the 429", resp, err)
		}
	})
	t.Run("Pause fails", func(t *testing.T) {
		boom := errors.New("redis is down")
		r := &fakePauser{pauseErr: boom}
		var failed error
		tr := waiter.NewTransport(r, answer(503, map[string]string{"Retry-After": "5"}),
			waiter.WithTransportHooks(waiter.TransportHooks{
				PauseFailed: func(_ *http.Request, d time.Duration, err error) {
					if d != 5*time.Second {
						t.Errorf("PauseFailed got %v, want 5s", d)
					}
					failed = err
				},
				Paused: func(*http.Request, int, time.Duration) { t.Error("Paused called after a failed pause") },
			}))
		resp, err := tr.RoundTrip(newRequest(t, context.Background(), nil))
		if err != nil || resp.StatusCode != 503 {
			t.Fatalf("RoundTrip: %v %v, want the 503", resp, err)
		}
		if !errors.Is(failed, boom) {
			t.Errorf("PauseFailed got %v, want %v", failed, boom)
		}
	})
	// The Pause call is bounded by the Reserver's own call bound only: neither the
	// request's cancellation or deadline nor a bound of the transport's ends it.
	t.Run("Pause outlives the request's context", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		r := &fakePauser{}
		base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			cancel() // the caller gives up as the answer arrives
			return answer(429, map[string]string{"Retry-After": "5"})(req)
		})
		if _, err := waiter.NewTransport(r, base).RoundTrip(newRequest(t, ctx, nil)); err != nil {
			t.Fatal(err)
		}
		if got, want := r.pauses(), []time.Duration{5 * time.Second}; !reflect.DeepEqual(got, want) {
			t.Errorf("paused %v, want %v", got, want)
		}
		if r.pauseCtxErr != nil {
			t.Errorf("Pause ran with a done context: %v", r.pauseCtxErr)
		}
		if r.pauseDeadline {
			t.Errorf("Pause ran with a deadline, want none: its call is bounded by the Reserver's own")
		}
	})
}

// Every early return closes the request's body, leaves the request as it was, sends
// nothing, reports NotSent and returns an error the caller can test for.
func TestTransportEarlyReturns(t *testing.T) {
	boom := errors.New("redis is down")
	var nilLimiter *throttle.Limiter
	cases := []struct {
		name string
		r    waiter.Reserver
		opts []waiter.TransportOption
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{name: "Reserver fails", r: &fakeReserver{err: boom}, want: boom},
		{name: "context done", r: &fakeReserver{}, want: context.Canceled,
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx, cancel
			}},
		{name: "permits come after the deadline", r: &fakeReserver{refuse: time.Hour}, want: waiter.ErrWouldExceedDeadline,
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), time.Minute)
			}},
		{name: "nil Reserver", r: nil, want: waiter.ErrNilReserver},
		{name: "nil *throttle.Limiter", r: nilLimiter, want: waiter.ErrNilReserver},
		{name: "zero permits", r: &fakeReserver{}, opts: []waiter.TransportOption{waiter.WithPermits(0)}, want: waiter.ErrInvalidOption},
		{name: "zero max pause", r: &fakeReserver{}, opts: []waiter.TransportOption{waiter.WithMaxPause(0)}, want: waiter.ErrInvalidOption},
		{name: "nil clock", r: &fakeReserver{}, opts: []waiter.TransportOption{waiter.WithTransportClock(nil)}, want: waiter.ErrInvalidOption},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if c.ctx != nil {
				ctx, cancel = c.ctx()
			}
			defer cancel()
			var sent int
			base := roundTripFunc(func(*http.Request) (*http.Response, error) {
				sent++
				return nil, errors.New("sent")
			})
			var notSent error
			opts := append(c.opts, waiter.WithTransportHooks(waiter.TransportHooks{
				NotSent: func(_ *http.Request, err error) { notSent = err },
			}))
			body := &closeRecorder{Reader: strings.NewReader("payload")}
			req := newRequest(t, ctx, body)
			before := snapshot(req)
			resp, err := waiter.NewTransport(c.r, base, opts...).RoundTrip(req)
			if !errors.Is(err, c.want) || resp != nil {
				t.Fatalf("RoundTrip: %v, %v; want nil, %v", resp, err, c.want)
			}
			if got := body.closed.Load(); got != 1 {
				t.Errorf("body closed %d times, want 1", got)
			}
			if sent != 0 {
				t.Errorf("the request was sent %d times, want none", sent)
			}
			if !errors.Is(notSent, c.want) {
				t.Errorf("NotSent got %v, want %v", notSent, c.want)
			}
			if after := snapshot(req); !reflect.DeepEqual(before, after) {
				t.Errorf("request changed:\n got %+v\nwant %+v", after, before)
			}
		})
	}
}

// ---- against Redis: a local server that enforces its own limit ----

// Many goroutines sending through one Transport: the limiter's grants never exceed
// its limit in any window (checked on the grants the scripts made, by Redis's clock),
// every request is sent, and the server's view (its receive times) is reported: the
// time between a permit taking effect and its request arriving is the machine's
// scheduling, which a busy machine can bunch, so it is a figure, not an assertion.
func TestTransportStaysUnderServerLimit(t *testing.T) {
	const (
		workers  = 16
		requests = 40
		rate     = 10
		period   = 100 * ms
	)
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		grants := redistest.RecordGrants(b.Client)
		srv := newRecordingServer(t, func(int, http.ResponseWriter, *recordingServer) {})
		lim := newLimiter(t, b, "under", throttle.Limit{Rate: rate, Period: period})
		client := &http.Client{Transport: waiter.NewTransport(lim, nil)}
		statuses, _ := sendTracked(t, client, srv.URL, workers, requests)
		if got := statuses[http.StatusOK]; got != requests {
			t.Fatalf("statuses %v, want %d × 200", statuses, requests)
		}
		if got := grants.MaxInWindow(period); got > rate {
			t.Errorf("%d grants took effect in one %v window, limit %d", got, period, rate)
		}
		t.Logf("%s: %d requests, most granted in any %v: %d, most received by the server: %d (limit %d)",
			b.Kind, requests, period, grants.MaxInWindow(period), srv.maxInWindow(period), rate)
	})
}

// A 503 asking for an hour is cut to the cap: the shared limiter is paused for the
// cap (another client sees it), and BadHeader says so. The other client's wait is
// checked against the time that passed since the request began (the pause began
// after it), not a guessed margin.
func TestTransportCapsRetryAfter(t *testing.T) {
	const limit = 2 * time.Second
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		srv := newRecordingServer(t, func(i int, w http.ResponseWriter, s *recordingServer) {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(http.StatusServiceUnavailable)
		})
		lim := newLimiter(t, b, "capped", throttle.PerSecond(100))
		var bad badLog
		client := &http.Client{Transport: waiter.NewTransport(lim, nil, waiter.WithMaxPause(limit),
			waiter.WithTransportHooks(waiter.TransportHooks{BadHeader: bad.hook}))}
		start := time.Now()
		resp, err := client.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got, want := resp.StatusCode, http.StatusServiceUnavailable; got != want {
			t.Fatalf("status %d, want %d", got, want)
		}
		bad.check(t, "Retry-After: longer than the cap", limit)
		res, err := otherClient(t, b, "capped", throttle.PerSecond(100)).Allow(context.Background())
		if elapsed := time.Since(start); err != nil || res.Allowed || res.RetryAfter > limit || res.RetryAfter < limit-elapsed {
			t.Errorf("other client %v after the request began: %+v, %v; want denied for the rest of %v", elapsed, res, err, limit)
		}
	})
}

// A request whose context ends while it waits for its permit returns at once with
// the context's error, is not sent, closes its body and leaves nothing booked: its
// booking is given back in the background.
//
// The cancellation comes once the waiting request has booked (the limiter's Allowed
// hook says so), not after a guessed sleep. RoundTrip must return before the slot it
// booked, 2s away, comes: one that waited for it fails. The give-back is awaited by
// its event (the Cancelled hook), then the permits that stand are counted.
func TestTransportCancelWhileWaiting(t *testing.T) {
	const slot = 2 * time.Second
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		grants := redistest.RecordGrants(b.Client)
		srv := newRecordingServer(t, func(int, http.ResponseWriter, *recordingServer) {})
		booked := make(chan time.Duration, 2)
		gaveBack := make(chan struct{}, 1)
		lim, err := throttle.New(b.Client, "cancel", throttle.Every(slot), throttle.WithKeyPrefix(b.Prefix),
			throttle.WithHooks(throttle.Hooks{
				Allowed:   func(_ string, _ int, wait time.Duration) { booked <- wait },
				Cancelled: func(string, int) { gaveBack <- struct{}{} },
			}))
		if err != nil {
			t.Fatal(err)
		}
		tr := waiter.NewTransport(lim, nil)
		ctx := context.Background()
		resp, err := tr.RoundTrip(newRequestTo(t, ctx, srv.URL, nil)) // takes the only permit
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		<-booked

		waiting, cancel := context.WithCancel(ctx)
		body := &closeRecorder{Reader: strings.NewReader("payload")}
		req := newRequestTo(t, waiting, srv.URL, body)
		done := make(chan error, 1)
		called := time.Now()
		go func() {
			_, err := tr.RoundTrip(req)
			done <- err
		}()
		wait := <-booked
		slotAt := called.Add(wait) // its script ran after the call: the slot comes no earlier
		if wait <= 0 {             // it has booked the next slot and sleeps
			t.Fatalf("the second request was granted at once (wait %v), want a booking ahead", wait)
		}
		cancel()
		err = <-done
		if returned := time.Now(); !returned.Before(slotAt) {
			t.Errorf("RoundTrip returned %v after its slot could come, want before: it waited for the permit", returned.Sub(slotAt))
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("RoundTrip: %v, want context.Canceled", err)
		}
		if got := body.closed.Load(); got != 1 {
			t.Errorf("body closed %d times, want 1", got)
		}
		if got, want := len(srv.times()), 1; got != want {
			t.Errorf("the server got %d requests, want %d", got, want)
		}
		select {
		case <-gaveBack:
		case <-time.After(30 * time.Second):
			t.Fatalf("the cancelled booking was not given back within 30s")
		}
		if got, want := grants.Total(), 1; got != want {
			t.Errorf("%d permits stand, want %d: the cancelled booking was not given back", got, want)
		}
	})
}

// ---- helpers ----

// recordingServer is a local HTTP server that records when each request arrived
// and lets the test decide the answer (200 unless the handler writes another).
type recordingServer struct {
	*httptest.Server
	mu  sync.Mutex
	got []time.Time
}

func newRecordingServer(t *testing.T, answer func(i int, w http.ResponseWriter, s *recordingServer)) *recordingServer {
	t.Helper()
	s := &recordingServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.got = append(s.got, time.Now())
		i := len(s.got)
		s.mu.Unlock()
		answer(i, w, s)
	}))
	t.Cleanup(s.Close)
	return s
}

// times returns the receive times, in order.
func (s *recordingServer) times() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.got...)
}

// maxInWindow returns the most requests that arrived in any window [s, s+d).
func (s *recordingServer) maxInWindow(d time.Duration) int {
	return redistest.MaxTimesInWindow(s.times(), d)
}

// fakeReserver books at once (or, with refuse, refuses with that delay), or fails
// with err; it records the n of each call.
type fakeReserver struct {
	mu     sync.Mutex
	n      []int
	err    error
	refuse time.Duration
}

func (r *fakeReserver) Reserve(ctx context.Context, n int, maxWait time.Duration) (*waiter.Reservation, error) {
	r.mu.Lock()
	r.n = append(r.n, n)
	r.mu.Unlock()
	if r.err != nil {
		return nil, r.err
	}
	if r.refuse > 0 {
		return waiter.NewReservation(false, r.refuse, nil), nil
	}
	return waiter.NewReservation(true, 0, nil), nil
}

func (r *fakeReserver) reserves() int { return len(r.ns()) }

func (r *fakeReserver) ns() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.n...)
}

// fakePauser is a fakeReserver that records its pauses (or fails them with pauseErr).
type fakePauser struct {
	fakeReserver
	paused        []time.Duration
	pauseErr      error
	pauseCtxErr   error
	pauseDeadline bool // the last Pause's context had a deadline
}

func (r *fakePauser) Pause(ctx context.Context, d time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pauseCtxErr = ctx.Err()
	_, r.pauseDeadline = ctx.Deadline()
	if r.pauseErr != nil {
		return r.pauseErr
	}
	r.paused = append(r.paused, d)
	return nil
}

func (r *fakePauser) pauses() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.paused...)
}

func newRequestTo(t *testing.T, ctx context.Context, url string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Test", "1")
	return req
}

// snapshot is what of a request a RoundTripper must leave alone.
type reqSnapshot struct {
	Method, URL, Host string
	Header            http.Header
	Body              io.ReadCloser
	ContentLength     int64
	Ctx               context.Context
}

func snapshot(req *http.Request) reqSnapshot {
	return reqSnapshot{req.Method, req.URL.String(), req.Host, req.Header.Clone(), req.Body, req.ContentLength, req.Context()}
}

// closeRecorder is a request body that counts its Close calls.
type closeRecorder struct {
	io.Reader
	closed atomic.Int32
}

func (c *closeRecorder) Close() error {
	c.closed.Add(1)
	return nil
}

// script is a base transport that answers the i-th request (from 0) with
// statuses[i] (the last one for every request after), each with headers; it records
// the bodies it was sent and counts the closes of the bodies it answered with.
type script struct {
	statuses []int
	headers  map[string]string
	mu       sync.Mutex
	bodies   []string
	answered []*closeRecorder
}

func (s *script) RoundTrip(req *http.Request) (*http.Response, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var body string
	if req.Body != nil {
		b, _ := io.ReadAll(req.Body)
		req.Body.Close()
		body = string(b)
	}
	s.bodies = append(s.bodies, body)
	status := s.statuses[min(len(s.bodies)-1, len(s.statuses)-1)]
	h := http.Header{}
	for k, v := range s.headers {
		h.Set(k, v)
	}
	rb := &closeRecorder{Reader: strings.NewReader("answer")}
	s.answered = append(s.answered, rb)
	return &http.Response{StatusCode: status, Header: h, Body: rb, Request: req}, nil
}

func (s *script) sent() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.bodies...)
}

// closes returns how many times each answer's body was closed, in order.
func (s *script) closes() []int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var c []int32
	for _, b := range s.answered {
		c = append(c, b.closed.Load())
	}
	return c
}

// WithRetries: a replayable request answered 429 or 503 is sent again after the pause,
// at most n times; each discarded answer is closed; a body without GetBody, another
// status, or no retries asked for returns the answer as received.
func TestTransportRetries(t *testing.T) {
	getBody := func(t *testing.T) *http.Request { // http.NewRequest sets GetBody for a strings.Reader
		t.Helper()
		return newRequest(t, context.Background(), strings.NewReader("payload"))
	}
	cases := []struct {
		name     string
		statuses []int
		retries  int
		req      func(t *testing.T) *http.Request
		sends    int
		status   int     // of the response returned
		closes   []int32 // of each answer's body: discarded ones 1, the returned one 0
	}{
		{"off by default", []int{429, 200}, 0, getBody, 1, 429, []int32{0}},
		{"429 then 200", []int{429, 200}, 3, getBody, 2, 200, []int32{1, 0}},
		{"503 then 200", []int{503, 200}, 1, getBody, 2, 200, []int32{1, 0}},
		{"no body", []int{429, 429, 200}, 3, func(t *testing.T) *http.Request {
			return newRequest(t, context.Background(), nil)
		}, 3, 200, []int32{1, 1, 0}},
		{"at most n", []int{429}, 2, getBody, 3, 429, []int32{1, 1, 0}},
		{"500 is not retried", []int{500, 200}, 3, getBody, 1, 500, []int32{0}},
		{"body without GetBody: as received", []int{429, 200}, 3, func(t *testing.T) *http.Request {
			return newRequest(t, context.Background(), &closeRecorder{Reader: strings.NewReader("payload")})
		}, 1, 429, []int32{0}},
		{"GetBody fails: as received, no permits taken for the retry", []int{429, 200}, 3, func(t *testing.T) *http.Request {
			req := getBody(t)
			req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("body gone") }
			return req
		}, 1, 429, []int32{0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := &fakePauser{}
			base := &script{statuses: c.statuses, headers: map[string]string{"Retry-After": "1"}}
			var retried []int
			tr := waiter.NewTransport(g, base, waiter.WithRetries(c.retries),
				waiter.WithTransportHooks(waiter.TransportHooks{
					Retrying: func(_ *http.Request, _ int, retry int) { retried = append(retried, retry) },
				}))
			req := c.req(t)
			before := snapshot(req)
			resp, err := tr.RoundTrip(req)
			if err != nil || resp.StatusCode != c.status {
				t.Fatalf("RoundTrip: %v, %v; want a %d", resp, err, c.status)
			}
			sent := base.sent()
			if len(sent) != c.sends {
				t.Fatalf("sent %d times, want %d", len(sent), c.sends)
			}
			for i, b := range sent {
				if req.Body != nil && b != "payload" {
					t.Errorf("send %d carried %q, want the whole body", i, b)
				}
			}
			if got := base.closes(); !reflect.DeepEqual(got, c.closes) {
				t.Errorf("answer bodies closed %v times, want %v", got, c.closes)
			}
			if got, want := len(retried), c.sends-1; got != want {
				t.Errorf("Retrying called %d times, want %d", got, want)
			}
			if got, want := g.reserves(), c.sends; got != want {
				t.Errorf("%d reservations, want %d (each send waits for its permits)", got, want)
			}
			if after := snapshot(req); !reflect.DeepEqual(before, after) {
				t.Errorf("request changed:\n got %+v\nwant %+v", after, before)
			}
		})
	}
	t.Run("context ends while the retry waits", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		base := &script{statuses: []int{429}, headers: map[string]string{"Retry-After": "5"}}
		cancelling := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := base.RoundTrip(req)
			cancel() // the caller gives up as the answer arrives
			return resp, err
		})
		r := &fakeReserver{} // cannot pause: the transport sleeps out the pause itself
		resp, err := waiter.NewTransport(r, cancelling, waiter.WithRetries(3)).RoundTrip(newRequest(t, ctx, nil))
		if !errors.Is(err, context.Canceled) || resp != nil {
			t.Fatalf("RoundTrip: %v, %v; want context.Canceled", resp, err)
		}
		if got, want := base.closes(), []int32{1}; !reflect.DeepEqual(got, want) {
			t.Errorf("answer bodies closed %v times, want %v", got, want)
		}
	})
	t.Run("the pause ends after the deadline: as received", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		base := &script{statuses: []int{503, 200}, headers: map[string]string{"Retry-After": "120"}}
		resp, err := waiter.NewTransport(&fakeReserver{}, base, waiter.WithRetries(3)).RoundTrip(newRequest(t, ctx, nil))
		if err != nil || resp.StatusCode != 503 {
			t.Fatalf("RoundTrip: %v, %v; want the 503 as received", resp, err)
		}
		if got, want := base.closes(), []int32{0}; !reflect.DeepEqual(got, want) {
			t.Errorf("answer bodies closed %v times, want %v", got, want)
		}
	})
	t.Run("negative", func(t *testing.T) {
		tr := waiter.NewTransport(&fakeReserver{}, answer(200, nil), waiter.WithRetries(-1))
		if _, err := tr.RoundTrip(newRequest(t, context.Background(), nil)); !errors.Is(err, waiter.ErrInvalidOption) {
			t.Errorf("RoundTrip with WithRetries(-1): %v, want ErrInvalidOption", err)
		}
	})
}

// NewTransportFunc: each request waits on the Reserver chosen for it, with the permits
// chosen (0: the transport's); a 429 pauses only that one; a failed choice sends
// nothing.
func TestTransportFunc(t *testing.T) {
	search, rest := &fakePauser{}, &fakePauser{}
	boom := errors.New("no limit for this host")
	choose := func(req *http.Request) (waiter.Reserver, int, error) {
		switch req.URL.Path {
		case "/search":
			return search, 2, nil
		case "/items":
			return rest, 0, nil
		case "/nil":
			return nil, 1, nil
		case "/negative":
			return rest, -1, nil
		}
		return nil, 0, boom
	}
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if req.URL.Path == "/search" {
			return answer(429, map[string]string{"Retry-After": "9"})(req)
		}
		return answer(200, nil)(req)
	})
	var notSent []error
	tr := waiter.NewTransportFunc(choose, base, waiter.WithPermits(3),
		waiter.WithTransportHooks(waiter.TransportHooks{NotSent: func(_ *http.Request, err error) { notSent = append(notSent, err) }}))
	for _, c := range []struct {
		path   string
		status int
		err    error
	}{
		{"/items", 200, nil},
		{"/search", 429, nil},
		{"/other", 0, boom},
		{"/nil", 0, waiter.ErrNilReserver},
		{"/negative", 0, waiter.ErrInvalidOption},
	} {
		body := &closeRecorder{Reader: strings.NewReader("payload")}
		resp, err := tr.RoundTrip(newRequestTo(t, context.Background(), "http://127.0.0.1:1"+c.path, body))
		if c.err != nil {
			if !errors.Is(err, c.err) || resp != nil {
				t.Errorf("%s: %v, %v; want %v", c.path, resp, err, c.err)
			}
			if body.closed.Load() != 1 {
				t.Errorf("%s: body closed %d times, want 1", c.path, body.closed.Load())
			}
			continue
		}
		if err != nil || resp.StatusCode != c.status {
			t.Errorf("%s: %v, %v; want %d", c.path, resp, err, c.status)
		}
	}
	if got, want := search.ns(), []int{2}; !reflect.DeepEqual(got, want) {
		t.Errorf("search reserved %v, want %v", got, want)
	}
	if got, want := rest.ns(), []int{3}; !reflect.DeepEqual(got, want) {
		t.Errorf("rest reserved %v, want %v (0 chosen: WithPermits)", got, want)
	}
	if got, want := search.pauses(), []time.Duration{9 * time.Second}; !reflect.DeepEqual(got, want) {
		t.Errorf("search paused %v, want %v", got, want)
	}
	if got := rest.pauses(); len(got) != 0 {
		t.Errorf("rest paused %v, want none", got)
	}
	if len(notSent) != 3 {
		t.Errorf("NotSent called %d times, want 3", len(notSent))
	}
	if _, err := waiter.NewTransportFunc(nil, base).RoundTrip(newRequest(t, context.Background(), nil)); !errors.Is(err, waiter.ErrNilReserver) {
		t.Errorf("nil choose: %v, want ErrNilReserver", err)
	}
}

// Through a local vendor that refuses each request's first send (429, Retry-After: 0):
// with WithRetries(2), every replayable request comes back 200 after one retry, and
// no request whose body cannot be replayed (no GetBody) is sent twice: it returns
// the 429 as received.
func TestTransportRetriesOverHTTP(t *testing.T) {
	const each = 20
	b := redistest.NewMiniRealTime(t)
	var (
		mu    sync.Mutex
		sends = map[string]int{}
	)
	vendor := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id := r.Header.Get("X-Req")
		mu.Lock()
		sends[id]++
		first := sends[id] == 1
		mu.Unlock()
		if string(body) != "payload "+id {
			t.Errorf("request %s carried %q", id, body)
		}
		if first {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer vendor.Close()
	lim := newLimiter(t, b, "retries", throttle.PerSecond(1000))
	client := &http.Client{Transport: waiter.NewTransport(lim, nil, waiter.WithRetries(2))}
	statuses := map[string]map[int]int{"replayable": {}, "not replayable": {}}
	for i := 0; i < 2*each; i++ {
		id := strconv.Itoa(i)
		kind := "replayable"
		var body io.Reader = strings.NewReader("payload " + id) // http.NewRequest sets GetBody
		if i%2 == 1 {
			kind, body = "not replayable", io.MultiReader(strings.NewReader("payload "+id)) // no GetBody
		}
		req, err := http.NewRequest(http.MethodPost, vendor.URL, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Req", id)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		statuses[kind][resp.StatusCode]++
	}
	resentWithoutGetBody := 0
	for id, n := range sends {
		if i, _ := strconv.Atoi(id); i%2 == 1 && n > 1 {
			resentWithoutGetBody++
		}
	}
	redistest.Figure(t, "WithRetries(2), each request's first send refused 429: %d replayable requests ended %v; %d without GetBody ended %v, %d of them sent again",
		each, statuses["replayable"], each, statuses["not replayable"], resentWithoutGetBody)
	if got := statuses["replayable"][http.StatusOK]; got != each {
		t.Errorf("%d replayable requests ended 200, want %d", got, each)
	}
	if got := statuses["not replayable"][http.StatusTooManyRequests]; got != each || resentWithoutGetBody != 0 {
		t.Errorf("requests without GetBody: %d returned 429 as received, %d sent again; want %d and 0", got, resentWithoutGetBody, each)
	}
}
