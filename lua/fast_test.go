package lua

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// fastAlgo is a limiter script with a fast path (fast[name] != ""), with its state
// key's suffix and the ARGV tail of one limit (which the fast path takes) and of two
// (which it leaves to the full script).
type fastAlgo struct {
	name   Name
	suffix string
	one    []any
	two    []any
	burst  int // the most n the one-limit tail allows
}

var fastAlgos = []fastAlgo{
	{GCRA, "tb", []any{1, 5, 100000, 5}, []any{2, 5, 100000, 5, 12, 1000000, 8}, 5},
	{FixedWindow, "fw", []any{1, 5, 100000}, []any{2, 5, 100000, 12, 1000000}, 5},
	{SlidingWindow, "sw", []any{1, 5, 100000}, []any{2, 5, 100000, 12, 1000000}, 5},
	{SlidingCounter, "sc", []any{1, 10000, 5, 100000}, []any{2, 10000, 5, 100000, 12, 1000000}, 5},
}

// A script's fast path decides exactly as the full script: random calls (acquires
// with n from 0 to above the limit, max waits from 0 past the next slots, cancels of
// earlier grants, arguments of other shapes, single calls and batches), with the
// control key now and then holding a pause or an override, the state key now and
// then deleted or foreign, and another algorithm's key now and then present, go to
// the production script (fast path first) on one key and to the full script alone on
// another: the replies (errors by their text, the key's name aside) and the state and
// TTL left must be the same.
func TestFastPathEqualsFullScript(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for i, a := range fastAlgos {
			t.Run(a.suffix, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(i), 11))
				fastVsFull(t, b, a, 300, func(n int) int { return rng.IntN(n) })
			})
		}
	})
}

// FuzzFastPath is TestFastPathEqualsFullScript on miniredis with the steps the fuzzer
// picks.
func FuzzFastPath(f *testing.F) {
	f.Add(uint8(0), []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	f.Add(uint8(0), []byte{0, 0, 0, 0, 255, 3, 17, 40, 9, 9, 9, 9, 2, 1})
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		b := redistest.NewMini(t)
		a := fastAlgos[int(which)%len(fastAlgos)]
		fastVsFull(t, b, a, 1+len(data)/6, picker(data))
	})
}

func fastVsFull(t *testing.T, b *redistest.Backend, a fastAlgo, steps int, pick func(n int) int) {
	t.Helper()
	ctx := context.Background()
	prod, ref := redis.NewScript(a.name.Source()), redis.NewScript(full[a.name])
	if b.Real() {
		prod, ref = redistest.FakeClockScript(a.name.Source()), redistest.FakeClockScript(full[a.name])
	}
	tags := [2]string{"{" + b.Prefix + "fastA}", "{" + b.Prefix + "fastB}"}
	var keys [2][]string
	for i, tag := range tags {
		keys[i] = []string{tag + ":" + a.suffix, tag + ":pause"}
		for _, s := range []string{"sw", "sc", "tb", "fw"} {
			if s != a.suffix {
				keys[i] = append(keys[i], tag+":"+s)
			}
		}
	}
	// both keys alike: f gets a key's keys
	both := func(f func(keys []string) error) {
		t.Helper()
		for _, k := range keys {
			if err := f(k); err != nil {
				t.Fatal(err)
			}
		}
	}
	now := redistest.Epoch
	b.SetTime(t, now, tags[0], tags[1])
	var tokens []int64
	num := func() string { // an argument, usually good
		switch pick(40) {
		case 0:
			return "1e3"
		case 1:
			return " 5"
		case 2:
			return ""
		case 3:
			return "-1"
		case 4:
			return "0x10"
		case 5:
			return "99999999999999999999"
		}
		return fmt.Sprint(pick(7))
	}
	request := func() []any {
		op, n, x := any(0), any(pick(a.burst+2)), any(int64(0))
		switch r := pick(20); {
		case r < 3 && len(tokens) > 0:
			op, n, x = 1, 1+pick(2), tokens[pick(len(tokens))]
		case r < 10:
			x = int64(pick(300) * 1000)
		case r == 10:
			x = int64(1) << 53
		case r == 11:
			op = pick(4)
		case r == 12:
			op, n, x = num(), num(), num()
		}
		return []any{op, n, x}
	}
	for step := 0; step < steps; step++ {
		if pick(3) == 0 {
			now = now.Add(time.Duration(pick(200)*1000+pick(1000)) * time.Microsecond)
			b.SetTime(t, now, tags[0], tags[1])
		}
		switch pick(30) {
		case 0: // a pause until a little later, or one that has ended
			end := now.Add(time.Duration(pick(3)-1) * 50 * time.Millisecond).UnixMicro()
			both(func(k []string) error { return b.Client.Set(ctx, k[1], fmt.Sprint(end), 0).Err() })
		case 1: // an override of the first limit's rate and burst
			end := now.Add(time.Duration(pick(3)-1) * 100 * time.Millisecond).UnixMicro()
			v := fmt.Sprintf("0 %d 1 %d %d", end, 1+pick(8), pick(8))
			both(func(k []string) error { return b.Client.Set(ctx, k[1], v, 0).Err() })
		case 2, 3, 9, 10:
			both(func(k []string) error { return b.Client.Del(ctx, k[1]).Err() })
		case 4:
			both(func(k []string) error { return b.Client.Del(ctx, k[0]).Err() })
		case 5: // foreign state: a string, or a key of another type
			str := pick(2) == 0
			both(func(k []string) error {
				if str {
					return b.Client.Set(ctx, k[0], "junk:1:2", 0).Err()
				}
				b.Client.Del(ctx, k[0])
				return b.Client.HSet(ctx, k[0], "f", "1").Err()
			})
		case 6: // another algorithm's state on the key
			both(func(k []string) error { return b.Client.RPush(ctx, k[2], "0").Err() })
		case 7, 8:
			both(func(k []string) error { return b.Client.Del(ctx, k[2]).Err() })
		case 11: // a log's entry far in, not a number (the others have no list)
			i := int64(5 + pick(8))
			both(func(k []string) error { b.Client.LSet(ctx, k[0], i, "x"); return nil })
		}
		tail := a.one
		if pick(8) == 0 {
			tail = a.two
		}
		var args []any
		if pick(2) == 0 {
			args = append(request(), tail...)
		} else {
			k := 1 + pick(10)
			args = []any{Batch, k}
			for range k {
				args = append(args, request()...)
			}
			args = append(args, tail...)
			if pick(30) == 0 {
				args[1] = k + 1 // a count that does not fit
			}
		}
		if pick(40) == 0 {
			args[len(args)-1-pick(len(tail))] = num()
		}
		trace := fmt.Sprintf("step %d: ARGV %v", step, args)
		var got [2]string
		for i, s := range []*redis.Script{prod, ref} {
			v, err := s.Run(ctx, b.Client, keys[i], args...).Result()
			if err != nil {
				got[i] = "error " + err.Error()
			} else {
				got[i] = fmt.Sprint(v)
				if args[0] == Batch { // the errors' texts, to compare as text
					k, _ := args[1].(int)
					if rs, err := splitBatch(v, k); err == nil {
						got[i] = fmt.Sprint(rs)
					}
				}
			}
			got[i] = strings.ReplaceAll(got[i], tags[i], "{tag}")
			if j := strings.Index(got[i], " stack traceback"); j >= 0 {
				got[i] = got[i][:j]
			}
			got[i] = lineNumber.ReplaceAllString(got[i], ":N:")
			if i == 0 && err == nil {
				tokens = append(tokens, grantedTokens(args, v)...)
			}
		}
		if got[0] != got[1] {
			t.Fatalf("%s:\n  fast path %s\n  full      %s", trace, got[0], got[1])
		}
		for j := range keys[0] {
			ka, kb := keys[0][j], keys[1][j]
			if sa, sb := contents(ctx, b.Client, ka), contents(ctx, b.Client, kb); sa != sb {
				t.Fatalf("%s: %s differs: %s, full script %s", trace, ka, sa, sb)
			}
			ta, tb := b.Client.PTTL(ctx, ka).Val(), b.Client.PTTL(ctx, kb).Val()
			if d := ta - tb; d > time.Second || d < -time.Second || (!b.Real() && d != 0) {
				t.Fatalf("%s: %s's TTL %v, full script %v", trace, ka, ta, tb)
			}
		}
	}
}

// contents returns a key's type and what it holds, as text.
func contents(ctx context.Context, c redis.UniversalClient, key string) string {
	switch typ := c.Type(ctx, key).Val(); typ {
	case "string":
		return typ + " " + c.Get(ctx, key).Val()
	case "list":
		return fmt.Sprint(typ, c.LRange(ctx, key, 0, -1).Val())
	case "hash":
		return fmt.Sprint(typ, c.HGetAll(ctx, key).Val())
	default:
		return typ
	}
}

// lineNumber is the place in the script an error names, or its SHA, which differ
// between the two scripts.
var lineNumber = regexp.MustCompile(`[^\s\[]*:\d+[:.]|script: [0-9a-f]{40}`)

// grantedTokens returns the tokens of the acquires a reply to args granted.
func grantedTokens(args []any, v any) []int64 {
	reply := func(r any) int64 {
		if g, ok := r.([]any); ok && len(g) >= 5 && g[0] == int64(1) {
			if tok, ok := g[4].(int64); ok && tok != 0 {
				return tok
			}
		}
		return 0
	}
	var out []int64
	if args[0] == Batch {
		k, _ := args[1].(int)
		rs, _ := splitBatch(v, k)
		for _, r := range rs {
			if tok := reply(r); tok != 0 {
				out = append(out, tok)
			}
		}
	} else if tok := reply(v); tok != 0 {
		out = append(out, tok)
	}
	return out
}

// A log whose times or counts past the head (and before the last entry) are not
// numbers fails the fast path's call as the
// full script's, with the same JTSTATE, once a lookup reaches them.
func TestFastPathCorruptLog(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, c := range []struct {
			a     fastAlgo
			first int64 // the first element made "x", then every second one
		}{{fastAlgos[2], 9}, {fastAlgos[2], 10}, {fastAlgos[3], 9}, {fastAlgos[3], 10}} {
			a := c.a
			t.Run(fmt.Sprint(a.suffix, c.first), func(t *testing.T) {
				tail := append([]any(nil), a.one...)
				tail[len(tail)-2], tail[len(tail)-1] = 20, 1000000 // 20 per second
				var got [2]string
				for i, src := range []string{a.name.Source(), full[a.name]} {
					s := redis.NewScript(src)
					if b.Real() {
						s = redistest.FakeClockScript(src)
					}
					tag := fmt.Sprintf("{%scorrupt%s%d-%d}", b.Prefix, a.suffix, c.first, i)
					keys := []string{tag + ":" + a.suffix, tag + ":pause"}
					now := redistest.Epoch
					for range 40 { // 20 grants now, 20 booked a second later, one entry each
						now = now.Add(20 * time.Millisecond)
						b.SetTime(t, now, tag)
						if err := s.Run(ctx, b.Client, keys, append([]any{0, 1, 10000000}, tail...)...).Err(); err != nil {
							t.Fatal(err)
						}
					}
					n := b.Client.LLen(ctx, keys[0]).Val()
					if n < 30 {
						t.Fatalf("the log has %d elements, want more than its head", n)
					}
					for j := c.first; j < n-2; j += 2 { // times (odd) or counts (even)
						b.Client.LSet(ctx, keys[0], j, "x")
					}
					got[i] = fmt.Sprint(s.Run(ctx, b.Client, keys, append([]any{0, 1, 10000000}, tail...)...).Err())
				}
				for i := range got {
					got[i] = lineNumber.ReplaceAllString(got[i], ":N:")
					if j := strings.Index(got[i], " stack traceback"); j >= 0 {
						got[i] = got[i][:j]
					}
					got[i] = strings.ReplaceAll(got[i], fmt.Sprintf("-%d}", i), "}")
				}
				if got[0] != got[1] || !strings.Contains(got[0], "JTSTATE") {
					t.Fatalf("fast path %s, full script %s; want the same JTSTATE", got[0], got[1])
				}
			})
		}
	})
}

// An argument holding a comma (digits otherwise) is left to the full script, which
// answers it (JTARG), by the fast path of every algorithm: in a single call's limit,
// and in a batch request's n or x. (The fast path joins the arguments with commas to
// check them in one pattern: such a field once passed that check, and reading it as a
// number raised a Lua error in place of the full script's answer.)
func TestFastPathCommaInArgument(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, a := range fastAlgos {
			comma := append([]any(nil), a.one...)
			comma[1] = "5,6"
			calls := map[string][]any{
				"single limit": append([]any{0, 1, 0}, comma...),
				"single n":     append([]any{0, "1,2", 0}, a.one...),
				"batch n":      append([]any{Batch, 2, 0, "1,2", 0, 0, 1, 0}, a.one...),
				"batch x":      append([]any{Batch, 2, 0, 1, "0,1", 0, 1, 0}, a.one...),
				"batch limit":  append([]any{Batch, 1, 0, 1, 0}, comma...),
			}
			for name, args := range calls {
				t.Run(a.suffix+" "+name, func(t *testing.T) {
					var got [2]string
					for i, src := range []string{a.name.Source(), full[a.name]} {
						tag := fmt.Sprintf("{%scomma%s-%d}", b.Prefix, a.suffix, i)
						s := redis.NewScript(src)
						if b.Real() {
							s = redistest.FakeClockScript(src)
						}
						b.SetTime(t, redistest.Epoch, tag)
						v, err := s.Run(ctx, b.Client, []string{tag + ":" + a.suffix, tag + ":pause"}, args...).Result()
						got[i] = fmt.Sprint(v, err)
					}
					if got[0] != got[1] || strings.Contains(got[0], "arithmetic") {
						t.Fatalf("ARGV %v: fast path %s, full script %s", args, got[0], got[1])
					}
				})
			}
		}
	})
}
