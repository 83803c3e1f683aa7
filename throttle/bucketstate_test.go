package throttle

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"golang.org/x/time/rate"
)

// The token bucket's state is "<last> <u1> <e1> ...\n<meta>" (lua/bucket.lua): when the
// tokens were counted, then per limit the tokens in ticks (p a token, r a µs) and the
// latest booking, exact integers, negative tokens when booked ahead; the limits they
// were counted with are the meta's head's. It is written so, read back (the next
// decisions follow from it), taken as jobthrottle's by internal/keys (the operator's
// tools), and any other text is refused (ErrCorruptState) and left as it is.
func TestTokenBucketStateForm(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		l := tl.limiter("bucket-form", Limit{Rate: 2, Period: time.Second}, WithAlgorithm(TokenBucket),
			WithLimits(Limit{Rate: 3, Period: 10 * time.Second}))
		t0 := tl.now.UnixMicro()
		head := "\ntb 2 1000000 2 3 10000000 3"
		state := func(want string) {
			t.Helper()
			got, err := b.Client.Get(ctx, l.stateKey()).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("state %q, want %q", got, want)
			}
			if err := keys.Check(keys.State, "string", []string{got}); err != nil {
				t.Fatalf("internal/keys does not take the state as jobthrottle's: %v", err)
			}
		}
		runSteps(t, tl, l, []step{{0, 2, Result{true, 0, 0, 6666667 * time.Microsecond}}}) // the second refills in 20/3s
		// 2 of 2 taken from the first (0 left), 2 of 3 from the second (1e7 ticks left)
		state(fmt.Sprintf("%d 0 %d 10000000 %d", t0, t0, t0) + head)
		// at t0+100ms one permit is booked for t0+500ms, when the first has a token again
		tl.at(100 * ms)
		if r, err := l.Reserve(ctx, 1, time.Second); err != nil || !r.OK() || r.Delay() != 400*ms {
			t.Fatalf("Reserve: %v, want a booking 400ms ahead", err)
		}
		now := t0 + 100_000
		state(fmt.Sprintf("%d -800000 %d 300000 %d", now, now+400_000, now+400_000) + head)
		runSteps(t, tl, l, []step{
			{200 * ms, 1, Result{false, 0, 3133334 * time.Microsecond, 9800 * ms}}, // the second holds 6e5 of the 1e7 ticks of a token: (1e7-6e5)/3 µs
			{1 * time.Second, 1, Result{false, 0, 2333334 * time.Microsecond, 9 * time.Second}},
		})

		for _, foreign := range []string{
			"661f1e8ad4b6d:0:0",                                         // an older release's TAT, in hex
			fmt.Sprintf("%d 0 %d", t0, t0) + head,                       // the numbers of one limit, the head's two
			fmt.Sprintf("%d 0 %d 10000000", t0, t0) + head,              // a limit cut short
			fmt.Sprintf("%d 3000000 %d 10000000 %d", t0, t0, t0) + head, // more tokens than the burst
			fmt.Sprintf("%d 0 %d x %d", t0, t0, t0) + head,              // a word that is no number
			fmt.Sprintf("%d 0 %d 10000000 %d\nhello", t0, t0, t0),       // a meta not ours
			fmt.Sprintf("%d 0 %d 10000000 %d", t0, t0, t0),              // no meta
		} {
			if err := b.Client.Set(ctx, l.stateKey(), foreign, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := l.AllowN(ctx, 1); !errors.Is(err, ErrCorruptState) {
				t.Fatalf("state %q: %v, want ErrCorruptState", foreign, err)
			}
			if got := b.Client.Get(ctx, l.stateKey()).Val(); got != foreign {
				t.Fatalf("state %q was changed to %q", foreign, got)
			}
		}
	})
}

// An override that lowers the burst cuts the tokens above it, and they stay cut when it
// ends: the tokens held at a change of burst are kept, as x/time/rate's SetBurstAt keeps
// them, even while the bucket is full at the lower burst (its state is kept until it is
// full at the callers' burst too).
func TestTokenBucketOverrideKeepsTheTokens(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		limit := Limit{Rate: 10, Period: time.Minute, Burst: 10}
		for _, c := range []struct {
			name string
			d    time.Duration // the override's length; 0: until cleared
		}{{"cleared", 0}, {"expired", 20 * time.Second}} {
			tl := newTimeline(t, b)
			l := tl.limiter("bucket-override-"+c.name, limit, WithAlgorithm(TokenBucket))
			oracle := rate.NewLimiter(rate.Limit(float64(limit.Rate)/limit.Period.Seconds()), limit.Burst)
			t0 := tl.now
			if r, err := l.AllowN(ctx, 2); err != nil || !r.Allowed || r.Remaining != 8 {
				t.Fatalf("%s: AllowN(2): %+v %v", c.name, r, err)
			}
			oracle.AllowN(t0, 2)
			if err := l.Override(ctx, c.d, Limit{Rate: 10, Burst: 5}); err != nil {
				t.Fatal(err)
			}
			oracle.SetBurstAt(t0, 5)
			// 10s later the bucket is full at 5: nothing of it would be left to count from
			tl.at(10 * time.Second)
			if c.d == 0 {
				if err := l.ClearOverride(ctx); err != nil {
					t.Fatal(err)
				}
				oracle.SetBurstAt(tl.now, 10)
			} else {
				tl.at(c.d)
				oracle.SetBurstAt(t0.Add(c.d), 10)
			}
			want := int(oracle.TokensAt(tl.now))
			r, err := l.AllowN(ctx, 0)
			if err != nil || r.Remaining != want {
				t.Fatalf("%s: after the override: Remaining %d (%v), want %d, the tokens x/time/rate keeps", c.name, r.Remaining, err, want)
			}
			if want >= limit.Burst {
				t.Fatalf("%s: the oracle holds a full bucket: the case shows nothing", c.name)
			}
		}
	})
}
