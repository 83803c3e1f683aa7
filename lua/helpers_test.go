package lua

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The limiter ops (limiter.lua).
const (
	opAcquire = iota
	opCancel
	opInspect
	opPause
	opResume
	opOverride
	opClear
)

// algo is a limiter script with the state suffix it serves and its ARGV per limit.
type algo struct {
	name   string // the script: log, bucket, window
	suffix string // sw, sc, tb, fw
	param  []any  // the algorithm's parameters (the log's bucket_us)
	burst  bool   // limits carry a burst
}

var (
	slidingWindow  = algo{"log", "sw", []any{0}, false}
	slidingCounter = algo{"log", "sc", []any{10000}, false}
	tokenBucket    = algo{"bucket", "tb", nil, true}
	fixedWindow    = algo{"window", "fw", nil, false}
	allAlgos       = []algo{slidingWindow, slidingCounter, tokenBucket, fixedWindow}
)

// limit is one limit: rate per period (µs), and a bucket's burst.
type limit struct{ rate, period, burst int64 }

// req is one request of a limiter call: op, n, x, y and the booking key's suffix after
// "bk:" (its KEYS index is filled in), or "".
type req struct {
	op, n, x, y int64
	booking     string
}

// limiterCall is the shared part of a call: limits, the other algorithms' suffixes, the
// record, extras.
type limiterCall struct {
	a         algo
	limits    []limit
	others    []string
	record    string
	recordTTL int64
	extras    []any
}

// res is one request's reply: its six integers, its error's text or its extra.
type res struct {
	v     [6]int64
	err   string
	extra []int64
}

func (r res) String() string {
	if r.err != "" {
		return "error " + r.err
	}
	if r.extra != nil {
		return fmt.Sprintf("%v %v", r.v, r.extra)
	}
	return fmt.Sprint(r.v)
}

// keys returns the call's KEYS under tag, and the KEYS index of each request's booking.
func (c limiterCall) keys(tag string, reqs []req) ([]string, []int64) {
	keys := []string{tag + ":" + c.a.suffix, tag + ":pause", tag + ":conf"}
	for _, o := range c.others {
		keys = append(keys, tag+":"+o)
	}
	idx := make([]int64, len(reqs))
	for i, r := range reqs {
		if r.booking == "" {
			continue
		}
		k := tag + ":bk:" + r.booking
		for j, have := range keys {
			if have == k {
				idx[i] = int64(j + 1)
			}
		}
		if idx[i] == 0 {
			keys = append(keys, k)
			idx[i] = int64(len(keys))
		}
	}
	return keys, idx
}

// argv returns the call's ARGV for reqs (bookings at the KEYS indexes idx).
func (c limiterCall) argv(reqs []req, idx []int64) []any {
	args := []any{len(reqs)}
	for i, r := range reqs {
		args = append(args, r.op, r.n, r.x, r.y, idx[i])
	}
	args = append(args, len(c.limits))
	for _, l := range c.limits {
		args = append(args, l.rate, l.period)
		if c.a.burst {
			args = append(args, l.burst)
		}
	}
	args = append(args, c.a.param...)
	args = append(args, len(c.others), c.record, c.recordTTL)
	return append(args, c.extras...)
}

// extraIndex returns the ARGV index (1-based) of the first extra argument of a call of k
// requests.
func (c limiterCall) extraIndex(k int) int64 {
	w := 2
	if c.a.burst {
		w = 3
	}
	return int64(1 + 5*k + 1 + w*len(c.limits) + len(c.a.param) + 3 + 1)
}

// script returns the script to run on b: the production one on miniredis, its fake-clock
// copy on a real server.
func script(b *redistest.Backend, name string) *redis.Script {
	if b.Real() {
		return fakeScripts[name]
	}
	return Script(name)
}

var fakeScripts = map[string]*redis.Script{
	"log":       redistest.FakeClockScript(Source("log")),
	"bucket":    redistest.FakeClockScript(Source("bucket")),
	"window":    redistest.FakeClockScript(Source("window")),
	"semaphore": redistest.FakeClockScript(Source("semaphore")),
}

// run makes one call of reqs on the limiter under tag and returns each request's reply.
func (c limiterCall) run(t testing.TB, b *redistest.Backend, tag string, reqs ...req) []res {
	t.Helper()
	out, err := c.try(b, tag, reqs...)
	if err != nil {
		t.Fatalf("%s %v: %v", c.a.suffix, reqs, err)
	}
	return out
}

// try is run that returns the call's error.
func (c limiterCall) try(b *redistest.Backend, tag string, reqs ...req) ([]res, error) {
	keys, idx := c.keys(tag, reqs)
	v, err := script(b, c.a.name).Run(context.Background(), b.Client, keys, c.argv(reqs, idx)...).Int64Slice()
	if err != nil {
		return nil, err
	}
	inspect := make([]bool, len(reqs))
	for i, r := range reqs {
		inspect[i] = r.op == opInspect
	}
	return parseReply(v, inspect)
}

// one makes a call of one request and returns its reply.
func (c limiterCall) one(t testing.TB, b *redistest.Backend, tag string, r req) res {
	t.Helper()
	return c.run(t, b, tag, r)[0]
}

// parseReply splits a flat reply (common.lua, reply) of len(detail) requests; detail[i]
// says request i's fields 5 and 6 point at its extra (Inspect).
func parseReply(v []int64, detail []bool) ([]res, error) {
	k := len(detail)
	if len(v) < 6*k {
		return nil, fmt.Errorf("reply %v: shorter than %d requests", v, k)
	}
	out := make([]res, k)
	for i := range out {
		copy(out[i].v[:], v[6*i:6*i+6])
		at, n := out[i].v[1], out[i].v[2]
		if out[i].v[0] != -1 {
			if !detail[i] {
				continue
			}
			at, n = out[i].v[4], out[i].v[5]
		}
		if at < int64(6*k+1) || at-1+n > int64(len(v)) || n < 0 {
			return nil, fmt.Errorf("reply %v: request %d's extra at %d, %d long", v, i+1, at, n)
		}
		extra := v[at-1 : at-1+n]
		if out[i].v[0] != -1 {
			out[i].extra = append([]int64{}, extra...)
			continue
		}
		var s strings.Builder
		for _, c := range extra {
			s.WriteByte(byte(c))
		}
		out[i].err = s.String()
	}
	return out, nil
}

// clock is a test's timeline on one backend: miniredis's clock, or the fake-clock key of
// each tag on a real server.
type clock struct {
	b    *redistest.Backend
	tags []string
	now  time.Time
}

func newClock(t testing.TB, b *redistest.Backend, tags ...string) *clock {
	c := &clock{b: b, tags: tags, now: redistest.Epoch}
	c.set(t, c.now)
	return c
}

func (c *clock) set(t testing.TB, now time.Time) {
	t.Helper()
	c.now = now
	c.b.SetTime(t, now, c.tags...)
}

// add moves the clock d on (or back, d < 0).
func (c *clock) add(t testing.TB, d time.Duration) { c.set(t, c.now.Add(d)) }

// us is the clock's time in µs.
func (c *clock) us() int64 { return c.now.UnixMicro() }

// tagOf returns a hash tag unique to the test and name.
func tagOf(b *redistest.Backend, name string) string { return "{" + b.Prefix + name + "}" }

const (
	ms  = int64(1000)
	sec = int64(1000000)
)
