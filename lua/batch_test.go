package lua

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// A call decides its requests exactly as lone calls made one after another at the same
// server instant: random rounds of every op (acquires within and above the limits, with
// and without bookings, cancels of earlier grants and bookings, Inspect, pause, resume,
// override, clear, bad arguments), made as lone calls on one key and as one call on
// another, get the same replies and leave the same keys (state, control key, records),
// on every limiter script with one and two limits, and on the semaphore.
func TestBatchEqualsLoneCalls(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for i, a := range allAlgos {
			for _, two := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/two=%v", a.suffix, two), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(i), map[bool]uint64{true: 2, false: 1}[two]))
					batchVsLone(t, b, a, two, 25, rng.IntN)
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
	f.Add(uint8(0), false, []byte{3, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add(uint8(2), true, []byte{9, 200, 17, 3, 3, 3, 0, 1, 250, 6, 6, 40, 41, 42})
	f.Fuzz(func(t *testing.T, which uint8, two bool, data []byte) {
		b := redistest.NewMini(t)
		if int(which)%5 == 4 {
			semBatchVsLone(t, b, 1+len(data)/8, picker(data))
			return
		}
		batchVsLone(t, b, allAlgos[int(which)%4], two, 1+len(data)/8, picker(data))
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
// and the keys left are the same. pick(n) returns a number in [0, n).
func batchVsLone(t *testing.T, b *redistest.Backend, a algo, two bool, rounds int, pick func(n int) int) {
	t.Helper()
	tagA, tagB := tagOf(b, a.suffix+"A"), tagOf(b, a.suffix+"B")
	c := limiterCall{a: a, limits: []limit{{5, 100 * ms, 5}}}
	if two {
		c.limits = append(c.limits, limit{12, sec, 8})
	}
	m := len(c.limits)
	clk := newClock(t, b, tagA, tagB)
	var tokens, stamps []int64
	for round := range rounds {
		clk.add(t, time.Duration(pick(60)*1000+pick(1000))*time.Microsecond)
		k := 1 + pick(10)
		reqs := make([]req, k)
		var pairs []any // the overrides' rates, in the extras
		offsets := make([]int64, k)
		for i := range reqs {
			r := &reqs[i]
			switch p := pick(20); {
			case p < 9:
				r.op, r.n = opAcquire, int64(pick(7))
				r.x = []int64{0, int64(pick(300)) * ms, 1 << 40}[pick(3)]
				if pick(3) == 0 {
					r.booking = []string{"a", "b"}[pick(2)]
					r.y = int64(pick(3)) * 50 * ms
				}
			case p < 12 && len(tokens) > 0:
				r.op, r.n, r.x = opCancel, int64(1+pick(3)), tokens[pick(len(tokens))]
			case p < 13 && len(stamps) > 0:
				r.op, r.n, r.x, r.booking = opCancel, int64(1+pick(3)), stamps[pick(len(stamps))], []string{"a", "b"}[pick(2)]
			case p < 15:
				r.op, r.n = opInspect, 1
			case p < 16:
				r.op, r.x = opPause, int64(1+pick(200))*ms
			case p < 17:
				r.op = opResume
			case p < 18:
				r.op, r.n, r.x = opOverride, int64(1+pick(m)), int64(pick(3))*100*ms
				offsets[i] = int64(len(pairs))
				for range r.n {
					pairs = append(pairs, 1+pick(9), pick(9))
				}
			case p < 19:
				r.op = opClear
			default:
				r.op, r.n = opAcquire, 9 // above every limit: JTARG
			}
		}
		c.extras = pairs
		if pick(4) == 0 {
			c.record, c.recordTTL = "1 "+a.suffix+" 1 5/100ms", 1000
		} else {
			c.record, c.recordTTL = "", 0
		}
		var want []res
		for i, r := range reqs {
			if r.op == opOverride {
				r.y = c.extraIndex(1) + offsets[i]
			}
			out := c.run(t, b, tagA, r)
			want = append(want, out[0])
			if r.op == opAcquire && out[0].v[0] == 1 && out[0].v[4] != 0 {
				tokens = append(tokens, out[0].v[4])
			}
			if r.op == opAcquire && out[0].v[5] != 0 {
				stamps = append(stamps, out[0].v[5])
			}
		}
		for i := range reqs {
			if reqs[i].op == opOverride {
				reqs[i].y = c.extraIndex(k) + offsets[i]
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
				t.Fatalf("round %d, request %d of %v: batch %v, lone %v", round, i+1, reqs, g, w)
			}
		}
		sameKeys(t, b, round, tagA, tagB, ":"+a.suffix, ":pause", ":conf", ":bk:a", ":bk:b")
	}
}

// comparable returns r with what depends on its place in a call left out: the request's
// number in an error's text, where its extra starts.
func comparable(r res) string {
	if r.err != "" {
		r.err = requestNumber.ReplaceAllString(r.err, "request N:")
	} else if r.extra != nil {
		r.v[4] = 0
	}
	return r.String()
}

var requestNumber = regexp.MustCompile(`request \d+:`)

// sameKeys fails unless the keys with suffixes under tagA and tagB hold the same (and, on
// miniredis, the same TTLs).
func sameKeys(t *testing.T, b *redistest.Backend, round int, tagA, tagB string, suffixes ...string) {
	t.Helper()
	for _, s := range suffixes {
		ka, kb := snapshot(t, b.Client, tagA+s)[tagA+s], snapshot(t, b.Client, tagB+s)[tagB+s]
		if b.Real() { // the fake clock stretches TTLs
			ka, kb = ka[:strings.LastIndex(ka, " ttl ")], kb[:strings.LastIndex(kb, " ttl ")]
		}
		if ka != kb {
			t.Fatalf("round %d: %s holds %s after lone calls, %s after the batch", round, s, ka, kb)
		}
	}
}

// semBatchVsLone is batchVsLone for the semaphore: tokens a..d, places p, q and the
// tokens themselves.
func semBatchVsLone(t *testing.T, b *redistest.Backend, rounds int, pick func(n int) int) {
	t.Helper()
	tagA, tagB := tagOf(b, "semA"), tagOf(b, "semB")
	clk := newClock(t, b, tagA, tagB)
	for round := range rounds {
		clk.add(t, time.Duration(pick(400))*time.Millisecond)
		k := 1 + pick(8)
		reqs := make([]semReq, k)
		for i := range reqs {
			tok := token("abcd"[pick(4)])
			place := []string{"p", "q", tok}[pick(3)]
			switch op := pick(9); {
			case op < 4:
				reqs[i] = semReq{semAcquire, tok, place, pick(2)}
			case op < 5:
				reqs[i] = semReq{semExtend, tok, "", 0}
			case op < 7:
				reqs[i] = semReq{semRelease, tok, []string{"", place}[pick(2)], 0}
			case op < 8:
				reqs[i] = semReq{semInspect, "", "", pick(3)}
			default:
				reqs[i] = semReq{semAcquire, "bad", place, 0}
			}
		}
		var want []res
		for _, r := range reqs {
			want = append(want, semCall(t, b, tagA, 2, sec, r)[0])
		}
		got := semCall(t, b, tagB, 2, sec, reqs...)
		for i := range got {
			g, w := got[i], want[i]
			if b.Real() && g.extra != nil && w.extra != nil {
				g.extra[3] = w.extra[3]
			}
			if comparable(g) != comparable(w) {
				t.Fatalf("round %d, request %d of %v: batch %v, lone %v", round, i+1, reqs, g, w)
			}
		}
		sameKeys(t, b, round, tagA, tagB, ":sem", ":semq", ":semx")
	}
}
