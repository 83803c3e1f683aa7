package throttle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
)

// aclWorkload runs everything the library does with Redis, every path of every
// script: each algorithm's grants, denials, bookings ahead and cancels, a permit log
// long enough to be searched, trimmed, merged into and emptied, pauses, the scripts run again
// after a SCRIPT FLUSH (EVAL), a semaphore's leases, queue, hand-off (PUBLISH), wake-up
// subscription, extension and release. admin flushes the scripts. It returns the
// first error of each algorithm's part and of the semaphore's (each goes on to its
// end regardless); each part has 3 seconds.
func aclWorkload(ctx context.Context, c, admin *redis.Client, run string) []error {
	var errs []error
	failed := false
	note := func(what string, err error) {
		if err != nil && !failed {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			failed = true
		}
	}
	// a step's deadline only bounds a call that would hang; calls
	// now return by their deadline (ErrUnavailable), so it must outlast a step on a
	// machine other suites starve (3s did not, once: 10s for two steps)
	step := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 30*time.Second) }
	for _, alg := range allAlgorithms {
		// 40 per 200ms: grants spread over two halves of a period, so that a later
		// grant trims some (LTRIM) and a denial searches the log (LINDEX, LLEN)
		l, err := New(c, run+"-"+alg.String(), Limit{Rate: 40, Period: 200 * time.Millisecond}, WithAlgorithm(alg))
		if err != nil {
			return append(errs, err)
		}
		cctx, cancel := step()
		failed = false
		for i := 0; i < 20; i++ {
			_, err := l.AllowN(cctx, 1)
			note(alg.String()+" AllowN", err)
		}
		time.Sleep(120 * time.Millisecond)
		_, err = l.AllowN(cctx, 2) // one entry of two permits
		note(alg.String()+" AllowN(2)", err)
		for i := 0; i < 18; i++ {
			_, err := l.AllowN(cctx, 1)
			note(alg.String()+" AllowN", err)
		}
		// denied whatever the machine's speed (the last grant is in the window): the
		// wait is searched for (LLEN, LINDEX)
		_, err = l.AllowN(cctx, 40)
		note(alg.String()+" denied AllowN", err)
		var held []*waiter.Reservation
		for i := 0; i < 3; i++ { // bookings ahead
			r, err := l.Reserve(cctx, 1, time.Second)
			note(alg.String()+" Reserve", err)
			if err == nil {
				held = append(held, r)
			}
		}
		_, err = l.Inspect(cctx) // read only, PTTL
		note(alg.String()+" Inspect", err)
		for _, r := range held {
			note(alg.String()+" Cancel", r.Cancel(cctx))
		}
		// a booking at the end of a pause (20s: it outlasts any step) stays in the
		// window; once every earlier grant has left it, the next booking trims them
		// (LTRIM: not all of the log has expired) and lands on the same time (LSET)
		note(alg.String()+" Pause", l.Pause(cctx, 20*time.Second))
		ahead, err := l.Reserve(cctx, 1, time.Minute)
		note(alg.String()+" Reserve after a pause", err)
		time.Sleep(210 * time.Millisecond) // every grant before the pause has left the window
		trims, err := l.Reserve(cctx, 1, time.Minute)
		note(alg.String()+" Reserve that trims", err)
		for _, r := range []*waiter.Reservation{ahead, trims} {
			if r != nil {
				note(alg.String()+" Cancel after a pause", r.Cancel(cctx))
			}
		}
		note("SCRIPT FLUSH", admin.ScriptFlush(cctx).Err())
		_, err = l.AllowN(cctx, 0) // EVAL, the script being gone
		note(alg.String()+" AllowN after SCRIPT FLUSH", err)
		// a log whose every entry has left the window while its key lives on: the
		// grant drops it whole (UNLINK). A key's TTL ends within a millisecond of its
		// last entry's window, so waiting for that state is luck (a loaded machine
		// missed it); it is written here instead, as [base 0, T1 1µs, S1 1] (LPUSH
		// pushes in reverse; not a command of the library's: the census leaves it out).
		stale, err := New(c, run+"-stale-"+alg.String(), Limit{Rate: 40, Period: 200 * time.Millisecond}, WithAlgorithm(alg))
		if err != nil {
			return append(errs, err)
		}
		if alg == SlidingWindow || alg == SlidingCounter { // the algorithms of lua/log.lua
			note("LPUSH (the test's)", admin.LPush(cctx, stale.keys[0], 1, 1, 0).Err())
		}
		_, err = stale.AllowN(cctx, 1)
		note(alg.String()+" AllowN on an expired log", err)
		// a booking after a pause on a fresh key, given back: the log is empty (DEL)
		fresh, err := New(c, run+"-fresh-"+alg.String(), Limit{Rate: 40, Period: 200 * time.Millisecond}, WithAlgorithm(alg))
		if err != nil {
			return append(errs, err)
		}
		// two bookings after a pause land on its end, one entry (LSET), whatever the
		// machine's speed: the pause outlasts any step (20s); given back, the first
		// leaves one permit in the entry, the second none: the log is empty (DEL)
		note(alg.String()+" Pause", fresh.Pause(cctx, 20*time.Second))
		var booked []*waiter.Reservation
		for i := 0; i < 2; i++ {
			if r, err := fresh.Reserve(cctx, 1, time.Minute); err != nil {
				note(alg.String()+" Reserve after a pause", err)
			} else {
				booked = append(booked, r)
			}
		}
		for _, r := range booked {
			note(alg.String()+" Cancel after a pause", r.Cancel(cctx))
		}
		cancel()
	}

	sem, err := NewSemaphore(c, run+"-sem", 1, WithLeaseTTL(time.Second))
	if err != nil {
		return append(errs, err)
	}
	cctx, cancel := step()
	defer cancel()
	failed = false
	lease, _, err := sem.TryAcquire(cctx)
	note("Semaphore TryAcquire", err)
	if lease != nil {
		note("Lease Extend", lease.Extend(cctx))
	}
	_, err = sem.Inspect(cctx)
	note("Semaphore Inspect", err)
	queued := newLeaseID()                                   // takes a place in the queue (its own call, whether or not
	_, err = sem.call(cctx, semAcquire, queued, true, false) // the wake-up subscription works)
	note("queued acquire", err)
	var wg sync.WaitGroup
	var waited error
	wg.Add(1)
	go func() { // waits in the queue behind it, subscribed
		defer wg.Done()
		l, err := sem.Acquire(cctx)
		if err == nil {
			err = l.Release(cctx)
		}
		waited = err
	}()
	time.Sleep(100 * time.Millisecond)
	if lease != nil {
		note("Lease Release", lease.Release(cctx)) // hands the slot to queued (PUBLISH)
	}
	_, err = sem.call(cctx, semRelease, queued, false, false) // and on to the waiter
	note("queued release", err)
	wg.Wait()
	note("Semaphore Acquire", waited)
	return errs
}

// aclUser creates (or replaces) user with password "pw" and rules.
func aclUser(ctx context.Context, admin *redis.Client, user, rules string) error {
	args := []any{"ACL", "SETUSER", user, "reset", "on", ">pw"}
	for _, r := range strings.Fields(rules) {
		args = append(args, r)
	}
	return admin.Do(ctx, args...).Err()
}

// Least privilege, on a real redis-server of the test's own:
//   - the commands the library uses, counted by INFO commandstats over the whole
//     workload, are exactly those ACLRules grants;
//   - a user with ACLRules("jobthrottle:") and nothing else runs the workload without
//     an error;
//   - a user missing any one command, the key pattern or the channel pattern gets an
//     error wrapping ErrNoPermission (never ErrUnavailable) that names what is
//     missing, as Redis does (Redis 7.0 does not name a command a script was refused:
//     its text then is Redis's "can't run this command"), and nothing hangs; except
//     SUBSCRIBE and UNSUBSCRIBE, whose refusal only slows Acquire's wake-up to its
//     renewal timer (logged, with the wait it cost).
func TestACLLeastPrivilege(t *testing.T) {
	s, admin := startOwnServer(t)
	ctx := context.Background()

	// the census, as a user with every permission
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	full := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer full.Close()
	if errs := aclWorkload(ctx, full, admin, "census"); len(errs) > 0 {
		t.Fatalf("workload with every permission: %v", errs)
	}
	stats, err := admin.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var used []string
	for _, line := range strings.Split(stats, "\r\n") {
		name, _, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		switch name {
		case "config|resetstat", "script|flush", "info", "ping", "hello", "client|setinfo", "acl|setuser", "lpush":
			continue // the test's own, and the connection's handshake (always allowed)
		}
		used = append(used, name)
	}
	slices.Sort(used)
	want := slices.Sorted(slices.Values(aclCommands))
	if !slices.Equal(used, want) {
		t.Fatalf("commands used: %v\nACLRules grants: %v", used, want)
	}
	redistest.Figure(t, "the library uses %d commands: %s", len(used), strings.Join(used, " "))

	rules := ACLRules("jobthrottle:")
	if err := aclUser(ctx, admin, "worker", rules); err != nil {
		t.Fatalf("ACL SETUSER worker %s: %v", rules, err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "worker", Password: "pw", MaxRetries: -1})
	start := time.Now()
	errs := aclWorkload(ctx, c, admin, "least")
	c.Close()
	if len(errs) > 0 {
		t.Fatalf("workload as a user with ACL %q: %v", rules, errs)
	}
	redistest.Figure(t, "ACL SETUSER worker on >pw %s: the whole workload works (%v)", rules, time.Since(start).Round(time.Millisecond))

	// one permission less at a time
	cases := map[string]string{}
	for _, cmd := range aclCommands {
		cases["+"+cmd] = strings.Replace(rules, " +"+cmd+" ", " ", 1) + " "
		if strings.HasSuffix(rules, " +"+cmd) {
			cases["+"+cmd] = strings.TrimSuffix(rules, " +"+cmd)
		}
	}
	cases["~{jobthrottle:*"] = strings.Replace(rules, "~{jobthrottle:*", "~other:*", 1)
	cases["&{jobthrottle:*"] = strings.Replace(rules, "&{jobthrottle:*", "&other:*", 1)
	var names []string
	for n := range cases {
		names = append(names, n)
	}
	slices.Sort(names)
	// every case at once (each as its own user, on its own keys): the workload sleeps
	type result struct {
		errs []error
		took time.Duration
	}
	results := make([]result, len(names))
	// go-redis drops each connection whose MULTI was refused, and says so
	redis.SetLogger(logging.NewBlacklistLogger([]string{"Conn has unread data"}))
	var wg sync.WaitGroup
	for i, missing := range names {
		user := fmt.Sprintf("worker%d", i)
		if err := aclUser(ctx, admin, user, cases[missing]); err != nil {
			t.Fatalf("ACL SETUSER %s %s: %v", user, cases[missing], err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// go-redis's default retries: a client that never re-sends (MaxRetries -1)
			// sends no MULTI/EXEC (see evalOnce), and +multi and +exec must be missed
			c := redis.NewClient(&redis.Options{Addr: s.Addr, Username: user, Password: "pw"})
			defer c.Close()
			start := time.Now()
			results[i].errs = aclWorkload(ctx, c, admin, fmt.Sprintf("missing%d", i))
			results[i].took = time.Since(start)
		}()
	}
	wg.Wait()
	logging.Enable()
	for i, missing := range names {
		// No wall-clock bound on took: a hang is a call that runs into its step's 30s
		// deadline, and fails below as an error that does not wrap ErrNoPermission (or
		// as any error without SUBSCRIBE). The ~40 workloads run at once; under load 24
		// they took 21s, CPU-bound, not hung.
		errs, took := results[i].errs, results[i].took
		if missing == "+subscribe" || missing == "+unsubscribe" {
			if len(errs) > 0 {
				t.Errorf("without %s: %v", missing, errs)
			}
			redistest.Figure(t, "without %s: no error; waiters are woken by their renewal timer instead (workload %v)", missing, took.Round(time.Millisecond))
			continue
		}
		if len(errs) == 0 {
			t.Errorf("without %s: no error", missing)
			continue
		}
		named := strings.Trim(missing, "+~&")
		for _, err := range errs {
			msg := err.Error()
			if !errors.Is(err, ErrNoPermission) || errors.Is(err, ErrUnavailable) {
				t.Errorf("without %s: %v, want an error wrapping ErrNoPermission", missing, err)
			}
			switch {
			case strings.Contains(msg, "'"+named+"'"), strings.Contains(msg, "can't run this command"),
				missing[0] == '~' && strings.Contains(msg, "key"), missing[0] == '&' && strings.Contains(msg, "channel"):
			default:
				t.Errorf("without %s: %q does not say what is missing", missing, msg)
			}
		}
		first := errs[0].Error()
		if len(first) > 200 {
			first = first[:200] + "…"
		}
		redistest.Figure(t, "without %-18s %d errors (%v), e.g. %s", missing+":", len(errs), took.Round(time.Millisecond), first)
	}
}
