// Command luaexec measures how long each limiter script runs inside Redis: the
// server's own execution time per EVALSHA (INFO commandstats), free of the network and
// of the client, case by case, for every jobthrottle algorithm and the peers (redis_rate,
// the Redisson-style log). Calls are sent in pipelines of 100 from one connection; the
// cases run in rounds, interleaved, and the fastest round of each is reported (the
// machine is shared and noisy; the fastest round is the one least disturbed), then the
// ratios the goals name, of those fastest rounds.
//
//	go run ./cmd/luaexec                        # starts its own redis-server
//	go run ./cmd/luaexec -addr 127.0.0.1:6379 -rounds 20
//	go run ./cmd/luaexec -only TokenBucket,redis_rate   # the no-op and the cases named so
//
// Each algorithm's cases, on a limit per second never reached (allowed) or always
// exceeded (denied): a lone acquire; on keys no call made before (fresh); under an
// operator's override; a log whose oldest entry expires on every call (a 10 ms period); a
// batch of 32 acquires (per request); a tenant's acquire (the group's limit, the tenant's
// caps and the fair share); an acquire on a limiter of calls and tokens (costs); a settle
// of such a grant, each on a key of its own holding that one grant (a lone settle). And
// the floor (a script of its own, see floor): what a token bucket's lone acquire costs in
// this protocol's shape when it checks nothing.
//
// To compare with 5867cf1's scripts (the protocol before tenants and costs) in one run,
// dump them with that commit's luaexec -dump DIR and pass -base DIR: the cases that
// protocol can make run with them too, as "base ...", with its arguments (oldArgs). To
// compare with an earlier version of this protocol's scripts (this command's -dump at
// that commit), pass -alt DIR: every jobthrottle case runs with them too, as "alt".
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/jobthrottle/jobthrottle/bench/internal/redisinfo"
	"github.com/jobthrottle/jobthrottle/bench/redisson"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// xcase is one script on one path: its SHA, and the keys and arguments of call i.
type xcase struct {
	name string
	sha  string
	call func(i int) (keys []string, args []any)
	// per: requests per call (the batch cases report exec per request)
	per int
	// setup runs once before the rounds (an override set); prep before each round's
	// calls, unmeasured (the grants a settle case settles), given the round's first
	// call's number
	setup, prep func(ctx context.Context, rdb *redis.Client, first int) error
}

// algo is a limiter algorithm: its head for a limit of rate per period, its script's
// name (the dumps' file), and 5867cf1's arguments after a single call's requests.
type algo struct {
	name, script, suffix string
	head                 func(rate, period int) string
	old                  func(rate, period int) []any // 5867cf1: m, the limit, parameters, A, record, its TTL
}

var algos = []algo{
	{"SlidingWindow", "log", "sw", func(r, p int) string { return fmt.Sprintf("sw %d %d", r, p) },
		func(r, p int) []any { return []any{1, r, p, 0, 0, "", 0} }},
	{"SlidingCounter", "log", "sc", func(r, p int) string { return fmt.Sprintf("sc 50 %d %d", r, p) },
		func(r, p int) []any { return []any{1, r, p, p / 50, 0, "", 0} }},
	{"TokenBucket", "bucket", "tb", func(r, p int) string { return fmt.Sprintf("tb %d %d %d", r, p, r) },
		func(r, p int) []any { return []any{1, r, p, r, 0, "", 0} }},
	{"FixedWindow", "window", "fw", func(r, p int) string { return fmt.Sprintf("fw %d %d", r, p) },
		func(r, p int) []any { return []any{1, r, p, 0, "", 0} }},
}

const (
	never, often = 1000000000, 100 // rates per second: never reached, always exceeded
	second       = 1000000
	batchSize    = 32 // requests in the batch cases
)

// jobthrottleCases returns every algorithm's cases with this tree's scripts, with alt's
// (a dump of this protocol's, by script name) as "alt ..." and base's (5867cf1's) as
// "base ...".
func jobthrottleCases(base, alt map[string]string) []xcase {
	noop := redis.NewScript("return 1")
	out := []xcase{{name: "no-op (return 1)", sha: noop.Hash(), call: fixed([]string{"{jtbench:noop}:x"}, 1), per: 1}}
	n := 0
	tag := func() string { n++; return fmt.Sprintf("{jtbench:luaexec%d}", n) }
	for _, a := range algos {
		versions := []struct{ prefix, sha string }{{"", lua.Script(a.script).Hash()}}
		if src, ok := alt[a.script]; ok {
			versions = append([]struct{ prefix, sha string }{{"alt ", redis.NewScript(src).Hash()}}, versions...)
		}
		oldSHA := ""
		if src, ok := base[a.script]; ok {
			oldSHA = redis.NewScript(src).Hash()
		}
		name := func(path string) string { return "jobthrottle " + a.name + " " + path }
		type path struct {
			name         string
			rate, period int
			fresh, over  bool
		}
		paths := []path{{"allowed", never, second, false, false}, {"denied", often, second, false, false},
			{"allowed, no state yet (fresh keys)", never, second, true, false}, {"allowed, override set", never, second, false, true}}
		if a.script == "log" {
			paths = append(paths, path{"allowed, an entry expires every call", never, 10000, false, false})
		}
		for _, p := range paths {
			head := a.head(p.rate, p.period)
			if oldSHA != "" {
				out = append(out, oldCase("base "+name(p.name), oldSHA, tag(), a, p.rate, p.period, 1, p.fresh, p.over))
			}
			for _, v := range versions {
				c := xcase{name: v.prefix + name(p.name), sha: v.sha, per: 1, call: fixed([]string{tag() + ":l"}, head, "", "a 1 0")}
				if p.fresh {
					c.call = func(i int) ([]string, []any) {
						return []string{fmt.Sprintf("{jtbench:fresh%d}:l", i)}, []any{head, "", "a 1 0"}
					}
				}
				if p.over { // an operator's override of the rate, for an hour
					keys, _ := c.call(0)
					c.setup = func(ctx context.Context, rdb *redis.Client, _ int) error {
						return rdb.EvalSha(ctx, c.sha, keys, head, "", fmt.Sprintf("o %d %d 0", 3600*second, never)).Err()
					}
				}
				out = append(out, c)
			}
		}
		for _, p := range paths[:2] {
			path := fmt.Sprintf("%s, batch of %d (per request)", p.name, batchSize)
			if oldSHA != "" {
				out = append(out, oldCase("base "+name(path), oldSHA, tag(), a, p.rate, p.period, batchSize, false, false))
			}
			args := []any{a.head(p.rate, p.period), ""}
			for range batchSize {
				args = append(args, "a 1 0")
			}
			for _, v := range versions {
				out = append(out, xcase{name: v.prefix + name(path), sha: v.sha, per: batchSize, call: fixed([]string{tag() + ":l"}, args...)})
			}
		}
		group, caps := a.head(never, second), a.head(never/10, second)
		costs := group + " /tokens " + strings.TrimPrefix(strings.TrimPrefix(a.head(never, second), a.suffix+" "), "50 ")
		for _, v := range versions {
			t := tag()
			out = append(out, xcase{name: v.prefix + name("tenant acquire (group, caps, fair share)"), sha: v.sha, per: 1,
				call: fixed([]string{t + ":l", t + ":q", t + ":t:acme"}, group, caps, "a 1 0 q2 c3 tacme")})
			t = tag()
			keys, args := []string{t + ":l", t + ":q"}, []any{group, caps}
			for i := range batchSize { // the next of batchSize tenants each, as jtbench's tenants case sends them
				keys = append(keys, fmt.Sprintf("%s:t:t%d", t, i))
				args = append(args, fmt.Sprintf("a 1 0 q2 c%d tt%d", i+3, i))
			}
			out = append(out, xcase{name: v.prefix + name(fmt.Sprintf("tenant acquire, batch of %d tenants (per request)", batchSize)),
				sha: v.sha, per: batchSize, call: fixed(keys, args...)})
			// a backlog: the same tenants' Waits (holding their places) on a group of 100/s
			// they keep busy, most of them told when their turn comes
			t = tag()
			keys, args = []string{t + ":l", t + ":q"}, []any{a.head(100, second), ""}
			for i := range batchSize {
				args = append(args, fmt.Sprintf("a 1 %d q2 h tt%d", 3600*second, i))
			}
			out = append(out, xcase{name: v.prefix + name(fmt.Sprintf("tenant acquire, batch of %d tenants waiting in a backlog (per request)", batchSize)),
				sha: v.sha, per: batchSize, call: fixed(keys, args...)})
			t = tag()
			out = append(out, xcase{name: v.prefix + name("acquire with costs (calls and tokens)"), sha: v.sha, per: 1,
				call: fixed([]string{t + ":l", t + ":u:tokens"}, costs, "", "a 1 0 utokens:100")})
			out = append(out, settleCase(v.prefix+name("settle of a grant of calls and tokens"), v.sha, costs))
		}
		if a.script == "bucket" {
			out = append(out, xcase{name: name(floorCase), sha: floor.Hash(), per: 1,
				call: fixed([]string{tag() + ":l"}, a.head(never, second), "", "a 1 0")})
			t := tag()
			out = append(out, xcase{name: name(tenantFloorCase), sha: tenantFloor.Hash(), per: 1,
				call: fixed([]string{t + ":l", t + ":q", t + ":t:acme"}, a.head(never, second), a.head(never/10, second), "a 1 0 q2 c3 tacme")})
		}
	}
	return out
}

func fixed(keys []string, args ...any) func(int) ([]string, []any) {
	return func(int) ([]string, []any) { return keys, args }
}

// settleCase settles call i's own grant, on a key of its own (a lone settle: the state
// holds that grant alone): the round's grants are made before it, unmeasured.
func settleCase(name, sha, head string) xcase {
	var tokens []int64
	var first int
	keys := func(i int) []string {
		t := fmt.Sprintf("{jtbench:settle%d}", i)
		return []string{t + ":l", t + ":u:tokens", t + ":st:1"}
	}
	return xcase{name: name, sha: sha, per: 1,
		prep: func(ctx context.Context, rdb *redis.Client, from int) error {
			first, tokens = from, tokens[:0]
			var cmds []*redis.Cmd
			p := rdb.Pipeline()
			for i := from; i < from+*calls; i++ {
				cmds = append(cmds, p.EvalSha(ctx, sha, keys(i)[:2], head, "", "a 1 0 utokens:100"))
			}
			if _, err := p.Exec(ctx); err != nil {
				return err
			}
			for _, c := range cmds {
				v, err := c.Int64Slice()
				if err != nil || v[0] != 1 {
					return fmt.Errorf("a grant to settle: %v %v", v, err)
				}
				tokens = append(tokens, v[4])
			}
			return nil
		},
		call: func(i int) ([]string, []any) {
			return keys(i), []any{head, "", fmt.Sprintf("s 1 %d e3 utokens:100:50", tokens[i-first])}
		}}
}

// oldCase is a case of 5867cf1's protocol: k requests of five integers (op, n, x, y, key),
// the limit's fields, parameters, A (the other algorithms' state keys in KEYS) and the
// record; its keys the state, the control key and the record key.
func oldCase(name, sha, tag string, a algo, rate, period, k int, fresh, over bool) xcase {
	keys := []string{tag + ":" + a.suffix, tag + ":pause", tag + ":conf"}
	args := []any{k}
	for range k {
		args = append(args, 0, 1, 0, 0, 0)
	}
	args = append(args, a.old(rate, period)...)
	c := xcase{name: name, sha: sha, per: k, call: fixed(keys, args...)}
	if fresh { // with the other algorithms' state keys, as its callers sent them (A = 3)
		fargs := append([]any(nil), args...)
		fargs[len(fargs)-3] = 3
		c.call = func(i int) ([]string, []any) {
			t := fmt.Sprintf("{jtbench:oldfresh%d}", i)
			ks := []string{t + ":" + a.suffix, t + ":pause", t + ":conf"}
			for _, s := range []string{"sw", "sc", "tb", "fw"} {
				if s != a.suffix {
					ks = append(ks, t+":"+s)
				}
			}
			return ks, fargs
		}
	}
	if over { // its control key's text: an override of limit 1 to the rate, for an hour
		c.setup = func(ctx context.Context, rdb *redis.Client, _ int) error {
			t, err := rdb.Time(ctx).Result()
			if err != nil {
				return err
			}
			us := t.UnixMicro()
			return rdb.Set(ctx, keys[1], fmt.Sprintf("0 %d 1 %d 0 %d", us+3600*second, never, us), time.Hour).Err()
		}
	}
	return c
}

// peerCases: redis_rate's script (not exported: its SHA and arguments are taken from
// one call of its Allow) and the Redisson-style log's, with the same limits.
func peerCases(ctx context.Context, rdb *redis.Client) ([]xcase, error) {
	var out []xcase
	for _, p := range []struct {
		path string
		rate int
	}{{"allowed", never}, {"denied", often}} {
		key := "jtbench:luaexec-rr-" + p.path
		c := &capture{}
		one := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr})
		one.AddHook(c)
		_, err := redis_rate.NewLimiter(one).Allow(ctx, key, redis_rate.PerSecond(p.rate))
		one.Close()
		if err != nil {
			return nil, err
		}
		if c.sha == "" {
			return nil, fmt.Errorf("redis_rate's script call was not seen")
		}
		out = append(out, xcase{name: "redis_rate " + p.path, sha: c.sha, call: fixed([]string{"rate:" + key}, c.args...), per: 1})

		rl := redisson.New(rdb, "jtbench:luaexec-redisson-"+p.path, p.rate, time.Second)
		rdb.Del(ctx, rl.Keys()...)
		if err := rl.TrySetRate(ctx, rdb); err != nil {
			return nil, err
		}
		if err := redisson.Script.Load(ctx, rdb).Err(); err != nil {
			return nil, err
		}
		out = append(out, xcase{name: "Redisson-style log " + p.path, sha: redisson.Script.Hash(), per: 1,
			call: func(i int) ([]string, []any) {
				// the client's clock and a fresh 16-byte id per call, as Redisson sends them
				return rl.Keys(), []any{1, time.Now().UnixMilli(), fmt.Sprintf("%016x", i)}
			}})
	}
	return out, nil
}

// capture notes the first EVALSHA sent through a client.
type capture struct {
	sha  string
	args []any
}

func (c *capture) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *capture) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (c *capture) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); c.sha == "" && cmd.Name() == "evalsha" && len(a) > 4 {
			c.sha, _ = a[1].(string)
			c.args = append([]any(nil), a[4:]...) // evalsha sha 1 key args...
		}
		return next(ctx, cmd)
	}
}

// floor is the least a token bucket's lone acquire in this protocol does, checking
// nothing: TIME, the state's GET and SET (its numbers and head, the TTL in ms) and the
// seven-integer reply, with the head and the request read by one match each. It is not
// a limiter (no pause, override, drift, tenants, costs or bad input); it measures what
// the protocol's shape costs before any of that ("floor ÷ redis_rate").
const floorCase = "allowed, floor: TIME, GET, SET and the reply, nothing checked"

var floor = redis.NewScript(`
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local r, p, b = string.match(ARGV[1], '^tb ([1-9]%d*) ([1-9]%d*) ([1-9]%d*)$')
r, p, b = r + 0, p + 0, b + 0
local n, w = string.match(ARGV[3], '^a ([1-9]%d*) (%d+)$')
n, w = n + 0, w + 0
local v, u = redis.call('GET', KEYS[1]), b * p
if v then
  local last, held = string.match(v, '^([1-9]%d*) (%-?%d+) %d+\n')
  u = math.min(b * p, held + (now - last) * r)
end
local at = now
if n * p > u then
  at = now + math.ceil((n * p - u) / r)
end
local ok = at - now <= w
if ok then
  u = u - n * p
end
local reset = math.ceil((b * p - u) / r)
redis.call('SET', KEYS[1], string.format('%d %d 0\n%s', now, u, ARGV[1]), 'PX', string.format('%d', math.max(1, math.ceil(reset / 1000))))
return {ok and 1 or 0, math.floor(u / p), at - now, reset, ok and at or 0, 0, 0}
`)

// tenantFloor is the least a tenant's lone acquire does in this protocol's layout
// (docs/design.md: the group's state, the tenant's caps in a key of its own that expires
// when idle, the fair share's tags in a sorted set), checking nothing: TIME, the two
// states' GET and SET, the tenant's ZSCORE and ZADD and the queue's PEXPIRE, and the
// seven-integer reply. Like floor, it is not a limiter; it measures the commands that
// layout costs ("tenant floor ÷ redis_rate").
const tenantFloorCase = "tenant floor: TIME, 2 GET, 2 SET, ZSCORE, ZADD, PEXPIRE, nothing checked"

var tenantFloor = redis.NewScript(`
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local g, c = redis.call('GET', KEYS[1]), redis.call('GET', KEYS[3])
local name = '1000000 ' .. string.match(ARGV[3], ' t(.*)$')
local f = tonumber(redis.call('ZSCORE', KEYS[2], name) or '0')
redis.call('ZADD', KEYS[2], string.format('%.17g', f + 1), name)
redis.call('PEXPIRE', KEYS[2], '1000')
redis.call('SET', KEYS[1], string.format('%d %d 0\n%s', now, 999999000000, ARGV[1]), 'PX', '1000')
redis.call('SET', KEYS[3], string.format('%d %d 0\n%s', now, 999999000000, ARGV[2]), 'PX', '1000')
return {1, 999999, 0, 1000000, now, 0, 0}
`)

// ratios are the figures the goals name: a case's fastest round over another's.
var ratios = []struct{ what, num, den string }{
	{"lone plain acquire ÷ redis_rate", "allowed", "redis_rate allowed"},
	{"floor ÷ redis_rate", floorCase, "redis_rate allowed"},
	{"tenant acquire ÷ redis_rate", "tenant acquire (group, caps, fair share)", "redis_rate allowed"},
	{"tenant floor ÷ redis_rate", tenantFloorCase, "redis_rate allowed"},
	{"settle ÷ acquire with costs", "settle of a grant of calls and tokens", "acquire with costs (calls and tokens)"},
}

var calls = flag.Int("calls", 2000, "calls per case per round")

func main() {
	addr := flag.String("addr", "", "redis-server to use, host:port; empty starts one on a free 127.0.0.1 port")
	rounds := flag.Int("rounds", 20, "rounds per case")
	only := flag.String("only", "", "run only the cases whose name contains one of these comma-separated texts (and the no-op)")
	dump := flag.String("dump", "", "write the scripts' texts to this directory and exit")
	baseDir := flag.String("base", "", "a directory holding 5867cf1's scripts (its luaexec -dump): run the cases its protocol can make with them too, as \"base ...\"")
	altDir := flag.String("alt", "", "a directory holding another version of this protocol's scripts (a -dump of it): run each jobthrottle case with them too, as \"alt ...\"")
	flag.Parse()
	log.SetFlags(0)
	names := []string{"log", "bucket", "window"}
	if *dump != "" {
		for _, name := range append(names, "semaphore") {
			if err := os.WriteFile(filepath.Join(*dump, name+".lua"), []byte(lua.Source(name)), 0o644); err != nil {
				log.Fatal(err)
			}
		}
		return
	}
	read := func(dir string) map[string]string {
		m := map[string]string{}
		for _, name := range names {
			if dir == "" {
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, name+".lua"))
			if err != nil {
				log.Fatal(err)
			}
			m[name] = string(b)
		}
		return m
	}
	base, alt := read(*baseDir), read(*altDir)
	if *addr == "" {
		s, err := redistest.StartServer()
		if err != nil {
			log.Fatalf("no -addr and redis-server could not be started: %v", err)
		}
		defer redistest.StopAll()
		*addr = s.Addr
	}
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: *addr})
	defer rdb.Close()
	scripts := []*redis.Script{redis.NewScript("return 1"), floor, tenantFloor}
	for _, name := range names {
		scripts = append(scripts, lua.Script(name))
	}
	for _, m := range []map[string]string{base, alt} {
		for _, src := range m {
			scripts = append(scripts, redis.NewScript(src))
		}
	}
	for _, s := range scripts {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			log.Fatal(err)
		}
	}
	cs := jobthrottleCases(base, alt)
	peers, err := peerCases(ctx, rdb)
	if err != nil {
		log.Fatal(err)
	}
	cs = append(cs, peers...)
	if *only != "" {
		var keep []xcase
		for i, c := range cs {
			for _, o := range strings.Split(*only, ",") {
				if i == 0 || strings.Contains(c.name, o) {
					keep = append(keep, c)
					break
				}
			}
		}
		cs = keep
	}
	n := 0 // calls made: each call's number is its own
	for _, c := range cs {
		if c.setup != nil {
			if err := c.setup(ctx, rdb, 0); err != nil {
				log.Fatalf("%s: %v", c.name, err)
			}
		}
		if c.prep == nil { // a first call, to check it and make its state
			n++
			keys, args := c.call(n)
			if err := rdb.EvalSha(ctx, c.sha, keys, args...).Err(); err != nil && err != redis.Nil {
				log.Fatalf("%s: %v", c.name, err)
			}
		}
	}
	best := make([]time.Duration, len(cs))
	for r := 0; r < *rounds; r++ {
		for i, c := range cs {
			k := *calls / max(1, c.per/8)
			if c.prep != nil {
				if err := c.prep(ctx, rdb, n+1); err != nil {
					log.Fatalf("%s: %v", c.name, err)
				}
			}
			d, err := redisinfo.ExecPerCall(ctx, rdb, k, func(p redis.Pipeliner) {
				n++
				keys, args := c.call(n)
				p.EvalSha(ctx, c.sha, keys, args...)
			})
			if err != nil {
				log.Fatalf("%s: %v", c.name, err)
			}
			if r == 0 || d < best[i] {
				best[i] = d
			}
		}
	}
	us := map[string]float64{}
	fmt.Printf("| script, path | exec µs per call (fastest of %d rounds of %d) |\n|---|---:|\n", *rounds, *calls)
	for i, c := range cs {
		us[c.name] = float64(best[i]) / float64(time.Microsecond) / float64(max(1, c.per))
		fmt.Printf("| %s | %.2f |\n", c.name, us[c.name])
		if c.prep == nil {
			keys, _ := c.call(0)
			rdb.Del(ctx, keys...)
		}
	}
	fmt.Printf("\n| ratio | %s |\n|---|%s\n", strings.Join(algoNames(), " | "), strings.Repeat("---:|", len(algos)))
	for _, q := range ratios {
		for _, prefix := range []string{"base ", "alt ", ""} {
			row, any := "| "+prefix+q.what+" |", false
			for _, a := range algos {
				num, den := us[prefix+"jobthrottle "+a.name+" "+q.num], us[q.den]
				if !strings.HasPrefix(q.den, "redis_rate") {
					den = us[prefix+"jobthrottle "+a.name+" "+q.den]
				}
				if num > 0 && den > 0 {
					row, any = row+fmt.Sprintf(" %.2f |", num/den), true
				} else {
					row += " – |"
				}
			}
			if any {
				fmt.Println(row)
			}
		}
	}
}

func algoNames() []string {
	var s []string
	for _, a := range algos {
		s = append(s, a.name)
	}
	return s
}
