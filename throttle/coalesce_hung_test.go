package throttle

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A batch sent to a Redis that accepts connections and never answers fails each of
// its callers with an error wrapping ErrUnavailable, as a call of its own does: when
// the client's read timeout ends the round trip first (the caller's bound is later),
// and when the call timeout passes first. So does a batch sent to a port that refuses
// connections.
//
// Tolerance: each call returns within lateBy (250ms) of the earlier of the two bounds.
func TestCoalescedHungRedis(t *testing.T) {
	hung := hungServer(t)
	refused := redistest.RefusedAddr
	const short = 200 * time.Millisecond
	for _, c := range []struct {
		name  string
		addr  string
		read  time.Duration // the client's ReadTimeout
		bound time.Duration // WithCallTimeout
	}{
		{"hung, read timeout first", hung.Addr, short, time.Hour},
		{"hung, call timeout first", hung.Addr, -1, short},
		{"refused", refused, short, time.Hour},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: c.addr, ReadTimeout: c.read, MaxRetries: -1, DialTimeout: short})
			defer rdb.Close()
			for _, ctxKind := range []string{"Background", "1h deadline"} {
				l, err := New(rdb, "hung-batch", PerSecond(10), WithCallTimeout(c.bound))
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if ctxKind != "Background" {
					ctx, cancel = context.WithTimeout(ctx, time.Hour)
				}
				start := time.Now()
				got := runBatch(t, l.src.batch, 3, func(int) outcome { return (call{false, 1, 0}).run(ctx, l) })
				took := time.Since(start)
				cancel()
				for i, g := range got {
					if !errors.Is(g.errv, ErrUnavailable) || errors.Is(g.errv, ErrUnexpectedReply) {
						t.Errorf("%s: call %d of a batch: %v, want ErrUnavailable", ctxKind, i, g.errv)
					}
				}
				if took > short+lateBy {
					t.Errorf("%s: the batch's calls returned after %v, want %v (+ up to %v)", ctxKind, took, short, lateBy)
				}
			}
		})
	}
}
