package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// view is one reading of a key, what show and watch print.
type view struct {
	key   string
	lim   *throttle.LimiterState
	sem   *throttle.SemaphoreState
	total int64 // the permit log's running count (SlidingWindow, SlidingCounter); -1 unknown
	at    time.Time
}

func (t *tool) view(ctx context.Context, tg *target) (*view, error) {
	v := &view{key: tg.key, total: -1}
	if tg.sem != nil {
		st, err := tg.sem.Inspect(ctx)
		if err != nil {
			return nil, err
		}
		if t.o.max == 0 {
			st.Max = 0
		}
		v.sem = &st
		return v, nil
	}
	st, err := tg.lim.Inspect(ctx)
	if err != nil {
		return nil, err
	}
	v.lim = &st
	if a := st.Algorithm; a == throttle.SlidingWindow || a == throttle.SlidingCounter {
		// the log's last entry holds the count of every permit granted since the key
		// was made (see lua/log.lua): its growth is the grant rate
		tag, _ := t.tag(tg.key)
		suffix := "sw"
		if a == throttle.SlidingCounter {
			suffix = "sc"
		}
		n, err := t.rdb.LIndex(ctx, tag+":"+suffix, -1).Int64()
		switch {
		case err == nil:
			v.total = n
		case errors.Is(err, redis.Nil):
			v.total = 0
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

// render prints the view; prev, the previous reading of the same key, gives the rate.
func (v *view) render(w io.Writer, prev *view) {
	if v.sem != nil {
		v.renderSem(w)
		return
	}
	s := v.lim
	fmt.Fprintf(w, "%s  %v\n", v.key, s.Algorithm)
	log := s.Algorithm == throttle.SlidingWindow || s.Algorithm == throttle.SlidingCounter
	for _, l := range s.Limits {
		used, more := l.Used, ""
		if log && s.Booked > 0 { // the log counts bookings in Used: show them apart
			used = max(0, l.Used-s.Booked)
			more = fmt.Sprintf(" + %d booked", s.Booked)
		}
		fmt.Fprintf(w, "  %-22s %s %d/%d used%s\n", l.Limit.String(), bar(used, l.Capacity), used, l.Capacity, more)
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
	paused := "no"
	if s.PausedFor > 0 {
		paused = "yes, " + round(s.PausedFor).String() + " more"
	}
	fmt.Fprintf(w, "  %-11s %s\n", "paused", paused)
	if s.Override > 0 {
		left := round(s.Override).String() + " more"
		if s.Override > 400*24*time.Hour {
			left = "until unset"
		}
		fmt.Fprintf(w, "  %-11s the rates above, set by an operator, %s\n", "override", left)
	}
	rate := "-"
	if prev != nil && prev.total >= 0 && v.total >= prev.total && v.at.After(prev.at) {
		// permits that took effect: those granted since the last screen, less the
		// growth of the queue booked ahead (bookings made long before take effect now)
		secs := v.at.Sub(prev.at).Seconds()
		took := (v.total - prev.total) - int64(s.Booked-prev.lim.Booked)
		rate = fmt.Sprintf("%.1f took effect, %.1f new grants", max(0, float64(took))/secs, float64(v.total-prev.total)/secs)
	} else if v.total < 0 || (prev != nil && prev.total >= 0 && v.total < prev.total) {
		rate = "-"
	} else if prev == nil && v.total >= 0 {
		rate = "(next screen)"
	}
	if v.total < 0 && (s.Algorithm == throttle.TokenBucket || s.Algorithm == throttle.FixedWindow) {
		rate = "n/a for " + s.Algorithm.String()
	}
	fmt.Fprintf(w, "  %-11s %s\n", "granted/s", rate)
	fmt.Fprintf(w, "  %-11s %v (state TTL %v)\n", "reset in", round(s.ResetAfter), s.TTL)
}

func (v *view) renderSem(w io.Writer) {
	s := v.sem
	fmt.Fprintf(w, "%s  Semaphore\n", v.key)
	if s.Max > 0 {
		fmt.Fprintf(w, "  %-11s %s %d/%d held\n", "leases", bar(s.Held, s.Max), s.Held, s.Max)
	} else {
		fmt.Fprintf(w, "  %-11s %d held (give -max for the bar)\n", "leases", s.Held)
	}
	fmt.Fprintf(w, "  %-11s %d\n", "waiting", s.Waiting)
	if len(s.Expiries) > 0 {
		fmt.Fprintf(w, "  %-11s first in %v, last listed in %v\n", "expiries", round(s.Expiries[0]), round(s.Expiries[len(s.Expiries)-1]))
	}
	paused := "no"
	if s.PausedFor > 0 {
		paused = "yes, " + round(s.PausedFor).String() + " more"
	}
	fmt.Fprintf(w, "  %-11s %s\n", "paused", paused)
}
