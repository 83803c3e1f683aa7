package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"github.com/jobthrottle/jobthrottle/internal/booking"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// aclUser makes a Redis user with exactly rules (and a password) on b's server (every
// node of a cluster), for the test's life, and returns the flags that log in as it.
func aclUser(t *testing.T, b *redistest.Backend, rules string) []string {
	t.Helper()
	ctx := context.Background()
	var r [4]byte
	_, _ = rand.Read(r[:])
	name, pw := "jt-op-"+hex.EncodeToString(r[:]), "pw-"+hex.EncodeToString(r[:])
	args := []any{"ACL", "SETUSER", name, "reset", "on", ">" + pw}
	for _, f := range strings.Fields(rules) {
		args = append(args, f)
	}
	each := func(f func(c doer) error) error { return f(b.Client) }
	if c, ok := b.Client.(*redis.ClusterClient); ok {
		each = func(f func(c doer) error) error {
			return c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return f(n) })
		}
	}
	if err := each(func(c doer) error { return c.Do(ctx, args...).Err() }); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() {
		each(func(c doer) error { return c.Do(context.Background(), "ACL", "DELUSER", name).Err() })
	})
	return []string{"--user", name, "-a", pw}
}

// doer is a client or a cluster's node.
type doer interface {
	Do(ctx context.Context, args ...any) *redis.Cmd
}

// seed makes the keys every command acts on: a sliding window with bookings, a
// token bucket and a semaphore with a lease.
func seed(t *testing.T, b *redistest.Backend) {
	t.Helper()
	ctx := context.Background()
	sw, err := throttle.New(b.Client, "vendor-api", throttle.PerMinute(10), throttle.WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sw.AllowN(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := sw.Reserve(booking.With(ctx, &booking.Task{ID: "task-1"}), 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	tb, err := throttle.New(b.Client, "mail", throttle.Limit{Rate: 5, Period: time.Minute, Burst: 8},
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
	t.Cleanup(func() { lease.Release(context.Background()) })
}

// every is each command once, in an order that leaves something for the next.
var every = [][]string{
	{"ls"}, {"show", "vendor-api"}, {"show", "mail"}, {"show", "-max", "4", "reports"},
	{"watch", "-count", "2", "-interval", "10ms", "vendor-api", "mail", "reports"},
	{"pause", "vendor-api", "30s"}, {"resume", "vendor-api"}, {"set", "-for", "1m", "vendor-api", "5/1m"},
	{"unset", "vendor-api"}, {"reset", "-yes", "vendor-api"}, {"reset", "-yes", "reports"},
}

// On a real redis-server (and a cluster), a user with exactly throttle.ACLRules and
// cliRules (throttle.ACLRules grants what a cluster client needs) runs every command; a user without one of
// cliRules is told NOPERM and the rule missing by the commands that need it, and no
// command calls that "cannot reach Redis".
func TestACL(t *testing.T) {
	for _, k := range []redistest.Kind{redistest.Standalone, redistest.Cluster} {
		t.Run(string(k), func(t *testing.T) { testACL(t, redistest.New(t, k)) })
	}
}

func testACL(t *testing.T, b *redistest.Backend) {
	seed(t, b)
	as := aclUser(t, b, throttle.ACLRules(b.Prefix)+" "+cliRules)
	for _, args := range every {
		code, out, errs := cli(t, b, "", append(as, args...)...)
		if code != 0 || errs != "" {
			t.Fatalf("%v as a user with ACLRules and %s: status %d: %s\n%s", args, cliRules, code, errs, out)
		}
	}
	seed(t, b) // reset deleted some
	for _, rule := range strings.Fields(cliRules) {
		as := aclUser(t, b, throttle.ACLRules(b.Prefix)+" "+strings.Replace(cliRules, rule, "", 1))
		refused := 0
		for _, args := range every {
			code, _, errs := cli(t, b, "", append(as, args...)...)
			if code == 0 {
				continue
			}
			refused++
			if code != 1 || !strings.Contains(errs, "jobthrottle: NOPERM: the Redis user lacks "+rule+" (") ||
				strings.Contains(errs, "cannot reach") || strings.Count(errs, "\n") != 1 {
				t.Errorf("%v without %s: status %d: %q; want 1 and one line naming NOPERM and %s", args, rule, code, errs, rule)
			}
		}
		if refused == 0 {
			t.Errorf("every command ran without %s: it is not needed", rule)
		}
	}
	// and the keys: a user whose key pattern is another prefix's
	as = aclUser(t, b, throttle.ACLRules("other:")+" "+cliRules)
	code, _, errs := cli(t, b, "", append(as, "show", "vendor-api")...)
	if code != 1 || !strings.Contains(errs, "NOPERM: the Redis user lacks access to the keys (~{"+b.Prefix+"*)") {
		t.Errorf("show as a user of another prefix: status %d: %q", code, errs)
	}
	// a wrong password is a refused login, not an unreachable Redis
	code, _, errs = cli(t, b, "", append(as[:3:3], "wrong", "ls")...)
	if code != 1 || !strings.Contains(errs, "refused the login: WRONGPASS") || strings.Contains(errs, "cannot reach") {
		t.Errorf("wrong password: status %d: %q", code, errs)
	}
}

// docs/operating.md gives the ACL SETUSER lines of a worker and of the command as
// throttle.ACLRules and cliRules make them.
func TestOperatingDocACL(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	worker := "ACL SETUSER worker on >secret " + throttle.ACLRules("jobthrottle:") + "\n"
	operator := "ACL SETUSER operator on >secret " + throttle.ACLRules("jobthrottle:") + " " + cliRules + "\n"
	for _, line := range []string{worker, operator} {
		if !strings.Contains(string(doc), line) {
			t.Errorf("docs/operating.md lacks the line\n%s", line)
		}
	}
	if !strings.Contains(string(doc), "`"+cliRules+"`") {
		t.Errorf("docs/operating.md does not name the rules %q", cliRules)
	}
}
