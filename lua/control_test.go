package lua

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// Pause, resume, override and clear, on every limiter script: what they answer, the
// control key they leave (internal/keys reads it), its TTL, what acquires see after them,
// and the pause's and the resume's wake-ups.
func TestControlOps(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, a := range allAlgos {
			tag := tagOf(b, "ctl"+a.suffix)
			clk := newClock(t, b, tag)
			c := limiterCall{a: a, limits: []limit{{4, sec, 4}}, extras: []any{8, 0}}
			over := c.extraIndex(1)
			sub := b.Client.Subscribe(ctx, tag+":wake")
			if _, err := sub.Receive(ctx); err != nil {
				t.Fatal(err)
			}
			control := func() (keys.Control, time.Duration) {
				t.Helper()
				text, err := b.Client.Get(ctx, tag+":pause").Result()
				if err != nil {
					return keys.Control{PauseEnd: -1}, 0
				}
				ctl, err := keys.ParseControl(text)
				if err != nil {
					t.Fatalf("%s: control key %q: %v", a.suffix, text, err)
				}
				return ctl, b.Client.PTTL(ctx, tag+":pause").Val()
			}
			now := clk.us()

			got := c.one(t, b, tag, pauseFor(5*sec))
			if got.v != [6]int64{1, 0, 5 * sec, 0, 0, 0} {
				t.Fatalf("%s: pause: %v", a.suffix, got)
			}
			if ctl, ttl := control(); ctl.PauseEnd != now+5*sec || ctl.Override != nil || (!b.Real() && ttl != 5*time.Second) {
				t.Fatalf("%s: after pause: %+v, TTL %v", a.suffix, ctl, ttl)
			}
			if got := c.one(t, b, tag, acquire(1, 0)); got.v[0] != 0 || got.v[2] != 5*sec || got.v[1] != 0 {
				t.Fatalf("%s: acquire while paused: %v", a.suffix, got)
			}
			if got := c.one(t, b, tag, acquire(1, 10*sec)); got.v[0] != 1 || got.v[4] != now+5*sec {
				t.Fatalf("%s: booking while paused: %v", a.suffix, got)
			}
			if got := c.one(t, b, tag, pauseFor(sec)); got.v[2] != 5*sec {
				t.Fatalf("%s: a shorter pause: %v, want the longer one kept", a.suffix, got)
			}
			for _, what := range []string{"pause", "a shorter pause"} { // each publishes the end in force
				if msg, err := sub.ReceiveMessage(ctx); err != nil || msg.Payload != fmt.Sprintf("p %d", now+5*sec) {
					t.Fatalf("%s: %s published %v %v, want p <pause end>", a.suffix, what, msg, err)
				}
			}
			clk.add(t, time.Second)
			got = c.one(t, b, tag, req{op: opResume})
			if got.v != [6]int64{1, 0, 0, 0, now + 5*sec, 0} {
				t.Fatalf("%s: resume: %v, want the ended pause's end in the fifth integer", a.suffix, got)
			}
			msg, err := sub.ReceiveMessage(ctx)
			if err != nil || msg.Payload != fmt.Sprintf("r %d", now+5*sec) {
				t.Fatalf("%s: resume published %v %v, want r <pause end>", a.suffix, msg, err)
			}
			if ctl, _ := control(); ctl.PauseEnd != -1 {
				t.Fatalf("%s: after resume: %+v, want no control key", a.suffix, ctl)
			}
			if got := c.one(t, b, tag, req{op: opResume}); got.v != [6]int64{1, 0, 0, 0, 0, 0} { // nothing paused: nothing published
				t.Fatalf("%s: resume with no pause: %v", a.suffix, got)
			}

			now = clk.us()
			got = c.one(t, b, tag, req{op: opOverride, n: 1, x: 2 * sec, y: over})
			if got.v != [6]int64{1, 0, 0, 2 * sec, 0, 0} {
				t.Fatalf("%s: override: %v", a.suffix, got)
			}
			ctl, ttl := control()
			want := keys.Control{Override: &keys.Override{End: now + 2*sec, Rates: []keys.Rate{{Rate: 8}}, Set: now}}
			if fmt.Sprint(ctl.PauseEnd, *ctl.Override) != fmt.Sprint(want.PauseEnd, *want.Override) || (!b.Real() && ttl != 2*time.Second) {
				t.Fatalf("%s: after override: %+v %+v, TTL %v", a.suffix, ctl, ctl.Override, ttl)
			}
			got = c.one(t, b, tag, inspect())
			if e := got.extra; e[4] != 2*sec || e[5] != 8 || e[6] != 8 {
				t.Fatalf("%s: inspect under the override: %v", a.suffix, got)
			}
			got = c.one(t, b, tag, req{op: opClear})
			if got.v != [6]int64{1, 0, 0, 0, 0, 0} {
				t.Fatalf("%s: clear: %v", a.suffix, got)
			}
			if ctl, _ := control(); ctl.PauseEnd != -1 {
				t.Fatalf("%s: after clear: %+v, want no control key", a.suffix, ctl)
			}
			// 0 is until cleared (2^45 µs); a lowering override bounds n
			c.extras = []any{1, 1}
			c.one(t, b, tag, req{op: opOverride, n: 1, y: over})
			if ctl, _ := control(); ctl.Override.End != clk.us()+1<<45 {
				t.Fatalf("%s: override of length 0: %+v", a.suffix, ctl.Override)
			}
			if got := c.one(t, b, tag, acquire(2, 10*sec)); !strings.HasPrefix(got.err, "JTEXCEEDS") {
				t.Fatalf("%s: n above the overridden limit: %v", a.suffix, got)
			}
			// in one call, a pause applies to the requests after it
			c.one(t, b, tag, req{op: opClear})
			clk.add(t, 10*time.Second)
			out := c.run(t, b, tag, acquire(1, 0), pauseFor(sec), acquire(1, 0), req{op: opResume}, acquire(1, 0))
			if out[0].v[0] != 1 || out[2].v[0] != 0 || out[2].v[2] != sec || out[4].v[0] != 1 {
				t.Fatalf("%s: acquire, pause, acquire, resume, acquire in one call: %v", a.suffix, out)
			}
			for _, want := range []string{"p", "r"} {
				if msg, err := sub.ReceiveMessage(ctx); err != nil || msg.Payload != fmt.Sprintf("%s %d", want, clk.us()+sec) {
					t.Fatalf("%s: the pause and resume in a batch published %v %v, want %s <pause end>", a.suffix, msg, err, want)
				}
			}
			sub.Close()
		}
	})
}

// A bucket's override settles its tokens at the change and counts at the new rates from
// then on (the two bugs of the absolute TAT): raising 5/s to 10/s brings the next permit
// sooner; a drained bucket of 1 per 2^45µs raised to 10/s refills at once at 10/s;
// lowering a drained 10/s burst-2 bucket to 1/s does not grant at once; raising the burst
// does not hand a drained bucket the new burst. An override that ends is settled at its end.
func TestBucketRateChanges(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		type change struct {
			name          string
			rate, period  int64
			burst         int64
			drain         int64   // permits taken at Epoch
			after         int64   // µs later, the change:
			orate, oburst int64   // an override, or ...
			deploy        []limit // ... the callers' new limits
			wait          int64   // an acquire of 1 then waits this, µs
		}
		for _, tc := range []change{
			{"raise the rate", 5, sec, 1, 1, 100 * ms, 10, 1, nil, 50 * ms},
			{"deploy a fast rate over a slow one", 1, 1 << 45, 1, 1, 100 * ms, 0, 0, []limit{{10, sec, 1}}, 100 * ms},
			{"lower the rate", 10, sec, 2, 2, 0, 1, 2, nil, sec},
			{"raise the burst", 10, sec, 2, 2, 0, 10, 8, nil, 100 * ms},
		} {
			tag := tagOf(b, strings.ReplaceAll(tc.name, " ", ""))
			clk := newClock(t, b, tag)
			c := limiterCall{a: tokenBucket, limits: []limit{{tc.rate, tc.period, tc.burst}}, extras: []any{tc.orate, tc.oburst}}
			if got := c.one(t, b, tag, acquire(tc.drain, 0)); got.v[0] != 1 {
				t.Fatalf("%s: drain: %v", tc.name, got)
			}
			clk.add(t, time.Duration(tc.after)*time.Microsecond)
			if tc.deploy != nil {
				c.limits = tc.deploy
			} else {
				c.one(t, b, tag, req{op: opOverride, n: 1, x: sec, y: c.extraIndex(1)})
			}
			if got := c.one(t, b, tag, acquire(1, 0)); got.v[2] != tc.wait || got.v[0] != 0 {
				t.Fatalf("%s: %v, want a wait of %dµs", tc.name, got, tc.wait)
			}
		}
		// the override of 1/s ends at +1.1s: 10/s from then on
		tag := tagOf(b, "overrideends")
		clk := newClock(t, b, tag)
		c := limiterCall{a: tokenBucket, limits: []limit{{10, sec, 2}}, extras: []any{1, 2}}
		c.one(t, b, tag, acquire(2, 0))
		c.one(t, b, tag, req{op: opOverride, n: 1, x: sec, y: c.extraIndex(1)})
		clk.add(t, 1100*time.Millisecond) // 1s at 1/s, then 100ms at 10/s: 2 tokens
		if got := c.one(t, b, tag, acquire(2, 0)); got.v[0] != 1 {
			t.Fatalf("after the override's end: %v, want 2 tokens", got)
		}
	})
}

// The control key's text is the same on both sides: what internal/keys writes, the
// scripts read (Inspect shows the pause and the override); what it refuses, they find
// foreign (JTSTATE).
func TestControlTextMatchesKeys(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tag := tagOf(b, "ctltext")
		clk := newClock(t, b, tag)
		now := clk.us()
		c := limiterCall{a: tokenBucket, limits: []limit{{4, sec, 4}, {9, sec, 9}}}
		for _, ctl := range []keys.Control{
			{PauseEnd: now + 3*sec},
			{PauseEnd: 0, Override: &keys.Override{End: now + 2*sec, Rates: []keys.Rate{{Rate: 7, Burst: 2}}, Set: now}},
			{PauseEnd: now + sec, Override: &keys.Override{End: now + 2*sec, Rates: []keys.Rate{{Rate: 7}, {Rate: 5, Burst: 6}}}},
		} {
			b.Client.Set(ctx, tag+":pause", ctl.String(), 0)
			got := c.one(t, b, tag, inspect())
			wantPause, wantOver := max(0, ctl.PauseEnd-now), int64(0)
			if ctl.Override != nil {
				wantOver = ctl.Override.End - now
			}
			if got.err != "" || got.extra[2] != wantPause || got.extra[4] != wantOver {
				t.Fatalf("%q: %v, want paused %d, override %d", ctl.String(), got, wantPause, wantOver)
			}
			if ctl.Override != nil && (got.extra[5] != 7 || got.extra[6] != map[bool]int64{true: 2, false: 7}[ctl.Override.Rates[0].Burst == 2]) {
				t.Fatalf("%q: rates in force %v", ctl.String(), got.extra)
			}
		}
		for _, text := range []string{"", "x", "01", "1 2", "0 5 1 0 0", "0 5 1 1000000001 0", "0 5 1 5 1000000001",
			"0 5 17 1 1", "0 5 1 5 5 6 7", "9007199254740992", "-1"} {
			_, goErr := keys.ParseControl(text)
			b.Client.Set(ctx, tag+":pause", text, 0)
			got := c.one(t, b, tag, inspect())
			if foreign := strings.HasPrefix(got.err, "JTSTATE"); foreign != (goErr != nil) {
				t.Errorf("%q: script %v, internal/keys %v", text, got, goErr)
			}
		}
	})
}
