package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// view is one reading of a key, what show and watch print.
type view struct {
	tg    *target
	lim   *throttle.LimiterState
	sem   *throttle.SemaphoreState
	now   int64 // the server's clock when the control key was read, µs
	total int64 // the permit log's running count (SlidingWindow, SlidingCounter); -1 unknown
	at    time.Time
}

func (t *tool) view(ctx context.Context, tg *target) (*view, error) {
	v := &view{tg: tg, total: -1}
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
		if tg.state == keys.SlidingWindow || tg.state == keys.SlidingCounter {
			// the log's last entry holds the count of every permit granted since the key
			// was made: its growth is the grant rate
			n, err := t.rdb.LIndex(ctx, keys.Name(tg.ks.tag, tg.state), -1).Int64()
			switch {
			case err == nil:
				v.total = n
			case errors.Is(err, redis.Nil):
				v.total = 0
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
		v.renderControl(w, v.tg.ks.control(), 0, 0)
	}
	for _, e := range v.tg.ks.foreign {
		fmt.Fprintf(w, "  %s\n", e.leftAlone())
	}
}

// renderControl prints what is set on the key: a pause and an override, each with
// the time it has left, or "no" and "none". paused and over are Inspect's figures
// (0: read them from c, the control key as read at v.now).
func (v *view) renderControl(w io.Writer, c keys.Control, paused, over time.Duration) {
	if v.lim == nil && v.sem == nil {
		paused = left(c.PauseEnd, v.now)
		if c.Override != nil {
			over = left(c.Override.End, v.now)
		}
	}
	p := "no"
	if paused > 0 {
		p = "yes, " + round(paused).String() + " more"
	}
	fmt.Fprintf(w, "  %-11s %s\n", "paused", p)
	o := "none"
	switch {
	case over > 0 && v.sem != nil:
		o = "set, " + remaining(over) + ", but a semaphore has no rates: it changes nothing here"
	case over > 0 && v.lim != nil:
		// the overridden limits as enforced (Inspect), and as the code passes them
		n := len(v.lim.Limits)
		if c.Override != nil {
			n = min(n, len(c.Override.Rates))
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
		o = overrideText(c.Override, rec.Limits, true) + ", " + remaining(over)
	}
	fmt.Fprintf(w, "  %-11s %s\n", "override", o)
}

func (v *view) renderLimiter(w io.Writer, prev *view, more bool) {
	s := v.lim
	fmt.Fprintf(w, "%s  %v\n", keyText(v.tg.key), s.Algorithm)
	log := s.Algorithm == throttle.SlidingWindow || s.Algorithm == throttle.SlidingCounter
	for _, l := range s.Limits {
		used, booked := l.Used, ""
		if log && s.Booked > 0 { // the log counts bookings in Used: show them apart
			used = max(0, l.Used-s.Booked)
			booked = fmt.Sprintf(" + %d booked", s.Booked)
		}
		fmt.Fprintf(w, "  %-22s %s %d/%d used%s\n", l.Limit.String(), bar(used, l.Capacity), used, l.Capacity, booked)
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
	v.renderControl(w, v.tg.ks.control(), s.PausedFor, s.Override)
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
	c := v.tg.ks.control()
	var over time.Duration
	if c.Override != nil {
		over = left(c.Override.End, v.now)
	}
	v.renderControl(w, c, s.PausedFor, over)
}
