package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// tool runs one command.
type tool struct {
	o   *options
	rdb redis.UniversalClient
	in  io.Reader
	out io.Writer
	now func() time.Time // watch's clock for grants/s; nil: time.Now
}

// kind names what a keyset holds: the algorithms whose state it has, Semaphore, or
// the record's algorithm and "(idle)"; "" for none of these.
func kind(k *keyset) string {
	var kinds []string
	for _, s := range k.states() {
		kinds = append(kinds, algorithm(s).String())
	}
	if k.semaphore() {
		kinds = append(kinds, "Semaphore")
	}
	if r, ok := k.record(); ok && len(kinds) == 0 {
		kinds = append(kinds, algorithm(r.State).String()+" (idle)")
	}
	return strings.Join(kinds, "+")
}

// ls lists the keys under the prefix (matching the optional glob), one a line, then
// the keys there that are not jobthrottle's.
func (t *tool) ls(ctx context.Context) error {
	pattern := "*"
	if len(t.o.args) == 1 {
		pattern = t.o.args[0]
	}
	match := "{" + escapeGlob(t.o.prefix) + pattern + "}:*"
	all, err := t.scan(ctx, match, "")
	if err != nil {
		return err
	}
	byTag := map[string]string{}
	var names, suffixes []string
	for _, n := range all {
		key, s, ok := keys.Split(t.o.prefix, n)
		if !ok {
			continue
		}
		tag, err := keys.Tag(t.o.prefix, key)
		if err != nil {
			continue
		}
		byTag[tag] = key
		names, suffixes = append(names, n), append(suffixes, s)
	}
	found, err := t.examine(ctx, names, suffixes)
	if err != nil {
		return err
	}
	sets := group(found, byTag)
	now, err := t.serverNow(ctx)
	if err != nil {
		return err
	}
	var list []string
	var foreign []*entry
	for key, k := range sets {
		if len(k.ours) > 0 {
			list = append(list, key)
		}
		foreign = append(foreign, k.foreign...)
	}
	if len(list) == 0 {
		fmt.Fprintf(t.out, "no jobthrottle keys match %s (keys under another prefix? give it with -prefix, as the code gives throttle.WithKeyPrefix)\n", match)
	} else {
		slices.Sort(list)
		w := tabwriter.NewWriter(t.out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "KEY\tKIND\tPAUSED\tOVERRIDE\tLIMITS (the key's record)")
		for _, key := range list {
			k := sets[key]
			kd := kind(k)
			switch {
			case kd == "":
				kd = "(control key only)"
				if len(k.bookings()) > 0 {
					kd = "(bookings only)"
				}
			case len(k.bookings()) > 0:
				kd += fmt.Sprintf(", %d booking%s", len(k.bookings()), plural(len(k.bookings())))
			}
			c := k.control()
			paused, over := "-", "-"
			if d := left(c.PauseEnd, now); d > 0 {
				paused = round(d).String()
			}
			rec, hasRec := k.record()
			if o := c.Override; o != nil && left(o.End, now) > 0 {
				over = overrideText(o, rec.Limits, false) + ", " + remaining(left(o.End, now))
			}
			limits := "-"
			if hasRec {
				limits = limitsText(limitsOf(rec))
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", keyText(key), kd, paused, over, limits)
		}
		w.Flush()
	}
	slices.SortFunc(foreign, func(a, b *entry) int { return strings.Compare(a.name, b.name) })
	for _, e := range foreign {
		fmt.Fprintln(t.out, e.leftAlone())
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

// overrideText is an override's rates: with the periods of the key's limits (as
// given, or as recorded) when they are known, RATE/PERIOD[:BURST] (long: "5 per 1s");
// else "rate 5".
func overrideText(o *keys.Override, code []keys.Limit, long bool) string {
	parts := make([]string, len(o.Rates))
	for i, r := range o.Rates {
		switch {
		case i < len(code) && long:
			parts[i] = throttle.Limit{Rate: r.Rate, Period: code[i].Period, Burst: r.Burst}.String()
		case i < len(code):
			parts[i] = limitsText([]throttle.Limit{{Rate: r.Rate, Period: code[i].Period, Burst: r.Burst}})
		case r.Burst != 0:
			parts[i] = fmt.Sprintf("rate %d (burst %d)", r.Rate, r.Burst)
		default:
			parts[i] = fmt.Sprintf("rate %d", r.Rate)
		}
	}
	return strings.Join(parts, ", ")
}

// remaining is how long something set on the key lasts: its time left, or "until
// unset" for an override set without -for (it lasts 2^45 µs, about 407 days).
func remaining(d time.Duration) string {
	if d > 400*24*time.Hour {
		return "until unset"
	}
	return round(d).String() + " more"
}

// target is a key resolved to what show and watch read.
type target struct {
	key   string
	ks    *keyset
	state string           // the algorithm's state suffix; "" for a semaphore or a key with a control key only
	code  []throttle.Limit // the limits the code passes: -limit, else the record's
	lim   *throttle.Limiter
	sem   *throttle.Semaphore
}

// resolve finds what key is: a limiter of the algorithm given with -alg, else of the
// one whose state the key holds, else of its record's; a semaphore; or, when the key
// holds only a control key, that alone. The limits are -limit's, else the record's.
// A key whose state is not jobthrottle's, or that holds nothing of jobthrottle's, is
// an error.
func (t *tool) resolve(ctx context.Context, key string) (*target, error) {
	ks, err := t.look(ctx, key, false)
	if err != nil {
		return nil, err
	}
	tg := &target{key: key, ks: ks}
	rec, hasRec := ks.record()
	s := t.o.alg
	if s == "" {
		states := ks.states()
		switch {
		case len(states) > 1:
			return nil, fmt.Errorf("key %q holds the state of several algorithms (%s): give -alg", key, strings.Join(states, ", "))
		case len(states) == 1:
			s = states[0]
		case ks.semaphore():
			tg.sem, err = t.semaphore(key)
			return tg, err
		case hasRec: // idle: no state, but its processes' record
			s = rec.State
		case len(ks.foreign) > 0:
			return nil, fmt.Errorf("key %q: nothing of jobthrottle's to show under %s: %s", key, ks.tag, notes(ks.foreign))
		case ks.has(keys.ControlKey):
			return tg, nil
		default:
			return nil, fmt.Errorf("unknown key %q: nothing under %s:* (prefix %q); the key is idle or misspelt: see jobthrottle ls",
				key, ks.tag, t.o.prefix)
		}
	}
	if e := ks.foreignOf(s); e != nil {
		return nil, fmt.Errorf("key %q: %s: jobthrottle's calls on the key fail until it is deleted", key, e.leftAlone())
	}
	limits, buckets := t.o.limits, t.o.buckets
	if len(limits) == 0 {
		switch {
		case !hasRec && ks.foreignOf(keys.RecordKey) != nil:
			return nil, fmt.Errorf("key %q: %s: give the limits with -limit RATE/PERIOD as the code does", key, ks.foreignOf(keys.RecordKey).leftAlone())
		case !hasRec:
			return nil, fmt.Errorf("key %q is a %v limiter with no record of its limits (none of its processes wrote one lately: idle, or an older jobthrottle?): give them with -limit RATE/PERIOD as the code does (e.g. -limit 20/1.1s)",
				key, algorithm(s))
		case rec.State != s:
			return nil, fmt.Errorf("key %q holds %v state, but its record says %v (written by the last process to use it): a rollout between algorithms? give -alg and -limit",
				key, algorithm(s), algorithm(rec.State))
		}
		limits = limitsOf(rec)
		if buckets == 0 {
			buckets = rec.Buckets
		}
	}
	tg.state, tg.code = s, limits
	tg.lim, err = t.limiter(key, s, limits, buckets)
	return tg, err
}

// notes joins the lines of foreign keys.
func notes(foreign []*entry) string {
	parts := make([]string, len(foreign))
	for i, e := range foreign {
		parts[i] = e.leftAlone()
	}
	return strings.Join(parts, "; ")
}

// show prints a key's state once.
func (t *tool) show(ctx context.Context) error {
	tg, err := t.resolve(ctx, t.o.args[0])
	if err != nil {
		return err
	}
	v, err := t.view(ctx, tg)
	if err != nil {
		for _, e := range tg.ks.foreign {
			fmt.Fprintln(t.out, e.leftAlone())
		}
		return err
	}
	v.render(t.out, nil, false)
	return nil
}

// watch shows the keys' state every interval until ctx ends (or -count screens).
// Each screen reads every key afresh, as show does.
func (t *tool) watch(ctx context.Context) error {
	for _, k := range t.o.args { // a misspelt key is said at once
		if _, err := t.resolve(ctx, k); err != nil {
			return err
		}
	}
	now := t.now
	if now == nil {
		now = time.Now
	}
	prev := make([]*view, len(t.o.args))
	tick := time.NewTicker(t.o.interval)
	defer tick.Stop()
	for screen := 1; ; screen++ {
		more := t.o.count == 0 || screen < t.o.count
		var b strings.Builder
		b.WriteString("\033[H\033[2J") // home, clear
		fmt.Fprintf(&b, "jobthrottle watch  %s  every %v  (Ctrl-C quits)\n\n", now().UTC().Format("15:04:05"), t.o.interval)
		for i, k := range t.o.args {
			tg, err := t.resolve(ctx, k)
			var v *view
			if err == nil {
				v, err = t.view(ctx, tg)
			}
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				fmt.Fprintf(&b, "%s: %s\n", keyText(k), describe(err, t.o.prefix))
				if tg != nil {
					for _, e := range tg.ks.foreign {
						fmt.Fprintf(&b, "  %s\n", e.leftAlone())
					}
				}
				b.WriteString("\n")
				prev[i] = nil
				continue
			}
			v.at = now()
			v.render(&b, prev[i], more)
			b.WriteString("\n")
			prev[i] = v
		}
		io.WriteString(t.out, b.String())
		if !more {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// control looks at key's tags for the control key's commands (pause, resume, set,
// unset): it refuses a control key that is not jobthrottle's, which they would
// overwrite, and returns the keyset and the server's clock.
func (t *tool) control(ctx context.Context, key, verb string) (*keyset, int64, error) {
	ks, err := t.look(ctx, key, false)
	if err != nil {
		return nil, 0, err
	}
	if e := ks.foreignOf(keys.ControlKey); e != nil {
		return nil, 0, fmt.Errorf("%s nothing: %s; jobthrottle would overwrite it (delete it if nothing else uses it: redis-cli DEL '%s')", verb, e.leftAlone(), e.name)
	}
	now, err := t.serverNow(ctx)
	return ks, now, err
}

// after prints what else is set on the key that the command kept, what the command
// found foreign, and a note when the key is idle.
func (t *tool) after(ks *keyset, c keys.Control, now int64, pause, override bool) {
	if d := left(c.PauseEnd, now); pause && d > 0 {
		fmt.Fprintf(t.out, "the pause set on it stays: %v more ('jobthrottle resume %s' ends it)\n", round(d), keyText(ks.key))
	}
	if o := c.Override; override && o != nil && left(o.End, now) > 0 {
		rec, _ := ks.record()
		fmt.Fprintf(t.out, "the override set on it stays: %s, %s ('jobthrottle unset %s' ends it)\n",
			overrideText(o, rec.Limits, true), remaining(left(o.End, now)), keyText(ks.key))
	}
	for _, e := range ks.foreign {
		fmt.Fprintln(t.out, e.leftAlone())
	}
	switch {
	case kind(ks) != "" && !strings.HasSuffix(kind(ks), "(idle)"):
	case ks.has(keys.RecordKey):
		fmt.Fprintf(t.out, "note: %q is idle now (no state, but its processes' record): they apply it from their next call\n", ks.key)
	default:
		fmt.Fprintf(t.out, "note: no state under %q now (idle, or misspelt? see jobthrottle ls)\n", ks.key)
	}
}

// pause pauses the key for the duration given.
func (t *tool) pause(ctx context.Context) error {
	key := t.o.args[0]
	d := t.o.pauseFor
	ks, _, err := t.control(ctx, key, "paused")
	if err != nil {
		return err
	}
	lim, err := t.controller(key)
	if err != nil {
		return err
	}
	if err := lim.Pause(ctx, d); err != nil {
		return err
	}
	if ks, err = t.look(ctx, key, false); err != nil { // read back what is set now
		return err
	}
	now, err := t.serverNow(ctx)
	if err != nil {
		return err
	}
	c := ks.control()
	l := left(c.PauseEnd, now)
	fmt.Fprintf(t.out, "paused %s for %v: no new grants on it anywhere until then, permits booked before it keep their slots ('jobthrottle resume %s' ends it sooner)\n", keyText(key), round(l), keyText(key))
	if l > d+time.Second {
		fmt.Fprintf(t.out, "(a longer pause was already set: it is kept)\n")
	}
	t.after(ks, c, now, false, true)
	return nil
}

// parsePause reads pause's DURATION, which must be positive.
func parsePause(o *options) error {
	key, arg := o.args[0], o.args[1]
	d, err := time.ParseDuration(arg)
	switch {
	case err != nil:
		return usagef("pause", "pause %s: %q is not a duration (e.g. 30s, 5m)", keyText(key), arg)
	case d <= 0:
		return usagef("pause", "pause %s: %s is not a positive duration: a pause lasts that long from now (e.g. 30s, 5m); 'jobthrottle resume %s' ends one",
			keyText(key), arg, keyText(key))
	}
	o.pauseFor = d
	return nil
}

// resume ends a pause; an override stays.
func (t *tool) resume(ctx context.Context) error {
	key := t.o.args[0]
	ks, now, err := t.control(ctx, key, "resumed")
	if err != nil {
		return err
	}
	c := ks.control()
	l := left(c.PauseEnd, now)
	if l == 0 {
		fmt.Fprintf(t.out, "%s was not paused: nothing to resume\n", keyText(key))
		t.after(ks, c, now, false, true)
		return nil
	}
	lim, err := t.controller(key)
	if err != nil {
		return err
	}
	if err := lim.Resume(ctx); err != nil {
		return err
	}
	fmt.Fprintf(t.out, "resumed %s: ended its pause, which had %v left\n", keyText(key), round(l))
	t.after(ks, c, now, false, true)
	return nil
}

// set overrides the key's rates for every process.
func (t *tool) set(ctx context.Context) error {
	key := t.o.args[0]
	var limits []throttle.Limit
	for _, a := range t.o.args[1:] {
		l, err := parseLimit(a)
		if err != nil {
			return usagef("set", "set %s: %v", keyText(key), err)
		}
		limits = append(limits, l)
	}
	ks, now, err := t.control(ctx, key, "set")
	if err != nil {
		return err
	}
	// the key's record gives its algorithm and limits: the override is checked
	// against them (how many, which periods, a burst only for a token bucket), as
	// Override checks it in a process
	rec, checked := ks.record()
	code, state, buckets := limits, keys.SlidingWindow, 0
	if checked {
		code, state, buckets = limitsOf(rec), rec.State, rec.Buckets
		for _, l := range limits {
			if state != keys.TokenBucket && l.Burst != 0 {
				return fmt.Errorf("set %s: a burst is a TokenBucket's; the key is a %v limiter (%s)", keyText(key), algorithm(state), limitsText(code))
			}
		}
	}
	lim, err := t.limiter(key, state, code, buckets)
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
		if l.Period == 0 && i < len(code) {
			l.Period = code[i].Period
		}
		parts[i] = l.String()
		if checked && (l.Rate != code[i].Rate || l.Burst != code[i].Burst) {
			parts[i] += " in place of " + code[i].String()
		}
	}
	fmt.Fprintf(t.out, "%s: every process now enforces %s, %s (rates only: the periods stay those the code passes)\n",
		keyText(key), strings.Join(parts, ", "), until)
	switch {
	case !checked && ks.foreignOf(keys.RecordKey) != nil:
		fmt.Fprintf(t.out, "note: its record is not jobthrottle's: the number of limits and their periods were not checked\n")
	case !checked:
		fmt.Fprintf(t.out, "note: %s has no record of its limits: the number of limits and their periods were not checked\n", keyText(key))
	case len(limits) < len(code):
		fmt.Fprintf(t.out, "(its other limits keep their rates: %s)\n", limitsText(code[len(limits):]))
	}
	t.after(ks, ks.control(), now, true, false)
	return nil
}

// unset removes an override.
func (t *tool) unset(ctx context.Context) error {
	key := t.o.args[0]
	ks, now, err := t.control(ctx, key, "unset")
	if err != nil {
		return err
	}
	c := ks.control()
	if c.Override == nil || left(c.Override.End, now) == 0 {
		fmt.Fprintf(t.out, "%s had no override; the rates the code passes apply\n", keyText(key))
		t.after(ks, c, now, true, false)
		return nil
	}
	// the clear runs the key's own script when its record names it, as a process's
	// ClearOverride does: a token bucket settles its tokens at the new rates then (else
	// at its next call)
	rec, checked := ks.record()
	lim, err := t.controller(key)
	if checked {
		lim, err = t.limiter(key, rec.State, limitsOf(rec), rec.Buckets)
	}
	if err != nil {
		return err
	}
	if err := lim.ClearOverride(ctx); err != nil {
		return err
	}
	fmt.Fprintf(t.out, "%s: removed the override (%s, %s); the rates the code passes apply again\n",
		keyText(key), overrideText(c.Override, rec.Limits, true), strings.TrimSuffix(remaining(left(c.Override.End, now)), " more")+" left")
	t.after(ks, c, now, true, false)
	return nil
}

// reset deletes the key's state (its algorithm's, a semaphore's, its bookings),
// after asking; the control key and the record stay, and so does any key under the
// tag that is not jobthrottle's.
func (t *tool) reset(ctx context.Context) error {
	key := t.o.args[0]
	ks, err := t.look(ctx, key, true)
	if err != nil {
		return err
	}
	var del, kept []string
	for _, s := range append(keys.States(), keys.Leases, keys.Queue, keys.QueueExpiry) {
		if ks.has(s) {
			del = append(del, ks.ours[s].name)
		}
	}
	var said []string // what the command says it deletes: bookings counted
	for _, n := range del {
		said = append(said, keyText(n))
	}
	if b := ks.bookings(); len(b) > 0 {
		del = append(del, b...)
		said = append(said, fmt.Sprintf("%d booking%s (%s*)", len(b), plural(len(b)), keyText(keys.Name(ks.tag, keys.Booking))))
	}
	if e := ks.ours[keys.ControlKey]; e != nil {
		kept = append(kept, keyText(e.name)+" (the pause and override: resume and unset end them)")
	}
	if e := ks.ours[keys.RecordKey]; e != nil {
		kept = append(kept, keyText(e.name)+" (the record of its limits)")
	}
	if len(del) == 0 {
		for _, e := range ks.foreign {
			fmt.Fprintln(t.out, e.leftAlone())
		}
		if len(kept) > 0 {
			fmt.Fprintf(t.out, "%s has no state to reset (idle); kept %s\n", keyText(key), strings.Join(kept, ", "))
			return nil
		}
		if len(ks.foreign) > 0 {
			return fmt.Errorf("reset nothing: no key of jobthrottle's under %s", ks.tag)
		}
		return fmt.Errorf("unknown key %q: no state under %s:* to reset", key, ks.tag)
	}
	if !t.o.yes {
		for _, e := range ks.foreign {
			fmt.Fprintln(t.out, e.leftAlone())
		}
		fmt.Fprintf(t.out, "delete %s? Its limits start afresh: up to a full window more can pass. [y/N] ", strings.Join(said, ", "))
		line, _ := bufio.NewReader(t.in).ReadString('\n')
		if a := strings.TrimSpace(strings.ToLower(line)); a != "y" && a != "yes" {
			fmt.Fprintln(t.out, "not reset")
			return nil
		}
	}
	if err := t.rdb.Del(ctx, del...).Err(); err != nil { // one hash slot: one command
		return err
	}
	fmt.Fprintf(t.out, "reset %s: deleted %s\n", keyText(key), strings.Join(said, ", "))
	for _, k := range kept {
		fmt.Fprintln(t.out, "kept", k)
	}
	if t.o.yes {
		for _, e := range ks.foreign {
			fmt.Fprintln(t.out, e.leftAlone())
		}
	}
	return nil
}

// keyText is a key (or a Redis key's name) as the command prints it: as it is, or,
// when it has a space or a character that is not printable (a tab or a newline,
// which the library accepts, would break a line or a table) or begins with a
// quotation mark, quoted and escaped as a Go string ("a\tb").
func keyText(key string) string {
	plain := key != "" && !strings.HasPrefix(key, `"`) && !strings.ContainsFunc(key, func(r rune) bool {
		return !unicode.IsGraphic(r) || unicode.IsSpace(r)
	})
	if plain {
		return key
	}
	return strconv.Quote(key)
}

func round(d time.Duration) time.Duration {
	if d > time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}
