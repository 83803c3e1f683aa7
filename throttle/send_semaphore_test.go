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

// A Semaphore's calls go the one send path too: batched, decided as separate calls,
// at most once.

// sendSemCall is one request of a semaphore batch test: op on the lease token id, with
// the place place (join: a denied acquire takes a place in the queue).
type sendSemCall struct {
	op    int
	id    string
	place string
	join  bool
}

// sendSemOutcome is what a semaphore call got, comparable across semaphores.
type sendSemOutcome struct {
	r   semReply
	err string
}

func (c sendSemCall) run(ctx context.Context, s *Semaphore) sendSemOutcome {
	r, err := s.call(ctx, c.op, c.id, c.place, c.join, false)
	if err != nil {
		return sendSemOutcome{err: err.Error()}
	}
	return sendSemOutcome{r: r}
}

// sendSemID is lease token number i.
func sendSemID(i int) string { return fmt.Sprintf("%032x", i) }

// A semaphore's requests batch like a Limiter's: on a timeline, a batch of acquires
// (queueing and not), extends and releases on one semaphore gets what the same calls
// made one by one get on another key, each reply and error alike (a token the script
// refuses fails only its own request), and leaves the same leases and queue.
func TestSemaphoreBatchDecidesAsSeparateCalls(t *testing.T) {
	id := sendSemID
	calls := []sendSemCall{
		{semAcquire, id(1), id(1), false},
		{semAcquire, id(2), id(2), false},
		{semAcquire, id(3), id(3), true},  // queued
		{semAcquire, id(4), id(4), false}, // denied, not queued
		{semExtend, id(1), "", false},
		{semAcquire, "not-a-token", "x", false}, // JTARG, alone
		{semRelease, id(2), "", false},          // hands its slot to 3
		{semAcquire, id(3), id(3), true},        // finds it handed
		{semExtend, id(9), "", false},           // holds nothing
		{semAcquire, id(5), id(5), true},        // queued
		{semRelease, id(1), "", false},          // hands its slot to 5
		{semAcquire, id(6), id(6), true},        // queued
		{semRelease, id(6), id(6), false},       // gives its place up
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tl := newTimeline(t, b)
		batched := tl.semaphore("sem-batched", 2, WithLeaseTTL(time.Second))
		alone := tl.semaphore("sem-alone", 2, WithLeaseTTL(time.Second))
		ctx := context.Background()
		for step := range 2 {
			tl.at(time.Duration(step) * 400 * ms)
			want := make([]sendSemOutcome, len(calls))
			for i, c := range calls {
				want[i] = c.run(ctx, alone)
			}
			got := make([]sendSemOutcome, len(calls))
			sendRunBatch(t, batched.client(), len(calls), func(i int) sendOutcome {
				got[i] = calls[i].run(ctx, batched)
				return sendOutcome{}
			})
			for i, c := range calls {
				if g, w := got[i], want[i]; g.r != w.r || strings.ReplaceAll(g.err, "batched", "alone") != w.err {
					t.Fatalf("step %d call %d %+v: batched got %+v, want %+v (alone)", step, i, c, g, w)
				}
			}
			if !strings.Contains(got[5].err, "JTARG") {
				t.Fatalf("step %d: the bad token got %+v, want JTARG", step, got[5])
			}
			for k := range 3 { // :sem, :semq, :semx
				g, w := sendZset(t, b, batched.t.keys[k]), sendZset(t, b, alone.t.keys[k])
				if g != w {
					t.Fatalf("step %d: %s holds %s, want %s (as %s one by one)", step, batched.t.keys[k], g, w, alone.t.keys[k])
				}
			}
		}
	})
}

// sendZset returns a sorted set's members and scores, as text.
func sendZset(t *testing.T, b *redistest.Backend, key string) string {
	t.Helper()
	v, err := b.Client.ZRangeWithScores(context.Background(), key, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(v)
}

// A lost reply fails every semaphore call of the round trip with ErrUnavailable, and
// the leases it granted stand once: the transaction is not re-sent.
func TestSemaphoreBatchLostReply(t *testing.T) {
	direct, proxy, rdb := redistest.NewProxied(t)
	ctx := context.Background()
	s, err := NewSemaphore(rdb, "sem-lost", 5, WithKeyPrefix(direct.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptLoad(ctx, s.t.script.src).Err(); err != nil {
		t.Fatal(err)
	}
	proxy.DropReplyTo("exec")
	got := sendRunBatch(t, s.client(), 3, func(int) sendOutcome {
		l, _, err := s.TryAcquire(ctx)
		if err != nil {
			return sendOutcome{err: err.Error(), errv: err}
		}
		return sendOutcome{ok: l != nil}
	})
	for i, g := range got {
		if !errors.Is(g.errv, ErrUnavailable) {
			t.Fatalf("call %d of a round trip whose reply was lost: got %+v, want ErrUnavailable", i, g)
		}
	}
	if proxy.Dropped() != 1 {
		t.Fatalf("%d replies dropped, want the round trip's 1", proxy.Dropped())
	}
	// the leases the callers never saw are released by their late path only if the
	// reply comes: it never does, so they stand, once, until their TTL
	if n, err := direct.Client.ZCard(ctx, s.t.keys[0]).Result(); err != nil || n != 3 {
		t.Fatalf("leases after the lost round trip: got %d, %v; want its 3 grants, once", n, err)
	}
}

// Under load a semaphore's calls share round trips (fewer script calls than requests)
// and never hold more than max leases: 64 goroutines taking and giving back leases of
// a semaphore of 4.
func TestSemaphoreBatchesUnderLoad(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		calls := &sendScriptCalls{}
		b.Client.AddHook(sendPipeHook(calls.count))
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
			t.Errorf("%d leases held at once, want at most %d", most.Load(), max)
		}
		n := calls.n.Load()
		t.Logf("%d semaphore calls in %d script calls", requests.Load(), n)
		if n >= requests.Load() {
			t.Errorf("%d script calls for %d requests, want fewer: no round trip was shared", n, requests.Load())
		}
	})
}

// sendScriptCalls counts the script calls a client sends in pipelines (where every call
// of this package goes).
type sendScriptCalls struct{ n atomic.Int64 }

func (c *sendScriptCalls) count(cmds []redis.Cmder) {
	for _, cmd := range cmds {
		if sendIsEval(cmd) {
			c.n.Add(1)
		}
	}
}
