package throttle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// semCall is one request of a semaphore batch test: op on lease id (join: a denied
// acquire takes a place in the queue).
type semCall struct {
	op   int
	id   string
	join bool
}

// semOutcome is what a semaphore call got, comparable across semaphores.
type semOutcome struct {
	r   semReply
	err string
}

func (c semCall) run(ctx context.Context, s *Semaphore) semOutcome {
	r, err := s.run(ctx, c.op, c.id, c.join, false)
	if err != nil {
		return semOutcome{err: err.Error()}
	}
	return semOutcome{r: r}
}

// semID is lease id number i.
func semID(i int) string { return fmt.Sprintf("%032x", i) }

// A semaphore's calls coalesce like a Limiter's: on a timeline, a forced batch of
// acquires (queueing and not), extends and releases on one semaphore gets what the
// same calls made one by one get on another key, each reply and error alike (an id
// the script refuses fails only its own request), and leaves the same leases and
// queue.
func TestCoalescedSemaphoreDecidesAsSeparateCalls(t *testing.T) {
	calls := []semCall{
		{semAcquire, semID(1), false},
		{semAcquire, semID(2), false},
		{semAcquire, semID(3), true},  // queued
		{semAcquire, semID(4), false}, // denied, not queued
		{semExtend, semID(1), false},
		{semAcquire, "not-an-id", false}, // JTARG, alone
		{semRelease, semID(2), false},    // hands its slot to 3
		{semAcquire, semID(3), true},     // finds it handed
		{semExtend, semID(9), false},     // holds nothing
		{semAcquire, semID(5), true},     // queued
		{semRelease, semID(1), false},    // hands its slot to 5
		{semAcquire, semID(6), true},     // queued
		{semRelease, semID(6), false},    // gives its place up
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tl := newTimeline(t, b)
		batched := tl.semaphore("sem-batched", 2, WithLeaseTTL(time.Second))
		alone := tl.semaphore("sem-alone", 2, WithLeaseTTL(time.Second), WithCoalescing(false))
		ctx := context.Background()
		for step := range 2 {
			tl.at(time.Duration(step) * 400 * ms)
			want := make([]semOutcome, len(calls))
			for i, c := range calls {
				want[i] = c.run(ctx, alone)
			}
			got := make([]semOutcome, len(calls))
			runBatch(t, batched.src.batch, len(calls), func(i int) outcome {
				got[i] = calls[i].run(ctx, batched)
				return outcome{}
			})
			for i, c := range calls {
				if g, w := got[i], want[i]; g.r != w.r || strings.ReplaceAll(g.err, "batched", "alone") != w.err {
					t.Fatalf("step %d call %d %+v: batched %+v, alone %+v", step, i, c, g, w)
				}
			}
			if got[5].err == "" || !strings.Contains(got[5].err, "JTARG") {
				t.Fatalf("step %d: the bad id got %+v, want JTARG", step, got[5])
			}
			for _, k := range []int{0, 1, 2} { // :sem, :semq, :semx
				g := zsetOf(t, b, batched.keys[k])
				if w := zsetOf(t, b, alone.keys[k]); g != w {
					t.Fatalf("step %d: %s holds %s, one by one %s", step, batched.keys[k], g, w)
				}
			}
		}
	})
}

// zsetOf returns a sorted set's members and scores, as text.
func zsetOf(t *testing.T, b *redistest.Backend, key string) string {
	t.Helper()
	v, err := b.Client.ZRangeWithScores(context.Background(), key, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(v)
}

// A lost batch reply fails every semaphore call in the batch with ErrUnavailable, and
// the leases it granted stand once (the batch is not re-sent).
func TestCoalescedSemaphoreLostReply(t *testing.T) {
	direct, proxy, rdb := redistest.NewProxied(t)
	ctx := context.Background()
	s, err := NewSemaphore(rdb, "sem-lost", 5, WithKeyPrefix(direct.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.script.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	proxy.DropReplyTo("exec")
	got := runBatch(t, s.src.batch, 3, func(int) outcome {
		l, _, err := s.TryAcquire(ctx)
		if err != nil {
			return outcome{err: err.Error(), errv: err}
		}
		return outcome{ok: l != nil}
	})
	for i, g := range got {
		if !errors.Is(g.errv, ErrUnavailable) {
			t.Fatalf("call %d of a batch whose reply was lost: %+v, want ErrUnavailable", i, g)
		}
	}
	if proxy.Dropped() != 1 {
		t.Fatalf("%d replies dropped, want the batch's 1", proxy.Dropped())
	}
	if n, err := direct.Client.ZCard(ctx, s.keys[0]).Result(); err != nil || n != 3 {
		t.Fatalf("leases after the lost batch: %d, %v; want its 3 grants, once", n, err)
	}
}

// Under load a semaphore's calls coalesce (fewer script calls than requests) and
// never hold more than max leases: 64 goroutines taking and giving back leases of a
// semaphore of 4.
func TestCoalescedSemaphoreUnderLoad(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		calls := &pipedScriptCalls{}
		b.Client.AddHook(calls)
		const max, goroutines, rounds = 4, 64, 20
		s, err := NewSemaphore(b.Client, "sem-load", max, WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		var holding, most, requests atomic.Int64
		var wg sync.WaitGroup
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					requests.Add(1)
					l, _, err := s.TryAcquire(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					if l == nil {
						continue
					}
					h := holding.Add(1)
					for m := most.Load(); h > m && !most.CompareAndSwap(m, h); m = most.Load() {
					}
					holding.Add(-1)
					requests.Add(1)
					if err := l.Release(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if most.Load() > max {
			t.Errorf("%d leases held at once, max %d", most.Load(), max)
		}
		n := calls.n.Load()
		t.Logf("%d semaphore calls in %d script calls", requests.Load(), n)
		if n >= requests.Load() {
			t.Errorf("%d script calls for %d requests: none coalesced", n, requests.Load())
		}
	})
}

// pipedScriptCalls counts the EVAL and EVALSHA commands a client sends, in pipelines
// (where the calls of this package go) too.
type pipedScriptCalls struct{ n atomic.Int64 }

func (c *pipedScriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *pipedScriptCalls) count(cmd redis.Cmder) {
	if isEval(cmd) {
		c.n.Add(1)
	}
}

func (c *pipedScriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}

func (c *pipedScriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.count(cmd)
		}
		return next(ctx, cmds)
	}
}
