package throttle

import (
	"fmt"
	"math/bits"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
)

// Algorithm selects how a Limiter counts.
type Algorithm int

const (
	// SlidingWindow is the default: a log of grants (Redisson's RRateLimiter, done
	// right). At most Rate permits take effect in any window of Period, exactly; a
	// denied caller is told the exact time until enough permits have left the window.
	// Memory: one list entry per grant time in the longest period.
	SlidingWindow Algorithm = iota

	// TokenBucket: Burst permits at once after an idle spell, then Rate per Period.
	// O(1) state. Its decisions are golang.org/x/time/rate's with the same rate and
	// burst, rate and burst changes (Override) and cancels included.
	TokenBucket

	// FixedWindow counts permits per aligned window (windows start at multiples of
	// Period since the Unix epoch). O(1) state, but up to 2 × Rate can pass around a
	// window boundary.
	FixedWindow

	// SlidingCounter keeps counters per sub-bucket (see WithBuckets): never more than
	// Rate in any Period, memory bounded by the number of buckets, at the price of
	// holding a permit up to one bucket longer than Period.
	SlidingCounter
)

// String returns the algorithm's name, as in "SlidingWindow".
func (a Algorithm) String() string {
	if a >= SlidingWindow && a <= SlidingCounter {
		return algorithms[a].name
	}
	return fmt.Sprintf("Algorithm(%d)", int(a))
}

// algorithm is everything the Go side knows of one algorithm: the rest is its script.
type algorithm struct {
	name   string
	tag    string            // its head's (internal/keys)
	script *script           // lua/gen/<script>.lua
	bursts bool              // a limit holds its burst
	maxN   func(l Limit) int // the most permits l can grant at once: its capacity
	// counted is how long after a grant takes effect its permits still count against
	// l: the key's state (and this process's, for StateLost and FailLocal) matters that long.
	counted func(l Limit) time.Duration
	// share is l cut to one process's share of a fleet of n, as a sliding window (FailLocal)
	share func(l Limit, n int) Limit
	// lack is, for StateLost, how many permits the key's state still lacks at server
	// time now (µs) from mark, n of ours granted at token under l, if it is intact;
	// ok is false when mark no longer counts.
	lack func(l Limit, token int64, n int, now int64) (lack int, ok bool)
}

var (
	logScript    = newScript("log")
	bucketScript = newScript("bucket")
	windowScript = newScript("window")
)

var algorithms = [...]algorithm{
	SlidingWindow: {
		name: "SlidingWindow", tag: keys.SlidingWindow, script: logScript,
		maxN: rateN, counted: period, share: rateShare, lack: windowLack,
	},
	TokenBucket: {
		name: "TokenBucket", tag: keys.TokenBucket, script: bucketScript, bursts: true,
		maxN: func(l Limit) int { return l.burst() },
		// a full burst takes burst/rate periods to come back
		counted: func(l Limit) time.Duration { return l.Period * time.Duration(max(1, (l.burst()+l.Rate-1)/l.Rate)) },
		// burst permits per the time the share of the rate takes to refill them; at
		// most 2^50µs (a share that slow grants once in any outage), since more than
		// burst × period, which validate bounds so, would overflow a Duration
		share: func(l Limit, n int) Limit {
			b := max(1, l.burst()/n)
			p := float64(l.Period) * float64(b) * float64(n) / float64(l.Rate)
			return Limit{Rate: b, Period: time.Duration(min(p, float64(maxBucketUS*time.Microsecond)))}
		},
		lack: bucketLack,
	},
	FixedWindow: {
		name: "FixedWindow", tag: keys.FixedWindow, script: windowScript,
		maxN: rateN, counted: period, share: rateShare,
		lack: func(l Limit, token int64, n int, now int64) (int, bool) {
			p := l.periodMicros()
			return n, token/p == now/p // counted while in the same aligned window
		},
	},
	SlidingCounter: {
		name: "SlidingCounter", tag: keys.SlidingCounter, script: logScript,
		maxN: rateN, counted: period, share: rateShare, lack: windowLack,
	},
}

func (a Algorithm) algo() *algorithm { return &algorithms[a] }

func rateN(l Limit) int              { return l.Rate }
func period(l Limit) time.Duration   { return l.Period }
func rateShare(l Limit, n int) Limit { return Limit{Rate: max(1, l.Rate/n), Period: l.Period} }
func windowLack(l Limit, token int64, n int, now int64) (int, bool) {
	return n, token+l.periodMicros() > now // counted while in the window
}

// bucketLack: the bucket gets a token back every period/rate, so n permits taken at
// token are still missing ceil(n - (now - token) × rate / period) at now.
func bucketLack(l Limit, token int64, n int, now int64) (int, bool) {
	p := uint64(l.periodMicros())
	hi, lo := bits.Mul64(uint64(now-token), uint64(l.Rate))
	owed := uint64(n) * p // <= 2^50: burst × period is bounded
	if hi != 0 || lo >= owed {
		return 0, false
	}
	return int((owed - lo + p - 1) / p), true
}

// head is the head of limits as New sends it (buckets: SlidingCounter's).
func (a *algorithm) head(limits []Limit, buckets int) keys.Head {
	h := keys.Head{Alg: a.tag, Buckets: buckets}
	for _, l := range limits {
		kl := keys.Limit{Rate: l.Rate, Period: time.Duration(l.periodMicros()) * time.Microsecond, Unit: l.Unit}
		if a.bursts {
			kl.Burst = l.burst()
		}
		h.Limits = append(h.Limits, kl)
	}
	return h
}
