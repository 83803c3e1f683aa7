package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// An operator at a shell, in tmux: keys the library accepts with a tab or a newline
// are listed quoted, one row each, the table's columns in line; a negative pause is
// refused as the argument it is, with what to do instead; such a key is paused by
// its name typed in the shell's quoting.
func TestKeysAndDurationsInTmux(t *testing.T) {
	bin := buildCLI(t)
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, key := range []string{"vendor-api", "tenant\n7", "tab\there", "two words"} {
			lim, err := throttle.New(b.Client, key, throttle.PerMinute(10), throttle.WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := lim.Allow(ctx); err != nil {
				t.Fatal(err)
			}
		}
		addrs, _ := b.Addrs()
		tm := newTerminal(t, fmt.Sprintf("env PS1='$ ' PATH=%s:$PATH REDIS_ADDR=%s bash --norc --noprofile",
			filepath.Dir(bin), strings.Join(addrs, ",")))
		n := 0
		// run types line and returns the screen once it has run, which must have
		// exited with status
		run := func(line string, status int) string {
			t.Helper()
			n++
			done := fmt.Sprintf("\n[%d] status ", n) // only this command's echo begins a line so
			tm.typeLine("clear")
			tm.typeLine(fmt.Sprintf("%s; echo [%d] status $?", line, n))
			screen := tm.waitFor(line, func(s string) bool { return strings.Contains(s, done) })
			mustContain(t, line, screen, fmt.Sprintf("%s%d\n", done, status))
			return screen
		}

		// header returns the screen's lines and where column name begins in ls's header
		header := func(screen, name string) ([]string, int) {
			t.Helper()
			lines := strings.Split(screen, "\n")
			i := lineWith(lines, "KEY ")
			if i < 0 {
				t.Fatalf("ls printed no header:\n%s", screen)
			}
			return lines, strings.Index(lines[i], name)
		}
		screen := run("jobthrottle -prefix "+b.Prefix+" ls", 0)
		lines, col := header(screen, "KIND")
		for _, want := range []string{"vendor-api", `"tenant\n7"`, `"tab\there"`, `"two words"`} {
			i := lineWith(lines, want+" ")
			if i < 0 {
				t.Fatalf("ls does not list %s on a row of its own:\n%s", want, screen)
			}
			if got := strings.Index(lines[i], "SlidingWindow"); got != col {
				t.Fatalf("ls: the row of %s has its kind at column %d, the header at %d:\n%s", want, got, col, screen)
			}
		}
		t.Logf("ls:\n%s", strings.TrimRight(screen, "\n"))

		screen = run("jobthrottle -prefix "+b.Prefix+" pause vendor-api -5s", 2)
		mustContain(t, "pause -5s", screen, "jobthrottle: pause vendor-api: -5s is not a positive duration: a pause lasts that long from now (e.g. 30s, 5m); 'jobthrottle resume vendor-api' ends one (see 'jobthrottle help pause')")

		screen = run("jobthrottle -prefix "+b.Prefix+` pause $'tenant\n7' 30s`, 0)
		mustMatch(t, "pause a key with a newline", screen, `paused "tenant\\n7" for [\d.]+s: the whole fleet stops until then`)
		mustContain(t, "pause a key with a newline", screen, `'jobthrottle resume "tenant\n7"' ends it sooner`)
		screen = run("jobthrottle -prefix "+b.Prefix+" ls", 0)
		lines, paused := header(screen, "PAUSED")
		for _, key := range []string{`"tenant\n7"`, `"tab\there"`} {
			i := lineWith(lines, key+" ")
			if i < 0 || len(lines[i]) <= paused {
				t.Fatalf("ls does not list %s:\n%s", key, screen)
			}
			if got, want := lines[i][paused] != '-', key == `"tenant\n7"`; got != want {
				t.Fatalf("ls: %s paused %v, want %v:\n%s", key, got, want, screen)
			}
		}
	})
}

// lineWith is the index of the first line that begins with prefix, or -1.
func lineWith(lines []string, prefix string) int {
	for i, l := range lines {
		if strings.HasPrefix(l, prefix) {
			return i
		}
	}
	return -1
}

// An operator at a shell, in tmux, sets a tenant's weight for the whole fleet and
// clears it: the requests another process's tenant handle (weight 1) makes after
// `jobthrottle weight` are queued in the fair share with the operator's weight 4, as
// the key's Inspect lists them; after `jobthrottle weight ... clear`, with the
// handle's own weight again. show lists the weight while it lasts. The tenant's name
// holds a space, typed in the shell's quoting.
func TestWeightInTmux(t *testing.T) {
	bin := buildCLI(t)
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		addrs, cluster := b.Addrs()
		c := redistest.Dial(addrs, cluster) // the fleet's process
		defer c.Close()
		lim, err := throttle.New(c, "vendor-api", throttle.PerHour(6), throttle.WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		const tenant = "acme corp"
		// queued returns the weights with which the key's Inspect lists tenant queued
		queued := func() []float64 {
			t.Helper()
			st, err := lim.Inspect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var w []float64
			for _, ts := range st.Tenants {
				if ts.Name == tenant && ts.Queued > 0 {
					w = append(w, ts.Weight)
				}
			}
			slices.Sort(w)
			return w
		}
		allow := func() {
			t.Helper()
			if r, err := lim.Tenant(tenant).Allow(ctx); err != nil || !r.Allowed {
				t.Fatalf("Allow: %+v %v", r, err)
			}
		}
		tm := newTerminal(t, fmt.Sprintf("env PS1='$ ' PATH=%s:$PATH REDIS_ADDR=%s bash --norc --noprofile",
			filepath.Dir(bin), strings.Join(addrs, ",")))
		n := 0
		run := func(line string) string {
			t.Helper()
			n++
			done := fmt.Sprintf("\n[%d] status ", n)
			tm.typeLine("clear")
			tm.typeLine(fmt.Sprintf("%s; echo [%d] status $?", line, n))
			screen := tm.waitFor(line, func(s string) bool { return strings.Contains(s, done) })
			mustContain(t, line, screen, done+"0\n")
			return screen
		}
		cmd := "jobthrottle -prefix " + b.Prefix + " "

		screen := run(cmd + "weight vendor-api 'acme corp' 4 10m")
		// (what is set, read back after the call: a busy host's round trips may pass first)
		mustMatch(t, "weight", screen, `vendor-api: tenant "acme corp" now has weight 4 in every process's fair share, for (10m0s|9m5\d\.\ds),`)
		allow()
		if w := queued(); !slices.Equal(w, []float64{4}) {
			t.Fatalf("after weight 4: the tenant queued with weights %v, want [4]", w)
		}
		screen = run(cmd + "show vendor-api")
		mustMatch(t, "show", screen, `\n  weights     "acme corp" 4, [\dms.]+ more \(an operator's\)\n`)
		mustMatch(t, "show", screen, `\n    "acme corp"  4 +[\dhms.]+ ahead\n`)

		screen = run(cmd + "weight vendor-api 'acme corp' clear")
		mustContain(t, "weight clear", screen, `vendor-api: cleared tenant "acme corp"'s weight (4, `, "the weight its callers pass counts again")
		allow()
		if w := queued(); !slices.Equal(w, []float64{1}) { // its place, queued under 4, moved to 1
			t.Fatalf("after clear: the tenant queued with weights %v, want [1]", w)
		}
		screen = run(cmd + "show vendor-api")
		if strings.Contains(screen, "weights ") {
			t.Fatalf("show lists a weight after clear:\n%s", screen)
		}
		screen = run(cmd + "weight vendor-api 'acme corp' clear")
		mustContain(t, "weight clear again", screen, `vendor-api: tenant "acme corp" had no operator's weight`)

		// a weight lasts 2^45µs at most: the line says what was set, as show does after it
		screen = run(cmd + "weight vendor-api 'acme corp' 2.0000001 1000000h")
		mustMatch(t, "weight for longer than the most", screen,
			`vendor-api: tenant "acme corp" now has weight 2 in every process's fair share, for 9773h26m12(\.\d)?s, `)
		t.Logf("tmux screen:\n%s", strings.TrimRight(screen, "\n"))
	})
}

// An override of a limiter of calls and tokens names each rate's unit wherever the
// command prints it: set's line, ls's OVERRIDE column and unset's line say that the
// 50000 a minute are tokens, not calls.
func TestOverrideUnits(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		lim, err := throttle.New(b.Client, "llm", throttle.PerMinute(600), throttle.WithKeyPrefix(b.Prefix),
			throttle.WithLimits(throttle.Limit{Rate: 100000, Period: time.Minute, Unit: "tokens"}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lim.Allow(context.Background()); err != nil {
			t.Fatal(err)
		}
		code, out, errs := cli(t, b, "", "set", "-for", "1h", "llm", "600/1m", "50000/1m")
		if code != 0 {
			t.Fatalf("set: status %d: %s", code, errs)
		}
		mustContain(t, "set", out, "every process now enforces 600 per 1m0s, 50000 tokens per 1m0s in place of 100000 tokens per 1m0s, for 1h0m0s")
		_, out, _ = cli(t, b, "", "ls")
		mustMatch(t, "ls", out, `\nllm +SlidingWindow +- +600/1m0s, 50000 tokens/1m0s, [\d.hm]+s more +600/1m0s,100000 tokens/1m0s\n`)
		_, out, _ = cli(t, b, "", "unset", "llm")
		mustMatch(t, "unset", out, `^llm: removed the override \(600 per 1m0s, 50000 tokens per 1m0s, [\d.hm]+s left\)`)
	})
}

// set on a key that shows a semaphore (leases held) and no limiter's record is
// refused, status 1, saying why and what acts on a semaphore: a semaphore has no rates,
// and an override would leave a record of limits no process passes, which ls and show
// would then list as a limiter's. Nothing is written.
func TestSetOnSemaphore(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		sem, err := throttle.NewSemaphore(b.Client, "jobs", 2, throttle.WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		lease, _, err := sem.TryAcquire(ctx)
		if err != nil || lease == nil {
			t.Fatal(lease, err)
		}
		defer lease.Release(ctx)
		code, out, errs := cli(t, b, "", "set", "-for", "1h", "jobs", "1/1s")
		if code != 1 || out != "" {
			t.Fatalf("set on a semaphore: status %d, printed %q; want 1 and nothing", code, out)
		}
		mustContain(t, "set on a semaphore", errs, "nothing set: the key is a Semaphore's, which has no rates", "jobthrottle pause jobs")
		_, out, _ = cli(t, b, "", "ls")
		mustMatch(t, "ls after set", out, `\njobs +Semaphore +- +- +-\n`)
		ks, err := (&tool{o: &options{prefix: b.Prefix}, rdb: b.Client}).look(ctx, "jobs", false)
		if err != nil {
			t.Fatal(err)
		}
		if ks.has(keys.State) {
			t.Fatalf("set on a semaphore wrote the key's state")
		}
	})
}
