// Command jobthrottle shows and steers the limits a fleet shares through Redis: list
// the keys, show or watch their live state, pause, resume or reset them.
//
//	jobthrottle ls                                   # keys under the prefix, with their algorithm and limits
//	jobthrottle show vendor-api                      # the live state, once
//	jobthrottle watch vendor-api                     # refreshed every second (Ctrl-C ends)
//	jobthrottle pause vendor-api 30s                 # no grants anywhere for 30s
//	jobthrottle resume vendor-api                    # end a pause now
//	jobthrottle set -for 1h vendor-api 10/1.1s       # lower the rate fleet-wide for an hour
//	jobthrottle unset vendor-api                     # back to the rates the code passes
//	jobthrottle reset vendor-api                     # forget the key's state (asks first)
//
// Redis is found as redis-cli finds it: -h, -p, -a, -n or -u URL, else REDIS_URL, else
// REDIS_ADDR (host:port; several, comma-separated, or -c, for a Cluster), else
// 127.0.0.1:6379. Keys are given as the code gives them to throttle.New, without the
// prefix (-prefix, "jobthrottle:" by default, as throttle.WithKeyPrefix).
//
// Show and watch read a key's algorithm and limits from its record ({…}:conf), which
// the processes that use the key write (see throttle.ReadRecord; the last writer's
// when processes differ); set checks an override against it. -limit RATE/PERIOD
// (repeat it for several limits; RATE/PERIOD:BURST for a token bucket's burst) shows
// the state as those limits read it instead, and stands in for a record that is
// missing (a key idle for 10 seconds or 3 of its periods, or processes of an older
// jobthrottle).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/redis/go-redis/v9"
)

// quiet drops go-redis's own log lines (a failed dial is logged there and returned
// to us as well, and said once, plainly).
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func main() {
	redis.SetLogger(quiet{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// run is the command: it returns the exit status (0 ok, 1 failed, 2 bad usage).
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	o, err := parse(args, getenv)
	if err != nil {
		fmt.Fprintln(stderr, "jobthrottle:", err)
		if _, ok := err.(usageError); ok {
			fmt.Fprint(stderr, usage)
			return 2
		}
		return 1
	}
	if o.cmd == "help" {
		fmt.Fprint(stdout, usage)
		return 0
	}
	c, err := dial(ctx, o)
	if err != nil {
		fmt.Fprintln(stderr, "jobthrottle:", err)
		return 1
	}
	defer c.Close()
	t := &tool{o: o, rdb: c, in: stdin, out: stdout}
	if err := t.do(ctx); err != nil {
		// the library's errors start with "jobthrottle: " too: say it once
		fmt.Fprintln(stderr, "jobthrottle:", strings.TrimPrefix(err.Error(), "jobthrottle: "))
		return 1
	}
	return 0
}

const usage = `usage: jobthrottle [flags] COMMAND [flags] [ARGS]

commands:
  ls [PATTERN]             keys under the prefix (SCAN), with their algorithm and limits
  show KEY                 the key's live state (its limits from the key's record, or -limit)
  watch KEY...             the live state, refreshed every -interval (Ctrl-C ends)
  pause KEY DURATION       no grants on the key, fleet-wide, for DURATION (e.g. 30s)
  resume KEY               end a pause on the key now (an override stays)
  set KEY RATE/PERIOD[:BURST]...  override the rates of the key's limits, in order, for
                           every process (periods stay the code's); -for D to end it by itself
  unset KEY                remove the override: the rates the code passes apply again
  reset KEY                delete the key's state (limits start afresh); asks unless -yes

flags:
  -h HOST -p PORT          Redis host and port (default 127.0.0.1:6379, or REDIS_ADDR)
  -a PASSWORD --user NAME  AUTH (or REDISCLI_AUTH)
  -n DB                    database number
  -u URL                   redis://[user:pass@]host:port/db (or REDIS_URL)
  -c                       Redis Cluster (REDIS_ADDR may list several nodes, comma-separated)
  -prefix P                key prefix, as throttle.WithKeyPrefix (default "jobthrottle:")
  -limit RATE/PERIOD[:BURST]  show/watch: a limit of the key, as given to throttle.New, instead
                           of the key's record's; repeat for several
  -alg NAME                sw, sc, tb or fw (default: found from the key's state, or its record)
  -buckets N               the sliding counter's buckets, as throttle.WithBuckets (default: the
                           record's, else 50)
  -max N                   a semaphore's max (shown as the bar's full width)
  -interval D              watch's refresh interval (default 1s)
  -count N                 watch: stop after N screens (default 0: until Ctrl-C)
  -yes                     reset without asking
  -for D                   set: how long the override lasts (default: until unset)
`
