package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jobthrottle/jobthrottle/bench/internal/redisinfo"
	"github.com/redis/go-redis/v9"
)

// serverSnap is what a measurement reads from the server before and after.
type serverSnap struct {
	cpu        float64 // seconds of main-thread CPU (user + sys)
	evalCalls  int64   // EVALSHA + EVAL calls
	evalUsec   int64   // their execution time, µs
	otherCalls int64   // PING calls (for the PING case)
	otherUsec  int64
}

func snapServer(ctx context.Context, rdb *redis.Client) (serverSnap, error) {
	m, err := redisinfo.Read(ctx, rdb, "cpu", "commandstats")
	if err != nil {
		return serverSnap{}, err
	}
	var s serverSnap
	user, sys := "used_cpu_user_main_thread", "used_cpu_sys_main_thread"
	if _, ok := m[user]; !ok {
		user, sys = "used_cpu_user", "used_cpu_sys"
	}
	for _, k := range []string{user, sys} {
		f, _ := strconv.ParseFloat(m[k], 64)
		s.cpu += f
	}
	for _, k := range []string{"cmdstat_evalsha", "cmdstat_eval"} {
		c, u := redisinfo.CmdStat(m[k])
		s.evalCalls += c
		s.evalUsec += u
	}
	s.otherCalls, s.otherUsec = redisinfo.CmdStat(m["cmdstat_ping"])
	return s, nil
}

// clientSnap is this process's CPU time and allocation count.
type clientSnap struct {
	cpu     time.Duration
	mallocs uint64
}

func snapClient() clientSnap {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return clientSnap{
		cpu:     time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		mallocs: ms.Mallocs,
	}
}

// machine describes where the benchmark ran.
type machine struct {
	CPU, Cores, Redis, Go, GoRedis, RedisRate, Load string
}

func describeMachine(ctx context.Context, rdb *redis.Client) machine {
	m := machine{Cores: strconv.Itoa(runtime.NumCPU()), Go: runtime.Version()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if i, err := redisinfo.Read(ctx, rdb, "server", "memory"); err == nil {
		m.Redis = i["redis_version"] + " (" + i["mem_allocator"] + ")"
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/redis/go-redis/v9":
				m.GoRedis = d.Version
			case "github.com/go-redis/redis_rate/v10":
				m.RedisRate = d.Version
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.Load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return m
}

func (m machine) String() string {
	return fmt.Sprintf("CPU %s × %s cores (client and server share them); redis-server %s; %s; go-redis %s; redis_rate %s; load average at start %s",
		m.CPU, m.Cores, m.Redis, m.Go, m.GoRedis, m.RedisRate, m.Load)
}
