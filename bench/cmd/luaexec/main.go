// Command luaexec measures how long each limiter script runs inside Redis: the
// server's own execution time per EVALSHA (INFO commandstats), free of the network and
// of the client, on the allowed and denied paths of every jobthrottle algorithm and of
// the peers (redis_rate, the Redisson-style log). Calls are sent in pipelines of 100
// from one connection; the cases run in rounds, interleaved, and the fastest round of
// each is reported (the machine is shared and noisy; the fastest round is the one
// least disturbed).
//
//	go run ./cmd/luaexec                        # starts its own redis-server
//	go run ./cmd/luaexec -addr 127.0.0.1:6379 -rounds 20
//	go run ./cmd/luaexec -only TokenBucket,redis_rate   # the no-op and the cases named so
//
// To compare this version's scripts with 93c979c's (the version before one script per
// algorithm) in one run (interleaved, same server), dump that version's texts with its
// luaexec -dump DIR and pass -base DIR here: every jobthrottle case then runs twice,
// "base" with DIR's text and its protocol. To compare with another version of this
// protocol's scripts (this version's own -dump of an earlier commit), pass -alt DIR:
// every jobthrottle case runs with DIR's scripts too, as "alt". A batch case reports
// exec per request.
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

// xcase is one script on one path: its SHA, its keys and the arguments of call i.
type xcase struct {
	name string
	sha  string
	keys []string
	args func(i int) []any
	// fresh: each call on keys of its own (tag and the call's number), with the other
	// algorithms' state keys too: a state that is not there
	fresh bool
	// per: requests per call (the batch cases report exec per request)
	per int
	// override: an operator's override of the rate is set on the key first
	override bool
}

func fixed(args ...any) func(int) []any { return func(int) []any { return args } }

// algo is a limiter algorithm as this version's script and 93c979c's take it: the
// arguments after a single call's requests for a limit of rate per second.
type algo struct {
	name   string // SlidingWindow, ...; the base's dump file
	script string // lua.Script's name
	suffix string
	tail   func(rate int) []any // after the requests: m, the limit, parameters, A, record
	old    func(rate int) []any // 93c979c's ARGV after op, n, x
}

var algos = []algo{
	{"SlidingWindow", "log", "sw", func(r int) []any { return []any{1, r, 1000000, 0, 0, "", 0} },
		func(r int) []any { return []any{1, r, 1000000} }},
	{"SlidingCounter", "log", "sc", func(r int) []any { return []any{1, r, 1000000, 20000, 0, "", 0} },
		func(r int) []any { return []any{1, 20000, r, 1000000} }},
	{"TokenBucket", "bucket", "tb", func(r int) []any { return []any{1, r, 1000000, r, 0, "", 0} },
		func(r int) []any { return []any{1, r, 1000000, r} }},
	{"FixedWindow", "window", "fw", func(r int) []any { return []any{1, r, 1000000, 0, "", 0} },
		func(r int) []any { return []any{1, r, 1000000} }},
}

// baseNames are the files -base reads: 93c979c's limiter scripts as its luaexec -dump
// wrote them.
var baseNames = map[string]string{"SlidingWindow": "SlidingWindow", "SlidingCounter": "SlidingCounter", "TokenBucket": "GCRA", "FixedWindow": "FixedWindow"}

// jobthrottleCases: one limit per second, never reached (allowed) or always exceeded
// (denied); a limit of 1e9 per 10 ms makes one entry of the log expire on every call; a
// batch of batchSize acquires in one call. With base (93c979c's texts, by algorithm),
// each case runs with them too, as "base ...", in its protocol.
func jobthrottleCases(base, alt map[string]string) []xcase {
	const never, often = 1000000000, 100
	noop := redis.NewScript("return 1")
	out := []xcase{{name: "no-op (return 1)", sha: noop.Hash(), keys: []string{"{jtbench:noop}:x"}, args: fixed(1), per: 1}}
	n := 0
	add := func(name, sha string, suffix string, args []any, old bool, per int, fresh, override bool) {
		n++
		tag := fmt.Sprintf("{jtbench:luaexec%d}", n)
		keys := []string{tag + ":" + suffix, tag + ":pause", tag + ":conf"}
		if old {
			keys = keys[:2]
		}
		out = append(out, xcase{name: name, sha: sha, keys: keys, args: fixed(args...), fresh: fresh, per: per, override: override})
	}
	for _, a := range algos {
		s := lua.Script(a.script)
		var oldSHA, altSHA string
		if src, ok := base[a.name]; ok {
			oldSHA = redis.NewScript(src).Hash()
		}
		if src, ok := alt[a.script]; ok {
			altSHA = redis.NewScript(src).Hash()
		}
		type path struct {
			name     string
			rate     int
			period   int
			fresh    bool
			override bool
		}
		paths := []path{{"allowed", never, 0, false, false}, {"denied", often, 0, false, false},
			{"allowed, no state yet (fresh keys)", never, 0, true, false}, {"allowed, override set", never, 0, false, true}}
		if a.script == "log" {
			paths = append(paths, path{"allowed, an entry expires every call", never, 10000, false, false})
		}
		for _, p := range paths {
			tail, old := a.tail(p.rate), a.old(p.rate)
			if p.period > 0 {
				tail[2], old[len(old)-1] = p.period, p.period
			}
			name := "jobthrottle " + a.name + " " + p.name
			if oldSHA != "" {
				add("base "+name, oldSHA, a.suffix, append([]any{0, 1, 0}, old...), true, 1, p.fresh, p.override)
			}
			if altSHA != "" {
				add("alt "+name, altSHA, a.suffix, append([]any{1, 0, 1, 0, 0, 0}, tail...), false, 1, p.fresh, p.override)
			}
			add(name, s.Hash(), a.suffix, append([]any{1, 0, 1, 0, 0, 0}, tail...), false, 1, p.fresh, p.override)
		}
		for _, p := range paths[:2] { // a batch of batchSize acquires
			tail, old := a.tail(p.rate), a.old(p.rate)
			name := fmt.Sprintf("jobthrottle %s %s, batch of %d (per request)", a.name, p.name, batchSize)
			if oldSHA != "" {
				args := []any{4, batchSize}
				for range batchSize {
					args = append(args, 0, 1, 0)
				}
				add("base "+name, oldSHA, a.suffix, append(args, old...), true, batchSize, false, false)
			}
			args := []any{batchSize}
			for range batchSize {
				args = append(args, 0, 1, 0, 0, 0)
			}
			if altSHA != "" {
				add("alt "+name, altSHA, a.suffix, append(args, tail...), false, batchSize, false, false)
			}
			add(name, s.Hash(), a.suffix, append(args, tail...), false, batchSize, false, false)
		}
	}
	return out
}

// freshKeys returns a limiter's keys on a tag of call n's own, its state key's suffix that
// of key, and the other algorithms' state keys: this version's (A = 3 in its ARGV) when
// the case has a record key, else 93c979c's.
func freshKeys(c xcase, n int) []string {
	suffix := c.keys[0][strings.LastIndex(c.keys[0], ":")+1:]
	tag := fmt.Sprintf("{jtbench:fresh%d}", n)
	keys := []string{tag + ":" + suffix, tag + ":pause"}
	if len(c.keys) == 3 {
		keys = append(keys, tag+":conf")
	}
	for _, s := range []string{"sw", "sc", "tb", "fw"} {
		if s != suffix {
			keys = append(keys, tag+":"+s)
		}
	}
	return keys
}

// freshArgs sets A, the other algorithms' keys in KEYS, in this version's ARGV.
func freshArgs(c xcase, args []any) []any {
	if len(c.keys) != 3 {
		return args
	}
	out := append([]any(nil), args...)
	out[len(out)-3] = 3
	return out
}

// batchSize is the number of requests in the batch cases.
const batchSize = 32

// peerCases: redis_rate's script (not exported: its SHA and arguments are taken from
// one call of its Allow) and the Redisson-style log's, with the same limits.
func peerCases(ctx context.Context, rdb *redis.Client) ([]xcase, error) {
	var out []xcase
	for _, p := range []struct {
		path string
		rate int
	}{{"allowed", 1000000000}, {"denied", 100}} {
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
		out = append(out, xcase{name: "redis_rate " + p.path, sha: c.sha, keys: []string{"rate:" + key}, args: fixed(c.args...), per: 1})

		rl := redisson.New(rdb, "jtbench:luaexec-redisson-"+p.path, p.rate, time.Second)
		rdb.Del(ctx, rl.Keys()...)
		if err := rl.TrySetRate(ctx, rdb); err != nil {
			return nil, err
		}
		if err := redisson.Script.Load(ctx, rdb).Err(); err != nil {
			return nil, err
		}
		out = append(out, xcase{name: "Redisson-style log " + p.path, sha: redisson.Script.Hash(), keys: rl.Keys(), per: 1, args: func(i int) []any {
			// the client's clock and a fresh 16-byte id per call, as Redisson sends them
			return []any{1, time.Now().UnixMilli(), fmt.Sprintf("%016x", i)}
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

func main() {
	addr := flag.String("addr", "", "redis-server to use, host:port; empty starts one on a free 127.0.0.1 port")
	rounds := flag.Int("rounds", 20, "rounds per case")
	calls := flag.Int("calls", 2000, "calls per case per round")
	only := flag.String("only", "", "run only the cases whose name contains one of these comma-separated texts (and the no-op)")
	dump := flag.String("dump", "", "write the scripts' texts to this directory and exit")
	baseDir := flag.String("base", "", "a directory holding 93c979c's limiter scripts (its luaexec -dump): run each case with them too, in their protocol, as \"base ...\"")
	altDir := flag.String("alt", "", "a directory holding another version of this protocol's scripts (a -dump of it): run each jobthrottle case with them too, as \"alt ...\"")
	flag.Parse()
	log.SetFlags(0)
	if *dump != "" {
		for _, name := range []string{"log", "bucket", "window", "semaphore"} {
			if err := os.WriteFile(filepath.Join(*dump, name+".lua"), []byte(lua.Source(name)), 0o644); err != nil {
				log.Fatal(err)
			}
		}
		return
	}
	base := map[string]string{}
	if *baseDir != "" {
		for alg, file := range baseNames {
			b, err := os.ReadFile(filepath.Join(*baseDir, file+".lua"))
			if err != nil {
				log.Fatal(err)
			}
			base[alg] = string(b)
		}
	}
	alt := map[string]string{}
	if *altDir != "" {
		for _, name := range []string{"log", "bucket", "window"} {
			b, err := os.ReadFile(filepath.Join(*altDir, name+".lua"))
			if err != nil {
				log.Fatal(err)
			}
			alt[name] = string(b)
		}
	}
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
	scripts := []*redis.Script{redis.NewScript("return 1")}
	for _, name := range []string{"log", "bucket", "window"} {
		scripts = append(scripts, lua.Script(name))
	}
	for _, src := range base {
		scripts = append(scripts, redis.NewScript(src))
	}
	for _, src := range alt {
		scripts = append(scripts, redis.NewScript(src))
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
	for _, c := range cs {
		if c.override { // an operator's override of the rate (the same text in both versions), for an hour
			t, err := rdb.Time(ctx).Result()
			if err != nil {
				log.Fatal(err)
			}
			us := t.UnixMicro()
			text := fmt.Sprintf("0 %d 1 1000000000 0 %d", us+int64(time.Hour/time.Microsecond), us)
			if err := rdb.Set(ctx, c.keys[1], text, time.Hour).Err(); err != nil {
				log.Fatal(err)
			}
		}
		if err := rdb.EvalSha(ctx, c.sha, c.keys, c.args(0)...).Err(); err != nil && err != redis.Nil {
			log.Fatalf("%s: %v", c.name, err)
		}
	}
	best := make([]time.Duration, len(cs))
	n := 0
	for r := 0; r < *rounds; r++ {
		for i, c := range cs {
			d, err := redisinfo.ExecPerCall(ctx, rdb, *calls/max(1, c.per/8), func(p redis.Pipeliner) {
				n++
				keys, args := c.keys, c.args(n)
				if c.fresh {
					keys, args = freshKeys(c, n), freshArgs(c, args)
				}
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
	fmt.Printf("| script, path | exec µs per call (fastest of %d rounds of %d) |\n|---|---:|\n", *rounds, *calls)
	for i, c := range cs {
		per := float64(best[i]) / float64(time.Microsecond) / float64(max(1, c.per))
		fmt.Printf("| %s | %.2f |\n", c.name, per)
		rdb.Del(ctx, c.keys...)
	}
}
