package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

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
		run := func(line string) string {
			t.Helper()
			tm.typeLine("clear")
			tm.typeLine(line + "; echo status $?")
			return tm.waitFor(line, func(s string) bool { return strings.Contains(s, "\nstatus ") })
		}

		screen := run("jobthrottle -prefix " + b.Prefix + " ls")
		lines := strings.Split(screen, "\n")
		header := lines[lineWith(lines, "KEY ")]
		col := strings.Index(header, "KIND")
		for _, want := range []string{"vendor-api", `"tenant\n7"`, `"tab\there"`, `"two words"`} {
			i := lineWith(lines, want+" ")
			if i < 0 {
				t.Fatalf("ls does not list %s on a row of its own:\n%s", want, screen)
			}
			if got := strings.Index(lines[i], "SlidingWindow"); got != col {
				t.Fatalf("ls: the row of %s has its kind at column %d, the header at %d:\n%s", want, got, col, screen)
			}
		}
		mustContain(t, "ls", screen, "status 0")
		t.Logf("ls:\n%s", strings.TrimRight(screen, "\n"))

		screen = run("jobthrottle -prefix " + b.Prefix + " pause vendor-api -5s")
		mustContain(t, "pause -5s", screen, "jobthrottle: pause vendor-api: -5s is not a positive duration: a pause lasts that long from now (e.g. 30s, 5m); 'jobthrottle resume vendor-api' ends one (see 'jobthrottle help pause')", "status 2")

		screen = run("jobthrottle -prefix " + b.Prefix + ` pause $'tenant\n7' 30s`)
		mustMatch(t, "pause a key with a newline", screen, `paused "tenant\\n7" for (30s|29(\.\d+)?s): no new grants`)
		mustContain(t, "pause a key with a newline", screen, `'jobthrottle resume "tenant\n7"' ends it sooner`, "status 0")
		screen = run("jobthrottle -prefix " + b.Prefix + " ls")
		lines = strings.Split(screen, "\n")
		if i := lineWith(lines, `"tenant\n7" `); i < 0 || !strings.Contains(lines[i], "29") && !strings.Contains(lines[i], "30s") {
			t.Fatalf("ls does not show the pause on the key's row:\n%s", screen)
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
