package lua

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
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
			if got := c.one(t, b, tag, inspect()); got.v[1] != 0 || got.v[2] != 5*sec || got.v[6] != paused || got.extra[2] != 5*sec {
				fail("inspect while paused", got)
			}
			if got := c.one(t, b, tag, acquire(1, 10*sec)); got.v[0] != 1 || got.v[2] != 5*sec || got.v[4] != now+5*sec || got.v[6] != paused {
				fail("booking while paused", got)
			}
			if got := c.one(t, b, tag, pause(sec)); got.v[2] != 5*sec {
				fail("a shorter pause, want the longer one kept", got)
			}
			clk.add(t, time.Second)
			if got := c.one(t, b, tag, resume()); got.v != [7]int64{1, 0, 0, 0, now + 5*sec, 0, 0} {
				fail("resume, want the ended pause's end in the fifth integer", got)
			}
			woke(fmt.Sprintf("r %d", now+5*sec)) // (the shorter pause published nothing)
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
			if got := c.one(t, b, tag, inspect()); got.extra[4] != 2*sec || got.extra[5] != 8 || got.extra[6] != 8 {
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
				if got.extra[2] != max(0, m.PauseEnd-now) || got.extra[4] != wantOver {
					t.Errorf("meta %q: %v, want paused %d, override %d", text, got, max(0, m.PauseEnd-now), wantOver)
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
