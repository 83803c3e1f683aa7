package throttle

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/clock"
	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"
)

// Fuzz targets for the limiter scripts, one per algorithm: each input is a limit
// configuration, a key, some foreign content and a program of calls (acquire now, book
// ahead, cancel, read, Inspect, pause, resume, override and clear the rates, time
// passing, the state key vanishing or corrupted) run through the Limiter on miniredis
// and on a real redis-server side by side (redistest.Pair), on a clock the input moves.
// Properties, checked after every call:
//   - no panic, no hang (every call has a deadline), and no error but the package's
//     sentinels: bad input (a limit, n, maxWait, a cancel's token, a pause's length or
//     an override out of range, foreign state) gets its typed error and changes nothing;
//   - both servers give the same answer and hold the same state;
//   - every key the call wrote has a TTL; the state's TTL lasts as long as the state is
//     needed and no longer, a state key is never gone while it is needed, and, at the
//     end, every key is gone once the longest of them has passed;
//   - valid input gets the answer of the reference model, request for request (model in
//     refmodel_window_test.go for the log and window algorithms, bucketModel in
//     refmodel_bucket_test.go for the token bucket), Inspect included; and the token
//     bucket's decisions, waits and tokens are golang.org/x/time/rate's wherever both
//     apply (one limit, no pause in the way, n > 0; Override standing in for SetLimitAt
//     and SetBurstAt, Cancel for CancelAt).
// Seeds are in testdata/fuzz (written from limiter_fuzzseeds_test.go). CI runs each target for
// a count of inputs; see .ci/run.

func FuzzSlidingWindow(f *testing.F)  { fuzzLimiter(f, SlidingWindow) }
func FuzzSlidingCounter(f *testing.F) { fuzzLimiter(f, SlidingCounter) }
func FuzzTokenBucket(f *testing.F)    { fuzzLimiter(f, TokenBucket) }
func FuzzFixedWindow(f *testing.F)    { fuzzLimiter(f, FixedWindow) }

func fuzzLimiter(f *testing.F, alg Algorithm) {
	noteMissingServers(f, "every input is skipped (each runs on miniredis and a real redis-server side by side)", redistest.Standalone)
	f.Fuzz(func(t *testing.T, cfg []byte, key, junk string, ops []byte) {
		runLimiterInput(t, alg, cfg, key, junk, ops)
	})
}

// fuzzReader hands out the bytes of a fuzz input; past the end it returns zeros.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) done() bool { return len(r.b) == 0 }

func (r *fuzzReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *fuzzReader) int64() int64 {
	var buf [8]byte
	n := copy(buf[:], r.b)
	r.b = r.b[n:]
	return int64(binary.BigEndian.Uint64(buf[:]))
}

// pick returns table[b % len] for the next byte b, or, for b >= rawFrom, a raw
// 64-bit value from the next 8 bytes (huge, negative, anything).
func pick[T ~int | ~int64](r *fuzzReader, table []T) T {
	b := r.byte()
	if b >= rawFrom {
		return T(r.int64())
	}
	return table[int(b)%len(table)]
}

const rawFrom = 244

// Values the fuzz inputs choose from: ordinary ones first (a byte of 0, as the end of
// an input reads, picks the first), then the edges of every range.
var (
	fuzzRates   = []int{5, 1, 2, 3, 7, 10, 16, 100, 1000, 1_000_000, maxRate, maxRate + 1, 0, -1}
	fuzzPeriods = []time.Duration{time.Second, 100 * time.Millisecond, time.Microsecond, 2 * time.Microsecond,
		999 * time.Microsecond, time.Millisecond, 7 * time.Millisecond, 333_333 * time.Microsecond, time.Minute,
		time.Hour, 24 * time.Hour, maxPeriodUS * time.Microsecond, (maxPeriodUS + 1) * time.Microsecond, 0, -1, 1, 1500}
	fuzzBursts  = []int{0, 1, 2, 5, 10, 100, maxRate, maxRate + 1, -1}
	fuzzBuckets = []int{4, 1, 2, 3, 7, 50, 10000, 0, 10001}
)

// fuzzConfig is a decoded limit configuration and what New must say of it.
type fuzzConfig struct {
	limits   []Limit
	buckets  int
	prestate int  // foreign content put in a key before the first call (see prestates)
	longKey  bool // the key is repeated to the longest a key may be (overLong: a byte more)
	overLong bool
}

// decodeConfig decodes cfg: the number of limits (1, 2, 3, 16 or 17), the buckets, a
// flags byte (foreign content, a long key) and each limit's rate, period and burst.
func decodeConfig(cfg []byte) fuzzConfig {
	r := &fuzzReader{b: cfg}
	var c fuzzConfig
	m := 1
	switch b := r.byte(); {
	case b < 150:
	case b < 210:
		m = 2
	case b < 240:
		m = 3
	case b < 252:
		m = 16
	default:
		m = 17
	}
	c.buckets = pick(r, fuzzBuckets)
	flags := r.byte()
	c.longKey, c.overLong = flags >= 250, flags == 255
	if !c.longKey {
		c.prestate = int(flags%32) % len(prestates)
	}
	for i := 0; i < m; i++ {
		c.limits = append(c.limits, Limit{Rate: pick(r, fuzzRates), Period: pick(r, fuzzPeriods), Burst: pick(r, fuzzBursts)})
	}
	return c
}

// wantNew is the error New must return for the configuration on key with prefix, in
// the order New checks: options, the key, the number of limits, each limit against the
// bounds Limit documents (written here apart from Limit.validate); and why.
func (c fuzzConfig) wantNew(alg Algorithm, prefix, key string) (error, string) {
	switch {
	case c.buckets < 1 || c.buckets > 10000:
		return ErrInvalidArgument, "buckets"
	case key == "":
		return ErrInvalidKey, "empty key"
	case len(prefix)+len(key) > keys.MaxLen:
		return ErrInvalidKey, "key too long"
	case len(c.limits) > 16:
		return ErrInvalidArgument, "17 limits"
	}
	for _, l := range c.limits {
		if why := limitFault(alg, l); why != "" {
			return ErrInvalidLimit, why
		}
	}
	return nil, ""
}

// limitFault says what is out of range in l for alg, or "".
func limitFault(alg Algorithm, l Limit) string {
	p := l.Period / time.Microsecond
	if l.Period%time.Microsecond != 0 {
		p++
	}
	b := l.Burst
	if b == 0 {
		b = l.Rate
	}
	switch {
	case l.Rate < 1 || l.Rate > maxRate:
		return "rate"
	case l.Period <= 0 || p > maxPeriodUS:
		return "period"
	case l.Burst < 0 || l.Burst > maxRate:
		return "burst"
	case alg == TokenBucket && float64(b)*float64(p) > float64(maxBucketUS):
		return "burst x period"
	}
	return ""
}

// Foreign content put in a key before the first call (prestate % len; most inputs
// choose none).
var prestates = []string{"none", "hash in state", "set in state", "zset in state", "junk string in state",
	"junk list in state", "junk meta in a list state", "junk meta in a string state", "junk numbers before a meta",
	"junk string with TTL in state", "another algorithm's state"}

// fuzzGoClock is the Go side's clock during an input (clock.Set): it stands at the
// input's time; its timers are real.
type fuzzGoClock struct{ now *time.Time }

func (c fuzzGoClock) Now() time.Time                       { return *c.now }
func (c fuzzGoClock) NewTimer(d time.Duration) clock.Timer { return clock.System.NewTimer(d) }

// fuzzSide is one server's limiter and what its hooks saw.
type fuzzSide struct {
	name      string
	b         *redistest.Backend
	l         *Limiter
	cancelled int
	paused    int
	lost      int
}

// fuzzBooking is a reservation made ahead and still held.
type fuzzBooking struct {
	n     int
	token int64 // server time it takes effect, µs
	res   [2]*waiter.Reservation
	orc   *rate.Reservation // x/time/rate's, while the oracle follows (gen: its oracle's)
	gen   int
	limit rate.Limit // the oracle's rate when it was made
}

// fuzzRef is the reference model an input is checked against.
type fuzzRef interface {
	allow(now int64, n int, maxWait int64) (Result, int64, int64) // reply, wait, token
	cancel(now, token int64, n int) (bool, time.Duration)
	pause(now, d int64) int64
	resume()
	override(now, d int64, rates [][2]int) // rates nil: clear
	needed(now int64) int64                // how long the state key is needed from now, µs
	inspect(now int64) LimiterState        // what Inspect reports, TTL aside
	evict()
}

// fuzzOverride is the override the run set on the key: until end, the first
// len(rates) limits run at the rates and bursts given (0: the rate).
type fuzzOverride struct {
	end   int64
	rates [][2]int
}

// inForce returns the limits enforced at now: the callers', with the override's rates
// (and, for the token bucket, bursts) while it lasts.
func inForce(alg Algorithm, given []Limit, o *fuzzOverride, now int64) []Limit {
	out := slices.Clone(given)
	if o == nil || o.end <= now {
		return out
	}
	for i, rb := range o.rates {
		out[i].Rate = rb[0]
		if alg == TokenBucket {
			out[i].Burst = rb[1]
			if rb[1] == 0 {
				out[i].Burst = rb[0]
			}
		}
	}
	return out
}

// logRef follows the log and window algorithms with model, the limits in force
// changing with an override.
type logRef struct {
	m     *model
	given []Limit
	over  *fuzzOverride
	oend  int64
}

func (r *logRef) at(now int64) {
	if r.over != nil && r.over.end <= now {
		r.over = nil
	}
	r.m.limits = inForce(r.m.alg, r.given, r.over, now)
}

func (r *logRef) allow(now int64, n int, maxWait int64) (Result, int64, int64) {
	r.at(now)
	res, t := r.m.allow(now, n, maxWait)
	if !res.Allowed {
		return res, int64(res.RetryAfter / time.Microsecond), 0
	}
	if n == 0 {
		return res, 0, 0
	}
	return res, t - now, t
}

func (r *logRef) cancel(now, token int64, n int) (bool, time.Duration) {
	r.at(now)
	freed := r.m.cancel(now, token, n)
	return freed, r.m.reset(now)
}

func (r *logRef) pause(now, d int64) int64 { return r.m.pause(now, d) }
func (r *logRef) resume()                  { r.m.paused = 0 }

func (r *logRef) override(now, d int64, rates [][2]int) {
	r.over = nil
	if rates != nil {
		if d == 0 {
			d = maxPeriodUS
		}
		r.over = &fuzzOverride{end: now + d, rates: rates}
	}
	r.at(now)
}

func (r *logRef) needed(now int64) int64 {
	r.at(now)
	return int64(r.m.reset(now) / time.Microsecond)
}

func (r *logRef) inspect(now int64) LimiterState {
	r.at(now)
	m := r.m
	st := LimiterState{Algorithm: m.alg, Remaining: m.remaining(now), NextFree: micros(m.earliest(now, 1) - now),
		ResetAfter: m.reset(now), PausedFor: micros(max(0, m.paused-now))}
	if r.over != nil {
		st.Override = micros(r.over.end - now)
	}
	var prec int64 // the log's bucket: a permit counts from the end of its sub-bucket
	if m.alg == SlidingCounter {
		prec = m.bucket
	}
	for i, l := range m.limits {
		ls := LimitState{Limit: r.given[i], Capacity: l.Rate}
		if st.Override > 0 {
			ls.Limit.Rate = l.Rate
		}
		p := l.periodMicros()
		switch m.alg {
		case FixedWindow:
			lw, nw := floorDiv(m.latest, p), floorDiv(now, p)
			c := 0
			if len(m.grants) > 0 {
				c = m.windowCount(i, lw)
			}
			switch {
			case lw > nw:
				ls.Used = l.Rate
				st.Booked = max(st.Booked, c)
			case lw == nw:
				ls.Used = c
			}
		default:
			for _, g := range m.grants {
				if g.rec > now-p {
					ls.Used += g.n
				}
			}
		}
		st.Limits = append(st.Limits, ls)
	}
	switch m.alg {
	case FixedWindow:
		if len(m.grants) > 0 {
			st.BookedAhead = micros(max(0, m.latest-now))
		}
	default:
		for _, g := range m.grants {
			if g.rec > now+prec {
				st.Booked += g.n
			}
		}
		if st.Booked > 0 {
			st.BookedAhead = micros(m.grants[len(m.grants)-1].rec - prec - now)
		}
	}
	return st
}

// evict forgets the state, as if its key had been deleted: an empty log, and no pause or
// override (the state's meta held them).
func (r *logRef) evict() {
	r.m.grants, r.m.back, r.m.latest, r.m.paused, r.over = nil, nil, 0, 0, nil
}

// bucketRef follows the token bucket with bucketModel.
type bucketRef struct{ *bucketModel }

func (r bucketRef) inspect(now int64) LimiterState {
	m := r.bucketModel
	m.at(now)
	defer m.done()
	avail, booked, ahead := m.detail(now)
	remaining, reset := m.report(now)
	st := LimiterState{Algorithm: TokenBucket, Remaining: remaining, NextFree: micros(m.nextFree(now)), ResetAfter: reset,
		Booked: booked, BookedAhead: micros(ahead), PausedFor: micros(max(0, m.paused-now))}
	if m.over != nil && m.over.end > now {
		st.Override = micros(m.over.end - now)
	}
	for i, l := range m.given {
		rt, b := m.inForce(i, now)
		ls := LimitState{Limit: l, Capacity: b, Used: b - avail[i]}
		if st.Override > 0 {
			ls.Limit.Rate, ls.Limit.Burst = rt, b
		}
		st.Limits = append(st.Limits, ls)
	}
	return st
}

// fuzzOracle is golang.org/x/time/rate's Limiter beside a one-limit token bucket. It
// computes in floats and whole nanoseconds where the script computes in exact ticks and
// whole microseconds, so a comparison within slack tokens (or their time) is left
// undecided: the oracle then follows the script's decision. Cancels add to the slack
// (the script counts the time between bookings in rounded times).
type fuzzOracle struct {
	lim   *rate.Limiter
	slack float64 // tokens
	gen   int     // a new Limiter after the state was lost: bookings of an older one are not its own
	given Limit
	over  *fuzzOverride // an override the oracle has yet to end
}

// perUS is the oracle's rate in tokens per µs.
func (o *fuzzOracle) perUS() float64 { return float64(o.lim.Limit()) / 1e6 }

// oracleLimit returns x/time/rate's Limit for l: its rate per second, l's period in
// whole microseconds as the scripts use it.
func oracleLimit(l Limit) rate.Limit {
	return rate.Limit(float64(l.Rate) / (float64(l.periodMicros()) / 1e6))
}

// set changes the oracle's rate and burst to l's at t (SetLimitAt, SetBurstAt).
func (o *fuzzOracle) set(t time.Time, l Limit) {
	o.lim.SetLimitAt(t, oracleLimit(l))
	o.lim.SetBurstAt(t, l.burst())
}

// errClass names the sentinel an error wraps; anything else is "unexpected".
func errClass(err error) string {
	for _, s := range []error{ErrInvalidArgument, ErrExceedsLimit, ErrInvalidLimit, ErrInvalidKey, ErrCorruptState,
		ErrAlgorithmMismatch} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	if err == nil {
		return "ok"
	}
	return "unexpected: " + err.Error()
}

// fuzzRun is the state of one input's run.
type fuzzRun struct {
	t        *testing.T
	name     string // what is fuzzed
	alg      Algorithm
	lenient  bool // keys hold foreign content: no model, ErrCorruptState is fine
	otherAlg bool // the state key holds another algorithm's state: every call fails with ErrAlgorithmMismatch
	pair     *redistest.Pair
	sides    [2]*fuzzSide
	now      time.Time
	clock    string // the hash tag whose clock key the scripts read
	state    string // state key
	limits   []Limit
	over     *fuzzOverride // the override set on the key, nil: none
	ref      fuzzRef       // nil: no model (foreign content, or the model cannot follow)
	oracle   *fuzzOracle
	trace    []string
	horizon  int64 // the latest time any key is needed until, µs
	mayLose  bool  // the state lost permits (deleted, or a confused cancel): StateLost may be called
	// an override changed the rates: StateLost, which bounds Remaining by the callers'
	// limits, may be called while the state holds every permit (a known false alarm)
	overridden bool
	lastW      int64 // the last wait and reset seen, µs, for time steps that hit them
	lastR      int64
	books      []fuzzBooking
	foreign    map[string]bool // keys holding foreign content the scripts may leave
	initial    redistest.Snapshot
	maxN       int
}

func (r *fuzzRun) fail(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf("%s\n%s\nafter: %s", r.name, fmt.Sprintf(format, args...), strings.Join(r.trace, "\n  "))
}

func (r *fuzzRun) nowUS() int64 { return r.now.UnixMicro() }

func (r *fuzzRun) note(format string, args ...any) {
	r.trace = append(r.trace, fmt.Sprintf(format, args...))
}

func runLimiterInput(t *testing.T, alg Algorithm, cfg []byte, key, junk string, ops []byte) {
	c := decodeConfig(cfg)
	pair := redistest.NewPair(t)
	if c.longKey && key != "" {
		n := keys.MaxLen - len(pair.Mini.Prefix)
		if c.overLong {
			n++
		}
		key = strings.Repeat(key, n/len(key)+1)[:n]
	}
	r := &fuzzRun{t: t, name: alg.String(), alg: alg, pair: pair, now: redistest.Epoch, foreign: map[string]bool{}}
	setGoClock(t, fuzzGoClock{&r.now})
	r.note("config %v buckets %d prestate %q key %q (%d bytes)", c.limits, c.buckets, prestates[c.prestate],
		trunc(key), len(key))

	// the key's hash tag, as the scripts (and the fake clock) find it: up to the first '}'
	tag := "{" + pair.Mini.Prefix + key
	if i := strings.IndexByte(key, '}'); i >= 0 {
		tag = "{" + pair.Mini.Prefix + key[:i]
	}
	r.clock = tag + "}"
	base := "{" + pair.Mini.Prefix + key + "}"
	r.state = keys.Name(base, keys.State)
	pair.Track(r.state)
	pair.SetTime(t, r.now, r.clock)

	want, why := c.wantNew(alg, pair.Mini.Prefix, key)
	for i, b := range []*redistest.Backend{pair.Mini, pair.Real} {
		s := &fuzzSide{name: string(b.Kind), b: b}
		hooks := Hooks{Cancelled: func(string, int) { s.cancelled++ }, StateLost: func(string) { s.lost++ },
			Paused: func(string, time.Duration) { s.paused++ }}
		var opts []Option
		if len(c.limits) > 1 {
			opts = append(opts, WithLimits(c.limits[1:]...))
		}
		opts = append(opts, WithAlgorithm(alg), WithBuckets(c.buckets), WithKeyPrefix(b.Prefix), WithHooks(hooks))
		l, err := New(b.Client, key, c.limits[0], opts...)
		if want != nil {
			if !errors.Is(err, want) {
				r.fail("New (%s): %v, want an error wrapping %v", why, err, want)
			}
			if keys := pair.MiniKeys(); len(keys) != 1 { // the clock key
				r.fail("New failed, yet keys were written: %q", keys)
			}
			return
		}
		if err != nil {
			r.fail("New: %v, want no error", err)
		}
		if b.Real() {
			l.useScript(fakeClock[l.t.script])
		}
		s.l = l
		r.sides[i] = s
	}
	r.limits = c.limits
	r.maxN = r.sides[0].l.maxN

	// foreign content, the same on both servers
	if c.prestate != 0 {
		r.prestate(c.prestate, junk)
	} else {
		switch alg {
		case TokenBucket:
			r.ref = bucketRef{newBucketModel(c.limits)}
			if len(c.limits) == 1 {
				l := c.limits[0]
				r.oracle = &fuzzOracle{lim: rate.NewLimiter(oracleLimit(l), l.burst()), slack: 1e-6, given: l}
			}
		default:
			r.ref = &logRef{m: newModel(alg, c.limits, c.buckets), given: c.limits}
		}
	}

	rd := &fuzzReader{b: ops}
	defer watchdog(fmt.Sprintf("%s %x %q %q %x", alg, cfg, trunc(key), trunc(junk), ops))()
	for step := 0; step < 48 && !rd.done(); step++ {
		r.step(rd)
	}
	r.finish()
}

// watchdog crashes the process, with every goroutine's stack, if the input has not
// finished within fuzzHang: a hang is a failure the fuzz engine does not see
// otherwise (it records the crashing input). Call the function it returns when done.
func watchdog(input string) func() {
	t := time.AfterFunc(fuzzHang, func() {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		panic(fmt.Sprintf("fuzz input still running after %v: %s\n%s", fuzzHang, input, buf))
	})
	return func() { t.Stop() }
}

const fuzzHang = 2 * time.Minute

func trunc(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// prestate puts foreign content in the state key of both servers.
func (r *fuzzRun) prestate(p int, junk string) {
	ctx := context.Background()
	words := strings.Fields(junk)
	if len(words) == 0 {
		words = []string{junk}
	}
	other := ""
	for _, b := range []*redistest.Backend{r.pair.Mini, r.pair.Real} {
		c := b.Client
		var err error
		switch prestates[p] {
		case "hash in state":
			err = c.HSet(ctx, r.state, "f", junk).Err()
		case "set in state":
			err = c.SAdd(ctx, r.state, junk).Err()
		case "zset in state":
			err = c.ZAdd(ctx, r.state, redisZ(words)...).Err()
		case "junk string in state":
			err = c.Set(ctx, r.state, junk, 0).Err()
		case "junk list in state":
			err = c.RPush(ctx, r.state, toAnySlice(words)...).Err()
		case "junk meta in a list state":
			err = c.RPush(ctx, r.state, junk, "0").Err()
		case "junk meta in a string state":
			err = c.Set(ctx, r.state, "1 2 3\n"+junk, 0).Err()
		case "junk numbers before a meta":
			err = c.Set(ctx, r.state, junk+"\n"+r.alg.algo().head(r.limits, defaultBuckets).String(), 0).Err()
		case "junk string with TTL in state":
			err = c.Set(ctx, r.state, junk, time.Hour).Err()
		case "another algorithm's state": // one of ours, of another algorithm: a log's list or a string
			if r.alg == TokenBucket || r.alg == FixedWindow {
				other = "sw"
				err = c.RPush(ctx, r.state, "sw 1 1000000", "0").Err()
			} else {
				other = "fw"
				err = c.Set(ctx, r.state, "0 0\nfw 1 1000000", 0).Err()
			}
		}
		if err != nil {
			r.fail("prestate %s: %v", prestates[p], err)
		}
	}
	r.lenient = true
	r.otherAlg = other != ""
	r.foreign[r.state] = true
	r.initial = r.pair.Compare(r.t, "foreign content")
}

// corrupt overwrites part of the state (its data or its meta) in place, keeping its TTL,
// as a foreign writer could: a list element, or the whole string. From then on there is
// no model, and calls must either work or fail with ErrCorruptState changing nothing.
func (r *fuzzRun) corrupt(b byte) {
	ctx := context.Background()
	r.pair.Sync(r.t)
	snap := r.pair.Compare(r.t, "corrupt")
	key := r.state
	junk := []string{"x", "-1", "1.5", "", "99999999999999999999", "1e3", " 1"}[int(b/3)%7]
	s := snap[key]
	r.note("corrupt %s (%s) with %q", key, s.Type, junk)
	for _, bk := range []*redistest.Backend{r.pair.Mini, r.pair.Real} {
		var err error
		switch s.Type {
		case "none":
			return
		case "list":
			err = bk.Client.LSet(ctx, key, int64(int(b)%len(s.Value)), junk).Err()
		case "string":
			err = bk.Client.SetArgs(ctx, key, junk, redis.SetArgs{KeepTTL: true}).Err()
		default: // foreign content of another type: it stays as it is
			return
		}
		if err != nil {
			r.fail("corrupt: %v", err)
		}
	}
	r.lenient, r.ref, r.oracle = true, nil, nil
	if s.TTL < 0 { // foreign content already: it stays foreign, now with the new junk
		if r.initial == nil {
			r.initial = redistest.Snapshot{}
		}
		r.foreign[key] = true
		r.initial[key] = r.pair.Compare(r.t, "corrupt")[key]
	}
	r.check("corrupt", nil, nil)
}

// step decodes and runs one call of the program.
func (r *fuzzRun) step(rd *fuzzReader) {
	switch op := rd.byte() % 16; op {
	case 0, 1, 2: // time passes
		var pmax, emin int64 = 0, math.MaxInt64
		for _, l := range r.limits {
			pmax = max(pmax, l.periodMicros())
			emin = min(emin, max(1, l.periodMicros()/int64(l.Rate)))
		}
		steps := []int64{emin, 0, 1, 2, 999, 1000, 1001, 50_000, 1_000_000, 3_600_000_000,
			pmax, pmax - 1, pmax + 1, emin + 1, r.lastW, r.lastW - 1, r.lastR, r.lastR + 1}
		d := pick(rd, steps)
		if d < 0 || d > 1<<47 {
			d = int64(uint64(d) % (1 << 40))
		}
		r.advance(d)
	case 3, 4:
		r.allow(r.pickN(rd))
	case 5, 6:
		n := r.pickN(rd)
		waits := []time.Duration{time.Hour, 0, time.Microsecond, time.Millisecond, time.Second, 1 << 62,
			math.MaxInt64, -1, time.Duration(r.lastW) * time.Microsecond, time.Duration(r.lastW-1) * time.Microsecond}
		r.reserve(n, pick(rd, waits))
	case 7, 11:
		r.cancel(rd)
	case 8:
		r.allow(0)
	case 9:
		ds := []int64{1, 1000, 1_000_000, r.lastW, maxPeriodUS, 0, -1, maxPeriodUS + 1}
		r.pause(pick(rd, ds))
	case 10:
		if rd.byte()%4 == 3 {
			r.corrupt(rd.byte())
			return
		}
		// the state key vanishes (an eviction)
		r.note("evict state key")
		r.pair.Sync(r.t)
		for _, b := range []*redistest.Backend{r.pair.Mini, r.pair.Real} {
			b.Client.Del(context.Background(), r.state)
		}
		r.mayLose = true
		r.evicted()
		r.check("evict", nil, nil)
	case 12:
		r.override(rd)
	case 13:
		r.clearOverride()
	case 14:
		r.resume()
	case 15:
		r.inspect()
	}
}

func (r *fuzzRun) pickN(rd *fuzzReader) int {
	ns := []int{1, 1, 2, 3, 0, r.maxN, r.maxN - 1, r.maxN + 1, -1, 1 << 40}
	return pick(rd, ns)
}

func (r *fuzzRun) advance(d int64) {
	r.now = r.now.Add(time.Duration(d) * time.Microsecond)
	r.note("t0+%v", r.now.Sub(redistest.Epoch))
	r.pair.SetTime(r.t, r.now, r.clock)
}

// ctx bounds every call: a script that does not return within it hangs (a call on a
// busy machine takes milliseconds).
func fuzzCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

// both runs f on each server and checks the answers agree; it returns the first.
func both[T comparable](r *fuzzRun, what string, f func(s *fuzzSide) (T, error)) (T, error) {
	r.t.Helper()
	var out [2]T
	var errs [2]error
	for i, s := range r.sides {
		out[i], errs[i] = f(s)
	}
	if c0, c1 := errClass(errs[0]), errClass(errs[1]); c0 != c1 || out[0] != out[1] {
		r.fail("%s: miniredis %+v %v, redis %+v %v", what, out[0], errs[0], out[1], errs[1])
	}
	if c := errClass(errs[0]); strings.HasPrefix(c, "unexpected") {
		r.fail("%s: %v", what, errs[0])
	}
	return out[0], errs[0]
}

// before is what every call starts with: the servers' state made one (Sync), and the
// model and the oracle brought to now. A state key that is gone must not have been
// needed.
func (r *fuzzRun) before(what string) redistest.Snapshot {
	r.t.Helper()
	r.note("%s", what)
	snap := r.pair.Sync(r.t)
	now := r.nowUS()
	if r.ref != nil && snap[r.state].Type == "none" {
		if need := r.needed(now); need > 0 && !r.mayLose {
			r.fail("%s at t0+%v: the state key is gone, yet needed for %dµs more", what, r.now.Sub(redistest.Epoch), need)
		}
		r.evicted()
	}
	if o := r.oracle; o != nil && o.over != nil && o.over.end <= now {
		o.set(time.UnixMicro(o.over.end), o.given)
		o.over = nil
	}
	return snap
}

// capacity is the largest n an acquire may ask at now: what the limits in force allow.
func (r *fuzzRun) capacity(now int64) int {
	c := maxRate
	for _, l := range inForce(r.alg, r.limits, r.over, now) {
		if r.alg == TokenBucket {
			c = min(c, l.burst())
		} else {
			c = min(c, l.Rate)
		}
	}
	return c
}

// evicted follows the state key gone (deleted, or expired): the data, and the pause and
// the override its meta held; the oracle starts again from a fresh Limiter's full bucket.
func (r *fuzzRun) evicted() {
	if r.ref != nil {
		r.ref.evict()
	}
	r.over = nil
	if o := r.oracle; o != nil {
		o.lim, o.gen, o.over = rate.NewLimiter(oracleLimit(r.limits[0]), r.limits[0].burst()), o.gen+1, nil
	}
}

// needed is how long the state key is needed from now, µs: its data's need (the
// model's), and while its meta holds a pause or an override.
func (r *fuzzRun) needed(now int64) int64 {
	need := r.ref.needed(now)
	switch ref := r.ref.(type) {
	case *logRef:
		need = max(need, ref.m.paused-now)
	case bucketRef:
		need = max(need, ref.paused-now)
	}
	if r.over != nil {
		need = max(need, r.over.end-now)
	}
	return need
}

// paused reports whether a pause set by the input lies ahead of now.
func (r *fuzzRun) paused() bool {
	switch ref := r.ref.(type) {
	case *logRef:
		return ref.m.paused > r.nowUS()
	case bucketRef:
		return ref.paused > r.nowUS()
	}
	return true
}

func (r *fuzzRun) allow(n int) {
	what := fmt.Sprintf("AllowN(%d)", n)
	before := r.before(what)
	got, err := both(r, what, func(s *fuzzSide) (Result, error) {
		ctx, cancel := fuzzCtx()
		defer cancel()
		return s.l.AllowN(ctx, n)
	})
	r.note("  -> %+v %v", got, err)
	wantIn := r.inputErr(n)
	r.wantErr(what, err, wantIn)
	r.check(what, before, err)
	if err != nil || wantIn != nil {
		return
	}
	r.lastW, r.lastR = int64(got.RetryAfter/time.Microsecond), int64(got.ResetAfter/time.Microsecond)
	r.noteReset(got.ResetAfter)
	if r.oracle != nil && n > 0 {
		r.oracleAllow(n, got)
	}
	if r.ref != nil {
		want, _, _ := r.ref.allow(r.nowUS(), n, 0)
		if got != want {
			r.fail("%s at t0+%v: got %+v, want %+v", what, r.now.Sub(redistest.Epoch), got, want)
		}
		r.checkTTL(what)
		r.oracleTokens(what)
	}
}

// wantErr fails unless err wraps want; with want nil, err must be nil, or wrap
// ErrCorruptState when a key holds foreign content (ErrAlgorithmMismatch when another
// algorithm's state is there), or ErrExceedsLimit when an override may bound n.
func (r *fuzzRun) wantErr(what string, err, want error) {
	r.t.Helper()
	switch {
	case want != nil && errors.Is(err, want):
	case want == nil && err == nil:
	case want == nil && r.lenient && errors.Is(err, ErrCorruptState):
	case want == nil && r.otherAlg && errors.Is(err, ErrAlgorithmMismatch):
	default:
		r.fail("%s: %v, want %v", what, err, want)
	}
}

// inputErr is the error an acquire of n must return, or nil: Go refuses n out of the
// callers' limits before calling Redis, the script n above an override's.
func (r *fuzzRun) inputErr(n int) error {
	switch {
	case n < 0:
		return ErrInvalidArgument
	case n > r.maxN, n > r.capacity(r.nowUS()):
		return ErrExceedsLimit
	}
	return nil
}

// oracleAllow compares an AllowN of n > 0 with x/time/rate's AllowN at the same time.
func (r *fuzzRun) oracleAllow(n int, got Result) {
	o, now := r.oracle, r.now
	if r.paused() { // x/time/rate has no pause: the script denies, and changes nothing
		if got.Allowed {
			r.fail("AllowN(%d) granted while paused", n)
		}
		return
	}
	tokens := o.lim.TokensAt(now)
	margin := tokens - float64(n)
	if math.Abs(margin) <= o.slack+o.perUS()/1000 { // undecided: where they differ, follow the script
		if got.Allowed && !o.lim.AllowN(now, n) {
			o.lim.ReserveN(now, n)
			o.slack += o.perUS()
			r.note("  (x/time/rate: %.9f tokens for %d: undecided, follows)", tokens, n)
		}
		return
	}
	if want := o.lim.AllowN(now, n); got.Allowed != want {
		r.fail("AllowN(%d) at t0+%v: allowed %v, x/time/rate says %v (tokens %.9f)", n, now.Sub(redistest.Epoch),
			got.Allowed, want, tokens)
	}
	if left := o.lim.TokensAt(now); got.Allowed && math.Abs(left-math.Round(left)) > o.slack {
		if want := max(0, int(math.Floor(left))); got.Remaining != want {
			r.fail("AllowN(%d) at t0+%v: Remaining %d, x/time/rate holds %.9f tokens", n, now.Sub(redistest.Epoch), got.Remaining, left)
		}
	}
	if !got.Allowed { // the wait for n, rounded up to the µs
		wait := -margin / o.perUS()
		if d := float64(got.RetryAfter/time.Microsecond) - wait; d < -o.slack/o.perUS() || d > 1+o.slack/o.perUS() {
			r.fail("AllowN(%d) at t0+%v: RetryAfter %v, x/time/rate waits %.3fµs", n, now.Sub(redistest.Epoch), got.RetryAfter, wait)
		}
	}
}

// oracleTokens compares the model's tokens with x/time/rate's, within the slack.
func (r *fuzzRun) oracleTokens(what string) {
	o, m := r.oracle, r.ref
	if o == nil || m == nil {
		return
	}
	want, _ := m.(bucketRef).tokens(r.nowUS(), 0).Float64()
	if got := o.lim.TokensAt(r.now); math.Abs(got-want) > o.slack {
		r.fail("%s at t0+%v: x/time/rate holds %.9f tokens, the model %.9f (slack %.9f)", what,
			r.now.Sub(redistest.Epoch), got, want, o.slack)
	}
}

func (r *fuzzRun) reserve(n int, maxWait time.Duration) {
	what := fmt.Sprintf("Reserve(%d, %v)", n, maxWait)
	before := r.before(what)
	type out struct {
		ok    bool
		delay time.Duration
	}
	var res [2]*waiter.Reservation
	i := 0
	got, err := both(r, what, func(s *fuzzSide) (out, error) {
		ctx, cancel := fuzzCtx()
		defer cancel()
		rv, err := s.l.Reserve(ctx, n, maxWait)
		res[i] = rv
		i++
		if err != nil {
			return out{}, err
		}
		return out{rv.OK(), rv.Delay()}, nil
	})
	r.note("  -> %+v %v", got, err)
	wantIn := r.inputErr(n)
	if n >= 0 && n <= r.maxN && maxWait < 0 {
		wantIn = ErrInvalidArgument
	}
	r.wantErr(what, err, wantIn)
	r.check(what, before, err)
	if err != nil || wantIn != nil {
		return
	}
	wait := int64(got.delay / time.Microsecond)
	r.lastW = wait
	now := r.nowUS()
	x := min(int64(maxWait/time.Microsecond), protocol.MaxWait)
	var bk *fuzzBooking
	if got.ok && wait > 0 {
		r.books = append(r.books, fuzzBooking{n: n, token: now + wait, res: res})
		bk = &r.books[len(r.books)-1]
		r.noteEnd(now + wait)
	}
	if r.oracle != nil && n > 0 {
		r.oracleReserve(n, x, got.ok, got.delay, bk)
	}
	if r.ref != nil {
		want, wantWait, _ := r.ref.allow(now, n, x)
		if got.ok != want.Allowed || wait != wantWait {
			r.fail("%s at t0+%v: got OK %v delay %v, want OK %v delay %v (%+v)", what, r.now.Sub(redistest.Epoch),
				got.ok, got.delay, want.Allowed, micros(wantWait), want)
		}
		r.noteReset(want.ResetAfter)
		r.checkTTL(what)
		r.oracleTokens(what)
	}
}

// oracleReserve follows a Reserve of n > 0 within x µs with x/time/rate: its reserveN
// books when the wait for n is within the max wait (computed here from TokensAt as
// reserveN computes it; ReserveN then books it). The script also refuses a booking
// beyond 2^50/rate µs, and books after a pause: x/time/rate has neither.
func (r *fuzzRun) oracleReserve(n int, x int64, ok bool, delay time.Duration, bk *fuzzBooking) {
	o, now := r.oracle, r.now
	tokens := o.lim.TokensAt(now)
	wait := max(0, float64(n)-tokens) / o.perUS() // µs
	horizon := float64(maxBucketUS / int64(inForce(r.alg, r.limits, r.over, r.nowUS())[0].Rate))
	tol := o.slack/o.perUS() + 0.001 // µs
	switch {
	case r.paused():
		if ok {
			r.note("  (x/time/rate has no pause: the oracle stops)")
			r.oracle = nil
		}
		return
	case ok && math.Ceil(wait-tol) > horizon:
		r.fail("Reserve(%d) booked %v ahead, beyond 2^50/rate µs", n, delay)
	case !ok && math.Ceil(wait+tol) > horizon: // x/time/rate has no horizon
		return
	case math.Abs(wait-float64(x)) <= tol: // undecided: follow the script
		r.note("  (x/time/rate: wait %.3fµs for a max wait of %dµs: undecided, follows)", wait, x)
	case ok != (wait <= float64(x)):
		r.fail("Reserve(%d, %dµs) at t0+%v: OK %v, x/time/rate says %v (wait %.3fµs)", n, x, now.Sub(redistest.Epoch),
			ok, !ok, wait)
	}
	if !ok {
		return
	}
	rv := o.lim.ReserveN(now, n)
	if d := rv.DelayFrom(now); math.Abs(float64(delay-d)) > float64(time.Microsecond)+o.slack/o.perUS()*1000 {
		r.fail("Reserve(%d) at t0+%v: delay %v, x/time/rate's %v", n, now.Sub(redistest.Epoch), delay, d)
	}
	if bk != nil {
		bk.orc, bk.gen, bk.limit = rv, o.gen, o.lim.Limit()
	}
}

// cancel gives a booking back: through its Reservation, or by a raw cancel call with
// the token or n altered (what a confused caller could send).
func (r *fuzzRun) cancel(rd *fuzzReader) {
	mode, j := rd.byte()%6, int(rd.byte())
	if len(r.books) == 0 {
		mode = 5
	}
	var b fuzzBooking
	if len(r.books) > 0 {
		j %= len(r.books)
		b = r.books[j]
		if mode < 3 {
			r.books = slices.Delete(r.books, j, j+1)
		}
	}
	now := r.nowUS()
	if mode < 3 {
		what := fmt.Sprintf("Reservation.Cancel (n=%d at t0+%v)", b.n, micros(b.token-redistest.Epoch.UnixMicro()))
		before := r.before(what)
		c0 := [2]int{r.sides[0].cancelled, r.sides[1].cancelled}
		i := 0
		_, err := both(r, what, func(s *fuzzSide) (bool, error) {
			ctx, cancel := fuzzCtx()
			defer cancel()
			err := b.res[i].Cancel(ctx)
			i++
			return false, err
		})
		r.wantErr(what, err, nil)
		r.check(what, before, err)
		if err != nil {
			return
		}
		freed := [2]bool{r.sides[0].cancelled > c0[0], r.sides[1].cancelled > c0[1]}
		r.note("  -> freed %v", freed[0])
		if freed[0] != freed[1] {
			r.fail("%s: freed on miniredis %v, on redis %v", what, freed[0], freed[1])
		}
		if now >= b.token { // a Reservation past its time gives nothing back, and does not call Redis
			if freed[0] {
				r.fail("%s after it took effect gave permits back", what)
			}
			return
		}
		r.oracleCancel(b, freed[0])
		if r.ref != nil {
			want, _ := r.ref.cancel(now, b.token, b.n)
			if freed[0] != want {
				r.fail("%s at t0+%v: freed %v, want %v", what, r.now.Sub(redistest.Epoch), freed[0], want)
			}
			r.checkTTL(what)
			r.oracleTokens(what)
		}
		return
	}
	// a raw cancel: token or n altered, or made up
	n, token := b.n, b.token
	switch mode {
	case 3:
		token += []int64{1, -1}[rd.byte()%2]
	case 4:
		n = pick(rd, []int{0, n + 1, r.maxN, r.maxN + 1, -1, 1 << 50})
	case 5:
		n = pick(rd, []int{1, 2, r.maxN})
		token = pick(rd, []int64{0, now, now + 1, now + 1_000_000, 1<<53 - 1, 1 << 53, -1})
	}
	what := fmt.Sprintf("cancel(n=%d, token=t0%+d)", n, token-redistest.Epoch.UnixMicro())
	before := r.before(what)
	v, err := both(r, what, func(s *fuzzSide) ([protocol.Width]int64, error) {
		ctx, cancel := fuzzCtx()
		defer cancel()
		rep, err := s.l.send(ctx, s.l.client().key(s.l.t.tag), s.l.request(protocol.OpCancel, n, token), nil)
		return rep.v, err
	})
	got := reply{v: v}
	var wantErr error // the protocol's ranges: a cancel's n is not checked against the limits
	if n < 0 || n > protocol.MaxRate || token < 0 || token > protocol.MaxWait {
		wantErr = ErrInvalidArgument
	}
	r.wantErr(what, err, wantErr)
	r.check(what, before, err)
	if err != nil {
		return
	}
	freed, reset := got.v[0] == 1, micros(got.v[3])
	r.note("  -> %v", got.v)
	r.noteReset(reset)
	if freed && (mode != 4 || n > b.n) {
		r.mayLose = true // gave back permits nobody booked at that time, or more than booked
	}
	if got.v[0] < 0 || got.v[0] > 1 || got.v[1] != 0 || got.v[2] != 0 || got.v[4] != 0 || got.v[5] != 0 {
		r.fail("%s: reply %v, want {freed, 0, 0, reset, 0, 0}", what, got.v)
	}
	if freed && r.oracle != nil { // x/time/rate has no cancel but a Reservation's
		if b.orc != nil && mode == 4 && n == b.n {
			r.oracleCancel(b, true)
		} else {
			r.note("  (a made-up cancel: the oracle stops)")
			r.oracle = nil
		}
	}
	if r.ref != nil {
		wantFreed, wantReset := r.ref.cancel(now, token, n)
		if freed != wantFreed || reset != wantReset {
			r.fail("%s at t0+%v: freed %v reset %v, want freed %v reset %v", what, r.now.Sub(redistest.Epoch),
				freed, reset, wantFreed, wantReset)
		}
		r.checkTTL(what)
		r.oracleTokens(what)
	}
}

// oracleCancel follows a cancel of b at now with x/time/rate's CancelAt, while the
// oracle's Limiter made b at the rate in force (the script counts the tokens booked
// after b at the rate in force at the cancel, x/time/rate at b's).
func (r *fuzzRun) oracleCancel(b fuzzBooking, freed bool) {
	o := r.oracle
	behind, _ := r.ref.(interface{ behindLatest(token int64) bool })
	switch {
	case o == nil:
		return
	case behind != nil && behind.behindLatest(b.token):
		if freed {
			r.note("  (a cancel of a booking after the bucket's latest booking time: x/time/rate gives back more, the oracle stops)")
			r.oracle = nil
		}
		return
	case b.orc == nil || b.gen != o.gen || b.limit != o.lim.Limit() || b.orc.DelayFrom(r.now) == 0:
		if freed {
			r.note("  (a cancel x/time/rate cannot follow: the oracle stops)")
			r.oracle = nil
		}
		return
	}
	b.orc.CancelAt(r.now)
	o.slack += 3 * o.perUS() // the times between bookings, and a latest booking moved back, in whole µs
}

func (r *fuzzRun) pause(d int64) {
	what := fmt.Sprintf("pause(%dµs)", d)
	public := d >= 1 && d <= maxPeriodUS // else the script must refuse it (Pause refuses d <= 0 itself)
	if public {
		what = fmt.Sprintf("Pause(%v)", micros(d))
	}
	before := r.before(what)
	p0 := [2]int{r.sides[0].paused, r.sides[1].paused}
	_, err := both(r, what, func(s *fuzzSide) (bool, error) {
		ctx, cancel := fuzzCtx()
		defer cancel()
		if public {
			return false, s.l.Pause(ctx, micros(d))
		}
		_, err := s.l.controlCall(ctx, &protocol.Request{Op: protocol.OpPause, X: d})
		return false, err
	})
	var wantErr error
	if !public {
		wantErr = ErrInvalidArgument
	}
	r.wantErr(what, err, wantErr)
	r.check(what, before, err)
	if err != nil {
		if r.sides[0].paused != p0[0] {
			r.fail("%s failed, yet the Paused hook was called", what)
		}
		return
	}
	if r.sides[0].paused != p0[0]+1 || r.sides[1].paused != p0[1]+1 {
		r.fail("%s: the Paused hook was called %d and %d times, want once", what, r.sides[0].paused-p0[0],
			r.sides[1].paused-p0[1])
	}
	r.noteEnd(r.nowUS() + d) // the pause's end, checked by Inspect's PausedFor
	if r.ref != nil {
		r.ref.pause(r.nowUS(), d)
	}
}

func (r *fuzzRun) resume() {
	what := "Resume"
	before := r.before(what)
	_, err := both(r, what, func(s *fuzzSide) (bool, error) {
		ctx, cancel := fuzzCtx()
		defer cancel()
		return false, s.l.Resume(ctx)
	})
	r.wantErr(what, err, nil)
	r.check(what, before, err)
	if err == nil && r.ref != nil {
		r.ref.resume()
	}
}

// override sets an override the input picks: a count of limits (0 and one more than
// the limiter has are refused), each a rate and burst from the tables, its period the
// limit's or (refused) another, and a length.
func (r *fuzzRun) override(rd *fuzzReader) {
	cnt := int(rd.byte()) % (len(r.limits) + 2)
	var lims []Limit
	for i := 0; i < cnt; i++ {
		l := Limit{Rate: pick(rd, fuzzRates), Burst: pick(rd, fuzzBursts)}
		if rd.byte()%8 == 7 && i < len(r.limits) {
			l.Period = r.limits[i].Period + time.Microsecond
		}
		lims = append(lims, l)
	}
	ds := []time.Duration{time.Second, 0, time.Millisecond, time.Microsecond, 100 * time.Millisecond, time.Hour,
		maxPeriodUS * time.Microsecond, -1, micros(r.lastW), micros(r.lastR + 1)}
	d := pick(rd, ds)
	what := fmt.Sprintf("Override(%v, %v)", d, lims)
	before := r.before(what)
	_, err := both(r, what, func(s *fuzzSide) (bool, error) {
		ctx, cancel := fuzzCtx()
		defer cancel()
		return false, s.l.Override(ctx, d, lims...)
	})
	var wantErr error
	switch {
	case d < 0, cnt == 0, cnt > len(r.limits):
		wantErr = ErrInvalidArgument
	default:
		for i, l := range lims {
			if l.Period != 0 && l.Period != r.limits[i].Period {
				wantErr = ErrInvalidLimit
				break
			}
			l.Period = r.limits[i].Period
			if limitFault(r.alg, l) != "" {
				wantErr = ErrInvalidLimit
				break
			}
		}
	}
	r.wantErr(what, err, wantErr)
	r.check(what, before, err)
	if err != nil {
		return
	}
	now, x := r.nowUS(), min(ceilMicros(d), maxPeriodUS)
	var rates [][2]int
	for _, l := range lims {
		rates = append(rates, [2]int{l.Rate, l.Burst})
	}
	end := now + x
	if x == 0 {
		end = now + maxPeriodUS
	}
	r.over = &fuzzOverride{end: end, rates: rates}
	r.overridden = true
	r.noteEnd(end)
	if r.ref != nil {
		r.ref.override(now, x, rates)
		r.checkTTL(what)
	}
	if o := r.oracle; o != nil {
		o.set(r.now, inForce(r.alg, r.limits, r.over, now)[0])
		o.over = r.over
		r.oracleTokens(what)
	}
}

func (r *fuzzRun) clearOverride() {
	what := "ClearOverride"
	before := r.before(what)
	_, err := both(r, what, func(s *fuzzSide) (bool, error) {
		ctx, cancel := fuzzCtx()
		defer cancel()
		return false, s.l.ClearOverride(ctx)
	})
	r.wantErr(what, err, nil)
	r.check(what, before, err)
	if err != nil {
		return
	}
	r.over = nil
	if r.ref != nil {
		r.ref.override(r.nowUS(), 0, nil)
		r.checkTTL(what)
	}
	if o := r.oracle; o != nil {
		o.set(r.now, o.given)
		o.over = nil
		r.oracleTokens(what)
	}
}

// fuzzState is a LimiterState as compared: a string (it holds a slice), TTL aside.
func fuzzState(st LimiterState) string {
	st.TTL = 0
	return fmt.Sprintf("%+v", st)
}

func (r *fuzzRun) inspect() {
	what := "Inspect"
	before := r.before(what)
	ttls := [2]time.Duration{}
	i := 0
	got, err := both(r, what, func(s *fuzzSide) (string, error) {
		ctx, cancel := fuzzCtx()
		defer cancel()
		st, err := s.l.Inspect(ctx)
		ttls[i] = st.TTL
		i++
		return fuzzState(st), err
	})
	r.wantErr(what, err, nil)
	r.check(what, before, err)
	if err != nil {
		return
	}
	// a TTL under 1ms reads 0, the real server's are stretched (Sync): only a key without
	// one is wrong, unless it is foreign content
	if (ttls[0] < 0 || ttls[1] < 0) && !r.lenient {
		r.fail("%s: TTL %v on miniredis, %v on redis", what, ttls[0], ttls[1])
	}
	if r.ref != nil {
		if want := fuzzState(r.ref.inspect(r.nowUS())); got != want {
			r.fail("%s at t0+%v:\n got %s\nwant %s", what, r.now.Sub(redistest.Epoch), got, want)
		}
		r.checkTTL(what)
	}
}

func (r *fuzzRun) noteReset(d time.Duration) {
	r.noteEnd(r.nowUS() + int64(d/time.Microsecond))
}

func (r *fuzzRun) noteEnd(at int64) { r.horizon = max(r.horizon, at) }

// check runs after every call: both servers hold the same state; a failed call
// changed nothing; every key holds a TTL (or is foreign content no call touched), and
// miniredis holds no key but those tracked and the key's record.
func (r *fuzzRun) check(what string, before redistest.Snapshot, err error) {
	r.t.Helper()
	after := r.pair.Compare(r.t, what)
	if err != nil && before != nil {
		for k, s := range after {
			if b := before[k]; !s.Same(b) || s.TTL != b.TTL {
				r.fail("%s failed (%v) but changed %q:\n  before %v\n  after  %v", what, err, k, b, s)
			}
		}
	}
	for k, s := range after {
		if s.Type == "none" || s.TTL >= 0 {
			continue
		}
		if r.foreign[k] && s.Same(r.initial[k]) {
			continue // foreign content left as it was
		}
		r.fail("%s: key %q has no TTL: %v", what, k, s)
	}
	for _, k := range r.pair.MiniKeys() {
		if !slices.Contains(r.pair.Keys(), k) {
			r.fail("%s: wrote key %q, not one of the limiter's", what, k)
		}
	}
	if s := r.sides; s[0] != nil && s[0].l != nil {
		if s[0].lost != s[1].lost {
			r.fail("%s: StateLost called %d times on miniredis, %d on redis", what, s[0].lost, s[1].lost)
		}
		if s[0].lost > 0 && !r.mayLose && !r.lenient && !r.overridden {
			r.fail("%s: StateLost called, yet the state holds every permit granted", what)
		}
	}
}

// checkTTL fails unless the state's TTL lasts as long as the model says the state is
// needed and, but for the fixed window (whose state lasts to the end of its longest
// window), no longer (PTTL reads whole milliseconds, rounded down; TTLs are set in
// whole milliseconds, rounded up).
func (r *fuzzRun) checkTTL(what string) {
	r.t.Helper()
	st := r.pair.Compare(r.t, what)[r.state]
	need := micros(r.needed(r.nowUS()))
	r.noteEnd(r.nowUS() + int64(need/time.Microsecond))
	if st.Type == "none" {
		if need > 0 {
			r.fail("%s: no state, yet it is needed for %v", what, need)
		}
		return
	}
	if st.TTL+time.Millisecond < need {
		r.fail("%s: state TTL %v, needed for %v", what, st.TTL, need)
	}
	if r.alg != FixedWindow && st.TTL > need+time.Millisecond {
		r.fail("%s: state TTL %v, only needed for %v", what, st.TTL, need)
	}
}

// finish moves the clock past the latest time any key was needed until (plus the
// millisecond TTLs round up to): every key must be gone.
func (r *fuzzRun) finish() {
	if r.lenient {
		return
	}
	end := max(r.nowUS(), r.horizon) + 1000
	r.now = time.UnixMicro(end)
	r.note("t0+%v (every key's end)", r.now.Sub(redistest.Epoch))
	r.pair.Mini.Mini.SetTime(r.now)
	var left []string
	for _, k := range r.pair.MiniKeys() {
		if !strings.HasSuffix(k, ":clock") {
			left = append(left, k)
		}
	}
	if len(left) > 0 {
		r.fail("keys left after every TTL should have passed: %q (%v)", left, r.pair.Mini.Mini.TTL(left[0]))
	}
}

func redisZ(words []string) []redis.Z {
	var out []redis.Z
	for i, w := range words {
		out = append(out, redis.Z{Score: float64(i), Member: w})
	}
	return out
}

func toAnySlice(v []string) []any {
	out := make([]any, len(v))
	for i, s := range v {
		out[i] = s
	}
	return out
}
