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

// A batch decides its requests exactly as single calls made one after another at the
// same server instant: random rounds of acquires (n within and above the limit, max
// waits from 0 to past the next slots) and cancels of earlier grants, on every
// limiter script with one and two limits, run as single calls on one key and as one
// batch on another, must get the same replies (errors included) and leave the same
// state. The clock stands still within a round (miniredis's clock, or the fake clock
// on real servers) and moves between rounds.
func TestBatchEqualsSingleCalls(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for i, a := range batchAlgos {
			for _, two := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/two=%v", a.name, two), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(i), 7))
					batchVsSingles(t, b, a, two, 40, func(n int) int { return rng.IntN(n) })
				})
			}
		}
	})
}

// FuzzBatch is TestBatchEqualsSingleCalls on miniredis with the rounds, requests and
// clock steps the fuzzer picks: every batch must reply and leave the state as the
// same requests made one by one at the same instant.
func FuzzBatch(f *testing.F) {
	f.Add(uint8(0), false, []byte{3, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add(uint8(3), true, []byte{9, 200, 17, 3, 3, 3, 0, 1, 250, 6, 6})
	f.Fuzz(func(t *testing.T, which uint8, two bool, data []byte) {
		b := redistest.NewMini(t)
		a := batchAlgos[int(which)%len(batchAlgos)]
		batchVsSingles(t, b, a, two, 1+len(data)/8, picker(data))
	})
}

// picker returns a pick(n) that takes the fuzzer's bytes one by one, each modulo n,
// and 0 when they run out.
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

// batchAlgo is a limiter script with the ARGV tail of one or two limits.
type batchAlgo struct {
	name, suffix string
	src          string
	tail         func(two bool) []any
}

func ratePairs(two bool) []any {
	if two {
		return []any{2, 5, 100000, 12, 1000000}
	}
	return []any{1, 5, 100000}
}

var batchAlgos = []batchAlgo{
	{"slidingwindow", "sw", SlidingWindow.Source(), ratePairs},
	{"fixedwindow", "fw", FixedWindow.Source(), ratePairs},
	{"slidingcounter", "sc", SlidingCounter.Source(), func(two bool) []any {
		return append([]any{ratePairs(two)[0], 10000}, ratePairs(two)[1:]...)
	}},
	{"gcra", "tb", GCRA.Source(), func(two bool) []any {
		if two {
			return []any{2, 5, 100000, 5, 12, 1000000, 8}
		}
		return []any{1, 5, 100000, 5}
	}},
}

// batchVsSingles runs rounds of requests (acquires with n within and above the limit
// and max waits from 0 past the next slots, cancels of earlier grants), each round as
// single calls on one key and as one batch on another, at one instant per round
// (miniredis's clock, or the fake clock on real servers), and fails unless the
// replies (errors by their code) and the state left are the same. pick(n) returns a
// number in [0, n).
func batchVsSingles(t *testing.T, b *redistest.Backend, a batchAlgo, two bool, rounds int, pick func(n int) int) {
	t.Helper()
	ctx := context.Background()
	s := redis.NewScript(a.src)
	if b.Real() {
		s = redistest.FakeClockScript(a.src)
	}
	tagA, tagB := "{"+b.Prefix+a.name+"A}", "{"+b.Prefix+a.name+"B}"
	keysA := []string{tagA + ":" + a.suffix, tagA + ":pause"}
	keysB := []string{tagB + ":" + a.suffix, tagB + ":pause"}
	tail := a.tail(two)
	now := redistest.Epoch
	var tokens []int64
	for round := 0; round < rounds; round++ {
		now = now.Add(time.Duration(pick(60)*1000+pick(1000)) * time.Microsecond)
		b.SetTime(t, now, tagA, tagB)
		k := 1 + pick(12)
		batch := []any{Batch, k}
		var singles [][]any
		for range k {
			op, n, x := 0, pick(7), int64(0)
			switch r := pick(10); {
			case r < 2 && len(tokens) > 0:
				op, n, x = 1, 1+pick(2), tokens[pick(len(tokens))]
			case r < 6:
				x = int64(pick(300) * 1000)
			}
			batch = append(batch, op, n, x)
			singles = append(singles, append([]any{op, n, x}, tail...))
		}
		batch = append(batch, tail...)
		var want []any
		for _, args := range singles {
			v, err := s.Run(ctx, b.Client, keysA, args...).Result()
			if err != nil {
				want = append(want, err.Error())
				continue
			}
			want = append(want, v)
			if r := v.([]any); args[0] == 0 && r[0] == int64(1) && r[4] != int64(0) {
				tokens = append(tokens, r[4].(int64))
			}
		}
		v, err := s.Run(ctx, b.Client, keysB, batch...).Result()
		if err != nil {
			t.Fatalf("round %d: batch %v: %v", round, batch, err)
		}
		got, err := splitBatch(v, k)
		if err != nil {
			t.Fatalf("round %d: batch %v: %v", round, batch, err)
		}
		if len(got) != len(want) {
			t.Fatalf("round %d: %d replies, want %d", round, len(got), len(want))
		}
		for i := range got {
			if g, ok := got[i].(string); ok { // an error: the same code
				w, _ := want[i].(string)
				if errCode(g) != errCode(w) || errCode(g) == "" {
					t.Fatalf("round %d request %d %v: batch says %q, single call %v", round, i, singles[i][:3], g, want[i])
				}
				continue
			}
			if !reflect.DeepEqual(got[i], want[i]) {
				t.Fatalf("round %d request %d %v: batch %v, single call %v", round, i, singles[i][:3], got[i], want[i])
			}
		}
		sa := b.Client.Dump(ctx, keysA[0]).Val()
		sb := b.Client.Dump(ctx, keysB[0]).Val()
		if sa != sb {
			t.Fatalf("round %d: state differs after the batch", round)
		}
	}
}

// splitBatch reads a batch's flat reply (see batch.lua) of k requests into one element
// per request, as a single call's reply reads: five integers ([]any of int64), or the
// text of its error (string).
func splitBatch(v any, k int) ([]any, error) {
	flat, ok := v.([]any)
	if !ok || len(flat) < 5*k {
		return nil, fmt.Errorf("batch reply %v: want at least %d integers", v, 5*k)
	}
	out := make([]any, k)
	for r := range k {
		five := flat[5*r : 5*r+5]
		if five[0] != int64(-1) {
			out[r] = five
			continue
		}
		at, _ := five[1].(int64)
		n, _ := five[2].(int64)
		if at < int64(5*k+1) || n < 0 || int(at-1+n) > len(flat) {
			return nil, fmt.Errorf("batch reply %v: request %d's error text at %d, %d bytes", v, r, at, n)
		}
		text := make([]byte, n)
		for i := range text {
			b, _ := flat[int(at)-1+i].(int64)
			text[i] = byte(b)
		}
		out[r] = string(text)
	}
	return out, nil
}

// errCode returns the JT error code (or WRONGTYPE) in a script error's text.
func errCode(msg string) string {
	for _, c := range []string{"JTARG", "JTEXCEEDS", "JTALG", "JTSTATE", "WRONGTYPE"} {
		if strings.Contains(msg, c) {
			return c
		}
	}
	return ""
}

// A batch's own arguments are checked: a bad count is JTARG and writes nothing; a
// booking op (2, 3) in a batch is that request's JTARG (it has no booking key).
func TestBatchArguments(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tag := "{" + b.Prefix + "k}"
		keys := []string{tag + ":sw", tag + ":pause"}
		for _, args := range [][]any{
			{Batch, 0, 1, 5, 1000000},
			{Batch, "x", 0, 1, 0, 1, 5, 1000000},
			{Batch, 3, 0, 1, 0, 1, 5, 1000000},
			{Batch, 1001, 0, 1, 0, 1, 5, 1000000},
		} {
			err := SlidingWindow.Script().Run(ctx, b.Client, keys, args...).Err()
			if err == nil || !strings.Contains(err.Error(), "JTARG") {
				t.Fatalf("%v: %v, want JTARG", args, err)
			}
			if n := b.Client.Exists(ctx, keys...).Val(); n != 0 {
				t.Fatalf("%v: %d keys written", args, n)
			}
		}
		v, err := SlidingWindow.Script().Run(ctx, b.Client, keys, Batch, 2, 2, 1, 0, 0, 1, 0, 1, 5, 1000000).Result()
		if err != nil {
			t.Fatal(err)
		}
		r, err := splitBatch(v, 2)
		if err != nil {
			t.Fatal(err)
		}
		if msg, ok := r[0].(string); !ok || !strings.Contains(msg, "JTARG") {
			t.Fatalf("op 2 in a batch: %v, want a JTARG text", r[0])
		}
		if g, ok := r[1].([]any); !ok || g[0] != int64(1) {
			t.Fatalf("the acquire after it: %v, want granted", r[1])
		}
	})
}

// A batch whose grant merges into the log's last entry, when the head the script read
// holds that entry (a list of exactly 4 entries), sees the merged count in later
// requests: a request after it whose permit is that entry's must wait for that entry,
// not for the next one (the full script kept the count it had read in its head).
func TestBatchMergeIntoTheHeadsLastEntry(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		now := redistest.Epoch
		us := func(d time.Duration) string { return fmt.Sprint(now.Add(d).UnixMicro()) }
		// rate 5 per 100ms; 3 permits in the window, a fourth booked 10ms ahead
		log := []any{"0", us(-50 * time.Millisecond), "1", us(-40 * time.Millisecond), "2",
			us(-30 * time.Millisecond), "3", us(10 * time.Millisecond), "4"}
		reqs := [][]any{{0, 1, 1000000}, {0, 1, 1000000}, {0, 4, 1000000}}
		tail := []any{1, 5, 100000}
		for name, src := range map[string]string{"full": full[SlidingWindow], "production": SlidingWindow.Source()} {
			t.Run(name, func(t *testing.T) {
				s := redis.NewScript(src)
				if b.Real() {
					s = redistest.FakeClockScript(src)
				}
				tagA, tagB := "{"+b.Prefix+name+"mergeA}", "{"+b.Prefix+name+"mergeB}"
				keysA, keysB := []string{tagA + ":sw", tagA + ":pause"}, []string{tagB + ":sw", tagB + ":pause"}
				b.SetTime(t, now, tagA, tagB)
				for _, k := range []string{keysA[0], keysB[0]} {
					if err := b.Client.RPush(ctx, k, log...).Err(); err != nil {
						t.Fatal(err)
					}
				}
				var want []any
				batch := []any{Batch, len(reqs)}
				for _, r := range reqs {
					v, err := s.Run(ctx, b.Client, keysA, append(append([]any{}, r...), tail...)...).Result()
					if err != nil {
						t.Fatal(err)
					}
					want = append(want, v)
					batch = append(batch, r...)
				}
				v, err := s.Run(ctx, b.Client, keysB, append(batch, tail...)...).Result()
				if err != nil {
					t.Fatal(err)
				}
				got, err := splitBatch(v, len(reqs))
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("batch %v, single calls %v", got, want)
				}
				if w := int64(110000); want[2].([]any)[2] != w {
					t.Fatalf("the third request waits %v, want %dµs (the 4th entry's permit leaves)", want[2].([]any)[2], w)
				}
			})
		}
	})
}
