package waiter_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
)

// gateRecorder is a *throttle.Limiter whose Hold and Pass calls are put in one order
// (seq), so that a test can tell exactly, without timing, whether a request's last
// Pass began after this process was held: such a request must not be sent before the
// hold ends.
type gateRecorder struct {
	*throttle.Limiter
	mu    sync.Mutex
	seq   int64
	holds []holdRecord
}

type holdRecord struct {
	seq   int64     // when Hold returned
	until time.Time // when the hold ends (at the earliest)
}

// tracked is what the test knows of one request; it rides in the request's context.
type tracked struct {
	id           int
	passStart    atomic.Int64 // seq when its last Pass began
	held         atomic.Bool  // a Pass of it reported held
	reserveStart atomic.Int64 // UnixNano when its last Reserve began
	sentAt       atomic.Int64 // UnixNano when the base transport got it
}

type trackedKey struct{}

func (g *gateRecorder) Hold(d time.Duration) {
	start := time.Now()
	g.Limiter.Hold(d)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.seq++
	g.holds = append(g.holds, holdRecord{seq: g.seq, until: start.Add(d)})
}

func (g *gateRecorder) Reserve(ctx context.Context, n int, maxWait time.Duration) (*waiter.Reservation, error) {
	if tr, ok := ctx.Value(trackedKey{}).(*tracked); ok {
		tr.reserveStart.Store(time.Now().UnixNano())
	}
	return g.Limiter.Reserve(ctx, n, maxWait)
}

func (g *gateRecorder) Pass(ctx context.Context) (bool, error) {
	if tr, ok := ctx.Value(trackedKey{}).(*tracked); ok {
		g.mu.Lock()
		g.seq++
		tr.passStart.Store(g.seq)
		g.mu.Unlock()
		held, err := g.Limiter.Pass(ctx)
		if held {
			tr.held.Store(true)
		}
		return held, err
	}
	return g.Limiter.Pass(ctx)
}

// violations returns the requests whose last Pass began after a Hold returned and
// that were sent before that hold ended.
func (g *gateRecorder) violations(reqs []*tracked) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var bad []string
	for _, r := range reqs {
		sent := time.Unix(0, r.sentAt.Load())
		for _, h := range g.holds {
			if r.sentAt.Load() != 0 && r.passStart.Load() > h.seq && sent.Before(h.until) {
				bad = append(bad, fmt.Sprintf("request %d sent %v before the end of a hold it passed after", r.id, h.until.Sub(sent)))
			}
		}
	}
	return bad
}

// holdCount returns how many times Hold was called.
func (g *gateRecorder) holdCount() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.holds)
}

// heldBefore reports whether request r's last Pass began before the first Hold
// returned: it was on its way before this process read the answer that held it.
func (g *gateRecorder) heldBefore(r *tracked) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.holds) == 0 || r.passStart.Load() < g.holds[0].seq
}

// stampSent is a base transport that notes when each tracked request is sent.
func stampSent(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if tr, ok := req.Context().Value(trackedKey{}).(*tracked); ok {
			tr.sentAt.Store(time.Now().UnixNano())
		}
		return base.RoundTrip(req)
	})
}

// sendTracked sends requests GETs to url from workers goroutines, each request
// carrying a *tracked in its context and its id in X-Req, and counts the statuses.
func sendTracked(t *testing.T, client *http.Client, url string, workers, requests int) (map[int]int, []*tracked) {
	t.Helper()
	reqs := make([]*tracked, requests)
	var (
		mu       sync.Mutex
		next     int
		statuses = map[int]int{}
		wg       sync.WaitGroup
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if next == requests {
					mu.Unlock()
					return
				}
				tr := &tracked{id: next}
				reqs[next] = tr
				next++
				mu.Unlock()
				req, err := http.NewRequestWithContext(context.WithValue(context.Background(), trackedKey{}, tr), http.MethodGet, url, nil)
				if err != nil {
					t.Error(err)
					return
				}
				req.Header.Set("X-Req", strconv.Itoa(tr.id))
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				statuses[resp.StatusCode]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return statuses, reqs
}

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
// holds this process and pauses the shared limiter, no request that passed the gate
// after the hold is sent before it ends, every request the server received inside the
// window it asked for had passed the gate before the transport read the 429, sending
// resumes after the pause, and a limiter of the same key on another client sees it.
//
// The server leaves out its Date header and sets the transport's clock so that its
// date (whole seconds) lies 300ms ahead: a short pause without sleeping seconds.
// The limiter spaces permits 50ms apart; ten workers book ahead, so a pause moves
// their bookings.
//
// No timing is assumed for the first two checks: the gate's order is recorded
// (gateRecorder). Tolerance: the first grant after the pause takes effect within
// 25ms of the pause's end in Redis (no later than Pause's return plus the pause),
// by Redis's clock: the waiters booked again while Pause ran, so only the
// microsecond rounding of the scripts and the gap between Pause's script and its
// return count. When that request reaches the server is reported (0.2-24ms later
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
		srv := newTrackingServer(t, func(i int, w http.ResponseWriter) {
			if i != busyAt {
				return
			}
			now := time.Now()
			at := now.Truncate(time.Second).Add(2 * time.Second)
			clock.set(at.Add(-pause))
			w.Header()["Date"] = nil // so the date counts from the transport's clock
			w.Header().Set("Retry-After", at.Format(http.TimeFormat))
			w.WriteHeader(http.StatusTooManyRequests)
			answered.Store(now.UnixNano())
		})
		grants := redistest.RecordGrants(b.Client)
		lim := &gateRecorder{Limiter: newLimiter(t, b, "retry-after", throttle.Every(spacing))}
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
					// another process sees the pause
					res, err := other.Allow(context.Background())
					if err != nil || res.Allowed {
						t.Errorf("other client's limiter during the pause: %+v, %v; want denied", res, err)
					}
					otherWait, sinceAnswer = res.RetryAfter, time.Since(time.Unix(0, answered.Load()))
				},
				BadRetryAfter: func(_ *http.Request, _ int, err error) { t.Errorf("BadRetryAfter: %v", err) },
			}))
		client := &http.Client{Transport: tr}

		statuses, reqs := sendTracked(t, client, srv.URL, workers, requests)
		if got, want := statuses[http.StatusTooManyRequests], 1; got != want {
			t.Fatalf("statuses %v, want exactly one 429", statuses)
		}
		if !reflect.DeepEqual(pauses, []time.Duration{pause}) {
			t.Fatalf("paused %v, want once for %v", pauses, pause)
		}
		if got := lim.holdCount(); got != 1 {
			t.Fatalf("the transport held this process %d times, want once", got)
		}
		for _, v := range lim.violations(reqs) {
			t.Error(v)
		}
		t429 := time.Unix(0, answered.Load())
		inside := srv.inside(t429.Add(time.Nanosecond), t429.Add(pause))
		for _, id := range inside {
			if !lim.heldBefore(reqs[id]) {
				t.Errorf("request %d reached the server inside the pause, having passed the gate after the 429 was read", id)
			}
		}
		firstAfter := srv.firstFrom(t429.Add(pause))
		// Redis's pause ends pause after its script ran, which is no later than when
		// Pause returned (on a loaded machine that call alone took 330ms once). The
		// waiters the pause moved booked again while it ran, so the first grant after
		// it takes effect at its end by Redis's clock, whatever the scheduling; when
		// the request then reaches the server is scheduling, reported, not asserted.
		end := t429.Add(pause)
		if e := pausedAt.Add(pause); e.After(end) {
			end = e
		}
		var firstGrant time.Time
		for _, g := range grants.List() {
			if g.At.After(t429) {
				firstGrant = g.At
				break
			}
		}
		t.Logf("%s: 429 at +0, Pause returned at +%v, %d requests on their way before it was read reached the server inside the pause, first grant after it at +%v, first request at +%v (%v after the pause asked for)",
			b.Kind, pausedAt.Sub(t429), len(inside), firstGrant.Sub(t429), firstAfter.Sub(t429), firstAfter.Sub(t429.Add(pause)))
		if late := firstGrant.Sub(end); late > resumeBy {
			t.Errorf("the first grant after the pause took effect %v after its end in Redis, want within %v", late, resumeBy)
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
// (the proxy holds the pause script's call back 250ms, most of the 300ms pause):
// requests whose permits fall due meanwhile are held by this process's gate, not
// sent. Checked exactly, without timing (gateRecorder): no request that passed the
// gate after the hold was sent before its end, and every request the server received
// inside the pause had passed the gate before the 429 was read.
func TestTransportGateUnderSlowRedis(t *testing.T) {
	const (
		workers  = 32
		requests = 120
		spacing  = 5 * ms
		pause    = 300 * ms
		slow     = 250 * ms
		busyAt   = 30
	)
	b := redistest.NewStandalone(t)
	proxy, err := redistest.NewProxy(b.Client.(*redis.Client).Options().Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr})
	defer rdb.Close()
	ctx := context.Background()
	if err := lua.Pause.Script().Load(ctx, rdb).Err(); err != nil { // so its calls are EVALSHA <hash>
		t.Fatal(err)
	}
	proxy.Delay(lua.Pause.Script().Hash(), slow)

	clock := &settableClock{}
	var answered atomic.Int64
	srv := newTrackingServer(t, func(i int, w http.ResponseWriter) {
		if i != busyAt {
			return
		}
		now := time.Now()
		at := now.Truncate(time.Second).Add(2 * time.Second)
		clock.set(at.Add(-pause))
		w.Header()["Date"] = nil
		w.Header().Set("Retry-After", at.Format(http.TimeFormat))
		w.WriteHeader(http.StatusTooManyRequests)
		answered.Store(now.UnixNano())
	})
	l, err := throttle.New(rdb, "slow-pause", throttle.Every(spacing), throttle.WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	lim := &gateRecorder{Limiter: l}
	var pausedAfter time.Duration
	tr := waiter.NewTransport(lim, stampSent(nil), waiter.WithTransportClock(clock),
		waiter.WithTransportHooks(waiter.TransportHooks{
			Paused: func(*http.Request, int, time.Duration) {
				pausedAfter = time.Since(time.Unix(0, answered.Load()))
			},
		}))
	statuses, reqs := sendTracked(t, &http.Client{Transport: tr}, srv.URL, workers, requests)
	if got, want := statuses[http.StatusTooManyRequests], 1; got != want {
		t.Fatalf("statuses %v, want exactly one 429", statuses)
	}
	if got := lim.holdCount(); got != 1 {
		t.Fatalf("the transport held this process %d times, want once", got)
	}
	for _, v := range lim.violations(reqs) {
		t.Error(v)
	}
	t429 := time.Unix(0, answered.Load())
	inside := srv.inside(t429.Add(time.Nanosecond), t429.Add(pause))
	for _, id := range inside {
		if !lim.heldBefore(reqs[id]) {
			t.Errorf("request %d reached the server inside the pause, having passed the gate after the 429 was read", id)
		}
	}
	held := 0
	for _, r := range reqs {
		if r.held.Load() {
			held++
		}
	}
	first := srv.firstFrom(t429.Add(time.Nanosecond))
	redistest.Figure(t, "%d workers, a permit every %v, Pause's Redis call slowed to %v (returned %v after the 429): %d requests received inside the %v pause (all on their way before the 429 was read); %d requests held by the gate; first request after the 429 received at +%v",
		workers, spacing, slow, pausedAfter.Round(ms), len(inside), pause, held, first.Sub(t429).Round(ms))
}
