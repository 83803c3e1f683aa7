package throttle

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// recordCarried counts the script calls that reached the server without an error
// carrying a record's text ("1 <state> ..."): the calls that write the key's record.
func recordCarried() *cmdCount {
	return &cmdCount{match: func(cmd redis.Cmder) bool {
		if n := cmd.Name(); n != "evalsha" && n != "eval" {
			return false
		}
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && strings.HasPrefix(s, "1 ") && strings.Contains(s, "/") {
				return true
			}
		}
		return false
	}}
}

// The key records the algorithm and limits its Limiters use: every algorithm, on
// every backend, several limits, a burst and the sliding counter's buckets read back
// as given; the record has a TTL (3 × the longest period, at least 10s: it
// outlasts the state), AllowN(0) writes none, and ReadRecord of a key nobody used is
// ErrNoRecord, of a key holding something else ErrCorruptState.
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
		// AllowN(0), a denial's twin that takes nothing, writes no record
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

// The record is written by the script of a call the process makes anyway, once per
// interval (a quarter of the record's life, 2.5s here) per process and key, whatever
// path the calls take: a transaction, a plain pipeline (a client that never re-sends),
// calls of many goroutines sharing round trips, Limiters built per call, and a first
// call the server has no script for (EVALSHA refused, then EVAL); another process (its
// own client) writes it at its first call, and the last writer's limits show.
func TestRecordWrittenOncePerInterval(t *testing.T) {
	b := redistest.NewStandalone(t)
	ctx := context.Background()
	addr := b.Client.(*redis.Client).Options().Addr
	for _, c := range []struct {
		name string
		opts redis.Options
	}{
		{"transaction", redis.Options{Addr: addr}},
		{"plain pipeline", redis.Options{Addr: addr, MaxRetries: -1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb := redis.NewClient(&c.opts)
			defer rdb.Close()
			w := recordCarried()
			rdb.AddHook(w)
			key := "rec-once-" + strings.ReplaceAll(c.name, " ", "-")
			l, err := New(rdb, key, PerSecond(1000), WithKeyPrefix(b.Prefix))
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
				t.Fatalf("400 calls carried the record %d times, want 1", got)
			}
			ks := l.client().key(l.t.tag)
			if due, want := time.Until(time.Unix(0, ks.record.Load())), l.every; due > want || due < want-time.Second || want != 2500*ms {
				t.Fatalf("the record is next due in %v, want in %v (a quarter of its 10s)", due, want)
			}
			// built per call: still no more
			for i := 0; i < 20; i++ {
				l, _ := New(rdb, key, PerSecond(1000), WithKeyPrefix(b.Prefix))
				if _, err := l.Allow(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if got := w.n.Load(); got != 1 {
				t.Fatalf("Limiters built per call: %d records carried, want 1", got)
			}
			ks.record.Store(time.Now().UnixNano()) // the interval has passed
			for i := 0; i < 10; i++ {
				if _, err := l.Allow(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if got := w.n.Load(); got != 2 {
				t.Fatalf("after the interval: %d records carried, want 2", got)
			}
			// another process's limits (its own client): the last writer shows
			other := redis.NewClient(&c.opts)
			defer other.Close()
			o, _ := New(other, key, PerSecond(400), WithKeyPrefix(b.Prefix))
			if _, err := o.Allow(ctx); err != nil {
				t.Fatal(err)
			}
			if r, err := ReadRecord(ctx, rdb, key, WithKeyPrefix(b.Prefix)); err != nil || r.Limits[0] != PerSecond(400) {
				t.Fatalf("after another process's first call: %+v %v, want its 400/s", r, err)
			}
		})
	}
}

// The script writes the record only over nothing or one of jobthrottle's: a foreign
// value is left as it is, and the call decides as usual; a record of another algorithm
// or other limits (another process's, an older deploy's) is replaced.
func TestRecordOnlyOverOurs(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, alg := range allAlgorithms {
			key := "rec-foreign-" + alg.String()
			name := "{" + b.Prefix + key + "}:conf"
			if err := b.Client.Set(ctx, name, "not ours", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			l, err := New(b.Client, key, PerSecond(5), WithAlgorithm(alg), WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			if r, err := l.Allow(ctx); err != nil || !r.Allowed {
				t.Fatalf("%v beside a foreign record: %+v %v, want granted", alg, r, err)
			}
			if v := b.Client.Get(ctx, name).Val(); v != "not ours" {
				t.Fatalf("%v: the foreign record became %q", alg, v)
			}
			if err := b.Client.HSet(ctx, "{"+b.Prefix+key+"2}:conf", "a", "b").Err(); err != nil {
				t.Fatal(err)
			}
			l2, _ := New(b.Client, key+"2", PerSecond(5), WithAlgorithm(alg), WithKeyPrefix(b.Prefix))
			if r, err := l2.Allow(ctx); err != nil || !r.Allowed {
				t.Fatalf("%v beside a record of another type: %+v %v, want granted", alg, r, err)
			}
			// ours, of another algorithm and limits: replaced
			if err := b.Client.Set(ctx, name, "1 fw 50 7/1m0s", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			c3 := redistest.Dial(b.Addrs())
			defer c3.Close()
			l3, _ := New(c3, key, PerSecond(5), WithAlgorithm(alg), WithKeyPrefix(b.Prefix))
			if _, err := l3.Allow(ctx); err != nil {
				t.Fatal(err)
			}
			if r, err := ReadRecord(ctx, b.Client, key, WithKeyPrefix(b.Prefix)); err != nil || r.Algorithm != alg || r.Limits[0] != PerSecond(5) {
				t.Fatalf("%v over an older record of ours: %+v %v", alg, r, err)
			}
		}
	})
}

// A call never fails because of the record: one whose write of it is refused (a user
// without SET, which the sliding window's grants do not need) decides as usual, as a
// plain pipeline and as a transaction, and leaves no record.
func TestRecordRefusedStillDecides(t *testing.T) {
	b := redistest.NewStandalone(t)
	ctx := context.Background()
	addr := b.Client.(*redis.Client).Options().Addr
	rules := strings.Replace(ACLRules(b.Prefix)+" ", " +set ", " ", 1)
	args := []any{"acl", "setuser", "noset", "reset", "on", ">pw"}
	for _, r := range strings.Fields(rules) {
		args = append(args, r)
	}
	if err := b.Client.Do(ctx, args...).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Client.Do(context.Background(), "acl", "deluser", "noset") })
	for _, retries := range []int{0, -1} {
		rdb := redis.NewClient(&redis.Options{Addr: addr, Username: "noset", Password: "pw", MaxRetries: retries})
		defer rdb.Close()
		l, _ := New(rdb, "rec-noset", PerSecond(10), WithKeyPrefix(b.Prefix))
		for i := 0; i < 3; i++ {
			if r, err := l.Allow(ctx); err != nil || !r.Allowed || r.Remaining != 10-(i+1)-3*max(0, -retries) {
				t.Fatalf("MaxRetries %d: Allow %d without SET: %+v %v, want granted", retries, i, r, err)
			}
		}
	}
	if _, err := ReadRecord(ctx, b.Client, "rec-noset", WithKeyPrefix(b.Prefix)); !errors.Is(err, ErrNoRecord) {
		t.Fatalf("record written for a user without SET: %v", err)
	}
}

// ReadRecord keeps a call's bounds whatever Redis does: against a server that never
// answers (go-redis's defaults: a 3s read timeout, deadlines not honoured), it returns
// at its context's deadline with ErrUnavailable and context.DeadlineExceeded, and,
// without a deadline, by its call timeout with ErrUnavailable alone; a cancelled
// context is its error.
func TestReadRecordHoldsItsBounds(t *testing.T) {
	hung := hungServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: hung.Addr})
	defer rdb.Close()
	const bound = 300 * ms
	for _, c := range []struct {
		name     string
		deadline bool
		cancel   bool
	}{{"deadline", true, false}, {"call timeout", false, false}, {"cancelled", false, true}} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			ctx, cancel := context.WithCancel(context.Background())
			if c.deadline {
				ctx, cancel = context.WithTimeout(context.Background(), bound)
			}
			defer cancel()
			if c.cancel {
				time.AfterFunc(bound, cancel)
			}
			timeout := time.Minute // the context's end comes first
			if !c.deadline && !c.cancel {
				timeout = bound
			}
			_, err := ReadRecord(ctx, rdb, "hung", WithCallTimeout(timeout))
			took := time.Since(start)
			redistest.Figure(t, "ReadRecord against a hung server, %s of %v: returned after %v: %v", c.name, bound, took.Round(time.Microsecond), err)
			want := errors.Is(err, ErrUnavailable) && errors.Is(err, context.DeadlineExceeded) == c.deadline
			if c.cancel {
				want = errors.Is(err, context.Canceled) && !errors.Is(err, ErrUnavailable)
			}
			if !want || took < bound || took > bound+sendPrompt {
				t.Fatalf("ReadRecord: got %v after %v; want its bound's error within %v after %v", err, took, sendPrompt, bound)
			}
		})
	}
}
