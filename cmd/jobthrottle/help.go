package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/jobthrottle/jobthrottle/throttle"
)

// command is one command: its arguments, the flags it takes besides connFlags, its
// help, and what runs it.
type command struct {
	name     string
	args     string // the arguments, as the help shows them
	min, max int    // how many arguments it takes
	flags    []string
	summary  string               // one line, for the list of commands
	about    string               // what it does, for its own help
	example  string               // a command line and what it prints
	check    func(*options) error // reads the arguments before Redis is dialled; nil: none to read
	run      func(*tool, context.Context) error
}

// commands are the commands, in the order the help lists them.
var commands = []*command{
	{
		name: "ls", args: "[PATTERN]", min: 0, max: 1,
		summary: "list the keys under the prefix, with their kind, pause, override and limits",
		about: `Lists every key under the prefix (SCAN on each node), or those whose key matches
PATTERN (a glob: 'vendor-*'), one a line: the key as the code gives it to
throttle.New, its kind (the algorithm whose state it holds, Semaphore, or "(idle)"
when it holds only what is set on it), its tenants' caps and tasks' bookings, the
pause and the override set on it with the time each has left, and its limits as its
record (its state's head, written by the last process to use it) says; "drift:"
names another process's limits found on the key within the last minute.
Keys under the prefix whose type or content jobthrottle does not write are listed
after the table, with what is wrong with each; no command touches them.`,
		example: `$ jobthrottle ls
KEY         KIND                            PAUSED  OVERRIDE  LIMITS (the key's record)
mail        TokenBucket                     -       -         5/1m0s:8
reports     Semaphore                       -       -         -
vendor-api  SlidingWindow, 3 tenants' caps  -       -         20/1s`,
		run: (*tool).ls,
	},
	{
		name: "show", args: "KEY", min: 1, max: 1, flags: []string{"limit", "alg", "buckets", "max"},
		summary: "print a key's live state once",
		about: `Prints the key's live state, by the Redis server's clock: each limit's use of
its capacity (bookings apart; a unit's, such as tokens, with the estimates booked),
the queue booked ahead, when the next permit is free, whether a pause and an
override are set (each with the time it has left),
operators' weights of tenants, the fair share (W, the weight of the tenants
queued, and the tenants with the most queued: each one's weight and how far ahead
its requests reach), another process's limits when they were found on the key
lately (drift), and when the key is back to full capacity. A semaphore shows its
leases and waiters. The algorithm and limits come from the key's record (its
state's head), which the processes that use the key write; -limit shows the state
as other limits read it, or stands in for a missing record (a key idle for a while).`,
		example: `$ jobthrottle show vendor-api
vendor-api  SlidingWindow
  20 per 1s              [##############################] 20/20 used
  queue       none
  next free   in 257ms (remaining now: 0)
  paused      no
  override    none
  weights     acme 3, 9m48.5s more (an operator's)
  fair share  W 5 (the weight of the tenants queued); the tenants with the most queued:
    TENANT  WEIGHT  QUEUED
    bigco   1       4.5s ahead
    globex  1       1.5s ahead
    acme    3       227ms ahead
  reset in    958ms (state TTL 9m48.453s)`,
		run: (*tool).show,
	},
	{
		name: "watch", args: "KEY...", min: 1, max: 100, flags: []string{"limit", "alg", "buckets", "max", "interval", "count"},
		summary: "show keys' live state, redrawn every -interval until Ctrl-C",
		about: `Shows each key as show does, redrawn every -interval (1s unless given) until
Ctrl-C or -count screens. From the second screen on, a sliding window's or
sliding counter's "granted/s" line gives the permits that took effect per second
since the last screen (bookings come due included) and the grants made (bookings
included).`,
		example: `$ jobthrottle watch -interval 2s vendor-api mail
jobthrottle watch  14:03:07  every 2s  (Ctrl-C quits)

vendor-api  SlidingWindow
  10 per 1m0s            [##############################] 10/10 used
  ...
  granted/s   0.5 took effect, 0.5 new grants`,
		run: (*tool).watch,
	},
	{
		name: "pause", args: "KEY DURATION", min: 2, max: 2,
		summary: "stop all grants on a key, fleet-wide, for DURATION",
		about: `Pauses the key for DURATION (30s, 5m, 1h): the whole fleet stops until it ends or
resume ends it. Every process's calls are denied and bookings start after it; a
waiter already asleep on a booking gives it back and books after the pause. A
longer pause already set is kept. An override set on the key stays.`,
		example: `$ jobthrottle pause vendor-api 30s
paused vendor-api for 30s: the whole fleet stops until then; a waiter already asleep gives its booking back and books after the pause ('jobthrottle resume vendor-api' ends it sooner)`,
		check: parsePause,
		run:   (*tool).pause,
	},
	{
		name: "resume", args: "KEY", min: 1, max: 1,
		summary: "end a pause on a key now",
		about: `Ends the pause set on the key, for every process, and says how much of it was
left. An override set on the key stays (unset ends it). A key that is not paused
is left as it is.`,
		example: `$ jobthrottle resume vendor-api
resumed vendor-api: ended its pause, which had 21.4s left`,
		run: (*tool).resume,
	},
	{
		name: "set", args: "KEY RATE/PERIOD[:BURST]...", min: 2, max: 17, flags: []string{"for"},
		summary: "override the rates of a key's limits for every process",
		about: `Overrides the rates (and, for a token bucket, the bursts) of the key's limits, in
order, for every process from its next call, until unset or for -for's duration.
Each PERIOD must be the limit's own (an override changes rates, not periods);
limits not given keep their rates. The key's record gives its limits, and the
override is checked against them. A pause set on the key stays. A semaphore's key
(leases held, and no limiter's record) is refused: a semaphore has no rates.`,
		example: `$ jobthrottle set -for 1h vendor-api 2/1m
vendor-api: every process now enforces 2 per 1m0s in place of 10 per 1m0s, for 1h0m0s (rates only: the periods stay those the code passes)`,
		run: (*tool).set,
	},
	{
		name: "unset", args: "KEY", min: 1, max: 1,
		summary: "remove an override: the rates the code passes apply again",
		about: `Removes the override set on the key: every process's next call enforces the
limits its code passes. A pause set on the key stays (resume ends it).`,
		example: `$ jobthrottle unset vendor-api
vendor-api: removed the override (2 per 1m0s, 59m12s left); the rates the code passes apply again`,
		run: (*tool).unset,
	},
	{
		name: "weight", args: "KEY TENANT (WEIGHT DURATION | clear)", min: 3, max: 4,
		summary: "set a tenant's weight in a key's fair share, fleet-wide, or clear it",
		about: `Sets TENANT's weight in the key's fair share for every process, for DURATION
(10m, 24h), in place of the weight its callers pass (throttle.Weight): while
several tenants have requests queued, each gets the key's rate in proportion to
its weight. WEIGHT is a number from 0.000001 to 1000000 (3, 0.5). 'weight KEY
TENANT clear' ends it sooner: its callers' weight counts again. A tenant's name
is any text of 1 to 256 bytes, given in the shell's quoting; show lists the
weights set.`,
		example: `$ jobthrottle weight vendor-api acme 3 10m
vendor-api: tenant acme now has weight 3 in every process's fair share, for 10m0s, in place of the weight its callers pass ('jobthrottle weight vendor-api acme clear' ends it sooner)
$ jobthrottle weight vendor-api acme clear
vendor-api: cleared tenant acme's weight (3, 9m50.5s left); the weight its callers pass counts again`,
		check: parseWeight,
		run:   (*tool).weight,
	},
	{
		name: "reset", args: "KEY", min: 1, max: 1, flags: []string{"yes"},
		summary: "delete a key's state, so its limits start afresh (asks first)",
		about: `Deletes the key's state: what its state key counts, the fair share's queue, its
tenants' caps, its tasks' bookings, a semaphore's leases and queue. Its limits
start afresh: up to a full window more can pass, and a semaphore's holders lose
their leases. What is set on the key is kept: the pause, the override and
operators' weights stay in its state key, alone (resume, unset and weight ...
clear end them). Keys whose type or content is not jobthrottle's are left alone
and named. It asks before deleting, unless -yes.`,
		example: `$ jobthrottle reset vendor-api
delete the counts of {jobthrottle:vendor-api}:l, {jobthrottle:vendor-api}:q, 3 tenants' caps ({jobthrottle:vendor-api}:t:*)? Its limits start afresh: up to a full window more can pass; what is set on it stays: the pause (29.9s more), 1 tenant's weight. [y/N] y
reset vendor-api: deleted the counts of {jobthrottle:vendor-api}:l, {jobthrottle:vendor-api}:q, 3 tenants' caps ({jobthrottle:vendor-api}:t:*)
kept what is set on it: the pause (29.9s more), 1 tenant's weight`,
		run: (*tool).reset,
	},
	{
		name: "help", args: "[COMMAND | acl]", min: 0, max: 1,
		summary: "this text, a command's help, or the ACL rules ('help acl')",
	},
}

// lookup returns the command named name, or nil.
func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// flagHelp is each flag's line of help.
var flagHelp = map[string]string{
	"h":        "-h HOST            Redis host (default 127.0.0.1; REDIS_ADDR gives host:port)",
	"p":        "-p PORT            Redis port (default 6379)",
	"a":        "-a PASSWORD        AUTH password (or REDISCLI_AUTH)",
	"user":     "--user NAME        AUTH user (ACL)",
	"n":        "-n DB              database number",
	"u":        "-u URL             redis://[user:pass@]host:port/db (or REDIS_URL)",
	"c":        "-c                 Redis Cluster (REDIS_ADDR may list nodes, comma-separated)",
	"prefix":   "-prefix P          key prefix, as throttle.WithKeyPrefix (default \"jobthrottle:\")",
	"limit":    "-limit R/P[:B]     a limit of the key as the code gives it, RATE/PERIOD[:BURST]\n                     (20/1.1s, 10/s:20); repeat for several; in place of the key's record",
	"alg":      "-alg NAME          sw, sc, tb or fw: the algorithm, in place of the one the key's\n                     state or record shows",
	"buckets":  "-buckets N         a sliding counter's buckets, as throttle.WithBuckets (default:\n                     the record's, else 50)",
	"max":      "-max N             a semaphore's max, for the bar (the key does not record it)",
	"interval": "-interval D        time between screens (default 1s)",
	"count":    "-count N           stop after N screens (default: until Ctrl-C)",
	"yes":      "-yes               delete without asking",
	"for":      "-for D             how long the override lasts (default: until unset)",
}

// cliRules are the ACL rules the command needs beyond throttle.ACLRules: PING when
// it connects, SCAN for ls and for reset's bookings and tenants' caps, WATCH for
// reset's transaction.
const cliRules = "+ping +scan +watch"

// help prints the help of c, or the general help when c is nil.
func help(w io.Writer, c *command, prefix string) {
	if c == nil {
		fmt.Fprint(w, `usage: jobthrottle [flags] COMMAND [flags] [ARGS]

Shows and steers the limits a fleet of workers shares through Redis: the keys
jobthrottle's Limiters and Semaphores keep there.

commands:
`)
		for _, c := range commands {
			fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
		}
		fmt.Fprint(w, "\nflags of every command (before or after it):\n")
		for _, f := range connFlags {
			fmt.Fprintf(w, "  %s\n", flagHelp[f])
		}
		fmt.Fprint(w, `
Keys are given as the code gives them to throttle.New, without the prefix.
'jobthrottle help COMMAND' (or 'jobthrottle COMMAND --help') gives a command's
arguments, flags and an example; 'jobthrottle help acl' the Redis ACL rules.
`)
		return
	}
	if c.name == "help" {
		fmt.Fprint(w, "usage: jobthrottle help [COMMAND | acl]\n\nPrints the general help, a command's, or the Redis ACL rules for -prefix.\n")
		return
	}
	fmt.Fprintf(w, "usage: jobthrottle [flags] %s", c.name)
	if len(c.flags) > 0 {
		fmt.Fprint(w, " [flags]")
	}
	fmt.Fprintf(w, " %s\n\n%s\n", c.args, c.about)
	if len(c.flags) > 0 {
		fmt.Fprint(w, "\nflags:\n")
		for _, f := range c.flags {
			fmt.Fprintf(w, "  %s\n", flagHelp[f])
		}
	}
	fmt.Fprintf(w, "\nexample:\n%s\n\nThe flags every command takes (Redis, -prefix): jobthrottle --help\n", indent(c.example))
}

// helpACL prints the ACL rules of a worker and of this command for prefix.
func helpACL(w io.Writer, prefix string) {
	fmt.Fprintf(w, `Redis ACL rules for the keys under prefix %q.

A worker (Limiters and Semaphores) needs throttle.ACLRules:

  ACL SETUSER worker on >secret %s

This command needs those and %s:

  ACL SETUSER operator on >secret %s %s

On a Redis Cluster, set the users on every node (+cluster|slots is there for a
cluster: go-redis's cluster client reads the cluster's layout with CLUSTER SLOTS).

A command refused for lack of a rule says NOPERM and names the rule.
`, prefix, throttle.ACLRules(prefix), cliRules, throttle.ACLRules(prefix), cliRules)
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(s, "\n", "\n  ")
}
