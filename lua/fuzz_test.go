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

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// FuzzScriptArgs calls one script with any ARGV at all (bytes split at 0x1f), on
// miniredis and a real redis-server side by side (redistest.Pair; the production script
// on miniredis, its fake-clock copy on the real server), after an optional good call that
// leaves state and optional foreign content in one of its keys, at a time the input picks.
// No argument can make a script crash, hang, or write when it fails:
//   - ARGV whose shared arguments are outside the header's contract (argsOK, written here
//     apart from the script) gets a JTARG error, and no key changes;
//   - otherwise the reply is six integers per request and the extras; a request outside
//     its op's contract gets JTARG, any other a reply of its op's shape or, only when a key
//     holds foreign content (or another algorithm's, or an override bounds n), JTSTATE,
//     JTALG or JTEXCEEDS; when every request failed, no key changes;
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
	name   string // the script
	keys   []string
	good   []string // arguments that work, for the call before the fuzzed one
	width  int      // a limiter's integers per limit; 0: the semaphore
	params int
}

var fuzzScripts = []fuzzScript{
	{"log", []string{":sw", ":pause", ":conf", ":bk:1"}, []string{"1", "0", "2", "1000000", "0", "0", "1", "5", "1000000", "0", "0", "", "0"}, 2, 1},
	{"log", []string{":sc", ":pause", ":conf", ":bk:1"}, []string{"1", "0", "2", "1000000", "0", "0", "1", "5", "1000000", "100000", "0", "1 sc 10 5/1s", "1000"}, 2, 1},
	{"bucket", []string{":tb", ":pause", ":conf", ":bk:1"}, []string{"1", "0", "2", "1000000", "0", "4", "1", "5", "1000000", "5", "0", "", "0"}, 3, 0},
	{"window", []string{":fw", ":pause", ":conf", ":bk:1"}, []string{"2", "3", "0", "3000000", "0", "0", "0", "2", "1000000", "0", "0", "1", "5", "1000000", "0", "", "0"}, 2, 0},
	{"semaphore", []string{":sem", ":semq", ":semx", ":pause"}, []string{"1", "0", "0123456789abcdef0123456789abcdef", "task", "1", "1", "1000000"}, 0, 0},
}

var (
	digits     = regexp.MustCompile(`^[0-9]+$`)
	lowerHex   = regexp.MustCompile(`^[0-9a-f]{32}$`)
	placeText  = regexp.MustCompile(`^[!-~]*$`)
	recordText = regexp.MustCompile(`^1 (sw|sc|tb|fw) [0-9]+ [^ \t\n\r\f\v]`)
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

// argsOK is the headers' ARGV contract, written out again: whether the shared arguments
// are valid (else what is wrong), and for each request whether its own are.
func argsOK(sc fuzzScript, argv []string, nkeys int) (bool, string, []bool) {
	const maxRate, maxPeriod, maxWait = 1_000_000_000, 1 << 45, 1<<53 - 1
	at := func(i int) string { // ARGV[i], "" past the end
		if i <= len(argv) {
			return argv[i-1]
		}
		return "\x00"
	}
	if len(argv) == 0 || !inRange(argv[0], 1, 1000) {
		return false, "k", nil
	}
	k := int(num(argv[0]))
	if sc.width == 0 { // the semaphore
		if len(argv) != 3+4*k {
			return false, "argument count", nil
		}
		if !inRange(at(2+4*k), 1, maxRate) || !inRange(at(3+4*k), 1000, maxPeriod) {
			return false, "max or ttl", nil
		}
		ok := make([]bool, k)
		for r := range k {
			j := 2 + 4*r
			op, token, place, join := at(j), at(j+1), at(j+2), at(j+3)
			if !inRange(op, 0, 3) {
				continue
			}
			o := num(op)
			ok[r] = (lowerHex.MatchString(token) || (o == 3 && token == "")) &&
				len(place) <= 200 && placeText.MatchString(place) && (o != 0 || place != "") &&
				inRange(join, 0, map[int64]int64{0: 1, 1: 0, 2: 0, 3: 1000}[o])
		}
		return true, "", ok
	}
	p := 2 + 5*k
	if len(argv) < p || nkeys < 3 {
		return false, "k", nil
	}
	if !inRange(at(p), 1, 16) {
		return false, "m", nil
	}
	m := int(num(at(p)))
	if len(argv) < p+sc.width*m+sc.params+3 {
		return false, "argument count", nil
	}
	capN := int64(maxRate)
	for i := range m {
		b := p + sc.width*i
		rate, period := at(b+1), at(b+2)
		if !inRange(rate, 1, maxRate) || !inRange(period, 1, maxPeriod) {
			return false, "limit", nil
		}
		c := num(rate)
		if sc.width == 3 {
			if !inRange(at(b+3), 1, maxRate) || num(at(b+3))*num(period) > 1<<50 {
				return false, "burst", nil
			}
			c = num(at(b + 3))
		}
		capN = min(capN, c)
	}
	p += sc.width*m + 1
	if sc.params > 0 && !inRange(at(p), 0, maxPeriod) {
		return false, "parameter", nil
	}
	p += sc.params
	if !inRange(at(p), 0, int64(nkeys-3)) {
		return false, "A", nil
	}
	A := int(num(at(p)))
	if !inRange(at(p+2), 0, maxPeriod/1000) || (num(at(p+2)) > 0) != recordText.MatchString(at(p+1)) || (num(at(p+2)) == 0 && at(p+1) != "") {
		return false, "record", nil
	}
	extra := int64(p + 3)
	ok := make([]bool, k)
	for r := range k {
		f := argv[1+5*r : 6+5*r]
		good := true
		for _, s := range f {
			good = good && digits.MatchString(s)
		}
		if !good {
			continue
		}
		op, n, x, y, key := num(f[0]), num(f[1]), num(f[2]), num(f[3]), num(f[4])
		big := func(s string, hi int64) bool { return !inRange(s, 0, hi) }
		switch {
		case big(f[0], 6):
		case op <= 1:
			ok[r] = !big(f[1], capN) && !big(f[2], maxWait) && !big(f[3], maxWait) &&
				(y == 0 || (key != 0 && op == 0)) &&
				(key == 0 || (!big(f[4], 1<<30) && key >= int64(4+A) && key <= int64(nkeys)))
		case op == 5:
			ok[r] = !big(f[1], int64(m)) && n >= 1 && !big(f[2], maxPeriod) && key == 0 && !big(f[3], 1<<30) &&
				y >= extra && y+2*n-1 <= int64(len(argv))
			for i := y; ok[r] && i < y+2*n; i += 2 {
				ok[r] = inRange(at(int(i)), 1, maxRate) && inRange(at(int(i+1)), 0, maxRate)
			}
		default:
			wantN := map[bool]int64{true: 1, false: 0}[op == 2]
			ok[r] = !big(f[1], 1) && n == wantN && !big(f[3], 0) && !big(f[4], 0) &&
				((op == 3 && !big(f[2], maxPeriod) && x >= 1) || (op != 3 && !big(f[2], 0)))
		}
		_ = x
	}
	return true, "", ok
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
	var keys []string
	for _, s := range sc.keys {
		keys = append(keys, tag+s)
	}
	pair.Track(keys...)
	now := redistest.Epoch
	pair.SetTime(t, now, clock)
	ctx := context.Background()
	trace := fmt.Sprintf("%s%s ARGV %q, key %q, pre %d, junk %q", sc.name, sc.keys[0], argv, key, pre, junk)

	run := func(args []string) ([]int64, error) {
		var out [2][]int64
		var errs [2]error
		for i, b := range []*redistest.Backend{pair.Mini, pair.Real} {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			out[i], errs[i] = script(b, sc.name).Run(cctx, b.Client, keys, toAny(args)...).Int64Slice()
			cancel()
		}
		if code(errs[0]) != code(errs[1]) || fmt.Sprint(out[0]) != fmt.Sprint(out[1]) {
			t.Fatalf("%s: miniredis %v %v, redis %v %v", trace, out[0], errs[0], out[1], errs[1])
		}
		return out[0], errs[0]
	}

	if pre&1 == 1 { // a good call first, leaving state the fuzzed call meets
		if _, err := run(sc.good); err != nil {
			t.Fatalf("%s: the good call failed: %v", trace, err)
		}
	}
	foreignKey := ""
	if p := int(pre/8) % len(argPrestates); p != 0 {
		foreignKey = keys[int(pre/2)%4%len(keys)]
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
	ok, why, reqOK := argsOK(sc, argv, len(keys))
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
		op := argv[1+(map[bool]int{true: 4, false: 5}[sc.width == 0])*r]
		detail[r] = reqOK[r] && (op == "2" && sc.width > 0 || op == "3" && sc.width == 0)
	}
	out, perr := parseReply(v, detail)
	if perr != nil {
		t.Fatalf("%s: %v", trace, perr)
	}
	failed := 0
	for r, res := range out {
		switch c := code(fmt.Errorf("%s", res.err)); {
		case !reqOK[r]:
			if !strings.HasPrefix(res.err, fmt.Sprintf("JTARG request %d: ", r+1)) {
				t.Fatalf("%s: request %d: %v, want JTARG", trace, r+1, res)
			}
		case res.err == "":
			if err := replyShape(sc, argv, r, res); err != nil {
				t.Fatalf("%s: request %d: %v", trace, r+1, err)
			}
			continue
		case c == "JTSTATE" && foreignKey != "", c == "JTALG", c == "JTEXCEEDS":
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

// replyShape checks a request's successful reply against its op's shape.
func replyShape(sc fuzzScript, argv []string, r int, res res) error {
	v := res.v
	if sc.width == 0 {
		op := num(argv[1+4*r])
		switch {
		case op == 3 && (v[0] != 1 || v[1] != 0 || len(res.extra) < 5 || res.extra[0] != v[2]):
			return fmt.Errorf("inspect %v", res)
		case op < 3 && (v[0] < 0 || v[0] > 1 || v[1] < 0 || v[2] < 0 || (op == 0 && v[0] == 0 && v[1] < 1)):
			return fmt.Errorf("reply %v: want ok 0|1, wait >= 0 (>= 1 when denied), held >= 0", res)
		}
		return nil
	}
	op, n := num(argv[1+5*r]), num(argv[2+5*r])
	m := int(num(argv[1+5*int(num(argv[0]))]))
	for _, x := range v[1:4] {
		if x < 0 {
			return fmt.Errorf("reply %v: a negative number", res)
		}
	}
	switch {
	case op == 0 && (v[0] < 0 || v[0] > 2 || (v[0] == 0 && (v[2] < 1 || v[4] != 0)) || (v[0] == 1 && n > 0 && v[4] == 0)):
		return fmt.Errorf("acquire %v", res)
	case op == 1 && (v[0] < 0 || v[0] > 1 || v[1] != 0 || v[2] != 0 || v[5] != 0):
		return fmt.Errorf("cancel %v", res)
	case op == 2 && (v[0] != 1 || len(res.extra) != 5+3*m):
		return fmt.Errorf("inspect %v", res)
	case op >= 3 && (v[0] != 1 || v[1] != 0 || (op != 4 && v[4] != 0) || v[4] < 0 || v[5] != 0):
		return fmt.Errorf("control %v", res)
	}
	return nil
}

// code is the kind of error a script call returned: JTARG, JTSTATE, JTALG, JTEXCEEDS,
// WRONGTYPE, or its text (miniredis wraps a script's error in its own "ERR ..."), "" for
// nil.
func code(err error) string {
	if err == nil || err.Error() == "" {
		return ""
	}
	for _, c := range []string{"JTARG", "JTSTATE", "JTALG", "JTEXCEEDS", "WRONGTYPE"} {
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
// exists; each argument made bad; foreign content in its keys; an argument too many and
// too few.
func argSeeds() map[string][]any {
	join := func(a ...string) []byte { return []byte(strings.Join(a, "\x1f")) }
	out := map[string][]any{}
	add := func(name string, which int, key string, argv []byte, pre int, junk string) {
		out[name] = []any{uint8(which), key, argv, uint8(pre), junk}
	}
	for i, sc := range fuzzScripts {
		name := sc.name + strings.ReplaceAll(sc.keys[0], ":", "-")
		add(name+"-good", i, "k", join(sc.good...), 0, "")
		add(name+"-good-on-state", i, "k", join(sc.good...), 1, "")
		add(name+"-good-an-hour-later", i, "k", join(sc.good...), 1+6, "")
		for j := range sc.good {
			args := append([]string(nil), sc.good...)
			args[j] = "-" + sc.good[j]
			add(fmt.Sprintf("%s-arg%d-negative", name, j+1), i, "k", join(args...), 1, "")
		}
		for _, bad := range []struct{ name, v string }{{"empty", ""}, {"fraction", "1.5"}, {"exponent", "1e3"},
			{"hex", "0x10"}, {"space", " 1"}, {"20-digits", "99999999999999999999"},
			{"leading-zeros", "00000000000000000001"}, {"minus-zero", "-0"}} {
			for _, j := range []int{0, 2} { // k, and the first request's op or n
				args := append([]string(nil), sc.good...)
				args[j] = bad.v
				add(fmt.Sprintf("%s-arg%d-%s", name, j+1, bad.name), i, "k", join(args...), 1, "")
			}
		}
		add(name+"-argument-too-many", i, "k", join(append(sc.good, "1")...), 0, "")
		add(name+"-argument-too-few", i, "k", join(sc.good[:len(sc.good)-1]...), 0, "")
		add(name+"-no-arguments", i, "k", nil, 0, "")
		add(name+"-string-in-first-key-braces-in-key", i, "a}{b", join(sc.good...), 1+8*1, "junk")
		add(name+"-zset-in-first-key-binary-key", i, "\x00\xff", join(sc.good...), 1+8*3, "x y")
		add(name+"-hash-in-second-key", i, "k", join(sc.good...), 2+8*4, "v")
		add(name+"-string-in-fourth-key", i, "k", join(sc.good...), 6+8*1, "1 2 x")
		add(name+"-numbers-list-in-first-key", i, "k", join(sc.good...), 8*7, "7")
	}
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
