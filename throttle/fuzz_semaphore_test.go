package throttle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// FuzzSemaphore runs programs of semaphore script calls (acquire with or without a
// place in the queue, extend, release, for several lease ids, max and TTL values, odd
// ids among them; pauses; time passing; a key vanishing) on miniredis and a real
// redis-server side by side, after foreign content in any of its keys, and checks them
// as the limiter targets do (see fuzz_test.go) against semModel, the script's rules
// in plain Go (refmodel_semaphore_test.go).
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
	// lease ids: four good ones, then ones the script must refuse
	fuzzIDs = []string{"0123456789abcdef0123456789abcdef", "ffffffffffffffffffffffffffffffff",
		"00000000000000000000000000000001", "a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0",
		"", "0123456789ABCDEF0123456789ABCDEF", "0123456789abcdef0123456789abcde", "0123456789abcdef0123456789abcdef0",
		"0123456789abcdef:123456789abcdef", "0123456789abcdeg0123456789abcdef"}
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
	keys     []string // leases, queue, expiries, pause
	sm       *semModel
}

func runSemaphoreInput(t *testing.T, cfg []byte, key, junk string, ops []byte) {
	rc := &fuzzReader{b: cfg}
	nv := 1 + int(rc.byte()%3)
	flags := rc.byte()
	prestate := int(flags) % 16 % len(semPrestates)
	if flags >= 250 && key != "" {
		key = strings.Repeat(key, 10_000/len(key)+1)
	}
	pair := redistest.NewPair(t)
	r := &semRun{fuzzRun: &fuzzRun{t: t, name: "Semaphore", pair: pair, now: redistest.Epoch, foreign: map[string]bool{}}}
	tag := "{" + pair.Mini.Prefix + key + "}"
	r.clock = tag
	if i := strings.IndexByte(key, '}'); i >= 0 {
		r.clock = "{" + pair.Mini.Prefix + key[:i] + "}"
	}
	r.keys = []string{tag + ":sem", tag + ":semq", tag + ":semx", tag + ":pause"}
	pair.Track(r.keys...)
	pair.SetTime(t, r.now, r.clock)
	r.trace = append(r.trace, fmt.Sprintf("key %q (%d bytes), prestate %q", trunc(key), len(key), semPrestates[prestate]))

	for v := 0; v < nv; v++ {
		max, ttl := pick(rc, fuzzMaxes), pick(rc, fuzzTTLs)
		r.trace = append(r.trace, fmt.Sprintf("semaphore %d: max %d, TTL %v", v, max, ttl))
		var want error
		switch {
		case ttl < time.Millisecond || ceilMicrosTest(ttl) > maxPeriodUS:
			want = ErrInvalidArgument
		case max < 1 || max > maxRate:
			want = ErrInvalidLimit
		case key == "":
			want = ErrInvalidKey
		}
		sv := &semVariant{max: max}
		for i, b := range []*redistest.Backend{pair.Mini, pair.Real} {
			s, err := NewSemaphore(b.Client, key, max, WithKeyPrefix(b.Prefix), WithLeaseTTL(ttl))
			if err == nil && b.Real() {
				s.script = fakeSemaphore
			}
			if want != nil {
				if !errors.Is(err, want) {
					r.fail("NewSemaphore(max %d, TTL %v): %v, want %v", max, ttl, err, want)
				}
				continue
			}
			if err != nil {
				r.fail("NewSemaphore(max %d, TTL %v): %v", max, ttl, err)
			}
			sv.sems[i] = s
			sv.ttl = s.ttlUS
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

// ceilMicrosTest rounds d up to whole microseconds, the way the Semaphore must.
func ceilMicrosTest(d time.Duration) int64 {
	us := d / time.Microsecond
	if d%time.Microsecond > 0 {
		us++
	}
	return int64(us)
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

func (r *semRun) semStep(rd *fuzzReader) {
	switch op := rd.byte() % 9; op {
	case 0, 1: // time passes
		v := r.variants[0]
		d := pick(rd, []int64{0, 1, 999, 1000, 1001, v.ttl, v.ttl - 1, v.ttl + 1, v.ttl / 3, r.lastW, r.lastW - 1, 3_600_000_000})
		if d < 0 || d > 1<<47 {
			d = int64(uint64(d) % (1 << 40))
		}
		r.advance(d)
	case 2, 3, 4, 5, 6:
		v := r.variants[int(rd.byte())%len(r.variants)]
		id := fuzzIDs[int(rd.byte())%len(fuzzIDs)]
		sop := []int{semAcquire, semAcquire, semExtend, semRelease}[int(rd.byte())%4]
		r.semCall(v, sop, id, rd.byte()%2 == 1)
	case 7:
		r.semPause(pick(rd, []int64{1, 1000, 1_000_000, r.lastW, maxPeriodUS, 0, -1, maxPeriodUS + 1}))
	case 8: // a key vanishes, or gets a foreign member
		k := int(rd.byte()) % 6
		r.pair.Sync(r.t)
		if k >= 3 {
			r.semJunk(k-3, rd.byte())
			return
		}
		r.trace = append(r.trace, "delete "+r.keys[k])
		for _, b := range []*redistest.Backend{r.pair.Mini, r.pair.Real} {
			b.Client.Del(context.Background(), r.keys[k])
		}
		if r.sm != nil {
			switch k {
			case 0:
				r.sm.leases = map[string]int64{}
			case 1:
				r.sm.queue = nil
			case 2:
				r.sm.lapse = map[string]int64{}
			}
		}
		r.check("delete", nil, nil)
	}
}

// semJunk adds a member the script did not write to one of the sorted sets (keeping
// its TTL), as a foreign writer could; from then on there is no model, and calls must
// either work or fail with ErrCorruptState changing nothing.
func (r *semRun) semJunk(k int, b byte) {
	member := []string{"x", "0123456789abcdef0123456789abcdef:x", "zz:5", "0123456789abcdef0123456789abcdef:0", ""}[int(b)%5]
	score := float64(r.nowUS()) + []float64{-1, 1, 1e6, 0.5}[int(b/5)%4]
	r.trace = append(r.trace, fmt.Sprintf("add %q at %.1f to %s", member, score-float64(r.nowUS()), r.keys[k]))
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

func (r *semRun) semCall(v *semVariant, op int, id string, queue bool) {
	what := fmt.Sprintf("%s(id %q, max %d, TTL %dµs, queue %v)", []string{"acquire", "extend", "release"}[op], id, v.max, v.ttl, queue)
	r.trace = append(r.trace, what)
	before := r.pair.Sync(r.t)
	var got [2]semReply
	var errs [2]error
	for i, s := range v.sems {
		ctx, cancel := fuzzCtx()
		got[i], errs[i] = s.call(ctx, op, id, queue, false)
		cancel()
	}
	if errClass(errs[0]) != errClass(errs[1]) || got[0] != got[1] {
		r.fail("%s: miniredis %+v %v, redis %+v %v", what, got[0], errs[0], got[1], errs[1])
	}
	err := errs[0]
	var wantErr error
	if len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" {
		wantErr = ErrInvalidArgument
	}
	r.wantErr(what, err, wantErr)
	r.check(what, before, err)
	if err != nil {
		return
	}
	r.lastW = int64(got[0].wait / time.Microsecond)
	if r.sm == nil {
		return
	}
	want := r.sm.call(r.nowUS(), op, id, v.max, v.ttl, queue)
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
				r.fail("%s: %s is gone, the model holds leases until t0+%v", what, r.keys[i], time.Duration(end-redistest.Epoch.UnixMicro())*time.Microsecond)
			}
			continue
		}
		need := time.Duration(end-now) * time.Microsecond
		if s.TTL+time.Millisecond < need || s.TTL > need+time.Millisecond {
			r.fail("%s: %s TTL %v, needed for %v", what, r.keys[i], s.TTL, need)
		}
	}
	r.noteEnd(max(leases, queue))
}

func (r *semRun) semPause(d int64) {
	what := fmt.Sprintf("pause(%dµs)", d)
	r.trace = append(r.trace, what)
	before := r.pair.Sync(r.t)
	var got [2]int64
	var errs [2]error
	for i, b := range []*redistest.Backend{r.pair.Mini, r.pair.Real} {
		script := lua.Pause.Script()
		if b.Real() {
			script = fakePause
		}
		ctx, cancel := fuzzCtx()
		got[i], errs[i] = script.Run(ctx, b.Client, r.keys[3:4], d).Int64()
		cancel()
		if errs[i] != nil {
			errs[i] = scriptError(ctx, "fuzz", errs[i])
		}
	}
	if errClass(errs[0]) != errClass(errs[1]) || got[0] != got[1] {
		r.fail("%s: miniredis %d %v, redis %d %v", what, got[0], errs[0], got[1], errs[1])
	}
	var wantErr error
	if d < 1 || d > maxPeriodUS {
		wantErr = ErrInvalidArgument
	}
	r.wantErr(what, errs[0], wantErr)
	r.check(what, before, errs[0])
	if errs[0] != nil || r.sm == nil {
		return
	}
	r.sm.paused = max(r.sm.paused, r.nowUS()+d)
	if want := r.sm.paused - r.nowUS(); got[0] != want {
		r.fail("%s: ends in %dµs, want %dµs", what, got[0], want)
	}
	r.noteEnd(r.sm.paused)
}

// semFinish moves the clock past every lease's, place's and pause's end: every key
// must be gone.
func (r *semRun) semFinish() {
	if r.sm == nil {
		return
	}
	r.finish()
}
