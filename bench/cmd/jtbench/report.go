package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// report holds everything one run measured.
type report struct {
	command  string
	machine  machine
	settings string

	cases []tcase
	gs    []int
	tp    map[tpKey]*tpResult

	cont []contResult
	mem  []memResult
	big  []bigResult
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Microsecond)) }

func ms(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d)/float64(time.Millisecond)) }

func pct(f float64) string {
	if math.IsNaN(f) {
		return "–"
	}
	return fmt.Sprintf("%.2f%%", 100*f)
}

func (r *report) write(w io.Writer) {
	fmt.Fprintf(w, "Command: `%s`\n\n", r.command)
	fmt.Fprintf(w, "Machine: %s.\n\n", r.machine)
	fmt.Fprintf(w, "Settings: %s.\n\n", r.settings)
	if r.tp != nil {
		r.writeThroughput(w)
	}
	if r.cont != nil {
		r.writeContention(w)
	}
	if r.mem != nil {
		r.writeMemory(w)
	}
	if r.big != nil {
		r.writeBig(w)
	}
	r.writeGoals(w)
}

func (r *report) caseIndex(name, path string) int {
	return slices.IndexFunc(r.cases, func(c tcase) bool { return c.name == name && c.path == path })
}

func (r *report) writeThroughput(w io.Writer) {
	top := r.gs[len(r.gs)-1]
	noop := r.caseIndex("EVALSHA return 1 (no-op)", "")
	ping := r.caseIndex("PING", "")
	fmt.Fprintf(w, "### Physical limit (one key, go-redis v9, default pool)\n\n")
	tx := r.caseIndex(noopTxName, "")
	fmt.Fprintf(w, "| goroutines | PING ops/s | PING p50 / p99 µs | no-op EVALSHA ops/s | no-op p50 / p99 µs | no-op Redis CPU µs/call | no-op exec µs/call | no-op in MULTI/EXEC ops/s (÷ no-op) |\n")
	fmt.Fprintf(w, "|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, g := range r.gs {
		p, n, t := r.tp[tpKey{ping, g}], r.tp[tpKey{noop, g}], r.tp[tpKey{tx, g}]
		fmt.Fprintf(w, "| %d | %.0f | %.0f / %.0f | %.0f | %.0f / %.0f | %.1f | %.2f | %.0f (%.2f) |\n", g,
			p.med(sample.opsPerSec), p.med(p50), p.med(p99),
			n.med(sample.opsPerSec), n.med(p50), n.med(p99), n.med(redisCPU), n.med(exec),
			t.med(sample.opsPerSec), median(t.ratios()))
	}
	fmt.Fprintf(w, "\n### Allow throughput\n\n")
	fmt.Fprintf(w, "Ops/s ÷ the no-op EVALSHA's ops/s in the same round (median of rounds); \"by CPU\": the no-op's client + Redis CPU per call ÷ the case's, same round (median), the steadier figure on a shared machine; the other columns at %d goroutines. Allowed path: a limit of %d per %v that is never reached (log entries expire while a case runs); denied path: %d per %v, so almost every call is denied. Every limiter case starts on fresh keys. Redis CPU is the server main thread's (INFO cpu) per call, I/O included; exec is the script's own time (INFO commandstats).\n\n", top, allowedRate, allowedPeriod, deniedRate, deniedPeriod)
	head := "| limiter | path | granted |"
	sep := "|---|---|---:|"
	for _, g := range r.gs {
		head += fmt.Sprintf(" ÷ no-op @%d |", g)
		sep += "---:|"
	}
	head += fmt.Sprintf(" p50 µs @%d |", r.gs[0])
	sep += "---:|"
	head += fmt.Sprintf(" ÷ no-op by CPU @%d | ops/s @%d | permits/s @%d | permits per Redis CPU s @%d | p50 / p99 µs | Redis CPU µs/call | exec µs/script run | client CPU µs/call | allocs/call |", top, top, top, top)
	sep += "---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, sep)
	for i, c := range r.cases {
		path := c.path
		if path == "" {
			path = "–"
		}
		t := r.tp[tpKey{i, top}]
		row := fmt.Sprintf("| %s | %s | %.1f%% |", c.name, path, 100*t.med(func(s sample) float64 { return float64(s.granted) / float64(s.ops) }))
		for _, g := range r.gs {
			row += fmt.Sprintf(" %.2f |", median(r.tp[tpKey{i, g}].ratios()))
		}
		row += fmt.Sprintf(" %.0f |", r.tp[tpKey{i, r.gs[0]}].med(p50))
		row += fmt.Sprintf(" %.2f | %.0f | %.0f | %.0f | %.0f / %.0f | %.1f | %.2f | %.1f | %.1f |",
			cpuRatio(t), t.med(sample.opsPerSec), t.med(permitsPerSec), t.med(permitsPerRedisCPU), t.med(p50), t.med(p99), t.med(redisCPU), t.med(exec), t.med(clientCPU), t.med(func(s sample) float64 { return s.allocs }))
		fmt.Fprintln(w, row)
	}
	fmt.Fprintln(w)
}

// cpuRatio is the no-op's CPU per call (client and Redis) over the case's, each the
// median of the rounds: what the ops/s ratio comes to when the two cores are the
// bottleneck, and far steadier than ops/s on a machine others share.
func cpuRatio(t *tpResult) float64 {
	cpu := func(s sample) float64 { return float64(s.clientCPU + s.redisCPU) }
	xs := make([]float64, len(t.samples))
	for i := range t.samples {
		xs[i] = cpu(t.noop[i]) / cpu(t.samples[i])
	}
	return median(xs)
}

// permitsPerSec is the permits granted per second.
func permitsPerSec(s sample) float64 { return float64(s.granted) / s.elapsed.Seconds() }

// permitsPerRedisCPU is the permits granted per second of the Redis server's CPU
// (main thread): how much of Redis a permit costs, whatever the client does.
func permitsPerRedisCPU(s sample) float64 {
	cpu := s.redisCPU.Seconds() * float64(s.ops)
	if cpu <= 0 {
		return math.NaN()
	}
	return float64(s.granted) / cpu
}

func p50(s sample) float64       { return float64(s.p50) / float64(time.Microsecond) }
func p99(s sample) float64       { return float64(s.p99) / float64(time.Microsecond) }
func redisCPU(s sample) float64  { return float64(s.redisCPU) / float64(time.Microsecond) }
func exec(s sample) float64      { return float64(s.exec) / float64(time.Microsecond) }
func clientCPU(s sample) float64 { return float64(s.clientCPU) / float64(time.Microsecond) }

func (r *report) writeContention(w io.Writer) {
	c0 := r.cont[0]
	fmt.Fprintf(w, "### Contention: W goroutines in a blocking acquire loop on one limit of R = %d/s for %v\n\n", c0.rate, c0.duration)
	fmt.Fprintf(w, "Utilization: permits that took effect in the whole seconds after the first one, over R per second. Most in 1 s / 100 ms: any window, by the grant times of the last column. Calls: EVAL/EVALSHA counted in a go-redis hook, over permits granted. Wait: from asking to holding a permit; W/R is the FIFO ideal (and, by Little's law, the mean wait of any limiter that keeps all W waiting at rate R). Fairness: permits of the least and the most served worker, and Jain's index.\n\n")
	fmt.Fprintf(w, "| W | limiter | permits | utilization | most in 1 s | most in 100 ms | calls/permit | wait mean / p50 / p99 ms | W/R ms | fairness min/max | Jain | grant times |\n")
	fmt.Fprintf(w, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, c := range r.cont {
		fmt.Fprintf(w, "| %d | %s | %d | %s | %d | %d | %.2f | %s / %s / %s | %d | %.2f | %.3f | %s |\n",
			c.workers, c.name, c.granted, pct(c.util), c.max1s, c.max100ms, c.callsPerPermit,
			ms(c.mean), ms(c.p50), ms(c.p99), 1000*c.workers/c.rate, c.fairMinMax, c.jain, c.clock)
	}
	fmt.Fprintln(w)
}

func (r *report) writeMemory(w io.Writer) {
	fmt.Fprintf(w, "### Memory after one full window (MEMORY USAGE … SAMPLES 0 of every key)\n\n")
	fmt.Fprintf(w, "Each limiter is set to rate/s and takes rate permits spread evenly over one second.\n\n")
	fmt.Fprintf(w, "| rate/s | limiter | permits | log entries | keys (bytes) | total bytes | bytes/permit |\n")
	fmt.Fprintf(w, "|---:|---|---:|---:|---|---:|---:|\n")
	for _, m := range r.mem {
		var ks []string
		for _, k := range m.keys {
			ks = append(ks, fmt.Sprintf("`%s` %d", k.key, k.bytes))
		}
		entries := "–"
		if m.entries > 0 {
			entries = fmt.Sprint(m.entries)
		}
		fmt.Fprintf(w, "| %d | %s | %d | %s | %s | %d | %.1f |\n", m.rate, m.name, m.granted, entries, strings.Join(ks, ", "), m.total, m.perPermit())
	}
	fmt.Fprintln(w)
}

func (r *report) writeBig(w io.Writer) {
	fmt.Fprintf(w, "### Script execution on a big sliding-window log (INFO commandstats)\n\n")
	fmt.Fprintf(w, "| operation | live entries | calls | exec µs/call |\n|---|---:|---:|---:|\n")
	for _, b := range r.big {
		x := us(b.exec)
		if b.failed != "" {
			x += " (failed: " + strings.ReplaceAll(b.failed, "|", "\\|") + ")"
		}
		fmt.Fprintf(w, "| %s | %d | %d | %s |\n", b.what, b.entries, b.calls, x)
	}
	fmt.Fprintln(w)
}

// goal is one of the project's speed goals with the figure this run measured.
type goal struct {
	goal, figure string
	met          bool
}

func (r *report) goals() []goal {
	var out []goal
	if r.tp != nil {
		top := r.gs[len(r.gs)-1]
		ratio := func(name, path string) float64 {
			i := r.caseIndex(name, path)
			if i < 0 {
				return math.NaN()
			}
			return median(r.tp[tpKey{i, top}].ratios())
		}
		for _, path := range []string{"allowed", "denied"} {
			rr := ratio("redis_rate", path)
			for _, a := range algorithms {
				name := "jobthrottle " + a.String()
				x := ratio(name, path)
				out = append(out, goal{
					fmt.Sprintf("%s Allow (%s) ≥ 0.90× no-op at %d goroutines", a, path, top),
					fmt.Sprintf("%.2f×", x), x >= 0.90,
				}, goal{
					fmt.Sprintf("%s Allow (%s) ahead of redis_rate", a, path),
					fmt.Sprintf("%.2f× vs %.2f×", x, rr), x > rr,
				})
			}
		}
	}
	for _, c := range r.cont {
		if c.workers != 64 || !strings.HasPrefix(c.name, "jobthrottle") {
			continue
		}
		ideal := time.Duration(c.workers) * time.Second / time.Duration(c.rate)
		out = append(out, goal{fmt.Sprintf("W=64 %s: ≤ 1.02 script calls per permit", c.name), fmt.Sprintf("%.3f", c.callsPerPermit), c.callsPerPermit <= 1.02})
		// the goals name the default (SlidingWindow) and a Burst-1 token bucket; a token
		// bucket with burst R lets 2R through in a second by design, a fixed window 2R
		// around an edge, and a sliding counter holds permits up to a bucket longer
		switch {
		case strings.Contains(c.name, "burst 1"):
			out = append(out,
				goal{fmt.Sprintf("W=64 %s: paces evenly, most in 100 ms ≈ R/10 = %d", c.name, c.rate/10), fmt.Sprint(c.max100ms), c.max100ms <= c.rate/10+1},
				goal{fmt.Sprintf("W=64 %s: ≥ 99.5%% utilization", c.name), pct(c.util), c.util >= 0.995},
				goal{fmt.Sprintf("W=64 %s: never more than R = %d in any 1 s", c.name, c.rate), fmt.Sprint(c.max1s), c.max1s <= c.rate})
		case strings.Contains(c.name, "SlidingWindow"):
			out = append(out,
				goal{fmt.Sprintf("W=64 %s: ≥ 99.8%% utilization", c.name), pct(c.util), c.util >= 0.998},
				goal{fmt.Sprintf("W=64 %s: never more than R = %d in any 1 s", c.name, c.rate), fmt.Sprint(c.max1s), c.max1s <= c.rate})
		}
		if strings.Contains(c.name, "SlidingWindow") || strings.Contains(c.name, "burst 1") {
			out = append(out, goal{fmt.Sprintf("W=64 %s: wait p99 near the FIFO ideal W/R = %v", c.name, ideal),
				fmt.Sprintf("%v (%.2f× W/R; mean %v)", c.p99.Round(time.Millisecond), float64(c.p99)/float64(ideal), c.mean.Round(time.Millisecond)),
				float64(c.p99) <= 1.1*float64(ideal)})
		}
	}
	rrKey := map[int]float64{}
	for _, m := range r.mem {
		if m.name == "redis_rate" {
			rrKey[m.rate] = float64(m.total)
		}
	}
	for _, m := range r.mem {
		switch m.name {
		case "jobthrottle SlidingWindow":
			out = append(out, goal{fmt.Sprintf("SlidingWindow ≤ 80 B per permit at %d/s", m.rate), fmt.Sprintf("%.1f B", m.perPermit()), m.perPermit() <= 80})
		case "jobthrottle TokenBucket":
			out = append(out, goal{fmt.Sprintf("TokenBucket ≤ 104 B per key and ≤ redis_rate's at %d/s", m.rate),
				fmt.Sprintf("%d B (redis_rate %.0f B)", m.total, rrKey[m.rate]), m.total <= 104 && float64(m.total) <= rrKey[m.rate]})
		}
	}
	for _, b := range r.big {
		if b.peer {
			continue
		}
		out = append(out, goal{fmt.Sprintf("exec < 1 ms with %d live entries: %s", b.entries, b.what), us(b.exec) + " µs", b.exec < time.Millisecond})
	}
	return out
}

func (r *report) writeGoals(w io.Writer) {
	gs := r.goals()
	if len(gs) == 0 {
		return
	}
	fmt.Fprintf(w, "### Speed goals\n\n| goal | measured | met |\n|---|---:|:---:|\n")
	for _, g := range gs {
		mark := "yes"
		if !g.met {
			mark = "**no**"
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", g.goal, g.figure, mark)
	}
	fmt.Fprintln(w)
}
