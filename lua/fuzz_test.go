package lua

import (
	"bytes"
	"context"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// FuzzScriptArgs calls one script with any ARGV at all (bytes split at 0x1f), on
// miniredis and a real redis-server side by side (redistest.Pair; the production script
// on miniredis, its fake-clock copy on the real server), after an optional good call that
// leaves state and optional foreign content in one of its keys, at a time the input picks.
// No argument can make a script crash, hang, or write when it fails:
//   - ARGV whose shared arguments are outside the contract (argsOK, written here apart
//     from the scripts, after internal/protocol's description) gets a JTARG error, and no
//     key changes;
//   - otherwise the reply is Width integers per request and the extras; a request outside
//     its op's contract gets ErrArg, any other a reply of its op's shape or, only when a
//     key holds foreign content, ErrState or ErrAlg, or ErrAlg when the good call left
//     another algorithm's state (a sliding counter's head on a sliding window's key), or,
//     only when n is above a limit that may be in force, ErrExceeds; when every request
//     failed, no key changes;
//   - both servers answer alike and hold the same keys after; every key a call changed has
//     a TTL.
func FuzzScriptArgs(f *testing.F) {
	if _, err := redistest.StandaloneAddr(); err != nil {
		redistest.Figure(f, "NOT CHECKED on real Redis: no redis (%v); every input is skipped (each runs on miniredis and a real redis-server side by side)", err)
	}
	f.Fuzz(func(t *testing.T, which uint8, key string, argv []byte, pre uint8, junk string) {
		runScriptArgs(t, which, key, argv, pre, junk)
	})
}

// fuzzScript is a script as FuzzScriptArgs calls it.
type fuzzScript struct {
	name string   // the script
	keys []string // suffixes under the tag
	good []string // arguments that work, for the call before the fuzzed one
	tags []string // a limiter's head tags; none: the semaphore
}

// A limiter's KEYS: the state, a booking, tenant "a"'s state, the fair share's queue.
var limiterKeys = []string{":" + keys.State, ":" + keys.Booking + "1", ":" + keys.Tenant + "a", ":" + keys.FairQueue}

var fuzzScripts = []fuzzScript{
	{"log", limiterKeys, []string{"sw 5 1000000", "", "a 1 0", "a 2 1000000 b2 l0", "i", "p 1000"}, []string{"sw", "sc"}},
	{"log", limiterKeys, []string{"sc 10 5 1000000", "sc 10 2 1000000", "a 1 0 q4 c3 ta", "a 1 1000000 b2 l5 q4 c3 h ta", "i q4"}, []string{"sw", "sc"}},
	{"bucket", limiterKeys, []string{"tb 5 1000000 5", "", "a 1 0", "o 1000000 7 2", "c 1 1", "W 1000 2 q4 ta"}, []string{"tb"}},
	{"window", limiterKeys, []string{"fw 5 1000000 3 3000000", "fw 2 1000000", "a 1 0 q4 c3 w2000000 h ta", "W 1000 2 q4 ta", "x", "i q4 c3 ta"}, []string{"fw"}},
	{"semaphore", []string{":" + keys.Leases, ":" + keys.Queue, ":" + keys.QueueExpiry, ":" + keys.State},
		[]string{"1", "0", "0123456789abcdef0123456789abcdef", "task", "1", "1", "1000000"}, nil},
}

var (
	digits    = regexp.MustCompile(`^[0-9]+$`)
	lowerHex  = regexp.MustCompile(`^[0-9a-f]{32}$`)
	placeText = regexp.MustCompile(`^[!-~]*$`)
)

// inRange reports whether s is plain decimal digits with a value in [lo, hi].
func inRange(s string, lo, hi int64) bool {
	if !digits.MatchString(s) {
		return false
	}
	v, _ := new(big.Int).SetString(s, 10)
	return v.Cmp(big.NewInt(lo)) >= 0 && v.Cmp(big.NewInt(hi)) <= 0
}

func num(s string) int64 {
	v, _ := new(big.Int).SetString(s, 10)
	return v.Int64()
}

// luaFields splits s at Lua's spaces (%s: space, \t, \n, \v, \f, \r), as gmatch('%S+').
func luaFields(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return strings.ContainsRune(" \t\n\v\f\r", r) })
}

// fuzzHead is a head read by the contract: its tag, and the largest n its limits allow.
type fuzzHead struct {
	tag    string
	limits int
	capN   int64
}

// parseFuzzHead reads a head of one of tags, or says it is not one.
func parseFuzzHead(text string, tags []string) (fuzzHead, bool) {
	w := luaFields(text)
	if len(w) == 0 || !slicesContains(tags, w[0]) {
		return fuzzHead{}, false
	}
	h := fuzzHead{tag: w[0], capN: protocol.MaxRate}
	w = w[1:]
	if h.tag == keys.SlidingCounter {
		if len(w) == 0 || !inRange(w[0], 1, 10000) {
			return h, false
		}
		w = w[1:]
	}
	width := map[bool]int{true: 3, false: 2}[h.tag == keys.TokenBucket]
	if len(w) == 0 || len(w)%width != 0 || len(w)/width > protocol.MaxLimits {
		return h, false
	}
	for i := 0; i < len(w); i += width {
		if !inRange(w[i], 1, protocol.MaxRate) || !inRange(w[i+1], 1, protocol.MaxPeriod) {
			return h, false
		}
		c := num(w[i])
		if width == 3 {
			if !inRange(w[i+2], 1, protocol.MaxRate) || num(w[i+2])*num(w[i+1]) > protocol.MaxTicks {
				return h, false
			}
			c = num(w[i+2])
		}
		h.capN = min(h.capN, c)
	}
	h.limits = len(w) / width
	return h, true
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// fuzzReq is what argsOK reads of a limiter's valid request.
type fuzzReq struct {
	op, tenant string
	n          int64
	b, c, q    bool
	hold       bool
}

// parseFuzzRequest reads a limiter's request text by the contract (internal/protocol):
// an op and its fields, options, the tenant's name last; the key options name keys of
// their kind under KEYS[1]'s tag.
func parseFuzzRequest(text string, group fuzzHead, caps *fuzzHead, ks []string) (fuzzReq, bool) {
	var q fuzzReq
	body := text
	if i := strings.Index(text, " t"); i >= 0 {
		q.tenant, body = text[i+2:], text[:i]
		if len(q.tenant) < 1 || len(q.tenant) > protocol.MaxTenant {
			return q, false
		}
	}
	w := luaFields(body)
	if len(w) == 0 {
		return q, false
	}
	q.op = w[0]
	nf := 1
	var units, ticket, late bool
	switch q.op {
	case protocol.OpAcquire, protocol.OpCancel:
		if len(w) < 3 || !inRange(w[1], 0, protocol.MaxRate) || !inRange(w[2], 0, protocol.MaxWait) {
			return q, false
		}
		q.n, nf = num(w[1]), 3
	case protocol.OpPause:
		if len(w) < 2 || !inRange(w[1], 1, protocol.MaxPeriod) {
			return q, false
		}
		nf = 2
	case protocol.OpOverride:
		if len(w) < 4 || len(w)%2 != 0 || (len(w)-2)/2 > group.limits || !inRange(w[1], 0, protocol.MaxPeriod) {
			return q, false
		}
		for i := 2; i < len(w); i += 2 {
			if !inRange(w[i], 1, protocol.MaxRate) || !inRange(w[i+1], 0, protocol.MaxRate) {
				return q, false
			}
		}
		return q, true // an override takes no options
	case protocol.OpWeight:
		if len(w) < 3 || !inRange(w[1], 0, protocol.MaxPeriod) || !inRange(w[2], 1, protocol.MaxWeight*1000000) {
			return q, false
		}
		nf = 3
	case protocol.OpInspect, protocol.OpResume, protocol.OpClear:
	default:
		return q, false
	}
	base, hasBase := strings.CutSuffix(ks[0], "l")
	hasBase = hasBase && strings.HasSuffix(base, ":")
	keyOK := func(v, kind string) bool {
		if !inRange(v, 2, int64(len(ks))) {
			return false
		}
		k := ks[num(v)-1]
		switch kind {
		case "b":
			return hasBase && len(k) > len(base)+3 && strings.HasPrefix(k, base+keys.Booking)
		case "q":
			return hasBase && k == base+keys.FairQueue
		}
		return hasBase && k == base+keys.Tenant+q.tenant
	}
	for _, o := range w[nf:] {
		letter, v := o[0], o[1:]
		switch {
		case letter == 'b' || letter == 'c' || letter == 'q':
			if !inRange(v, 2, int64(len(ks))) {
				return q, false
			}
			// the kind is checked after all options, with the tenant's name
			switch letter {
			case 'b':
				q.b = true
			case 'c':
				q.c = true
			default:
				q.q = true
			}
		case letter == 'l':
			if !inRange(v, 0, protocol.MaxWait) {
				return q, false
			}
			late = true
		case letter == 'w':
			if !inRange(v, 1, protocol.MaxWeight*1000000) {
				return q, false
			}
			units = true
		case letter == 'k':
			if !inRange(v, 0, protocol.MaxWait) {
				return q, false
			}
			ticket = true
		case letter == 'h' && v == "":
			q.hold = true
		default:
			return q, false
		}
	}
	tenant, weight, inspect := q.tenant != "", q.op == protocol.OpWeight, q.op == protocol.OpInspect
	if (tenant && !q.q) || (q.q && !tenant && !inspect) || (q.c && !tenant) || (late && !q.b) ||
		((units || ticket || q.hold) && !weight && !tenant) || (q.c && caps == nil) ||
		(caps != nil && tenant && !q.c && !weight) || (weight && !tenant) {
		return q, false
	}
	// each key option's last value names a key of its kind
	last := map[byte]string{}
	for _, o := range w[nf:] {
		if o[0] == 'b' || o[0] == 'c' || o[0] == 'q' {
			last[o[0]] = o[1:]
		}
	}
	for letter, v := range last {
		if !keyOK(v, string(letter)) {
			return q, false
		}
	}
	return q, true
}

// argsOK is the protocol's ARGV contract, written out again: whether the shared arguments
// are valid (else what is wrong), and for each request whether it is.
func argsOK(sc fuzzScript, argv []string, ks []string) (bool, string, []fuzzReq, []bool) {
	at := func(i int) string { // ARGV[i], "\x00" past the end
		if i <= len(argv) {
			return argv[i-1]
		}
		return "\x00"
	}
	if sc.tags == nil { // the semaphore
		if len(argv) == 0 || !inRange(argv[0], 1, protocol.MaxRequests) {
			return false, "k", nil, nil
		}
		k := int(num(argv[0]))
		if len(argv) != 3+4*k || len(ks) != 4 {
			return false, "argument count", nil, nil
		}
		if !inRange(at(2+4*k), 1, protocol.MaxRate) || !inRange(at(3+4*k), 1000, protocol.MaxPeriod) {
			return false, "max or ttl", nil, nil
		}
		ok := make([]bool, k)
		reqs := make([]fuzzReq, k)
		for r := range k {
			j := 2 + 4*r
			op, token, place, join := at(j), at(j+1), at(j+2), at(j+3)
			if !inRange(op, 0, 3) {
				continue
			}
			o := num(op)
			reqs[r].op = op
			ok[r] = (lowerHex.MatchString(token) || (o == 3 && token == "")) &&
				len(place) <= 200 && placeText.MatchString(place) && (o != 0 || place != "") &&
				inRange(join, 0, map[int64]int64{0: 1, 1: 0, 2: 0, 3: 1000}[o])
		}
		return true, "", reqs, ok
	}
	if len(argv) < 3 || len(argv) > 2+protocol.MaxRequests {
		return false, "request count", nil, nil
	}
	group, ok := parseFuzzHead(argv[0], sc.tags)
	if !ok {
		return false, "head", nil, nil
	}
	var caps *fuzzHead
	if argv[1] != "" {
		h, ok := parseFuzzHead(argv[1], sc.tags)
		if f := luaFields(argv[1]); !ok || len(f) == 0 || !strings.HasPrefix(argv[1], f[0]) || h.tag != group.tag {
			return false, "caps head", nil, nil
		}
		caps = &h
	}
	k := len(argv) - 2
	reqs := make([]fuzzReq, k)
	good := make([]bool, k)
	for r := range k {
		reqs[r], good[r] = parseFuzzRequest(argv[2+r], group, caps, ks)
	}
	return true, "", reqs, good
}

// Foreign content runScriptArgs can put in a key before the calls (pre / 8 % len).
var argPrestates = []string{"none", "string", "list", "zset", "hash", "set", "numbers string", "numbers list"}

func runScriptArgs(t *testing.T, which uint8, key string, argvRaw []byte, pre uint8, junk string) {
	sc := fuzzScripts[int(which)%len(fuzzScripts)]
	var argv []string
	if len(argvRaw) > 0 {
		for _, a := range bytes.Split(argvRaw, []byte{0x1f}) {
			argv = append(argv, string(a))
		}
	}
	pair := redistest.NewPair(t)
	tag := "{" + pair.Mini.Prefix + key + "}"
	clock := tag
	if i := strings.IndexByte(key, '}'); i >= 0 {
		clock = "{" + pair.Mini.Prefix + key[:i] + "}"
	}
	var ks []string
	for _, s := range sc.keys {
		ks = append(ks, tag+s)
	}
	pair.Track(ks...)
	now := redistest.Epoch
	pair.SetTime(t, now, clock)
	ctx := context.Background()
	trace := fmt.Sprintf("%s %s ARGV %q, key %q, pre %d, junk %q", sc.name, sc.good[0], argv, key, pre, junk)

	run := func(args []string) ([]int64, error) {
		var out [2][]int64
		var errs [2]error
		for i, b := range []*redistest.Backend{pair.Mini, pair.Real} {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			out[i], errs[i] = script(b, sc.name).Run(cctx, b.Client, ks, toAny(args)...).Int64Slice()
			cancel()
		}
		_, _, reqs, ok := argsOK(sc, args, ks)
		var ttls [2][]int64 // an inspect's pttl: the real server's TTLs run apart (Pair.Sync)
		for i := range out {
			ttls[i] = inspectTTLs(out[i], reqs, ok, sc.tags == nil)
		}
		if code(errs[0]) != code(errs[1]) || fmt.Sprint(out[0]) != fmt.Sprint(out[1]) {
			t.Fatalf("%s: miniredis %v %v, redis %v %v", trace, out[0], errs[0], out[1], errs[1])
		}
		for i := range ttls[0] {
			if m, r := ttls[0][i], ttls[1][i]; (m < 0) != (r < 0) {
				t.Fatalf("%s: an inspect's pttl %d on miniredis, %d on redis", trace, m, r)
			}
		}
		return out[0], errs[0]
	}

	goodFirst := pre&1 == 1
	if goodFirst { // a good call first, leaving state the fuzzed call meets
		if _, err := run(sc.good); err != nil {
			t.Fatalf("%s: the good call failed: %v", trace, err)
		}
	}
	foreignKey := ""
	if p := int(pre/8) % len(argPrestates); p != 0 {
		foreignKey = ks[int(pre/2)%4%len(ks)]
		words := strings.Fields(junk)
		if len(words) == 0 {
			words = []string{junk}
		}
		for _, b := range []*redistest.Backend{pair.Mini, pair.Real} {
			c := b.Client
			c.Del(ctx, foreignKey)
			var err error
			switch argPrestates[p] {
			case "string":
				err = c.Set(ctx, foreignKey, junk, 0).Err()
			case "list":
				err = c.RPush(ctx, foreignKey, toAny(words)...).Err()
			case "zset":
				for i, w := range words {
					err = c.ZAdd(ctx, foreignKey, redis.Z{Member: w, Score: float64(now.UnixMicro() + int64(i-1)*1000)}).Err()
				}
			case "hash":
				err = c.HSet(ctx, foreignKey, "f", junk).Err()
			case "set":
				err = c.SAdd(ctx, foreignKey, toAny(words)...).Err()
			case "numbers string":
				err = c.Set(ctx, foreignKey, fmt.Sprint(now.UnixMicro()+int64(len(junk))), 0).Err()
			case "numbers list":
				err = c.RPush(ctx, foreignKey, "0", fmt.Sprint(now.UnixMicro()+int64(len(junk))), "1").Err()
			}
			if err != nil {
				t.Fatalf("%s: foreign content: %v", trace, err)
			}
		}
	}
	now = now.Add([]time.Duration{0, time.Millisecond, time.Second, time.Hour}[int(pre/2)%4])
	pair.SetTime(t, now, clock)

	before := pair.Sync(t)
	v, err := run(argv)
	after := pair.Compare(t, trace)
	ok, why, reqs, reqOK := argsOK(sc, argv, ks)
	unchanged := func() {
		for k, s := range after {
			if b := before[k]; !s.Same(b) || s.TTL != b.TTL {
				t.Fatalf("%s: failed (%v), yet %q changed:\n  before %v\n  after  %v", trace, err, k, b, s)
			}
		}
	}
	if !ok {
		if code(err) != "JTARG" {
			t.Fatalf("%s: %v, want a JTARG error (%s)", trace, err, why)
		}
		unchanged()
		return
	}
	if err != nil {
		t.Fatalf("%s: %v, want a reply (valid shared arguments)", trace, err)
	}
	detail := make([]bool, len(reqOK))
	for r := range detail {
		detail[r] = reqOK[r] && (reqs[r].op == protocol.OpInspect || sc.tags == nil && reqs[r].op == "3")
	}
	out, perr := parseReply(v, detail)
	if perr != nil {
		t.Fatalf("%s: %v", trace, perr)
	}
	// an override may be in force: the good call's, or one earlier in this call
	overridden := goodFirst && slicesContains(sc.good, "o 1000000 7 2")
	failed := 0
	for r, res := range out {
		c := res.code()
		switch {
		case !reqOK[r]:
			if c != protocol.ErrArg || !strings.HasPrefix(res.err, "JTARG") {
				t.Fatalf("%s: request %d: %v, want ErrArg", trace, r+1, res)
			}
		case !res.failed():
			if err := replyShape(sc, reqs[r], r, res, now.UnixMicro()); err != nil {
				t.Fatalf("%s: request %d: %v", trace, r+1, err)
			}
			if reqs[r].op == protocol.OpOverride {
				overridden = true
			}
			continue
		case (c == protocol.ErrState || c == protocol.ErrAlg) && foreignKey != "":
		case c == protocol.ErrAlg && sc.tags != nil && goodFirst && headTag(argv[0]) != headTag(sc.good[0]): // another algorithm's state
		case c == protocol.ErrExceeds && reqs[r].op == protocol.OpAcquire && (overridden || exceeds(sc, argv, reqs[r])):
		default:
			t.Fatalf("%s: request %d: %v, want a reply", trace, r+1, res)
		}
		failed++
	}
	if failed == len(out) {
		unchanged()
	}
	for k, s := range after {
		if s.Type == "none" || s.TTL >= 0 {
			continue
		}
		if b := before[k]; k == foreignKey && s.Same(b) {
			continue // foreign content the call left alone
		}
		t.Fatalf("%s: key %q has no TTL: %v", trace, k, s)
	}
}

// headTag returns a head's algorithm tag, its first word.
func headTag(head string) string {
	tag, _, _ := strings.Cut(head, " ")
	return tag
}

// inspectTTLs takes the pttl out of each inspect's detail in a reply v (0 in its place)
// and returns them.
func inspectTTLs(v []int64, reqs []fuzzReq, ok []bool, semaphore bool) []int64 {
	var ttls []int64
	for r := range ok {
		inspect := reqs[r].op == protocol.OpInspect || semaphore && reqs[r].op == "3"
		if !ok[r] || !inspect || len(v) < protocol.Width*(r+1) || v[protocol.Width*r] != 1 {
			continue
		}
		if at := v[protocol.Width*r+4]; at >= 1 && at+3 <= int64(len(v)) {
			ttls = append(ttls, v[at+2])
			v[at+2] = 0
		}
	}
	return ttls
}

// exceeds reports whether a tenant's or the group's limits can never grant q's n.
func exceeds(sc fuzzScript, argv []string, q fuzzReq) bool {
	group, _ := parseFuzzHead(argv[0], sc.tags)
	if q.n > group.capN {
		return true
	}
	caps, ok := parseFuzzHead(argv[1], sc.tags)
	return ok && q.c && q.n > caps.capN
}

// replyShape checks a request's successful reply against its op's shape.
func replyShape(sc fuzzScript, q fuzzReq, r int, res res, now int64) error {
	v := res.v
	if sc.tags == nil { // the semaphore
		switch {
		case q.op == "3" && (v != [7]int64{1, 0, v[2], 0, v[4], v[5], 0} || len(res.extra) < 5 || res.extra[0] != v[2]):
			return fmt.Errorf("inspect %v", res)
		case q.op != "3" && (v[0] < 0 || v[0] > 1 || v[1] < 0 || v[2] < 0 || (q.op == "0" && v[0] == 0 && v[1] < 1) ||
			v[3] != 0 || v[4] != 0 || v[5] != 0 || v[6] != 0):
			return fmt.Errorf("reply %v: want ok 0|1, wait >= 0 (>= 1 when denied), held >= 0, then zeros", res)
		}
		return nil
	}
	for _, x := range v[1:4] {
		if x < 0 {
			return fmt.Errorf("reply %v: a negative number", res)
		}
	}
	const all = group | capped | turn | paused | drift | held
	denial := v[6] & (group | capped | turn)
	switch q.op {
	case protocol.OpAcquire:
		switch {
		case v[0] < 0 || v[0] > 2 || v[6]&^all != 0 || v[5] < 0:
			return fmt.Errorf("acquire %v", res)
		case v[0] == 0 && (v[2] < 1 || v[4] != 0 || denial == 0):
			return fmt.Errorf("acquire %v: a denial waits, books nothing and names who denied", res)
		case v[0] != 0 && (denial != 0 || v[6]&held != 0):
			return fmt.Errorf("acquire %v: a grant names no denial", res)
		case v[0] == 1 && q.n > 0 && v[4] < now:
			return fmt.Errorf("acquire %v: a grant's token is not before now", res)
		case v[0] == 1 && q.n == 0 && v[4] != 0:
			return fmt.Errorf("acquire %v: n = 0 has no token", res)
		case v[6]&held != 0 && (!q.hold || q.tenant == ""):
			return fmt.Errorf("acquire %v: a ticket without h", res)
		}
	case protocol.OpCancel:
		if v[0] < 0 || v[0] > 1 || v[1] != 0 || v[2] != 0 || v[4] < 0 || v[5] != 0 || v[6] != 0 || (!q.b && v[4] != 0) {
			return fmt.Errorf("cancel %v", res)
		}
	case protocol.OpInspect:
		if v[0] != 1 || len(res.extra) < 6+3 || v[6]&^(paused|drift) != 0 {
			return fmt.Errorf("inspect %v", res)
		}
	default:
		if v[0] != 1 || v[1] != 0 || v[4] < 0 || (q.op != protocol.OpResume && v[4] != 0) || v[5] != 0 || v[6] != 0 {
			return fmt.Errorf("control %v", res)
		}
	}
	return nil
}

// code is the kind of error a script call returned: JTARG, WRONGTYPE, or its text
// (miniredis wraps a script's error in its own "ERR ..."), "" for nil.
func code(err error) string {
	if err == nil || err.Error() == "" {
		return ""
	}
	for _, c := range []string{"JTARG", "WRONGTYPE"} {
		if strings.Contains(err.Error(), c) {
			return c
		}
	}
	return err.Error()
}

func toAny(v []string) []any {
	out := make([]any, len(v))
	for i, s := range v {
		out[i] = s
	}
	return out
}

// argSeeds are the seed corpus (testdata/fuzz/FuzzScriptArgs, written by
// TestFuzzScriptArgsSeeds): each script with good arguments, before and after state
// exists; each argument made bad, and each field of the heads and the first request;
// foreign content in its keys; an argument too many and too few.
func argSeeds() map[string][]any {
	join := func(a ...string) []byte { return []byte(strings.Join(a, "\x1f")) }
	out := map[string][]any{}
	add := func(name string, which int, key string, argv []byte, pre int, junk string) {
		out[name] = []any{uint8(which), key, argv, uint8(pre), junk}
	}
	bads := []struct{ name, v string }{{"empty", ""}, {"fraction", "1.5"}, {"exponent", "1e3"},
		{"hex", "0x10"}, {"space", " 1"}, {"20-digits", "99999999999999999999"},
		{"leading-zeros", "00000000000000000001"}, {"minus-zero", "-0"}}
	for i, sc := range fuzzScripts {
		name := sc.name + "-" + strings.Fields(sc.good[0])[0]
		add(name+"-good", i, "k", join(sc.good...), 0, "")
		add(name+"-good-on-state", i, "k", join(sc.good...), 1, "")
		add(name+"-good-an-hour-later", i, "k", join(sc.good...), 1+6, "")
		for j := range sc.good {
			args := append([]string(nil), sc.good...)
			args[j] = "-" + sc.good[j]
			add(fmt.Sprintf("%s-arg%d-negative", name, j+1), i, "k", join(args...), 1, "")
			f := strings.Split(sc.good[j], " ")
			for fi := range f {
				if len(f) == 1 || j > 2 {
					break // the heads' and the first request's fields
				}
				for _, bad := range bads[:4] {
					g := append([]string(nil), f...)
					g[fi] = bad.v
					args := append([]string(nil), sc.good...)
					args[j] = strings.Join(g, " ")
					add(fmt.Sprintf("%s-arg%d-field%d-%s", name, j+1, fi+1, bad.name), i, "k", join(args...), 1, "")
				}
			}
		}
		for _, bad := range bads {
			args := append([]string(nil), sc.good...)
			args[0] = bad.v
			add(fmt.Sprintf("%s-arg1-%s", name, bad.name), i, "k", join(args...), 1, "")
		}
		add(name+"-argument-too-many", i, "k", join(append(sc.good, "1")...), 0, "")
		add(name+"-argument-too-few", i, "k", join(sc.good[:len(sc.good)-1]...), 0, "")
		add(name+"-no-arguments", i, "k", nil, 0, "")
		add(name+"-string-in-first-key-braces-in-key", i, "a}{b", join(sc.good...), 1+8*1, "junk")
		add(name+"-zset-in-first-key-binary-key", i, "\x00\xff", join(sc.good...), 1+8*3, "x y")
		add(name+"-hash-in-second-key", i, "k", join(sc.good...), 2+8*4, "v")
		add(name+"-string-in-fourth-key", i, "k", join(sc.good...), 6+8*1, "1 2 x")
		add(name+"-numbers-list-in-first-key", i, "k", join(sc.good...), 8*7, "7")
		add(name+"-numbers-string-in-first-key", i, "k", join(sc.good...), 1+8*6, "77")
	}
	// a meta not ours, another algorithm's state, a meta alone: in the state key
	add("log-sw-another-algorithms-state", 0, "k", join(fuzzScripts[0].good...), 1+8*1, "1767323045000000 1\nfw 5 1000000")
	add("log-sw-a-meta-alone-of-the-bucket", 0, "k", join(fuzzScripts[0].good...), 1+8*1, "\ntb 5 1000000 5\np 1767323046000000")
	add("window-fw-a-meta-not-ours", 3, "k", join(fuzzScripts[3].good...), 1+8*1, "1 2\nfw 5 1000000\nz")
	return out
}

// The seed files say what argSeeds writes (JOBTHROTTLE_WRITE_SEEDS=1 writes them); the
// others are inputs the fuzzer found.
func TestFuzzScriptArgsSeeds(t *testing.T) {
	write := os.Getenv("JOBTHROTTLE_WRITE_SEEDS") != ""
	dir := filepath.Join("testdata", "fuzz", "FuzzScriptArgs")
	seeds := argSeeds()
	found := regexp.MustCompile(`^[0-9a-f]{16}$`) // inputs the fuzzer found, kept as regressions
	if write {
		files, _ := os.ReadDir(dir)
		for _, f := range files {
			if !found.MatchString(f.Name()) {
				os.Remove(filepath.Join(dir, f.Name()))
			}
		}
	}
	for name, values := range seeds {
		var b strings.Builder
		b.WriteString("go test fuzz v1\n")
		fmt.Fprintf(&b, "byte(%q)\nstring(%q)\n[]byte(%q)\nbyte(%q)\nstring(%q)\n",
			values[0], values[1], values[2], values[3], values[4])
		path := filepath.Join(dir, name)
		if write {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if got, err := os.ReadFile(path); err != nil || string(got) != b.String() {
			t.Errorf("%s is not what argSeeds says (%v); run JOBTHROTTLE_WRITE_SEEDS=1 go test -run TestFuzzScriptArgsSeeds ./lua", path, err)
		}
	}
	files, _ := os.ReadDir(dir)
	for _, f := range files {
		if _, ok := seeds[f.Name()]; !ok && !found.MatchString(f.Name()) {
			t.Errorf("%s/%s is neither a seed argSeeds writes nor an input the fuzzer found", dir, f.Name())
		}
	}
}
