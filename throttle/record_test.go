package throttle

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/clock"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// recordWrites counts the writes of records (SET …:conf) that reached the server
// without an error, in single commands and pipelines alike.
func recordWrites() *cmdCount {
	return &cmdCount{match: func(cmd redis.Cmder) bool {
		a := cmd.Args()
		if cmd.Name() != "set" || len(a) < 2 {
			return false
		}
		k, _ := a[1].(string)
		return strings.HasSuffix(k, ":conf")
	}}
}

// movingClock is a clock the test moves.
type movingClock struct{ ns atomic.Int64 }

func (c *movingClock) Now() time.Time                       { return time.Unix(0, c.ns.Load()) }
func (c *movingClock) NewTimer(d time.Duration) clock.Timer { return clock.System.NewTimer(d) }

// The key records the algorithm and limits its Limiters use: every algorithm, on
// every backend, several limits, a burst and the sliding counter's buckets read back
// as given; the record has a TTL (3 × the longest period, at least 10s: it
// outlasts the state), AllowN(0) writes none, and
// ReadRecord of a key nobody used is ErrNoRecord.
func TestRecordNamesAlgorithmAndLimits(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, alg := range allAlgorithms {
			limits := []Limit{{Rate: 20, Period: 1100 * ms}, {Rate: 500, Period: time.Hour}}
			if alg == TokenBucket {
				limits[0].Burst = 30
			}
			l, err := New(b.Client, "rec-"+alg.String(), limits[0], WithLimits(limits[1:]...), WithAlgorithm(alg),
				WithBuckets(7), WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.Allow(ctx); err != nil {
				t.Fatal(err)
			}
			r, err := ReadRecord(ctx, b.Client, "rec-"+alg.String(), WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			if r.Algorithm != alg || len(r.Limits) != 2 || r.Limits[0] != limits[0] || r.Limits[1] != limits[1] || r.Buckets != 7 {
				t.Fatalf("%v: record %+v, want %v %v buckets 7", alg, r, alg, limits)
			}
			if want := 3 * time.Hour; r.TTL <= want-time.Minute || r.TTL > want {
				t.Fatalf("%v: record TTL %v, want about %v (3 × the longest period)", alg, r.TTL, want)
			}
		}
		short, _ := New(b.Client, "rec-short", PerSecond(5), WithKeyPrefix(b.Prefix))
		if _, err := short.Allow(ctx); err != nil {
			t.Fatal(err)
		}
		if r, err := ReadRecord(ctx, b.Client, "rec-short", WithKeyPrefix(b.Prefix)); err != nil || r.TTL <= 9*time.Second || r.TTL > 10*time.Second {
			t.Fatalf("record of 5/s: %+v %v, want a TTL of 10s", r, err)
		}
		// AllowN(0) and a cancel write no record
		zero, _ := New(b.Client, "rec-zero", PerSecond(5), WithKeyPrefix(b.Prefix))
		if _, err := zero.AllowN(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadRecord(ctx, b.Client, "rec-zero", WithKeyPrefix(b.Prefix)); !errors.Is(err, ErrNoRecord) {
			t.Fatalf("ReadRecord after AllowN(0): %v, want ErrNoRecord", err)
		}
		if _, err := ReadRecord(ctx, b.Client, "rec-nobody", WithKeyPrefix(b.Prefix)); !errors.Is(err, ErrNoRecord) {
			t.Fatalf("ReadRecord of an unused key: %v, want ErrNoRecord", err)
		}
		if err := b.Client.Set(ctx, "{"+b.Prefix+"rec-junk}:conf", "hello", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadRecord(ctx, b.Client, "rec-junk", WithKeyPrefix(b.Prefix)); !errors.Is(err, ErrCorruptState) {
			t.Fatalf("ReadRecord of junk: %v, want ErrCorruptState", err)
		}
	})
}

// The record costs no round trip and is written once per interval (a quarter of its
// TTL, 2.5s here) per process, whatever path the calls take: a transaction, a plain pipeline (a
// client that never re-sends), coalesced batches, Limiters built per call (their
// shared state collected between calls), and a first call the server has no script
// for (EVALSHA refused, then EVAL). The last process to write it is the one
// it shows; a call whose write was refused (a user without SET) still decides.
func TestRecordWrittenOncePerInterval(t *testing.T) {
	b := redistest.NewStandalone(t)
	ctx := context.Background()
	addr := b.Client.(*redis.Client).Options().Addr
	for _, c := range []struct {
		name  string
		opts  redis.Options
		alone bool // no coalescing
	}{
		{"transaction", redis.Options{Addr: addr}, true},
		{"plain pipeline", redis.Options{Addr: addr, MaxRetries: -1}, true},
		{"coalesced", redis.Options{Addr: addr}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb := redis.NewClient(&c.opts)
			defer rdb.Close()
			w := recordWrites()
			rdb.AddHook(w)
			clk := &movingClock{}
			clk.ns.Store(time.Unix(1_700_000_000, 0).UnixNano())
			key := "rec-once-" + strings.ReplaceAll(c.name, " ", "-")
			l, err := New(rdb, key, PerSecond(1000), WithKeyPrefix(b.Prefix), withClock(clk), WithCoalescing(!c.alone))
			if err != nil {
				t.Fatal(err)
			}
			if err := scriptFlush(ctx, rdb); err != nil { // the first call sends EVALSHA, then EVAL
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 50; i++ {
						if _, err := l.Allow(ctx); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			if got := w.n.Load(); got != 1 {
				t.Fatalf("400 calls wrote the record %d times, want 1", got)
			}
			clk.ns.Add(int64(3 * time.Second)) // past a quarter of the record's 10s
			for i := 0; i < 10; i++ {
				if _, err := l.Allow(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if got := w.n.Load(); got != 2 {
				t.Fatalf("after 3s: %d writes, want 2", got)
			}
			// built per call, the shared state collected in between: still no more
			for i := 0; i < 20; i++ {
				l, _ := New(rdb, key, PerSecond(1000), WithKeyPrefix(b.Prefix), withClock(clk), WithCoalescing(!c.alone))
				if _, err := l.Allow(ctx); err != nil {
					t.Fatal(err)
				}
				runtime.GC()
			}
			if got := w.n.Load(); got != 2 {
				t.Fatalf("Limiters built per call: %d writes, want 2", got)
			}
			// another process's limits (another configuration): the last writer shows
			other, _ := New(rdb, key, PerSecond(400), WithKeyPrefix(b.Prefix), WithCoalescing(!c.alone))
			if _, err := other.Allow(ctx); err != nil {
				t.Fatal(err)
			}
			if r, err := ReadRecord(ctx, rdb, key, WithKeyPrefix(b.Prefix)); err != nil || r.Limits[0] != PerSecond(400) {
				t.Fatalf("after another process's first call: %+v %v, want its 400/s", r, err)
			}
		})
	}

	// a user without SET: the record is refused, the transaction discarded, and the
	// call made again without it
	rules := strings.Replace(ACLRules(b.Prefix), " +set ", " ", 1)
	if err := b.Client.Do(ctx, append([]any{"acl", "setuser", "noset", "on", ">pw"}, anys(strings.Fields(rules))...)...).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Client.Do(context.Background(), "acl", "deluser", "noset") })
	for _, retries := range []int{0, -1} {
		rdb := redis.NewClient(&redis.Options{Addr: addr, Username: "noset", Password: "pw", MaxRetries: retries})
		defer rdb.Close()
		l, _ := New(rdb, "rec-noset", PerSecond(10), WithKeyPrefix(b.Prefix))
		if r, err := l.Allow(ctx); err != nil || !r.Allowed {
			t.Fatalf("MaxRetries %d: Allow without SET: %+v %v, want granted", retries, r, err)
		}
	}
	if _, err := ReadRecord(ctx, b.Client, "rec-noset", WithKeyPrefix(b.Prefix)); !errors.Is(err, ErrNoRecord) {
		t.Fatalf("record written for a user without SET: %v", err)
	}
}

func anys(s []string) []any {
	a := make([]any, len(s))
	for i, v := range s {
		a[i] = v
	}
	return a
}

// TakeOver writes the record of its Limiter's algorithm at once.
func TestTakeOverRecords(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		sw, _ := New(b.Client, "rec-take", PerSecond(10), WithKeyPrefix(b.Prefix))
		if _, err := sw.Allow(ctx); err != nil {
			t.Fatal(err)
		}
		tb, _ := New(b.Client, "rec-take", Limit{Rate: 5, Period: time.Second, Burst: 9}, WithAlgorithm(TokenBucket), WithKeyPrefix(b.Prefix))
		if err := tb.TakeOver(ctx); err != nil {
			t.Fatal(err)
		}
		r, err := ReadRecord(ctx, b.Client, "rec-take", WithKeyPrefix(b.Prefix))
		if err != nil || r.Algorithm != TokenBucket || r.Limits[0].Burst != 9 {
			t.Fatalf("after TakeOver: %+v %v", r, err)
		}
	})
}
