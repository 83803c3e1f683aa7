package lua

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// snapshot returns each key's type, value and TTL as text.
func snapshot(t testing.TB, c redis.UniversalClient, keys ...string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	for _, k := range keys {
		typ := c.Type(ctx, k).Val()
		var v any
		switch typ {
		case "string":
			v = c.Get(ctx, k).Val()
		case "list":
			v = c.LRange(ctx, k, 0, -1).Val()
		case "zset":
			v = c.ZRangeWithScores(ctx, k, 0, -1).Val()
		case "hash":
			v = c.HGetAll(ctx, k).Val()
		}
		out[k] = fmt.Sprintf("%s %v ttl %v", typ, v, c.PTTL(ctx, k).Val())
	}
	return out
}

// foreign puts content jobthrottle did not write in key: kind "type" is a value of another
// type than want ("string", "list" or "zset"), "text" a value of that type that is not ours.
func foreign(t testing.TB, c redis.UniversalClient, key, want, kind string) {
	t.Helper()
	ctx := context.Background()
	var err error
	switch {
	case kind == "type" && want == "string", kind == "text" && want == "list":
		err = c.RPush(ctx, key, "a", "b", "c").Err()
	case kind == "type":
		err = c.HSet(ctx, key, "f", "v").Err()
	case want == "zset":
		err = c.ZAdd(ctx, key, redis.Z{Member: "x:y", Score: 1e18}).Err()
	default:
		err = c.Set(ctx, key, "1 2 3 x", 0).Err()
	}
	if err != nil {
		t.Fatal(err)
	}
}

// Nothing lands on a key jobthrottle does not own: a foreign state key fails the requests
// that need it (JTSTATE), and neither it nor the record is written, while a pause, which
// needs no state (but the token bucket's override does), goes through; a foreign control
// key fails every request and nothing is written; a foreign booking key fails its request
// only; a foreign record is left alone, silently.
func TestForeignKeys(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, a := range allAlgos {
			stateType := "string"
			if a.name == "log" {
				stateType = "list"
			}
			c := limiterCall{a: a, limits: []limit{{5, sec, 5}}, record: "1 " + a.suffix + " 1 5/1s", recordTTL: 60000, extras: []any{3, 3}}
			reqs := func(k int) []req {
				return []req{acquire(1, 0), inspect(), pauseFor(sec), {op: opOverride, n: 1, y: c.extraIndex(k)}, {op: opAcquire, n: 1, booking: "t"}}
			}
			for _, kind := range []string{"type", "text"} {
				name := func(s string) string { return strings.Join([]string{a.suffix, s, kind}, "-") }

				tag := tagOf(b, name("state"))
				state := tag + ":" + a.suffix
				foreign(t, b.Client, state, stateType, kind)
				before := snapshot(t, b.Client, state)
				out := c.run(t, b, tag, reqs(5)...)
				for i, r := range out {
					needs := i != 2 && (i != 3 || a.burst)
					if got := strings.HasPrefix(r.err, "JTSTATE "+state); got != needs {
						t.Errorf("%s, foreign state (%s), request %d: %v", a.suffix, kind, i+1, r)
					}
				}
				if after := snapshot(t, b.Client, state); fmt.Sprint(after) != fmt.Sprint(before) {
					t.Errorf("%s, foreign state (%s): %v became %v", a.suffix, kind, before, after)
				}
				if n := b.Client.Exists(ctx, tag+":conf", tag+":bk:t").Val(); n != 0 {
					t.Errorf("%s, foreign state (%s): the record or the booking was written", a.suffix, kind)
				}
				if b.Client.Exists(ctx, tag+":pause").Val() != 1 {
					t.Errorf("%s, foreign state (%s): the pause was not written", a.suffix, kind)
				}

				tag = tagOf(b, name("control"))
				foreign(t, b.Client, tag+":pause", "string", kind)
				all := []string{tag + ":" + a.suffix, tag + ":pause", tag + ":conf", tag + ":bk:t"}
				before = snapshot(t, b.Client, all...)
				for i, r := range c.run(t, b, tag, reqs(5)...) {
					if !strings.HasPrefix(r.err, "JTSTATE "+tag+":pause") {
						t.Errorf("%s, foreign control key (%s), request %d: %v", a.suffix, kind, i+1, r)
					}
				}
				if after := snapshot(t, b.Client, all...); fmt.Sprint(after) != fmt.Sprint(before) {
					t.Errorf("%s, foreign control key (%s): %v became %v", a.suffix, kind, before, after)
				}

				tag = tagOf(b, name("booking"))
				foreign(t, b.Client, tag+":bk:t", "string", kind)
				before = snapshot(t, b.Client, tag+":bk:t")
				out = c.run(t, b, tag, acquire(1, 0), req{op: opAcquire, n: 1, x: 10 * sec, booking: "t"}, req{op: opCancel, n: 1, x: 1, booking: "t"})
				if out[0].v[0] != 1 || !strings.HasPrefix(out[1].err, "JTSTATE "+tag+":bk:t") || !strings.HasPrefix(out[2].err, "JTSTATE") {
					t.Errorf("%s, foreign booking key (%s): %v", a.suffix, kind, out)
				}
				if after := snapshot(t, b.Client, tag+":bk:t"); fmt.Sprint(after) != fmt.Sprint(before) {
					t.Errorf("%s, foreign booking key (%s): %v became %v", a.suffix, kind, before, after)
				}

				tag = tagOf(b, name("record"))
				foreign(t, b.Client, tag+":conf", "string", kind)
				before = snapshot(t, b.Client, tag+":conf")
				if out := c.run(t, b, tag, acquire(1, 0)); out[0].v[0] != 1 {
					t.Errorf("%s, foreign record (%s): %v", a.suffix, kind, out)
				}
				if after := snapshot(t, b.Client, tag+":conf"); fmt.Sprint(after) != fmt.Sprint(before) {
					t.Errorf("%s, foreign record (%s): %v became %v", a.suffix, kind, before, after)
				}
			}
			// the record is written when due: absent, or one of ours (another's limits)
			tag := tagOf(b, a.suffix+"-record")
			for _, had := range []string{"", "1 tb 1 7/1m0s:7"} {
				if had != "" {
					b.Client.Set(ctx, tag+":conf", had, 0)
				}
				c.run(t, b, tag, acquire(1, 0))
				if v := b.Client.Get(ctx, tag+":conf").Val(); v != c.record {
					t.Errorf("%s: record %q over %q, want %q", a.suffix, v, had, c.record)
				}
				if ttl := b.Client.PTTL(ctx, tag+":conf").Val(); !b.Real() && ttl != time.Minute {
					t.Errorf("%s: record TTL %v, want 1m", a.suffix, ttl)
				}
			}
		}
	})
}

// One algorithm per key: a grant that would create the state key while another
// algorithm's state exists under the tag fails with JTALG, writing nothing; a state of its
// own, or a call that creates nothing, is not checked.
func TestOneAlgorithmPerKey(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, a := range allAlgos {
			tag := tagOf(b, "alg"+a.suffix)
			newClock(t, b, tag)
			var others []string
			for _, o := range allAlgos {
				if o.suffix != a.suffix {
					others = append(others, o.suffix)
				}
			}
			c := limiterCall{a: a, limits: []limit{{5, sec, 5}}, others: others, extras: []any{3, 3}}
			other := tag + ":" + others[1]
			b.Client.Set(ctx, other, "x", 0)
			all := []string{tag + ":" + a.suffix, tag + ":pause", tag + ":conf", other}
			before := snapshot(t, b.Client, all...)
			out := c.run(t, b, tag, acquire(0, 0), inspect(), req{op: opCancel, n: 1, x: 1}, acquire(1, 0))
			if out[0].v[0] != 1 || out[1].err != "" || out[2].err != "" || out[3].err != "JTALG "+other {
				t.Fatalf("%s: %v", a.suffix, out)
			}
			if after := snapshot(t, b.Client, all...); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("%s: %v became %v", a.suffix, before, after)
			}
			out = c.run(t, b, tag, req{op: opOverride, n: 1, y: c.extraIndex(1)})
			if got := out[0].err == "JTALG "+other; got != a.burst {
				t.Fatalf("%s: override while another algorithm's state exists: %v", a.suffix, out)
			}
			c.run(t, b, tag, req{op: opClear})
			b.Client.Del(ctx, other)
			if out := c.run(t, b, tag, acquire(1, 0)); out[0].v[0] != 1 {
				t.Fatalf("%s: %v", a.suffix, out)
			}
			b.Client.Set(ctx, other, "x", 0)
			if out := c.run(t, b, tag, acquire(1, 0)); out[0].v[0] != 1 {
				t.Fatalf("%s: with its own state: %v", a.suffix, out)
			}
		}
	})
}

// Each state key's TTL is what its file's header says (miniredis keeps the test's clock
// for TTLs): the log's until its last entry leaves the longest window, the bucket's until
// every bucket is full, the window's to the end of the longest window holding the latest
// grant.
func TestStateTTLs(t *testing.T) {
	b := redistest.NewMini(t)
	for _, tc := range []struct {
		a    algo
		ttl  time.Duration
		note string
	}{
		{slidingWindow, 1500 * time.Millisecond, "the 1.5s period"},
		{slidingCounter, 1510 * time.Millisecond, "recorded at the end of its 10ms sub-bucket"},
		{tokenBucket, 1500 * time.Millisecond, "4 tokens at 4 per 1.5s"},
		{fixedWindow, time.Second, "Epoch is 500ms into its 1.5s window"},
	} {
		tag := tagOf(b, "ttl"+tc.a.suffix)
		newClock(t, b, tag)
		c := limiterCall{a: tc.a, limits: []limit{{4, 500 * ms, 4}, {4, 1500 * ms, 4}}}
		c.run(t, b, tag, acquire(4, 0))
		if got := b.Client.PTTL(context.Background(), tag+":"+tc.a.suffix).Val(); got != tc.ttl {
			t.Errorf("%s: TTL %v, want %v (%s)", tc.a.suffix, got, tc.ttl, tc.note)
		}
	}
}
