package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// view is one reading of a key, what show and watch print.
type view struct {
	tg    *target
	lim   *throttle.LimiterState
	sem   *throttle.SemaphoreState
	meta  keys.Meta // the key's meta, as look read it
	now   int64     // the server's clock when the meta was read, µs
	total int64     // the permit log's running count (SlidingWindow, SlidingCounter); -1 unknown
	at    time.Time
}

func (t *tool) view(ctx context.Context, tg *target) (*view, error) {
	v := &view{tg: tg, meta: tg.ks.meta(), total: -1}
	var err error
	if v.now, err = t.serverNow(ctx); err != nil {
		return nil, err
	}
	switch {
	case tg.sem != nil:
		st, err := tg.sem.Inspect(ctx)
		if err != nil {
			return nil, err
		}
		if t.o.max == 0 {
			st.Max = 0
		}
		v.sem = &st
	case tg.lim != nil:
		st, err := tg.lim.Inspect(ctx)
		if err != nil {
			return nil, err
		}
		v.lim = &st
		if a := st.Algorithm; a == throttle.SlidingWindow || a == throttle.SlidingCounter {
			// the log's last entry holds the count of every permit granted since the key
			// was made: its growth is the grant rate (a meta alone: none yet)
			name := keys.Name(tg.ks.tag, keys.State)
			pipe := t.rdb.Pipeline()
			n, last := pipe.LLen(ctx, name), pipe.LIndex(ctx, name, -1)
			_, _ = pipe.Exec(ctx)
			if n.Err() == nil && n.Val() <= 1 {
				v.total = 0
			} else if c, err := last.Int64(); err == nil {
				v.total = c
			}
		}
	}
	return v, nil
}

const barWidth = 30

// bar draws used of capacity as [#####.....], full when used reaches it.
func bar(used, capacity int) string {
	if capacity <= 0 {
		return "[" + strings.Repeat("?", barWidth) + "]"
	}
	k := min(barWidth, max(0, used*barWidth/capacity))
	if used > 0 && k == 0 {
		k = 1
	}
	return "[" + strings.Repeat("#", k) + strings.Repeat(".", barWidth-k) + "]"
}

// render prints the view. prev, the previous reading of the same key, gives watch's
// rate; more says another screen follows (watch), else no rate line is printed.
func (v *view) render(w io.Writer, prev *view, more bool) {
	switch {
	case v.sem != nil:
		v.renderSem(w)
	case v.lim != nil:
		v.renderLimiter(w, prev, more)
	default:
		fmt.Fprintf(w, "%s  (no state and no record of its limits: idle, or give -alg and -limit)\n", keyText(v.tg.key))
		v.renderControl(w, left(v.meta.PauseEnd, v.now))
		v.renderWeights(w)
	}
	for _, e := range v.tg.ks.foreign {
		fmt.Fprintf(w, "  %s\n", e.leftAlone())
	}
}

// renderControl prints what is set on the key: a pause and an override, each with
// the time it has left, or "no" and "none". paused is Inspect's figure, or the meta's.
func (v *view) renderControl(w io.Writer, paused time.Duration) {
	p := "no"
	if paused > 0 {
		p = "yes, " + round(paused).String() + " more"
	}
	fmt.Fprintf(w, "  %-11s %s\n", "paused", p)
	var over time.Duration
	if o := v.meta.Override; o != nil {
		over = left(o.End, v.now)
	}
	if v.lim != nil {
		over = v.lim.Override
	}
	o := "none"
	switch {
	case over > 0 && v.sem != nil:
		o = "set, " + remaining(over) + ", but a semaphore has no rates: it changes nothing here"
	case over > 0 && v.lim != nil:
		// the overridden limits as enforced (Inspect), and as the code passes them
		n := len(v.lim.Limits)
		if v.meta.Override != nil {
			n = min(n, len(v.meta.Override.Rates))
		}
		parts := make([]string, n)
		for i := range parts {
			parts[i] = v.lim.Limits[i].Limit.String()
			if i < len(v.tg.code) && v.tg.code[i] != v.lim.Limits[i].Limit {
				parts[i] += " in place of " + v.tg.code[i].String()
			}
		}
		o = strings.Join(parts, ", ") + ", " + remaining(over)
	case over > 0:
		rec, _ := v.tg.ks.record()
		o = overrideText(v.meta.Override, rec.Limits, true) + ", " + remaining(over)
	}
	fmt.Fprintf(w, "  %-11s %s\n", "override", o)
}

// renderWeights prints the operators' weights of tenants that last after now, one a
// line; nothing when there are none.
func (v *view) renderWeights(w io.Writer) {
	label := "weights"
	for _, wt := range v.meta.Weights {
		if d := left(wt.End, v.now); d > 0 {
			fmt.Fprintf(w, "  %-11s %s %s, %s (an operator's)\n", label, keyText(wt.Tenant), units(wt.Units), remaining(d))
			label = ""
		}
	}
}

// renderTenants prints the fair share: W, the weight of the tenants queued (from the
// meta's clock, as its last writer left it), and the tenants with the most queued,
// each with its weight and how far ahead its queued requests reach; nothing when no
// tenant has requests queued.
func (v *view) renderTenants(w io.Writer) {
	var queued []throttle.TenantState
	for _, t := range v.lim.Tenants {
		if t.Queued > 0 {
			queued = append(queued, t)
		}
	}
	if len(queued) == 0 {
		return
	}
	head := "the tenants with the most queued:"
	if f := v.meta.Fair; f != nil && f.W > 0 {
		head = "W " + units(f.W) + " (the weight of the tenants queued); " + head
	}
	fmt.Fprintf(w, "  %-11s %s\n", "fair share", head)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "    TENANT\tWEIGHT\tQUEUED\n")
	for _, t := range queued {
		fmt.Fprintf(tw, "    %s\t%s\t%v ahead\n", keyText(t.Name), strconv.FormatFloat(t.Weight, 'g', -1, 64), round(t.Queued))
	}
	tw.Flush()
}

// renderDrift prints, when the meta holds another process's head (drift), whose
// limits were found and when.
func (v *view) renderDrift(w io.Writer) {
	if v.meta.Drift == "" {
		return
	}
	h, err := keys.ParseHead(v.meta.Drift)
	what := strconv.Quote(v.meta.Drift)
	if err == nil {
		what = headText(v.meta.Drift, true) + " (" + algorithm(h.Alg).String() + ")"
	}
	fmt.Fprintf(w, "  %-11s another process's limits were found %v ago: %s; the processes on the key disagree on its limits\n",
		"drift", round(left(v.now, v.meta.DriftAt)), what)
}

func (v *view) renderLimiter(w io.Writer, prev *view, more bool) {
	s := v.lim
	fmt.Fprintf(w, "%s  %v\n", keyText(v.tg.key), s.Algorithm)
	log := s.Algorithm == throttle.SlidingWindow || s.Algorithm == throttle.SlidingCounter
	width := 22 // the limits' bars line up
	for _, l := range s.Limits {
		width = max(width, len(l.Limit.String()))
	}
	for _, l := range s.Limits {
		used, booked := l.Used, ""
		switch {
		case !log || s.Booked == 0:
		case l.Limit.Unit == "": // the log counts bookings in Used: show them apart
			used = max(0, l.Used-s.Booked)
			booked = fmt.Sprintf(" + %d booked", s.Booked)
		default: // Booked counts calls, not what their estimates hold of this unit
			booked = ", bookings included"
		}
		fmt.Fprintf(w, "  %-*s %s %d/%d used%s\n", width, l.Limit.String(), bar(used, l.Capacity), used, l.Capacity, booked)
	}
	queue := "none"
	if s.Booked > 0 || s.BookedAhead > 0 {
		queue = fmt.Sprintf("%d permits booked, the last %v ahead", s.Booked, round(s.BookedAhead))
	}
	fmt.Fprintf(w, "  %-11s %s\n", "queue", queue)
	next := "now"
	if s.NextFree > 0 {
		next = "in " + round(s.NextFree).String()
	}
	fmt.Fprintf(w, "  %-11s %s (remaining now: %d)\n", "next free", next, s.Remaining)
	v.renderControl(w, s.PausedFor)
	v.renderWeights(w)
	v.renderTenants(w)
	v.renderDrift(w)
	if more || prev != nil {
		fmt.Fprintf(w, "  %-11s %s\n", "granted/s", v.rate(prev))
	}
	fmt.Fprintf(w, "  %-11s %v (state TTL %v)\n", "reset in", round(s.ResetAfter), s.TTL)
}

// rate is watch's rate line: the permits that took effect and the grants made per
// second since prev.
func (v *view) rate(prev *view) string {
	s := v.lim
	switch {
	case v.total < 0:
		return "n/a for " + s.Algorithm.String()
	case prev == nil || prev.lim == nil || prev.total < 0:
		return "from the next screen on"
	case v.total < prev.total || !v.at.After(prev.at):
		return "- (the key was reset)"
	}
	// permits that took effect: those granted since the last screen, less the
	// growth of the queue booked ahead (bookings made long before take effect now)
	secs := v.at.Sub(prev.at).Seconds()
	took := (v.total - prev.total) - int64(s.Booked-prev.lim.Booked)
	return fmt.Sprintf("%.1f took effect, %.1f new grants", max(0, float64(took))/secs, float64(v.total-prev.total)/secs)
}

func (v *view) renderSem(w io.Writer) {
	s := v.sem
	fmt.Fprintf(w, "%s  Semaphore\n", keyText(v.tg.key))
	if s.Max > 0 {
		fmt.Fprintf(w, "  %-11s %s %d/%d held\n", "leases", bar(s.Held, s.Max), s.Held, s.Max)
	} else {
		fmt.Fprintf(w, "  %-11s %d held (give -max for the bar)\n", "leases", s.Held)
	}
	fmt.Fprintf(w, "  %-11s %d\n", "waiting", s.Waiting)
	if len(s.Expiries) > 0 {
		fmt.Fprintf(w, "  %-11s first in %v, last listed in %v\n", "expiries", round(s.Expiries[0]), round(s.Expiries[len(s.Expiries)-1]))
	}
	v.renderControl(w, s.PausedFor)
}
