package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// usageError is a mistake in the command line: the command exits 2 and points to
// the help of cmd ("" for the general help).
type usageError struct{ msg, cmd string }

func (e usageError) Error() string { return e.msg }

func usagef(cmd, format string, args ...any) error {
	return usageError{fmt.Sprintf(format, args...), cmd}
}

// options is the parsed command line.
type options struct {
	cmd      *command
	help     bool // print the help of cmd (nil: the general help)
	acl      bool // help acl: print the ACL rules
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
	pauseFor time.Duration // pause: its DURATION

	// weight: the WEIGHT and its DURATION, or clear
	weight    float64
	weightFor time.Duration
	clear     bool
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

// connFlags are the flags every command takes: where Redis is and the key prefix.
var connFlags = []string{"h", "p", "a", "user", "n", "u", "c", "prefix"}

// parse reads the command line. Flags may come before the command, after it and
// between its arguments. Help is asked for with "help [COMMAND]", --help anywhere,
// or -h without a host after it (the last word: -h HOST is the host, as for
// redis-cli).
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
	fs.StringVar(&o.prefix, "prefix", keys.DefaultPrefix, "")
	fs.Var(limitList{&o.limits}, "limit", "")
	fs.StringVar(&o.alg, "alg", "", "")
	fs.IntVar(&o.buckets, "buckets", 0, "")
	fs.IntVar(&o.max, "max", 0, "")
	fs.DurationVar(&o.interval, "interval", time.Second, "")
	fs.IntVar(&o.count, "count", 0, "")
	fs.BoolVar(&o.yes, "yes", false, "")
	fs.DurationVar(&o.forD, "for", 0, "")
	if n := len(args); n > 0 && (args[n-1] == "-h" || args[n-1] == "--h") {
		o.help, args = true, args[:n-1]
	}
	var pos []string
	for {
		if len(args) > 0 && negative(args[0]) { // an argument ("pause KEY -5s"), not a flag
			pos, args = append(pos, args[0]), args[1:]
			continue
		}
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			o.help = true
			break
		}
		if err != nil {
			return nil, usagef(commandName(pos), "%v", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if len(pos) > 0 && pos[0] == "help" {
		o.help, pos = true, pos[1:]
		if len(pos) > 1 {
			return nil, usagef("", "help takes one command, got %q", strings.Join(pos, " "))
		}
	}
	if o.help && len(pos) == 1 && pos[0] == "acl" {
		o.acl = true
		return o, nil
	}
	if len(pos) == 0 {
		if o.help {
			return o, nil
		}
		return nil, usagef("", "no command")
	}
	o.cmd = lookup(pos[0])
	if o.cmd == nil {
		return nil, usagef("", "unknown command %q", pos[0])
	}
	if o.help {
		return o, nil
	}
	c := o.cmd
	o.args = pos[1:]
	if len(o.args) < c.min || len(o.args) > c.max {
		return nil, usagef(c.name, "%s takes %s, got %d argument%s", c.name, c.args, len(o.args), plural(len(o.args)))
	}
	var wrong []string
	fs.Visit(func(f *flag.Flag) {
		if !slices.Contains(connFlags, f.Name) && !slices.Contains(c.flags, f.Name) {
			wrong = append(wrong, "-"+f.Name)
		}
	})
	if len(wrong) > 0 {
		return nil, usagef(c.name, "%s does not take %s", c.name, strings.Join(wrong, ", "))
	}
	if o.alg != "" && !slices.Contains(keys.Algorithms(), o.alg) {
		return nil, usagef(c.name, "-alg %q: want one of %s", o.alg, strings.Join(keys.Algorithms(), ", "))
	}
	switch {
	case o.forD < 0:
		return nil, usagef(c.name, "-for %v is negative", o.forD)
	case o.interval <= 0:
		return nil, usagef(c.name, "-interval %v is not positive", o.interval)
	case o.count < 0 || o.max < 0 || o.buckets < 0:
		return nil, usagef(c.name, "-count, -max and -buckets take a positive number")
	}
	if c.check != nil {
		if err := c.check(o); err != nil {
			return nil, err
		}
	}
	if o.host == "" && o.port == 0 && o.url == "" {
		if a := getenv("REDIS_ADDR"); a != "" {
			o.addrs = strings.Split(a, ",")
		}
	}
	return o, nil
}

// negative reports whether a word is a negative number or duration ("-5s", "-.5",
// "-5/1s"), which no flag's name begins with: the flag package would take it for one.
func negative(word string) bool {
	return len(word) > 1 && word[0] == '-' && (word[1] == '.' || word[1] >= '0' && word[1] <= '9')
}

// commandName is the command among the words read so far, for a usage error's
// pointer to help: "" when there is none yet.
func commandName(pos []string) string {
	if len(pos) > 0 && lookup(pos[0]) != nil {
		return pos[0]
	}
	return ""
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// dial connects as the options say and checks the server answers (PING); its errors
// say where Redis was looked for.
func dial(ctx context.Context, o *options) (redis.UniversalClient, error) {
	var c redis.UniversalClient
	var where string
	switch {
	case o.url != "":
		opt, err := redis.ParseURL(o.url)
		if err != nil {
			return nil, usagef("", "-u %q: %v", o.url, err)
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
		return nil, &redisError{where: where, cmd: "ping", err: err}
	}
	return c, nil
}
