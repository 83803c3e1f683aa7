package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// show says exactly what is set on a key: neither a pause nor an override, a pause,
// an override, or both, each with the time it has left; a semaphore and a key that
// holds only a control key too. It says nothing of screens it does not have.
func TestShowControl(t *testing.T) {
	const (
		pause30 = `(30s|29(\.\d)?s) more`
		hour    = `(1h0m0s|59m\d+(\.\d)?s) more`
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

		// a semaphore: a pause, and an override, which changes nothing there
		sem, err := throttle.NewSemaphore(b.Client, "jobs", 2, throttle.WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		lease, _, err := sem.TryAcquire(ctx)
		if err != nil || lease == nil {
			t.Fatal(lease, err)
		}
		defer lease.Release(ctx)
		mustMatch(t, "semaphore", show("semaphore", "show", "-max", "2", "jobs"), `1/2 held\n  waiting     0\n.*\n  paused      no\n  override    none\n`)
		step("pause", "jobs", "30s")
		step("set", "-for", "1h", "jobs", "1/1s")
		mustMatch(t, "semaphore paused", show("semaphore paused", "show", "jobs"),
			`\n  paused      yes, `+pause30+`\n  override    set, `+hour+`, but a semaphore has no rates: it changes nothing here\n`)

		// a key with nothing but a control key (a pause set on a key not in use)
		step("pause", "idle", "30s")
		out = show("control key only", "show", "idle")
		mustContain(t, "control key only", out, "idle  (no state and no record of its limits")
		mustMatch(t, "control key only", out, `\n  paused      yes, `+pause30+`\n  override    none\n`)
	})
}
