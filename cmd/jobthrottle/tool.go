package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
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

// kind names what a keyset holds: the algorithm whose state it has, Semaphore, or
// both; the record's algorithm and "(idle)" when its state counts nothing; "" for
// none of these.
func kind(k *keyset) string {
	var kinds []string
	h, ok := k.record()
	if ok && !k.idle() {
		kinds = append(kinds, algorithm(h.Alg).String())
	}
	if k.semaphore() {
		kinds = append(kinds, "Semaphore")
	}
	if ok && len(kinds) == 0 {
		kinds = append(kinds, algorithm(h.Alg).String()+" (idle)")
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
			case kd != "":
			case k.has(keys.State):
				kd = "(idle, no record)" // a meta alone this command wrote: what is set on the key
			default:
				kd = "(no state)"
			}
			kd += count(len(k.named(keys.Tenant)), "tenant's caps", "tenants' caps")
			kd += count(len(k.named(keys.Booking)), "booking", "bookings")
			m := k.meta()
			paused, over := "-", "-"
			if d := left(m.PauseEnd, now); d > 0 {
				paused = round(d).String()
			}
			rec, hasRec := k.record()
			if o := m.Override; o != nil && left(o.End, now) > 0 {
				over = overrideText(o, rec.Limits, false) + ", " + remaining(left(o.End, now))
			}
			limits := "-"
			if hasRec {
				limits = limitsText(limitsOf(rec))
				if m.Drift != "" {
					limits += " (drift: " + headText(m.Drift, false) + ")"
				}
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

// count is ", <n> <what>" (one: what for 1, many: for more), or "" for none.
func count(n int, one, many string) string {
	switch {
	case n == 1:
		return ", 1 " + one
	case n > 1:
		return fmt.Sprintf(", %d %s", n, many)
	}
	return ""
}

// limitsText is limits as the command line takes them: RATE/PERIOD[:BURST], comma-separated.
func limitsText(limits []throttle.Limit) string {
	parts := make([]string, len(limits))
	for i, l := range limits {
		parts[i] = fmt.Sprintf("%d/%v", l.Rate, l.Period)
		if l.Unit != "" {
			parts[i] = fmt.Sprintf("%d %s/%v", l.Rate, l.Unit, l.Period)
		}
		if l.Burst != 0 {
			parts[i] += fmt.Sprintf(":%d", l.Burst)
		}
	}
	return strings.Join(parts, ",")
}

// headText is a head's limits: as the command line takes them (limitsText), or long
// ("10 per 1s, 100 per 1h0m0s"); a text that is no head is quoted.
func headText(text string, long bool) string {
	h, err := keys.ParseHead(text)
	if err != nil {
		return strconv.Quote(text)
	}
	if !long {
		return limitsText(limitsOf(h))
	}
	parts := make([]string, len(h.Limits))
	for i, l := range limitsOf(h) {
		parts[i] = l.String()
	}
	return strings.Join(parts, ", ")
}

// overrideText is an override's rates: with the periods and units of the key's limits
// (as given, or as recorded) when they are known, RATE/PERIOD[:BURST] (long: "5 per 1s");
// else "rate 5".
func overrideText(o *keys.Override, code []keys.Limit, long bool) string {
	parts := make([]string, len(o.Rates))
	for i, r := range o.Rates {
		switch {
		case i < len(code) && long:
			parts[i] = throttle.Limit{Rate: r.Rate, Period: code[i].Period, Burst: r.Burst, Unit: code[i].Unit}.String()
		case i < len(code):
			parts[i] = limitsText([]throttle.Limit{{Rate: r.Rate, Period: code[i].Period, Burst: r.Burst, Unit: code[i].Unit}})
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
	key  string
	ks   *keyset
	code []throttle.Limit // the limits the code passes: -limit, else the record's
	lim  *throttle.Limiter
	sem  *throttle.Semaphore
}

// resolve finds what key is: a limiter of the algorithm given with -alg, else of its
// state's; a semaphore; or, when the key holds no state (a meta alone: a pause set on
// a key nobody uses), what is set on it alone. The limits are -limit's, else those of
// the key's record (its state's head). A key whose state is not jobthrottle's, or that
// holds nothing of jobthrottle's, is an error.
func (t *tool) resolve(ctx context.Context, key string) (*target, error) {
	ks, err := t.look(ctx, key, false)
	if err != nil {
		return nil, err
	}
	tg := &target{key: key, ks: ks}
	if e := ks.foreignOf(keys.State); e != nil {
		return nil, fmt.Errorf("key %q: %s: jobthrottle's calls on the key fail until it is deleted", key, e.leftAlone())
	}
	rec, hasRec := ks.record()
	alg := t.o.alg
	if alg == "" {
		switch {
		case hasRec && !ks.idle():
			alg = rec.Alg
		case ks.semaphore():
			tg.sem, err = t.semaphore(key)
			return tg, err
		case hasRec: // idle: its state's meta alone
			alg = rec.Alg
		case len(ks.ours) > 0:
			return tg, nil
		case len(ks.foreign) > 0:
			return nil, fmt.Errorf("key %q: nothing of jobthrottle's to show under %s: %s", key, ks.tag, notes(ks.foreign))
		default:
			return nil, fmt.Errorf("unknown key %q: nothing under %s:* (prefix %q); the key is idle or misspelt: see jobthrottle ls",
				key, ks.tag, t.o.prefix)
		}
	}
	limits, buckets := t.o.limits, t.o.buckets
	if len(limits) == 0 {
		switch {
		case !hasRec:
			return nil, fmt.Errorf("key %q has no record of its limits (no process used it lately): give them with -limit RATE/PERIOD as the code does (e.g. -limit 20/1.1s)", key)
		case rec.Alg != alg:
			return nil, fmt.Errorf("key %q holds %v state: give -limit with -alg %s, the limits as that algorithm takes them",
				key, algorithm(rec.Alg), alg)
		}
		limits = limitsOf(rec)
	}
	if buckets == 0 && hasRec && rec.Alg == alg {
		buckets = rec.Buckets
	}
	tg.code = limits
	tg.lim, err = t.limiter(key, alg, limits, buckets)
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

// control looks at key's tag for the commands that set something on the key (pause,
// resume, set, unset, weight), which the key's state keeps in its meta: it refuses a
// state that is not jobthrottle's, which they would overwrite, and returns the keyset
// and the server's clock.
func (t *tool) control(ctx context.Context, key, verb string) (*keyset, int64, error) {
	ks, err := t.look(ctx, key, false)
	if err != nil {
		return nil, 0, err
	}
	if e := ks.foreignOf(keys.State); e != nil {
		return nil, 0, fmt.Errorf("%s nothing: %s; jobthrottle would overwrite it (delete it if nothing else uses it: redis-cli DEL '%s')", verb, e.leftAlone(), e.name)
	}
	now, err := t.serverNow(ctx)
	return ks, now, err
}

// after prints what else is set on the key that the command kept, what the command
// found foreign, and a note when the key has no state.
func (t *tool) after(ks *keyset, now int64, pause, override bool) {
	m := ks.meta()
	if d := left(m.PauseEnd, now); pause && d > 0 {
		fmt.Fprintf(t.out, "the pause set on it stays: %v more ('jobthrottle resume %s' ends it)\n", round(d), keyText(ks.key))
	}
	if o := m.Override; override && o != nil && left(o.End, now) > 0 {
		rec, _ := ks.record()
		fmt.Fprintf(t.out, "the override set on it stays: %s, %s ('jobthrottle unset %s' ends it)\n",
			overrideText(o, rec.Limits, true), remaining(left(o.End, now)), keyText(ks.key))
	}
	for _, e := range ks.foreign {
		fmt.Fprintln(t.out, e.leftAlone())
	}
	switch kd := kind(ks); {
	case strings.HasSuffix(kd, "(idle)"):
		fmt.Fprintf(t.out, "note: %s is idle now (its state counts nothing): its processes apply what is set from their next call\n", keyText(ks.key))
	case kd == "":
		fmt.Fprintf(t.out, "note: no state under %s now (idle, or misspelt? see jobthrottle ls): its processes apply what is set from their next call\n", keyText(ks.key))
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
	lim, err := t.controller(ks)
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
	l := left(ks.meta().PauseEnd, now)
	fmt.Fprintf(t.out, "paused %s for %v: the whole fleet stops until then; a waiter already asleep gives its booking back and books after the pause ('jobthrottle resume %s' ends it sooner)\n",
		keyText(key), round(l), keyText(key))
	if l > d+time.Second {
		fmt.Fprintf(t.out, "(a longer pause was already set: it is kept)\n")
	}
	t.after(ks, now, false, true)
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
	l := left(ks.meta().PauseEnd, now)
	if l == 0 {
		fmt.Fprintf(t.out, "%s was not paused: nothing to resume\n", keyText(key))
		t.after(ks, now, false, true)
		return nil
	}
	lim, err := t.controller(ks)
	if err != nil {
		return err
	}
	if err := lim.Resume(ctx); err != nil {
		return err
	}
	fmt.Fprintf(t.out, "resumed %s: ended its pause, which had %v left\n", keyText(key), round(l))
	t.after(ks, now, false, true)
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
	rec, checked := ks.record()
	if !checked && ks.semaphore() { // an override would invent a limiter's record on it
		return fmt.Errorf("set %s: nothing set: the key is a Semaphore's, which has no rates (its Max is the code's); 'jobthrottle pause %s' stops its grants",
			keyText(key), keyText(key))
	}
	// the key's record gives its algorithm and limits: the override is checked
	// against them (how many, which periods, a burst only for a token bucket), as
	// Override checks it in a process. A key with no record takes the override's
	// own limits for its meta's head, which its processes' first call replaces.
	code := limits
	var lim *throttle.Limiter
	if checked {
		code = limitsOf(rec)
		for _, l := range limits {
			if rec.Alg != keys.TokenBucket && l.Burst != 0 {
				return fmt.Errorf("set %s: a burst is a TokenBucket's; the key is a %v limiter (%s)", keyText(key), algorithm(rec.Alg), limitsText(code))
			}
		}
		lim, err = t.limiter(key, rec.Alg, code, rec.Buckets)
	} else {
		alg := keys.SlidingWindow
		if slices.ContainsFunc(limits, func(l throttle.Limit) bool { return l.Burst != 0 }) {
			alg = keys.TokenBucket
		}
		lim, err = t.limiter(key, alg, limits, 0)
	}
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
		if checked { // the rate is of the key's limit: of its unit
			l.Unit = code[i].Unit
		}
		parts[i] = l.String()
		if checked && (l.Rate != code[i].Rate || l.Burst != code[i].Burst) {
			parts[i] += " in place of " + code[i].String()
		}
	}
	fmt.Fprintf(t.out, "%s: every process now enforces %s, %s (rates only: the periods stay those the code passes)\n",
		keyText(key), strings.Join(parts, ", "), until)
	switch {
	case !checked:
		fmt.Fprintf(t.out, "note: %s has no record of its limits: the number of limits and their periods were not checked\n", keyText(key))
	case len(limits) < len(code):
		fmt.Fprintf(t.out, "(its other limits keep their rates: %s)\n", limitsText(code[len(limits):]))
	}
	t.after(ks, now, true, false)
	return nil
}

// unset removes an override.
func (t *tool) unset(ctx context.Context) error {
	key := t.o.args[0]
	ks, now, err := t.control(ctx, key, "unset")
	if err != nil {
		return err
	}
	o := ks.meta().Override
	if o == nil || left(o.End, now) == 0 {
		fmt.Fprintf(t.out, "%s had no override; the rates the code passes apply\n", keyText(key))
		t.after(ks, now, true, false)
		return nil
	}
	// the clear runs the key's own script with its own head, as a process's
	// ClearOverride does: a token bucket settles its tokens at the new rates then
	lim, err := t.controller(ks)
	if err != nil {
		return err
	}
	if err := lim.ClearOverride(ctx); err != nil {
		return err
	}
	rec, _ := ks.record()
	lasted := remaining(left(o.End, now))
	if l, ok := strings.CutSuffix(lasted, " more"); ok {
		lasted = l + " left"
	}
	fmt.Fprintf(t.out, "%s: removed the override (%s, %s); the rates the code passes apply again\n",
		keyText(key), overrideText(o, rec.Limits, true), lasted)
	t.after(ks, now, true, false)
	return nil
}

// weightOf returns the operator's weight of tenant in m that lasts after now, or nil.
func weightOf(m keys.Meta, tenant string, now int64) *keys.Weight {
	for i, w := range m.Weights {
		if w.Tenant == tenant && left(w.End, now) > 0 {
			return &m.Weights[i]
		}
	}
	return nil
}

// units is a weight in the meta's millionths, as a number.
func units(u int64) string { return strconv.FormatFloat(float64(u)/1e6, 'g', -1, 64) }

// weight sets a tenant's weight in the key's fair share for every process, or clears
// the weight an operator set.
func (t *tool) weight(ctx context.Context) error {
	key, tenant := t.o.args[0], t.o.args[1]
	verb := "set no weight"
	if t.o.clear {
		verb = "cleared no weight"
	}
	ks, now, err := t.control(ctx, key, verb)
	if err != nil {
		return err
	}
	old := weightOf(ks.meta(), tenant, now)
	if t.o.clear && old == nil {
		fmt.Fprintf(t.out, "%s: tenant %s had no operator's weight; the weight its callers pass counts\n", keyText(key), keyText(tenant))
		t.after(ks, now, false, false)
		return nil
	}
	lim, err := t.controller(ks)
	if err != nil {
		return err
	}
	h := lim.Tenant(tenant)
	if t.o.clear {
		if err := h.ClearWeight(ctx); err != nil {
			return err
		}
		fmt.Fprintf(t.out, "%s: cleared tenant %s's weight (%s, %v left); the weight its callers pass counts again\n",
			keyText(key), keyText(tenant), units(old.Units), round(left(old.End, now)))
		t.after(ks, now, false, false)
		return nil
	}
	if err := h.OverrideWeight(ctx, t.o.weightFor, t.o.weight); err != nil {
		return err
	}
	was := ""
	if old != nil {
		was = fmt.Sprintf(" (it was %s, %v more)", units(old.Units), round(left(old.End, now)))
	}
	// read back what is set now: the weight in millionths, for 2^45µs at most
	if ks, err = t.look(ctx, key, false); err != nil {
		return err
	}
	if now, err = t.serverNow(ctx); err != nil {
		return err
	}
	set := weightOf(ks.meta(), tenant, now)
	if set == nil {
		return fmt.Errorf("%s: the weight of tenant %s was set and has ended already", keyText(key), keyText(tenant))
	}
	fmt.Fprintf(t.out, "%s: tenant %s now has weight %s%s in every process's fair share, for %v, in place of the weight its callers pass ('jobthrottle weight %s %s clear' ends it sooner)\n",
		keyText(key), keyText(tenant), units(set.Units), was, round(left(set.End, now)), keyText(key), keyText(tenant))
	t.after(ks, now, false, false)
	return nil
}

// parseWeight reads weight's arguments: TENANT, then WEIGHT and DURATION, or clear.
func parseWeight(o *options) error {
	key, tenant := o.args[0], o.args[1]
	if err := keys.CheckTenant(tenant); err != nil {
		return usagef("weight", "weight %s: %v", keyText(key), err)
	}
	if len(o.args) == 3 {
		if o.args[2] != "clear" {
			return usagef("weight", "weight %s %s: give WEIGHT and DURATION (e.g. 3 10m), or clear", keyText(key), keyText(tenant))
		}
		o.clear = true
		return nil
	}
	w, err := strconv.ParseFloat(o.args[2], 64)
	if err != nil || !(w > 0) || math.IsInf(w, 0) {
		return usagef("weight", "weight %s %s: %q is not a positive number (e.g. 3, 0.5)", keyText(key), keyText(tenant), o.args[2])
	}
	if w < protocol.MinWeight || w > protocol.MaxWeight {
		return usagef("weight", "weight %s %s: %s is not a weight from %s to %s", keyText(key), keyText(tenant), o.args[2],
			strconv.FormatFloat(protocol.MinWeight, 'f', -1, 64), strconv.FormatFloat(protocol.MaxWeight, 'f', -1, 64))
	}
	d, err := time.ParseDuration(o.args[3])
	if err != nil || d <= 0 {
		return usagef("weight", "weight %s %s: %q is not a positive duration: the weight lasts that long from now (e.g. 10m, 24h); 'jobthrottle weight %s %s clear' ends it",
			keyText(key), keyText(tenant), o.args[3], keyText(key), keyText(tenant))
	}
	o.weight, o.weightFor = w, d
	return nil
}

// setOn names what is set on the key in meta m and lasts after now: a pause, an
// override, operators' weights.
func setOn(m keys.Meta, now int64) []string {
	var set []string
	if d := left(m.PauseEnd, now); d > 0 {
		set = append(set, fmt.Sprintf("the pause (%v more)", round(d)))
	}
	if o := m.Override; o != nil && left(o.End, now) > 0 {
		set = append(set, fmt.Sprintf("the override (%s)", remaining(left(o.End, now))))
	}
	n := 0
	for _, w := range m.Weights {
		if left(w.End, now) > 0 {
			n++
		}
	}
	if n > 0 {
		set = append(set, strings.TrimPrefix(count(n, "tenant's weight", "tenants' weights"), ", "))
	}
	return set
}

// reset deletes the key's state (what it counts, the fair share's queue, its tenants'
// states, its tasks' bookings, a semaphore's leases and queue), after asking. What is
// set on the key stays (a pause, an override, operators' weights: its state keeps its
// meta alone), and so does any key under the tag that is not jobthrottle's.
func (t *tool) reset(ctx context.Context) error {
	key := t.o.args[0]
	ks, err := t.look(ctx, key, true)
	if err != nil {
		return err
	}
	now, err := t.serverNow(ctx)
	if err != nil {
		return err
	}
	var del, said []string // what the command deletes, and says it deletes
	st := ks.ours[keys.State]
	kept := setOn(ks.meta(), now)
	if st != nil && !st.bare {
		said = append(said, keyText(st.name))
		if len(kept) > 0 {
			said[0] = "the counts of " + said[0]
		}
	}
	for _, s := range []string{keys.FairQueue, keys.Leases, keys.Queue, keys.QueueExpiry} {
		if e := ks.ours[s]; e != nil {
			del, said = append(del, e.name), append(said, keyText(e.name))
		}
	}
	for _, c := range []struct{ suffix, one, many string }{
		{keys.Tenant, "tenant's caps", "tenants' caps"}, {keys.Part, "unit's state", "units' states"},
		{keys.Booking, "booking", "bookings"}, {keys.Settled, "settle record", "settle records"},
	} {
		if names := ks.named(c.suffix); len(names) > 0 {
			del = append(del, names...)
			said = append(said, fmt.Sprintf("%s (%s*)", strings.TrimPrefix(count(len(names), c.one, c.many), ", "), keyText(keys.Name(ks.tag, c.suffix))))
		}
	}
	leftAlone := func() {
		for _, e := range ks.foreign {
			fmt.Fprintln(t.out, e.leftAlone())
		}
	}
	stays := ""
	if len(kept) > 0 {
		stays = "; what is set on it stays: " + strings.Join(kept, ", ")
	}
	if len(said) == 0 {
		leftAlone()
		switch {
		case st != nil:
			fmt.Fprintf(t.out, "%s has no state to reset (idle)%s\n", keyText(key), stays)
			return nil
		case len(ks.foreign) > 0:
			return fmt.Errorf("reset nothing: no key of jobthrottle's under %s", ks.tag)
		}
		return fmt.Errorf("unknown key %q: no state under %s:* to reset", key, ks.tag)
	}
	if !t.o.yes {
		leftAlone()
		fmt.Fprintf(t.out, "delete %s? Its limits start afresh: up to a full window more can pass%s. [y/N] ", strings.Join(said, ", "), stays)
		line, _ := bufio.NewReader(t.in).ReadString('\n')
		if a := strings.TrimSpace(strings.ToLower(line)); a != "y" && a != "yes" {
			fmt.Fprintln(t.out, "not reset")
			return nil
		}
	}
	if kept, err = t.wipe(ctx, ks.tag, del); err != nil {
		return err
	}
	fmt.Fprintf(t.out, "reset %s: deleted %s\n", keyText(key), strings.Join(said, ", "))
	if len(kept) > 0 {
		fmt.Fprintf(t.out, "kept what is set on it: %s\n", strings.Join(kept, ", "))
	}
	if t.o.yes {
		leftAlone()
	}
	return nil
}

// wipe deletes del and what the state under tag counts, in one transaction (the keys
// of a tag lie in one hash slot). A state that holds something set on the key (setOn)
// is cut to its meta alone, the form the scripts give a state with nothing counted (a
// list's first element; a string's text after its numbers, behind a newline), with its
// TTL; else it is deleted. A state not jobthrottle's, or a meta alone, stays as it is.
// The state is read again under WATCH: a process that writes it meanwhile makes wipe
// read it once more. It returns what stays set on the key.
func (t *tool) wipe(ctx context.Context, tag string, del []string) ([]string, error) {
	name := keys.Name(tag, keys.State)
	var kept []string
	wipe := func(tx *redis.Tx) error {
		now, err := t.serverNow(ctx)
		if err != nil {
			return err
		}
		e := &entry{name: name, suffix: keys.State, typ: tx.Type(ctx, name).Val()}
		var values []string
		switch e.typ {
		case "list":
			values, err = tx.LRange(ctx, name, 0, sample-1).Result()
		case "string":
			var text string
			text, err = tx.Get(ctx, name).Result()
			values = []string{text}
		}
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		if e.typ != "none" && len(values) > 0 {
			if e.foreign = keys.Check(keys.State, e.typ, values); e.foreign == nil {
				e.readMeta(values)
			}
		}
		kept = nil
		if e.meta != nil {
			kept = setOn(*e.meta, now)
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			if len(del) > 0 {
				p.Del(ctx, del...)
			}
			switch {
			case e.meta == nil || e.bare:
			case len(kept) == 0:
				p.Del(ctx, name)
			case e.typ == "list":
				p.LTrim(ctx, name, 0, 0)
			default:
				p.SetArgs(ctx, name, "\n"+e.rawMeta, redis.SetArgs{KeepTTL: true})
			}
			return nil
		})
		return err
	}
	for range 100 {
		if err := t.rdb.Watch(ctx, wipe, name); !errors.Is(err, redis.TxFailedErr) {
			return kept, err
		}
	}
	return nil, fmt.Errorf("reset nothing: %s changed under each of 100 tries (its processes write it all the time); try again", keyText(name))
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
