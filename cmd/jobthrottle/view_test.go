package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// show says exactly what is set on a key: neither a pause nor an override, a pause,
// an override, or both, each with the time it has left; a semaphore and a key that
// holds only a control key too. It says nothing of screens it does not have.
func TestShowControl(t *testing.T) {
	const (
		pause30 = `[\d.]+m?s more` // what is left of 30s, however slowly the test runs
		hour    = `(1h0m0s|\d+m[\d.]+s) more`
	)
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		lim, err := throttle.New(b.Client, "api", throttle.PerMinute(10), throttle.WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lim.AllowN(ctx, 3); err != nil {
			t.Fatal(err)
		}
		show := func(what string, args ...string) string {
			t.Helper()
			code, out, errs := cli(t, b, "", args...)
			if code != 0 {
				t.Fatalf("%s: %v: status %d: %s", what, args, code, errs)
			}
			if strings.Contains(out, "granted/s") || strings.Contains(out, "screen") {
				t.Fatalf("%s: show speaks of a rate between screens it does not have:\n%s", what, out)
			}
			return out
		}
		step := func(args ...string) {
			t.Helper()
			if code, _, errs := cli(t, b, "", args...); code != 0 {
				t.Fatalf("%v: status %d: %s", args, code, errs)
			}
		}

		mustMatch(t, "neither", show("neither", "show", "api"), `\n  paused      no\n  override    none\n`)
		step("pause", "api", "30s")
		mustMatch(t, "pause only", show("pause only", "show", "api"), `\n  paused      yes, `+pause30+`\n  override    none\n`)
		step("set", "-for", "1h", "api", "2/1m")
		mustMatch(t, "both", show("both", "show", "api"), `\n  paused      yes, `+pause30+`\n  override    2 per 1m0s in place of 10 per 1m0s, `+hour+`\n`)
		step("resume", "api")
		mustMatch(t, "override only", show("override only", "show", "api"), `\n  paused      no\n  override    2 per 1m0s in place of 10 per 1m0s, `+hour+`\n`)
		step("set", "api", "2/1m") // no -for: until unset
		mustMatch(t, "override until unset", show("override until unset", "show", "api"), `\n  override    2 per 1m0s in place of 10 per 1m0s, until unset\n`)
		step("unset", "api")
		mustMatch(t, "unset", show("unset", "show", "api"), `\n  paused      no\n  override    none\n`)

		// watch: one screen has no rate; of two, the first says the rate comes next
		code, out, errs := cli(t, b, "", "watch", "-count", "1", "api")
		if code != 0 || strings.Contains(out, "granted/s") {
			t.Fatalf("watch -count 1: status %d %s:\n%s", code, errs, out)
		}
		code, out, errs = cli(t, b, "", "watch", "-count", "2", "-interval", "10ms", "api")
		if code != 0 {
			t.Fatalf("watch -count 2: status %d: %s", code, errs)
		}
		screens := strings.Split(out, "jobthrottle watch")
		if len(screens) != 3 || !strings.Contains(screens[1], "granted/s   from the next screen on") ||
			!strings.Contains(screens[2], "granted/s   0.0 took effect") {
			t.Fatalf("watch -count 2: %d screens:\n%s", len(screens)-1, out)
		}

		// a semaphore: a pause, and an override set while its key was not in use, which
		// changes nothing there (set refuses a key that shows a semaphore)
		sem, err := throttle.NewSemaphore(b.Client, "jobs", 2, throttle.WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		lease, _, err := sem.TryAcquire(ctx)
		if err != nil || lease == nil {
			t.Fatal(lease, err)
		}
		mustMatch(t, "semaphore", show("semaphore", "show", "-max", "2", "jobs"), `1/2 held\n  waiting     0\n.*\n  paused      no\n  override    none\n`)
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		step("set", "-for", "1h", "jobs", "1/1s")
		if lease, _, err = sem.TryAcquire(ctx); err != nil || lease == nil {
			t.Fatal(lease, err)
		}
		defer lease.Release(ctx)
		step("pause", "jobs", "30s")
		mustMatch(t, "semaphore paused", show("semaphore paused", "show", "jobs"),
			`\n  paused      yes, `+pause30+`\n  override    set, `+hour+`, but a semaphore has no rates: it changes nothing here\n`)

		// a key with nothing but a control key (a pause set on a key not in use)
		step("pause", "idle", "30s")
		out = show("control key only", "show", "idle")
		mustContain(t, "control key only", out, "idle  (no state and no record of its limits")
		mustMatch(t, "control key only", out, `\n  paused      yes, `+pause30+`\n  override    none\n`)
	})
}

// Driven as a person would, in tmux: two clients, standing for two processes of a
// fleet, queue tenants of weights 3, 1 and 1 (one a name with a newline) in a key's
// fair share; `jobthrottle show` lists each with its weight and how far ahead its
// requests reach, and W, the weight of the tenants queued. The limit is a few an hour,
// so the tenants stay queued however slowly the machine runs the test.
func TestShowTenantsInTmux(t *testing.T) {
	bin := buildCLI(t)
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		addrs, cluster := b.Addrs()
		var lims [2]*throttle.Limiter
		for i := range lims {
			c := redistest.Dial(addrs, cluster)
			defer c.Close()
			var err error
			lims[i], err = throttle.New(c, "vendor-api", throttle.PerHour(6), throttle.WithTenantLimits(throttle.PerHour(4)),
				throttle.WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
		}
		for _, q := range []struct {
			process int
			tenant  string
			weight  float64
		}{{0, "acme", 3}, {1, "acme", 3}, {0, "bigco", 1}, {1, "ten\n7", 1}} {
			if r, err := lims[q.process].Tenant(q.tenant, throttle.Weight(q.weight)).Allow(ctx); err != nil || !r.Allowed {
				t.Fatalf("%d %q: %+v %v", q.process, q.tenant, r, err)
			}
		}
		tm := newTerminal(t, fmt.Sprintf("env PS1='$ ' PATH=%s:$PATH REDIS_ADDR=%s bash --norc --noprofile",
			filepath.Dir(bin), strings.Join(addrs, ",")))
		tm.typeLine("jobthrottle -prefix " + b.Prefix + " show vendor-api; echo [1] status $?")
		screen := tm.waitFor("show", func(s string) bool { return strings.Contains(s, "\n[1] status ") })
		mustContain(t, "show", screen, "\n[1] status 0\n", "vendor-api  SlidingWindow", "6 per 1h0m0s", "4/6 used",
			"  fair share  W 5 (the weight of the tenants queued); the tenants with the most queued:\n")
		lines := strings.Split(screen, "\n")
		for _, want := range []struct{ name, weight string }{{"acme", "3"}, {"bigco", "1"}, {`"ten\n7"`, "1"}} {
			i := lineWith(lines, "    "+want.name+" ")
			if i < 0 {
				t.Fatalf("show does not list tenant %s:\n%s", want.name, screen)
			}
			mustMatch(t, "show's row of "+want.name, lines[i], `^    \S+ +`+want.weight+` +[\dhms.]+ ahead$`)
		}
		t.Logf("show:\n%s", strings.TrimRight(screen, "\n"))
	})
}

// A process with other limits on the key (drift): show names them and when they
// were found, from the meta's d line.
func TestShowDrift(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, rate := range []int{20, 10} { // the process of 10 a minute writes last
			lim, err := throttle.New(b.Client, "api", throttle.PerMinute(rate), throttle.WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := lim.Allow(ctx); err != nil {
				t.Fatal(err)
			}
		}
		code, out, errs := cli(t, b, "", "show", "api")
		if code != 0 {
			t.Fatalf("show: status %d: %s", code, errs)
		}
		mustContain(t, "show", out, "api  SlidingWindow\n  10 per 1m0s ")
		mustMatch(t, "show", out, `\n  drift       another process's limits were found [\d.]+m?s ago: 20 per 1m0s \(SlidingWindow\); the processes on the key disagree on its limits\n`)
		_, out, _ = cli(t, b, "", "ls")
		mustMatch(t, "ls", out, `\napi +SlidingWindow +- +- +10/1m0s \(drift: 20/1m0s\)\n`)
	})
}

// A limiter of calls and tokens: ls and show name each limit's unit, a pause through the
// CLI keeps the key's head (its units included), and reset deletes the tokens' state and
// the settle records with the rest.
func TestUnits(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		lim, err := throttle.New(b.Client, "llm", throttle.PerMinute(600), throttle.WithKeyPrefix(b.Prefix),
			throttle.WithLimits(throttle.Limit{Rate: 100000, Period: time.Minute, Unit: "tokens"}))
		if err != nil {
			t.Fatal(err)
		}
		r, err := lim.WaitCost(ctx, map[string]int{"tokens": 4000})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Settle(ctx, map[string]int{"tokens": 1500}); err != nil {
			t.Fatal(err)
		}
		_, out, _ := cli(t, b, "", "ls")
		mustMatch(t, "ls", out, `\nllm +SlidingWindow +- +- +600/1m0s,100000 tokens/1m0s\n`)
		_, out, _ = cli(t, b, "", "show", "llm")
		mustContain(t, "show", out, "100000 tokens per 1m0s")
		if code, _, errs := cli(t, b, "", "pause", "llm", "10s"); code != 0 {
			t.Fatalf("pause: %s", errs)
		}
		if st, err := lim.Inspect(ctx); err != nil || st.PausedFor <= 0 || len(st.Limits) != 2 || st.Limits[1].Used != 1500 {
			t.Fatalf("after the CLI's pause: %+v %v, want paused, the tokens' count kept", st, err)
		}
		_, out, _ = cli(t, b, "", "show", "llm")
		if strings.Contains(out, "drift") {
			t.Fatalf("the CLI's pause wrote another head: %s", out)
		}
		_, out, _ = cli(t, b, "", "reset", "-yes", "llm")
		mustContain(t, "reset", out, "1 unit's state", "1 settle record")
		tag := "{" + b.Prefix + "llm}"
		for _, k := range []string{tag + ":l", tag + ":u:tokens"} {
			if n := b.Client.Exists(ctx, k).Val(); n != 0 && k != tag+":l" {
				t.Fatalf("reset left %s", k)
			}
		}
		if n, _ := b.Client.Keys(ctx, tag+":st:*").Result(); len(n) != 0 {
			t.Fatalf("reset left the settle records %v", n)
		}
	})
}

// A limit of a unit counts the estimates of the calls booked ahead in its use: show
// says so, rather than taking the booked calls from its figure as it does for the limit
// of calls (a count of calls, not of tokens); the bars line up whatever the units'
// names.
func TestShowUnitsBookedAhead(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		lim, err := throttle.New(b.Client, "llm", throttle.PerMinute(2), throttle.WithKeyPrefix(b.Prefix),
			throttle.WithLimits(throttle.Limit{Rate: 10000, Period: time.Minute, Unit: "tokens"},
				throttle.Limit{Rate: 50000, Period: time.Minute, Unit: "output-tokens"}))
		if err != nil {
			t.Fatal(err)
		}
		cost := lim.Cost(map[string]int{"tokens": 100, "output-tokens": 10})
		for i := range 4 { // 2 now, 2 a minute ahead
			if r, err := cost.Reserve(ctx, 1, 2*time.Minute); err != nil || !r.OK() {
				t.Fatalf("booking %d: %v %v", i, r, err)
			}
		}
		_, out, _ := cli(t, b, "", "show", "llm")
		mustMatch(t, "calls", out, `\n  2 per 1m0s +\[#+\] 2/2 used \+ 2 booked\n`)
		mustMatch(t, "tokens", out, `\n  10000 tokens per 1m0s +\[[#.]+\] 400/10000 used, bookings included\n`)
		mustMatch(t, "output tokens", out, `\n  50000 output-tokens per 1m0s +\[[#.]+\] 40/50000 used, bookings included\n`)
		bars := map[int]bool{}
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, " used") {
				bars[strings.Index(line, "[")] = true
			}
		}
		if len(bars) != 1 {
			t.Fatalf("the limits' bars start in %d columns, want 1:\n%s", len(bars), out)
		}
	})
}
