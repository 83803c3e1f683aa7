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
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"
)

// Fuzz targets for the limiter scripts, one per algorithm: each input is a limit
// configuration, a key, some foreign content and a program of calls (acquire now,
// book ahead, cancel, read, pause, time passing, the state key vanishing) run through
// the Limiter on miniredis and on a real redis-server side by side
// (redistest.Pair), on a clock the input moves. Properties, checked after every call:
//   - no panic, no hang (every call has a deadline), and no error but the package's
//     sentinels: bad input (a limit, n, maxWait, a cancel's token or the pause length
//     out of range, foreign state) gets its typed error and changes nothing;
//   - both servers give the same answer and hold the same state;
//   - every key the call wrote has a TTL, the state's TTL lasts as long as the state
//     is needed (ResetAfter) and, at the end, every key is gone once the longest of
//     them has passed;
//   - valid input gets the answer of the reference model (model in
//     refmodel_window_test.go for the log and window algorithms; bucketModel in
//     refmodel_bucket_test.go and, while it applies, x/time/rate for the token bucket).
// Seeds are in testdata/fuzz (written from fuzzseeds_test.go). CI runs each target
// for a short while; see .ci/run.

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
	prestate int    // foreign content put in a key before the first call (see prestates)
	longKey  bool   // the key is repeated to about 10kB
	wantErr  error  // the sentinel New must return, or nil
	why      string // why the configuration is invalid
}

func decodeConfig(alg Algorithm, cfg []byte) fuzzConfig {
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
	c.prestate = int(flags % 32)
	c.longKey = flags >= 250
	for i := 0; i < m; i++ {
		c.limits = append(c.limits, Limit{Rate: pick(r, fuzzRates), Period: pick(r, fuzzPeriods), Burst: pick(r, fuzzBursts)})
	}
	// what New must answer, in the order it checks: options, the number of limits,
	// each limit against the bounds Limit documents (checked here independently)
	switch {
	case c.buckets < 1 || c.buckets > 10000:
		c.wantErr, c.why = ErrInvalidArgument, "buckets"
		return c
	case m > 16:
		c.wantErr, c.why = ErrInvalidArgument, "17 limits"
		return c
	}
	for _, l := range c.limits {
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
			c.wantErr, c.why = ErrInvalidLimit, "rate"
		case l.Period <= 0 || p > maxPeriodUS:
			c.wantErr, c.why = ErrInvalidLimit, "period"
		case l.Burst < 0 || l.Burst > maxRate:
			c.wantErr, c.why = ErrInvalidLimit, "burst"
		case alg == TokenBucket && float64(b)*float64(p) > float64(maxBucketUS):
			c.wantErr, c.why = ErrInvalidLimit, "burst x period"
		default:
			continue
		}
		return c
	}
	return c
}

// Foreign content put in a key before the first call (prestate % len; most inputs
// choose none).
var prestates = []string{"none", "hash in state", "set in state", "zset in state", "junk string in state",
	"junk list in state", "junk string in pause", "hash in pause", "list in pause", "junk string with TTL in state"}

// fuzzClock is the Go clock of the fuzzed limiters: it stands at the input's time.
type fuzzClock struct{ now *time.Time }

func (c fuzzClock) Now() time.Time                       { return *c.now }
func (c fuzzClock) NewTimer(d time.Duration) clock.Timer { return clock.System.NewTimer(d) }

// fuzzSide is one server's limiter and what its hooks saw.
type fuzzSide struct {
	name      string
	l         *Limiter
	cancelled int
	lost      int
}

// booking is a reservation made ahead and still held.
type booking struct {
	n     int
	token int64 // server time it takes effect, µs
	due   int64
	res   [2]*waiter.Reservation
}

// fuzzRef is the reference model an input is checked against.
type fuzzRef interface {
	allow(now int64, n int, maxWait int64) (Result, int64, int64) // reply, wait, token
	cancel(now, token int64, n int) (bool, time.Duration)
	pause(now, d int64) int64
	evict()
}

type logRef struct{ *model }

func (r logRef) allow(now int64, n int, maxWait int64) (Result, int64, int64) {
	res, t := r.model.allow(now, n, maxWait)
	if !res.Allowed {
		return res, int64(res.RetryAfter / time.Microsecond), 0
	}
	if n == 0 {
		return res, 0, 0
	}
	return res, t - now, t
}

func (r logRef) cancel(now, token int64, n int) (bool, time.Duration) {
	freed := r.model.cancel(now, token, n)
	return freed, r.model.reset(now)
}

func (r logRef) evict() {
	r.grants, r.back, r.latest = nil, nil, 0
}

// errClass names the sentinel an error wraps; anything else is "unexpected".
func errClass(err error) string {
	for _, s := range []error{ErrInvalidArgument, ErrExceedsLimit, ErrInvalidLimit, ErrInvalidKey, ErrCorruptState} {
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
	t       *testing.T
	name    string // what is fuzzed
	alg     Algorithm
	lenient bool // keys hold foreign content: no model, ErrCorruptState is fine
	pair    *redistest.Pair
	sides   [2]*fuzzSide
	now     time.Time
	clock   string // the hash tag whose clock key the scripts read
	state   string // state key
	pausek  string
	ref     fuzzRef // nil: no model (foreign content, or the model cannot follow)
	oracle  *rate.Limiter
	trace   []string
	horizon int64 // the latest time any key is needed until, µs
	mayLose bool  // the state lost permits (deleted, or a confused cancel): StateLost may be called
	lastW   int64 // the last wait and reset seen, µs, for time steps that hit them
	lastR   int64
	books   []booking
	foreign map[string]bool // keys holding foreign content the scripts may leave
	initial redistest.Snapshot
	maxN    int
	scriptN int // the largest n the script takes (min rate, or min burst)
}

func (r *fuzzRun) fail(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf("%s\n%s\nafter: %s", r.name, fmt.Sprintf(format, args...), strings.Join(r.trace, "\n  "))
}

func (r *fuzzRun) nowUS() int64 { return r.now.UnixMicro() }

func runLimiterInput(t *testing.T, alg Algorithm, cfg []byte, key, junk string, ops []byte) {
	c := decodeConfig(alg, cfg)
	if c.longKey && key != "" {
		key = strings.Repeat(key, 10_000/len(key)+1)
	}
	pair := redistest.NewPair(t)
	r := &fuzzRun{t: t, name: alg.String(), alg: alg, pair: pair, now: redistest.Epoch, foreign: map[string]bool{}}
	r.trace = append(r.trace, fmt.Sprintf("config %v buckets %d prestate %q key %q (%d bytes)",
		c.limits, c.buckets, prestates[c.prestate%len(prestates)], trunc(key), len(key)))

	// the key's hash tag, as the scripts (and the fake clock) find it: up to the first '}'
	tag := "{" + pair.Mini.Prefix + key
	if i := strings.IndexByte(key, '}'); i >= 0 {
		tag = "{" + pair.Mini.Prefix + key[:i]
	}
	r.clock = tag + "}"
	r.state = "{" + pair.Mini.Prefix + key + "}:" + alg.algo().suffix
	r.pausek = "{" + pair.Mini.Prefix + key + "}:pause"
	pair.Track(r.state, r.pausek)
	pair.SetTime(t, r.now, r.clock)

	for i, b := range []*redistest.Backend{pair.Mini, pair.Real} {
		s := &fuzzSide{name: string(b.Kind)}
		hooks := Hooks{Cancelled: func(string, int) { s.cancelled++ }, StateLost: func(string) { s.lost++ }}
		var opts []Option
		if len(c.limits) > 1 {
			opts = append(opts, WithLimits(c.limits[1:]...))
		}
		opts = append(opts, WithAlgorithm(alg), WithBuckets(c.buckets), WithKeyPrefix(b.Prefix),
			withClock(fuzzClock{&r.now}), WithHooks(hooks))
		var first Limit
		if len(c.limits) > 0 {
			first = c.limits[0]
		}
		l, err := New(b.Client, key, first, opts...)
		if err == nil && b.Real() {
			l.script = fakeClock[alg]
		}
		want := c.wantErr
		if want == nil && key == "" {
			want, c.why = ErrInvalidKey, "empty key"
		}
		if want != nil {
			// with more than one thing wrong, New may name any of them: an empty key
			// is checked with the client and options, before the limits
			if !errors.Is(err, want) && !(key == "" && errors.Is(err, ErrInvalidKey)) {
				r.fail("New (%s): %v, want an error wrapping %v", c.why, err, want)
			}
			if keys := pair.MiniKeys(); len(keys) != 1 { // the clock key
				r.fail("New failed, yet keys were written: %q", keys)
			}
			return
		}
		if err != nil {
			r.fail("New: %v, want no error", err)
		}
		s.l = l
		r.sides[i] = s
	}
	r.maxN = r.sides[0].l.maxN
	r.scriptN = r.maxN

	// foreign content, the same on both servers
	if p := c.prestate % len(prestates); p != 0 {
		r.prestate(p, junk)
	} else {
		switch alg {
		case TokenBucket:
			r.ref = newBucketModel(c.limits)
			if l := c.limits[0]; len(c.limits) == 1 && l.periodMicros() >= 1000 && l.Rate <= 1_000_000 && l.burst() <= 1_000_000 {
				r.oracle = rate.NewLimiter(rate.Limit(float64(l.Rate)/l.Period.Seconds()), l.burst())
			}
		default:
			r.ref = logRef{newModel(alg, c.limits, c.buckets)}
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

const fuzzHang = 30 * time.Second

func trunc(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// prestate puts foreign content in the state or the pause key of both servers.
func (r *fuzzRun) prestate(p int, junk string) {
	ctx := context.Background()
	words := strings.Fields(junk)
	if len(words) == 0 {
		words = []string{junk}
	}
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
		case "junk string in pause":
			err = c.Set(ctx, r.pausek, junk, 0).Err()
		case "hash in pause":
			err = c.HSet(ctx, r.pausek, "f", junk).Err()
		case "list in pause":
			err = c.RPush(ctx, r.pausek, toAnySlice(words)...).Err()
		case "junk string with TTL in state":
			err = c.Set(ctx, r.state, junk, time.Hour).Err()
		}
		if err != nil {
			r.fail("prestate %s: %v", prestates[p], err)
		}
	}
	r.lenient = true
	r.foreign[r.state] = strings.Contains(prestates[p], "state")
	r.foreign[r.pausek] = strings.Contains(prestates[p], "pause")
	r.initial = r.pair.Compare(r.t, "foreign content")
}

// corrupt overwrites part of the state (or the pause) in place, keeping its TTL, as a
// foreign writer could: a list element, or the whole string. From then on there is no
// model, and calls must either work or fail with ErrCorruptState changing nothing.
func (r *fuzzRun) corrupt(b byte) {
	ctx := context.Background()
	r.pair.Sync(r.t)
	snap := r.pair.Compare(r.t, "corrupt")
	key := r.state
	if b%3 == 2 {
		key = r.pausek
	}
	junk := []string{"x", "-1", "1.5", "", "99999999999999999999", "1e3", " 1"}[int(b/3)%7]
	s := snap[key]
	r.trace = append(r.trace, fmt.Sprintf("corrupt %s (%s) with %q", key, s.Type, junk))
	for _, bk := range []*redistest.Backend{r.pair.Mini, r.pair.Real} {
		var err error
		switch s.Type {
		case "none":
			return
		case "list":
			err = bk.Client.LSet(ctx, key, int64(int(b)%len(s.Value)), junk).Err()
		case "string":
			err = bk.Client.SetArgs(ctx, key, junk, redis.SetArgs{KeepTTL: true}).Err()
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
	switch op := rd.byte() % 12; op {
	case 0, 1, 2: // time passes
		var pmax, emin int64 = 0, math.MaxInt64
		for _, l := range r.sides[0].l.limits {
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
		r.trace = append(r.trace, "evict state key")
		r.pair.Sync(r.t)
		for _, b := range []*redistest.Backend{r.pair.Mini, r.pair.Real} {
			b.Client.Del(context.Background(), r.state)
		}
		r.mayLose = true
		r.oracle = nil
		if r.ref != nil {
			r.ref.evict()
		}
		r.check("evict", nil, nil)

	}
}

func (r *fuzzRun) pickN(rd *fuzzReader) int {
	ns := []int{1, 1, 2, 3, 0, r.maxN, r.maxN - 1, r.maxN + 1, -1, 1 << 40}
	n := pick(rd, ns)
	return n
}

func (r *fuzzRun) advance(d int64) {
	r.now = r.now.Add(time.Duration(d) * time.Microsecond)
	r.trace = append(r.trace, fmt.Sprintf("t0+%v", r.now.Sub(redistest.Epoch)))
	r.pair.SetTime(r.t, r.now, r.clock)
}

// ctx bounds every call: a script that does not return within it hangs.
func fuzzCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

// both runs f on each server and checks the answers agree; it returns the first.
func both[T comparable](r *fuzzRun, what string, f func(s *fuzzSide) (T, error)) (T, error) {
	r.t.Helper()
	var out [2]T
	var errs [2]error
	for i, s := range r.sides {
		start := time.Now()
		out[i], errs[i] = f(s)
		if d := time.Since(start); d > 5*time.Second {
			r.fail("%s on %s took %v", what, s.name, d)
		}
	}
	if c0, c1 := errClass(errs[0]), errClass(errs[1]); c0 != c1 || out[0] != out[1] {
		r.fail("%s: miniredis %+v %v, redis %+v %v", what, out[0], errs[0], out[1], errs[1])
	}
	if c := errClass(errs[0]); strings.HasPrefix(c, "unexpected") {
		r.fail("%s: %v", what, errs[0])
	}
	return out[0], errs[0]
}

func (r *fuzzRun) allow(n int) {
	what := fmt.Sprintf("AllowN(%d)", n)
	r.trace = append(r.trace, what)
	before := r.pair.Sync(r.t)
	got, err := both(r, what, func(s *fuzzSide) (Result, error) {
		ctx, cancel := fuzzCtx()
		defer cancel()
		return s.l.AllowN(ctx, n)
	})
	wantIn := r.inputErr(n)
	r.wantErr(what, err, wantIn)
	r.check(what, before, err)
	if err != nil || wantIn != nil {
		return
	}
	r.lastW, r.lastR = int64(got.RetryAfter/time.Microsecond), int64(got.ResetAfter/time.Microsecond)
	r.checkTTL(what, got.ResetAfter)
	r.noteReset(got.ResetAfter)
	if r.oracle != nil {
		r.checkOracle(n, got)
	}
	if r.ref != nil {
		want, _, _ := r.ref.allow(r.nowUS(), n, 0)
		if got != want {
			r.fail("%s at t0+%v: got %+v, want %+v", what, r.now.Sub(redistest.Epoch), got, want)
		}
	}
}

// wantErr fails unless err wraps want; with want nil, err must be nil, or wrap
// ErrCorruptState when a key holds foreign content.
func (r *fuzzRun) wantErr(what string, err, want error) {
	r.t.Helper()
	switch {
	case want != nil && errors.Is(err, want):
	case want == nil && err == nil:
	case want == nil && r.lenient && errors.Is(err, ErrCorruptState):
	default:
		r.fail("%s: %v, want %v", what, err, want)
	}
}

// inputErr is the error Go must return for n before calling Redis, or nil.
func (r *fuzzRun) inputErr(n int) error {
	switch {
	case n < 0:
		return ErrInvalidArgument
	case n > r.maxN:
		return ErrExceedsLimit
	}
	return nil
}

// checkOracle compares an AllowN with x/time/rate, away from exact boundaries (it
// computes in floats).
func (r *fuzzRun) checkOracle(n int, got Result) {
	tokens := r.oracle.TokensAt(r.now)
	if math.Abs(tokens-float64(n)) < 1e-6*max(1, float64(n)) {
		r.oracle = nil // on a boundary: float rounding may decide either way
		return
	}
	want := r.oracle.AllowN(r.now, n)
	if got.Allowed != want {
		r.fail("AllowN(%d): allowed %v, x/time/rate says %v (tokens %.9f)", n, got.Allowed, want, tokens)
	}
}

func (r *fuzzRun) reserve(n int, maxWait time.Duration) {
	what := fmt.Sprintf("Reserve(%d, %v)", n, maxWait)
	r.trace = append(r.trace, what)
	before := r.pair.Sync(r.t)
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
	wantIn := r.inputErr(n)
	if wantIn == nil && maxWait < 0 {
		wantIn = ErrInvalidArgument
	}
	r.wantErr(what, err, wantIn)
	r.check(what, before, err)
	if err != nil || wantIn != nil {
		return
	}
	r.oracle = nil // x/time/rate has no booking bounded by maxWait
	wait := int64(got.delay / time.Microsecond)
	r.lastW = wait
	now := r.nowUS()
	if got.ok && wait > 0 {
		r.books = append(r.books, booking{n: n, token: now + wait, due: now + wait, res: res})
		r.noteEnd(now + wait)
	}
	if r.ref != nil {
		x := min(int64(maxWait/time.Microsecond), maxWaitMicros)
		want, wantWait, _ := r.ref.allow(now, n, x)
		if got.ok != want.Allowed || wait != wantWait {
			r.fail("%s at t0+%v: got OK %v delay %v, want OK %v delay %v (%+v)", what, r.now.Sub(redistest.Epoch),
				got.ok, got.delay, want.Allowed, time.Duration(wantWait)*time.Microsecond, want)
		}
		r.noteReset(want.ResetAfter)
	}
}

// cancel gives a booking back: through its Reservation, or by a raw cancel call with
// the token or n altered (what a confused caller could send).
func (r *fuzzRun) cancel(rd *fuzzReader) {
	mode, j := rd.byte()%6, int(rd.byte())
	if len(r.books) == 0 {
		mode = 5
	}
	var b booking
	if len(r.books) > 0 {
		j %= len(r.books)
		b = r.books[j]
		if mode < 3 {
			r.books = slices.Delete(r.books, j, j+1)
		}
	}
	now := r.nowUS()
	if mode < 3 {
		what := fmt.Sprintf("Reservation.Cancel (n=%d at t0+%v)", b.n, time.Duration(b.token-redistest.Epoch.UnixMicro())*time.Microsecond)
		r.trace = append(r.trace, what)
		before := r.pair.Sync(r.t)
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
		if freed[0] != freed[1] {
			r.fail("%s: freed on miniredis %v, on redis %v", what, freed[0], freed[1])
		}
		if r.ref != nil && now < b.due {
			want, _ := r.ref.cancel(now, b.token, b.n)
			if freed[0] != want {
				r.fail("%s at t0+%v: freed %v, want %v", what, r.now.Sub(redistest.Epoch), freed[0], want)
			}
		} else if freed[0] && now >= b.due {
			r.fail("%s after it took effect gave permits back", what)
		}
		return
	}
	// a raw cancel: token or n altered, or made up
	n, token := b.n, b.token
	switch mode {
	case 3:
		token += []int64{1, -1}[rd.byte()%2]
	case 4:
		n = pick(rd, []int{0, n + 1, r.scriptN, r.scriptN + 1, -1, 1 << 50})
	case 5:
		n = pick(rd, []int{1, 2, r.scriptN})
		token = pick(rd, []int64{0, now, now + 1, now + 1_000_000, 1<<53 - 1, 1 << 53, -1})
	}
	what := fmt.Sprintf("cancel(n=%d, token=t0%+d)", n, token-redistest.Epoch.UnixMicro())
	r.trace = append(r.trace, what)
	before := r.pair.Sync(r.t)
	got, err := both(r, what, func(s *fuzzSide) (reply, error) {
		ctx, cancel := fuzzCtx()
		defer cancel()
		return s.l.call(ctx, opCancel, n, token)
	})
	var wantErr error
	if n < 0 || n > r.scriptN || token < 0 || token > maxWaitMicros {
		wantErr = ErrInvalidArgument
	}
	r.wantErr(what, err, wantErr)
	r.check(what, before, err)
	if err != nil {
		return
	}
	r.checkTTL(what, got.reset)
	r.noteReset(got.reset)
	if got.granted && (mode != 4 || n > b.n) {
		r.mayLose = true // gave back permits nobody booked at that time, or more than booked
	}
	if got.remaining != 0 || got.wait != 0 || got.token != 0 {
		r.fail("%s: reply %+v, want {freed, 0, 0, reset, 0}", what, got)
	}
	if r.ref != nil {
		freed, reset := r.ref.cancel(now, token, n)
		if got.granted != freed || got.reset != reset {
			r.fail("%s at t0+%v: freed %v reset %v, want freed %v reset %v", what, r.now.Sub(redistest.Epoch),
				got.granted, got.reset, freed, reset)
		}
	}
}

func (r *fuzzRun) pause(d int64) {
	what := fmt.Sprintf("pause(%dµs)", d)
	r.trace = append(r.trace, what)
	before := r.pair.Sync(r.t)
	got, err := both(r, what, func(s *fuzzSide) (int64, error) {
		ctx, cancel := fuzzCtx()
		defer cancel()
		script := lua.Pause.Script()
		if s.name != string(redistest.Mini) {
			script = fakePause
		}
		v, err := script.Run(ctx, s.l.rdb, []string{r.pausek}, d).Int64()
		if err != nil {
			err = scriptError(ctx, "fuzz", err)
		}
		return v, err
	})
	var wantErr error
	if d < 1 || d > maxPeriodUS {
		wantErr = ErrInvalidArgument
	}
	r.wantErr(what, err, wantErr)
	r.check(what, before, err)
	if err != nil {
		return
	}
	r.oracle = nil
	r.noteEnd(r.nowUS() + got)
	if r.ref != nil {
		if want := r.ref.pause(r.nowUS(), d); got != want {
			r.fail("%s: ends in %dµs, want %dµs", what, got, want)
		}
	}
}

func (r *fuzzRun) noteReset(d time.Duration) {
	r.noteEnd(r.nowUS() + int64(d/time.Microsecond))
}

func (r *fuzzRun) noteEnd(at int64) { r.horizon = max(r.horizon, at) }

// check runs after every call: both servers hold the same state; a failed call
// changed nothing; every key holds a TTL (or is foreign content no call touched), and
// miniredis holds no key but those tracked.
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
		if strings.HasSuffix(k, "}:conf") { // the key's record (record.go): not state, but with a TTL
			if r.pair.Mini.Mini.TTL(k) <= 0 {
				r.fail("%s: the key's record %q has no TTL", what, k)
			}
			continue
		}
		if !slices.Contains(r.pair.Keys(), k) {
			r.fail("%s: wrote key %q, not one of the limiter's", what, k)
		}
	}
	if s := r.sides; s[0] != nil && s[0].l != nil {
		if s[0].lost != s[1].lost {
			r.fail("%s: StateLost called %d times on miniredis, %d on redis", what, s[0].lost, s[1].lost)
		}
		if s[0].lost > 0 && !r.mayLose && !r.lenient {
			r.fail("%s: StateLost called, yet the state holds every permit granted", what)
		}
	}
}

// checkTTL fails unless the state's TTL lasts as long as a reply said the state is
// needed (reset), and, but for the fixed window (whose reset leaves out windows a
// cancel emptied), no longer.
func (r *fuzzRun) checkTTL(what string, reset time.Duration) {
	r.t.Helper()
	if r.ref == nil {
		return
	}
	st := r.pair.Compare(r.t, what)[r.state]
	if st.Type == "none" {
		if reset > time.Millisecond {
			r.fail("%s: no state, yet reset %v", what, reset)
		}
		return
	}
	if st.TTL+time.Millisecond < reset { // PTTL reads whole milliseconds, rounded down
		r.fail("%s: state TTL %v, needed for %v", what, st.TTL, reset)
	}
	if r.alg != FixedWindow && st.TTL > reset+time.Millisecond {
		r.fail("%s: state TTL %v, only needed for %v", what, st.TTL, reset)
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
	r.trace = append(r.trace, fmt.Sprintf("t0+%v (every key's end)", r.now.Sub(redistest.Epoch)))
	r.pair.Mini.Mini.SetTime(r.now)
	var left []string
	for _, k := range r.pair.MiniKeys() {
		if !strings.HasSuffix(k, ":clock") && !strings.HasSuffix(k, "}:conf") { // the record lives its own TTL (checked in check)
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
