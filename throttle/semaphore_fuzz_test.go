package throttle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// FuzzSemaphore runs programs of semaphore script calls (acquire with or without a
// place in the queue, extend, release, for several holders' tokens and places, the
// caller's own or a task's, odd ones among them, and several max and TTL values; Inspect;
// pause and resume; time passing; a key vanishing or getting a foreign member) on
// miniredis and a real redis-server side by side, after foreign content in any of its
// keys, and checks them as the limiter targets do (see limiter_fuzz_test.go) against semModel,
// the script's rules in plain Go (refmodel_semaphore_test.go).
func FuzzSemaphore(f *testing.F) {
	noteMissingServers(f, "every input is skipped (each runs on miniredis and a real redis-server side by side)", redistest.Standalone)
	f.Fuzz(func(t *testing.T, cfg []byte, key, junk string, ops []byte) {
		runSemaphoreInput(t, cfg, key, junk, ops)
	})
}

var (
	fuzzMaxes = []int{1, 2, 3, 5, maxRate, 0, -1, maxRate + 1}
	fuzzTTLs  = []time.Duration{time.Millisecond, time.Second, 30 * time.Second, 1500 * time.Microsecond,
		maxPeriodUS * time.Microsecond, 999 * time.Microsecond, (maxPeriodUS + 1) * time.Microsecond, 0}
	// holders' tokens: four good ones, then ones the script must refuse
	fuzzTokens = []string{"0123456789abcdef0123456789abcdef", "ffffffffffffffffffffffffffffffff",
		"00000000000000000000000000000001", "a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0",
		"", "0123456789ABCDEF0123456789ABCDEF", "0123456789abcdef0123456789abcde", "0123456789abcdef0123456789abcdef0",
		"0123456789abcdef:123456789abcdef", "0123456789abcdeg0123456789abcdef"}
	// places other than the caller's token: tasks' (asynq's are 32 hex digits, like a
	// token; here one is another holder's token), ids at the edges of what the script
	// takes, then ones it must refuse (and "" for an acquire)
	fuzzPlaces = []string{"5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a", "task:7", "ffffffffffffffffffffffffffffffff", "x",
		strings.Repeat("p", 200), "a:1000000", "", "with space", strings.Repeat("p", 201), "tab\t", "\x7f", "é"}
)

// Foreign content put in a semaphore key before the first call.
var semPrestates = []string{"none", "hash in leases", "string in queue", "junk zset in leases",
	"junk zset in queue", "junk zset in expiries", "junk string in pause", "list in pause"}

// semVariant is one Semaphore on the key: its max and TTL, on each server.
type semVariant struct {
	max  int
	ttl  int64 // µs
	sems [2]*Semaphore
}

type semRun struct {
	*fuzzRun
	variants []*semVariant
	pausers  [2]*Limiter // a Limiter on the same key, for its pause and resume
	keys     []string    // leases, queue, expiries, pause
	sm       *semModel
}

func runSemaphoreInput(t *testing.T, cfg []byte, key, junk string, ops []byte) {
	rc := &fuzzReader{b: cfg}
	nv := 1 + int(rc.byte()%3)
	flags := rc.byte()
	prestate := int(flags) % 16 % len(semPrestates)
	pair := redistest.NewPair(t)
	if flags >= 250 {
		prestate = 0
		if key != "" { // the longest key (flags 255: a byte more)
			n := keys.MaxLen - len(pair.Mini.Prefix)
			if flags == 255 {
				n++
			}
			key = strings.Repeat(key, n/len(key)+1)[:n]
		}
	}
	r := &semRun{fuzzRun: &fuzzRun{t: t, name: "Semaphore", pair: pair, now: redistest.Epoch, foreign: map[string]bool{}}}
	setGoClock(t, fuzzGoClock{&r.now})
	tag := "{" + pair.Mini.Prefix + key + "}"
	r.clock = tag
	if i := strings.IndexByte(key, '}'); i >= 0 {
		r.clock = "{" + pair.Mini.Prefix + key[:i] + "}"
	}
	r.keys = []string{keys.Name(tag, keys.Leases), keys.Name(tag, keys.Queue), keys.Name(tag, keys.QueueExpiry),
		keys.Name(tag, keys.State)}
	pair.Track(r.keys...)
	pair.SetTime(t, r.now, r.clock)
	r.note("key %q (%d bytes), prestate %q", trunc(key), len(key), semPrestates[prestate])

	for v := 0; v < nv; v++ {
		max, ttl := pick(rc, fuzzMaxes), pick(rc, fuzzTTLs)
		r.note("semaphore %d: max %d, TTL %v", v, max, ttl)
		var want error // in the order NewSemaphore checks
		switch {
		case ttl < time.Millisecond || ceilMicros(ttl) > maxPeriodUS:
			want = ErrInvalidArgument
		case key == "" || len(pair.Mini.Prefix)+len(key) > keys.MaxLen:
			want = ErrInvalidKey
		case max < 1 || max > maxRate:
			want = ErrInvalidLimit
		}
		sv := &semVariant{max: max, ttl: ceilMicros(ttl)}
		for i, b := range []*redistest.Backend{pair.Mini, pair.Real} {
			s, err := NewSemaphore(b.Client, key, max, WithKeyPrefix(b.Prefix), WithLeaseTTL(ttl))
			if want != nil {
				if !errors.Is(err, want) {
					r.fail("NewSemaphore(max %d, TTL %v): %v, want %v", max, ttl, err, want)
				}
				continue
			}
			if err != nil {
				r.fail("NewSemaphore(max %d, TTL %v): %v", max, ttl, err)
			}
			if b.Real() {
				s.useScript(fakeClock[s.t.script])
			}
			sv.sems[i] = s
		}
		if want == nil {
			r.variants = append(r.variants, sv)
		}
	}
	if len(r.variants) == 0 {
		if keys := pair.MiniKeys(); len(keys) != 1 {
			r.fail("NewSemaphore failed, yet keys were written: %q", keys)
		}
		return
	}
	for i, b := range []*redistest.Backend{pair.Mini, pair.Real} {
		l, err := New(b.Client, key, PerSecond(1), WithKeyPrefix(b.Prefix))
		if err != nil {
			r.fail("New (for the key's pause): %v", err)
		}
		if b.Real() {
			l.useScript(fakeClock[l.t.script])
		}
		r.pausers[i] = l
	}
	if prestate != 0 {
		r.semPrestate(prestate, junk)
	} else {
		r.sm = newSemModel()
	}
	defer watchdog(fmt.Sprintf("semaphore %x %q %q %x", cfg, trunc(key), trunc(junk), ops))()
	rd := &fuzzReader{b: ops}
	for step := 0; step < 48 && !rd.done(); step++ {
		r.semStep(rd)
	}
	r.semFinish()
}

func (r *semRun) semPrestate(p int, junk string) {
	ctx := context.Background()
	words := strings.Fields(junk)
	if len(words) == 0 {
		words = []string{junk}
	}
	var zs []redis.Z
	for i, w := range words {
		zs = append(zs, redis.Z{Member: w, Score: float64(redistest.Epoch.UnixMicro()) + float64(i)*1e6 - 2e6})
	}
	for _, b := range []*redistest.Backend{r.pair.Mini, r.pair.Real} {
		c := b.Client
		var err error
		switch semPrestates[p] {
		case "hash in leases":
			err = c.HSet(ctx, r.keys[0], "f", junk).Err()
		case "string in queue":
			err = c.Set(ctx, r.keys[1], junk, 0).Err()
		case "junk zset in leases":
			err = c.ZAdd(ctx, r.keys[0], zs...).Err()
		case "junk zset in queue":
			err = c.ZAdd(ctx, r.keys[1], zs...).Err()
		case "junk zset in expiries":
			err = c.ZAdd(ctx, r.keys[2], zs...).Err()
		case "junk string in pause":
			err = c.Set(ctx, r.keys[3], junk, 0).Err()
		case "list in pause":
			err = c.RPush(ctx, r.keys[3], junk).Err()
		}
		if err != nil {
			r.fail("prestate %s: %v", semPrestates[p], err)
		}
	}
	for _, k := range r.keys {
		r.foreign[k] = true
	}
	r.lenient = true
	r.initial = r.pair.Compare(r.t, "foreign content")
}

// semStep decodes and runs one step of the program.
func (r *semRun) semStep(rd *fuzzReader) {
	switch op := rd.byte() % 12; op {
	case 0, 1: // time passes
		v := r.variants[0]
		d := pick(rd, []int64{0, 1, 999, 1000, 1001, v.ttl, v.ttl - 1, v.ttl + 1, v.ttl / 3, r.lastW, r.lastW - 1, 3_600_000_000})
		if d < 0 || d > 1<<47 {
			d = int64(uint64(d) % (1 << 40))
		}
		r.advance(d)
	case 2, 3, 4, 5, 6, 11:
		v := r.variants[int(rd.byte())%len(r.variants)]
		token := fuzzTokens[int(rd.byte())%len(fuzzTokens)]
		b := rd.byte()
		sop := []int{semAcquire, semAcquire, semExtend, semRelease}[b%4]
		place := token // Acquire's: the caller's own place
		if b >= 4 {
			place = fuzzPlaces[int(b/4-1)%len(fuzzPlaces)]
		}
		r.semCall(v, sop, token, place, rd.byte()%2 == 1)
	case 7:
		r.semPause(pick(rd, []int64{1, 1000, 1_000_000, r.lastW, maxPeriodUS, 0, -1, maxPeriodUS + 1}))
	case 8: // a key vanishes, or gets a foreign member
		k := int(rd.byte()) % 6
		r.pair.Sync(r.t)
		if k >= 3 {
			r.semJunk(k-3, rd.byte())
			return
		}
		r.note("delete %s", r.keys[k])
		for _, b := range []*redistest.Backend{r.pair.Mini, r.pair.Real} {
			b.Client.Del(context.Background(), r.keys[k])
		}
		if r.sm != nil {
			switch k {
			case 0:
				r.sm.leases = map[string]int64{}
			case 1:
				r.sm.queue, r.sm.qExp = nil, 1<<62
			case 2:
				r.sm.lapse = map[string]int64{}
			}
		}
		r.check("delete", nil, nil)
	case 9:
		r.semResume()
	case 10:
		r.semInspect(r.variants[int(rd.byte())%len(r.variants)])
	}
}

// semJunk adds a member the script did not write to one of the sorted sets (keeping
// its TTL), as a foreign writer could; from then on there is no model, and calls must
// either work or fail with ErrCorruptState changing nothing.
func (r *semRun) semJunk(k int, b byte) {
	member := []string{"x", "0123456789abcdef0123456789abcdef:x", "zz:5", "0123456789abcdef0123456789abcdef:0", ""}[int(b)%5]
	score := float64(r.nowUS()) + []float64{-1, 1, 1e6, 0.5}[int(b/5)%4]
	r.note("add %q at %.1f to %s", member, score-float64(r.nowUS()), r.keys[k])
	var wrongType int
	for _, bk := range []*redistest.Backend{r.pair.Mini, r.pair.Real} {
		err := bk.Client.ZAdd(context.Background(), r.keys[k], redis.Z{Member: member, Score: score}).Err()
		switch {
		case err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE"):
			wrongType++ // a prestate already put foreign content of another type there
		case err != nil:
			r.fail("add junk: %v", err)
		}
	}
	switch wrongType {
	case 2:
		r.trace[len(r.trace)-1] += ": WRONGTYPE on both, nothing added"
		return
	case 1:
		r.fail("add junk: WRONGTYPE on one backend only")
	}
	snap := r.pair.Compare(r.t, "add junk")
	if snap[r.keys[k]].TTL < 0 { // a new key: foreign content
		if r.initial == nil {
			r.initial = redistest.Snapshot{}
		}
		r.foreign[r.keys[k]] = true
		r.initial[r.keys[k]] = snap[r.keys[k]]
	}
	r.lenient, r.sm = true, nil
	r.check("add junk", nil, nil)
}

// semArgsErr is the error the script must answer to a request's own arguments, or nil.
func semArgsErr(op int, token, place string, join bool) error {
	bad := len(token) != 32 || strings.Trim(token, "0123456789abcdef") != "" ||
		len(place) > 200 || strings.IndexFunc(place, func(c rune) bool { return c < '!' || c > '~' }) >= 0 ||
		op == semAcquire && place == "" || join && op != semAcquire
	if bad {
		return ErrInvalidArgument
	}
	return nil
}

func (r *semRun) semCall(v *semVariant, op int, token, place string, join bool) {
	what := fmt.Sprintf("%s(token %q, place %q, max %d, TTL %dµs, join %v)", []string{"acquire", "extend", "release"}[op],
		trunc(token), trunc(place), v.max, v.ttl, join)
	r.note("%s", what)
	before := r.pair.Sync(r.t)
	var got [2]semReply
	var errs [2]error
	for i, s := range v.sems {
		ctx, cancel := fuzzCtx()
		got[i], errs[i] = s.call(ctx, op, token, place, join, false)
		cancel()
	}
	if errClass(errs[0]) != errClass(errs[1]) || got[0] != got[1] {
		r.fail("%s: miniredis %+v %v, redis %+v %v", what, got[0], errs[0], got[1], errs[1])
	}
	err := errs[0]
	r.note("  -> %+v %v", got[0], err)
	r.wantErr(what, err, semArgsErr(op, token, place, join))
	r.check(what, before, err)
	if err != nil {
		return
	}
	r.lastW = int64(got[0].wait / time.Microsecond)
	if r.sm == nil {
		return
	}
	want := r.sm.call(r.nowUS(), semOp{op: op, token: token, place: place, max: v.max, ttl: v.ttl, join: join})
	g := [3]int64{0, r.lastW, int64(got[0].held)}
	if got[0].ok {
		g[0] = 1
	}
	if g != want {
		r.fail("%s at t0+%v: got {ok, wait, held} %v, want %v", what, r.now.Sub(redistest.Epoch), g, want)
	}
	r.semTTLs(what)
}

// semTTLs checks each key's TTL on miniredis covers the latest expiry in it, no more.
func (r *semRun) semTTLs(what string) {
	snap := r.pair.Compare(r.t, what)
	leases, queue := r.sm.ends()
	now := r.nowUS()
	for i, end := range []int64{leases, queue, queue} {
		s := snap[r.keys[i]]
		if end <= now {
			if s.Type != "none" && i == 0 {
				r.fail("%s: %s holds %v, the model nothing", what, r.keys[i], s)
			}
			continue
		}
		if s.Type == "none" {
			if i == 0 {
				r.fail("%s: %s is gone, the model holds leases until t0+%v", what, r.keys[i], micros(end-redistest.Epoch.UnixMicro()))
			}
			continue
		}
		need := micros(end - now)
		if s.TTL+time.Millisecond < need || s.TTL > need+time.Millisecond {
			r.fail("%s: %s TTL %v, needed for %v", what, r.keys[i], s.TTL, need)
		}
	}
	r.noteEnd(max(leases, queue))
}

// semPause pauses the key through a Limiter on it: Pause for a length in range, the
// script's own pause op (which must refuse it) for one out of range.
func (r *semRun) semPause(d int64) {
	public := d >= 1 && d <= maxPeriodUS
	what := fmt.Sprintf("pause(%dµs)", d)
	r.note("%s", what)
	before := r.pair.Sync(r.t)
	var errs [2]error
	for i, l := range r.pausers {
		ctx, cancel := fuzzCtx()
		if public {
			errs[i] = l.Pause(ctx, micros(d))
		} else {
			_, errs[i] = l.controlCall(ctx, &protocol.Request{Op: protocol.OpPause, X: d})
		}
		cancel()
	}
	if errClass(errs[0]) != errClass(errs[1]) {
		r.fail("%s: miniredis %v, redis %v", what, errs[0], errs[1])
	}
	var wantErr error
	if !public {
		wantErr = ErrInvalidArgument
	}
	r.wantErr(what, errs[0], wantErr)
	r.check(what, before, errs[0])
	if errs[0] != nil {
		return
	}
	r.noteEnd(r.nowUS() + d)
	if r.sm != nil {
		r.sm.paused = max(r.sm.paused, r.nowUS()+d)
	}
}

func (r *semRun) semResume() {
	what := "Resume"
	r.note("%s", what)
	before := r.pair.Sync(r.t)
	var errs [2]error
	for i, l := range r.pausers {
		ctx, cancel := fuzzCtx()
		errs[i] = l.Resume(ctx)
		cancel()
	}
	if errClass(errs[0]) != errClass(errs[1]) {
		r.fail("%s: miniredis %v, redis %v", what, errs[0], errs[1])
	}
	r.wantErr(what, errs[0], nil)
	r.check(what, before, errs[0])
	if errs[0] == nil && r.sm != nil {
		r.sm.paused = 0
	}
}

func (r *semRun) semInspect(v *semVariant) {
	what := fmt.Sprintf("Inspect (max %d)", v.max)
	r.note("%s", what)
	before := r.pair.Sync(r.t)
	var got [2]SemaphoreState
	var errs [2]error
	for i, s := range v.sems {
		ctx, cancel := fuzzCtx()
		got[i], errs[i] = s.Inspect(ctx)
		cancel()
	}
	ttls := [2]time.Duration{got[0].TTL, got[1].TTL}
	got[0].TTL, got[1].TTL = 0, 0
	g0, g1 := fmt.Sprintf("%+v", got[0]), fmt.Sprintf("%+v", got[1])
	if errClass(errs[0]) != errClass(errs[1]) || g0 != g1 || (ttls[0] < 0 || ttls[1] < 0) && !r.lenient {
		r.fail("%s: miniredis %s (TTL %v) %v, redis %s (TTL %v) %v", what, g0, ttls[0], errs[0], g1, ttls[1], errs[1])
	}
	r.wantErr(what, errs[0], nil)
	r.check(what, before, errs[0])
	for k, s := range r.pair.Compare(r.t, what) { // Inspect writes nothing
		if b := before[k]; !s.Same(b) || s.TTL != b.TTL {
			r.fail("%s changed %q:\n  before %v\n  after  %v", what, k, b, s)
		}
	}
	if errs[0] != nil || r.sm == nil {
		return
	}
	if want := fmt.Sprintf("%+v", r.sm.inspect(r.nowUS(), v.max)); g0 != want {
		r.fail("%s at t0+%v:\n got %s\nwant %s", what, r.now.Sub(redistest.Epoch), g0, want)
	}
}

// semFinish moves the clock past every lease's, place's and pause's end: every key
// must be gone.
func (r *semRun) semFinish() {
	if r.sm == nil {
		return
	}
	r.finish()
}
