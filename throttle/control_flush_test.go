package throttle

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// When the requests queued behind the round trips in flight have all been left by
// their callers by the time a round trip lands, the next round trip has nothing to
// carry: the client sends none and goes on serving later calls. (It used to send an
// empty one, and crashed the process.) Two calls are held in flight by the proxy,
// filling the client's two round trips; a third queues behind them and its caller
// leaves; the held calls land.
func TestQueueLeftByEveryCallerSendsNothing(t *testing.T) {
	direct, proxy, rdb := redistest.NewProxied(t)
	ctx := context.Background()
	slow, err := New(rdb, "held-in-flight", PerSecond(100), WithKeyPrefix(direct.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	other, err := New(rdb, "queued", PerSecond(100), WithKeyPrefix(direct.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	proxy.Delay("held-in-flight", 300*ms)
	held := make(chan error, 2)
	for range maxFlights {
		go func() {
			_, err := slow.Allow(ctx)
			held <- err
		}()
	}
	c := slow.client()
	for deadline := time.Now().Add(signalWait); ; time.Sleep(ms) {
		c.mu.Lock()
		flying := len(c.flights)
		c.mu.Unlock()
		if flying == maxFlights {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d round trips in flight after %v, want %d", flying, signalWait, maxFlights)
		}
	}
	left, cancel := context.WithCancel(ctx)
	go func() { // the caller leaves once its call is queued
		for {
			c.mu.Lock()
			n := len(c.queue)
			c.mu.Unlock()
			if n > 0 {
				cancel()
				return
			}
			time.Sleep(ms)
		}
	}()
	if _, err := other.Allow(left); !errors.Is(err, context.Canceled) {
		t.Fatalf("the queued call whose caller left: got %v, want context.Canceled", err)
	}
	for range maxFlights {
		if err := <-held; err != nil {
			t.Fatal(err)
		}
	}
	proxy.Delay("", 0)
	if r, err := other.Allow(ctx); err != nil || !r.Allowed {
		t.Fatalf("a call after: got %+v, %v; want allowed", r, err)
	}
}
