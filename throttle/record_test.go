package throttle

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The key's record is its state's head: the algorithm and limits its last writer used.
// Every algorithm, on every backend: several limits, a burst and the sliding counter's
// buckets read back as given, with the state's TTL; AllowN(0) writes nothing; the last
// writer's limits show; ReadRecord of a key nobody used is ErrNoRecord, of a key holding
// something else ErrCorruptState.
func TestRecordNamesAlgorithmAndLimits(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, alg := range allAlgorithms {
			limits := []Limit{{Rate: 20, Period: 1100 * ms}, {Rate: 500, Period: time.Hour}}
			if alg == TokenBucket {
				limits[0].Burst = 30
			}
			key := "rec-" + alg.String()
			l, err := New(b.Client, key, limits[0], WithLimits(limits[1:]...), WithAlgorithm(alg),
				WithBuckets(7), WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			res, err := l.Allow(ctx)
			if err != nil {
				t.Fatal(err)
			}
			r, err := ReadRecord(ctx, b.Client, key, WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			want := 7
			if alg != SlidingCounter {
				want = 0
			}
			wantLimits := slices.Clone(limits)
			if alg == TokenBucket { // the head carries every burst: 0 reads back as the rate
				wantLimits[1].Burst = limits[1].Rate
			}
			if r.Algorithm != alg || !slices.Equal(r.Limits, wantLimits) || r.Buckets != want {
				t.Fatalf("%v: record %+v, want %v %v buckets %d", alg, r, alg, wantLimits, want)
			}
			if r.TTL <= 0 || r.TTL > res.ResetAfter+time.Second && b.Kind == redistest.Mini {
				t.Fatalf("%v: record TTL %v, want the state's, about %v", alg, r.TTL, res.ResetAfter)
			}
			// another process with other limits writes the key (a booking: a sliding
			// counter of other buckets may book the grant ahead): its limits show
			other, _ := New(b.Client, key, PerSecond(1000), WithAlgorithm(alg), WithKeyPrefix(b.Prefix))
			if r, err := other.Reserve(ctx, 1, time.Minute); err != nil || !r.OK() {
				t.Fatalf("%v: another writer's Reserve: %v %v", alg, r, err)
			}
			if r, err := ReadRecord(ctx, b.Client, key, WithKeyPrefix(b.Prefix)); err != nil || len(r.Limits) != 1 || r.Limits[0].Rate != 1000 {
				t.Fatalf("%v: record after another writer: %+v %v, want its 1000 per second", alg, r, err)
			}
		}
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
		for _, junk := range []string{"hello", "1 2\nhello"} {
			if err := b.Client.Set(ctx, "{"+b.Prefix+"rec-junk}:l", junk, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := ReadRecord(ctx, b.Client, "rec-junk", WithKeyPrefix(b.Prefix)); !errors.Is(err, ErrCorruptState) {
				t.Fatalf("ReadRecord of %q: %v, want ErrCorruptState", junk, err)
			}
		}
	})
}

// ReadRecord keeps a call's bounds whatever Redis does: against a server that never
// answers (go-redis's defaults: a 5s read timeout, deadlines not honoured), it returns
// at its context's deadline with ErrUnavailable and context.DeadlineExceeded, and,
// without a deadline, by its call timeout with ErrUnavailable alone; a cancelled
// context is its error. How late it returns is measured from the bound as a goroutine
// of the test sees it (sendLeaves, sendBound): a loaded machine runs the library's
// timers and the test's late alike.
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
			read := func(ctx context.Context) error {
				_, err := ReadRecord(ctx, rdb, "hung", WithCallTimeout(timeout))
				return err
			}
			var err error
			var late time.Duration
			if c.deadline || c.cancel {
				err, late, _ = sendLeaves(ctx, read)
			} else {
				since := sendBound(bound)
				err = read(ctx)
				late = since()
			}
			took := time.Since(start)
			redistest.Figure(t, "ReadRecord against a hung server, %s of %v: returned after %v (%v after the bound as the test saw it): %v",
				c.name, bound, took.Round(time.Microsecond), late.Round(time.Microsecond), err)
			want := errors.Is(err, ErrUnavailable) && errors.Is(err, context.DeadlineExceeded) == c.deadline
			if c.cancel {
				want = errors.Is(err, context.Canceled) && !errors.Is(err, ErrUnavailable)
			}
			if !want || took < bound || late > sendPrompt {
				t.Fatalf("ReadRecord: got %v after %v, %v after the bound as the test saw it; want its bound's error after %v, at most %v after it",
					err, took, late, bound, sendPrompt)
			}
		})
	}
}
