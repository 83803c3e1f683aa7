package lua

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A multi-form call decides each of its calls exactly as the script called on its own
// would, one after another: random rounds of calls (single calls and batches, on four
// keys, a key twice in a round at times, a bad argument now and then, and a key of the
// wrong type) on every limiter script, run as calls of their own on one set of keys
// and as one multi-form call on another, must get the same replies (errors by their
// code) and leave the same state. The clock stands still within a round and moves
// between rounds.
func TestMultiEqualsSeparateCalls(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		if b.Kind == redistest.Cluster {
			t.Skip("the multi form runs on one node: package throttle does not use it on a cluster")
		}
		for i, a := range batchAlgos {
			for _, two := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/two=%v", a.name, two), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(i), 11))
					multiVsSeparate(t, b, a, two, 30, func(n int) int { return rng.IntN(n) })
				})
			}
		}
	})
}

// FuzzMulti is TestMultiEqualsSeparateCalls on miniredis with the rounds, calls and
// clock steps the fuzzer picks.
func FuzzMulti(f *testing.F) {
	f.Add(uint8(0), false, []byte{3, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add(uint8(3), true, []byte{9, 200, 17, 3, 3, 3, 0, 1, 250, 6, 6, 4, 4, 4})
	f.Fuzz(func(t *testing.T, which uint8, two bool, data []byte) {
		b := redistest.NewMini(t)
		a := batchAlgos[int(which)%len(batchAlgos)]
		multiVsSeparate(t, b, a, two, 1+len(data)/8, picker(data))
	})
}

// multiName is the Name of a batchAlgo's script.
func multiName(a batchAlgo) Name {
	for n := range numNames {
		if n.Source() == a.src {
			return n
		}
	}
	panic("no such script: " + a.name)
}

// multiVsSeparate runs rounds of calls as calls of their own on keys "A…" and as one
// multi-form call on keys "B…", and fails unless replies and states are the same.
func multiVsSeparate(t *testing.T, b *redistest.Backend, a batchAlgo, two bool, rounds int, pick func(n int) int) {
	t.Helper()
	ctx := context.Background()
	name := multiName(a)
	s, m := name.Script(), name.Multi()
	if b.Real() {
		s, m = redistest.FakeClockScript(a.src), redistest.FakeClockScript(name.MultiSource())
	}
	const nkeys = 5 // key 4 holds a hash: every call on it is WRONGTYPE
	var tags []string
	keysOf := func(set string, i int) []string {
		tag := fmt.Sprintf("{%s%s%s%d}", b.Prefix, a.name, set, i)
		return []string{tag + ":" + a.suffix, tag + ":pause"}
	}
	for _, set := range []string{"A", "B"} {
		for i := range nkeys {
			tag, _, _ := strings.Cut(keysOf(set, i)[0], "}")
			tags = append(tags, tag+"}")
		}
		if err := b.Client.HSet(ctx, keysOf(set, nkeys-1)[0], "f", "v").Err(); err != nil {
			t.Fatal(err)
		}
	}
	tail := a.tail(two)
	now := redistest.Epoch
	for round := 0; round < rounds; round++ {
		now = now.Add(time.Duration(pick(60)*1000+pick(1000)) * time.Microsecond)
		b.SetTime(t, now, tags...) // the multi form reads the clock of its first key's tag
		g := 1 + pick(6)
		type call struct {
			key  int
			args []any
		}
		var calls []call
		for range g {
			key := pick(nkeys)
			var args []any
			switch r := pick(10); {
			case r < 4: // a single call
				args = append([]any{0, pick(7), pick(300) * 1000}, tail...)
			case r < 9: // a batch
				k := 1 + pick(6)
				args = []any{Batch, k}
				for range k {
					args = append(args, 0, pick(7), pick(300)*1000)
				}
				args = append(args, tail...)
			default: // a bad argument: the call's own JTARG
				args = append([]any{0, -1, 0}, tail...)
			}
			calls = append(calls, call{key, args})
		}
		var want []any
		margs := []any{MultiForm, g}
		var mkeys []string
		for _, c := range calls {
			v, err := s.Run(ctx, b.Client, keysOf("A", c.key), c.args...).Result()
			if err != nil {
				want = append(want, err.Error())
			} else {
				want = append(want, v)
			}
			margs = append(margs, 2, len(c.args))
			mkeys = append(mkeys, keysOf("B", c.key)...)
		}
		for _, c := range calls {
			margs = append(margs, c.args...)
		}
		v, err := m.Run(ctx, b.Client, mkeys, margs...).Result()
		if err != nil {
			t.Fatalf("round %d: multi %v: %v", round, margs, err)
		}
		got, err := splitMulti(v)
		if err != nil {
			t.Fatalf("round %d: multi %v: %v", round, margs, err)
		}
		if len(got) != len(want) {
			t.Fatalf("round %d: %d replies, want %d", round, len(got), len(want))
		}
		for i := range got {
			if gs, ok := got[i].(string); ok {
				w, _ := want[i].(string)
				if errCode(gs) != errCode(w) || errCode(gs) == "" {
					t.Fatalf("round %d call %d %v: multi says %q, its own call %v", round, i, calls[i], gs, want[i])
				}
				continue
			}
			if !reflect.DeepEqual(got[i], want[i]) {
				t.Fatalf("round %d call %d %v: multi %v, its own call %v", round, i, calls[i], got[i], want[i])
			}
		}
		for i := range nkeys {
			sa := b.Client.Dump(ctx, keysOf("A", i)[0]).Val()
			sb := b.Client.Dump(ctx, keysOf("B", i)[0]).Val()
			if sa != sb {
				t.Fatalf("round %d: key %d's state differs after the multi call", round, i)
			}
		}
	}
}

// splitMulti reads a multi-form reply (see multi.lua) into one element per call: its
// reply ([]any of int64, as a call of its own reads), or its error's text (string).
func splitMulti(v any) ([]any, error) {
	flat, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("multi reply %v: not an array", v)
	}
	var out []any
	for o := 0; o < len(flat); {
		if o+2 > len(flat) {
			return nil, fmt.Errorf("multi reply %v: cut at %d", v, o)
		}
		kind, _ := flat[o].(int64)
		n, _ := flat[o+1].(int64)
		body := flat[o+2:]
		if n < 0 || int(n) > len(body) {
			return nil, fmt.Errorf("multi reply %v: length %d at %d", v, n, o)
		}
		body = body[:n]
		switch kind {
		case 0:
			out = append(out, append([]any{}, body...))
		case 1:
			text := make([]byte, n)
			for i := range text {
				c, _ := body[i].(int64)
				text[i] = byte(c)
			}
			out = append(out, string(text))
		default:
			return nil, fmt.Errorf("multi reply %v: kind %d at %d", v, kind, o)
		}
		o += 2 + int(n)
	}
	return out, nil
}

// The multi form's own arguments are checked before any call runs: a bad count or
// layout is JTARG and writes nothing.
func TestMultiArguments(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) { // one key: one slot, the cluster too
		ctx := context.Background()
		tag := "{" + b.Prefix + "m}"
		keys := []string{tag + ":sw", tag + ":pause"}
		call := []any{0, 1, 0, 1, 5, 1000000}
		for _, args := range [][]any{
			append([]any{MultiForm, 0, 2, 6}, call...),
			append([]any{MultiForm, "x", 2, 6}, call...),
			append([]any{MultiForm, 1001, 2, 6}, call...),
			append([]any{MultiForm, 1, 2, 5}, call...),
			append([]any{MultiForm, 1, 1, 6}, call...),
			append([]any{MultiForm, 2, 2, 6}, call...),
			append([]any{MultiForm, 1, "-2", 6}, call...),
			append([]any{Batch, 1, 2, 6}, call...),
			{MultiForm, 1, 2, 6},
		} {
			err := SlidingWindow.Multi().Run(ctx, b.Client, keys, args...).Err()
			if err == nil || !strings.Contains(err.Error(), "JTARG") {
				t.Fatalf("%v: %v, want JTARG", args, err)
			}
			if n := b.Client.Exists(ctx, keys...).Val(); n != 0 {
				t.Fatalf("%v: %d keys written", args, n)
			}
		}
		v, err := SlidingWindow.Multi().Run(ctx, b.Client, keys, append([]any{MultiForm, 1, 2, 6}, call...)...).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got, err := splitMulti(v); err != nil || len(got) != 1 || got[0].([]any)[0] != int64(1) {
			t.Fatalf("a good call: %v %v, want it granted", got, err)
		}
	})
}

// Every script with a multi form compiles as one (Redis's Lua limits on a function's
// locals and upvalues hold with the script's body made a function), and MultiOf finds
// it from the script.
func TestMultiForms(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for n := range numNames {
			m := n.Multi()
			if m == nil {
				continue
			}
			if MultiOf(n.Script()) != m {
				t.Fatalf("%d: MultiOf does not find its multi form", n)
			}
			if err := m.Load(context.Background(), b.Client).Err(); err != nil {
				t.Fatalf("%d: %v", n, err)
			}
		}
		if MultiOf(Pause.Script()) != nil || MultiOf(redis.NewScript("return 1")) != nil {
			t.Fatal("MultiOf found a multi form of a script that has none")
		}
	})
}

// multi.lua reports a call whose reply is not an array of integers as kind 2 (nothing
// of it copied), an error a call returns or raises as kind 1, and refuses counts
// unpack cannot take before any call runs.
func TestMultiReplyKinds(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		s := redis.NewScript(`local function jt_key(KEYS, ARGV)
  if ARGV[1] == 'str' then return {1, 'x', 3} end
  if ARGV[1] == 'err' then return redis.error_reply('JTARG mine') end
  if ARGV[1] == 'raise' then error('JTSTATE raised') end
  if ARGV[1] == 'empty' then return {} end
  return {7, 8}
end
` + multiSrc)
		tag := "{" + b.Prefix + "kinds}"
		v, err := s.Run(ctx, b.Client, []string{tag + ":a"}, MultiForm, 5, 0, 1, 0, 1, 0, 1, 1, 1, 0, 1,
			"str", "err", "raise", "ok", "empty").Result()
		if err != nil {
			t.Fatal(err)
		}
		flat := v.([]any)
		if fmt.Sprint(flat[:2]) != "[2 0]" || fmt.Sprint(flat[len(flat)-6:]) != "[0 2 7 8 0 0]" {
			t.Fatalf("reply %v: want kind 2 first, then {7, 8} and an empty reply last", flat)
		}
		got, err := splitMulti(append([]any{}, flat[2:]...))
		if err != nil || len(got) != 4 || !strings.Contains(fmt.Sprint(got[0]), "JTARG mine") || !strings.Contains(fmt.Sprint(got[1]), "JTSTATE raised") {
			t.Fatalf("the errors: %v %v", got, err)
		}
		err = s.Run(ctx, b.Client, []string{tag + ":a"}, MultiForm, 1, 1, 7001).Err()
		if err == nil || !strings.Contains(err.Error(), "JTARG") {
			t.Fatalf("a call of 7001 arguments: %v, want JTARG", err)
		}
	})
}
