// Command jobthrottle shows and steers the limits a fleet shares through Redis: list
// the keys, show or watch their live state, pause, resume, override or reset them, set
// a tenant's weight.
//
//	jobthrottle ls                                   # keys under the prefix, with their kind, pause, override and limits
//	jobthrottle show vendor-api                      # the live state, once
//	jobthrottle watch vendor-api                     # redrawn every second (Ctrl-C ends)
//	jobthrottle pause vendor-api 30s                 # no grants anywhere for 30s
//	jobthrottle resume vendor-api                    # end a pause now
//	jobthrottle set -for 1h vendor-api 10/1.1s       # lower the rate fleet-wide for an hour
//	jobthrottle unset vendor-api                     # back to the rates the code passes
//	jobthrottle weight vendor-api acme 3 10m         # tenant acme's weight in the fair share, fleet-wide
//	jobthrottle weight vendor-api acme clear         # back to the weight its callers pass
//	jobthrottle reset vendor-api                     # forget the key's state (asks first)
//	jobthrottle help show                            # a command's arguments, flags and an example
//
// Redis is found as redis-cli finds it: -h, -p, -a, -n or -u URL, else REDIS_URL, else
// REDIS_ADDR (host:port; several, comma-separated, or -c, for a Cluster), else
// 127.0.0.1:6379. Keys are given as the code gives them to throttle.New, without the
// prefix (-prefix, "jobthrottle:" by default, as throttle.WithKeyPrefix).
//
// Every command reads and writes only keys whose Redis type and content are those
// jobthrottle writes (internal/keys.Check); it names any other key it finds under a
// key's tag and leaves it alone. docs/operating.md describes each command and the ACL
// rules it needs.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"

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
		return usageFailed(stderr, err)
	}
	switch {
	case o.acl:
		helpACL(stdout, o.prefix)
		return 0
	case o.help:
		help(stdout, o.cmd, o.prefix)
		return 0
	}
	c, err := dial(ctx, o)
	if err != nil {
		return failed(stderr, err, o.prefix)
	}
	defer c.Close()
	t := &tool{o: o, rdb: c, in: stdin, out: stdout}
	if err := o.cmd.run(t, ctx); err != nil {
		return failed(stderr, err, o.prefix)
	}
	return 0
}

// failed prints err, one line, and returns the exit status: 2 for bad usage, else 1.
func failed(stderr io.Writer, err error, prefix string) int {
	var u usageError
	if errors.As(err, &u) {
		return usageFailed(stderr, u)
	}
	fmt.Fprintln(stderr, "jobthrottle:", describe(err, prefix))
	return 1
}

// usageFailed prints a usage error, one line with a pointer to help, and returns 2.
func usageFailed(stderr io.Writer, err error) int {
	var u usageError
	errors.As(err, &u)
	where := "jobthrottle --help"
	if u.cmd != "" {
		where = "jobthrottle help " + u.cmd
	}
	fmt.Fprintf(stderr, "jobthrottle: %v (see '%s')\n", err, where)
	return 2
}
