package throttle

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// The seed corpus of the fuzz targets, in readable form. Each seed is the file
// testdata/fuzz/<target>/<name> holds: a scenario worth starting from, or a bug the
// fuzzers found (named after it). TestFuzzSeeds checks the files say what is written
// here; to rewrite them after a change:
//
//	JOBTHROTTLE_WRITE_SEEDS=1 go test -run TestFuzzSeeds ./throttle

type fuzzSeed struct {
	name   string
	target string
	values []any // the fuzz function's arguments after t
}

// raw encodes v as the decoders' escape to a raw 64-bit value.
func fzRaw(v int64) []byte {
	return binary.BigEndian.AppendUint64([]byte{rawFrom}, uint64(v))
}

func fzCat(parts ...[]byte) []byte { return slices.Concat(parts...) }

// limCfg encodes a limiter configuration: limits (1, 2, 3, 16 or 17 of them), buckets
// and foreign content (an index in prestates; longKey repeats the key to the longest a
// key may be, with no foreign content).
func fzLimCfg(limits []Limit, buckets, prestate int, longKey bool) []byte {
	m := map[int]byte{1: 0, 2: 150, 3: 210, 16: 240, 17: 252}[len(limits)]
	flags := byte(prestate)
	if longKey {
		flags = 254
	}
	out := []byte{m}
	out = append(out, fzRaw(int64(buckets))...)
	out = append(out, flags)
	for _, l := range limits {
		out = fzCat(out, fzRaw(int64(l.Rate)), fzRaw(int64(l.Period)), fzRaw(int64(l.Burst)))
	}
	return out
}

// fzTooLongKeyCfg is fzLimCfg with the key repeated to a byte more than a key may be.
func fzTooLongKeyCfg(limits []Limit) []byte {
	c := fzLimCfg(limits, 4, 0, true)
	c[10] = 255 // the flags byte, after m and the buckets
	return c
}

// Limiter program steps (see fuzzRun.step).
func fzAt(d time.Duration) []byte { return fzCat([]byte{0}, fzRaw(int64(d/time.Microsecond))) }
func fzAllow(n int) []byte        { return fzCat([]byte{3}, fzRaw(int64(n))) }
func fzRead() []byte              { return []byte{8} }
func fzReserve(n int, maxWait time.Duration) []byte {
	return fzCat([]byte{5}, fzRaw(int64(n)), fzRaw(int64(maxWait)))
}
func fzCancel(j int) []byte      { return []byte{7, 0, byte(j)} }
func fzCancelPlus1(j int) []byte { return []byte{7, 3, byte(j), 0} }
func fzCancelN(j, n int) []byte  { return fzCat([]byte{7, 4, byte(j)}, fzRaw(int64(n))) }
func fzCancelRaw(n int, token int64) []byte {
	return fzCat([]byte{7, 5, 0}, fzRaw(int64(n)), fzRaw(token))
}
func fzPause(d time.Duration) []byte { return fzCat([]byte{9}, fzRaw(int64(d/time.Microsecond))) }
func fzEvict() []byte                { return []byte{10, 0} }
func fzCorrupt(junk int) []byte      { return []byte{10, 3, byte(3 * junk)} }
func fzClear() []byte                { return []byte{13} }
func fzResume() []byte               { return []byte{14} }
func fzInspect() []byte              { return []byte{15} }

// fzOverride overrides the first len(limits) limits' rates and bursts for d; a limit
// with a Period set gets a period other than its limit's (refused). fzOverrideCount
// asks for cnt limits (0, or one more than the limiter has, are refused), each 1 per
// period.
func fzOverride(d time.Duration, limits ...Limit) []byte {
	out := []byte{12, byte(len(limits))}
	for _, l := range limits {
		bad := byte(0)
		if l.Period != 0 {
			bad = 7
		}
		out = fzCat(out, fzRaw(int64(l.Rate)), fzRaw(int64(l.Burst)), []byte{bad})
	}
	return fzCat(out, fzRaw(int64(d)))
}
func fzOverrideCount(cnt int, d time.Duration) []byte {
	limits := make([]Limit, cnt)
	for i := range limits {
		limits[i] = Limit{Rate: 1}
	}
	return fzOverride(d, limits...)
}

func fzProg(steps ...[]byte) []byte { return fzCat(steps...) }

// t0us is a token (µs) at t0 + d.
func fzT0(d time.Duration) int64 { return redistestEpochUS + int64(d/time.Microsecond) }

var redistestEpochUS = redistest.Epoch.UnixMicro()

// every repeats steps n times.
func fzEvery(n int, steps ...[]byte) []byte {
	var out []byte
	for i := 0; i < n; i++ {
		out = append(out, fzCat(steps...)...)
	}
	return out
}

func fzLimSeed(target, name string, cfg []byte, key, junk string, ops []byte) fuzzSeed {
	return fuzzSeed{name, target, []any{cfg, key, junk, ops}}
}

// Semaphore configurations and steps (see semRun.semStep).
func fzSemCfg(prestate int, variants ...[2]int64) []byte { // {max, ttl µs}
	out := []byte{byte(len(variants) - 1), byte(prestate)}
	for _, v := range variants {
		out = fzCat(out, fzRaw(v[0]), fzRaw(v[1]*int64(time.Microsecond)))
	}
	return out
}

const (
	semAcq  = 0
	semExt  = 2
	semRel  = 3
	idBad   = 5 // fuzzTokens[5]: upper-case hex
	idShort = 6
)

// fzSemLongCfg repeats the key to the longest a key may be (over: a byte more).
func fzSemLongCfg(over bool, variants ...[2]int64) []byte {
	c := fzSemCfg(0, variants...)
	c[1] = 254
	if over {
		c[1] = 255
	}
	return c
}

func fzSemAt(d time.Duration) []byte { return fzCat([]byte{0}, fzRaw(int64(d/time.Microsecond))) }

// fzSemCall is a call with token fuzzTokens[token] in its own place (as Acquire calls);
// fzSemCallAt one in place fuzzPlaces[place] (a task's, or a bad one).
func fzSemCall(variant, token, op int, join bool) []byte {
	return []byte{2, byte(variant), byte(token), byte(op), fzBool(join)}
}
func fzSemCallAt(variant, token, op, place int, join bool) []byte {
	return []byte{2, byte(variant), byte(token), byte(op + 4*(place+1)), fzBool(join)}
}
func fzBool(b bool) byte {
	if b {
		return 1
	}
	return 0
}
func fzSemPause(d time.Duration) []byte { return fzCat([]byte{7}, fzRaw(int64(d/time.Microsecond))) }
func fzSemDelete(k int) []byte          { return []byte{8, byte(k)} }
func fzSemJunk(k, junk int) []byte      { return []byte{8, byte(3 + k), byte(junk)} }
func fzSemResume() []byte               { return []byte{9} }
func fzSemInspect(variant int) []byte   { return []byte{10, byte(variant)} }

func fuzzSeeds() []fuzzSeed {
	const (
		ms = time.Millisecond
		s  = time.Second
	)
	var seeds []fuzzSeed
	for _, alg := range allAlgorithms {
		target := "Fuzz" + alg.String()
		add := func(name string, cfg []byte, key, junk string, ops []byte) {
			seeds = append(seeds, fzLimSeed(target, name, cfg, key, junk, ops))
		}
		one := func(rate int, period time.Duration) []byte {
			return fzLimCfg([]Limit{{Rate: rate, Period: period}}, 4, 0, false)
		}
		add("five-per-second-saturated", one(5, s), "tenant", "",
			fzProg(fzEvery(4, fzAllow(2), fzAt(90*ms)), fzRead(), fzAt(s), fzAllow(5), fzAllow(1), fzAt(200*ms), fzAllow(1)))
		add("two-limits-3-per-200ms-10-per-second", fzLimCfg([]Limit{{Rate: 3, Period: 200 * ms}, {Rate: 10, Period: s}}, 4, 0, false),
			"api", "", fzProg(fzEvery(6, fzAllow(2), fzAt(70*ms)), fzRead(), fzReserve(3, s), fzAt(150*ms), fzAllow(1), fzRead()))
		add("book-ahead-then-cancel", one(2, s), "mail", "",
			fzProg(fzAllow(2), fzReserve(1, time.Hour), fzReserve(2, time.Hour), fzRead(), fzCancel(0), fzRead(),
				fzReserve(1, time.Hour), fzAt(500*ms), fzCancel(1), fzAt(600*ms), fzAllow(1), fzRead()))
		add("cancel-after-effect-is-noop", one(1, 100*ms), "k", "",
			fzProg(fzAllow(1), fzReserve(1, s), fzAt(150*ms), fzCancel(0), fzAllow(1), fzRead()))
		add("confused-cancels", one(3, s), "k", "",
			fzProg(fzAllow(3), fzReserve(2, time.Hour), fzCancelPlus1(0), fzCancelN(0, 4), fzCancelN(0, 0),
				fzCancelRaw(1, fzT0(2*s)), fzCancelRaw(1, 1<<53), fzCancelRaw(-1, fzT0(s)), fzCancelRaw(1, -5), fzRead()))
		add("pause-then-book-after-it", one(4, s), "k", "",
			fzProg(fzAllow(1), fzPause(2*s), fzRead(), fzAllow(1), fzReserve(2, 5*s), fzPause(s), fzPause(0), fzPause(-1),
				fzAt(2*s), fzAllow(1), fzRead()))
		add("state-evicted-mid-use", one(3, s), "k", "",
			fzProg(fzAllow(1), fzAt(100*ms), fzAllow(1), fzEvict(), fzAllow(1), fzAt(100*ms), fzAllow(1), fzRead(), fzAllow(1)))
		add("bad-n-and-max-wait", one(5, s), "k", "",
			fzProg(fzAllow(-1), fzAllow(6), fzAllow(1<<40), fzReserve(1, -1), fzReserve(6, s), fzReserve(0, s), fzAllow(0), fzRead()))
		add("rate-1e9-per-microsecond", one(maxRate, time.Microsecond), "k", "",
			fzProg(fzAllow(maxRate), fzAllow(1), fzReserve(maxRate, math.MaxInt64), fzAt(time.Microsecond), fzAllow(maxRate/2), fzRead()))
		add("one-per-2^45us", one(1, maxPeriodUS*time.Microsecond), "k", "",
			fzProg(fzAllow(1), fzAllow(1), fzReserve(1, math.MaxInt64), fzRead(), fzAt(time.Hour), fzAllow(1)))
		lim16 := make([]Limit, 16)
		for i := range lim16 {
			lim16[i] = Limit{Rate: 2 + i, Period: time.Duration(i+1) * 100 * ms}
		}
		add("sixteen-limits", fzLimCfg(lim16, 4, 0, false), "k", "",
			fzProg(fzEvery(8, fzAllow(2), fzAt(40*ms)), fzReserve(2, time.Hour), fzRead()))
		add("seventeen-limits-refused", fzLimCfg(append(slices.Clone(lim16), PerSecond(1)), 4, 0, false), "k", "", fzProg(fzAllow(1)))
		add("limits-out-of-range-refused", fzLimCfg([]Limit{{Rate: 0, Period: s}}, 4, 0, false), "k", "", fzProg(fzAllow(1)))
		add("period-above-2^45us-refused", one(1, (maxPeriodUS+1)*time.Microsecond), "k", "", fzProg(fzAllow(1)))
		add("period-near-largest-duration-refused", one(1, math.MaxInt64), "k", "", fzProg(fzAllow(1)))
		add("empty-key-refused", one(1, s), "", "", fzProg(fzAllow(1)))
		add("key-with-braces", one(2, s), "a}{b}c{", "", fzProg(fzAllow(1), fzReserve(2, time.Hour), fzCancel(0), fzRead()))
		add("binary-key", one(2, s), "\x00\xff{\r\n}\x7f", "", fzProg(fzAllow(2), fzRead(), fzAt(s), fzAllow(1)))
		add("longest-key", fzLimCfg([]Limit{PerSecond(2)}, 4, 0, true), "x{}", "", fzProg(fzAllow(2), fzRead(), fzAt(s), fzAllow(1), fzInspect()))
		add("key-a-byte-too-long-refused", fzTooLongKeyCfg([]Limit{PerSecond(2)}), "x{}", "", fzProg(fzAllow(2)))
		add("hash-in-state-key", fzLimCfg([]Limit{PerSecond(2)}, 4, 1, false), "k", "v", fzProg(fzAllow(1), fzRead(), fzReserve(1, s)))
		add("junk-list-in-state-key", fzLimCfg([]Limit{PerSecond(2)}, 4, 5, false), "k", "0 x 1", fzProg(fzAllow(1), fzRead()))
		add("well-formed-foreign-list", fzLimCfg([]Limit{PerSecond(2)}, 4, 5, false), "k", "0 1767323045000000 1", fzProg(fzAllow(1), fzRead()))
		add("junk-string-in-state-key", fzLimCfg([]Limit{PerSecond(2)}, 4, 4, false), "k", "1 2 3 x", fzProg(fzAllow(1), fzRead()))
		add("junk-in-pause-key", fzLimCfg([]Limit{PerSecond(2)}, 4, 6, false), "k", "not a time", fzProg(fzAllow(1), fzPause(s), fzRead()))
		add("hash-in-pause-key", fzLimCfg([]Limit{PerSecond(2)}, 4, 7, false), "k", "v", fzProg(fzAllow(1), fzPause(s), fzRead()))
		add("state-corrupted-mid-use", one(40, 400*ms), "k", "",
			fzProg(fzEvery(12, fzAllow(1), fzAt(ms)), fzCorrupt(0), fzAllow(1), fzRead(), fzCorrupt(4), fzAllow(1), fzRead()))
		// a log longer than the head a call reads at once (lua/log.lua's LOG_HEAD)
		add("long-log", one(40, 400*ms), "k", "",
			fzProg(fzEvery(30, fzAllow(1), fzAt(3*ms)), fzReserve(5, s), fzAt(250*ms), fzAllow(2), fzRead(), fzAt(100*ms), fzAllow(3), fzRead()))
		add("another-algorithms-state-on-the-key", fzLimCfg([]Limit{PerSecond(2)}, 4, 10, false), "k", "x",
			fzProg(fzRead(), fzAllow(1), fzReserve(1, s), fzInspect(), fzOverride(s, Limit{Rate: 4}), fzPause(s), fzResume(), fzCancelRaw(1, fzT0(s))))
		add("pause-resume-then-book", one(2, s), "k", "",
			fzProg(fzAllow(2), fzPause(3*s), fzInspect(), fzReserve(1, 5*s), fzResume(), fzInspect(), fzReserve(1, 5*s), fzAllow(1), fzInspect(),
				fzAt(s), fzAllow(1), fzInspect()))
		add("override-raises-then-lowers-the-rate", fzLimCfg([]Limit{{Rate: 4, Period: s}, {Rate: 10, Period: 10 * s}}, 4, 0, false), "k", "",
			fzProg(fzAllow(4), fzOverride(s, Limit{Rate: 8}), fzAllow(3), fzInspect(), fzOverride(0, Limit{Rate: 1}, Limit{Rate: 2}),
				fzAllow(1), fzAllow(4), fzReserve(2, time.Hour), fzInspect(), fzAt(500*ms), fzClear(), fzAllow(1), fzInspect()))
		add("override-ends-by-itself", one(3, s), "k", "",
			fzProg(fzOverride(200*ms, Limit{Rate: 1, Burst: 1}), fzAllow(1), fzAllow(1), fzReserve(1, s), fzInspect(),
				fzAt(200*ms), fzInspect(), fzAllow(2), fzAt(s), fzInspect()))
		add("overrides-refused", fzLimCfg([]Limit{PerSecond(3), PerMinute(10)}, 4, 0, false), "k", "",
			fzProg(fzOverrideCount(0, s), fzOverrideCount(3, s), fzOverride(-1, Limit{Rate: 1}), fzOverride(s, Limit{Rate: 0}),
				fzOverride(s, Limit{Rate: 2, Period: s}), fzOverride(s, Limit{Rate: maxRate + 1}), fzOverride(s, Limit{Rate: 1, Burst: -1}),
				fzAllow(3), fzInspect()))
		add("cancel-of-zero-permits-frees-nothing", fzLimCfg([]Limit{{Rate: 2, Period: 1, Burst: 5}}, 3, 0, false), "0", "",
			fzProg(fzPause(time.Microsecond), fzReserve(1, time.Hour), fzCancelN(0, 0)))
		add("cancel-more-than-booked", fzLimCfg([]Limit{{Rate: 3, Period: s}}, 3, 0, false), "0", "",
			fzProg(fzAllow(3), fzReserve(1, time.Hour), fzCancelN(0, 3), fzReserve(1, time.Hour), fzInspect()))
		switch alg {
		case TokenBucket:
			add("seed-10-per-minute-burst-10", fzLimCfg([]Limit{{Rate: 10, Period: time.Minute, Burst: 10}}, 4, 0, false), "k", "",
				fzProg(fzAllow(5), fzAllow(5), fzAllow(5), fzAt(30*s), fzAllow(5)))
			add("burst-times-period-above-2^63-refused", fzLimCfg([]Limit{{Rate: 16, Period: 24 * time.Hour, Burst: maxRate}}, 4, 0, false),
				"k", "", fzProg(fzAllow(1)))
			// one permit per 35184µs, bookings at most 2^50/rate = 1125899µs ahead
			add("booking-capped-at-2^50-over-rate", fzLimCfg([]Limit{{Rate: maxRate, Period: maxPeriodUS * time.Microsecond, Burst: 1}}, 4, 0, false),
				"k", "", fzProg(fzAllow(1), fzEvery(40, fzReserve(1, time.Hour)), fzRead()))
			add("burst-above-rate", fzLimCfg([]Limit{{Rate: 3, Period: s, Burst: 7}}, 4, 0, false), "k", "",
				fzProg(fzAllow(7), fzReserve(3, s), fzCancel(0), fzAt(400*ms), fzAllow(1), fzRead()))
			// x/time/rate's CancelAt gives back n less the tokens booked after the
			// booking (by the latest booking's time): here the latest booking (C) lies
			// before the one cancelled (B), which gets back more than its n
			bucket := fzLimCfg([]Limit{{Rate: 1, Period: s, Burst: 5}}, 4, 0, false)
			add("cancel-after-a-booking-made-earlier", bucket, "k", "",
				fzProg(fzAllow(5), fzReserve(3, time.Hour), fzReserve(1, time.Hour), fzCancel(0), fzReserve(1, time.Hour), fzCancel(0),
					fzInspect(), fzAllow(1), fzAt(2*s), fzInspect()))
			add("cancel-latest-moves-it-back", bucket, "k", "",
				fzProg(fzAllow(5), fzReserve(2, time.Hour), fzReserve(3, time.Hour), fzCancel(1), fzCancel(0), fzInspect(), fzAllow(5)))
			// SetLimitAt and SetBurstAt keep the tokens; a lower burst cuts them
			add("override-keeps-the-tokens", bucket, "k", "",
				fzProg(fzAllow(4), fzOverride(s, Limit{Rate: 10, Burst: 20}), fzAt(500*ms), fzInspect(), fzAllow(5), fzOverride(s, Limit{Rate: 2, Burst: 2}),
					fzInspect(), fzAt(300*ms), fzAllow(1), fzClear(), fzInspect(), fzReserve(5, time.Hour), fzInspect()))
			add("override-with-bookings-ahead", bucket, "k", "",
				fzProg(fzAllow(5), fzReserve(2, time.Hour), fzOverride(0, Limit{Rate: 4}), fzReserve(2, time.Hour), fzInspect(),
					fzCancel(0), fzCancel(0), fzAt(250*ms), fzClear(), fzReserve(1, time.Hour), fzInspect()))
			add("burst-raised-on-an-absent-key", bucket, "k", "",
				fzProg(fzOverride(s, Limit{Rate: 5, Burst: 50}), fzInspect(), fzAllow(20), fzAt(s), fzInspect(), fzAllow(5), fzAt(2*s), fzInspect()))
			// the state outlives an override that refills faster than the callers' rate
			add("state-kept-past-a-faster-override", bucket, "k", "",
				fzProg(fzOverride(s, Limit{Rate: 2, Burst: 5}), fzAllow(5), fzAt(1500*ms), fzRead(), fzAt(1500*ms), fzRead(), fzInspect(), fzAllow(4)))
			add("burst-lowered-then-restored", bucket, "k", "",
				fzProg(fzOverride(s, Limit{Rate: 2}), fzAllow(2), fzInspect(), fzAt(1500*ms), fzRead(), fzAt(3*s), fzRead(), fzInspect(), fzAllow(5)))
			add("state-evicted-under-an-override", fzLimCfg([]Limit{PerSecond(5)}, 4, 0, false), "k", "",
				fzProg(fzAllow(1), fzOverride(0, Limit{Rate: 16, Burst: 1}), fzEvict(), fzRead(), fzInspect(), fzCancelRaw(1, 0), fzClear(), fzAllow(5)))
			add("paused-booking-spends-the-cut-refill", bucket, "k", "",
				fzProg(fzAllow(2), fzPause(10*s), fzReserve(5, time.Hour), fzInspect(), fzAt(10*s), fzAllow(1), fzInspect()))
		case SlidingCounter:
			add("one-bucket", fzLimCfg([]Limit{PerSecond(3)}, 1, 0, false), "k", "", fzProg(fzEvery(5, fzAllow(1), fzAt(300*ms)), fzRead()))
			add("ten-thousand-buckets", fzLimCfg([]Limit{PerSecond(3)}, 10000, 0, false), "k", "", fzProg(fzEvery(5, fzAllow(1), fzAt(300*ms)), fzRead()))
			add("buckets-out-of-range-refused", fzLimCfg([]Limit{PerSecond(3)}, 10001, 0, false), "k", "", fzProg(fzAllow(1)))
		case FixedWindow:
			add("double-rate-at-window-edge", one(3, s), "k", "",
				fzProg(fzAt(990*ms), fzAllow(3), fzAt(10*ms), fzAllow(3), fzRead()))
			add("cancel-in-latest-window-only", fzLimCfg([]Limit{{Rate: 2, Period: s}, {Rate: 3, Period: 10 * s}}, 4, 0, false), "k", "",
				fzProg(fzAllow(2), fzReserve(1, time.Hour), fzCancel(0), fzAllow(1), fzReserve(1, time.Hour), fzRead()))
		}
	}
	// a regression: a 20-digit number in the log reads as 1e20 on Redis's Lua, not as
	// foreign state (miniredis refused it); log.lua now refuses numbers over 17 digits
	seeds = append(seeds, fzLimSeed("FuzzSlidingCounter", "corrupt-log-with-20-digit-number",
		fzLimCfg([]Limit{Every(time.Microsecond)}, 1, 0, false), "00", "",
		fzProg(fzAt(time.Microsecond), fzRead(), fzReserve(1, math.MaxInt64), fzCorrupt(4), fzRead())))

	sem := func(name string, cfg []byte, key, junk string, ops []byte) {
		seeds = append(seeds, fuzzSeed{name, "FuzzSemaphore", []any{cfg, key, junk, ops}})
	}
	sec := int64(time.Second / time.Microsecond)
	sem("two-slots-queue-and-handoff", fzSemCfg(0, [2]int64{2, sec}), "reports", "",
		fzProg(fzSemCall(0, 0, semAcq, false), fzSemCall(0, 1, semAcq, false), fzSemCall(0, 2, semAcq, true),
			fzSemCall(0, 3, semAcq, true), fzSemCall(0, 0, semRel, false), fzSemCall(0, 2, semAcq, true),
			fzSemAt(300*time.Millisecond), fzSemCall(0, 1, semExt, false), fzSemAt(800*time.Millisecond),
			fzSemCall(0, 3, semAcq, true), fzSemCall(0, 2, semRel, false), fzSemCall(0, 3, semRel, false)))
	sem("leaked-lease-frees-its-slot-after-ttl", fzSemCfg(0, [2]int64{1, 100_000}), "k", "",
		fzProg(fzSemCall(0, 0, semAcq, false), fzSemCall(0, 1, semAcq, false), fzSemAt(99_999*time.Microsecond),
			fzSemCall(0, 1, semAcq, false), fzSemAt(time.Microsecond), fzSemCall(0, 1, semAcq, false), fzSemCall(0, 0, semExt, false)))
	sem("place-lapses-unrenewed", fzSemCfg(0, [2]int64{1, 1000}), "k", "",
		fzProg(fzSemCall(0, 0, semAcq, false), fzSemCall(0, 1, semAcq, true), fzSemAt(500*time.Microsecond),
			fzSemCall(0, 0, semExt, false), fzSemAt(700*time.Microsecond), fzSemCall(0, 0, semRel, false), fzSemCall(0, 2, semAcq, false)))
	sem("different-max-and-ttl-on-one-key", fzSemCfg(0, [2]int64{1, sec}, [2]int64{3, 2 * sec}, [2]int64{maxRate, maxPeriodUS}), "k", "",
		fzProg(fzSemCall(0, 0, semAcq, true), fzSemCall(1, 1, semAcq, true), fzSemCall(0, 2, semAcq, true),
			fzSemCall(2, 3, semAcq, false), fzSemCall(1, 0, semRel, false), fzSemAt(time.Second), fzSemCall(0, 2, semAcq, true)))
	sem("paused-then-resumed", fzSemCfg(0, [2]int64{2, sec}), "k", "",
		fzProg(fzSemCall(0, 0, semAcq, false), fzSemPause(500*time.Millisecond), fzSemCall(0, 1, semAcq, true),
			fzSemCall(0, 0, semExt, false), fzSemAt(500*time.Millisecond), fzSemCall(0, 1, semAcq, true), fzSemPause(0)))
	sem("bad-ids-refused", fzSemCfg(0, [2]int64{2, sec}), "k", "",
		fzProg(fzSemCall(0, idBad, semAcq, false), fzSemCall(0, idShort, semRel, false), fzSemCall(0, 4, semExt, false),
			fzSemCall(0, 7, semAcq, true), fzSemCall(0, 8, semAcq, true), fzSemCall(0, 9, semAcq, true)))
	sem("keys-deleted-mid-use", fzSemCfg(0, [2]int64{1, sec}), "k", "",
		fzProg(fzSemCall(0, 0, semAcq, false), fzSemCall(0, 1, semAcq, true), fzSemDelete(2), fzSemCall(0, 1, semAcq, true),
			fzSemDelete(1), fzSemCall(0, 0, semRel, false), fzSemDelete(0), fzSemCall(0, 2, semAcq, false)))
	sem("junk-place-in-queue-mid-use", fzSemCfg(0, [2]int64{1, sec}), "k", "",
		fzProg(fzSemCall(0, 0, semAcq, false), fzSemJunk(1, 2), fzSemAt(time.Second), fzSemCall(0, 1, semAcq, false)))
	sem("junk-place-after-a-lease-expired", fzSemCfg(0, [2]int64{2, sec}), "k", "",
		fzProg(fzSemCall(0, 0, semAcq, false), fzSemAt(500*time.Millisecond), fzSemCall(0, 1, semAcq, false), fzSemJunk(1, 2),
			fzSemAt(600*time.Millisecond), fzSemCall(0, 2, semAcq, false), fzSemCall(0, 1, semRel, false)))
	sem("foreign-member-in-the-lease-set", fzSemCfg(0, [2]int64{3, sec}), "k", "",
		fzProg(fzSemCall(0, 0, semAcq, false), fzSemAt(500*time.Millisecond), fzSemJunk(0, 10),
			fzSemAt(600*time.Millisecond), fzSemCall(0, 1, semAcq, false), fzSemCall(0, 1, semExt, false), fzSemCall(0, 1, semRel, false)))
	sem("max-and-ttl-out-of-range-refused", fzSemCfg(0, [2]int64{0, sec}, [2]int64{1, 999}, [2]int64{maxRate + 1, maxPeriodUS + 1}), "k", "",
		fzProg(fzSemCall(0, 0, semAcq, false)))
	sem("hash-in-lease-key", fzSemCfg(1, [2]int64{1, sec}), "k", "v", fzProg(fzSemCall(0, 0, semAcq, true)))
	sem("junk-members-in-queue", fzSemCfg(4, [2]int64{1, sec}), "k", "a b:1 0123456789abcdef0123456789abcdef:x",
		fzProg(fzSemCall(0, 0, semAcq, true), fzSemCall(0, 1, semAcq, true)))
	// found by the fuzzer: the queue key expires in whole milliseconds; a foreign member
	// of the expiries met after the writes; a junk member added to a key of another type
	sem("queue-key-expires-in-whole-ms", fzSemCfg(0, [2]int64{1, 1000}), "0", "",
		fzProg(fzSemCall(0, 0, semAcq, false), fzSemCall(0, 1, semAcq, true), fzSemAt(304*time.Microsecond),
			fzSemCall(0, 1, semAcq, false), fzSemAt(999*time.Microsecond), fzSemDelete(2), fzSemCall(0, 0, semAcq, false)))
	sem("foreign-expiry-read-after-writes", fzSemCfg(6, [2]int64{2, 1000}), "0", "0",
		fzProg(fzSemJunk(2, 55), fzSemCall(0, 0, semAcq, false)))
	sem("junk-member-in-a-hash", fzSemCfg(1, [2]int64{1, 1000}), "0", "0", fzProg(fzSemJunk(0, 0)))
	// tokens and places: a task's place is handed the slot and its next acquire (a new
	// token) claims it; a stale holder's release leaves the new holder's lease alone; a
	// place that is another holder's token; ids at the edges
	sem("task-place-handed-then-claimed", fzSemCfg(0, [2]int64{1, sec}), "k", "",
		fzProg(fzSemCall(0, 0, semAcq, false), fzSemCallAt(0, 1, semAcq, 1, true), fzSemInspect(0), fzSemCall(0, 0, semRel, false),
			fzSemInspect(0), fzSemCallAt(0, 2, semAcq, 1, false), fzSemCall(0, 1, semRel, false), fzSemCallAt(0, 1, semRel, 1, false),
			fzSemInspect(0), fzSemCall(0, 2, semExt, false), fzSemCallAt(0, 2, semRel, 1, false)))
	sem("place-is-another-holders-token", fzSemCfg(0, [2]int64{2, sec}), "k", "",
		fzProg(fzSemCall(0, 1, semAcq, false), fzSemCallAt(0, 0, semAcq, 2, false), fzSemCallAt(0, 3, semAcq, 2, true),
			fzSemCall(0, 1, semExt, false), fzSemCallAt(0, 3, semRel, 2, false), fzSemInspect(0)))
	sem("place-ids-at-the-edges", fzSemCfg(0, [2]int64{1, sec}), "k", "",
		fzProg(fzSemCall(0, 0, semAcq, false), fzSemCallAt(0, 1, semAcq, 3, true), fzSemCallAt(0, 2, semAcq, 4, true),
			fzSemCallAt(0, 3, semAcq, 5, true), fzSemCallAt(0, 1, semAcq, 6, true), fzSemCallAt(0, 1, semAcq, 7, true),
			fzSemCallAt(0, 1, semAcq, 8, true), fzSemCallAt(0, 1, semAcq, 9, true), fzSemCallAt(0, 1, semRel, 6, false),
			fzSemCall(0, 1, semExt, true), fzSemInspect(0), fzSemCall(0, 0, semRel, false), fzSemInspect(0)))
	sem("paused-handoff-waits-for-resume", fzSemCfg(0, [2]int64{1, sec}), "k", "",
		fzProg(fzSemCall(0, 0, semAcq, false), fzSemCall(0, 1, semAcq, true), fzSemPause(2*time.Second), fzSemCall(0, 0, semRel, false),
			fzSemInspect(0), fzSemCall(0, 1, semAcq, true), fzSemResume(), fzSemCall(0, 2, semAcq, false), fzSemInspect(0)))
	sem("longest-key", fzSemLongCfg(false, [2]int64{1, sec}), "ab", "", fzProg(fzSemCall(0, 0, semAcq, true), fzSemInspect(0)))
	sem("key-a-byte-too-long-refused", fzSemLongCfg(true, [2]int64{1, sec}), "ab", "", fzProg(fzSemCall(0, 0, semAcq, true)))
	sem("braces-in-key", fzSemCfg(0, [2]int64{1, sec}), "}{x}", "", fzProg(fzSemCall(0, 0, semAcq, true), fzSemCall(0, 1, semAcq, true)))
	return seeds
}

// corpusFile is the go tool's encoding of a fuzz input (testing/fuzz "go test fuzz v1").
func corpusFile(values []any) string {
	var b strings.Builder
	b.WriteString("go test fuzz v1\n")
	for _, v := range values {
		switch v := v.(type) {
		case []byte:
			fmt.Fprintf(&b, "[]byte(%q)\n", v)
		case string:
			fmt.Fprintf(&b, "string(%q)\n", v)
		default:
			panic(fmt.Sprintf("corpusFile: %T", v))
		}
	}
	return b.String()
}

// The seed files say what fuzzSeeds writes (JOBTHROTTLE_WRITE_SEEDS=1 writes them).
func TestFuzzSeeds(t *testing.T) {
	write := os.Getenv("JOBTHROTTLE_WRITE_SEEDS") != ""
	seen := map[string]bool{}
	for _, s := range fuzzSeeds() {
		path := filepath.Join("testdata", "fuzz", s.target, s.name)
		if seen[path] {
			t.Fatalf("two seeds named %s", path)
		}
		seen[path] = true
		want := corpusFile(s.values)
		if write {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != want {
			t.Errorf("%s is not what fuzzSeeds says (%v); run JOBTHROTTLE_WRITE_SEEDS=1 go test -run TestFuzzSeeds ./throttle", path, err)
		}
	}
	if write {
		t.Logf("wrote %d seeds", len(seen))
	}
}
