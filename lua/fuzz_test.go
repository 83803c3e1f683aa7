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
// miniredis and a real redis-server side by side (redistest.Pair; the production
// script on miniredis, its fake-clock copy on the real server), after an optional
// good call that leaves state and optional foreign content in one of its keys, at a
// time the input picks. Properties:
//   - ARGV outside the header's contract (checked here by argsOK, independently of
//     the script) gets an error starting with JTARG, and no key changes;
//   - ARGV inside it gets a reply of the header's shape, all integers, or, only when
//     a key holds foreign content, a JTSTATE or WRONGTYPE error and no key changes;
//   - both servers answer alike and hold the same state after; every key a call
//     changed has a TTL.
//
// The model-checked fuzz targets of each algorithm and of the semaphore are in
// throttle/fuzz_test.go and throttle/fuzz_semaphore_test.go.
func FuzzScriptArgs(f *testing.F) {
	// Without a real server every input is skipped (NewPair), and go test prints
	// nothing of it: say so (t.Log, and under CI the figures file .ci/run prints).
	if _, err := redistest.StandaloneAddr(); err != nil {
		redistest.Figure(f, "NOT CHECKED on real Redis: no redis (%v); every input is skipped (each runs on miniredis and a real redis-server side by side)", err)
	}
	f.Fuzz(func(t *testing.T, which uint8, key string, argv []byte, pre uint8, junk string) {
		runScriptArgs(t, which, key, argv, pre, junk)
	})
}

// fuzzScript is a script as FuzzScriptArgs calls it.
type fuzzScript struct {
	name string
	prod *redis.Script
	fake *redis.Script
	keys []string // suffixes after the hash tag
	good []string // arguments that work, for the call before the fuzzed one
	// reply checks a successful reply to argv
	reply func(argv []string, v []int64) error
}

var fuzzScripts = []fuzzScript{
	{"slidingwindow", SlidingWindow.Script(), redistest.FakeClockScript(SlidingWindow.Source()), []string{":sw", ":pause"},
		[]string{"0", "2", "1000000", "1", "5", "1000000"}, limiterReply},
	{"slidingcounter", SlidingCounter.Script(), redistest.FakeClockScript(SlidingCounter.Source()), []string{":sc", ":pause"},
		[]string{"0", "2", "1000000", "1", "100000", "5", "1000000"}, limiterReply},
	{"gcra", GCRA.Script(), redistest.FakeClockScript(GCRA.Source()), []string{":tb", ":pause"},
		[]string{"0", "2", "1000000", "1", "5", "1000000", "5"}, limiterReply},
	{"fixedwindow", FixedWindow.Script(), redistest.FakeClockScript(FixedWindow.Source()), []string{":fw", ":pause"},
		[]string{"0", "2", "1000000", "1", "5", "1000000"}, limiterReply},
	{"pause", Pause.Script(), redistest.FakeClockScript(Pause.Source()), []string{":pause"}, []string{"1000000"},
		func(argv []string, v []int64) error {
			if len(v) != 1 || v[0] < mustInt(argv[0]) {
				return fmt.Errorf("reply %v: want one integer >= d", v)
			}
			return nil
		}},
	{"semaphore", Semaphore.Script(), redistest.FakeClockScript(Semaphore.Source()), []string{":sem", ":semq", ":semx", ":pause"},
		[]string{"0", "0123456789abcdef0123456789abcdef", "1", "1000000", "1"},
		func(argv []string, v []int64) error {
			if len(v) != 3 || v[0] < 0 || v[0] > 1 || v[1] < 0 || v[2] < 0 || (v[0] == 0 && mustInt(argv[0]) == 0 && v[1] < 1) {
				return fmt.Errorf("reply %v: want {ok 0|1, wait >= 0 (>= 1 when denied), held >= 0}", v)
			}
			return nil
		}},
}

// limiterReply checks {granted, remaining, wait_us, reset_us, token}.
func limiterReply(argv []string, v []int64) error {
	if len(v) != 5 {
		return fmt.Errorf("reply %v: want 5 integers", v)
	}
	for _, x := range v {
		if x < 0 {
			return fmt.Errorf("reply %v: a negative number", v)
		}
	}
	switch {
	case v[0] > 1:
		return fmt.Errorf("reply %v: granted is not 0 or 1", v)
	case mustInt(argv[0]) == 1 && (v[1] != 0 || v[2] != 0 || v[4] != 0):
		return fmt.Errorf("cancel reply %v: want {freed, 0, 0, reset, 0}", v)
	case mustInt(argv[0]) == 0 && v[0] == 0 && (v[2] < 1 || v[4] != 0):
		return fmt.Errorf("denied reply %v: want wait >= 1 and no token", v)
	case mustInt(argv[0]) == 0 && v[0] == 1 && mustInt(argv[1]) > 0 && v[4] == 0:
		return fmt.Errorf("grant %v: no token", v)
	}
	return nil
}

// bigInt parses a decimal integer (sign allowed) of any length.
func bigInt(s string) (*big.Int, bool) {
	return new(big.Int).SetString(s, 10)
}

func mustInt(s string) int64 {
	v, _ := bigInt(s)
	return v.Int64()
}

var (
	digits     = regexp.MustCompile(`^[0-9]+$`)
	signedInt  = regexp.MustCompile(`^-?[0-9]+$`)
	lowerHex32 = regexp.MustCompile(`^[0-9a-f]{32}$`)
)

// inRange reports whether s is a plain decimal integer in [lo, hi]; short means it
// must also be at most 16 characters, a sign allowed (the prelude's jt_int).
func inRange(s string, lo, hi int64, short bool) bool {
	if short && (len(s) > 16 || !signedInt.MatchString(s)) {
		return false
	}
	v, ok := bigInt(s)
	return ok && v.Cmp(big.NewInt(lo)) >= 0 && v.Cmp(big.NewInt(hi)) <= 0
}

// argsOK is each header's ARGV contract, written out again: whether argv is valid
// for the script, and if not, what is wrong.
func argsOK(name string, argv []string) (bool, string) {
	const maxRate, maxPeriod, maxWait = 1_000_000_000, 1 << 45, 1<<53 - 1
	switch name {
	case "pause":
		if len(argv) == 0 || !inRange(argv[0], 1, maxPeriod, true) {
			return false, "d"
		}
		return true, ""
	case "semaphore":
		switch {
		case len(argv) < 1 || !inRange(argv[0], 0, 2, true):
			return false, "op"
		case len(argv) < 2 || !lowerHex32.MatchString(argv[1]):
			return false, "id"
		case len(argv) < 3 || !inRange(argv[2], 1, maxRate, true):
			return false, "max"
		case len(argv) < 4 || !inRange(argv[3], 1000, maxPeriod, true):
			return false, "ttl"
		case len(argv) < 5 || !inRange(argv[4], 0, 1, true):
			return false, "queue"
		case len(argv) != 5:
			return false, "argument count"
		}
		return true, ""
	}
	// the limiter scripts: op, n, x, m, [bucket], m groups
	for i, a := range argv {
		if !digits.MatchString(a) {
			return false, fmt.Sprintf("argument %d is not plain digits", i+1)
		}
	}
	first, width := 5, 2
	hi := []int64{maxRate, maxPeriod, maxRate}
	switch name {
	case "slidingcounter":
		first = 6
	case "gcra":
		width = 3
	}
	switch {
	case len(argv) < 1 || !inRange(argv[0], 0, 1, false):
		return false, "op"
	case len(argv) < 2 || !inRange(argv[1], 0, 1e15, false):
		return false, "n"
	case len(argv) < 3 || !inRange(argv[2], 0, maxWait, false):
		return false, "max_wait/token"
	case len(argv) < 4 || !inRange(argv[3], 1, 16, false):
		return false, "m"
	}
	m := int(mustInt(argv[3]))
	if len(argv) != first-1+m*width {
		return false, "argument count"
	}
	n := mustInt(argv[1])
	for i := 0; i < m; i++ {
		for j := 0; j < width; j++ {
			if !inRange(argv[first-1+i*width+j], 1, hi[j], false) {
				return false, fmt.Sprintf("limit %d field %d", i+1, j+1)
			}
		}
		rate, period := mustInt(argv[first-1+i*width]), mustInt(argv[first+i*width])
		switch name {
		case "gcra":
			burst := mustInt(argv[first+1+i*width])
			if burst*period > 1<<50 {
				return false, "burst x period"
			}
			if n > burst {
				return false, "n above burst"
			}
		default:
			if n > rate {
				return false, "n above rate"
			}
		}
	}
	if name == "slidingcounter" && !inRange(argv[4], 1, maxPeriod, true) {
		return false, "bucket"
	}
	return true, ""
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
	trace := fmt.Sprintf("%s ARGV %q, key %q, pre %d, junk %q", sc.name, argv, key, pre, junk)

	run := func(args []string) ([]int64, error) {
		var out [2][]int64
		var errs [2]error
		for i, b := range []*redistest.Backend{pair.Mini, pair.Real} {
			s := sc.prod
			if b.Real() {
				s = sc.fake
			}
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			out[i], errs[i] = ints(s.Run(cctx, b.Client, keys, toAny(args)...))
			cancel()
		}
		if code(errs[0]) != code(errs[1]) || fmt.Sprint(out[0]) != fmt.Sprint(out[1]) {
			t.Fatalf("%s: miniredis %v %v, redis %v %v", trace, out[0], errs[0], out[1], errs[1])
		}
		return out[0], errs[0]
	}

	// a good call first (pre & 1), leaving state the fuzzed call meets
	if pre&1 == 1 {
		if _, err := run(sc.good); err != nil {
			t.Fatalf("%s: the good call failed: %v", trace, err)
		}
	}
	// foreign content in one key
	foreign := ""
	if p := int(pre/8) % len(argPrestates); p != 0 {
		foreign = keys[int(pre/2)%4%len(keys)]
		words := strings.Fields(junk)
		if len(words) == 0 {
			words = []string{junk}
		}
		for _, b := range []*redistest.Backend{pair.Mini, pair.Real} {
			c := b.Client
			c.Del(ctx, foreign)
			var err error
			switch argPrestates[p] {
			case "string":
				err = c.Set(ctx, foreign, junk, 0).Err()
			case "list":
				err = c.RPush(ctx, foreign, toAny(words)...).Err()
			case "zset":
				for i, w := range words {
					err = c.ZAdd(ctx, foreign, redis.Z{Member: w, Score: float64(now.UnixMicro() + int64(i-1)*1000)}).Err()
				}
			case "hash":
				err = c.HSet(ctx, foreign, "f", junk).Err()
			case "set":
				err = c.SAdd(ctx, foreign, toAny(words)...).Err()
			case "numbers string":
				err = c.Set(ctx, foreign, fmt.Sprint(now.UnixMicro()+int64(len(junk))), 0).Err()
			case "numbers list":
				err = c.RPush(ctx, foreign, "0", fmt.Sprint(now.UnixMicro()+int64(len(junk))), "1").Err()
			}
			if err != nil {
				t.Fatalf("%s: foreign content: %v", trace, err)
			}
		}
	}
	// time passes (pre & 6: 0, 1ms, 1s, 1h)
	now = now.Add([]time.Duration{0, time.Millisecond, time.Second, time.Hour}[int(pre/2)%4])
	pair.SetTime(t, now, clock)

	before := pair.Sync(t)
	v, err := run(argv)
	after := pair.Compare(t, trace)
	ok, why := argsOK(sc.name, argv)
	unchanged := func() {
		for k, s := range after {
			if b := before[k]; !s.Same(b) || s.TTL != b.TTL {
				t.Fatalf("%s: failed (%v), yet %q changed:\n  before %v\n  after  %v", trace, err, k, b, s)
			}
		}
	}
	switch {
	case !ok:
		if code(err) != "JTARG" {
			t.Fatalf("%s: %v, want a JTARG error (%s)", trace, err, why)
		}
		unchanged()
	case err != nil:
		if c := code(err); foreign == "" || (c != "JTSTATE" && c != "WRONGTYPE") {
			t.Fatalf("%s: %v, want a reply (valid arguments)", trace, err)
		}
		unchanged()
	default:
		if err := sc.reply(argv, v); err != nil {
			t.Fatalf("%s: %v", trace, err)
		}
		for k, s := range after {
			if s.Type == "none" || s.TTL >= 0 {
				continue
			}
			if b := before[k]; k == foreign && s.Same(b) {
				continue // foreign content the call left alone
			}
			t.Fatalf("%s: key %q has no TTL: %v", trace, k, s)
		}
	}
}

// ints reads a script's reply: one integer, or a list of integers.
func ints(cmd *redis.Cmd) ([]int64, error) {
	v, err := cmd.Result()
	if err != nil {
		return nil, err
	}
	switch v := v.(type) {
	case int64:
		return []int64{v}, nil
	case []any:
		out := make([]int64, len(v))
		for i, e := range v {
			n, ok := e.(int64)
			if !ok {
				return nil, fmt.Errorf("reply %v: element %d is not an integer", v, i+1)
			}
			out[i] = n
		}
		return out, nil
	}
	return nil, fmt.Errorf("reply of the wrong type: %v", v)
}

// code is the kind of error a script call returned: JTARG, JTSTATE, WRONGTYPE, or
// its text (miniredis wraps a script's error in its own "ERR ..."), "" for nil.
func code(err error) string {
	if err == nil {
		return ""
	}
	for _, c := range []string{"JTARG", "JTSTATE", "WRONGTYPE"} {
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
// exists; each argument made bad the ways the header forbids; foreign content in its
// keys; an argument too many and too few.
func argSeeds() map[string][]any {
	join := func(a ...string) []byte { return []byte(strings.Join(a, "\x1f")) }
	out := map[string][]any{}
	add := func(name string, which int, key string, argv []byte, pre int, junk string) {
		out[name] = []any{uint8(which), key, argv, uint8(pre), junk}
	}
	for i, sc := range fuzzScripts {
		add(sc.name+"-good", i, "k", join(sc.good...), 0, "")
		add(sc.name+"-good-on-state", i, "k", join(sc.good...), 1, "")
		add(sc.name+"-good-an-hour-later", i, "k", join(sc.good...), 1+6, "")
		for j := range sc.good {
			args := append([]string(nil), sc.good...)
			args[j] = "-" + sc.good[j]
			add(fmt.Sprintf("%s-arg%d-negative", sc.name, j+1), i, "k", join(args...), 1, "")
		}
		for _, bad := range []struct{ name, v string }{{"empty", ""}, {"fraction", "1.5"}, {"exponent", "1e3"},
			{"hex", "0x10"}, {"space", " 1"}, {"20-digits", "99999999999999999999"},
			{"leading-zeros", "00000000000000000001"}, {"minus-zero", "-0"}} {
			args := append([]string(nil), sc.good...)
			j := map[string]int{"slidingcounter": 4, "semaphore": 0}[sc.name] // SC's bucket, the semaphore's op
			args[j] = bad.v
			add(fmt.Sprintf("%s-arg%d-%s", sc.name, j+1, bad.name), i, "k", join(args...), 1, "")
		}
		add(sc.name+"-argument-too-many", i, "k", join(append(sc.good, "1")...), 0, "")
		add(sc.name+"-argument-too-few", i, "k", join(sc.good[:len(sc.good)-1]...), 0, "")
		add(sc.name+"-no-arguments", i, "k", nil, 0, "")
		add(sc.name+"-string-in-first-key-braces-in-key", i, "a}{b", join(sc.good...), 1+8*1, "junk")
		add(sc.name+"-zset-in-first-key-binary-key", i, "\x00\xff", join(sc.good...), 1+8*3, "x y")
		add(sc.name+"-hash-in-second-key", i, "k", join(sc.good...), 2+8*4, "v")
		add(sc.name+"-numbers-list-in-first-key", i, "k", join(sc.good...), 8*7, "7")
	}
	return out
}

// The seed files say what argSeeds writes (JOBTHROTTLE_WRITE_SEEDS=1 writes them).
func TestFuzzScriptArgsSeeds(t *testing.T) {
	write := os.Getenv("JOBTHROTTLE_WRITE_SEEDS") != ""
	for name, values := range argSeeds() {
		var b strings.Builder
		b.WriteString("go test fuzz v1\n")
		fmt.Fprintf(&b, "byte(%q)\nstring(%q)\n[]byte(%q)\nbyte(%q)\nstring(%q)\n",
			values[0], values[1], values[2], values[3], values[4])
		path := filepath.Join("testdata", "fuzz", "FuzzScriptArgs", name)
		if write {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
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
}
