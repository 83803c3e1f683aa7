package throttle

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// flightGate is a go-redis hook that, while closed, holds every round trip back until
// it is opened: round trips stay in flight as long as a test needs.
type flightGate struct {
	closed atomic.Bool
	open   chan struct{}
}

func (g *flightGate) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (g *flightGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (g *flightGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if g.closed.Load() {
			<-g.open
		}
		return next(ctx, cmds)
	}
}

// A round trip that lands while the queue holds only requests whose callers have left
// sends nothing more and stops (it used to make a round trip of no requests, which
// panicked), and the client goes on serving. The states are reached by the client's
// own counts, not by timing: two round trips held in flight, then a request queued
// behind them whose caller leaves, then the round trips let go.
func TestFlushAfterQueuedCallersLeft(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		gate := &flightGate{open: make(chan struct{})}
		b.Client.AddHook(gate)
		l, err := New(b.Client, "left", PerSecond(1000), WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if _, err := l.Allow(ctx); err != nil { // the script loaded, a connection made
			t.Fatal(err)
		}
		c := l.client()
		until := func(what string, cond func() bool) {
			t.Helper()
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(ms) {
				c.mu.Lock()
				ok := cond()
				c.mu.Unlock()
				if ok {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("no %s within 30s", what)
				}
			}
		}
		gate.closed.Store(true)
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := l.Allow(ctx); err != nil {
					t.Error(err)
				}
			}()
		}
		until("two round trips in flight", func() bool { return len(c.flights) == 2 })
		leaving, cancel := context.WithCancel(ctx)
		left := make(chan error, 1)
		go func() {
			_, err := l.Allow(leaving)
			left <- err
		}()
		until("request queued", func() bool { return len(c.queue) == 1 })
		cancel()
		if err := <-left; !errors.Is(err, context.Canceled) {
			t.Fatalf("Allow whose caller left: %v, want context.Canceled", err)
		}
		gate.closed.Store(false)
		close(gate.open) // the round trips land with only the left request queued
		wg.Wait()
		if _, err := l.Allow(ctx); err != nil {
			t.Fatalf("Allow after: %v", err)
		}
	})
}
