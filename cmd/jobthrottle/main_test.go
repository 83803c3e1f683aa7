package main

import (
	"bytes"
	"context"
	"fmt"
	"github.com/jobthrottle/jobthrottle/internal/booking"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// addrEnv is the environment the command sees for backend b: REDIS_ADDR naming its
// server (the cluster's nodes, comma-separated).
func addrEnv(b *redistest.Backend) func(string) string {
	addrs, _ := b.Addrs()
	addr := strings.Join(addrs, ",")
	return func(k string) string {
		if k == "REDIS_ADDR" {
			return addr
		}
		return ""
	}
}

// cli runs the command with args (after -prefix b.Prefix) and stdin, and returns its
// exit status, stdout and stderr.
func cli(t *testing.T, b *redistest.Backend, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	args = append([]string{"-prefix", b.Prefix}, args...)
	code := run(context.Background(), args, strings.NewReader(stdin), &out, &errb, addrEnv(b))
	return code, out.String(), errb.String()
}

func mustContain(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Fatalf("%s: %q does not contain %q", what, got, w)
		}
	}
}

// lasts checks that got matches re, whose one group is a duration in (0, most]: what is
// left of something set on a key, however long the machine took since it was set.
func lasts(t *testing.T, what, got, re string, most time.Duration) {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(got)
	if m == nil {
		t.Fatalf("%s: %q does not match %q", what, got, re)
	}
	if d, err := time.ParseDuration(m[1]); err != nil || d <= 0 || d > most {
		t.Fatalf("%s: %q says %s, want a duration in (0, %v]", what, got, m[1], most)
	}
}

func mustMatch(t *testing.T, what, got, re string) {
	t.Helper()
	if !regexp.MustCompile(re).MatchString(got) {
		t.Fatalf("%s: %q does not match %q", what, got, re)
	}
}

func TestCommands(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		sw, err := throttle.New(b.Client, "vendor-api", throttle.PerMinute(10), throttle.WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sw.AllowN(ctx, 3); err != nil {
			t.Fatal(err)
		}
		if _, err := sw.Reserve(ctx, 10, 2*time.Minute); err != nil { // booked a minute ahead
			t.Fatal(err)
		}
		tb, err := throttle.New(b.Client, "mail", throttle.Limit{Rate: 5, Period: time.Minute, Burst: 8}, // its state lasts the test
			throttle.WithAlgorithm(throttle.TokenBucket), throttle.WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tb.AllowN(ctx, 2); err != nil {
			t.Fatal(err)
		}
		sem, err := throttle.NewSemaphore(b.Client, "reports", 4, throttle.WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		lease, _, err := sem.TryAcquire(ctx)
		if err != nil || lease == nil {
			t.Fatal(lease, err)
		}
		defer lease.Release(ctx)

		code, out, errs := cli(t, b, "", "ls")
		if code != 0 {
			t.Fatalf("ls: %d %s", code, errs)
		}
		mustContain(t, "ls", out, "vendor-api", "SlidingWindow", "mail", "TokenBucket", "reports", "Semaphore",
			"10/1m0s", "5/1m0s:8")

		// show needs no -limit: the key's record gives its algorithm and limits
		code, out, errs = cli(t, b, "", "show", "vendor-api")
		if code != 0 {
			t.Fatalf("show: %d %s", code, errs)
		}
		st, err := sw.Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustContain(t, "show vendor-api", out, "vendor-api  SlidingWindow", "10 per 1m0s",
			fmt.Sprintf("%d/10 used + %d booked", st.Limits[0].Used-st.Booked, st.Booked), "next free", "paused      no",
			"override    none")
		if strings.Contains(out, "granted/s") || strings.Contains(out, "screen") {
			t.Fatalf("show speaks of a rate between screens it does not have:\n%s", out)
		}

		code, out, _ = cli(t, b, "", "show", "mail")
		if code != 0 {
			t.Fatal(out)
		}
		mustContain(t, "show mail", out, "TokenBucket", "2/8 used", "paused      no", "override    none")

		code, out, _ = cli(t, b, "", "show", "-max", "4", "reports")
		if code != 0 {
			t.Fatal(out)
		}
		mustContain(t, "show reports", out, "Semaphore", "1/4 held", "waiting     0", "paused      no", "override    none")

		// pause, resume
		code, out, errs = cli(t, b, "", "pause", "vendor-api", "30s")
		if code != 0 {
			t.Fatal(errs)
		}
		// what is left of the pause when the CLI reads it back: 30s less the time
		// between the two calls, however long a loaded machine takes
		lasts(t, "pause", out, `paused vendor-api for (\S+): the whole fleet stops until then; a waiter already asleep gives its booking back and books after the pause`, 30*time.Second)
		if st, err := sw.Inspect(ctx); err != nil || st.PausedFor == 0 {
			t.Fatalf("after pause: %+v %v", st, err)
		}
		_, out, _ = cli(t, b, "", "show", "vendor-api")
		mustContain(t, "show paused", out, "paused      yes, ", "override    none")
		_, out, _ = cli(t, b, "", "resume", "vendor-api")
		lasts(t, "resume", out, `resumed vendor-api: ended its pause, which had (\S+) left\n`, 30*time.Second)
		if st, err := sw.Inspect(ctx); err != nil || st.PausedFor != 0 {
			t.Fatalf("after resume: %+v %v", st, err)
		}
		_, out, _ = cli(t, b, "", "resume", "vendor-api")
		mustContain(t, "resume again", out, "vendor-api was not paused: nothing to resume")

		// set, unset: every process's next call enforces the override
		code, out, errs = cli(t, b, "", "set", "-for", "1h", "vendor-api", "2/1m")
		if code != 0 {
			t.Fatal(errs)
		}
		mustContain(t, "set", out, "vendor-api: every process now enforces 2 per 1m0s in place of 10 per 1m0s, for 1h0m0s", "periods stay")
		if r, err := sw.Allow(ctx); err != nil || r.Allowed {
			t.Fatalf("Allow under an override of 2/s with 3 taken: %+v %v, want denied", r, err)
		}
		_, out, _ = cli(t, b, "", "show", "vendor-api")
		mustContain(t, "show overridden", out, "2 per 1m0s", "/2 used", "paused      no", "override    2 per 1m0s in place of 10 per 1m0s, ")
		mustMatch(t, "show overridden", out, `override    .*, ([\d.hms]+) more\n`)
		// pause and resume read the pause from a meta that holds an override too
		code, out, errs = cli(t, b, "", "pause", "vendor-api", "30s")
		if code != 0 {
			t.Fatalf("pause under an override: %d %s", code, errs)
		}
		mustContain(t, "pause under an override", out, "paused vendor-api for ", "the override set on it stays: 2 per 1m0s, ")
		_, out, _ = cli(t, b, "", "ls")
		mustContain(t, "ls paused under an override", out, "vendor-api")
		lasts(t, "ls paused under an override", out, `\nvendor-api +SlidingWindow +(\S+) +2/1m0s, `, 30*time.Second)
		_, out, _ = cli(t, b, "", "resume", "vendor-api")
		mustContain(t, "resume under an override", out, "resumed vendor-api: ended its pause", "the override set on it stays")
		_, out, _ = cli(t, b, "", "show", "vendor-api")
		mustContain(t, "override kept by resume", out, "paused      no", "override    2 per 1m0s in place of 10 per 1m0s, ")
		// set is checked against the record: the periods, the number of limits, a burst
		code, _, errs = cli(t, b, "", "set", "vendor-api", "2/1s")
		if code != 1 {
			t.Fatalf("set with another period: status %d", code)
		}
		mustContain(t, "set 2/1s", errs, "an override changes rates, not periods", "the key's limits (its record) are 10/1m0s")
		if strings.Contains(errs, "jobthrottle: jobthrottle:") {
			t.Fatalf("set 2/1s: %q says jobthrottle twice", errs)
		}
		code, _, errs = cli(t, b, "", "set", "vendor-api", "2/1m", "5/1h")
		if code != 1 {
			t.Fatalf("set of two limits on a key of one: status %d", code)
		}
		mustContain(t, "set of two", errs, "2 limits to override, the limiter has 1")
		code, _, errs = cli(t, b, "", "set", "vendor-api", "2/1m:4")
		if code != 1 {
			t.Fatalf("set with a burst on a sliding window: status %d", code)
		}
		mustContain(t, "set burst", errs, "a burst is a TokenBucket's")
		code, out, errs = cli(t, b, "", "set", "-for", "1m", "mail", "3/1m:6")
		if code != 0 {
			t.Fatal(errs)
		}
		mustContain(t, "set mail", out, "3 per 1m0s (burst 6) in place of 5 per 1m0s (burst 8)")
		_, out, _ = cli(t, b, "", "show", "mail")
		mustContain(t, "show mail overridden", out, "3 per 1m0s (burst 6)", "/6 used")
		if _, _, errs = cli(t, b, "", "unset", "mail"); errs != "" {
			t.Fatal(errs)
		}
		// set and unset ran the bucket's own script with its own head, as Override and
		// ClearOverride do in a process: the meta holds that head alone, no override and
		// no other head (drift) after them
		if _, meta, _ := strings.Cut(b.Client.Get(ctx, "{"+b.Prefix+"mail}:l").Val(), "\n"); meta != "tb 5 60000000 8" {
			t.Fatalf("mail's meta after set and unset: %q, want its head alone", meta)
		}

		_, out, _ = cli(t, b, "", "unset", "vendor-api")
		mustContain(t, "unset", out, "vendor-api: removed the override (2 per 1m0s, ", " left); the rates the code passes apply again")
		_, out, _ = cli(t, b, "", "unset", "vendor-api")
		mustContain(t, "unset again", out, "vendor-api had no override")
		if st, err := sw.Inspect(ctx); err != nil || st.Override != 0 || st.Limits[0].Limit.Rate != 10 {
			t.Fatalf("after unset: %+v %v", st, err)
		}
		// -limit shows the state as other limits read it
		_, out, _ = cli(t, b, "", "show", "-limit", "20/1m", "vendor-api")
		mustContain(t, "show -limit", out, "20 per 1m0s", "/20 used")

		// watch: two screens
		code, out, errs = cli(t, b, "", "watch", "-interval", "20ms", "-count", "2", "vendor-api")
		if code != 0 {
			t.Fatal(errs)
		}
		if n := strings.Count(out, "jobthrottle watch"); n != 2 {
			t.Fatalf("watch -count 2 printed %d screens:\n%s", n, out)
		}
		mustContain(t, "watch", out, "\033[H\033[2J", "granted/s   from the next screen on", "granted/s   0.0")

		// reset asks; "n" keeps, "y" deletes
		_, out, _ = cli(t, b, "n\n", "reset", "mail")
		mustContain(t, "reset n", out, "[y/N]", "not reset")
		if n := b.Client.Exists(ctx, "{"+b.Prefix+"mail}:l").Val(); n != 1 {
			t.Fatalf("reset answered n deleted the key")
		}
		_, out, _ = cli(t, b, "y\n", "reset", "mail")
		mustContain(t, "reset y", out, "reset mail: deleted {"+b.Prefix+"mail}:l\n")
		if n := b.Client.Exists(ctx, "{"+b.Prefix+"mail}:l").Val(); n != 0 {
			t.Fatalf("reset left mail's state, with nothing set on it")
		}
		if _, err := sw.Reserve(booking.With(ctx, &booking.Task{ID: "task-1"}), 1, 2*time.Minute); err != nil { // a task's booking goes too
			t.Fatal(err)
		}
		// what is set on the key stays: the pause, in the state's meta alone
		if code, _, errs = cli(t, b, "", "pause", "vendor-api", "1h"); code != 0 {
			t.Fatal(errs)
		}
		_, out, _ = cli(t, b, "", "reset", "-yes", "vendor-api")
		mustContain(t, "reset -yes", out, "reset vendor-api: deleted the counts of {"+b.Prefix+"vendor-api}:l, 1 booking ({"+b.Prefix+"vendor-api}:bk:*)\n",
			"kept what is set on it: the pause (")
		if n := b.Client.Exists(ctx, "{"+b.Prefix+"vendor-api}:bk:task-1").Val(); n != 0 {
			t.Fatalf("reset left the task's booking")
		}
		if st, err := sw.Inspect(ctx); err != nil || st.Limits[0].Used != 0 || st.Booked != 0 || st.PausedFor == 0 {
			t.Fatalf("after reset: %+v %v, want nothing used or booked, the pause kept", st, err)
		}
		// the record stays with what is set on the key: the idle key is still shown,
		// with its limits
		code, out, errs = cli(t, b, "", "show", "vendor-api")
		if code != 0 {
			t.Fatalf("show after reset: %d %s", code, errs)
		}
		mustContain(t, "show idle", out, "vendor-api  SlidingWindow", "10 per 1m0s", "0/10 used", "paused      yes, ")
		_, out, _ = cli(t, b, "", "ls")
		mustMatch(t, "ls idle", out, `vendor-api +SlidingWindow \(idle\) +[\d.hms]+ +- +10/1m0s\n`)
		_, out, _ = cli(t, b, "", "reset", "-yes", "vendor-api")
		mustContain(t, "reset of an idle key", out, "vendor-api has no state to reset (idle); what is set on it stays: the pause (")
	})
}

// Mistakes get a clear message and a non-zero status: a wrong address, an unknown
// key, a key of another type, limits not given, bad usage.
func TestErrors(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		code, _, errs := cli(t, b, "", "show", "-limit", "10/1s", "nosuchkey")
		if code != 1 {
			t.Fatalf("unknown key: status %d", code)
		}
		mustContain(t, "unknown key", errs, `unknown key "nosuchkey"`, "jobthrottle ls")

		if err := b.Client.HSet(ctx, "{"+b.Prefix+"wrong}:l", "a", "b").Err(); err != nil {
			t.Fatal(err)
		}
		code, _, errs = cli(t, b, "", "show", "-limit", "10/1s", "wrong")
		if code != 1 {
			t.Fatalf("key of another type: status %d", code)
		}
		mustContain(t, "another type", errs, "left alone: {"+b.Prefix+"wrong}:l is not jobthrottle's (a hash, not a list or string)")
		code, _, errs = cli(t, b, "", "show", "wrong") // no record, no -limit: still said plainly
		if code != 1 {
			t.Fatalf("key of another type, no -limit: status %d", code)
		}
		mustContain(t, "another type, no -limit", errs, "left alone: {"+b.Prefix+"wrong}:l is not jobthrottle's (a hash, not a list or string)")

		sw, _ := throttle.New(b.Client, "nolimits", throttle.PerSecond(10), throttle.WithKeyPrefix(b.Prefix))
		if _, err := sw.Allow(ctx); err != nil {
			t.Fatal(err)
		}
		code, out, errs := cli(t, b, "", "show", "nolimits")
		if code != 0 {
			t.Fatalf("show with the key's record: status %d: %s", code, errs)
		}
		mustContain(t, "show by record", out, "10 per 1s")
		// -alg of another algorithm than the state's: the limits as it takes them are asked for
		code, _, errs = cli(t, b, "", "show", "-alg", "tb", "nolimits")
		if code != 1 {
			t.Fatalf("-alg of another algorithm, no -limit: status %d", code)
		}
		mustContain(t, "-alg tb", errs, `key "nolimits" holds SlidingWindow state: give -limit with -alg tb`)
		// no state (a pause set on a key nobody uses): no record of its limits, so -alg
		// needs -limit; set is not checked against limits it does not know
		if code, _, errs = cli(t, b, "", "pause", "unused", "1m"); code != 0 {
			t.Fatalf("pause an unused key: status %d: %s", code, errs)
		}
		code, _, errs = cli(t, b, "", "show", "-alg", "sw", "unused")
		if code != 1 {
			t.Fatalf("no record, no -limit: status %d", code)
		}
		mustContain(t, "no record", errs, `key "unused" has no record of its limits`, "-limit RATE/PERIOD")
		code, out, errs = cli(t, b, "", "set", "unused", "5/1s")
		if code != 0 {
			t.Fatalf("set without a record: status %d: %s", code, errs)
		}
		mustContain(t, "set without a record", out, "unused has no record of its limits: the number of limits and their periods were not checked")

		code, _, errs = cli(t, b, "", "show", "-limit", "ten/1s", "nolimits")
		if code != 2 {
			t.Fatalf("bad -limit: status %d", code)
		}
		mustContain(t, "bad -limit", errs, `rate "ten"`)

		code, out, _ = cli(t, b, "", "-prefix", "nothing-here:", "ls") // the later -prefix wins
		if code != 0 {
			t.Fatalf("ls of an empty prefix: status %d", code)
		}
		mustContain(t, "ls of an empty prefix", out, "no jobthrottle keys match {nothing-here:*}:*", "give it with -prefix")

		code, _, errs = cli(t, b, "", "frobnicate")
		if code != 2 {
			t.Fatalf("unknown command: status %d", code)
		}
		mustContain(t, "unknown command", errs, `unknown command "frobnicate"`, "see 'jobthrottle --help'")

		code, _, errs = cli(t, b, "", "pause", "nolimits", "-3s")
		if code == 0 {
			t.Fatal("pause -3s succeeded")
		}
	})
	// a port nobody listens on
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().(*net.TCPAddr)
	l.Close()
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"-h", "127.0.0.1", "-p", fmt.Sprint(addr.Port), "ls"}, nil, &out, &errb, func(string) string { return "" })
	if code != 1 {
		t.Fatalf("wrong address: status %d", code)
	}
	mustContain(t, "wrong address", errb.String(), "cannot reach Redis at 127.0.0.1:"+fmt.Sprint(addr.Port), "connection refused")
	if strings.Count(errb.String(), "\n") != 1 {
		t.Fatalf("wrong address: want one line, got %q", errb.String())
	}
}

func TestParseLimit(t *testing.T) {
	for _, c := range []struct {
		in   string
		want throttle.Limit
		err  bool
	}{
		{"20/1.1s", throttle.Limit{Rate: 20, Period: 1100 * time.Millisecond}, false},
		{"100/m", throttle.PerMinute(100), false},
		{"10/s:20", throttle.Limit{Rate: 10, Period: time.Second, Burst: 20}, false},
		{"10", throttle.Limit{}, true},
		{"0/1s", throttle.Limit{}, true},
		{"10/0s", throttle.Limit{}, true},
		{"10/1s:x", throttle.Limit{}, true},
	} {
		got, err := parseLimit(c.in)
		if (err != nil) != c.err || (!c.err && got != c.want) {
			t.Errorf("parseLimit(%q) = %v, %v; want %v, error %v", c.in, got, err, c.want, c.err)
		}
	}
}

// buildCLI builds the command into a directory of the test's and returns its path;
// it skips the test when tmux, which drives it as a person would, is not installed.
func buildCLI(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux is not installed: the command's screens are checked through run only")
	}
	bin := filepath.Join(t.TempDir(), "jobthrottle")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// terminal is a tmux session, 200 columns by 50 lines, as an operator's terminal. It
// has a tmux server of its own (its socket named after it), so that no other tmux
// user of the machine, nor the end of another terminal's server, touches it.
type terminal struct {
	t       *testing.T
	session string
}

// newTerminal starts a tmux session running cmd (a shell command line); it ends with
// the test.
func newTerminal(t *testing.T, cmd string) *terminal {
	t.Helper()
	tm := &terminal{t: t, session: fmt.Sprintf("jt-test-%d-%s", os.Getpid(), strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()))}
	if out, err := tm.tmux("new-session", "-d", "-s", tm.session, "-x", "200", "-y", "50", cmd).CombinedOutput(); err != nil {
		t.Fatalf("tmux new-session: %v\n%s", err, out)
	}
	t.Cleanup(func() { tm.tmux("kill-server").Run() })
	return tm
}

// tmux is a tmux command on the terminal's own server.
func (tm *terminal) tmux(args ...string) *exec.Cmd {
	return exec.Command("tmux", append([]string{"-L", tm.session}, args...)...)
}

// screen returns what the terminal shows.
func (tm *terminal) screen() string {
	out, err := tm.tmux("capture-pane", "-p", "-t", tm.session).Output()
	if err != nil {
		tm.t.Fatalf("tmux capture-pane: %v", err)
	}
	return string(out)
}

// typeLine types line and Enter, as a person would.
func (tm *terminal) typeLine(line string) {
	tm.t.Helper()
	if out, err := tm.tmux("send-keys", "-t", tm.session, "-l", line).CombinedOutput(); err != nil {
		tm.t.Fatalf("tmux send-keys: %v\n%s", err, out)
	}
	if out, err := tm.tmux("send-keys", "-t", tm.session, "Enter").CombinedOutput(); err != nil {
		tm.t.Fatalf("tmux send-keys Enter: %v\n%s", err, out)
	}
}

// waitFor returns the screen once ok accepts it, polling for up to 10s (a busy
// machine builds and starts the command late); after that it fails the test.
func (tm *terminal) waitFor(what string, ok func(screen string) bool) string {
	tm.t.Helper()
	var s string
	for i := 0; i < 100; i++ {
		if s = tm.screen(); ok(s) {
			return s
		}
		time.Sleep(100 * time.Millisecond)
	}
	tm.t.Fatalf("%s: not on the screen in 10s:\n%s", what, s)
	return s
}

// Driven as a person would: the built command runs watch in a tmux session against
// a redis-server where a limiter is busy; the screen tmux shows has the key's block,
// and is redrawn (its clock line changes). Skips when tmux is not installed.
func TestWatchInTmux(t *testing.T) {
	bin := buildCLI(t)
	b := redistest.NewStandalone(t)
	ctx := context.Background()
	lim, err := throttle.New(b.Client, "vendor-api", throttle.PerSecond(20), throttle.WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // a busy worker: 20 grants a second, booked ahead
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			_ = lim.Wait(wctx)
			cancel()
		}
	}()
	defer func() { close(stop); <-done }()

	env := "REDIS_ADDR=" + b.Client.(*redis.Client).Options().Addr
	tm := newTerminal(t, fmt.Sprintf("env %s %s -prefix %s watch vendor-api", env, bin, b.Prefix)) // the limits: the key's record
	// the first screen comes after a Redis call: wait for it, then for a redraw
	first := tm.waitFor("the first screen", func(s string) bool { return strings.Contains(s, "granted/s") })
	mustContain(t, "tmux screen", first, "jobthrottle watch", "vendor-api  SlidingWindow", "20 per 1s", "[", "next free", "paused      no")
	second := tm.waitFor("a redrawn screen", func(s string) bool {
		return strings.Contains(s, "granted/s") && firstLine(s) != firstLine(first)
	})
	t.Logf("tmux screen:\n%s", second)

	// an operator lowers the rate in another terminal: the watch screen shows it
	// at its next redraw
	set := exec.Command(bin, "-prefix", b.Prefix, "set", "-for", "1m", "vendor-api", "5/1s")
	set.Env = append(os.Environ(), env)
	if out, err := set.CombinedOutput(); err != nil {
		t.Fatalf("set: %v\n%s", err, out)
	}
	third := tm.waitFor("the override", func(s string) bool { return strings.Contains(s, "in place of") })
	mustContain(t, "tmux screen after set", third, "5 per 1s", "override    5 per 1s in place of 20 per 1s, ")
	t.Logf("tmux screen after set:\n%s", third)
}

func firstLine(s string) string {
	s = strings.TrimLeft(s, "\n")
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// An override set by the command is enforced by a running fleet from each process's
// next call: four workers (each its own client, as four processes) call Allow every
// 30ms on a key of 100 per 300ms, well under it (about 40 per 300ms in all), when
// `jobthrottle set KEY 5/300ms` runs. The first call each worker sends after the
// command returned is decided under 5 per 300ms (Remaining at most 4, where the old
// limit would leave about 60), and no 300ms window holds more than 5 of the grants
// decided after it. Grant times are the server's (script replies), so the machine's
// load changes how many calls there are, not the checks.
func TestFleetOverrideByCLI(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		const period = 300 * time.Millisecond
		addrs, cluster := b.Addrs()
		type call struct {
			sent, back time.Time // sent, and its reply read
			res        throttle.Result
		}
		var calls [4][]call
		var grants [4]*redistest.Grants
		stop := make(chan struct{})
		done := make(chan error, 4)
		for w := range calls {
			c := redistest.Dial(addrs, cluster)
			defer c.Close()
			grants[w] = redistest.RecordGrants(c)
			l, err := throttle.New(c, "fleet-cli", throttle.Limit{Rate: 100, Period: period}, throttle.WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				tick := time.NewTicker(30 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						done <- nil
						return
					case <-tick.C:
					}
					sent := time.Now()
					res, err := l.Allow(ctx)
					if err != nil {
						done <- err
						return
					}
					calls[w] = append(calls[w], call{sent, time.Now(), res})
				}
			}()
		}
		time.Sleep(2 * period)
		before := time.Now() // calls answered before this were decided under the old limit
		code, out, errs := cli(t, b, "", "set", "-for", "1m", "fleet-cli", "5/300ms")
		changed := time.Now() // calls sent after this are decided under the override
		if code != 0 {
			t.Fatalf("set: %d %s", code, errs)
		}
		mustContain(t, "set", out, "every process now enforces 5 per 300ms")
		time.Sleep(6 * period) // each worker calls again unless stalled for 1.7s
		close(stop)
		for range calls {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		for w, cs := range calls {
			i := slices.IndexFunc(cs, func(c call) bool { return c.sent.After(changed) })
			if i < 0 {
				t.Fatalf("worker %d made no call after the override", w)
			}
			if r := cs[i].res; r.Remaining > 4 {
				t.Fatalf("worker %d's first call after the override: %+v, want Remaining <= 4 (decided under 5 per %v)", w, r, period)
			}
			// answered before the command ran (a call sent before it but stalled on a
			// loaded machine can be decided under the override: seen at load 7)
			j := slices.IndexFunc(cs, func(c call) bool { return !c.back.Before(before) }) - 1
			if j < 0 || cs[j].res.Remaining < 10 {
				t.Fatalf("worker %d's last call before the override: %v: the old limit was not far from full, the check proves nothing", w, cs[max(j, 0)])
			}
		}
		var after []time.Time
		for _, g := range grants {
			for _, gr := range g.List() {
				if gr.Sent.After(changed) {
					after = append(after, gr.At)
				}
			}
		}
		slices.SortFunc(after, func(a, b time.Time) int { return a.Compare(b) })
		most := redistest.MaxTimesInWindow(after, period)
		if most > 5 || len(after) == 0 {
			t.Fatalf("%d grants decided under the override, %d in one window of %v: want 1..5", len(after), most, period)
		}
		redistest.Figure(t, "fleet override by the CLI (%s): 4 workers; first call after `set` of each decided under it; %d grants after it, at most %d in any %v (override 5)",
			b.Kind, len(after), most, period)
	})
}

// watch's rate line: permits that took effect between two screens (granted at once,
// or booked earlier and come due), and the grants made (bookings included). A
// backlog booked ahead before the first screen takes effect at the limit's pace
// while no new grant is made.
func TestRenderRate(t *testing.T) {
	at := time.Unix(1_700_000_000, 0)
	st := func(booked int) *throttle.LimiterState {
		return &throttle.LimiterState{Algorithm: throttle.SlidingWindow, Booked: booked,
			Limits: []throttle.LimitState{{Limit: throttle.PerSecond(10), Capacity: 10, Used: 10 + booked}}}
	}
	for _, c := range []struct {
		prevTotal, total int64
		prevBooked       int
		booked           int
		want             string
	}{
		{100, 100, 50, 40, "granted/s   10.0 took effect, 0.0 new grants"}, // the backlog comes due
		{100, 110, 0, 0, "granted/s   10.0 took effect, 10.0 new grants"},  // granted at once
		{100, 120, 0, 20, "granted/s   0.0 took effect, 20.0 new grants"},  // booked ahead
	} {
		tg := &target{key: "k", ks: &keyset{key: "k", ours: map[string]*entry{}}}
		prev := &view{tg: tg, lim: st(c.prevBooked), total: c.prevTotal, at: at}
		v := &view{tg: tg, lim: st(c.booked), total: c.total, at: at.Add(time.Second)}
		var b strings.Builder
		v.render(&b, prev, true)
		mustContain(t, "render", b.String(), c.want)
	}
}
