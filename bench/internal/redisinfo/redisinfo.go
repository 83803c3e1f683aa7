// Package redisinfo reads the INFO fields the benchmark commands measure with.
package redisinfo

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Read returns the fields of the INFO sections as a map.
func Read(ctx context.Context, rdb *redis.Client, sections ...string) (map[string]string, error) {
	s, err := rdb.Info(ctx, sections...).Result()
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(s, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(k, "#") {
			m[k] = v
		}
	}
	return m, nil
}

// CmdStat reads "calls=N,usec=U,..." from an INFO commandstats value.
func CmdStat(v string) (calls, usec int64) {
	for _, f := range strings.Split(v, ",") {
		k, x, _ := strings.Cut(f, "=")
		switch k {
		case "calls":
			calls, _ = strconv.ParseInt(x, 10, 64)
		case "usec":
			usec, _ = strconv.ParseInt(x, 10, 64)
		}
	}
	return calls, usec
}

// EvalStats returns the EVALSHA and EVAL calls made so far and their total execution
// time in µs, as the server counts them.
func EvalStats(ctx context.Context, rdb *redis.Client) (calls, usec int64, err error) {
	m, err := Read(ctx, rdb, "commandstats")
	if err != nil {
		return 0, 0, err
	}
	for _, k := range []string{"cmdstat_evalsha", "cmdstat_eval"} {
		c, u := CmdStat(m[k])
		calls += c
		usec += u
	}
	return calls, usec, nil
}

// ExecPerCall sends calls script calls in pipelines of 100 (queue adds one to p) and
// returns the script execution time per call, as the server counts it (EvalStats).
func ExecPerCall(ctx context.Context, rdb *redis.Client, calls int, queue func(p redis.Pipeliner)) (time.Duration, error) {
	c0, u0, err := EvalStats(ctx, rdb)
	if err != nil {
		return 0, err
	}
	for sent := 0; sent < calls; sent += 100 {
		p := rdb.Pipeline()
		for j := 0; j < 100; j++ {
			queue(p)
		}
		if _, err := p.Exec(ctx); err != nil && err != redis.Nil {
			return 0, err
		}
	}
	c1, u1, err := EvalStats(ctx, rdb)
	if err != nil {
		return 0, err
	}
	return time.Duration(u1-u0) * time.Microsecond / time.Duration(c1-c0), nil
}
