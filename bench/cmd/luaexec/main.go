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
// To compare two versions of the scripts in one run (interleaved, same server), dump
// one version's texts with -dump DIR (from that version's checkout) and pass -base DIR
// to the other: every jobthrottle case then runs twice, "base" with DIR's text.
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
	// fresh: each call on keys of its own (tag and the call's number), the limiter's
	// five (state, control, the other algorithms' state): a state that is not there
	fresh bool
}

func fixed(args ...any) func(int) []any { return func(int) []any { return args } }

// jobthrottleCases: one limit per second, never reached (allowed) or always exceeded
// (denied); the limit of 1e9 per 10 ms makes one entry of the log expire on every call.
func jobthrottleCases(base map[lua.Name]string) []xcase {
	const never, often = 1000000000, 100
	cs := []struct {
		name   string
		script *redis.Script
		suffix string
		args   []any
	}{
		{"no-op (return 1)", redis.NewScript("return 1"), "noop", []any{0, 1, 0, 1, never, 1000000}},
		{"jobthrottle SlidingWindow allowed", lua.SlidingWindow.Script(), "sw", []any{0, 1, 0, 1, never, 1000000}},
		{"jobthrottle SlidingWindow allowed, an entry expires every call", lua.SlidingWindow.Script(), "sw", []any{0, 1, 0, 1, never, 10000}},
		{"jobthrottle SlidingWindow allowed, override set", lua.SlidingWindow.Script(), "sw", []any{0, 1, 0, 1, never, 1000000}},
		{"jobthrottle SlidingWindow denied", lua.SlidingWindow.Script(), "sw", []any{0, 1, 0, 1, often, 1000000}},
		{"jobthrottle SlidingWindow allowed, no log yet (5 keys)", lua.SlidingWindow.Script(), "sw", []any{0, 1, 0, 1, never, 1000000}},
		{"jobthrottle TokenBucket allowed, no state yet (5 keys)", lua.GCRA.Script(), "tb", []any{0, 1, 0, 1, never, 1000000, never}},
		{"jobthrottle SlidingCounter allowed", lua.SlidingCounter.Script(), "sc", []any{0, 1, 0, 1, 20000, never, 1000000}},
		{"jobthrottle SlidingCounter denied", lua.SlidingCounter.Script(), "sc", []any{0, 1, 0, 1, 20000, often, 1000000}},
		{"jobthrottle TokenBucket allowed", lua.GCRA.Script(), "tb", []any{0, 1, 0, 1, never, 1000000, never}},
		{"jobthrottle TokenBucket allowed, override set", lua.GCRA.Script(), "tb", []any{0, 1, 0, 1, never, 1000000, never}},
		{"jobthrottle TokenBucket denied", lua.GCRA.Script(), "tb", []any{0, 1, 0, 1, often, 1000000, often}},
		{"jobthrottle FixedWindow allowed", lua.FixedWindow.Script(), "fw", []any{0, 1, 0, 1, never, 1000000}},
		{"jobthrottle FixedWindow denied", lua.FixedWindow.Script(), "fw", []any{0, 1, 0, 1, often, 1000000}},
	}
	if len(base) > 0 { // each case twice: base's text, then this one's
		var two []struct {
			name   string
			script *redis.Script
			suffix string
			args   []any
		}
		for _, c := range cs {
			for n, src := range base {
				if c.script.Hash() == n.Script().Hash() {
					b := c
					b.name, b.script = "base "+c.name, redis.NewScript(src)
					two = append(two, b)
				}
			}
			two = append(two, c)
		}
		cs = two
	}
	var out []xcase
	for i, c := range cs {
		tag := fmt.Sprintf("{jtbench:luaexec%d}", i)
		out = append(out, xcase{c.name, c.script.Hash(), []string{tag + ":" + c.suffix, tag + ":pause"}, fixed(c.args...), strings.Contains(c.name, " yet (")})
	}
	// the same calls as batches of batchSize requests (lua/batch.lua): exec per request
	for i, c := range cs {
		if i == 0 || strings.HasSuffix(c.name, "override set") || strings.Contains(c.name, "expires") || strings.Contains(c.name, " yet (") {
			continue
		}
		tag := fmt.Sprintf("{jtbench:luaexecb%d}", i)
		args := []any{lua.Batch, batchSize}
		for range batchSize {
			args = append(args, c.args[:3]...)
		}
		args = append(args, c.args[3:]...)
		out = append(out, xcase{fmt.Sprintf("%s, batch of %d (per request)", c.name, batchSize), c.script.Hash(),
			[]string{tag + ":" + c.suffix, tag + ":pause"}, fixed(args...), false})
	}
	return out
}

// freshKeys returns a limiter's five keys on a tag of call n's own, its state key's
// suffix that of key.
func freshKeys(key string, n int) []string {
	suffix := key[strings.LastIndex(key, ":")+1:]
	tag := fmt.Sprintf("{jtbench:fresh%d}", n)
	keys := []string{tag + ":" + suffix, tag + ":pause"}
	for _, s := range []string{"sw", "sc", "tb", "fw"} {
		if s != suffix {
			keys = append(keys, tag+":"+s)
		}
	}
	return keys
}

// limiterNames names the limiter scripts' files for -dump and -base.
var limiterNames = map[lua.Name]string{lua.SlidingWindow: "SlidingWindow", lua.SlidingCounter: "SlidingCounter", lua.GCRA: "GCRA", lua.FixedWindow: "FixedWindow"}

// batchSize is the number of requests in the batch cases.
const batchSize = 64

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
		out = append(out, xcase{"redis_rate " + p.path, c.sha, []string{"rate:" + key}, fixed(c.args...), false})

		rl := redisson.New(rdb, "jtbench:luaexec-redisson-"+p.path, p.rate, time.Second)
		rdb.Del(ctx, rl.Keys()...)
		if err := rl.TrySetRate(ctx, rdb); err != nil {
			return nil, err
		}
		if err := redisson.Script.Load(ctx, rdb).Err(); err != nil {
			return nil, err
		}
		out = append(out, xcase{"Redisson-style log " + p.path, redisson.Script.Hash(), rl.Keys(), func(i int) []any {
			// the client's clock and a fresh 16-byte id per call, as Redisson sends them
			return []any{1, time.Now().UnixMilli(), fmt.Sprintf("%016x", i)}
		}, false})
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
	dump := flag.String("dump", "", "write the limiter scripts' texts to this directory (for another version's -base) and exit")
	baseDir := flag.String("base", "", "a directory -dump wrote: run each jobthrottle case with its text too, as \"base ...\"")
	flag.Parse()
	log.SetFlags(0)
	if *dump != "" {
		for n, name := range limiterNames {
			if err := os.WriteFile(filepath.Join(*dump, name+".lua"), []byte(n.Source()), 0o644); err != nil {
				log.Fatal(err)
			}
		}
		return
	}
	base := map[lua.Name]string{}
	if *baseDir != "" {
		for n, name := range limiterNames {
			b, err := os.ReadFile(filepath.Join(*baseDir, name+".lua"))
			if err != nil {
				log.Fatal(err)
			}
			base[n] = string(b)
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
	for _, s := range []*redis.Script{redis.NewScript("return 1"), lua.SlidingWindow.Script(), lua.SlidingCounter.Script(), lua.GCRA.Script(), lua.FixedWindow.Script(), lua.Control.Script()} {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			log.Fatal(err)
		}
	}
	for _, src := range base {
		if err := redis.NewScript(src).Load(ctx, rdb).Err(); err != nil {
			log.Fatal(err)
		}
	}
	cs := jobthrottleCases(base)
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
		if strings.HasSuffix(c.name, "override set") { // an operator's override of the rate, for an hour
			if err := lua.Control.Script().Run(ctx, rdb, c.keys[1:2], 0, int64(time.Hour/time.Microsecond), 1, 1000000000, 0).Err(); err != nil {
				log.Fatalf("%s: %v", c.name, err)
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
			d, err := redisinfo.ExecPerCall(ctx, rdb, *calls, func(p redis.Pipeliner) {
				n++
				keys := c.keys
				if c.fresh {
					keys = freshKeys(c.keys[0], n)
				}
				p.EvalSha(ctx, c.sha, keys, c.args(n)...)
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
		per := float64(best[i]) / float64(time.Microsecond)
		if strings.Contains(c.name, "batch of") {
			per /= batchSize
		}
		fmt.Printf("| %s | %.2f |\n", c.name, per)
		rdb.Del(ctx, c.keys...)
	}
}
