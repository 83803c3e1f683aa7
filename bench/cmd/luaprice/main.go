// Command luaprice prices the pieces of a script run inside Redis: each case is a
// small script (a no-op, one redis.call, a piece of a fast path) run as luaexec runs
// its cases (pipelines of 100 EVALSHA from one connection, interleaved rounds, the
// fastest round kept), on a list of 2001 numbers, a string and an absent key.
//
//	go run ./cmd/luaprice -rounds 10
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"strconv"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/bench/internal/redisinfo"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// KEYS: a list of 1 + 2×1000 numbers, an absent key, a string "123 456".
var cases = []struct{ name, src string }{
	{"no-op", "return 1"},
	{"reply of 5 integers", "return {1, 2, 3, 4, 5}"},
	{"TIME", "local t = redis.call('TIME') return 1"},
	{"TIME + arithmetic", "local t = redis.call('TIME') local now = t[1] * 1000000 + t[2] return 1"},
	{"EXISTS absent", "redis.call('EXISTS', KEYS[2]) return 1"},
	{"EXISTS 4 keys", "redis.call('EXISTS', KEYS[2], KEYS[2], KEYS[2], KEYS[2]) return 1"},
	{"MGET string, absent", "redis.call('MGET', KEYS[3], KEYS[2]) return 1"},
	{"LRANGE 0 8", "redis.call('LRANGE', KEYS[1], '0', '8') return 1"},
	{"pcall LRANGE 0 8", "redis.pcall('LRANGE', KEYS[1], '0', '8') return 1"},
	{"LRANGE -2 -1", "redis.call('LRANGE', KEYS[1], '-2', '-1') return 1"},
	{"LINDEX", "redis.call('LINDEX', KEYS[1], '5') return 1"},
	{"LLEN", "redis.call('LLEN', KEYS[1]) return 1"},
	{"LSET -1", "redis.call('LSET', KEYS[1], '-1', '99999999999999') return 1"},
	{"PEXPIRE", "redis.call('PEXPIRE', KEYS[1], '100000000') return 1"},
	{"SET PX", "redis.call('SET', KEYS[3], '123 456', 'PX', '100000000') return 1"},
	{"RPUSH 2 + LTRIM", "redis.call('RPUSH', KEYS[1], '99999999999999', '99999999999999') redis.call('LTRIM', KEYS[1], '2', '-1') redis.call('LSET', KEYS[1], '0', '0') return 1"},
	{"LTRIM only (no-op range)", "redis.call('LTRIM', KEYS[1], '0', '-1') return 1"},
	{"3 string.format %d", "local f = string.format local a, b, c = f('%d', 1764067000000000), f('%d', 123456789), f('%d', 100000) return 1"},
	{"3 tostring-ish concat", "local a, b, c = '' .. 1764067000000000, '' .. 123456789, '' .. 100000 return 1"},
	{"LRANGE 0 8 + concat + 2 find", "local h = redis.call('LRANGE', KEYS[1], '0', '8') local s = ',' .. table.concat(h, ',') if not string.find(s, '^[0-9,]*$') or string.find(s, ',0%d') then return 0 end return 1"},
	{"3 closures", "local a = 1 local function f() return a end local function g() return a end local function h() return a end return 1"},
	{"arg check as fast.lua (single)", fastSingle},
	{"log reads, no check", "local h = redis.call('LRANGE', KEYS[1], '0', '8') local l = redis.call('LRANGE', KEYS[1], '-2', '-1') h[10], h[11] = l[1], l[2] return 1"},
	{"log reads + check as log_fast.lua", "local h = redis.call('LRANGE', KEYS[1], '0', '8') local l = redis.call('LRANGE', KEYS[1], '-2', '-1') h[10], h[11] = l[1], l[2] " +
		"local s = table.concat(h, ',') if not string.find(s, '^[%d,]*$') or string.find(s, ',0', 1, true) or string.find(s, '^0%d') then return 0 end for i = 1, #h do if #h[i] > 17 or h[i] == '' then return 0 end end return 1"},
	{"log reads + concat only", "local h = redis.call('LRANGE', KEYS[1], '0', '8') local l = redis.call('LRANGE', KEYS[1], '-2', '-1') h[10], h[11] = l[1], l[2] " +
		"local s = table.concat(h, ',') return 1"},
	{"log reads + loop only", "local h = redis.call('LRANGE', KEYS[1], '0', '8') local l = redis.call('LRANGE', KEYS[1], '-2', '-1') h[10], h[11] = l[1], l[2] " +
		"for i = 1, #h do if #h[i] > 17 or h[i] == '' then return 0 end end return 1"},
	{"log reads + 11 anchored finds", "local h = redis.call('LRANGE', KEYS[1], '0', '8') local l = redis.call('LRANGE', KEYS[1], '-2', '-1') h[10], h[11] = l[1], l[2] " +
		"local find = string.find for i = 2, #h do local e = h[i] if #e > 17 or not find(e, '^[1-9]%d*$') then return 0 end end return 1"},
	{"log reads + concat + [%d,] find", "local h = redis.call('LRANGE', KEYS[1], '0', '8') local l = redis.call('LRANGE', KEYS[1], '-2', '-1') h[10], h[11] = l[1], l[2] " +
		"local s = table.concat(h, ',') if not string.find(s, '^[%d,]*$') then return 0 end return 1"},
	{"log reads + concat + [,-9] find", "local h = redis.call('LRANGE', KEYS[1], '0', '8') local l = redis.call('LRANGE', KEYS[1], '-2', '-1') h[10], h[11] = l[1], l[2] " +
		"local s = table.concat(h, ',') if not string.find(s, '^[,-9]*$') then return 0 end return 1"},
	{"log reads + concat '' + %d find", "local h = redis.call('LRANGE', KEYS[1], '0', '8') local l = redis.call('LRANGE', KEYS[1], '-2', '-1') h[10], h[11] = l[1], l[2] " +
		"local s = table.concat(h) if not string.find(s, '^%d*$') then return 0 end return 1"},
	{"log reads + concat + 3 plain finds", "local h = redis.call('LRANGE', KEYS[1], '0', '8') local l = redis.call('LRANGE', KEYS[1], '-2', '-1') h[10], h[11] = l[1], l[2] " +
		"local s = table.concat(h, ',') if string.find(s, ',0', 1, true) or string.find(s, '-', 1, true) or string.find(s, '.', 1, true) then return 0 end return 1"},
	{"log reads + check v2", "local h = redis.call('LRANGE', KEYS[1], '0', '8') local l = redis.call('LRANGE', KEYS[1], '-2', '-1') h[10], h[11] = l[1], l[2] " +
		"local s = table.concat(h, ',') if not string.find(s, '^[0-9,]*$') or string.find(s, ',0', 1, true) or string.find(s, '^0%d') then return 0 end for i = 1, #h do local e = h[i] if #e > 17 or e == '' then return 0 end end return 1"},
	{"args: concat + %d pattern", "local A = ARGV local s = table.concat(A, ',', 2) if string.find(s, #A == 6 and '^[1-9]%d*,%d+,1,[1-9]%d*,[1-9]%d*$' or '^[1-9]%d*,%d+,1,[1-9]%d*,[1-9]%d*,[1-9]%d*$') then return 1 end return 0"},
	{"args: concat + [0-9] pattern", "local A = ARGV local s = table.concat(A, ',', 2) if string.find(s, #A == 6 and '^[1-9][0-9]*,[0-9]+,1,[1-9][0-9]*,[1-9][0-9]*$' or '^[1-9][0-9]*,[0-9]+,1,[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]*$') then return 1 end return 0"},
	{"args: concat only", "local A = ARGV local s = table.concat(A, ',', 2) return 1"},
	{"args: per-field finds", "local A, find = ARGV, string.find if find(A[2], '^[1-9]%d*$') and find(A[3], '^%d+$') and A[4] == '1' and find(A[5], '^[1-9]%d*$') and find(A[6], '^[1-9]%d*$') then return 1 end return 0"},
	{"args: 5 x +0", "local A = ARGV local a, b, c, d = A[2] + 0, A[3] + 0, A[5] + 0, A[6] + 0 return 1"},
	{"format %x:%x:%x + %d", "local a = string.format('%x:%x:%x', 1764067000000000, 123456, 1000) local b = string.format('%d', 100000) return 1"},
	{"SET PX of a formatted state", "redis.call('SET', KEYS[3], string.format('%x:%x:%x', 1764067000000000, 123456, 1000), 'PX', string.format('%d', 100000)) return 1"},
	{"SET PX of a state, new each call", "local t = redis.call('TIME') redis.call('SET', KEYS[3], string.format('%x:%x:%x', t[1] * 1000000 + t[2], 123456, 1000), 'PX', string.format('%d', 100000)) return 1"},
	{"TIME + SET PX of a fixed state", "local t = redis.call('TIME') redis.call('SET', KEYS[3], '123 456', 'PX', '100000') return 1"},
	{"SET PX of a fixed state (no TIME)", "redis.call('SET', KEYS[3], '123 456', 'PX', '100000') return 1"},
	{"MGET + TIME + SET PX", "local s = redis.call('MGET', KEYS[3], KEYS[2]) local t = redis.call('TIME') redis.call('SET', KEYS[3], '123 456', 'PX', '100000') return 1"},
}

const fastSingle = `local A = ARGV local find = string.find
local s = ',' .. A[2] .. ',' .. A[3]
if find(s, '^,%d+,%d+$') and not find(s, ',0%d') then
  local l = 4
  local s2 = ',' .. table.concat(A, ',', l + 1, #A)
  if A[l] ~= '1' or not find(s2, '^,%d+,%d+,?%d*$') or A[#A] == '' or find(s2, ',0%d') then return 0 end
  local l1, l2 = A[5] + 0, A[6] + 0
  local n, x = A[2] + 0, A[3] + 0
  return 1
end
return 0`

func main() {
	rounds := flag.Int("rounds", 10, "rounds per case")
	calls := flag.Int("calls", 2000, "calls per case per round")
	only := flag.String("only", "", "only the cases whose name contains one of these comma-separated texts (and the no-op)")
	alg := flag.String("alg", "", "price the script of this algorithm (SlidingWindow, SlidingCounter, GCRA, FixedWindow) cut short: a case per -cuts line")
	cuts := flag.String("cuts", "", "with -alg: comma-separated line numbers of its text after which a case returns 1 (0: the whole script)")
	denied := flag.Bool("denied", false, "with -alg: a limit always exceeded (else one never reached)")
	flag.Parse()
	log.SetFlags(0)
	s, err := redistest.StartServer()
	if err != nil {
		log.Fatal(err)
	}
	defer redistest.StopAll()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rdb.Close()
	keys := []string{"{p}:list", "{p}:absent", "{p}:str"}
	rows := []any{"0"}
	for i := 1; i <= 1000; i++ {
		rows = append(rows, fmt.Sprint(1764067000000000+i), fmt.Sprint(i))
	}
	if err := rdb.RPush(ctx, keys[0], rows...).Err(); err != nil {
		log.Fatal(err)
	}
	rdb.Set(ctx, keys[2], "123 456", 0)
	args := []any{0, 1, 0, 1, 1000000000, 1000000}
	type c struct {
		name string
		sha  string
	}
	var cs []c
	for i, x := range cases {
		keep := i == 0 || *only == ""
		for _, o := range strings.Split(*only, ",") {
			keep = keep || (o != "" && strings.Contains(x.name, o))
		}
		if !keep {
			continue
		}
		sc := redis.NewScript(x.src)
		if err := sc.Load(ctx, rdb).Err(); err != nil {
			log.Fatalf("%s: %v", x.name, err)
		}
		cs = append(cs, c{x.name, sc.Hash()})
	}
	if *alg != "" {
		cs = cs[:1]
		name := map[string]lua.Name{"SlidingWindow": lua.SlidingWindow, "SlidingCounter": lua.SlidingCounter, "GCRA": lua.GCRA, "FixedWindow": lua.FixedWindow}[*alg]
		suffix := map[lua.Name]string{lua.SlidingWindow: "sw", lua.SlidingCounter: "sc", lua.GCRA: "tb", lua.FixedWindow: "fw"}[name]
		rate := 1000000000
		if *denied {
			rate = 100
		}
		args = map[lua.Name][]any{
			lua.SlidingWindow:  {0, 1, 0, 1, rate, 1000000},
			lua.SlidingCounter: {0, 1, 0, 1, 20000, rate, 1000000},
			lua.GCRA:           {0, 1, 0, 1, rate, 1000000, rate},
			lua.FixedWindow:    {0, 1, 0, 1, rate, 1000000},
		}[name]
		keys = []string{"{a}:" + suffix, "{a}:pause"}
		for _, s := range []string{"sw", "sc", "tb", "fw"} {
			if s != suffix {
				keys = append(keys, "{a}:"+s)
			}
		}
		lines := strings.Split(name.Source(), "\n")
		for _, f := range strings.Split(*cuts, ",") {
			l, err := strconv.Atoi(f)
			if err != nil {
				log.Fatal(err)
			}
			src := name.Source()
			label := "whole script"
			if l > 0 {
				src = strings.Join(lines[:l], "\n") + "\ndo return 1 end\n" + strings.Join(lines[l:], "\n")
				label = fmt.Sprintf("cut after line %d: %.60s", l, strings.TrimSpace(lines[l-1]))
			}
			sc := redis.NewScript(src)
			if err := sc.Load(ctx, rdb).Err(); err != nil {
				log.Fatalf("%s: %v", label, err)
			}
			cs = append(cs, c{label, sc.Hash()})
		}
		for i := 0; i < 50; i++ { // a log of many entries; a state
			if err := name.Script().Run(ctx, rdb, keys, args...).Err(); err != nil {
				log.Fatal(err)
			}
		}
	}
	best := make([]time.Duration, len(cs))
	for r := 0; r < *rounds; r++ {
		for i, x := range cs {
			d, err := redisinfo.ExecPerCall(ctx, rdb, *calls, func(p redis.Pipeliner) { p.EvalSha(ctx, x.sha, keys, args...) })
			if err != nil {
				log.Fatalf("%s: %v", x.name, err)
			}
			if r == 0 || d < best[i] {
				best[i] = d
			}
		}
	}
	fmt.Printf("| script | exec µs per call (fastest of %d rounds of %d) | − no-op |\n|---|---:|---:|\n", *rounds, *calls)
	for i, x := range cs {
		us := float64(best[i]) / float64(time.Microsecond)
		fmt.Printf("| %s | %.2f | %.2f |\n", x.name, us, us-float64(best[0])/float64(time.Microsecond))
	}
}
