package lua

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The arguments a call's requests share (the group's head, the caps' head, the number of
// requests) fail the call as a whole with JTARG, before anything is written; good ones
// work.
func TestCallArgumentErrors(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, a := range allAlgos {
			tag := tagOf(b, a.tag)
			newClock(t, b, tag)
			good := a.head([]limit{{5, sec, 5}})
			other := map[bool]string{true: "sw 5 1000000", false: "tb 5 1000000 5"}[a.burst]
			heads := map[string]string{
				"empty":           "",
				"unknown tag":     "xx 5 1000000",
				"another's tag":   other,
				"no limits":       a.tag,
				"rate 0":          strings.Replace(good, " 5 ", " 0 ", 1),
				"rate 1e9+1":      strings.Replace(good, " 5 ", " 1000000001 ", 1),
				"rate fraction":   strings.Replace(good, " 5 ", " 1.5 ", 1),
				"rate negative":   strings.Replace(good, " 5 ", " -5 ", 1),
				"period 0":        strings.Replace(good, " 1000000", " 0", 1),
				"period 2^45+1":   strings.Replace(good, " 1000000", " 35184372088833", 1),
				"a number short":  good[:strings.LastIndexByte(good, ' ')],
				"a number more":   good + " 7",
				"17 limits":       good + strings.Repeat(good[strings.Index(good, " 5 "):], 16),
				"period 20 digit": strings.Replace(good, " 1000000", " 99999999999999999999", 1),
			}
			if a.burst {
				heads["burst 0"] = "tb 5 1000000 0"
				heads["burst x period above 2^50"] = "tb 5 1125899906842624 2"
			}
			if a == slidingCounter {
				heads["buckets 0"] = "sc 0 5 1000000"
				heads["buckets 10001"] = "sc 10001 5 1000000"
				heads["no buckets"] = "sc 5 1000000"
			}
			one := []any{"a 1 0"}
			cases := map[string][]any{
				"no arguments":          {},
				"no requests":           {good, ""},
				"head only":             {good},
				"1001 requests":         append([]any{good, ""}, manyOf("a 1 0", 1001)...),
				"caps of another's tag": append([]any{good, other}, one...),
				"caps malformed":        append([]any{good, a.tag + " 0 1"}, one...),
				"caps of no limits":     append([]any{good, a.tag}, one...),
			}
			for name, h := range heads {
				cases["head "+name] = append([]any{h, ""}, one...)
				if h != "" {
					cases["caps "+name] = append([]any{good, h}, one...)
				}
			}
			if a.tag == keys.SlidingWindow { // the log script serves both of its tags, not mixed
				cases["caps of the counter"] = append([]any{good, "sc 10 5 1000000"}, one...)
			}
			state := []string{tag + ":" + keys.State}
			for name, args := range cases {
				err := script(b, a.name).Run(ctx, b.Client, state, args...).Err()
				if err == nil || !strings.Contains(err.Error(), "JTARG") {
					t.Errorf("%s, %s: %v, want a JTARG error", a.tag, name, err)
				}
				if n := b.Client.Exists(ctx, state...).Val(); n != 0 {
					t.Fatalf("%s, %s: the state was written", a.tag, name)
				}
			}
			args := append([]any{good, ""}, manyOf("a 0 0", protocol.MaxRequests)...)
			if err := script(b, a.name).Run(ctx, b.Client, state, args...).Err(); err != nil {
				t.Errorf("%s: %d requests: %v", a.tag, protocol.MaxRequests, err)
			}
			if err := script(b, a.name).Run(ctx, b.Client, state, good, a.head([]limit{{2, sec, 2}}), "a 1 0").Err(); err != nil {
				t.Errorf("%s: with caps: %v", a.tag, err)
			}
		}
	})
}

func manyOf(text string, n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = text
	}
	return out
}

// A request's bad text fails that request only, with ErrArg (its text, for people,
// starting JTARG), and writes nothing: the call's other requests are decided and leave
// what they would alone. KEYS[2..4] are a booking, the fair share's queue and a tenant's
// state; a key option must name a key of its kind.
func TestRequestArgumentErrors(t *testing.T) {
	long := strings.Repeat("n", protocol.MaxTenant+1)
	bad := []string{
		"", " ", "z", "A 1 0", "a", "a 1", "a -1 0", "a 1 -1", "a x 0", "a 1.0 0", "a 1 1e3", "a 0x1 0",
		"a 1000000001 0", "a 1 9007199254740992", "a 99999999999999999999 0", "a 1 99999999999999999999", "a 1 0 5",
		"a 1 0 l5", "a 1 0 b1", "a 1 0 b5", "a 1 0 b0", "a 1 0 bx", "a 1 0 b", "a 1 0 b2 lx", "a 1 0 b2 l-1",
		"a 1 0 z1", "a 1 0 h1", "a 1 0 t", "a 1 0 q3 t" + long, "a 1 0 tacme", "a 1 0 q3", "a 1 0 w5",
		"a 1 0 k5", "a 1 0 h", "a 1 0 q3 w0 tacme", "a 1 0 q3 w1000000000001 tacme", "a 1 0 q3 kx tacme",
		"a 1 0 q3 k9007199254740992 tacme", "a 1 0 c4 q3 tacme",
		"a 1 0 b3", "a 1 0 q2 tacme", "a 1 0 q4 tacme", // a key of another kind
		"c 1", "c 1 x", "c x 1", "c 1 1 l5", "c 1 1 c4", "c 1 1 b3",
		"i 1", "i x", "i b", "i c4", "i q2",
		"p", "p 0", "p 35184372088833", "p 5 6", "p x",
		"r 5", "x 5", "r b", "x k1",
		"o", "o 5", "o 5 1", "o 5 0 0", "o 5 1 1000000001", "o 5 1 1 1 1", "o 35184372088833 1 1", "o x 1 1",
		"o 5 1 1 1",
		"W 5 1000000 q3", "W 5 0 q3 tacme", "W x 1 q3 tacme", "W 5 1000000 tacme", "W 5", "W 35184372088833 1 q3 tacme",
	}
	withCaps := []string{"a 1 0 q3 tacme", "c 1 1 q3 tacme", "a 1 0 c2 q3 tacme", "a 1 0 c3 q3 tacme"}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, a := range allAlgos {
			for _, caps := range []bool{false, true} {
				c := call{a: a, limits: []limit{{5, sec, 5}}}
				cases := bad
				if caps {
					c.caps = []limit{{2, sec, 2}}
					cases = append(withCaps, "a 1 0 q3 tacme c2")
				}
				ref := tagOf(b, fmt.Sprintf("%s%vref", a.tag, caps))
				tag := tagOf(b, fmt.Sprintf("%s%v", a.tag, caps))
				newClock(t, b, ref, tag)
				extra := func(tag string) []string {
					return []string{tag + ":bk:t", tag + ":" + keys.FairQueue, tag + ":" + keys.Tenant + "acme"}
				}
				all := func(tag string) []string { return append([]string{tag + ":" + keys.State}, extra(tag)...) }
				c.raw(t, b, ref, extra(ref), "a 1 0")
				want := snapshot(t, b.Client, all(ref)...)
				for _, text := range cases {
					out := c.raw(t, b, tag, extra(tag), text, "a 1 0")
					if out[0].code() != protocol.ErrArg || !strings.HasPrefix(out[0].err, "JTARG ") {
						t.Errorf("%s, caps %v, %q: %v, want an ErrArg error", a.tag, caps, text, out[0])
					}
					if out[1].v[0] != 1 || out[1].v[1] != 4 {
						t.Errorf("%s, caps %v, %q: the good request got %v", a.tag, caps, text, out[1])
					}
					got := snapshot(t, b.Client, all(tag)...)
					for i, k := range all(tag) {
						g, w := strings.ReplaceAll(got[k], tag, ref), want[all(ref)[i]]
						if b.Real() { // the fake clock stretches TTLs
							g, w = g[:strings.LastIndex(g, " ttl ")], w[:strings.LastIndex(w, " ttl ")]
						}
						if g != w {
							t.Errorf("%s, caps %v, %q: %s holds %s, want %s", a.tag, caps, text, k, g, w)
						}
					}
					b.Client.Del(context.Background(), all(tag)...)
				}
			}
		}
	})
}

// Pause, resume, override and clear, on every limiter script: what they answer, the
// meta they leave in the state (internal/keys reads it; a pause on an idle key is a meta
// alone) and its TTL, what acquires see after them, and the wake-ups published.
func TestControlOps(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, a := range allAlgos {
			tag := tagOf(b, "ctl"+a.tag)
			state := tag + ":" + keys.State
			clk := newClock(t, b, tag)
			c := call{a: a, limits: []limit{{4, sec, 4}}}
			sub := b.Client.Subscribe(ctx, tag+":"+keys.Wake)
			if _, err := sub.Receive(ctx); err != nil {
				t.Fatal(err)
			}
			woke := func(want string) {
				t.Helper()
				msg, err := sub.ReceiveMessage(ctx)
				if err != nil || msg.Payload != want {
					t.Fatalf("%s: published %v %v, want %q", a.tag, msg, err, want)
				}
			}
			fail := func(what string, got any) {
				t.Helper()
				m, _ := meta(t, b.Client, state)
				t.Fatalf("%s: %s: %v (meta %q)", a.tag, what, got, m)
			}
			now := clk.us()

			if got := c.one(t, b, tag, pause(5*sec)); got.v != [7]int64{1, 0, 5 * sec, 0, 0, 0, 0} {
				fail("pause", got)
			}
			woke(fmt.Sprintf("p %d", now+5*sec))
			m := parseMeta(t, b.Client, state)
			if _, alone := meta(t, b.Client, state); !alone || m.Head != c.a.head(c.limits) || m.PauseEnd != now+5*sec || m.Override != nil {
				fail("after a pause on an idle key, want its meta alone", m)
			}
			if ttl := b.Client.PTTL(ctx, state).Val(); !b.Real() && ttl != 5*time.Second {
				fail("the pause's TTL", ttl)
			}
			if got := c.one(t, b, tag, acquire(1, 0)); got.v != [7]int64{0, 0, 5 * sec, 0, 0, 0, group | paused} {
				fail("acquire while paused", got)
			}
			if got := c.one(t, b, tag, inspect()); got.v[1] != 0 || got.v[2] != 5*sec || got.v[6] != paused || got.extra[2] != 5*sec || got.extra[5] != now+5*sec {
				fail("inspect while paused", got)
			}
			if got := c.one(t, b, tag, acquire(1, 10*sec)); got.v[0] != 1 || got.v[2] != 5*sec || got.v[4] != now+5*sec || got.v[6] != paused {
				fail("booking while paused", got)
			}
			if got := c.one(t, b, tag, pause(sec)); got.v[2] != 5*sec {
				fail("a shorter pause, want the longer one kept", got)
			}
			woke(fmt.Sprintf("p %d", now+5*sec)) // each pause publishes the end in force
			clk.add(t, time.Second)
			if got := c.one(t, b, tag, resume()); got.v != [7]int64{1, 0, 0, 0, now + 5*sec, 0, 0} {
				fail("resume, want the ended pause's end in the fifth integer", got)
			}
			woke(fmt.Sprintf("r %d", now+5*sec))
			if m := parseMeta(t, b.Client, state); m.PauseEnd != 0 {
				fail("after resume", m)
			}
			if got := c.one(t, b, tag, resume()); got.v != [7]int64{1, 0, 0, 0, 0, 0, 0} {
				fail("resume with no pause", got)
			}

			now = clk.us()
			if got := c.one(t, b, tag, override(2*sec, 8, 0)); got.v != [7]int64{1, 0, 0, 2 * sec, 0, 0, 0} {
				fail("override", got)
			}
			m = parseMeta(t, b.Client, state)
			if o := m.Override; o == nil || o.End != now+2*sec || o.Set != now || fmt.Sprint(o.Rates) != "[{8 0}]" {
				fail("after override", m.Override)
			}
			if ttl := b.Client.PTTL(ctx, state).Val(); !b.Real() && ttl < 2*time.Second {
				fail("TTL under an override", ttl)
			}
			if got := c.one(t, b, tag, inspect()); got.extra[4] != 2*sec || got.extra[5] != 0 || got.extra[6] != 8 || got.extra[7] != 8 {
				fail("inspect under the override", got)
			}
			if got := c.one(t, b, tag, clearOver()); got.v != [7]int64{1, 0, 0, 0, 0, 0, 0} {
				fail("clear", got)
			}
			if m := parseMeta(t, b.Client, state); m.Override != nil {
				fail("after clear", m.Override)
			}
			// 0 is until cleared (2^45 µs); a lowering override bounds n
			c.one(t, b, tag, override(0, 1, 1))
			if m := parseMeta(t, b.Client, state); m.Override == nil || m.Override.End != clk.us()+protocol.MaxPeriod {
				fail("override of length 0", m.Override)
			}
			if got := c.one(t, b, tag, acquire(2, 10*sec)); got.code() != protocol.ErrExceeds {
				fail("n above the overridden limit", got)
			}
			// in one call, a pause applies to the requests after it
			c.one(t, b, tag, clearOver())
			clk.add(t, 10*time.Second)
			out := c.run(t, b, tag, acquire(1, 0), pause(sec), acquire(1, 0), resume(), acquire(1, 0))
			if out[0].v[0] != 1 || out[2].v[0] != 0 || out[2].v[2] != sec || out[2].v[6] != group|paused || out[4].v[0] != 1 {
				fail("acquire, pause, acquire, resume, acquire in one call", out)
			}
			woke(fmt.Sprintf("p %d", clk.us()+sec))
			woke(fmt.Sprintf("r %d", clk.us()+sec))
			// a pause on an idle key that ends leaves nothing
			clk.add(t, 10*time.Second)
			b.Client.Del(ctx, state)
			c.one(t, b, tag, pause(sec))
			c.one(t, b, tag, resume())
			if n := b.Client.Exists(ctx, state).Val(); n != 0 {
				fail("a pause on an idle key, resumed", snapshot(t, b.Client, state))
			}
			sub.Close()
		}
	})
}

// A call whose head differs from the stored one (another process's limits on the same
// key) decides with its own limits and says FlagDrift; what it writes carries its head.
// A call with the stored head says nothing.
func TestDrift(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, a := range allAlgos {
			tag := tagOf(b, "drift"+a.tag)
			state := tag + ":" + keys.State
			newClock(t, b, tag)
			c1 := call{a: a, limits: []limit{{4, sec, 4}}}
			c2 := call{a: a, limits: []limit{{2, sec, 2}}}
			if got := c1.one(t, b, tag, acquire(1, 0)); got.v[0] != 1 || got.v[6] != 0 {
				t.Fatalf("%s: %v", a.tag, got)
			}
			if got := c2.one(t, b, tag, acquire(1, 0)); got.v[0] != 1 || got.v[6] != drift {
				t.Fatalf("%s: another head's acquire: %v, want granted with FlagDrift", a.tag, got)
			}
			if m := parseMeta(t, b.Client, state); m.Head != c2.a.head(c2.limits) {
				t.Fatalf("%s: head %q after the other head's grant", a.tag, m.Head)
			}
			// c1's limits would grant two more (a bucket: in 250ms at 4/s); c2's do not
			got := c2.one(t, b, tag, acquire(2, 0))
			if got.v[0] != 0 || got.v[6] != group || (a.burst && got.v[2] != 500*ms) {
				t.Fatalf("%s: its own head again: %v, want denied by its limits (a bucket: 500ms at 2/s), no flag but the group's", a.tag, got)
			}
			if got := c1.one(t, b, tag, acquire(1, sec)); got.v[0] != 1 || got.v[6] != drift {
				t.Fatalf("%s: the first head again: %v, want granted with FlagDrift", a.tag, got)
			}
			if m := parseMeta(t, b.Client, state); m.Head != c1.a.head(c1.limits) {
				t.Fatalf("%s: head %q, want the last writer's", a.tag, m.Head)
			}
			if got := c2.one(t, b, tag, inspect()); got.v[6] != drift {
				t.Fatalf("%s: inspect with another head: %v, want FlagDrift", a.tag, got)
			}
			// the drift line lives its minute, as the state's TTL says, though the data
			// matters no longer (a bucket: full again in 250ms)
			if ttl := b.Client.PTTL(context.Background(), state).Val(); !b.Real() && ttl < time.Minute-time.Second {
				t.Fatalf("%s: the state's TTL %v with a drift line just noted, want a minute", a.tag, ttl)
			}
		}
		// the counter's sub-buckets are part of its head
		tag := tagOf(b, "driftbuckets")
		newClock(t, b, tag)
		c := call{a: slidingCounter, limits: []limit{{4, sec, 0}}}
		c.one(t, b, tag, acquire(1, 0))
		c.a.buckets = 10
		if got := c.one(t, b, tag, acquire(1, 0)); got.v[6] != drift {
			t.Fatalf("sc with other buckets: %v", got)
		}
	})
}

// One algorithm per key, by the state's content: a call that finds another algorithm's
// state fails every request with ErrAlg (its text starting with the stored head's tag)
// and writes nothing.
func TestOneAlgorithmPerKey(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, o := range allAlgos {
			for _, a := range allAlgos {
				if a == o {
					continue
				}
				tag := tagOf(b, "alg"+o.tag+a.tag)
				all := []string{tag + ":" + keys.State, tag + ":bk:t", tag + ":" + keys.FairQueue, tag + ":t:acme"}
				newClock(t, b, tag)
				call{a: o, limits: []limit{{5, sec, 5}}}.one(t, b, tag, acquire(1, 0))
				before := snapshot(t, b.Client, all...)
				c := call{a: a, limits: []limit{{5, sec, 5}}, caps: []limit{{2, sec, 2}}}
				out := c.run(t, b, tag, acquire(1, 0), acquire(0, 0), inspect(), pause(sec), resume(), cancel(1, 1),
					override(sec, 3, 3), clearOver(), booking(acquire(1, 10*sec), "t", 0), c.of("acme", acquire(1, 0)),
					c.of("acme", inspect()))
				for i, r := range out {
					if r.code() != protocol.ErrAlg || !strings.HasPrefix(r.err, o.tag+" ") {
						t.Errorf("%s on %s's state, request %d: %v, want ErrAlg naming %s", a.tag, o.tag, i+1, r, o.tag)
					}
				}
				if after := snapshot(t, b.Client, all...); !sameKeys(b, before, after) {
					t.Errorf("%s on %s's state: %v became %v", a.tag, o.tag, before, after)
				}
				// a plain acquire alone (the fast path) too
				if got := (call{a: a, limits: c.limits}).one(t, b, tag, acquire(1, 0)); got.code() != protocol.ErrAlg {
					t.Errorf("%s on %s's state, a plain acquire: %v", a.tag, o.tag, got)
				}
				b.Client.Del(ctx, all...)
			}
		}
	})
}

// A meta alone (a pause or an override on an idle key) is any algorithm's: a call of
// another algorithm than the one that set it honours it and takes the key, its head
// the caller's.
func TestMetaAloneIsAnyAlgorithms(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, o := range allAlgos {
			for _, a := range allAlgos {
				tag := tagOf(b, "alone"+o.tag+a.tag)
				state := tag + ":" + keys.State
				clk := newClock(t, b, tag)
				call{a: o, limits: []limit{{5, sec, 5}}}.one(t, b, tag, pause(sec))
				c := call{a: a, limits: []limit{{5, sec, 5}}}
				if got := c.one(t, b, tag, acquire(1, 0)); got.v[0] != 0 || got.v[2] != sec || got.v[6] != group|paused {
					t.Errorf("%s on %s's pause: %v, want paused", a.tag, o.tag, got)
					continue
				}
				if got := c.one(t, b, tag, acquire(1, 2*sec)); got.v[0] != 1 || got.v[4] != clk.us()+sec {
					t.Errorf("%s on %s's pause: %v, want booked at its end", a.tag, o.tag, got)
				}
				if m := parseMeta(t, b.Client, state); m.Head != a.head(c.limits) || m.PauseEnd != clk.us()+sec {
					t.Errorf("%s on %s's pause: meta %+v", a.tag, o.tag, m)
				}
			}
		}
	})
}

// The meta's text is read alike on both sides: a state whose meta internal/keys refuses
// (keys.Check), the scripts find foreign (ErrState), and one it reads, they read
// (Inspect shows its pause and override); none makes a script fail otherwise. The scripts
// refuse a few that keys.Check reads (it is lenient): a negative pause end, a space
// after a number, an override's rate or burst out of range, an infinite tag.
func TestMetaTextMatchesKeys(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tag := tagOf(b, "metatext")
		state := tag + ":" + keys.State
		clk := newClock(t, b, tag)
		now := clk.us()
		c := call{a: tokenBucket, limits: []limit{{4, sec, 4}, {9, sec, 9}}}
		head := c.a.head(c.limits)
		for _, line := range []string{
			"", fmt.Sprintf("p %d", now+3*sec), fmt.Sprintf("o %d %d 7 2", now+2*sec, now),
			fmt.Sprintf("o %d %d 7 0 5 6", now+2*sec, now-sec), fmt.Sprintf("p %d\no %d %d 7 2", now+sec, now+2*sec, now),
			fmt.Sprintf("w %d 2000000 4 acme", now+sec), fmt.Sprintf("w %d 2000000 5 a\nb c\np %d", now+sec, now+sec),
			fmt.Sprintf("f 0 1000000 %d 100000", now), fmt.Sprintf("f 12.5 3000000 %d 20.25", now),
			"p", "p x", "p 1 2", "o", "o 1 2", "o 1 2 3", "o 1 2 5 x", "o x 2 5 0", "f 1 2 3", "f x 1 2 3",
			"f nan 1 2 3", "w 1 2 0 ", "w 1 2 9 acme", "w x 2 4 acme", "q 5", " p 5",
		} {
			text := head
			if line != "" {
				text += "\n" + line
			}
			for _, data := range []string{"", fmt.Sprintf("%d 1000000 0 1000000 0", now)} {
				b.Client.Set(ctx, state, data+"\n"+text, 0)
				checkErr := keys.Check(keys.State, "string", []string{data + "\n" + text})
				got := c.one(t, b, tag, inspect())
				if foreign := got.code() == protocol.ErrState; foreign != (checkErr != nil) {
					t.Errorf("meta %q (data %q): script %v, keys.Check %v", text, data, got, checkErr)
					continue
				}
				if checkErr != nil {
					continue
				}
				m, _ := keys.ParseMeta(text)
				wantOver := int64(0)
				if m.Override != nil {
					wantOver = m.Override.End - now
				}
				wantEnd := m.PauseEnd // the pause's end while it lasts, else 0
				if wantEnd <= now {
					wantEnd = 0
				}
				if got.extra[2] != max(0, m.PauseEnd-now) || got.extra[4] != wantOver || got.extra[5] != wantEnd {
					t.Errorf("meta %q: %v, want paused %d, override %d, pause end %d", text, got, max(0, m.PauseEnd-now), wantOver, wantEnd)
				}
			}
		}
		for _, line := range []string{"p -1", "p 5 ", "o 1 2 0 0", "o 1 2 1000000001 0", "o 1 2 5 1000000001", "f 1 2 3 inf"} {
			b.Client.Set(ctx, state, "\n"+head+"\n"+line, 0)
			if got := c.one(t, b, tag, inspect()); got.code() != protocol.ErrState {
				t.Errorf("meta line %q: %v, want ErrState", line, got)
			}
		}
	})
}

// Bookings by task, on every limiter script: a booking ahead is recorded "token n stamp";
// the task's next acquire finds it (status 2, a new stamp); a give-back with a stale stamp
// does nothing, with the current one gives the permits back and deletes the record; a
// record past its token is used only within late µs; another n, a pause after the token,
// or an override set since that lowers the limits make the acquire book anew.
func TestBookings(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, a := range allAlgos {
			tag := tagOf(b, "bk"+a.tag)
			clk := newClock(t, b, tag)
			c := call{a: a, limits: []limit{{1, sec, 1}}}
			record := func() string {
				v, _ := b.Client.Get(ctx, tag+":bk:task").Result()
				return v
			}
			book := func(n int, maxWait, late int64) res {
				return c.one(t, b, tag, booking(acquire(n, maxWait), "task", late))
			}
			giveBack := func(n int, stamp int64) res {
				return c.one(t, b, tag, booking(cancel(n, stamp), "task", 0))
			}
			fail := func(what string, got any) {
				t.Helper()
				t.Fatalf("%s: %s: %v (record %q)", a.tag, what, got, record())
			}
			// a grant that takes effect now is not recorded
			if got := book(1, 0, 0); got.v[0] != 1 || got.v[5] != 0 || record() != "" {
				fail("a grant now", got)
			}
			t0 := clk.us()
			// booked ahead: recorded "token n stamp", a second past the token
			got := book(1, 10*sec, 0)
			token, stamp := got.v[4], got.v[5]
			if got.v[0] != 1 || token <= t0 || stamp != t0 || record() != fmt.Sprintf("%d 1 %d", token, t0) {
				fail("a booking ahead", got)
			}
			checkKey(t, b.Client, tag+":bk:task")
			if ttl := b.Client.PTTL(ctx, tag+":bk:task").Val(); !b.Real() && ttl != time.Duration(token-t0+sec)*time.Microsecond {
				fail("the record's TTL", ttl)
			}
			// found again: kept, with a new stamp
			clk.add(t, time.Millisecond)
			got = book(1, 0, 0)
			if got.v[0] != 2 || got.v[4] != token || got.v[2] != token-clk.us() || got.v[5] != clk.us() || got.v[6] != 0 {
				fail("the booking found", got)
			}
			newStamp := got.v[5]
			if got := giveBack(1, stamp); got.v != [7]int64{0, 0, 0, got.v[3], 0, 0, 0} || record() == "" {
				fail("a stale give-back", got)
			}
			if got := giveBack(1, newStamp); got.v[0] != 1 || got.v[4] != token || record() != "" {
				fail("the give-back", got)
			}
			// the slot is free again
			if got := book(1, 10*sec, 0); got.v[0] != 1 || got.v[4] != token {
				fail("after the give-back", got)
			}
			// booked ahead, come back late
			got = book(1, 10*sec, 0)
			token = got.v[4]
			clk.set(t, time.UnixMicro(token+100*ms))
			if got := book(1, 10*sec, 50*ms); got.v[0] == 2 {
				fail("100ms late, 50ms allowed", got)
			}
			got = book(1, 10*sec, 0)
			token = got.v[4]
			clk.set(t, time.UnixMicro(token+100*ms))
			if got := book(1, 0, 200*ms); got.v[0] != 2 || got.v[2] != 0 || got.v[4] != token {
				fail("100ms late, 200ms allowed", got)
			}
			// another n books anew
			if a.burst {
				c.limits[0].burst = 2
			} else {
				c.limits[0].rate = 2
			}
			clk.add(t, 10*time.Second)
			c.one(t, b, tag, acquire(2, 10*sec))
			token = book(1, 10*sec, 0).v[4]
			if got := book(2, 10*sec, 0); got.v[0] != 1 || got.v[4] == token {
				fail("another n", got)
			}
			// a pause after the token
			clk.add(t, 10*time.Second)
			c.one(t, b, tag, acquire(2, 10*sec))
			token = book(2, 10*sec, 0).v[4]
			c.one(t, b, tag, pause(token-clk.us()+sec))
			if got := book(2, 20*sec, 0); got.v[0] != 1 || got.v[4] < token+sec {
				fail("a pause overtook the booking", got)
			}
			c.one(t, b, tag, resume())
			// an override set since that lowers the limits: given back, booked anew
			clk.add(t, 30*time.Second)
			c.one(t, b, tag, acquire(2, 10*sec))
			got = book(1, 10*sec, 0)
			stamp = got.v[5]
			lower := func() int64 {
				clk.add(t, time.Millisecond)
				c.one(t, b, tag, override(100*sec, 1, 1)) // the bucket: its burst 2 lowered to 1; the others: the rate 2 to 1
				set := clk.us()
				clk.add(t, time.Millisecond)
				return set
			}
			set := lower()
			got = book(1, 20*sec, 0)
			if got.v[0] != 1 || got.v[5] <= set || got.v[5] <= stamp {
				fail("re-placed under a lower override", got)
			}
			if got := book(1, 20*sec, 0); got.v[0] != 2 {
				fail("the re-placed booking found", got)
			}
			// re-placed and denied: the record goes (its permits were given back)
			lower()
			if got := book(1, 0, 0); got.v[0] != 0 || record() != "" {
				fail("re-placed, denied", got)
			}
			c.one(t, b, tag, clearOver())
		}
	})
}

// Requests of one call on one booking key see each other: the second finds what the
// first booked; a give-back in the same call deletes it.
func TestBookingsInOneCall(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, a := range allAlgos {
			tag := tagOf(b, "bk1"+a.tag)
			newClock(t, b, tag)
			c := call{a: a, limits: []limit{{1, sec, 1}}}
			out := c.run(t, b, tag, acquire(1, 0), booking(acquire(1, 5*sec), "t", 0), booking(acquire(1, 0), "t", 0))
			if out[1].v[0] != 1 || out[2].v[0] != 2 || out[2].v[4] != out[1].v[4] || out[2].v[5] != out[1].v[5]+1 {
				t.Fatalf("%s: %v", a.tag, out)
			}
			out = c.run(t, b, tag, booking(cancel(1, out[2].v[5]), "t", 0), booking(acquire(1, 0), "t", 0))
			if out[0].v[0] != 1 || out[1].v[0] != 0 {
				t.Fatalf("%s: give-back, then a booking with max wait 0: %v", a.tag, out)
			}
			if n := b.Client.Exists(context.Background(), tag+":bk:t").Val(); n != 0 {
				t.Fatalf("%s: the record is still there", a.tag)
			}
		}
	})
}

// A tenant's request takes from the group's limits and its caps at once, or from
// neither: a cap that is full denies it (FlagCap) and the group keeps its room; a group
// that is full denies it (FlagGroup) and the caps keep theirs; the denial names the
// limit whose room comes later, and, past the tenants' horizon, the wait is until the
// request can book within it. Inspect of a tenant shows its caps.
func TestTenantsTakeFromGroupAndCaps(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, a := range allAlgos {
			tag := tagOf(b, "caps"+a.tag)
			all := []string{tag + ":l", tag + ":q", tag + ":t:A", tag + ":t:B", tag + ":t:C"}
			clk := newClock(t, b, tag)
			// the group 4/s; each tenant 2 per 4s; the horizon two slots, 500ms
			c := call{a: a, limits: []limit{{4, sec, 4}}, caps: []limit{{2, 4 * sec, 2}}}
			now := clk.us()
			fail := func(what string, got any) {
				t.Helper()
				t.Fatalf("%s: %s: %v\n%v", a.tag, what, got, snapshot(t, b.Client, all...))
			}
			unchanged := func(what string, r *protocol.Request, flags int64) {
				t.Helper()
				before := snapshot(t, b.Client, all...)
				if got := c.one(t, b, tag, r); got.v[0] != 0 || got.v[6] != flags || got.v[2] < 1 || got.v[4] != 0 {
					fail(what, got)
				}
				if after := snapshot(t, b.Client, all...); !sameKeys(b, before, after) {
					fail(what+": the denial wrote", fmt.Sprint(before, "\nbecame ", after))
				}
			}
			if got := c.one(t, b, tag, c.of("A", acquire(2, 0))); got.v != [7]int64{1, 2, 0, got.v[3], now, 0, 0} {
				fail("A takes 2", got)
			}
			unchanged("A's cap is full, the group is not", c.of("A", acquire(1, 0)), capped)
			unchanged("beyond the horizon", c.of("A", acquire(1, 10*sec)), capped)
			if a == slidingWindow { // the cap's room at +4s, asked again 500ms before
				if got := c.one(t, b, tag, c.of("A", acquire(1, 10*sec))); got.v[2] != 4*sec-500*ms {
					fail("the wait beyond the horizon, want 3.5s", got)
				}
			}
			if got := c.one(t, b, tag, c.of("B", acquire(2, 0))); got.v[0] != 1 || got.v[1] != 0 {
				fail("B takes 2", got)
			}
			unchanged("the group is full, C's cap is not", c.of("C", acquire(1, 0)), group)
			for _, k := range all[2:4] {
				checkKey(t, b.Client, k)
				if ttl := b.Client.PTTL(ctx, k).Val(); ttl <= 0 {
					fail(k+"'s TTL", ttl)
				}
			}
			if n := b.Client.Exists(ctx, tag+":t:C").Val(); n != 0 {
				fail("C's state was written", n)
			}
			// inspect: the caps' capacity and availability after the tenant's place and weight
			got := c.one(t, b, tag, c.of("A", inspect()))
			if e := got.extra; len(e) != 6+3+4 || e[10] != 1000000 || e[11] != 2 || e[12] != 0 || e[9] <= 0 {
				fail("inspect A, want its place, weight 1, then capacity 2, 0 available", got)
			}
			got = c.one(t, b, tag, c.of("C", inspect()))
			if e := got.extra; len(e) != 6+3+4 || e[9] != -1 || e[10] != 1000000 || e[11] != 2 || e[12] != 2 {
				fail("inspect C, want no place, weight 1, capacity 2, 2 available", got)
			}
			// both full: the denial names the limit whose room comes later (the horizon is
			// two of the group's slots, so a lone tenant's turn has come)
			for _, both := range []struct {
				group  int64 // the group's period, its rate 2
				flag   int64
				letter string
			}{{sec, capped, "D"}, {8 * sec, group, "E"}} {
				d := call{a: a, limits: []limit{{2, both.group, 2}}, caps: c.caps}
				tag := tagOf(b, "both"+a.tag+both.letter)
				newClock(t, b, tag)
				d.one(t, b, tag, d.of(both.letter, acquire(2, 0)))
				if got := d.one(t, b, tag, d.of(both.letter, acquire(1, 0))); got.v[0] != 0 || got.v[6] != both.flag {
					fail(fmt.Sprintf("both full, the group's period %dµs, the cap's 4s", both.group), got)
				}
			}
			// a booking ahead takes from both, at the same time: the group 4 per 200ms (its
			// horizon 250ms) full, a tenant books its next slot, on its cap too (a bucket
			// booked ahead from full also spends the refill the burst would cut)
			f := call{a: a, limits: []limit{{4, 200 * ms, 4}}, caps: c.caps}
			tag = tagOf(b, "ahead"+a.tag)
			newClock(t, b, tag)
			f.run(t, b, tag, f.of("J", acquire(2, 0)), f.of("L", acquire(2, 0)))
			out := f.run(t, b, tag, f.of("K", acquire(1, 0)), f.of("K", acquire(1, 250*ms)), f.of("K", inspect()), inspect())
			if out[0].v[6] != group || out[1].v[0] != 1 || out[1].v[4] <= now || out[2].extra[12] > 1 || out[3].extra[0] != 1 {
				fail("a booking ahead on both", out)
			}
		}
	})
}

// The fair share: a tenant may book while its start tag is within the horizon of the
// clock V; a newcomer's first request goes at once behind another's backlog; a tenant
// whose turn has not come is told when it comes (FlagTurn), and with h takes its place:
// its finish tag moves on and the reply carries the ticket, which sent back (k) keeps
// the place; the queue {…}:q holds "<units> <name>" scored by finish tag, with a TTL
// until the clock passes them.
func TestFairShare(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, a := range allAlgos {
			tag := tagOf(b, "fair"+a.tag)
			clk := newClock(t, b, tag)
			// 10/s: a slot of 100ms, tags in µs of the group's service for weight 1; the horizon 250ms
			c := call{a: a, limits: []limit{{10, sec, 10}}}
			fail := func(what string, got any) {
				t.Helper()
				t.Fatalf("%s: %s: %v\n%v", a.tag, what, got, snapshot(t, b.Client, tag+":l", tag+":q", tag+":bk:x"))
			}
			queue := func() string { t.Helper(); return queueText(t, b.Client, tag+":q") }
			A := func(r *protocol.Request) *protocol.Request { return c.of("A", r) }
			out := c.run(t, b, tag, A(acquire(1, 0)), A(acquire(1, 0)), A(acquire(1, 0)), A(acquire(1, 0)))
			for i, r := range out[:3] {
				if r.v[0] != 1 || r.v[6] != 0 {
					fail(fmt.Sprintf("A's grant %d", i+1), out)
				}
			}
			// A's fourth starts at 300000, beyond V + 250000: asked again in 50ms
			if out[3].v != [7]int64{0, 7, 50 * ms, out[3].v[3], 0, 0, turn} {
				fail("A's fourth, want its turn in 50ms", out[3])
			}
			if q := queue(); q != "1000000 A=300000" {
				fail("the queue", q)
			}
			if m := parseMeta(t, b.Client, tag+":l"); m.Fair == nil || m.Fair.W != 1000000 || m.Fair.V != 0 || m.Fair.Fmax != 300000 {
				fail("the fair share's clock", m.Fair)
			}
			// with h it takes its place: a ticket, its finish tag moved on; twice, two places
			out = c.run(t, b, tag, hold(A(acquire(1, protocol.MaxWait))), hold(A(acquire(1, protocol.MaxWait))))
			if out[0].v != [7]int64{0, 7, 50 * ms, out[0].v[3], 0, out[0].v[5], turn | held} || placeOf(out[0].v[5]) != 300000 ||
				placeOf(out[1].v[5]) != 400000 || out[1].v[6] != turn|held {
				fail("A holds two places", out)
			}
			if q := queue(); q != "1000000 A=500000" {
				fail("the queue after two places", q)
			}
			// B, new, goes at once (its start tag is V), and takes one slot of the queue
			if got := c.one(t, b, tag, c.of("B", acquire(1, 0))); got.v[0] != 1 {
				fail("B's first request", got)
			}
			if q := queue(); q != "1000000 B=100000 1000000 A=500000" {
				fail("the queue with B", q)
			}
			if ttl := b.Client.PTTL(ctx, tag+":q").Val(); !b.Real() && ttl != time.Second+time.Second {
				fail("the queue's TTL: V reaches A's 500000 at W 2 in 1s, and a second more", ttl)
			}
			if ttl := b.Client.PTTL(ctx, tag+":l").Val(); !b.Real() && ttl < 2*time.Second {
				fail("the state's TTL, at least the fair share's clock's", ttl)
			}
			// the group's inspect with the queue: W, then each tenant's place, weight and name
			got := c.one(t, b, tag, &protocol.Request{Op: protocol.OpInspect, Queue: keys.FairQueue})
			if e := got.extra[6+3:]; fmt.Sprint(e) != "[2000000 2 1000000 1000000 1 65 200000 1000000 1 66]" {
				fail("the group's inspect of the queue", got)
			}
			// the first ticket, sent back when V has moved on, keeps its place: granted, no new tag
			clk.add(t, 200*time.Millisecond) // V 100000 at W 2, then 50000 more at W 1
			if got := c.one(t, b, tag, ticket(A(acquire(1, 0)), out[0].v[5])); got.v[0] != 1 || got.v[6] != 0 {
				fail("A's ticket sent back", got)
			}
			if q := queue(); q != "1000000 A=500000" {
				fail("the queue after the ticket's grant", q)
			}
			// a task's request that holds keeps its ticket in its record; its next finds it
			clk.add(t, 50*time.Millisecond)
			got = c.one(t, b, tag, booking(hold(A(acquire(1, 0))), "x", 0))
			tk := got.v[5]
			if got.v[0] != 0 || got.v[6] != turn|held || placeOf(tk) != 500000 {
				fail("a task holds a place", got)
			}
			if rec := b.Client.Get(ctx, tag+":bk:x").Val(); rec != fmt.Sprintf("t %d 1", tk) {
				fail("the task's record", rec)
			}
			checkKey(t, b.Client, tag+":bk:x")
			if ttl := b.Client.PTTL(ctx, tag+":bk:x").Val(); !b.Real() && ttl != time.Duration(got.v[2]+60*sec)*time.Microsecond {
				fail("the record's TTL: the wait and a minute", ttl)
			}
			if got := c.one(t, b, tag, booking(hold(A(acquire(1, 0))), "x", 0)); got.v[5] != tk {
				fail("the task's next request, want the same ticket", got)
			}
			if q := queue(); q != "1000000 A=600000" {
				fail("the queue: one place for the task", q)
			}
			clk.add(t, time.Duration(got.v[2])*time.Microsecond)
			if got := c.one(t, b, tag, booking(A(acquire(1, 0)), "x", 0)); got.v[0] != 1 {
				fail("the task's request when its turn came", got)
			}
			if n := b.Client.Exists(ctx, tag+":bk:x").Val(); n != 0 {
				fail("the record after the grant", n)
			}
			// when the clock passes every finish tag the queue and the clock go
			clk.add(t, 2*time.Second)
			c.one(t, b, tag, c.of("B", acquire(1, 0)))
			if q := queue(); q != "1000000 B=100000" {
				fail("the queue anew: tags start again from 0", q)
			}
		}
	})
}

// Tenants' weights and the edges of their requests: an operator's weight (W) lives in
// the meta until its end and counts in place of the callers' (a tenant of weight 3 moves
// its finish tag a third as far), len 0 clears it, a name may hold any bytes; a tenant's n
// above its caps is ErrExceeds; a tenant state of another head takes the caller's caps, of another
// algorithm ErrState; a foreign tenant state or fair share's queue fails the requests
// that need it only, writing nothing.
func TestTenantWeightsAndEdges(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, a := range allAlgos {
			tag, otag := tagOf(b, "tw"+a.tag), tagOf(b, "twother"+a.tag)
			state := tag + ":" + keys.State
			clk := newClock(t, b, tag, otag)
			c := call{a: a, limits: []limit{{10, sec, 10}}, caps: []limit{{2, sec, 2}}}
			fail := func(what string, got any) {
				t.Helper()
				t.Fatalf("%s: %s: %v\n%v", a.tag, what, got, snapshot(t, b.Client, state, tag+":q"))
			}
			name := "a b\nc t9"
			w := &protocol.Request{Op: protocol.OpWeight, X: 5 * sec, Units: 3000000, Queue: keys.FairQueue, Tenant: name}
			if got := c.one(t, b, tag, w); got.v != [7]int64{1, 0, 0, 0, 0, 0, 0} {
				fail("the weight op", got)
			}
			m := parseMeta(t, b.Client, state)
			if len(m.Weights) != 1 || m.Weights[0] != (keys.Weight{Tenant: name, Units: 3000000, End: clk.us() + 5*sec}) {
				fail("the weight in the meta", m.Weights)
			}
			if got := c.one(t, b, tag, c.of(name, acquire(1, 0))); got.v[0] != 1 {
				fail("the weighted tenant's grant", got)
			}
			q := b.Client.ZRangeWithScores(ctx, tag+":q", 0, -1).Val()
			if len(q) != 1 || q[0].Member != "3000000 "+name || q[0].Score < 33333 || q[0].Score > 33334 {
				fail("its finish tag: a slot of 100000 at weight 3", q)
			}
			w.X = 0
			c.one(t, b, tag, w) // ended, kept while its tenant's place is under it
			if m := parseMeta(t, b.Client, state); len(m.Weights) != 1 || m.Weights[0].End != clk.us() {
				fail("the weight cleared", m.Weights)
			}
			c.one(t, b, tag, c.of(name, acquire(1, 0)))
			if m := parseMeta(t, b.Client, state); len(m.Weights) != 0 {
				fail("the cleared weight, once its tenant asked again", m.Weights)
			}
			// n above the caps
			before := snapshot(t, b.Client, state, tag+":q", tag+":t:A")
			out := c.run(t, b, tag, c.of("A", acquire(3, 10*sec)), acquire(3, 0))
			if out[0].code() != protocol.ErrExceeds || out[1].v[0] != 1 {
				fail("a tenant's 3 above its caps of 2, and the group's 3", out)
			}
			if after := snapshot(t, b.Client, state, tag+":q", tag+":t:A"); after[tag+":t:A"] != before[tag+":t:A"] {
				fail("the tenant's state written", after)
			}
			// the caps' head drifts
			c.one(t, b, tag, c.of("A", acquire(1, 0)))
			d := call{a: a, limits: c.limits, caps: []limit{{3, sec, 3}}}
			clk.add(t, 10*time.Second)
			if got := d.one(t, b, tag, d.of("A", acquire(1, 0))); got.v[0] != 1 || got.v[6]&drift != 0 {
				fail("other caps: granted by the caller's, and no FlagDrift (it names the group's head only)", got)
			}
			if h := snapshot(t, b.Client, tag+":t:A")[tag+":t:A"]; !strings.Contains(h, " 3 1000000") {
				fail("the caps' head rewritten", h)
			}
			// a tenant state of another algorithm
			other := map[bool]algo{true: tokenBucket, false: slidingWindow}[a.name != "bucket"]
			o := call{a: other, limits: []limit{{10, sec, 10}}, caps: []limit{{2, sec, 2}}}
			o.one(t, b, otag, o.of("A", acquire(1, 0)))
			b.Client.Del(ctx, otag+":l")
			if got := c.one(t, b, otag, c.of("A", acquire(1, 0))); got.code() != protocol.ErrState && got.code() != protocol.ErrAlg {
				fail("a tenant state of another algorithm", got)
			}
			// foreign keys fail the requests that need them, and only those
			for _, k := range []struct{ key, typ string }{{tag + ":t:C", "list"}, {tag + ":q", "zset"}} {
				for _, kind := range []string{"type", "text"} {
					if k.typ == "list" && a.name != "log" {
						k.typ = "string"
					}
					clk.add(t, 10*time.Second)
					b.Client.Del(ctx, k.key)
					putForeign(t, b.Client, k.key, k.typ, kind)
					before := snapshot(t, b.Client, tag+":q", tag+":t:C")
					out := c.run(t, b, tag, c.of("C", acquire(1, 0)), acquire(1, 0))
					if kind == "text" && k.typ == "zset" { // members not ours are read as weight 0
						continue
					}
					if out[0].code() != protocol.ErrState || out[1].v[0] != 1 {
						fail(fmt.Sprintf("%s of another %s", k.key, kind), out)
					}
					if after := snapshot(t, b.Client, tag+":q", tag+":t:C"); !sameKeys(b, before, after) {
						fail(fmt.Sprintf("%s of another %s: written", k.key, kind), fmt.Sprint(before, "\nbecame ", after))
					}
				}
				b.Client.Del(ctx, k.key)
			}
		}
	})
}

// A tenant holds one place in the queue, under its weight now: when an operator sets,
// changes, clears or outlives its weight, the place it queued under the weight before moves
// to the weight now (its finish tag kept, W changed by the difference) at the tenant's next
// request, or at once for a change of an operator's weight; an inspect reads the place where
// it is. An operator's weight that ended stays in the meta while a place may be under it.
func TestWeightChangeMovesThePlace(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, a := range allAlgos {
			tag := tagOf(b, "wmove"+a.tag)
			clk := newClock(t, b, tag)
			c := call{a: a, limits: []limit{{10, sec, 10}}}
			fail := func(what string, got any) {
				t.Helper()
				t.Fatalf("%s: %s: %v\n%v", a.tag, what, got, snapshot(t, b.Client, tag+":l", tag+":q"))
			}
			queue := func() string { t.Helper(); return queueText(t, b.Client, tag+":q") }
			W := func() int64 {
				t.Helper()
				if m := parseMeta(t, b.Client, tag+":l"); m.Fair != nil {
					return m.Fair.W
				}
				return 0
			}
			weight := func(x, units int64) *protocol.Request {
				return &protocol.Request{Op: protocol.OpWeight, X: x, Units: units, Queue: keys.FairQueue, Tenant: "A"}
			}
			A := func() *protocol.Request { return c.of("A", acquire(1, 0)) } // denied by its turn: its place stays
			c.run(t, b, tag, A(), A(), A(), c.of("B", acquire(1, 0)))
			if q := queue(); q != "1000000 B=100000 1000000 A=300000" || W() != 2000000 {
				fail("A's and B's places", fmt.Sprint(q, " W ", W()))
			}
			// an operator sets A's weight: its place moves at its next request
			c.one(t, b, tag, weight(10*sec, 500000))
			got := c.one(t, b, tag, c.of("A", inspect()))
			if e := got.extra[6+3:]; len(e) < 2 || e[0] <= 0 || e[1] != 500000 {
				fail("A's inspect before it asks again: its place, read where it is, at the weight set", got)
			}
			c.one(t, b, tag, A())
			if q := queue(); q != "1000000 B=100000 500000 A=300000" || W() != 1500000 {
				fail("A's place at weight 0.5", fmt.Sprint(q, " W ", W()))
			}
			// changed by the operator: at once
			c.one(t, b, tag, weight(10*sec, 3000000))
			if q := queue(); q != "1000000 B=100000 3000000 A=300000" || W() != 4000000 {
				fail("A's place at weight 3", fmt.Sprint(q, " W ", W()))
			}
			// cleared: kept ended in the meta until A's place moves back to its callers' weight
			c.one(t, b, tag, weight(0, 1))
			if m := parseMeta(t, b.Client, tag+":l"); len(m.Weights) != 1 || m.Weights[0].End > clk.us() {
				fail("the cleared weight, ended", m.Weights)
			}
			c.one(t, b, tag, A())
			if q := queue(); q != "1000000 B=100000 1000000 A=300000" || W() != 2000000 {
				fail("A's place back at weight 1", fmt.Sprint(q, " W ", W()))
			}
			if m := parseMeta(t, b.Client, tag+":l"); len(m.Weights) != 0 {
				fail("the ended weight, once no place is under it", m.Weights)
			}
			// and ended by time
			c.one(t, b, tag, weight(100*ms, 2000000))
			c.one(t, b, tag, A())
			clk.add(t, 150*time.Millisecond)
			c.one(t, b, tag, c.of("B", acquire(1, 0)))
			if m := parseMeta(t, b.Client, tag+":l"); len(m.Weights) != 1 {
				fail("the weight ended by time, A's place still under it", m.Weights)
			}
			c.one(t, b, tag, A())
			if q := queue(); !strings.Contains(q, "1000000 A=300000") || strings.Contains(q, "2000000 A") {
				fail("A's place back at weight 1 after the weight's end", q)
			}
			if m := parseMeta(t, b.Client, tag+":l"); len(m.Weights) != 0 {
				fail("the weight ended by time, no place under it", m.Weights)
			}
			// an ended weight goes with the place under it when the clock passes that place
			c.one(t, b, tag, &protocol.Request{Op: protocol.OpWeight, X: 100 * ms, Units: 2000000, Queue: keys.FairQueue, Tenant: "B"})
			c.one(t, b, tag, c.of("B", acquire(1, 0)))
			clk.add(t, 10*time.Second)
			c.one(t, b, tag, A())
			if m := parseMeta(t, b.Client, tag+":l"); len(m.Weights) != 0 || !strings.Contains(queue(), "A=") {
				fail("B's ended weight once the clock passed its place, A queued", fmt.Sprint(m.Weights, queue()))
			}
			// and one that ends with no place under it, while others are queued
			c.one(t, b, tag, &protocol.Request{Op: protocol.OpWeight, X: 100 * ms, Units: 2000000, Queue: keys.FairQueue, Tenant: "C"})
			clk.add(t, 150*time.Millisecond)
			c.one(t, b, tag, A())
			if m := parseMeta(t, b.Client, tag+":l"); len(m.Weights) != 0 || !strings.Contains(queue(), "A=") {
				fail("C's ended weight, no place under it, A queued", fmt.Sprint(m.Weights, queue()))
			}
		}
	})
}

// A call decides its requests exactly as lone calls made one after another at the same
// server instant: random rounds of every op (acquires within and above the limits, with
// and without bookings, tenants' acquires with weights, places held and tickets sent
// back, cancels of earlier grants and bookings, inspects of the group, the queue and a
// tenant, pause, resume, override, clear, tenants' weights, bad requests), now and then
// under another head (drift), made as lone calls on one key and as one call on another,
// get the same replies and leave the same keys, on every limiter script with one limit,
// two limits, and tenants with caps; and on the semaphore.
func TestBatchEqualsLoneCalls(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for i, a := range allAlgos {
			for v, variant := range []string{"one", "two", "caps", "many"} {
				t.Run(a.tag+"/"+variant, func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(i), uint64(v)))
					batchVsLone(t, b, a, v, 25+15*(v/3), rng.IntN)
				})
			}
		}
		t.Run("semaphore", func(t *testing.T) {
			semBatchVsLone(t, b, 40, rand.New(rand.NewPCG(5, 5)).IntN)
		})
	})
}

// FuzzBatch is TestBatchEqualsLoneCalls on miniredis with the rounds and requests the
// fuzzer picks.
func FuzzBatch(f *testing.F) {
	f.Add(uint8(0), uint8(0), []byte{3, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add(uint8(2), uint8(1), []byte{9, 200, 17, 3, 3, 3, 0, 1, 250, 6, 6, 40, 41, 42})
	f.Add(uint8(1), uint8(2), []byte{7, 9, 5, 0, 1, 2, 60, 61, 62, 63, 3, 9, 70, 71, 72, 5, 5, 9, 1, 100, 0, 2})
	f.Add(uint8(4), uint8(0), []byte{8, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2})
	f.Fuzz(func(t *testing.T, which, variant uint8, data []byte) {
		b := redistest.NewMini(t)
		if int(which)%5 == 4 {
			semBatchVsLone(t, b, 1+len(data)/8, picker(data))
			return
		}
		batchVsLone(t, b, allAlgos[int(which)%4], int(variant)%3, 1+len(data)/8, picker(data))
	})
}

// picker returns a pick(n) that takes the fuzzer's bytes one by one, each modulo n, and
// 0 when they run out.
func picker(data []byte) func(n int) int {
	return func(n int) int {
		if len(data) == 0 {
			return 0
		}
		v := int(data[0])
		data = data[1:]
		return v % n
	}
}

// batchVsLone runs rounds of random requests on algorithm a as lone calls under one tag
// and as one call under another, at one instant per round, and fails unless the replies
// and the keys left are the same. variant: 0 one limit, 1 two, 2 one and tenants' caps,
// 3 as 2 with 30 tenants, more than a turn looks at in the queue, in rounds of up to 24
// requests and no control op (a batch's turns keep the queue's order as its requests
// queue again: lua/limiter.lua, turn). pick(n) returns a number in [0, n).
func batchVsLone(t *testing.T, b *redistest.Backend, a algo, variant, rounds int, pick func(n int) int) {
	t.Helper()
	tagA, tagB := tagOf(b, fmt.Sprintf("%s%dA", a.tag, variant)), tagOf(b, fmt.Sprintf("%s%dB", a.tag, variant))
	heads := [][]limit{{{5, 100 * ms, 5}}, {{4, 100 * ms, 6}}} // the second: another process's limits
	if variant == 1 {
		heads = [][]limit{{{5, 100 * ms, 5}, {12, sec, 8}}, {{5, 100 * ms, 5}}}
	}
	c := call{a: a, limits: heads[0]}
	if variant >= 2 {
		c.caps = []limit{{3, 100 * ms, 3}}
	}
	clk := newClock(t, b, tagA, tagB)
	var tokens, stamps []int64
	tickets := map[string][]int64{}
	tenants, most := []string{"A", "B c"}, 10
	suffixes := []string{keys.State, keys.FairQueue, "t:A", "t:B c", "bk:a", "bk:b"}
	for variant == 3 && len(tenants) < 30 {
		tenants, most = append(tenants, fmt.Sprintf("T%d", len(tenants))), 24
		suffixes = append(suffixes, keys.Tenant+tenants[len(tenants)-1])
	}
	for round := range rounds {
		clk.add(t, time.Duration(pick(60)*1000+pick(1000))*time.Microsecond)
		if pick(8) == 0 {
			c.limits = heads[pick(2)]
		}
		k := 1 + pick(most)
		reqs := make([]*protocol.Request, k)
		queued := false // a tenant's acquire came before in the round
		for i := range reqs {
			var r *protocol.Request
			tenant := ""
			if variant >= 2 || pick(4) == 0 {
				tenant = tenants[pick(len(tenants))]
			}
			p := pick(24)
			if variant == 3 && p >= 17 && p < 22 { // the control ops: variants 0-2 make them
				p = 0
			}
			switch {
			case p < 10:
				r = acquire(pick(7), []int64{0, int64(pick(300)) * ms, 1 << 40}[pick(3)])
				if pick(3) == 0 {
					booking(r, []string{"a", "b"}[pick(2)], int64(pick(3))*50*ms)
				}
				if tenant != "" {
					c.of(tenant, r)
					r.Hold = pick(3) == 0
					r.Units = []int64{0, 500000, 3000000}[pick(3)]
					if ts := tickets[tenant]; len(ts) > 0 && pick(3) == 0 {
						r.Ticket = ts[pick(len(ts))]
					}
				}
			case p < 13 && len(tokens) > 0:
				r = cancel(1+pick(3), tokens[pick(len(tokens))])
				if tenant != "" {
					c.of(tenant, r)
				}
			case p < 14 && len(stamps) > 0:
				r = booking(cancel(1+pick(3), stamps[pick(len(stamps))]), []string{"a", "b"}[pick(2)], 0)
			case p < 17:
				r = inspect()
				switch pick(3) {
				case 1:
					// the group's inspect of the queue lists what is stored: not yet the
					// tenants this call queued or moved (a weight) before it (lone calls
					// would see them)
					if !queued {
						r.Queue = keys.FairQueue
					}
				case 2:
					if tenant != "" {
						c.of(tenant, r)
					}
				}
			case p < 18:
				r = pause(int64(1+pick(200)) * ms)
			case p < 19:
				r = resume()
			case p < 20:
				r = override(int64(pick(3))*100*ms, 1+pick(9), pick(9))
				if len(c.limits) > 1 && pick(2) == 0 {
					r.Rates = append(r.Rates, 1+pick(9), pick(9))
				}
			case p < 21:
				r = clearOver()
			case p < 22:
				r = &protocol.Request{Op: protocol.OpWeight, X: int64(pick(3)) * 100 * ms, Units: []int64{1, 2000000}[pick(2)],
					Queue: keys.FairQueue, Tenant: tenants[pick(len(tenants))]}
			case p < 23:
				r = acquire(9, 0) // above every limit: ErrExceeds
			default:
				r = &protocol.Request{Op: "z"} // ErrArg
			}
			reqs[i] = r
			queued = queued || (r.Tenant != "" && (r.Op == protocol.OpAcquire || r.Op == protocol.OpWeight))
		}
		before := snapshot(t, b.Client, keysUnder(tagA, suffixes)...) // for the failure's message
		var want []res
		for _, r := range reqs {
			out := c.run(t, b, tagA, r)
			want = append(want, out[0])
			if r.Op == protocol.OpAcquire && out[0].v[0] == 1 && out[0].v[4] != 0 {
				tokens = append(tokens, out[0].v[4])
			}
			if r.Op == protocol.OpAcquire && out[0].v[6]&held != 0 {
				tickets[r.Tenant] = append(tickets[r.Tenant], out[0].v[5])
			} else if r.Op == protocol.OpAcquire && out[0].v[5] != 0 {
				stamps = append(stamps, out[0].v[5])
			}
		}
		got := c.run(t, b, tagB, reqs...)
		for i := range got {
			g, w := got[i], want[i]
			g.err = strings.ReplaceAll(g.err, tagB, tagA)
			if b.Real() && g.extra != nil && w.extra != nil {
				g.extra[3] = w.extra[3] // the fake clock stretches TTLs
			}
			if comparable(g) != comparable(w) {
				t.Fatalf("round %d, request %d of %s: batch %v, lone %v (before the round: %v)", round, i+1, texts(reqs), g, w, before)
			}
		}
		sameUnder(t, b, tagA, tagB, suffixes, fmt.Sprintf("round %d (%s), lone calls under the first, one call under the second; before the round: %v", round, texts(reqs), before))
	}
}

// A batch's turns read the queue once and keep the order of its members as the batch's
// requests queue again (lua/limiter.lua, turn): on a queue of 40 tenants' places, one
// batch of Waits whose first turn reads the queue's head, whose next requests take the
// places of the members read (the first stored members all, then one of them again) so
// that later turns read further, and whose last turns look past them all, replies and
// leaves the keys as the same requests made one by one.
func TestTurnsOfABatchAsLoneCalls(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, a := range allAlgos {
			t.Run(a.tag, func(t *testing.T) {
				tagA, tagB := tagOf(b, "turnsA"+a.tag), tagOf(b, "turnsB"+a.tag)
				c := call{a: a, limits: []limit{{5, 100 * ms, 5}}}
				clk := newClock(t, b, tagA, tagB)
				wait := func(i int) *protocol.Request { // tenant i's Wait, of weight 0.5, 1 or 2
					r := c.of(fmt.Sprintf("T%d", i), acquire(1, 1<<40))
					r.Hold, r.Units = true, []int64{500000, 1000000, 2000000}[i%3]
					return r
				}
				var fill []*protocol.Request // places 1 to 3 deep, finish tags apart
				suffixes := []string{keys.State, keys.FairQueue}
				for i := range 40 {
					for range 1 + i%4%3 {
						fill = append(fill, wait(i))
					}
				}
				for _, tag := range []string{tagA, tagB} {
					c.run(t, b, tag, fill...)
				}
				clk.add(t, 30*time.Millisecond)
				reqs := []*protocol.Request{wait(39)}
				for i := range 20 {
					reqs = append(reqs, wait(i))
				}
				for _, i := range []int{5, 5, 2, 2, 3, 38, 40, 37, 3, 36, 34, 30, 26} {
					reqs = append(reqs, wait(i))
				}
				var want []res
				for _, r := range reqs {
					want = append(want, c.run(t, b, tagA, r)[0])
				}
				got := c.run(t, b, tagB, reqs...)
				turns := 0
				for i := range got {
					g, w := got[i], want[i]
					g.err = strings.ReplaceAll(g.err, tagB, tagA)
					if comparable(g) != comparable(w) {
						t.Fatalf("request %d of %s: batch %v, lone %v", i+1, texts(reqs), g, w)
					}
					if w.v[0] == 0 && w.v[6]&protocol.FlagTurn != 0 {
						turns++
					}
				}
				if turns < len(reqs)/2 {
					t.Fatalf("%d of %d requests told to wait for their turns: the batch reads too little of the queue to test", turns, len(reqs))
				}
				sameUnder(t, b, tagA, tagB, suffixes, "one batch under the second, its requests one by one under the first")
			})
		}
	})
}

// The fast paths decide as the loop (lua/limiter.lua): random rounds of calls of plain
// acquires or of tenants' (with caps or without, weights, places held and tickets sent
// back, within and above the limits and past their turns, in batches that repeat a text),
// made as Go writes them on one key and with a leading zero in each max wait (which the
// loop reads and the fast paths leave to it) on another, at one instant per round, get the
// same replies and leave the same keys, on every limiter script.
func TestFastPathsDecideAsTheLoop(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for i, a := range allAlgos {
			for v, variant := range []string{"caps", "nocaps"} {
				t.Run(a.tag+"/"+variant, func(t *testing.T) {
					pick := rand.New(rand.NewPCG(uint64(i), uint64(v)+7)).IntN
					tagA, tagB := tagOf(b, "fast"+a.tag+variant), tagOf(b, "loop"+a.tag+variant)
					c := call{a: a, limits: []limit{{8, 100 * ms, 8}}}
					if v == 0 {
						c.caps = []limit{{3, 100 * ms, 3}}
					}
					clk := newClock(t, b, tagA, tagB)
					// more tenants than a turn looks at in the queue (lua/limiter.lua, turn)
					tenants := []string{"B c"}
					for len(tenants) < 30 {
						tenants = append(tenants, string(rune('A'+len(tenants))))
					}
					// the keys compared after each call: the rounds' tenants' (the first four)
					suffixes, all := []string{keys.State, keys.FairQueue}, []string{keys.State, keys.FairQueue}
					for j, name := range tenants {
						if j < 4 {
							suffixes = append(suffixes, keys.Tenant+name)
						}
						all = append(all, keys.Tenant+name)
					}
					tickets := map[string][]int64{}
					// both makes a call of reqs on each key and fails unless they agree
					both := func(what string, reqs ...*protocol.Request) []res {
						t.Helper()
						before := snapshot(t, b.Client, keysUnder(tagA, suffixes)...)
						want := c.run(t, b, tagA, reqs...)
						ks, argv := c.build(tagB, reqs)
						for j := 2; j < len(argv); j++ {
							f := strings.SplitN(argv[j].(string), " ", 4)
							f[2] = "0" + f[2]
							argv[j] = strings.Join(f, " ")
						}
						got, err := exec(b, a.name, ks, argv, make([]bool, len(reqs)))
						if err != nil {
							t.Fatalf("%s %s: %v", what, texts(reqs), err)
						}
						for j := range got {
							if got[j].String() != want[j].String() {
								t.Fatalf("%s, request %d of %s: loop %v, fast path %v (before: %v)", what, j+1, texts(reqs), got[j], want[j], before)
							}
							if want[j].v[6]&held != 0 {
								tickets[reqs[j].Tenant] = append(tickets[reqs[j].Tenant], want[j].v[5])
							}
						}
						sameUnder(t, b, tagA, tagB, suffixes, fmt.Sprintf("%s (%s), before it %v", what, texts(reqs), before))
						return want
					}
					// first the queue's every tenant, of weights in steps, then one far ahead of
					// them; later, with the clock past some of them, its turn has not come
					for j, name := range tenants {
						r := c.of(name, acquire(1, 1<<40))
						r.Units = int64(j+1) * 100000
						both("queueing", r)
					}
					for range 3 {
						both("queueing", c.of("A", hold(acquire(1, 1<<40))))
					}
					sameUnder(t, b, tagA, tagB, all, "queueing")
					clk.add(t, 100*time.Millisecond)
					if got := both("past its turn", c.of("A", hold(acquire(1, 1<<40))))[0]; got.v[6]&turn == 0 {
						t.Fatalf("past its turn: %v, want its turn not come", got)
					}
					for round := range 60 {
						clk.add(t, time.Duration(pick(40)*1000+pick(1000))*time.Microsecond)
						reqs, plain := make([]*protocol.Request, 1+pick(6)), pick(4) == 0
						for j := range reqs {
							if j > 0 && pick(4) == 0 { // the same text again
								reqs[j] = reqs[j-1]
								continue
							}
							r := acquire(1+pick(3), []int64{0, int64(pick(300)) * ms, 1 << 40}[pick(3)])
							if !plain {
								tenant := tenants[pick(4)] // (the rest: the queue's length)
								c.of(tenant, r)
								r.Hold = pick(2) == 0
								r.Units = []int64{0, 500000, 3000000}[pick(3)]
								if ts := tickets[tenant]; len(ts) > 0 && pick(3) == 0 {
									r.Ticket = ts[pick(len(ts))]
								}
							}
							reqs[j] = r
						}
						both(fmt.Sprintf("round %d", round), reqs...)
					}
				})
			}
		}
	})
}

// keysUnder returns the keys of suffixes under tag.
func keysUnder(tag string, suffixes []string) []string {
	var ks []string
	for _, s := range suffixes {
		ks = append(ks, tag+":"+s)
	}
	return ks
}

// sameUnder fails unless the keys of suffixes under tagA and tagB hold the same, and the
// fair share's queue, where it exists, has a TTL; what says what came before.
func sameUnder(t *testing.T, b *redistest.Backend, tagA, tagB string, suffixes []string, what string) {
	t.Helper()
	ka, kb := keysUnder(tagA, suffixes), keysUnder(tagB, suffixes)
	sa, sb := snapshot(t, b.Client, ka...), snapshot(t, b.Client, kb...)
	for i, s := range suffixes {
		x, y := sa[ka[i]], strings.ReplaceAll(sb[kb[i]], tagB, tagA)
		// the fake clock stretches TTLs; the queue's is compared apart: a pause moves
		// the fair share's clock, and so its life, in the meta, but the queue's TTL
		// moves only in a call that names the queue
		if b.Real() || s == keys.FairQueue {
			x, y = x[:strings.LastIndex(x, " ttl ")], y[:strings.LastIndex(y, " ttl ")]
		}
		if x != y {
			t.Fatalf("%s: %s holds %s under %s, %s under %s", what, s, x, tagA, y, tagB)
		}
	}
	for _, k := range []string{tagA + ":" + keys.FairQueue, tagB + ":" + keys.FairQueue} {
		if b.Client.Exists(context.Background(), k).Val() == 1 && b.Client.PTTL(context.Background(), k).Val() <= 0 {
			t.Fatalf("%s: %s has no TTL", what, k)
		}
	}
}

// comparable returns r with what depends on its place in a call left out: where its
// detail starts.
func comparable(r res) string {
	if r.extra != nil {
		r.v[4] = 0
	}
	return r.String()
}

// Units: the limits of a unit count the requests' costs in it, those of calls their n, and
// a request takes from every part or from none; each part keeps a state of its own (the
// calls' in {…}:l with the meta, a unit's in {…}:u:<unit>, its meta its part's head), and
// a limiter with no limit of calls keeps the meta alone in {…}:l. A cost above what its
// unit's limits can grant is ErrExceeds, one naming a unit no limit counts ErrArg.
func TestUnits(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, a := range allAlgos {
			tag := tagOf(b, "units"+a.tag)
			clk := newClock(t, b, tag)
			// 10 calls and 100 tokens per second
			c := call{a: a, limits: []limit{{10, sec, 10}, {100, sec, 100}}, units: []string{"", "tokens"}}
			all := []string{tag + ":l", tag + ":u:tokens"}
			fail := func(what string, got any) {
				t.Helper()
				t.Fatalf("%s: %s: %v\n%v", a.tag, what, got, snapshot(t, b.Client, all...))
			}
			now := clk.us()
			if got := c.one(t, b, tag, costs(acquire(1, 0), "tokens", 60)); got.v != [7]int64{1, 9, 0, got.v[3], now, 0, 0} {
				fail("1 call of 60 tokens", got)
			}
			before := snapshot(t, b.Client, all...)
			got := c.one(t, b, tag, costs(acquire(1, 0), "tokens", 60))
			if got.v[0] != 0 || got.v[6] != group || got.v[2] <= 0 {
				fail("60 more tokens, want denied by the group", got)
			}
			if after := snapshot(t, b.Client, all...); !sameKeys(b, before, after) {
				fail("the denial wrote", fmt.Sprint(before, "\nbecame ", after))
			}
			if a != fixedWindow { // 20 more tokens come in 200ms (the bucket) or when 60 leave (the logs)
				want := map[string]int64{"sw": sec, "sc": sec + 10*ms, "tb": 200 * ms}[a.tag]
				if got.v[2] != want {
					fail(fmt.Sprintf("the wait, want %dµs", want), got)
				}
			}
			if got := c.one(t, b, tag, acquire(3, 0)); got.v[0] != 1 || got.v[1] != 6 {
				fail("3 calls and no tokens", got)
			}
			d := c.one(t, b, tag, inspect()).extra // per limit: rate, capacity, available
			if len(d) != 6+6 || d[6] != 10 || d[8] != 6 || d[9] != 100 || d[11] != 40 {
				fail("inspect: calls 6 of 10, tokens 40 of 100", d)
			}
			for _, k := range all {
				checkKey(t, b.Client, k)
			}
			h := snapshot(t, b.Client, tag+":u:tokens")[tag+":u:tokens"]
			if !strings.Contains(h, a.tag+" ") || !strings.Contains(h, "/tokens 100 1000000") {
				fail("the tokens' state keeps its part's head", h)
			}
			if m := parseMeta(t, b.Client, tag+":l"); m.Head != c.a.head(c.limits, c.units...) {
				fail("the meta keeps the whole head", m.Head)
			}
			// above what a unit can grant; a unit no limit counts
			if got := c.one(t, b, tag, costs(acquire(1, 10*sec), "tokens", 101)); got.code() != protocol.ErrExceeds {
				fail("101 tokens", got)
			}
			if got := c.raw(t, b, tag, []string{tag + ":u:tokens"}, "a 1 0 uwords:5"); got[0].code() != protocol.ErrArg || !strings.Contains(got[0].err, "no limit counts its unit") {
				fail("a cost of words", got)
			}
			// a caller's call of costs books no further than its horizon (the longest of
			// 250ms, two slots and its cost's time: 50 tokens, 500ms), and is told to ask
			// again within a horizon, so that the refunds of settles reach it
			r := c.one(t, b, tag, costs(acquire(1, 10*sec), "tokens", 50))
			if a != tokenBucket && a != fixedWindow && (r.v[0] != 0 || r.v[6] != group || r.v[2] != 500*ms) {
				fail("50 tokens whose room comes in 1s, want asked again in 500ms", r)
			}
			if r.v[0] == 1 { // the bucket's room comes in 100ms: booked, and given back
				c.one(t, b, tag, costs(cancel(1, r.v[4]), "tokens", 50))
			}
			// a task's booking is kept however far; a cancel gives both back
			r = c.one(t, b, tag, booking(costs(acquire(1, 10*sec), "tokens", 50), "x", 0))
			if r.v[0] != 1 || r.v[2] <= 0 {
				fail("50 tokens booked ahead for a task", r)
			}
			if got := c.one(t, b, tag, booking(costs(cancel(1, r.v[5]), "tokens", 50), "x", 0)); got.v[0] != 1 {
				fail("the cancel", got)
			}
			if d := c.one(t, b, tag, inspect()).extra; a != fixedWindow && (d[8] != 6 || d[11] != 40) {
				fail("after the cancel: calls 6, tokens 40", d) // (the window keeps the booking's window alone)
			}
			// tokens only: the meta alone in {…}:l
			otag := tagOf(b, "unitsonly"+a.tag)
			newClock(t, b, otag)
			o := call{a: a, limits: []limit{{100, sec, 100}}, units: []string{"tokens"}}
			if got := o.one(t, b, otag, costs(acquire(1, 0), "tokens", 100)); got.v[0] != 1 || got.v[1] != 0 {
				fail("100 tokens of a limiter of tokens only", got)
			}
			if got := o.one(t, b, otag, costs(acquire(5, 0), "tokens", 1)); got.v[0] != 0 || got.v[6] != group {
				fail("1 more token", got)
			}
			if _, alone := meta(t, b.Client, otag+":l"); !alone {
				fail("the meta alone", snapshot(t, b.Client, otag+":l"))
			}
			if ttl := b.Client.PTTL(ctx, otag+":l").Val(); ttl <= 0 {
				fail("the meta's TTL, as long as its parts'", ttl)
			}
		}
	})
}

// A settle charges the actual's difference from the estimate at the grant's place: a
// refund frees room for the callers after it, a debt holds them back; a second settle of
// the same record changes nothing (2), one after the grant has left every limit changes
// nothing and writes no record (3).
func TestSettle(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, a := range allAlgos {
			tag := tagOf(b, "settle"+a.tag)
			clk := newClock(t, b, tag)
			c := call{a: a, limits: []limit{{10, sec, 10}, {100, sec, 100}}, units: []string{"", "tokens"}}
			all := []string{tag + ":l", tag + ":u:tokens", tag + ":st:1", tag + ":st:2"}
			fail := func(what string, got any) {
				t.Helper()
				t.Fatalf("%s: %s: %v\n%v", a.tag, what, got, snapshot(t, b.Client, all...))
			}
			g := c.one(t, b, tag, costs(acquire(1, 0), "tokens", 80))
			if g.v[0] != 1 {
				fail("80 tokens", g)
			}
			clk.add(t, 100*time.Millisecond)
			s := costs(settle(1, g.v[4], "1"), "tokens", 80, 20)
			if got := c.one(t, b, tag, s); got.v[0] != 1 || got.v[4] != g.v[4] {
				fail("the settle of 80 as 20", got)
			}
			if ttl := b.Client.PTTL(ctx, tag+":st:1").Val(); ttl <= 0 || !b.Real() && ttl > time.Second {
				fail("the record's TTL, at most the grant's second", ttl)
			}
			if got := c.one(t, b, tag, costs(acquire(1, 0), "tokens", 70)); got.v[0] != 1 {
				fail("70 tokens after the refund of 60", got)
			}
			before := snapshot(t, b.Client, all...)
			if got := c.one(t, b, tag, s); got.v[0] != 2 {
				fail("the same settle again", got)
			}
			if after := snapshot(t, b.Client, all...); !sameKeys(b, before, after) {
				fail("the second settle wrote", fmt.Sprint(before, "\nbecame ", after))
			}
			if got := c.one(t, b, tag, costs(acquire(1, 0), "tokens", 21)); got.v[0] != 0 {
				fail("21 more tokens: the second settle refunded again", got)
			}
			// a debt: 10 tokens charged as 10 more than the room
			clk.add(t, 2*time.Second)
			g = c.one(t, b, tag, costs(acquire(1, 0), "tokens", 10))
			if got := c.one(t, b, tag, costs(settle(1, g.v[4], "2"), "tokens", 10, 100)); got.v[0] != 1 {
				fail("the settle of 10 as 100", got)
			}
			if got := c.one(t, b, tag, costs(acquire(1, 0), "tokens", 1)); got.v[0] != 0 || got.v[6] != group {
				fail("1 token after a debt that took the whole second", got)
			}
			// too late: the grant has left every limit
			clk.add(t, 2*time.Second)
			before = snapshot(t, b.Client, all...)
			if got := c.one(t, b, tag, costs(settle(1, g.v[4], "3"), "tokens", 10, 50)); got.v[0] != 3 {
				fail("a settle 2s after the grant", got)
			}
			if n := b.Client.Exists(ctx, tag+":st:3").Val(); n != 0 {
				fail("a record of the late settle", n)
			}
			// bad input
			if got := c.raw(t, b, tag, []string{tag + ":u:tokens", tag + ":st:4"}, "s 1 5 e3"); got[0].code() != protocol.ErrArg {
				fail("a settle of no cost", got)
			}
			if got := c.raw(t, b, tag, []string{tag + ":u:tokens", tag + ":bk:4"}, "s 1 5 e3 utokens:1:2"); got[0].code() != protocol.ErrArg {
				fail("a settle whose record is a booking's key", got)
			}
			if got := c.raw(t, b, tag, []string{tag + ":u:tokens"}, "a 1 0 utokens:1:2"); got[0].code() != protocol.ErrArg {
				fail("an acquire's cost with an actual", got)
			}
		}
	})
}

// Tenants and costs: a tenant's caps may count a unit (their state in
// {…}:u:<unit>:<name>); its fair share is measured in the time its costs take the group's
// limits, so a tenant of large requests moves its finish tag further; a settle moves it by
// the difference.
func TestTenantCosts(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, a := range allAlgos {
			tag := tagOf(b, "tcost"+a.tag)
			clk := newClock(t, b, tag)
			// the group 100 calls and 1000 tokens a second; each tenant 500 tokens a second
			c := call{a: a, limits: []limit{{100, sec, 100}, {1000, sec, 1000}}, units: []string{"", "tokens"},
				caps: []limit{{500, sec, 500}}, capUnits: []string{"tokens"}}
			all := []string{tag + ":l", tag + ":u:tokens", tag + ":q", tag + ":u:tokens:A", tag + ":t:A"}
			fail := func(what string, got any) {
				t.Helper()
				t.Fatalf("%s: %s: %v\n%v", a.tag, what, got, snapshot(t, b.Client, all...))
			}
			if got := c.one(t, b, tag, costs(c.of("A", acquire(1, 0)), "tokens", 400)); got.v[0] != 1 {
				fail("A's 400 tokens", got)
			}
			// 400 tokens take 400ms of the group's 1000 a second: the finish tag 400000
			q := b.Client.ZRangeWithScores(context.Background(), tag+":q", 0, -1).Val()
			if len(q) != 1 || q[0].Score != 400000 {
				fail("A's finish tag, want 400ms of service", q)
			}
			if got := c.one(t, b, tag, costs(c.of("A", acquire(1, 0)), "tokens", 200)); got.v[0] != 0 || got.v[6] != turn {
				fail("A's 200 more at once, want its turn not come", got)
			}
			clk.add(t, 200*time.Millisecond) // V 200000: A's start tag within the horizon
			if got := c.one(t, b, tag, costs(c.of("A", acquire(1, 0)), "tokens", 250)); got.v[0] != 0 || got.v[6] != capped {
				fail("A's 250 more (the bucket has 200 again), want denied by its caps", got)
			}
			checkKey(t, b.Client, tag+":u:tokens:A")
			if n := b.Client.Exists(context.Background(), tag+":t:A").Val(); n != 0 {
				fail("a state of caps of calls, which there are none of", n)
			}
			// B starts at V: 300 tokens, settled as 100, finish 200ms of service later
			g := c.one(t, b, tag, costs(c.of("B", acquire(1, 0)), "tokens", 300))
			if got := c.one(t, b, tag, costs(c.of("B", settle(1, g.v[4], "B1")), "tokens", 300, 100)); got.v[0] != 1 {
				fail("B's settle of 300 as 100", got)
			}
			q = b.Client.ZRangeWithScores(context.Background(), tag+":q", 0, -1).Val()
			if len(q) != 2 || q[0].Member != "1000000 B" || q[0].Score != 300000 {
				fail("B's finish tag moved back to 100ms of service after V", q)
			}
		}
	})
}

// A pause freezes the fair share's clock, so its queue lives as long as the state: the
// pause names the queue and extends its TTL (the TTLs are miniredis's; a real server's
// run on the test's fake clock).
func TestPauseKeepsTheQueue(t *testing.T) {
	b := redistest.NewMini(t)
	for _, a := range allAlgos {
		tag := tagOf(b, "pq"+a.tag)
		newClock(t, b, tag)
		c := call{a: a, limits: []limit{{10, sec, 10}}}
		c.one(t, b, tag, c.of("A", acquire(1, 0)))
		p := pause(5 * sec)
		p.Queue = keys.FairQueue
		c.one(t, b, tag, p)
		q, l := b.Client.PTTL(t.Context(), tag+":q").Val(), b.Client.PTTL(t.Context(), tag+":l").Val()
		if m := parseMeta(t, b.Client, tag+":l"); m.Fair == nil || q < 5*time.Second || q < l-time.Second {
			t.Fatalf("%s: the queue's TTL %v, the state's %v (its fair clock %+v)", a.tag, q, l, m.Fair)
		}
	}
}

// A tenant whose turn has not come is told it at the pause's end and its turn's time
// after it: the fair share's clock stands still until the pause ends. Told the turn's time
// alone, it would ask again all through the pause.
func TestTurnWaitsForThePause(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, a := range allAlgos {
			tag := tagOf(b, "pt"+a.tag)
			clk := newClock(t, b, tag)
			c := call{a: a, limits: []limit{{10, sec, 10}}}
			A := func() *protocol.Request { return c.of("A", acquire(1, protocol.MaxWait)) }
			out := c.run(t, b, tag, A(), A(), A(), A()) // the fourth: its turn in 50ms (TestFairShare)
			if out[3].v[0] != 0 || out[3].v[2] != 50*ms || out[3].v[6] != turn {
				t.Fatalf("%s: A's fourth %v, want its turn in 50ms", a.tag, out[3])
			}
			p := pause(2 * sec)
			p.Queue = keys.FairQueue
			c.one(t, b, tag, p)
			clk.add(t, 500*time.Millisecond)
			if got := c.one(t, b, tag, A()); got.v[0] != 0 || got.v[2] != 1550*ms || got.v[6] != turn|paused {
				t.Fatalf("%s: A's request 500ms into the 2s pause: %v, want its turn in 1.55s (the pause's end and 50ms)", a.tag, got)
			}
			// Inspect's places (the tenant's, the group's busiest) count the pause's rest
			// the same way: 1.5s more than with the clock running
			places := func() [2]int64 {
				group := inspect()
				group.Queue = keys.FairQueue
				out := c.run(t, b, tag, c.of("A", inspect()), group)
				return [2]int64{out[0].extra[9], out[1].extra[11]}
			}
			paused := places()
			c.one(t, b, tag, resume())
			if running := places(); running[0] <= 0 || paused != [2]int64{running[0] + 1500*ms, running[1] + 1500*ms} {
				t.Fatalf("%s: A's place inspected 500ms into the 2s pause %v, after the resume %v: want 1.5s more", a.tag, paused, running)
			}
			if got := c.one(t, b, tag, A()); got.v[0] != 0 || got.v[2] != 50*ms || got.v[6] != turn {
				t.Fatalf("%s: A's request after the resume: %v, want its turn in 50ms", a.tag, got)
			}
		}
	})
}

// The queue a call makes is a skiplist on Redis (keep_queue), made by the tenants' fast
// path or by the loop, and it holds the tenants' members alone.
func TestQueueIsASkiplist(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := t.Context()
		for _, a := range allAlgos {
			for path, first := range map[string]*protocol.Request{"fast": nil, "loop": inspect()} {
				tag := tagOf(b, "skip"+path+a.tag)
				newClock(t, b, tag)
				c := call{a: a, limits: []limit{{10, sec, 10}}}
				reqs := []*protocol.Request{c.of("A", acquire(1, 0)), c.of("B", acquire(1, 0))}
				if first != nil {
					reqs = append([]*protocol.Request{first}, reqs...)
				}
				c.run(t, b, tag, reqs...)
				c.run(t, b, tag, c.of("C", acquire(1, 0)))
				members := b.Client.ZRange(ctx, tag+":q", 0, -1).Val()
				slices.Sort(members)
				if want := []string{"1000000 A", "1000000 B", "1000000 C"}; !slices.Equal(members, want) {
					t.Fatalf("%s, %s path: the queue holds %q, want %q", a.tag, path, members, want)
				}
				if enc := b.Client.ObjectEncoding(ctx, tag+":q").Val(); b.Real() && enc != "skiplist" {
					t.Fatalf("%s, %s path: the queue's encoding %q, want skiplist", a.tag, path, enc)
				}
			}
		}
	})
}

// A task's record keeps its place as a ticket's digits (14 significant), and a request of
// the same call that reads the record decides with the place as kept, as the call after
// it would: here a finish tag of 16 digits whose turn comes 750000.00000002µs on, 750000µs
// as the ticket keeps it.
func TestTicketRecordAsKept(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		c := call{a: tokenBucket, limits: []limit{{10, sec, 10}}}
		tagA, tagB := tagOf(b, "keptA"), tagOf(b, "keptB")
		clk := newClock(t, b, tagA, tagB)
		const F = 1000000.00000002 // A's finish tag, its place; V 0 at W 1
		for _, tag := range []string{tagA, tagB} {
			meta := fmt.Sprintf("%s\nf 0 1000000 %d %.17g", c.a.head(c.limits), clk.us(), F)
			if err := b.Client.Set(ctx, tag+":"+keys.State, "\n"+meta, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			if err := b.Client.ZAdd(ctx, tag+":"+keys.FairQueue, redis.Z{Score: F, Member: "1000000 A"}).Err(); err != nil {
				t.Fatal(err)
			}
		}
		task := func() *protocol.Request { return booking(hold(c.of("A", acquire(1, 0))), "x", 0) }
		lone := c.loneThenOne(t, b, tagA, tagB, task(), task())
		if lone[1].v[2] != 750*ms || lone[1].v[6] != turn|held {
			t.Fatalf("the task's second request: %v, want its turn in 750ms (its place as the record keeps it)", lone[1])
		}
	})
}

// A ticket kept past the queue's emptying (its tags start again from 0) holds no place: a
// task that comes back with it is granted as a newcomer, not told its turn has not come
// for as long as the old tags reach (it was, again and again: a River job snoozed 25
// times, its record renewed on each return).
func TestStaleTicketHoldsNoPlace(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, a := range allAlgos {
			tag := tagOf(b, "stale"+a.tag)
			clk := newClock(t, b, tag)
			c := call{a: a, limits: []limit{{10, sec, 10}}}
			A := func(r *protocol.Request) *protocol.Request { return c.of("A", r) }
			c.run(t, b, tag, A(acquire(1, 0)), A(acquire(1, 0)), A(acquire(1, 0)))
			held := c.one(t, b, tag, booking(hold(A(acquire(1, 0))), "x", 0))
			if held.v[0] != 0 || held.v[6]&protocol.FlagTicket == 0 {
				t.Fatalf("%s: A's fourth with h, want a ticket: %v", a.tag, held)
			}
			clk.add(t, 10*time.Second) // the clock passes every finish tag: the queue empties
			c.one(t, b, tag, c.of("B", acquire(1, 0)))
			c.one(t, b, tag, c.of("B", acquire(1, 0)))
			if got := c.one(t, b, tag, booking(hold(A(acquire(1, 0))), "x", 0)); got.v[0] != 1 {
				t.Fatalf("%s: A back with its record's stale ticket: %v, want granted", a.tag, got)
			}
			if got := c.one(t, b, tag, ticket(hold(A(acquire(1, 0))), held.v[5])); got.v[0] != 1 {
				t.Fatalf("%s: A with the stale ticket sent back (k): %v, want granted", a.tag, got)
			}
		}
	})
}

// A tenant of the least weight (a millionth) moves its finish tag 10^11 per place at
// 10/s: its tickets, in millionths alone, would be beyond 2^53 from its first, refused
// when sent back (k) and unreadable in a task's record. Its places are kept as 14
// significant digits: sent back, and kept in a task's record, they hold the place.
func TestTicketsOfALightTenant(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, a := range allAlgos {
			tag := tagOf(b, "light"+a.tag)
			newClock(t, b, tag)
			c := call{a: a, limits: []limit{{10, sec, 10}}}
			A := func(r *protocol.Request) *protocol.Request { r = c.of("A", r); r.Units = 1; return r }
			c.run(t, b, tag, A(acquire(1, 0)), A(acquire(1, 0)), A(acquire(1, 0)))
			held := c.one(t, b, tag, hold(A(acquire(1, protocol.MaxWait))))
			if held.v[0] != 0 || held.v[6]&protocol.FlagTicket == 0 || held.v[5] > protocol.MaxWait || placeOf(held.v[5]) != 3e11 {
				t.Fatalf("%s: A's fourth with h: %v, want a ticket for the place 3e11 below 2^53", a.tag, held)
			}
			if got := c.one(t, b, tag, ticket(hold(A(acquire(1, protocol.MaxWait))), held.v[5])); got.v[0] != 0 || got.v[5] != held.v[5] {
				t.Fatalf("%s: A back with its ticket: %v %s, want its place still held (the same ticket)", a.tag, got.v, got.err)
			}
			task := c.one(t, b, tag, booking(hold(A(acquire(1, 0))), "x", 0))
			if task.v[0] != 0 || placeOf(task.v[5]) != 4e11 {
				t.Fatalf("%s: a task of A's with h: %v %s, want a ticket for the place 4e11", a.tag, task.v, task.err)
			}
			if got := c.one(t, b, tag, booking(hold(A(acquire(1, 0))), "x", 0)); got.v[0] != 0 || got.v[5] != task.v[5] {
				t.Fatalf("%s: the task back, its record read: %v %s, want the same ticket", a.tag, got.v, got.err)
			}
		}
	})
}

// A task's booking re-placed under a lower override and then denied its tenant's turn
// (or beyond the horizon) keeps no record: its permits were given back. It was kept, so
// each return of the task gave the same booking back again, freeing the permits of other
// callers' bookings at its time (as would a give-back with the stamp it held), and the
// group then granted them again: above the limit.
func TestReplacedBookingDeniedKeepsNoRecord(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, a := range allAlgos {
			tag := tagOf(b, "rpl"+a.tag)
			clk := newClock(t, b, tag)
			c := call{a: a, limits: []limit{{2, sec, 2}}}
			record := func() string {
				v, _ := b.Client.Get(ctx, tag+":bk:task").Result()
				return v
			}
			booked := func() int64 { return c.one(t, b, tag, inspect()).extra[0] }
			// A weighs a thousandth: once it has booked, B queued ahead, its turn is far
			A := func(r *protocol.Request) *protocol.Request { r = c.of("A", r); r.Units = 1000; return r }
			task := func(r *protocol.Request) *protocol.Request { return booking(A(r), "task", 0) }
			c.one(t, b, tag, acquire(2, 0))
			clk.add(t, 500*time.Millisecond)
			if got := c.one(t, b, tag, c.of("B", acquire(1, 10*sec))); got.v[0] != 1 {
				t.Fatalf("%s: B: %v", a.tag, got)
			}
			got := c.one(t, b, tag, task(acquire(1, 10*sec)))
			if got.v[0] != 1 || record() == "" {
				t.Fatalf("%s: A's task books ahead: %v (record %q)", a.tag, got, record())
			}
			stamp := got.v[5]
			clk.add(t, time.Millisecond)
			c.one(t, b, tag, override(100*sec, 1, 1))
			clk.add(t, time.Millisecond)
			got = c.one(t, b, tag, task(acquire(1, 10*sec)))
			if got.v[0] != 0 || got.v[6]&turn == 0 || record() != "" {
				t.Fatalf("%s: re-placed, denied its turn: %v (record %q), want no record", a.tag, got, record())
			}
			before := booked()
			if got := c.one(t, b, tag, task(acquire(1, 10*sec))); got.v[0] != 0 || booked() != before {
				t.Fatalf("%s: the task back: %v, %d booked, want denied and still %d", a.tag, got, booked(), before)
			}
			if got := c.one(t, b, tag, task(cancel(1, stamp))); got.v[0] != 0 || booked() != before {
				t.Fatalf("%s: a give-back with the old stamp: %v, %d booked, want nothing freed, still %d", a.tag, got, booked(), before)
			}
		}
	})
}

// An inspect writes nothing (docs/operating.md: a dashboard may call it as often as it
// likes; a full Redis still serves it): a token bucket counted at an override's rates,
// the override ended since, or at another process's head, was rewritten by a lone
// inspect, at the inspecting caller's head (replacing the fleet's) and with a new TTL.
func TestInspectWritesNothing(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, a := range allAlgos {
			tag := tagOf(b, "inw"+a.tag)
			all := []string{tag + ":l", tag + ":q", tag + ":t:A"}
			clk := newClock(t, b, tag)
			c := call{a: a, limits: []limit{{3, sec, 3}}, caps: []limit{{2, sec, 2}}}
			other := call{a: a, limits: []limit{{5, sec, 5}}, caps: c.caps}
			c.run(t, b, tag, c.of("A", acquire(1, 0)), c.of("B", acquire(2, 5*sec)))
			c.one(t, b, tag, override(sec, 1, 1))
			clk.add(t, 100*time.Millisecond)
			c.one(t, b, tag, acquire(1, 5*sec))
			clk.add(t, 1500*time.Millisecond) // the override has ended
			for _, who := range []struct {
				c    call
				note string
			}{{c, "the override ended"}, {other, "another head"}} {
				for _, r := range []*protocol.Request{inspect(), who.c.of("A", inspect())} {
					before := snapshot(t, b.Client, all...)
					if got := who.c.one(t, b, tag, r); got.failed() {
						t.Fatalf("%s: %s: %v", a.tag, who.note, got)
					}
					if after := snapshot(t, b.Client, all...); !sameKeys(b, before, after) {
						t.Fatalf("%s: %s: %s wrote:\n%v\nbecame\n%v", a.tag, who.note, texts([]*protocol.Request{r}), before, after)
					}
				}
			}
		}
	})
}
