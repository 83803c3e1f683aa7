package waiter_test

// Helpers shared by the package's external tests (transport_hold_test.go, transport_test.go,
// ratelimit_test.go, transport_fleet_test.go, transport_vendors_test.go). A helper used by one test file stays in that file.

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
)

// holdRecorder is a *throttle.Limiter whose holds and WaitN calls are put in one order
// (seq), so that a test can tell exactly, without timing, whether a request's WaitN
// began after this process was held: such a request must not be sent before the hold
// ends. Its Reserve and the rest are the Limiter's.
type holdRecorder struct {
	*throttle.Limiter
	mu    sync.Mutex
	seq   int64
	holds []holdRecord
}

type holdRecord struct {
	seq   int64     // when the hold was set (see holdMark)
	setAt time.Time // the time of the mark: the hold was set before it
	until time.Time // when the hold ends at the earliest: Pause's call plus its length
}

// tracked is what the test knows of one request; it rides in the request's context.
type tracked struct {
	id      int
	waitSeq atomic.Int64 // seq when its last WaitN began
	waitAt  atomic.Int64 // UnixNano when its last WaitN began: it books after
	doneSeq atomic.Int64 // seq when its last WaitN returned
	sentAt  atomic.Int64 // UnixNano when the base transport got it
}

type trackedKey struct{}

// holdMark is the context the recorder passes to Limiter.Pause: its first use marks
// the hold. Pause sets this process's hold before it uses its context at all (it
// holds even when its Redis call cannot be made), so a WaitN ordered after the mark
// began after the hold was set.
type holdMark struct {
	context.Context
	once sync.Once
	mark func()
}

func (c *holdMark) Deadline() (time.Time, bool) { c.once.Do(c.mark); return c.Context.Deadline() }
func (c *holdMark) Done() <-chan struct{}       { c.once.Do(c.mark); return c.Context.Done() }
func (c *holdMark) Err() error                  { c.once.Do(c.mark); return c.Context.Err() }
func (c *holdMark) Value(key any) any           { c.once.Do(c.mark); return c.Context.Value(key) }

// Pause records the hold the Limiter's Pause sets, in order with the WaitN calls.
func (g *holdRecorder) Pause(ctx context.Context, d time.Duration) error {
	start := time.Now() // the hold ends d after a moment that follows this one
	mc := &holdMark{Context: ctx, mark: func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.seq++
		g.holds = append(g.holds, holdRecord{seq: g.seq, setAt: time.Now(), until: start.Add(d)})
	}}
	err := g.Limiter.Pause(mc, d)
	if d > 0 { // a Pause of d > 0 holds, whatever its Redis call did
		mc.once.Do(mc.mark)
	}
	return err
}

// WaitN notes when a tracked request's WaitN began, in order with the holds.
func (g *holdRecorder) WaitN(ctx context.Context, n int) error {
	if tr, ok := ctx.Value(trackedKey{}).(*tracked); ok {
		tr.waitAt.Store(time.Now().UnixNano())
		g.mu.Lock()
		g.seq++
		tr.waitSeq.Store(g.seq)
		g.mu.Unlock()
		defer func() {
			g.mu.Lock()
			g.seq++
			tr.doneSeq.Store(g.seq)
			g.mu.Unlock()
		}()
	}
	return g.Limiter.WaitN(ctx, n)
}

// violations returns the requests whose last WaitN began after a hold was set and
// that were sent before that hold ended.
func (g *holdRecorder) violations(reqs []*tracked) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var bad []string
	for _, r := range reqs {
		sent := time.Unix(0, r.sentAt.Load())
		for _, h := range g.holds {
			if r.sentAt.Load() != 0 && r.waitSeq.Load() > h.seq && sent.Before(h.until) {
				bad = append(bad, fmt.Sprintf("request %d, whose WaitN began after a hold was set, was sent %v before the hold's end", r.id, h.until.Sub(sent)))
			}
		}
	}
	return bad
}

// held returns the holds Pause set, in order.
func (g *holdRecorder) held() []holdRecord {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]holdRecord(nil), g.holds...)
}

// returnedInside counts the requests whose WaitN began before a hold was set, returned
// after it was set, and were sent before its end. Pause's contract says none, but a
// WaitN's last look at the hold comes just before it returns, so one that looked
// before the hold was set may be seen returning after it: a figure, not asserted (the
// exact case is TestTransportHoldMovesWaiters's).
func (g *holdRecorder) returnedInside(reqs []*tracked) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, r := range reqs {
		sent := time.Unix(0, r.sentAt.Load())
		for _, h := range g.holds {
			if r.sentAt.Load() != 0 && r.waitSeq.Load() < h.seq && r.doneSeq.Load() > h.seq && sent.Before(h.until) {
				n++
				break
			}
		}
	}
	return n
}

// holdCount returns how many holds Pause set.
func (g *holdRecorder) holdCount() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.holds)
}

// heldBefore reports whether request r's last WaitN began before the first hold was
// set: it was on its way before this process read the answer that held it.
func (g *holdRecorder) heldBefore(r *tracked) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.holds) == 0 || r.waitSeq.Load() < g.holds[0].seq
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
