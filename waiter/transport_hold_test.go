package waiter_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
)

// arrivals is what a test server saw: the receive time of each request by X-Req.
type arrivals struct {
	mu sync.Mutex
	at map[int]time.Time
}

func (a *arrivals) note(r *http.Request) {
	id, err := strconv.Atoi(r.Header.Get("X-Req"))
	if err != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.at == nil {
		a.at = map[int]time.Time{}
	}
	a.at[id] = time.Now()
}

// inside returns the ids received in [from, to).
func (a *arrivals) inside(from, to time.Time) []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []int
	for id, at := range a.at {
		if !at.Before(from) && at.Before(to) {
			ids = append(ids, id)
		}
	}
	return ids
}

// The server answers one request with 429 and a Retry-After HTTP-date: the transport
// holds this process and pauses the shared limiter, no request whose WaitN began after
// the hold was set is sent before it ends, every request the server received inside the
// window it asked for had begun its WaitN before the transport read the 429, sending
// resumes after the pause, and a limiter of the same key on another client sees it.
//
// The server leaves out its Date header and sets the transport's clock so that its
// date (whole seconds) lies 300ms ahead: a short pause without sleeping seconds.
// The limiter spaces permits 50ms apart; ten workers book ahead, so a pause moves
// their bookings.
//
// No timing is assumed for the first two checks: the order of the hold and the WaitN
// calls is recorded (holdRecorder). Tolerance: the first grant after the pause takes effect within
// 25ms of the pause's end in Redis (no later than Pause's return plus the pause), or
// of its script's run if that came later (a waiter woken late), by Redis's clock:
// only the microsecond rounding of the scripts and the gap between Pause's script
// and its return count. When that request reaches the server is reported (0.2-24ms later
// when idle).
func TestTransportHonoursRetryAfter(t *testing.T) {
	const (
		workers  = 10
		requests = 20
		pause    = 300 * ms
		spacing  = 50 * ms
		busyAt   = 4 // the request the server answers with 429
		resumeBy = 25 * ms
	)
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		clock := &settableClock{}
		var answered atomic.Int64 // UnixNano when the 429 was written
		srv := newTrackingServer(t, retryAfterAt(busyAt, pause, clock, &answered))
		grants := redistest.RecordGrants(b.Client)
		lim := &holdRecorder{Limiter: newLimiter(t, b, "retry-after", throttle.Every(spacing))}
		var (
			mu       sync.Mutex
			pausedAt time.Time
			pauses   []time.Duration
		)
		other := otherClient(t, b, "retry-after", throttle.Every(spacing))
		var otherWait, sinceAnswer time.Duration
		tr := waiter.NewTransport(lim, stampSent(nil), waiter.WithTransportClock(clock),
			waiter.WithTransportHooks(waiter.TransportHooks{
				Paused: func(_ *http.Request, status int, d time.Duration) {
					mu.Lock()
					defer mu.Unlock()
					pausedAt = time.Now()
					pauses = append(pauses, d)
					// Another process sees the pause: its call is denied if its script ran
					// before the pause's end. The pause ends pause after its script ran,
					// which was after the 429 was written, so a reply read before
					// 429 + pause comes from a script that ran inside it. A reply read
					// later may come from a script the starved machine ran after the pause
					// (a new client's first call took over 300ms at load 17): allowed then.
					t429 := time.Unix(0, answered.Load())
					res, err := other.Allow(context.Background())
					replied := time.Now()
					if err != nil || res.Allowed && replied.Before(t429.Add(pause)) {
						t.Errorf("other client's limiter during the pause: %+v, %v, read %v after the 429; want denied", res, err, replied.Sub(t429))
					} else if res.Allowed {
						t.Logf("other client's limiter allowed, its reply read %v after the 429, after the %v pause", replied.Sub(t429), pause)
					}
					otherWait, sinceAnswer = res.RetryAfter, replied.Sub(t429)
				},
				BadHeader:   func(_ *http.Request, _ int, err *waiter.HeaderError) { t.Errorf("BadHeader: %v", err) },
				PauseFailed: func(_ *http.Request, d time.Duration, err error) { t.Errorf("Pause(%v) failed: %v", d, err) },
			}))
		client := &http.Client{Transport: tr}

		statuses, reqs := sendTracked(t, client, srv.URL, workers, requests)
		if got, want := statuses[http.StatusTooManyRequests], 1; got != want {
			t.Fatalf("statuses %v, want exactly one 429", statuses)
		}
		if !reflect.DeepEqual(pauses, []time.Duration{pause}) {
			t.Fatalf("paused %v, want once for %v", pauses, pause)
		}
		t429 := time.Unix(0, answered.Load())
		inside := lim.check(t, reqs, srv, t429, pause)
		firstAfter := srv.firstFrom(t429.Add(pause))
		// Redis's pause ends pause after its script ran, which is no later than when
		// Pause returned. Every worker books when this process's hold ends (it began
		// before Pause's script ran, so before Redis's pause ends), after the moved
		// ones gave their slots back, so the first grant after it takes effect at its
		// end by Redis's clock, whatever the scheduling; when the request then reaches
		// the server is scheduling, reported, not asserted.
		end := t429.Add(pause)
		if e := pausedAt.Add(pause); e.After(end) {
			end = e
		}
		var firstGrant, ran time.Time     // ran: when its script ran, by Redis's clock
		for _, g := range grants.List() { // in the order replies were read, not by At: two round trips may fly
			if g.At.After(t429) && (firstGrant.IsZero() || g.At.Before(firstGrant)) {
				firstGrant, ran = g.At, g.At.Add(-g.Wait)
			}
		}
		t.Logf("%s: 429 at +0, Pause returned at +%v, %d requests whose WaitN began before it was read reached the server inside the pause (%d requests returned from WaitN after the hold was set and were sent before its end), first grant after it at +%v (its script ran at +%v), first request at +%v (%v after the pause asked for)",
			b.Kind, pausedAt.Sub(t429), len(inside), lim.returnedInside(reqs), firstGrant.Sub(t429), ran.Sub(t429), firstAfter.Sub(t429), firstAfter.Sub(t429.Add(pause)))
		// The limiter's part: the grant takes effect at the pause's end, or, when the
		// waiter's call to book again came after it (its wake-up at the hold's end and
		// its call were late: a starved machine's scheduling), when that call's script
		// ran. How late the call came is reported, not asserted.
		from := end
		if ran.After(from) {
			from = ran
		}
		if late := firstGrant.Sub(from); late > resumeBy {
			t.Errorf("the first grant after the pause took effect %v after its end in Redis or its script's run, whichever was later (script ran %v after the end), want within %v", late, ran.Sub(end), resumeBy)
		}
		if otherWait < pause-sinceAnswer {
			t.Errorf("other client's limiter would wait %v, %v after the 429; want at least the rest of the %v pause", otherWait, sinceAnswer, pause)
		}
	})
}

// trackingServer is a local HTTP server that notes when each request arrived (by its
// X-Req id) and lets the test decide the answer (200 unless the handler writes another).
type trackingServer struct {
	URL string
	arrivals
	mu sync.Mutex
	n  int
}

func newTrackingServer(t *testing.T, answer func(i int, w http.ResponseWriter)) *trackingServer {
	t.Helper()
	s := &trackingServer{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.note(r)
		s.mu.Lock()
		s.n++
		i := s.n
		s.mu.Unlock()
		answer(i, w)
	}))
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// retryAfterAt is a trackingServer's answer: request busyAt gets a 429 with a
// Retry-After HTTP-date and no Date header, and clock (the transport's) is set pause
// before that date, so the transport pauses for pause without the test sleeping
// whole seconds; answered gets when the 429 was written (UnixNano).
func retryAfterAt(busyAt int, pause time.Duration, clock *settableClock, answered *atomic.Int64) func(int, http.ResponseWriter) {
	return func(i int, w http.ResponseWriter) {
		if i != busyAt {
			return
		}
		now := time.Now()
		at := now.Truncate(time.Second).Add(2 * time.Second)
		clock.set(at.Add(-pause))
		w.Header()["Date"] = nil // so the date counts from the transport's clock
		w.Header().Set("Retry-After", at.Format(http.TimeFormat))
		answered.Store(now.UnixNano()) // before the transport can read the answer
		w.WriteHeader(http.StatusTooManyRequests)
	}
}

// check fails the test unless the transport held this process once, no request whose
// WaitN began after the hold was set was sent before it ended, and every request srv
// received inside the pause (after the 429 at t429) had begun its WaitN before the
// hold. It returns the ids of those requests.
func (g *holdRecorder) check(t *testing.T, reqs []*tracked, srv *trackingServer, t429 time.Time, pause time.Duration) (inside []int) {
	t.Helper()
	if got := g.holdCount(); got != 1 {
		t.Fatalf("the transport held this process %d times, want once", got)
	}
	for _, v := range g.violations(reqs) {
		t.Error(v)
	}
	inside = srv.inside(t429.Add(time.Nanosecond), t429.Add(pause))
	for _, id := range inside {
		if !g.heldBefore(reqs[id]) {
			t.Errorf("request %d reached the server inside the pause, its WaitN having begun after the 429 held this process", id)
		}
	}
	return inside
}

// firstFrom returns the earliest arrival at or after from.
func (a *arrivals) firstFrom(from time.Time) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	var first time.Time
	for _, at := range a.at {
		if !at.Before(from) && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	return first
}

// Many goroutines send through one transport while Redis is slow to take the pause
// (the proxy holds back the pause's call 250ms, most of the 300ms pause): requests
// whose permits fall due meanwhile are held by this process's hold, not sent. Checked
// exactly, without timing (holdRecorder): no request whose WaitN began after the hold
// was set was sent before its end, and every request the server received inside the
// pause had begun its WaitN before the hold.
func TestTransportHoldUnderSlowRedis(t *testing.T) {
	const (
		workers  = 32
		requests = 120
		spacing  = 5 * ms
		pause    = 300 * ms
		slow     = 250 * ms
		busyAt   = 30
	)
	b, proxy, rdb := redistest.NewProxied(t)
	// The pause's call is the only one that carries its request, "p 300000 q<the fair
	// share's queue>" (its length, 300000µs), as an argument of its own (internal/protocol).
	proxy.Delay("\r\np 300000 q", slow)

	clock := &settableClock{}
	var answered atomic.Int64
	srv := newTrackingServer(t, retryAfterAt(busyAt, pause, clock, &answered))
	l, err := throttle.New(rdb, "slow-pause", throttle.Every(spacing), throttle.WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	lim := &holdRecorder{Limiter: l}
	var pausedAfter time.Duration
	tr := waiter.NewTransport(lim, stampSent(nil), waiter.WithTransportClock(clock),
		waiter.WithTransportHooks(waiter.TransportHooks{
			Paused: func(*http.Request, int, time.Duration) {
				pausedAfter = time.Since(time.Unix(0, answered.Load()))
			},
			PauseFailed: func(_ *http.Request, d time.Duration, err error) { t.Errorf("Pause(%v) failed: %v", d, err) },
		}))
	statuses, reqs := sendTracked(t, &http.Client{Transport: tr}, srv.URL, workers, requests)
	if got, want := statuses[http.StatusTooManyRequests], 1; got != want {
		t.Fatalf("statuses %v, want exactly one 429", statuses)
	}
	t429 := time.Unix(0, answered.Load())
	inside := lim.check(t, reqs, srv, t429, pause)
	held := 0
	for _, r := range reqs {
		if !lim.heldBefore(r) {
			held++
		}
	}
	if pausedAfter < slow {
		t.Errorf("Pause returned %v after the 429, want at least the %v the proxy held its call back: the slow call was not the pause's", pausedAfter, slow)
	}
	first := srv.firstFrom(t429.Add(time.Nanosecond))
	redistest.Figure(t, "%d workers, a permit every %v, Pause's Redis call slowed to %v (returned %v after the 429): %d requests received inside the %v pause (all begun before the 429 was read); %d requests returned from WaitN after the hold was set and were sent before its end; %d began their WaitN during the hold; first request after the 429 received at +%v",
		workers, spacing, slow, pausedAfter.Round(ms), len(inside), pause, lim.returnedInside(reqs), held, first.Sub(t429).Round(ms))
}

// pausing is a Reserver that grants at once and pauses p: a transport over it reads
// answers for p's key without taking p's permits.
type pausing struct {
	p interface {
		Pause(ctx context.Context, d time.Duration) error
	}
}

func (pausing) Reserve(context.Context, int, time.Duration) (*waiter.Reservation, error) {
	return waiter.NewReservation(true, 0, nil), nil
}

func (r pausing) Pause(ctx context.Context, d time.Duration) error { return r.p.Pause(ctx, d) }

// A 429 holds this process's waiters at once: one asleep on a booking ahead (A), one
// whose booking is on its way back from Redis as the hold begins (B: the 429 is read
// in the hook that reports B's booking, before B sleeps on it), and one that begins
// during the hold (C). None returns before the hold ends; A's and B's bookings are
// given back (whether a give-back came before its booking took effect is scheduling,
// reported), and this process books nothing while it is held: every booking it made
// during the hold's life was sent after its end.
//
// Checked by events, not timing: the hold is ordered with the calls by holdRecorder's
// mark, the bookings by their send times (Grants). A is checked when its booking came
// due after the hold was set: it is due a spacing after it was made, and the hold is
// set a round trip later (reported when it is not).
func TestTransportHoldMovesWaiters(t *testing.T) {
	const (
		spacing = 100 * ms
		pause   = 300 * ms
	)
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		grants := redistest.RecordGrants(b.Client)
		var (
			lim       *holdRecorder
			tr        http.RoundTripper
			allowed   atomic.Int32
			before    []redistest.Grant // the first permit, A's and B's bookings, by time
			aBooked   = make(chan struct{})
			holding   = make(chan struct{})
			paused    []time.Duration
			pauseErrs []error
		)
		l, err := throttle.New(b.Client, "moves", throttle.Every(spacing), throttle.WithKeyPrefix(b.Prefix),
			throttle.WithHooks(throttle.Hooks{Allowed: func(string, int, time.Duration) {
				switch allowed.Add(1) {
				case 2:
					close(aBooked)
				case 3: // B's booking is in hand and B does not sleep on it yet: the 429 comes
					before = grants.List()
					resp, err := tr.RoundTrip(newRequest(t, context.Background(), nil))
					if err != nil || resp.StatusCode != http.StatusTooManyRequests {
						t.Errorf("RoundTrip: %v, %v; want the 429", resp, err)
					}
					close(holding)
				}
			}}))
		if err != nil {
			t.Fatal(err)
		}
		lim = &holdRecorder{Limiter: l}
		tr = waiter.NewTransport(pausing{lim}, answer(429, map[string]string{"Retry-After": "0.3"}),
			waiter.WithTransportHooks(waiter.TransportHooks{
				Paused:      func(_ *http.Request, _ int, d time.Duration) { paused = append(paused, d) },
				PauseFailed: func(_ *http.Request, _ time.Duration, err error) { pauseErrs = append(pauseErrs, err) },
			}))
		ctx := context.Background()
		if err := lim.WaitN(ctx, 1); err != nil { // the first permit, at once
			t.Fatal(err)
		}
		type returned struct {
			at  time.Time
			err error
		}
		wait := func() <-chan returned {
			ch := make(chan returned, 1)
			go func() {
				err := lim.WaitN(ctx, 1)
				ch <- returned{time.Now(), err}
			}()
			return ch
		}
		a := wait()
		<-aBooked
		bw := wait()
		<-holding
		cw := wait()
		ra, rb, rc := <-a, <-bw, <-cw

		if !reflect.DeepEqual(paused, []time.Duration{pause}) || len(pauseErrs) > 0 {
			t.Fatalf("paused %v (failed: %v), want once for %v", paused, pauseErrs, pause)
		}
		holds := lim.held()
		if len(holds) != 1 || len(before) != 3 {
			t.Fatalf("%d holds and %d bookings before it, want 1 and 3", len(holds), len(before))
		}
		h := holds[0]
		aAt, bAt := before[1].At, before[2].At
		for _, c := range []struct {
			name  string
			r     returned
			check bool
		}{{"A (asleep)", ra, aAt.After(h.setAt)}, {"B (booking on its way)", rb, true}, {"C (began during the hold)", rc, true}} {
			switch {
			case c.r.err != nil:
				t.Errorf("%s: WaitN: %v", c.name, c.r.err)
			case c.check && c.r.at.Before(h.until):
				t.Errorf("%s returned %v before the hold's end", c.name, h.until.Sub(c.r.at))
			}
		}
		tried := map[time.Time]bool{} // give-backs tried, by the booking's time: whether they took
		for _, gb := range grants.GiveBacks() {
			tried[gb.At] = gb.OK
		}
		for _, c := range []struct {
			name  string
			at    time.Time
			check bool
		}{{"A", aAt, aAt.After(h.setAt)}, {"B", bAt, true}} {
			if _, ok := tried[c.at]; c.check && !ok {
				t.Errorf("%s's booking at %v was not given back", c.name, c.at.Sub(h.setAt))
			}
		}
		for _, g := range grants.List() {
			if !g.Sent.Before(h.setAt) && g.Sent.Before(h.until) {
				t.Errorf("a booking at %v was sent %v into the hold, want none during it", g.At.Sub(h.setAt), g.Sent.Sub(h.setAt))
			}
		}
		redistest.Figure(t, "%s: A's booking due %v after the hold was set (checked: %v), given back: %v; B's due %v after, given back: %v; A, B, C returned %v, %v, %v after the hold's end",
			b.Kind, aAt.Sub(h.setAt).Round(ms), aAt.After(h.setAt), tried[aAt], bAt.Sub(h.setAt).Round(ms), tried[bAt],
			ra.at.Sub(h.until).Round(ms), rb.at.Sub(h.until).Round(ms), rc.at.Sub(h.until).Round(ms))
	})
}
