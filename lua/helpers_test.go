package lua

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// algo is a limiter script and the head it is called with.
type algo struct {
	name    string // the script: log, bucket, window
	tag     string // the head's tag: sw, sc, tb, fw
	buckets int    // sc: the sub-buckets of the shortest period
	burst   bool   // limits carry a burst
}

var (
	slidingWindow  = algo{"log", keys.SlidingWindow, 0, false}
	slidingCounter = algo{"log", keys.SlidingCounter, 100, false}
	tokenBucket    = algo{"bucket", keys.TokenBucket, 0, true}
	fixedWindow    = algo{"window", keys.FixedWindow, 0, false}
	allAlgos       = []algo{slidingWindow, slidingCounter, tokenBucket, fixedWindow}
)

// limit is one limit: rate per period (µs), and a bucket's burst.
type limit struct{ rate, period, burst int64 }

// head returns the head's text for limits, as internal/keys writes it (and throttle
// sends); units[i] is limit i's unit (missing or "": calls).
func (a algo) head(limits []limit, units ...string) string {
	h := keys.Head{Alg: a.tag, Buckets: a.buckets}
	for i, l := range limits {
		kl := keys.Limit{Rate: int(l.rate), Period: time.Duration(l.period) * time.Microsecond, Burst: int(l.burst)}
		if i < len(units) {
			kl.Unit = units[i]
		}
		h.Limits = append(h.Limits, kl)
	}
	return h.String()
}

// call is what the requests of a limiter call share: the algorithm, the group's limits
// and the tenants' caps (none: ARGV[2] is ""), and their units (see head).
type call struct {
	a               algo
	limits          []limit
	caps            []limit
	units, capUnits []string
}

func (c call) capsHead() string {
	if len(c.caps) == 0 {
		return ""
	}
	return c.a.head(c.caps, c.capUnits...)
}

// parts returns the units of units' parts other than calls, in order.
func parts(units []string) []string {
	var out []string
	for _, u := range units {
		if u != "" && (len(out) == 0 || out[len(out)-1] != u) {
			out = append(out, u)
		}
	}
	return out
}

// build returns the KEYS and ARGV of a call of reqs under tag: KEYS[1] the state, each
// unit's part's, then each key a request names (its Booking, Queue and Caps are
// suffixes under the tag) once.
func (c call) build(tag string, reqs []*protocol.Request) ([]string, []any) {
	ks := []string{tag + ":" + keys.State}
	for _, u := range parts(c.units) {
		ks = append(ks, tag+":"+keys.Part+u)
	}
	index := func(suffix string) int {
		name := tag + ":" + suffix
		for i, k := range ks {
			if k == name {
				return i + 1
			}
		}
		ks = append(ks, name)
		return len(ks)
	}
	argv := []any{c.a.head(c.limits, c.units...), c.capsHead()}
	for _, r := range reqs {
		argv = append(argv, string(r.Append(nil, index)))
	}
	return ks, argv
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
func (c call) run(t testing.TB, b *redistest.Backend, tag string, reqs ...*protocol.Request) []res {
	t.Helper()
	out, err := c.try(b, tag, reqs...)
	if err != nil {
		t.Fatalf("%s %s: %v", c.a.tag, texts(reqs), err)
	}
	return out
}

// try is run that returns the call's error.
func (c call) try(b *redistest.Backend, tag string, reqs ...*protocol.Request) ([]res, error) {
	ks, argv := c.build(tag, reqs)
	detail := make([]bool, len(reqs))
	for i, r := range reqs {
		detail[i] = r.Op == protocol.OpInspect
	}
	return exec(b, c.a.name, ks, argv, detail)
}

// one makes a call of one request and returns its reply.
func (c call) one(t testing.TB, b *redistest.Backend, tag string, r *protocol.Request) res {
	t.Helper()
	return c.run(t, b, tag, r)[0]
}

// loneThenOne makes reqs one call each under tagA, then all in one call under tagB, and
// fails the test where a reply of the one call differs from the lone call's (on a real
// server, a TTL's figure is the lone call's: the fake clock stretches TTLs); it returns the
// lone calls' replies.
func (c call) loneThenOne(t testing.TB, b *redistest.Backend, tagA, tagB string, reqs ...*protocol.Request) []res {
	t.Helper()
	var lone []res
	for _, r := range reqs {
		lone = append(lone, c.one(t, b, tagA, r))
	}
	for i, g := range c.run(t, b, tagB, reqs...) {
		w := lone[i]
		if b.Real() && g.extra != nil && w.extra != nil {
			g.extra[3] = w.extra[3]
		}
		if comparable(g) != comparable(w) {
			t.Fatalf("request %d of %s: one call %v, lone calls %v", i+1, texts(reqs), g, w)
		}
	}
	return lone
}

// raw makes a call of request texts as given (their key options index KEYS: the state,
// then extra), and returns each request's reply.
func (c call) raw(t testing.TB, b *redistest.Backend, tag string, extra []string, reqs ...string) []res {
	t.Helper()
	argv := []any{c.a.head(c.limits, c.units...), c.capsHead()}
	detail := make([]bool, len(reqs))
	for i, r := range reqs {
		argv = append(argv, r)
		f := strings.Fields(r)
		detail[i] = len(f) > 0 && f[0] == protocol.OpInspect
	}
	out, err := exec(b, c.a.name, append([]string{tag + ":" + keys.State}, extra...), argv, detail)
	if err != nil {
		t.Fatalf("%s %q: %v", c.a.tag, reqs, err)
	}
	return out
}

// exec runs the script name on b and splits its reply; detail[i] says request i is an
// inspect (its fields 5 and 6 point at its detail).
func exec(b *redistest.Backend, name string, ks []string, argv []any, detail []bool) ([]res, error) {
	v, err := script(b, name).Run(context.Background(), b.Client, ks, argv...).Int64Slice()
	if err != nil {
		return nil, err
	}
	return parseReply(v, detail)
}

func texts(reqs []*protocol.Request) string {
	var s []string
	for _, r := range reqs {
		s = append(s, fmt.Sprintf("%q", r.Append(nil, func(string) int { return 0 })))
	}
	return "[" + strings.Join(s, " ") + "]"
}

// The requests a test makes; their keys are suffixes under the call's tag (see build).
func acquire(n int, wait int64) *protocol.Request {
	return &protocol.Request{Op: protocol.OpAcquire, N: n, X: wait}
}
func cancel(n int, token int64) *protocol.Request {
	return &protocol.Request{Op: protocol.OpCancel, N: n, X: token}
}
func inspect() *protocol.Request       { return &protocol.Request{Op: protocol.OpInspect} }
func pause(us int64) *protocol.Request { return &protocol.Request{Op: protocol.OpPause, X: us} }
func resume() *protocol.Request        { return &protocol.Request{Op: protocol.OpResume} }
func clearOver() *protocol.Request     { return &protocol.Request{Op: protocol.OpClear} }
func override(us int64, rates ...int) *protocol.Request {
	return &protocol.Request{Op: protocol.OpOverride, X: us, Rates: rates}
}

// booking makes r a task's: its booking key is {…}:bk:<id>, used up to late µs past.
func booking(r *protocol.Request, id string, late int64) *protocol.Request {
	r.Booking, r.Late = keys.Booking+id, late
	return r
}

// of makes r the tenant name's, as a tenant's handle sends it: the fair share's key and,
// when the call has caps, the tenant's state.
func (c call) of(name string, r *protocol.Request) *protocol.Request {
	r.Tenant, r.Queue = name, keys.FairQueue
	if len(c.caps) > 0 {
		r.Caps = keys.Tenant + name
		for _, u := range parts(c.capUnits) {
			r.CapKeys = append(r.CapKeys, keys.Part+u+":"+name)
		}
	}
	return r
}

// costs sets r's costs: unit, n pairs (a settle's: unit, estimate, actual triples).
func costs(r *protocol.Request, c ...any) *protocol.Request {
	step := 2
	if r.Op == protocol.OpSettle {
		step = 3
	}
	for i := 0; i+step <= len(c); i += step {
		k := protocol.Cost{Unit: c[i].(string), N: c[i+1].(int)}
		if step == 3 {
			k.Actual = c[i+2].(int)
		}
		r.Costs = append(r.Costs, k)
	}
	return r
}

// settle is a settle of a grant of n at token, its record {…}:st:<id>.
func settle(n int, token int64, id string) *protocol.Request {
	return &protocol.Request{Op: protocol.OpSettle, N: n, X: token, Record: keys.Settled + id}
}

// placeOf reads a ticket back: the tenant's place it holds (lua/limiter.lua, ticket_of:
// 14 significant digits m and an exponent e, m × 100 + e + 50, the place m / 10^e).
func placeOf(k int64) float64 {
	return float64(k/100) / math.Pow(10, float64(k%100-50))
}

// hold says that a tenant's request takes a place (when it may wait for its turn: a
// WaitN's, x its time left, or a task's); ticket that it comes back with one.
func hold(r *protocol.Request) *protocol.Request            { r.Hold = true; return r }
func ticket(r *protocol.Request, k int64) *protocol.Request { r.Ticket = k; return r }

// res is one request's reply: its Width integers, its error's text or its detail.
type res struct {
	v     [protocol.Width]int64
	err   string
	extra []int64
}

// code is the error's code, 0 when the request did not fail (or Redis's own error).
func (r res) code() int64 {
	if r.v[0] == -1 {
		return r.v[1]
	}
	return 0
}

func (r res) failed() bool { return r.v[0] == -1 }

func (r res) String() string {
	if r.failed() {
		return fmt.Sprintf("error %d %q", r.v[1], r.err)
	}
	if r.extra != nil {
		return fmt.Sprintf("%v %v", r.v, r.extra)
	}
	return fmt.Sprint(r.v)
}

// parseReply splits a flat reply (common.lua, reply) of len(detail) requests; detail[i]
// says request i's fields 5 and 6 point at its detail (Inspect).
func parseReply(v []int64, detail []bool) ([]res, error) {
	const w = protocol.Width
	k := len(detail)
	if len(v) < w*k {
		return nil, fmt.Errorf("reply %v: shorter than %d requests", v, k)
	}
	out := make([]res, k)
	end := int64(w * k) // each extra follows the one before
	for i := range out {
		copy(out[i].v[:], v[w*i:w*i+w])
		at, n := out[i].v[2], out[i].v[3]
		if out[i].v[0] != -1 {
			if !detail[i] {
				continue
			}
			at, n = out[i].v[4], out[i].v[5]
		}
		if at != end+1 || at-1+n > int64(len(v)) || n < 0 {
			return nil, fmt.Errorf("reply %v: request %d's extra at %d, %d long (want it at %d)", v, i+1, at, n, end+1)
		}
		end += n
		extra := v[at-1 : at-1+n]
		if out[i].v[0] != -1 {
			out[i].extra = append([]int64{}, extra...)
			continue
		}
		var s strings.Builder
		for _, c := range extra {
			if c < 0 || c > 255 {
				return nil, fmt.Errorf("reply %v: request %d's error text holds %d", v, i+1, c)
			}
			s.WriteByte(byte(c))
		}
		out[i].err = s.String()
	}
	if end != int64(len(v)) { // only the drift trailer: the head found, its bytes then their count
		if n := v[len(v)-1]; n != int64(len(v))-end-1 {
			return nil, fmt.Errorf("reply %v: %d integers after the extras", v, int64(len(v))-end)
		}
		for _, c := range v[end : len(v)-1] {
			if c < 0 || c > 255 {
				return nil, fmt.Errorf("reply %v: the drift trailer holds %d", v, c)
			}
		}
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

// tok is Epoch + us, a token.
func tok(us int64) int64 { return redistest.Epoch.UnixMicro() + us }

const (
	ms  = int64(1000)
	sec = int64(1000000)
)

// Flags of a reply, short.
const (
	group  = protocol.FlagGroup
	capped = protocol.FlagCap
	turn   = protocol.FlagTurn
	paused = protocol.FlagPaused
	drift  = protocol.FlagDrift
	held   = protocol.FlagTicket
)

// snapshot returns each key's type, value and TTL as text.
func snapshot(t testing.TB, c redis.UniversalClient, ks ...string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	for _, k := range ks {
		typ := c.Type(ctx, k).Val()
		var v any
		switch typ {
		case "string":
			v = c.Get(ctx, k).Val()
		case "list":
			v = c.LRange(ctx, k, 0, -1).Val()
		case "zset":
			v = c.ZRangeWithScores(ctx, k, 0, -1).Val()
		case "hash":
			v = c.HGetAll(ctx, k).Val()
		}
		out[k] = fmt.Sprintf("%s %q ttl %v", typ, v, c.PTTL(ctx, k).Val())
	}
	return out
}

// sameKeys reports whether two snapshots hold the same: their TTLs too on miniredis,
// whose clock is the test's (a real server's TTLs run in real time, and the fake clock
// stretches those the scripts set).
func sameKeys(b *redistest.Backend, x, y map[string]string) bool {
	if len(x) != len(y) {
		return false
	}
	for k, v := range x {
		w := y[k]
		if b.Real() {
			v, w = v[:strings.LastIndex(v, " ttl ")], w[:strings.LastIndex(w, " ttl ")]
		}
		if v != w {
			return false
		}
	}
	return true
}

// meta returns the meta of the state at key (a list's first element, or a string's text
// after its first line), and whether the state holds nothing else; "" when absent.
func meta(t testing.TB, c redis.UniversalClient, key string) (m string, alone bool) {
	t.Helper()
	ctx := context.Background()
	switch c.Type(ctx, key).Val() {
	case "list":
		v := c.LRange(ctx, key, 0, -1).Val()
		return v[0], len(v) == 1
	case "string":
		nums, m, _ := strings.Cut(c.Get(ctx, key).Val(), "\n")
		return m, nums == ""
	}
	return "", false
}

// parseMeta reads the meta at key with internal/keys, failing the test when it cannot,
// and checks the whole state with keys.Check.
func parseMeta(t testing.TB, c redis.UniversalClient, key string) keys.Meta {
	t.Helper()
	m, _ := meta(t, c, key)
	if m == "" {
		return keys.Meta{}
	}
	got, err := keys.ParseMeta(m)
	if err != nil {
		t.Fatalf("%s: meta %q: %v", key, m, err)
	}
	checkKey(t, c, key)
	return got
}

// checkKey fails unless the key at name has a form internal/keys reads (keys.Check), or
// is absent.
func checkKey(t testing.TB, c redis.UniversalClient, name string) {
	t.Helper()
	ctx := context.Background()
	suffix := name[strings.LastIndex(name, "}:")+2:]
	typ := c.Type(ctx, name).Val()
	var values []string
	switch typ {
	case "none":
		return
	case "string":
		values = []string{c.Get(ctx, name).Val()}
	case "list":
		values = c.LRange(ctx, name, 0, -1).Val()
	case "zset":
		for _, z := range c.ZRangeWithScores(ctx, name, 0, -1).Val() {
			values = append(values, fmt.Sprint(z.Member), strconv.FormatFloat(z.Score, 'f', -1, 64))
		}
	}
	if err := keys.Check(suffix, typ, values); err != nil {
		t.Fatalf("%s (%s %q): keys.Check: %v", name, typ, values, err)
	}
}

// putForeign puts content jobthrottle did not write in key: kind "type" is a value of
// another type than want ("string", "list" or "zset"), "text" a value of that type
// that is not ours.
func putForeign(t testing.TB, c redis.UniversalClient, key, want, kind string) {
	t.Helper()
	ctx := context.Background()
	var err error
	switch {
	case kind == "type" && want == "string", kind == "text" && want == "list":
		err = c.RPush(ctx, key, "a", "b", "c").Err()
	case kind == "type":
		err = c.HSet(ctx, key, "f", "v").Err()
	case want == "zset":
		err = c.ZAdd(ctx, key, redis.Z{Member: "x:y", Score: 1e18}).Err()
	default:
		err = c.Set(ctx, key, "1 2 3 x", 0).Err()
	}
	if err != nil {
		t.Fatal(err)
	}
}

// step is one request at a time of a test's timeline (µs after Epoch) and the reply it
// must get: want's fields are compared where check says; a token is written tok(µs).
type step struct {
	at    int64
	r     *protocol.Request
	want  [protocol.Width]int64
	check [protocol.Width]bool
	extra []int64 // Inspect's detail, pttl (index 3) not compared on real servers
	err   string
	note  string
}

// w builds a step's expected reply: nil for a field not compared, a []int64 for the
// detail, a string for an error's text's start.
func w(at int64, r *protocol.Request, note string, fields ...any) step {
	s := step{at: at, r: r, note: note}
	i := 0
	for _, f := range fields {
		switch v := f.(type) {
		case nil:
		case int:
			s.want[i], s.check[i] = int64(v), true
		case int64:
			s.want[i], s.check[i] = v, true
		case []int64:
			s.extra = v
			continue
		case string:
			s.err = v
			continue
		}
		i++
	}
	return s
}

// runSteps makes each step's request on c under a tag of the test's at its time, and
// fails at the first reply that is not the step's.
func runSteps(t *testing.T, b *redistest.Backend, c call, name string, steps []step) {
	t.Helper()
	tag := tagOf(b, name)
	clk := newClock(t, b, tag)
	for i, s := range steps {
		clk.set(t, redistest.Epoch.Add(time.Duration(s.at)*time.Microsecond))
		got := c.one(t, b, tag, s.r)
		where := fmt.Sprintf("%s step %d (%s) at +%dµs, %s", name, i, s.note, s.at, texts([]*protocol.Request{s.r}))
		if s.err != "" {
			if !strings.HasPrefix(got.err, s.err) {
				t.Fatalf("%s: %v, want error %q", where, got, s.err)
			}
			continue
		}
		if got.failed() {
			t.Fatalf("%s: %v", where, got)
		}
		for j := range got.v {
			if s.check[j] && got.v[j] != s.want[j] {
				t.Fatalf("%s: %v, want %v (field %d)", where, got.v, s.want, j+1)
			}
		}
		if s.extra != nil {
			e := append([]int64(nil), got.extra...)
			if b.Real() && len(e) > 3 {
				e[3] = s.extra[3] // the fake clock stretches TTLs
			}
			if fmt.Sprint(e) != fmt.Sprint(s.extra) {
				t.Fatalf("%s: detail %v, want %v", where, got.extra, s.extra)
			}
		}
	}
}

// queueText is the fair share's queue at key as "member=score ..." in queue order, once
// checkKey has read its form.
func queueText(t testing.TB, c redis.UniversalClient, key string) string {
	t.Helper()
	checkKey(t, c, key)
	var s []string
	for _, z := range c.ZRangeWithScores(context.Background(), key, 0, -1).Val() {
		s = append(s, fmt.Sprintf("%s=%g", z.Member, z.Score))
	}
	return strings.Join(s, " ")
}
