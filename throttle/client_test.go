package throttle

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Go-redis clients used and closed leave nothing behind: 500 clients (100 on the
// cluster), a third used for Allow, a third for a Wait asleep on its booking, a third
// for an Acquire queued for a slot, each closed at once after its call was cancelled
// (the subscription its waiter opened still lingering). Asserted: none of them is
// still registered, and every goroutine they started has ended (go-redis's
// subscription health check among them), after the sweeps two minutes hold (run here
// by hand, sweepEvery being what the timers would wait). Reported: what is left once
// they are closed, before any sweep (a subscription ends with its client, but go-redis
// keeps one open that it was dialling as the client closed, and its cluster client
// leaves them open: the sweep closes those); the heap they leave, beside what as many
// go-redis clients used without the library leave.
func TestClosedClientsLeaveNothing(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		addrs, cluster := b.Addrs()
		n := 500
		if cluster {
			n = 100
		}
		ctx := context.Background()
		if err := b.Client.Ping(ctx).Err(); err != nil { // the test's own connection, counted before
			t.Fatal(err)
		}
		runtime.GC()
		goroutines, heap := runtime.NumGoroutine(), heapInUse()
		var rdbs []redis.UniversalClient
		for i := range n {
			rdb := redistest.Dial(addrs, cluster)
			rdbs = append(rdbs, rdb)
			key := "churn-" + itoa(i)
			switch i % 3 {
			case 0:
				l := churnLimiter(t, rdb, b.Prefix, key)
				if _, err := l.Allow(ctx); err != nil {
					t.Fatal(err)
				}
			case 1: // a Wait asleep on a booking an hour ahead, cancelled
				l := churnLimiter(t, rdb, b.Prefix, key)
				if _, err := l.Allow(ctx); err != nil {
					t.Fatal(err)
				}
				wctx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- l.Wait(wctx) }()
				sendEventually(t, signalWait, "the Wait asleep", func() bool { return sendSleepers(l) == 1 })
				cancel()
				<-done
			case 2: // an Acquire queued behind a held lease, cancelled
				s, err := NewSemaphore(rdb, key, 1, WithKeyPrefix(b.Prefix))
				if err != nil {
					t.Fatal(err)
				}
				mustTry(t, s)
				actx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { _, err := s.Acquire(actx); done <- err }()
				sendEventually(t, signalWait, "the Acquire queued", func() bool {
					return b.Client.ZCard(ctx, s.t.keys[1]).Val() == 1
				})
				cancel()
				<-done
			}
			if err := rdb.Close(); err != nil {
				t.Fatal(err)
			}
		}
		left := func() int {
			runtime.GC()
			return runtime.NumGoroutine() - goroutines
		}
		settled := func(d time.Duration) int { // goroutines left once those ending end
			for deadline := time.Now().Add(d); left() > 0 && time.Now().Before(deadline); {
				time.Sleep(10 * ms)
			}
			return max(0, left())
		}
		registered := func() (k int, cs []*client) {
			for _, rdb := range rdbs {
				if v, ok := clients.Load(rdb); ok {
					k++
					cs = append(cs, v.(*client))
				}
			}
			return k, cs
		}
		closedLeft := settled(time.Second)
		atClose, cs := registered()
		sweeps := int(2 * time.Minute / sweepEvery)
		for range sweeps {
			for _, c := range cs {
				sendSweep(c)
			}
		}
		after, _ := registered()
		sweptLeft := settled(signalWait)
		rdbs, cs = nil, nil
		runtime.GC()
		runtime.GC() // go-redis's buffer pools
		retained := heapInUse() - heap
		heap = heapInUse() // go-redis's own: as many clients used for a PING and closed
		for range n {
			rdb := redistest.Dial(addrs, cluster)
			_ = rdb.Ping(ctx).Err()
			_ = rdb.Close()
		}
		runtime.GC()
		runtime.GC()
		redistest.Figure(t, "%d clients used and closed: %d goroutines and %d clients left once closed; after the %d sweeps of 2 minutes %d and %d; heap %+d kB (as many bare go-redis clients: %+d kB)",
			n, closedLeft, atClose, sweeps, sweptLeft, after, retained/1024, (heapInUse()-heap)/1024)
		if sweptLeft > 0 {
			t.Errorf("%d goroutines more than before %d clients were used and closed, want none:\n%s", sweptLeft, n, churnStacks())
		}
		if after > 0 {
			t.Errorf("%d of %d closed clients still registered after %d sweeps, want none", after, n, sweeps)
		}
	})
}

// churnLimiter returns a limiter of one permit an hour on key.
func churnLimiter(t *testing.T, rdb redis.UniversalClient, prefix, key string) *Limiter {
	t.Helper()
	l, err := New(rdb, key, PerHour(1), WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// heapInUse returns the bytes of the heap's objects (after a collection: those live).
func heapInUse() int64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// churnStacks returns the stacks of the goroutines that run go-redis or this package's
// code, for a test's failure message.
func churnStacks() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "go-redis") || strings.Contains(g, "jobthrottle/throttle.") && !strings.Contains(g, "testing.tRunner") {
			out = append(out, g)
		}
	}
	if len(out) > 5 {
		out = append(out[:5], "…")
	}
	return strings.Join(out, "\n\n")
}
