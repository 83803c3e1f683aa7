package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// usageError is a mistake in the command line.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// options is the parsed command line.
type options struct {
	cmd      string
	args     []string
	host     string
	port     int
	password string
	user     string
	db       int
	url      string
	cluster  bool
	addrs    []string // from REDIS_ADDR, when -h/-p are not given
	prefix   string
	limits   []throttle.Limit
	alg      string
	buckets  int
	max      int
	interval time.Duration
	count    int
	yes      bool
	forD     time.Duration // set: how long the override lasts; 0 until unset
}

// limitList is the repeatable -limit flag.
type limitList struct{ l *[]throttle.Limit }

func (f limitList) String() string { return "" }

func (f limitList) Set(s string) error {
	l, err := parseLimit(s)
	if err != nil {
		return err
	}
	*f.l = append(*f.l, l)
	return nil
}

// parseLimit reads "RATE/PERIOD[:BURST]": 20/1.1s, 100/m, 10/s:20. A period without a
// number (s, m, h) is one of that unit.
func parseLimit(s string) (throttle.Limit, error) {
	var l throttle.Limit
	rate, rest, ok := strings.Cut(s, "/")
	if !ok {
		return l, fmt.Errorf("limit %q: want RATE/PERIOD, e.g. 20/1s", s)
	}
	period, burst, hasBurst := strings.Cut(rest, ":")
	r, err := strconv.Atoi(rate)
	if err != nil || r < 1 {
		return l, fmt.Errorf("limit %q: rate %q is not a positive integer", s, rate)
	}
	if period == "s" || period == "m" || period == "h" {
		period = "1" + period
	}
	p, err := time.ParseDuration(period)
	if err != nil || p <= 0 {
		return l, fmt.Errorf("limit %q: period %q is not a positive duration (e.g. 1s, 500ms, 1m)", s, period)
	}
	l = throttle.Limit{Rate: r, Period: p}
	if hasBurst {
		if l.Burst, err = strconv.Atoi(burst); err != nil || l.Burst < 1 {
			return l, fmt.Errorf("limit %q: burst %q is not a positive integer", s, burst)
		}
	}
	return l, nil
}

func parse(args []string, getenv func(string) string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("jobthrottle", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.host, "h", "", "")
	fs.IntVar(&o.port, "p", 0, "")
	fs.StringVar(&o.password, "a", getenv("REDISCLI_AUTH"), "")
	fs.StringVar(&o.user, "user", "", "")
	fs.IntVar(&o.db, "n", 0, "")
	fs.StringVar(&o.url, "u", getenv("REDIS_URL"), "")
	fs.BoolVar(&o.cluster, "c", false, "")
	fs.StringVar(&o.prefix, "prefix", "jobthrottle:", "")
	fs.Var(limitList{&o.limits}, "limit", "")
	fs.StringVar(&o.alg, "alg", "", "")
	fs.IntVar(&o.buckets, "buckets", 0, "")
	fs.IntVar(&o.max, "max", 0, "")
	fs.DurationVar(&o.interval, "interval", time.Second, "")
	fs.IntVar(&o.count, "count", 0, "")
	fs.BoolVar(&o.yes, "yes", false, "")
	fs.DurationVar(&o.forD, "for", 0, "")
	// flags may come before and after the command and between its arguments
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				o.cmd = "help"
				return o, nil
			}
			return nil, usageError{err.Error()}
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if len(pos) == 0 {
		return nil, usagef("no command")
	}
	o.cmd, o.args = pos[0], pos[1:]
	c, ok := commands[o.cmd]
	if !ok {
		return nil, usagef("unknown command %q", o.cmd)
	}
	if len(o.args) < c.min || len(o.args) > c.max {
		return nil, usagef("%s takes %d to %d arguments, got %d", o.cmd, c.min, c.max, len(o.args))
	}
	if o.alg != "" {
		if _, ok := algorithms[o.alg]; !ok {
			return nil, usagef("-alg %q: want sw, sc, tb or fw", o.alg)
		}
	}
	if o.forD < 0 {
		return nil, usagef("-for %v is negative", o.forD)
	}
	if o.interval <= 0 {
		return nil, usagef("-interval %v is not positive", o.interval)
	}
	if o.host == "" && o.port == 0 && o.url == "" {
		if a := getenv("REDIS_ADDR"); a != "" {
			o.addrs = strings.Split(a, ",")
		}
	}
	return o, nil
}

// dial connects as the options say and checks the server answers.
func dial(ctx context.Context, o *options) (redis.UniversalClient, error) {
	var c redis.UniversalClient
	var where string
	switch {
	case o.url != "":
		opt, err := redis.ParseURL(o.url)
		if err != nil {
			return nil, fmt.Errorf("-u %q: %w", o.url, err)
		}
		where = opt.Addr
		if o.cluster {
			c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{opt.Addr}, Username: opt.Username, Password: opt.Password})
		} else {
			c = redis.NewClient(opt)
		}
	default:
		addrs := o.addrs
		if len(addrs) == 0 {
			host, port := o.host, o.port
			if host == "" {
				host = "127.0.0.1"
			}
			if port == 0 {
				port = 6379
			}
			addrs = []string{net.JoinHostPort(host, strconv.Itoa(port))}
		}
		where = strings.Join(addrs, ",")
		if o.cluster || len(addrs) > 1 {
			c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: o.user, Password: o.password,
				DialTimeout: 2 * time.Second, MaxRetries: 1})
		} else {
			c = redis.NewClient(&redis.Options{Addr: addrs[0], Username: o.user, Password: o.password, DB: o.db,
				DialTimeout: 2 * time.Second, MaxRetries: 1})
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		c.Close()
		return nil, fmt.Errorf("cannot reach Redis at %s: %w", where, err)
	}
	return c, nil
}
