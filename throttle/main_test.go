package throttle

import (
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// fakeClock holds each algorithm's script with the clock a test sets (see
// redistest.FakeClockScript): the production Lua on a timeline the test controls, for
// real servers. On miniredis timelines run the production scripts: its clock moves
// TIME and TTLs together.
var fakeClock = map[Algorithm]*redis.Script{
	SlidingWindow:  redistest.FakeClockScript(lua.SlidingWindowSource),
	TokenBucket:    redistest.FakeClockScript(lua.GCRASource),
	FixedWindow:    redistest.FakeClockScript(lua.FixedWindowSource),
	SlidingCounter: redistest.FakeClockScript(lua.SlidingCounterSource),
}

// timeline runs limiters on one backend with a clock the test moves: t0 is
// redistest.Epoch, at(d) sets the clock to t0 + d for every limiter made so far.
type timeline struct {
	t    *testing.T
	b    *redistest.Backend
	now  time.Time
	tags []string
}

func newTimeline(t *testing.T, b *redistest.Backend) *timeline {
	tl := &timeline{t: t, b: b, now: redistest.Epoch}
	b.SetTime(t, tl.now)
	return tl
}

// limiter makes a limiter under the backend's test prefix, on the fake-clock script.
func (tl *timeline) limiter(key string, limit Limit, opts ...Option) *Limiter {
	tl.t.Helper()
	c := newConfig()
	for _, o := range opts {
		o.applyLimiter(c)
	}
	opts = append([]Option{WithKeyPrefix(tl.b.Prefix), WithClock(goClock{tl})}, opts...)
	if tl.b.Real() {
		opts = append(opts, withScript(fakeClock[c.algorithm]))
	}
	l, err := New(tl.b.Client, key, limit, opts...)
	if err != nil {
		tl.t.Fatalf("New(%q, %v): %v", key, limit, err)
	}
	tag := "{" + tl.b.Prefix + key + "}"
	tl.tags = append(tl.tags, tag)
	tl.b.SetTime(tl.t, tl.now, tag)
	return l
}

// at moves the clock to t0 + d.
func (tl *timeline) at(d time.Duration) {
	tl.t.Helper()
	tl.now = redistest.Epoch.Add(d)
	tl.b.SetTime(tl.t, tl.now, tl.tags...)
}

// goClock is a waiter.Clock standing at the timeline's time (timers are real; the
// tests that use it do not sleep).
type goClock struct{ tl *timeline }

func (c goClock) Now() time.Time                        { return c.tl.now }
func (c goClock) NewTimer(d time.Duration) waiter.Timer { return waiter.SystemClock.NewTimer(d) }
