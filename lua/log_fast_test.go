package lua

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// logAlgo is a log-based limiter script with the ARGV tails of one limit it is tried
// with (a short one, whose log stays within its head, and a long one, whose log grows
// past it), and the most n each allows.
type logAlgo struct {
	name   Name
	suffix string
	tails  [][]any
	rates  []int
}

var logAlgos = []logAlgo{
	{SlidingWindow, "sw", [][]any{{1, 5, 100000}, {1, 40, 1000000}}, []int{5, 40}},
	{SlidingCounter, "sc", [][]any{{1, 10000, 5, 100000}, {1, 20000, 40, 1000000}}, []int{5, 40}},
}

// The logs' fast path decides a batch of plain acquires in one loop exactly as the
// full script decides it request by request: random batches (1 to 64 acquires, n from
// 1 to the rate, max waits from none to past the next slots, now and then a single
// call), on logs short and long (past the head the fast path reads in one LRANGE,
// so that lookups go to LINDEX), with the clock moving between batches and entries
// expiring, go to the production script on one key and to the full script alone on
// another, and to the fast path alone (its fall-through made an error) on a third:
// the replies and the list and TTL left must be the same, and the fast path alone
// must decide every call, but for one whose log was made corrupt past its head.
func TestLogBatchFastPath(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for i, a := range logAlgos {
			t.Run(a.suffix, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(i), 19))
				logBatchVsFull(t, b, a, 150, false, func(n int) int { return rng.IntN(n) })
			})
		}
	})
}

// A single call is decided straight through (no helper made) when its lookups fall in
// the log's head, by the loop otherwise: TestLogBatchFastPath with mostly single
// calls, so that the straight path meets logs of every shape (entries expiring from
// the head one, two or more at a time, all of them, none; logs past the head).
func TestLogSingleFastPath(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for i, a := range logAlgos {
			t.Run(a.suffix, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(i), 23))
				logBatchVsFull(t, b, a, 400, true, func(n int) int { return rng.IntN(n) })
			})
		}
	})
}

// FuzzLogBatch is TestLogBatchFastPath on miniredis with the steps the fuzzer picks.
func FuzzLogBatch(f *testing.F) {
	f.Add(uint8(0), []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	f.Add(uint8(1), []byte{0, 3, 63, 1, 255, 3, 17, 40, 9, 9, 9, 9, 2, 1, 200, 200, 7})
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		b := redistest.NewMini(t)
		a := logAlgos[int(which)%len(logAlgos)]
		logBatchVsFull(t, b, a, 1+len(data)/8, false, picker(data))
	})
}

// errNotFast is what the fast path alone answers when it leaves a call to the full
// script.
const errNotFast = "JTNOTFAST"

// logBatchVsFull runs steps random calls, one in 6 a single call and the others
// batches, or the other way round (singles).
func logBatchVsFull(t *testing.T, b *redistest.Backend, a logAlgo, steps int, singles bool, pick func(n int) int) {
	t.Helper()
	ctx := context.Background()
	fastOnly := fast[a.name] + "\nreturn redis.error_reply('" + errNotFast + "')\n"
	srcs := []string{a.name.Source(), full[a.name], fastOnly}
	scripts := make([]*redis.Script, len(srcs))
	for i, src := range srcs {
		scripts[i] = redis.NewScript(src)
		if b.Real() {
			scripts[i] = redistest.FakeClockScript(src)
		}
	}
	var tags []string
	var keys [][]string
	for _, s := range []string{"A", "B", "C"} {
		tag := "{" + b.Prefix + "logfast" + a.suffix + s + "}"
		tags = append(tags, tag)
		keys = append(keys, []string{tag + ":" + a.suffix, tag + ":pause", tag + ":tb"})
	}
	now := redistest.Epoch
	b.SetTime(t, now, tags...)
	corrupt := false  // the log holds a value that is not a number, past its head
	restored := false // the third key's list was copied, its TTL to the millisecond
	left := 0
	defer func() { t.Logf("left to the full script: %d of %d", left, steps) }()
	for step := 0; step < steps; step++ {
		switch pick(4) {
		case 0:
			now = now.Add(time.Duration(pick(300)*1000+pick(1000)) * time.Microsecond)
		case 1:
			now = now.Add(time.Duration(pick(20)) * time.Microsecond)
		}
		b.SetTime(t, now, tags...)
		switch pick(40) {
		case 0, 3, 4: // a fresh log
			for _, k := range keys {
				b.Client.Del(ctx, k[0])
			}
			corrupt = false
		case 1: // a time or a count far in, not a number
			i := int64(9 + pick(20))
			for _, k := range keys {
				if b.Client.LLen(ctx, k[0]).Val() > i+2 {
					b.Client.LSet(ctx, k[0], i, "x")
					corrupt = true
				}
			}
		case 2: // an element too many: a list of even length
			for _, k := range keys {
				if b.Client.LLen(ctx, k[0]).Val() > 0 {
					b.Client.RPush(ctx, k[0], "1")
					corrupt = true
				}
			}
		}
		which := pick(len(a.tails))
		tail, rate := a.tails[which], a.rates[which]
		request := func() []any {
			n, x := 1, int64(0)
			if pick(3) == 0 {
				n = 1 + pick(rate)
			}
			switch pick(6) {
			case 0, 1:
				x = int64(pick(2000) * 1000)
			case 2:
				x = int64(pick(100))
			case 3:
				x = 1<<53 - 1
			}
			return []any{0, n, x}
		}
		var args []any
		k := 0
		if (pick(6) == 0) != singles {
			args = append(request(), tail...)
		} else {
			k = 1 + pick(64)
			args = []any{Batch, k}
			for range k {
				args = append(args, request()...)
			}
			args = append(args, tail...)
		}
		trace := fmt.Sprintf("step %d: ARGV %v", step, args)
		var got [3]string
		for i, s := range scripts {
			v, err := s.Run(ctx, b.Client, keys[i], args...).Result()
			if err != nil {
				got[i] = "error " + err.Error()
			} else {
				got[i] = fmt.Sprint(v)
				if k > 0 {
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
		}
		if got[0] != got[1] {
			t.Fatalf("%s:\n  fast path %s\n  full      %s", trace, got[0], got[1])
		}
		if strings.Contains(got[2], errNotFast) {
			left++
			if !corrupt {
				t.Fatalf("%s: the fast path left the call to the full script (%s)", trace, got[1])
			}
			// the fast path alone wrote nothing: give its key the full script's state
			restoreFrom(t, b, keys[1][0], keys[2][0])
			restored = true
		} else if got[2] != got[0] {
			t.Fatalf("%s:\n  fast path alone %s\n  full            %s", trace, got[2], got[1])
		}
		for i := 1; i < len(keys); i++ {
			ka, kb := keys[0][0], keys[i][0]
			if sa, sb := contents(ctx, b.Client, ka), contents(ctx, b.Client, kb); sa != sb {
				t.Fatalf("%s: %s differs: %s, %s %s", trace, ka, sa, kb, sb)
			}
			ta, tb := b.Client.PTTL(ctx, ka).Val(), b.Client.PTTL(ctx, kb).Val()
			exact := time.Duration(0)
			if i == 2 && restored {
				exact = time.Millisecond
			}
			if d := ta - tb; d > time.Second || d < -time.Second || (!b.Real() && (d > exact || d < -exact)) {
				t.Fatalf("%s: %s's TTL %v, %s's %v", trace, ka, ta, kb, tb)
			}
		}
	}
}

// restoreFrom makes the list at to a copy of the list at from, with its TTL.
func restoreFrom(t *testing.T, b *redistest.Backend, from, to string) {
	t.Helper()
	ctx := context.Background()
	b.Client.Del(ctx, to)
	if vs := b.Client.LRange(ctx, from, 0, -1).Val(); len(vs) > 0 {
		args := make([]any, len(vs))
		for i, v := range vs {
			args[i] = v
		}
		b.Client.RPush(ctx, to, args...)
		if ttl := b.Client.PTTL(ctx, from).Val(); ttl > 0 {
			b.Client.PExpire(ctx, to, ttl)
		}
	}
}
