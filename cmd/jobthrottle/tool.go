package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// algorithms maps a state key's suffix to its algorithm.
var algorithms = map[string]throttle.Algorithm{
	"sw": throttle.SlidingWindow,
	"sc": throttle.SlidingCounter,
	"tb": throttle.TokenBucket,
	"fw": throttle.FixedWindow,
}

// suffixes are every key jobthrottle keeps under a hash tag (see the README's key
// layout), in the order ls and reset name them.
var suffixes = []string{"sw", "sc", "tb", "fw", "sem", "semq", "semx", "pause", "conf"}

// tool runs one command.
type tool struct {
	o   *options
	rdb redis.UniversalClient
	in  io.Reader
	out io.Writer
	now func() time.Time // watch's clock for grants/s; nil: time.Now
}

// commands are the commands: the arguments each takes (fewest, most) and what runs
// it (help is run's own).
var commands = map[string]struct {
	min, max int
	run      func(*tool, context.Context) error
}{
	"ls":     {0, 1, (*tool).ls},
	"show":   {1, 1, (*tool).show},
	"watch":  {1, 100, (*tool).watch},
	"pause":  {2, 2, (*tool).pause},
	"resume": {1, 1, (*tool).resume},
	"reset":  {1, 1, (*tool).reset},
	"set":    {2, 17, (*tool).set},
	"unset":  {1, 1, (*tool).unset},
	"help":   {0, 100, nil},
}

func (t *tool) do(ctx context.Context) error {
	c, ok := commands[t.o.cmd]
	if !ok || c.run == nil {
		return usagef("unknown command %q", t.o.cmd)
	}
	return c.run(t, ctx)
}

// tag is the hash tag of a key: "{<prefix><key>}".
func (t *tool) tag(key string) (string, error) {
	if key == "" || strings.HasPrefix(t.o.prefix+key, "}") {
		return "", fmt.Errorf("invalid key %q", key)
	}
	return "{" + t.o.prefix + key + "}", nil
}

// present returns the suffixes of the keys that exist under key's tag.
func (t *tool) present(ctx context.Context, key string) ([]string, error) {
	tag, err := t.tag(key)
	if err != nil {
		return nil, err
	}
	pipe := t.rdb.Pipeline() // one hash slot: one node, one round trip
	cmds := make([]*redis.IntCmd, len(suffixes))
	for i, s := range suffixes {
		cmds[i] = pipe.Exists(ctx, tag+":"+s)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	var have []string
	for i, c := range cmds {
		if c.Val() == 1 {
			have = append(have, suffixes[i])
		}
	}
	return have, nil
}

// kind names what the state suffixes show: an algorithm, "Semaphore", or "" for
// none; several kinds are joined with "+".
func kind(have []string) string {
	var kinds []string
	for _, s := range have {
		if a, ok := algorithms[s]; ok {
			kinds = append(kinds, a.String())
		} else if strings.HasPrefix(s, "sem") && !slices.Contains(kinds, "Semaphore") {
			kinds = append(kinds, "Semaphore")
		}
	}
	return strings.Join(kinds, "+")
}

// ls lists the keys under the prefix (matching the optional glob), one a line:
// key, kind, and a pause if one is set.
func (t *tool) ls(ctx context.Context) error {
	pattern := "*"
	if len(t.o.args) == 1 {
		pattern = t.o.args[0]
	}
	match := "{" + escapeGlob(t.o.prefix) + pattern + "}:*"
	found := map[string][]string{} // key -> suffixes
	scan := func(ctx context.Context, c *redis.Client) error {
		it := c.Scan(ctx, 0, match, 1000).Iterator()
		for it.Next(ctx) {
			name := it.Val()
			i := strings.LastIndex(name, "}:")
			if i < 0 || !strings.HasPrefix(name, "{"+t.o.prefix) {
				continue
			}
			suffix := name[i+2:]
			if !slices.Contains(suffixes, suffix) {
				continue
			}
			key := name[len(t.o.prefix)+1 : i]
			found[key] = append(found[key], suffix)
		}
		return it.Err()
	}
	var err error
	switch c := t.rdb.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex // ForEachMaster runs the nodes at once; found is shared
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return scan(ctx, n)
		})
	case *redis.Client:
		err = scan(ctx, c)
	default:
		err = errors.New("ls needs a plain or cluster client")
	}
	if err != nil {
		return err
	}
	if len(found) == 0 {
		fmt.Fprintf(t.out, "no jobthrottle keys match %s (keys under another prefix? give it with -prefix, as the code gives throttle.WithKeyPrefix)\n", match)
		return nil
	}
	keys := make([]string, 0, len(found))
	for k := range found {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprintf(t.out, "%-32s %-24s %-8s %s\n", "KEY", "KIND", "PAUSED", "LIMITS (the key's record)")
	for _, k := range keys {
		have := found[k]
		slices.SortFunc(have, func(a, b string) int { return slices.Index(suffixes, a) - slices.Index(suffixes, b) })
		paused := "-"
		if slices.Contains(have, "pause") {
			if d, err := t.pausedFor(ctx, k); err == nil && d > 0 {
				paused = round(d).String()
			}
		}
		limits := "-"
		kd := kind(have)
		if slices.Contains(have, "conf") {
			rec, err := throttle.ReadRecord(ctx, t.rdb, k, throttle.WithKeyPrefix(t.o.prefix))
			switch {
			case err != nil:
				limits = "(unreadable record)"
			default:
				limits = limitsText(rec.Limits)
				if kd == "" {
					kd = rec.Algorithm.String() + " (idle)"
				}
			}
		}
		if kd == "" {
			kd = "(pause only)"
		}
		fmt.Fprintf(t.out, "%-32s %-24s %-8s %s\n", k, kd, paused, limits)
	}
	return nil
}

// limitsText is limits as the command line takes them: RATE/PERIOD[:BURST], comma-separated.
func limitsText(limits []throttle.Limit) string {
	parts := make([]string, len(limits))
	for i, l := range limits {
		parts[i] = fmt.Sprintf("%d/%v", l.Rate, l.Period)
		if l.Burst != 0 {
			parts[i] += fmt.Sprintf(":%d", l.Burst)
		}
	}
	return strings.Join(parts, ",")
}

// escapeGlob quotes the glob characters of s for SCAN MATCH.
func escapeGlob(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
	return r.Replace(s)
}

// pausedFor reads the pause key's end and the server's clock.
func (t *tool) pausedFor(ctx context.Context, key string) (time.Duration, error) {
	tag, err := t.tag(key)
	if err != nil {
		return 0, err
	}
	// the control key: the pause's end (µs), then an override if one is set
	text, err := t.rdb.Get(ctx, tag+":pause").Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(text, " ")
	end, err := strconv.ParseInt(first, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("key %q: unreadable control key %q", key, text)
	}
	now, err := t.rdb.Time(ctx).Result()
	if err != nil {
		return 0, err
	}
	return max(0, time.Duration(end-now.UnixMicro())*time.Microsecond), nil
}

// target is a key resolved to what to inspect.
type target struct {
	key  string
	have []string
	lim  *throttle.Limiter
	sem  *throttle.Semaphore
}

// resolve finds what key is: the algorithm given with -alg, else found from its
// state, else from its record; or a semaphore. The limits are those given with
// -limit, else the key's record's (see throttle.ReadRecord). An unknown key (no
// state, no record, no -alg) is an error.
func (t *tool) resolve(ctx context.Context, key string) (*target, error) {
	have, err := t.present(ctx, key)
	if err != nil {
		return nil, err
	}
	tg := &target{key: key, have: have}
	var rec throttle.Record
	recErr := throttle.ErrNoRecord
	if slices.Contains(have, "conf") {
		rec, recErr = throttle.ReadRecord(ctx, t.rdb, key, throttle.WithKeyPrefix(t.o.prefix))
	}
	suffix := t.o.alg
	if suffix == "" {
		var algs []string
		for _, s := range have {
			if _, ok := algorithms[s]; ok {
				algs = append(algs, s)
			}
		}
		switch {
		case len(algs) > 1:
			return nil, fmt.Errorf("key %q holds the state of several algorithms (%s): give -alg", key, strings.Join(algs, ", "))
		case len(algs) == 1:
			suffix = algs[0]
		case slices.Contains(have, "sem") || slices.Contains(have, "semq"):
			max := t.o.max
			if max == 0 {
				max = 1_000_000_000 // unknown: the figures do not depend on it
			}
			tg.sem, err = throttle.NewSemaphore(t.rdb, key, max, throttle.WithKeyPrefix(t.o.prefix))
			return tg, err
		case recErr == nil: // idle: no state, but its processes' record
			suffix = suffixOf(rec.Algorithm)
		case slices.Contains(have, "pause"):
			return nil, fmt.Errorf("key %q has a pause set but no state (idle) and no record of its limits: give -alg and -limit to show it", key)
		default:
			return nil, fmt.Errorf("unknown key %q: nothing under %s (prefix %q); the key is idle or misspelt: see jobthrottle ls",
				key, "{"+t.o.prefix+key+"}:*", t.o.prefix)
		}
	}
	limits, buckets := t.o.limits, t.o.buckets
	if len(limits) == 0 {
		switch {
		case errors.Is(recErr, throttle.ErrNoRecord):
			// a state key jobthrottle did not write says so first: its limits do not matter
			probe, err := throttle.New(t.rdb, key, throttle.PerSecond(1), throttle.WithAlgorithm(algorithms[suffix]), throttle.WithKeyPrefix(t.o.prefix))
			if err != nil {
				return nil, err
			}
			if _, err := probe.Inspect(ctx); errors.Is(err, throttle.ErrCorruptState) {
				return nil, err
			}
			return nil, fmt.Errorf("key %q is a %v limiter with no record of its limits (none of its processes wrote one lately: idle, or an older jobthrottle?): give them with -limit RATE/PERIOD as the code does (e.g. -limit 20/1.1s)",
				key, algorithms[suffix])
		case recErr != nil:
			return nil, fmt.Errorf("key %q: reading its record: %w (give -limit RATE/PERIOD to show it anyway)", key, recErr)
		case rec.Algorithm != algorithms[suffix]:
			return nil, fmt.Errorf("key %q holds %v state, but its record says %v (written by the last process to use it): a rollout between algorithms? give -alg and -limit",
				key, algorithms[suffix], rec.Algorithm)
		}
		limits = rec.Limits
		if buckets == 0 {
			buckets = rec.Buckets
		}
	}
	if buckets == 0 {
		buckets = 50 // throttle's default
	}
	tg.lim, err = throttle.New(t.rdb, key, limits[0], throttle.WithLimits(limits[1:]...),
		throttle.WithAlgorithm(algorithms[suffix]), throttle.WithKeyPrefix(t.o.prefix), throttle.WithBuckets(buckets))
	return tg, err
}

// suffixOf is the state key's suffix of algorithm a.
func suffixOf(a throttle.Algorithm) string {
	for s, b := range algorithms {
		if a == b {
			return s
		}
	}
	return ""
}

// show prints a key's state once.
func (t *tool) show(ctx context.Context) error {
	tg, err := t.resolve(ctx, t.o.args[0])
	if err != nil {
		return err
	}
	v, err := t.view(ctx, tg)
	if err != nil {
		return err
	}
	v.render(t.out, nil)
	return nil
}

// watch shows the keys' state every interval until ctx ends (or -count screens).
func (t *tool) watch(ctx context.Context) error {
	var tgs []*target
	for _, k := range t.o.args {
		tg, err := t.resolve(ctx, k)
		if err != nil {
			return err
		}
		tgs = append(tgs, tg)
	}
	now := t.now
	if now == nil {
		now = time.Now
	}
	prev := make([]*view, len(tgs))
	tick := time.NewTicker(t.o.interval)
	defer tick.Stop()
	for screen := 1; ; screen++ {
		var b strings.Builder
		b.WriteString("\033[H\033[2J") // home, clear
		fmt.Fprintf(&b, "jobthrottle watch  %s  every %v  (Ctrl-C quits)\n\n", now().UTC().Format("15:04:05"), t.o.interval)
		for i, tg := range tgs {
			v, err := t.view(ctx, tg)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				fmt.Fprintf(&b, "%s: %v\n\n", tg.key, err)
				continue
			}
			v.at = now()
			v.render(&b, prev[i])
			b.WriteString("\n")
			prev[i] = v
		}
		io.WriteString(t.out, b.String())
		if t.o.count > 0 && screen >= t.o.count {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// pause pauses the key for the duration given.
func (t *tool) pause(ctx context.Context) error {
	key := t.o.args[0]
	d, err := time.ParseDuration(t.o.args[1])
	if err != nil || d <= 0 {
		return usagef("pause %s: %q is not a positive duration (e.g. 30s, 5m)", key, t.o.args[1])
	}
	have, err := t.present(ctx, key)
	if err != nil {
		return err
	}
	if err := t.control(key, func(lim *throttle.Limiter) error { return lim.Pause(ctx, d) }); err != nil {
		return err
	}
	left, err := t.pausedFor(ctx, key)
	if err != nil {
		return err
	}
	fmt.Fprintf(t.out, "paused %s: no grants for %v\n", key, round(left))
	if left > d+time.Second {
		fmt.Fprintf(t.out, "(a longer pause was already set; it is kept)\n")
	}
	t.noteIdle(key, have)
	return nil
}

// control runs op on a limiter on key for the control key's operations (pause,
// resume, set, unset), which do not depend on its algorithm; limits, if given, are
// those an override replaces.
func (t *tool) control(key string, op func(*throttle.Limiter) error, limits ...throttle.Limit) error {
	if len(limits) == 0 {
		limits = []throttle.Limit{throttle.PerSecond(1)}
	}
	lim, err := throttle.New(t.rdb, key, limits[0], throttle.WithLimits(limits[1:]...), throttle.WithKeyPrefix(t.o.prefix))
	if err != nil {
		return err
	}
	return op(lim)
}

// noteIdle says so when the key had no state (have: its suffixes): the key may be
// misspelt, and the command changed nothing a process uses.
func (t *tool) noteIdle(key string, have []string) {
	switch {
	case kind(have) != "":
	case slices.Contains(have, "conf"):
		fmt.Fprintf(t.out, "note: %q is idle now (no state, but its processes' record): they apply it from their next call\n", key)
	default:
		fmt.Fprintf(t.out, "note: no state under %q now (idle, or misspelt? see jobthrottle ls)\n", key)
	}
}

// resume ends a pause; an override stays.
func (t *tool) resume(ctx context.Context) error {
	key := t.o.args[0]
	left, err := t.pausedFor(ctx, key)
	if err != nil {
		return err
	}
	if err := t.control(key, func(lim *throttle.Limiter) error { return lim.Resume(ctx) }); err != nil {
		return err
	}
	if left == 0 {
		fmt.Fprintf(t.out, "%s was not paused\n", key)
	} else {
		fmt.Fprintf(t.out, "resumed %s (%v of its pause were left)\n", key, round(left))
	}
	return nil
}

// set overrides the key's rates for every process.
func (t *tool) set(ctx context.Context) error {
	key := t.o.args[0]
	var limits []throttle.Limit
	for _, a := range t.o.args[1:] {
		l, err := parseLimit(a)
		if err != nil {
			return usagef("set %s: %v", key, err)
		}
		limits = append(limits, l)
	}
	have, err := t.present(ctx, key)
	if err != nil {
		return err
	}
	// the key's record gives its algorithm and limits: the override is checked
	// against them (how many, which periods, a burst only for a token bucket), as
	// Override checks it in a process
	var rec throttle.Record
	checked := slices.Contains(have, "conf")
	if checked {
		if rec, err = throttle.ReadRecord(ctx, t.rdb, key, throttle.WithKeyPrefix(t.o.prefix)); err != nil {
			return err
		}
		for _, l := range limits {
			if rec.Algorithm != throttle.TokenBucket && l.Burst != 0 {
				return usagef("set %s: a burst is a TokenBucket's; the key is a %v limiter (%s)", key, rec.Algorithm, limitsText(rec.Limits))
			}
		}
	}
	code := limits
	opts := []throttle.Option{throttle.WithKeyPrefix(t.o.prefix)}
	if checked {
		code = rec.Limits
		opts = append(opts, throttle.WithAlgorithm(rec.Algorithm), throttle.WithBuckets(rec.Buckets))
	}
	lim, err := throttle.New(t.rdb, key, code[0], append(opts, throttle.WithLimits(code[1:]...))...)
	if err != nil {
		return err
	}
	if err := lim.Override(ctx, t.o.forD, limits...); err != nil {
		if checked {
			return fmt.Errorf("%w; the key's limits (its record) are %s", err, limitsText(code))
		}
		return err
	}
	until := "until unset"
	if t.o.forD > 0 {
		until = "for " + t.o.forD.String()
	}
	parts := make([]string, len(limits))
	for i, l := range limits {
		parts[i] = l.String()
	}
	fmt.Fprintf(t.out, "%s: every process now enforces %s, %s (rates only: the periods stay those the code passes)\n",
		key, strings.Join(parts, ", "), until)
	if !checked {
		fmt.Fprintf(t.out, "note: %s has no record of its limits: the number of limits and their periods were not checked\n", key)
	} else if len(limits) < len(code) {
		fmt.Fprintf(t.out, "(its other limits keep their rates: %s)\n", limitsText(code[len(limits):]))
	}
	t.noteIdle(key, have)
	return nil
}

// unset removes an override.
func (t *tool) unset(ctx context.Context) error {
	key := t.o.args[0]
	tag, err := t.tag(key)
	if err != nil {
		return err
	}
	// the control key holds "<pause end>" and, while an override is set, its parts
	// after it (lua/controlwrite.lua)
	text, err := t.rdb.Get(ctx, tag+":pause").Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	if err := t.control(key, func(lim *throttle.Limiter) error { return lim.ClearOverride(ctx) }); err != nil {
		return err
	}
	if len(strings.Fields(text)) <= 1 {
		fmt.Fprintf(t.out, "%s had no override; the rates the code passes apply\n", key)
		return nil
	}
	fmt.Fprintf(t.out, "%s: override removed; the rates the code passes apply\n", key)
	return nil
}

// reset deletes every key of the limiter or semaphore, after asking.
func (t *tool) reset(ctx context.Context) error {
	key := t.o.args[0]
	tag, err := t.tag(key)
	if err != nil {
		return err
	}
	have, err := t.present(ctx, key)
	if err != nil {
		return err
	}
	have = slices.DeleteFunc(have, func(s string) bool { return s == "conf" }) // the record stays: it is not state
	if len(have) == 0 {
		return fmt.Errorf("unknown key %q: no state under %s:* to reset", key, tag)
	}
	names := make([]string, len(have))
	for i, s := range have {
		names[i] = tag + ":" + s
	}
	if !t.o.yes {
		fmt.Fprintf(t.out, "delete %s? Its limits start afresh: up to a full window more can pass. [y/N] ", strings.Join(names, " "))
		line, _ := bufio.NewReader(t.in).ReadString('\n')
		if a := strings.TrimSpace(strings.ToLower(line)); a != "y" && a != "yes" {
			fmt.Fprintln(t.out, "not reset")
			return nil
		}
	}
	n, err := t.rdb.Del(ctx, names...).Result() // one hash slot: one command
	if err != nil {
		return err
	}
	fmt.Fprintf(t.out, "reset %s: deleted %d keys\n", key, n)
	return nil
}

func round(d time.Duration) time.Duration {
	if d > time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}
