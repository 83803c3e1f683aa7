package waiter_test

// Helpers shared by the package's external tests (gate_test.go, transport_test.go,
// ratelimit_test.go, fleet_test.go). A helper used by one test file stays in that file.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/clock"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
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

// newLimiter returns a sliding-window limiter under the backend's test prefix.
func newLimiter(t *testing.T, b *redistest.Backend, key string, limit throttle.Limit) *throttle.Limiter {
	t.Helper()
	l, err := throttle.New(b.Client, key, limit, throttle.WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// otherClient returns a limiter of key on a client of its own ("another process"
// as far as Redis and this process's pause signals can tell).
func otherClient(t *testing.T, b *redistest.Backend, key string, limit throttle.Limit) *throttle.Limiter {
	t.Helper()
	c := redistest.Dial(b.Addrs())
	t.Cleanup(func() { c.Close() })
	l, err := throttle.New(c, key, limit, throttle.WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// answer is a base transport that answers every request with status and headers.
func answer(status int, headers map[string]string) roundTripFunc {
	return func(req *http.Request) (*http.Response, error) {
		h := http.Header{}
		for k, v := range headers {
			h.Set(k, v)
		}
		return &http.Response{
			Status: fmt.Sprintf("%d %s", status, http.StatusText(status)), StatusCode: status,
			Header: h, Body: io.NopCloser(strings.NewReader("")), Request: req,
		}, nil
	}
}

func newRequest(t *testing.T, ctx context.Context, body io.Reader) *http.Request {
	t.Helper()
	return newRequestTo(t, ctx, "http://127.0.0.1:1/x?y=z", body)
}

// stoppedClock is a clock.Clock whose Now stands still; its timers are real.
type stoppedClock time.Time

func (c stoppedClock) Now() time.Time { return time.Time(c) }

func (c stoppedClock) NewTimer(d time.Duration) clock.Timer { return clock.System.NewTimer(d) }

// settableClock is a clock.Clock whose Now the test sets; its timers are real.
type settableClock struct{ now atomic.Int64 }

func (c *settableClock) set(t time.Time) { c.now.Store(t.UnixNano()) }

func (c *settableClock) Now() time.Time { return time.Unix(0, c.now.Load()) }

func (c *settableClock) NewTimer(d time.Duration) clock.Timer { return clock.System.NewTimer(d) }

// fakeGate is a fakePauser that is also a Gate: it records the order of its calls,
// and Pass reports held once after each Hold not followed by a Pause (the permits
// fell inside the hold), at once: it does not sleep.
type fakeGate struct {
	fakePauser
	gmu    sync.Mutex
	events []string
	held   []time.Duration
	owed   int // Pass calls still to report held
	// holdOnReserve makes the next Reserve set a hold once it has booked: a hold
	// that begins between a booking and its use.
	holdOnReserve time.Duration
}

func (g *fakeGate) note(e string) {
	g.gmu.Lock()
	defer g.gmu.Unlock()
	g.events = append(g.events, e)
}

func (g *fakeGate) Reserve(ctx context.Context, n int, maxWait time.Duration) (*waiter.Reservation, error) {
	g.note("reserve")
	r, err := g.fakePauser.Reserve(ctx, n, maxWait)
	g.gmu.Lock()
	d := g.holdOnReserve
	g.holdOnReserve = 0
	g.gmu.Unlock()
	if d > 0 {
		g.Hold(d)
	}
	return r, err
}

// Pause settles what Hold owed: bookings made from now on lie after the pause, as a
// store that took the pause places them.
func (g *fakeGate) Pause(ctx context.Context, d time.Duration) error {
	g.note("pause")
	g.gmu.Lock()
	g.owed = 0
	g.gmu.Unlock()
	return g.fakePauser.Pause(ctx, d)
}

func (g *fakeGate) Hold(d time.Duration) {
	g.note("hold")
	g.gmu.Lock()
	defer g.gmu.Unlock()
	g.held = append(g.held, d)
	g.owed++
}

func (g *fakeGate) Pass(ctx context.Context) (bool, error) {
	g.gmu.Lock()
	defer g.gmu.Unlock()
	if g.owed > 0 {
		g.owed--
		g.events = append(g.events, "pass held")
		return true, nil
	}
	return false, nil
}

func (g *fakeGate) holds() []time.Duration {
	g.gmu.Lock()
	defer g.gmu.Unlock()
	return append([]time.Duration(nil), g.held...)
}

func (g *fakeGate) log() []string {
	g.gmu.Lock()
	defer g.gmu.Unlock()
	return append([]string(nil), g.events...)
}
