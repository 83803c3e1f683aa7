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
		mustMatch(t, "pause a key with a newline", screen, `paused "tenant\\n7" for [\d.]+s: no new grants`)
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
