package throttle

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

type hookLog struct {
	mu     sync.Mutex
	events []string
}

func (h *hookLog) add(s string) {
	h.mu.Lock()
	h.events = append(h.events, s)
	h.mu.Unlock()
}

func (h *hookLog) hooks() Hooks {
	return Hooks{
		Allowed: func(key string, n int, wait time.Duration) {
			h.add("allowed " + key + " " + itoa(n) + " " + wait.String())
		},
		Denied: func(key string, n int, r Result) {
			by := ""
			if r.ByCap {
				by += " by cap"
			}
			if r.Turn {
				by += " turn"
			}
			h.add("denied " + key + " " + itoa(n) + " " + r.RetryAfter.String() + by)
		},
		Waited:     func(key string, n int, d time.Duration) { h.add("waited " + key + " " + itoa(n)) },
		Cancelled:  func(key string, n int) { h.add("cancelled " + key + " " + itoa(n)) },
		RedisError: func(key string, err error) { h.add("error " + key) },
		Paused:     func(key string, d time.Duration) { h.add("paused " + key + " " + d.String()) },
		LimitsDrift: func(key string, ours, theirs []Limit) {
			h.add(fmt.Sprintf("drift %s %v %v", key, ours, theirs))
		},
	}
}

func TestHooksReportDecisions(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		var h hookLog
		tl := newTimeline(t, b)
		l := tl.limiter("hooked", PerSecond(2), WithHooks(h.hooks()))
		l.AllowN(ctx, 2)                       // allowed 2 0s
		l.Allow(ctx)                           // denied 1 1s
		r, _ := l.Reserve(ctx, 1, time.Minute) // allowed 1 1s
		r.Cancel(ctx)                          // cancelled 1
		// a tenant's denials say what denied: its cap, its fair turn (10/s books a
		// tenant 250ms ahead at most)
		tn := tl.limiter("tenants", PerSecond(10), WithTenantLimits(PerSecond(3)), WithHooks(h.hooks())).Tenant("a")
		for i := 0; i < 5; i++ {
			tn.Allow(ctx) // allowed 1 0s, three times; denied 1 50ms turn
		}
		tl.at(time.Second / 2)
		tn.Allow(ctx) // denied 1 500ms by cap
		want := []string{"allowed hooked 2 0s", "denied hooked 1 1s", "allowed hooked 1 1s", "cancelled hooked 1",
			"allowed tenants 1 0s", "allowed tenants 1 0s", "allowed tenants 1 0s", "denied tenants 1 50ms turn",
			"denied tenants 1 50ms turn", "denied tenants 1 500ms by cap"}
		if len(h.events) != len(want) {
			t.Fatalf("hooks: %q, want %q", h.events, want)
		}
		for i := range want {
			if h.events[i] != want[i] {
				t.Fatalf("hook %d: %q, want %q", i, h.events[i], want[i])
			}
		}
	})
}

// WaitN's Waited hook comes after a sleep (the server's clock stands still: the second
// permit is booked 50ms ahead whatever the machine's speed), then Paused, then a failed
// call's RedisError.
func TestHooksReportWaitsPausesAndErrors(t *testing.T) {
	b := redistest.NewMini(t)
	ctx := context.Background()
	var h hookLog
	tl := newTimeline(t, b)
	l := tl.limiter("hooked", Limit{Rate: 1, Period: 50 * ms}, WithHooks(h.hooks()))
	if err := l.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Wait(ctx); err != nil { // sleeps 50ms
		t.Fatal(err)
	}
	if err := l.Pause(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	b.SetError("LOADING Redis is loading the dataset in memory")
	if _, err := l.Allow(ctx); err == nil {
		t.Fatal("Allow with a failing server returned nil")
	}
	b.SetError("")
	want := []string{"allowed hooked 1 0s", "allowed hooked 1 50ms", "waited hooked 1", "paused hooked 1s", "error hooked"}
	if len(h.events) != len(want) {
		t.Fatalf("hooks: %q, want %q", h.events, want)
	}
	for i := range want {
		if got := h.events[i]; got != want[i] {
			t.Fatalf("hook %d: %q, want %q", i, got, want[i])
		}
	}
}

// LimitsDrift comes once for each new set of limits another process wrote on the key,
// units and bursts included, and not while the key holds this process's own.
func TestHooksReportLimitsDrift(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		var h hookLog
		tl := newTimeline(t, b)
		tokens := func(n int) Option { return WithLimits(Limit{Rate: n, Period: time.Second, Unit: "tokens"}) }
		ours := tl.limiter("drift", Limit{Rate: 10, Period: time.Second, Burst: 20}, WithAlgorithm(TokenBucket), tokens(1000), WithHooks(h.hooks()))
		other := ctlLimiterOn(tl, ctlOtherClient(t, b), "drift", PerSecond(20), WithAlgorithm(TokenBucket), tokens(500))
		third := ctlLimiterOn(tl, ctlOtherClient(t, b), "drift", PerSecond(30), WithAlgorithm(TokenBucket), tokens(500))
		for _, l := range []*Limiter{ours, other, ours, ours, other, ours, third, ours} {
			if r, err := l.Allow(ctx); err != nil || !r.Allowed {
				t.Fatalf("Allow: %+v %v", r, err)
			}
		}
		want := []string{
			"allowed drift 1 0s",
			"drift drift [10 per 1s (burst 20) 1000 tokens per 1s] [20 per 1s (burst 20) 500 tokens per 1s (burst 500)]",
			"allowed drift 1 0s", "allowed drift 1 0s", // its own limits written
			"allowed drift 1 0s", // the same other set again: not told twice
			"drift drift [10 per 1s (burst 20) 1000 tokens per 1s] [30 per 1s (burst 30) 500 tokens per 1s (burst 500)]",
			"allowed drift 1 0s",
		}
		if fmt.Sprint(h.events) != fmt.Sprint(want) {
			t.Fatalf("hooks:\n%q\nwant\n%q", h.events, want)
		}
	})
}
