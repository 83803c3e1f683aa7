package throttle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/booking"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
)

// aclServer is a Redis of the ACL test's own (a redis-server or a cluster), so that
// INFO commandstats counts the test's commands alone: admin has every permission,
// dial makes a client of the server as user with password "pw" (user "": the default
// user), and each runs f on every node (every master: the cluster has no replicas).
type aclServer struct {
	kind  redistest.Kind
	admin redis.UniversalClient
	dial  func(user string, retries int) redis.UniversalClient
	each  func(ctx context.Context, f func(ctx context.Context, c *redis.Client) error) error
}

func startACLServer(t *testing.T, kind redistest.Kind) *aclServer {
	t.Helper()
	skip := func(err error) {
		if os.Getenv("JOBTHROTTLE_REQUIRE_REAL") != "" {
			t.Fatalf("real Redis required: %v", err)
		}
		t.Skipf("no redis-server: %v", err)
	}
	if kind == redistest.Standalone {
		s, admin := startOwnServer(t)
		return &aclServer{kind: kind, admin: admin,
			dial: func(user string, retries int) redis.UniversalClient {
				o := &redis.Options{Addr: s.Addr, MaxRetries: retries, ReadTimeout: redistest.ClientTimeout, WriteTimeout: redistest.ClientTimeout}
				if user != "" {
					o.Username, o.Password = user, "pw"
				}
				return redis.NewClient(o)
			},
			each: func(ctx context.Context, f func(context.Context, *redis.Client) error) error { return f(ctx, admin) },
		}
	}
	c, err := redistest.StartClusterWithReplicas(3, 0, redistest.ClusterNodeTimeout)
	if err != nil {
		skip(err)
	}
	t.Cleanup(func() {
		for _, s := range c.Masters {
			s.Kill()
			os.RemoveAll(s.Dir)
		}
	})
	addrs := c.Addrs()
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ReadTimeout: redistest.ClientTimeout, WriteTimeout: redistest.ClientTimeout})
	t.Cleanup(func() { admin.Close() })
	return &aclServer{kind: kind, admin: admin,
		dial: func(user string, retries int) redis.UniversalClient {
			o := &redis.ClusterOptions{Addrs: addrs, MaxRetries: retries, ReadTimeout: redistest.ClientTimeout, WriteTimeout: redistest.ClientTimeout}
			if user != "" {
				o.Username, o.Password = user, "pw"
			}
			return redis.NewClusterClient(o)
		},
		each: admin.ForEachMaster,
	}
}

// setUser creates (or replaces) user with password "pw" and rules, on every node.
func (s *aclServer) setUser(ctx context.Context, user, rules string) error {
	args := []any{"ACL", "SETUSER", user, "reset", "on", ">pw"}
	for _, r := range strings.Fields(rules) {
		args = append(args, r)
	}
	return s.each(ctx, func(ctx context.Context, c *redis.Client) error { return c.Do(ctx, args...).Err() })
}

// lpush is LPUSH as admin, sent to the node of key itself: a cluster client would look
// up the command's details first (COMMAND), which the census would count.
func (s *aclServer) lpush(ctx context.Context, key string, values ...any) error {
	if c, ok := s.admin.(*redis.ClusterClient); ok {
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			return err
		}
		return node.LPush(ctx, key, values...).Err()
	}
	return s.admin.LPush(ctx, key, values...).Err()
}

// used returns the commands the nodes ran since their stats were reset, by INFO
// commandstats, but for the test's own and the connections' handshakes.
func (s *aclServer) used(ctx context.Context) ([]string, error) {
	var mu sync.Mutex
	seen := map[string]bool{}
	err := s.each(ctx, func(ctx context.Context, c *redis.Client) error {
		stats, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, line := range strings.Split(stats, "\r\n") {
			name, _, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
			if !ok || !strings.HasPrefix(line, "cmdstat_") {
				continue
			}
			switch name {
			case "config|resetstat", "script|flush", "info", "ping", "hello", "client|setinfo", "acl|setuser", "lpush", "pubsub|numsub":
				continue // the test's own, and the connection's handshake (always allowed)
			}
			seen[name] = true
		}
		return nil
	})
	return slices.Sorted(func(yield func(string) bool) {
		for n := range seen {
			if !yield(n) {
				return
			}
		}
	}), err
}

// aclWorkload runs everything the library does with Redis, every path of every script,
// on clients dial makes: each algorithm's grants, denials, bookings ahead and cancels, a
// permit log long enough to be searched, trimmed, merged into and emptied, a task's
// booking found again and given back, an override set and cleared, pauses and a resume
// that wakes a sleeping WaitN, Inspect, ReadRecord, the scripts run again after a
// SCRIPT FLUSH (EVAL), a semaphore's leases, queue, hand-off (PUBLISH), wake-up
// subscription and its end (UNSUBSCRIBE), extension and release. admin flushes the
// scripts and plants a stale log. With census (a user with every permission), it
// returns only once Redis has run the UNSUBSCRIBE, so that INFO commandstats counts it.
// It returns the first error of each algorithm's part and of the semaphore's (each goes
// on to its end regardless).
func aclWorkload(ctx context.Context, s *aclServer, dial func() redis.UniversalClient, run string, census bool) []error {
	c, c2 := dial(), dial() // c2: a second process, which a Pause through c does not hold
	defer c.Close()
	defer c2.Close()
	var errs []error
	failed := false
	note := func(what string, err error) {
		if err != nil && !failed {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			failed = true
		}
	}
	// a step's deadline only bounds a call that would hang: calls return by their
	// deadline (ErrUnavailable), so it outlasts a step on a machine other suites starve
	step := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 30*time.Second) }
	limit := Limit{Rate: 40, Period: 200 * time.Millisecond}
	for _, alg := range allAlgorithms {
		// 40 per 200ms: grants spread over two halves of a period, so that a later
		// grant trims some (LTRIM) and a denial searches the log (LLEN, LRANGE)
		l, err := New(c, run+"-"+alg.String(), limit, WithAlgorithm(alg))
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
		// wait is searched for
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
		// a task's booking: made (SET), found again by the task's next Reserve (GET),
		// given back (DEL)
		task := booking.With(cctx, &booking.Task{ID: "task-1", Late: time.Minute})
		if _, err := l.Reserve(task, 1, time.Minute); err != nil {
			note(alg.String()+" Reserve for a task", err)
		} else if r, err := l.Reserve(task, 1, time.Minute); err != nil {
			note(alg.String()+" Reserve for a task again", err)
		} else {
			note(alg.String()+" Cancel of a task's booking", r.Cancel(cctx))
		}
		_, err = l.Inspect(cctx) // PTTL
		note(alg.String()+" Inspect", err)
		for _, r := range held {
			note(alg.String()+" Cancel", r.Cancel(cctx))
		}
		note(alg.String()+" Override", l.Override(cctx, time.Minute, Limit{Rate: 30}))
		note(alg.String()+" ClearOverride", l.ClearOverride(cctx))
		// a booking at the end of a pause (20s: it outlasts any step) stays in the
		// window; once every earlier grant has left it, the next booking trims them
		// (LTRIM: not all of the log has expired) and lands on the same time (LSET)
		note(alg.String()+" Pause", l.Pause(cctx, 20*time.Second))
		ahead, err := l.Reserve(cctx, 1, time.Minute)
		note(alg.String()+" Reserve after a pause", err)
		// the state lives while the pause does: its record reads (GET, LINDEX, PTTL), and
		_, err = ReadRecord(cctx, c, run+"-"+alg.String())
		note(alg.String()+" ReadRecord", err)
		// another algorithm on the key is refused with an *AlgorithmError (TYPE, and GET or
		// LINDEX, read the state's meta)
		other, err := New(c, run+"-"+alg.String(), limit, WithAlgorithm(allAlgorithms[(slices.Index(allAlgorithms, alg)+1)%len(allAlgorithms)]))
		if err != nil {
			return append(errs, err)
		}
		if _, err := other.Allow(cctx); err == nil {
			note(alg.String()+" Allow of another algorithm", errors.New("no error, want ErrAlgorithmMismatch"))
		} else if !errors.Is(err, ErrAlgorithmMismatch) {
			note(alg.String()+" Allow of another algorithm", err)
		}
		time.Sleep(210 * time.Millisecond) // every grant before the pause has left the window
		trims, err := l.Reserve(cctx, 1, time.Minute)
		note(alg.String()+" Reserve that trims", err)
		for _, r := range []*waiter.Reservation{ahead, trims} {
			if r != nil {
				note(alg.String()+" Cancel after a pause", r.Cancel(cctx))
			}
		}
		note(alg.String()+" Resume", l.Resume(cctx)) // PUBLISH; the state goes once nothing in it matters
		note("SCRIPT FLUSH", scriptFlush(cctx, s.admin))
		_, err = l.AllowN(cctx, 0) // EVAL, the script being gone
		note(alg.String()+" AllowN after SCRIPT FLUSH", err)
		// a log whose every entry has left the window while its key lives on: the
		// grant drops it whole (UNLINK). A key's TTL ends with its last entry's window,
		// so waiting for that state is luck; it is written here instead, as [meta, base
		// 0, T1 1µs, S1 1] (LPUSH pushes in reverse; the test's: the census leaves it out).
		stale, err := New(c, run+"-stale-"+alg.String(), limit, WithAlgorithm(alg))
		if err != nil {
			return append(errs, err)
		}
		if alg == SlidingWindow || alg == SlidingCounter { // the algorithms of lua/log.lua
			note("LPUSH (the test's)", s.lpush(cctx, stale.stateKey(), 1, 1, 0, stale.t.head))
		}
		_, err = stale.AllowN(cctx, 1)
		note(alg.String()+" AllowN on an expired log", err)
		// two bookings after a pause on a fresh key land on its end, one entry (LSET),
		// whatever the machine's speed: the pause outlasts any step (20s); given back,
		// the first leaves one permit in the entry, the second none: the log is empty
		fresh, err := New(c, run+"-fresh-"+alg.String(), limit, WithAlgorithm(alg))
		if err != nil {
			return append(errs, err)
		}
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

	// a WaitN asleep on a booking behind a pause (another process's: c's Pause does not
	// hold c2) listens on the key's channel (SUBSCRIBE); the Resume wakes it and it books
	// again. Without SUBSCRIBE it sleeps until the pause ends instead (3s).
	cctx, cancel := step()
	defer cancel()
	failed = false
	booked := make(chan struct{}, 4)
	pauser, err := New(c, run+"-wait", limit)
	if err != nil {
		return append(errs, err)
	}
	sleeper, err := New(c2, run+"-wait", limit, WithHooks(Hooks{Allowed: func(string, int, time.Duration) { booked <- struct{}{} }}))
	if err != nil {
		return append(errs, err)
	}
	note("Pause before WaitN", pauser.Pause(cctx, 3*time.Second))
	waited := make(chan error, 1)
	go func() { waited <- sleeper.Wait(cctx) }()
	select {
	case <-booked:
	case err := <-waited:
		waited <- err
	}
	note("Resume of a sleeping WaitN", pauser.Resume(cctx))
	note("WaitN", <-waited)

	// tenants with caps: grants on the group and the caps, a backlog that queues in the
	// fair share (ZSCORE, ZADD), the fair share's clock passing it (ZRANGE, ZREM, DEL),
	// Inspect of the group (ZREVRANGE) and of a tenant, an operator's weight set and
	// cleared
	failed = false
	group, err := New(c, run+"-tenants", Limit{Rate: 20, Period: 100 * time.Millisecond}, WithTenantLimits(Limit{Rate: 15, Period: 100 * time.Millisecond}))
	if err != nil {
		return append(errs, err)
	}
	acme, beta := group.Tenant("acme"), group.Tenant("beta", Weight(3))
	for i := 0; i < 40; i++ {
		tn := acme
		if i%2 == 1 {
			tn = beta
		}
		_, err := tn.Reserve(cctx, 1, time.Second)
		note("a tenant's Reserve", err)
	}
	_, err = group.Inspect(cctx)
	note("Inspect of the group", err)
	_, err = acme.Inspect(cctx)
	note("Inspect of a tenant", err)
	note("OverrideWeight", acme.OverrideWeight(cctx, time.Minute, 2))
	note("ClearWeight", acme.ClearWeight(cctx))
	time.Sleep(300 * time.Millisecond) // the fair share's clock passes every finish tag
	_, err = beta.Allow(cctx)
	note("a tenant's Allow once the queue is served", err)

	// a lease outlives the step (a TTL a loaded machine could pass between two calls
	// would lose it); without SUBSCRIBE, the waiter below asks again every TTL/3
	sem, err := NewSemaphore(c, run+"-sem", 1, WithLeaseTTL(30*time.Second))
	if err != nil {
		return append(errs, err)
	}
	// the key's pause, in a sliding window's state (a list): the semaphore reads its
	// meta (GET, then LINDEX)
	semLimiter, err := New(c, run+"-sem", limit)
	if err != nil {
		return append(errs, err)
	}
	if _, err := semLimiter.Allow(cctx); err != nil {
		note("Allow on the semaphore's key", err)
	}
	failed = false
	lease, _, err := sem.TryAcquire(cctx)
	note("Semaphore TryAcquire", err)
	if lease != nil {
		note("Lease Extend", lease.Extend(cctx))
	}
	_, err = sem.Inspect(cctx)
	note("Semaphore Inspect", err)
	queued := newToken() // takes a place in the queue (its own call, whether or not
	// the wake-up subscription works)
	_, err = sem.call(cctx, semAcquire, queued, queued, true, false)
	note("queued acquire", err)
	var wg sync.WaitGroup
	var acquired error
	ended := make(chan struct{})
	wg.Add(1)
	go func() { // waits behind it: subscribes, then takes a place in the queue
		defer wg.Done()
		defer close(ended)
		l, err := sem.Acquire(cctx)
		if err == nil {
			err = l.Release(cctx)
		}
		acquired = err
	}()
	// The waiter's subscription is the only one this workload sees end by UNSUBSCRIBE: a
	// key's listener of sleeping WaitNs stays until the key is swept idle (15-30s) or its
	// client closes, and a closed client's subscription goes with its connection, unsent.
	// A waiter that finds the slot free never subscribes, so the lease is released only
	// once the waiter has asked for the subscription (whether or not Redis allows it).
	hub := sem.client().hub
	note("waiter's subscription", pollUntil(cctx, ended, func() bool { return hub.asked(sem.channel) }))
	if lease != nil {
		note("Lease Release", lease.Release(cctx)) // hands the slot to queued (PUBLISH)
	}
	_, err = sem.call(cctx, semRelease, queued, queued, false, false) // and on to the waiter
	note("queued release", err)
	wg.Wait()
	note("Semaphore Acquire", acquired)
	if census {
		// The waiter's last listener gone (or, if it left before its SUBSCRIBE was
		// confirmed, the confirmation) drops the channel, and the hub's worker sends
		// UNSUBSCRIBE after: once the hub has sent it, and Redis counts no subscriber on
		// the channel while the connection is open, Redis has run it. Returning earlier,
		// c.Close could take the connection down before the UNSUBSCRIBE went out.
		note("waiter's UNSUBSCRIBE sent", pollUntil(cctx, nil, func() bool { return hub.unsubscribed(sem.channel) }))
		note("waiter's UNSUBSCRIBE run", pollUntil(cctx, nil, func() bool {
			n, err := s.subscribers(cctx, sem.channel)
			return err == nil && n == 0
		}))
	}
	return errs
}

// pollUntil returns nil once cond holds or stop is closed, or ctx's error if ctx ends
// first. It looks every millisecond: cond's state is reached by goroutines and Redis,
// not by a time.
func pollUntil(ctx context.Context, stop <-chan struct{}, cond func() bool) error {
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stop:
			return nil
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

// asked reports whether the hub has asked for a subscription to channel (listeners on
// it, SUBSCRIBE queued or sent).
func (h *hub) asked(channel string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := h.chans[channel]
	return ch != nil && ch.subscribed
}

// unsubscribed reports whether the hub has dropped channel and its worker has made
// every call queued, the UNSUBSCRIBE of a channel it had subscribed included.
func (h *hub) unsubscribed(channel string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.chans[channel] == nil && len(h.ops) == 0
}

// subscribers returns the connections subscribed to channel, on every node (PUBSUB
// NUMSUB is a node's own count; the census leaves it out).
func (s *aclServer) subscribers(ctx context.Context, channel string) (int64, error) {
	var mu sync.Mutex
	var total int64
	err := s.each(ctx, func(ctx context.Context, c *redis.Client) error {
		n, err := c.PubSubNumSub(ctx, channel).Result()
		mu.Lock()
		defer mu.Unlock()
		total += n[channel]
		return err
	})
	return total, err
}

// Least privilege, on a redis-server and a Redis Cluster of the test's own:
//   - the commands the library uses, counted by INFO commandstats over the whole
//     workload, are exactly those ACLRules grants but ASKING, which only a slot's
//     migration takes (TestACLRulesThroughAReshard): on a cluster all of them, on a
//     redis-server all but CLUSTER SLOTS, which go-redis's cluster client reads the
//     cluster's layout with (ACLRules grants it, so that one user works on both);
//   - a user with ACLRules("jobthrottle:") and nothing else runs the workload without
//     an error;
//   - on the redis-server, a user missing any one command, the key pattern or the
//     channel pattern gets an error wrapping ErrNoPermission (never ErrUnavailable)
//     that names what is missing, as Redis does (Redis 7.0 does not name a command a
//     script was refused: its text then is Redis's "can't run this command"), and
//     nothing hangs; except SUBSCRIBE and UNSUBSCRIBE, whose refusal only slows the
//     wake-ups of waiters to their timers (logged, with the time the workload took),
//     and CLUSTER SLOTS and ASKING, which a redis-server does not need; on the cluster, a user
//     without CLUSTER SLOTS gets such an error naming it.
func TestACLLeastPrivilege(t *testing.T) {
	parallel(t)
	for _, kind := range []redistest.Kind{redistest.Standalone, redistest.Cluster} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			testACL(t, startACLServer(t, kind))
		})
	}
}

func testACL(t *testing.T, s *aclServer) {
	ctx := context.Background()
	// the census, as a user with every permission
	if err := s.each(ctx, func(ctx context.Context, c *redis.Client) error { return c.ConfigResetStat(ctx).Err() }); err != nil {
		t.Fatal(err)
	}
	if errs := aclWorkload(ctx, s, func() redis.UniversalClient { return s.dial("", 0) }, "census", true); len(errs) > 0 {
		t.Fatalf("workload with every permission: %v", errs)
	}
	used, err := s.used(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Sorted(slices.Values(aclCommands))
	want = slices.DeleteFunc(want, func(c string) bool { // (ASKING: TestACLRulesThroughAReshard)
		return c == "asking" || c == "cluster|slots" && s.kind == redistest.Standalone
	})
	if !slices.Equal(used, want) {
		t.Fatalf("commands used on the %s: %v\nACLRules grants: %v", s.kind, used, aclCommands)
	}
	redistest.Figure(t, "on the %s the library uses %d commands: %s", s.kind, len(used), strings.Join(used, " "))

	rules := ACLRules("jobthrottle:")
	if err := s.setUser(ctx, "worker", rules); err != nil {
		t.Fatalf("ACL SETUSER worker %s: %v", rules, err)
	}
	start := time.Now()
	if errs := aclWorkload(ctx, s, func() redis.UniversalClient { return s.dial("worker", -1) }, "least", false); len(errs) > 0 {
		t.Fatalf("workload as a user with ACL %q: %v", rules, errs)
	}
	redistest.Figure(t, "%s: ACL SETUSER worker on >pw %s: the whole workload works (%v)", s.kind, rules, time.Since(start).Round(time.Millisecond))

	// one permission less at a time
	cases := map[string]string{}
	if s.kind == redistest.Cluster {
		cases["+cluster|slots"] = strings.Replace(rules+" ", " +cluster|slots ", " ", 1)
	} else {
		for _, cmd := range aclCommands {
			cases["+"+cmd] = strings.Replace(rules+" ", " +"+cmd+" ", " ", 1)
		}
		cases["~{jobthrottle:*"] = strings.Replace(rules, "~{jobthrottle:*", "~other:*", 1)
		cases["&{jobthrottle:*"] = strings.Replace(rules, "&{jobthrottle:*", "&other:*", 1)
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range cases {
			if !yield(n) {
				return
			}
		}
	})
	// every case at once (each as its own user, on its own keys): the workload sleeps
	type result struct {
		errs []error
		took time.Duration
	}
	results := make([]result, len(names)) // (TestMain quiets what go-redis says of the refusals)
	var wg sync.WaitGroup
	for i, missing := range names {
		user := fmt.Sprintf("worker%d", i)
		if err := s.setUser(ctx, user, cases[missing]); err != nil {
			t.Fatalf("ACL SETUSER %s %s: %v", user, cases[missing], err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// go-redis's default retries: a client that never re-sends (MaxRetries -1)
			// sends no MULTI/EXEC (see pipeline), and +multi and +exec must be missed
			start := time.Now()
			results[i].errs = aclWorkload(ctx, s, func() redis.UniversalClient { return s.dial(user, 0) }, fmt.Sprintf("missing%d", i), false)
			results[i].took = time.Since(start)
		}()
	}
	wg.Wait()
	for i, missing := range names {
		// No wall-clock bound on took: a hang is a call that runs into its step's 30s
		// deadline, and fails below as an error that does not wrap ErrNoPermission (or
		// as any error where none is wanted).
		errs, took := results[i].errs, results[i].took
		if missing == "+subscribe" || missing == "+unsubscribe" || (missing == "+cluster|slots" || missing == "+asking") && s.kind == redistest.Standalone {
			if len(errs) > 0 {
				t.Errorf("without %s: %v", missing, errs)
			}
			redistest.Figure(t, "%s: without %s: no error (workload %v)", s.kind, missing, took.Round(time.Millisecond))
			continue
		}
		if len(errs) == 0 {
			t.Errorf("%s: without %s: no error", s.kind, missing)
			continue
		}
		named := strings.Trim(missing, "+~&")
		for _, err := range errs {
			msg := err.Error()
			if !errors.Is(err, ErrNoPermission) || errors.Is(err, ErrUnavailable) {
				t.Errorf("%s: without %s: %v, want an error wrapping ErrNoPermission", s.kind, missing, err)
			}
			switch {
			case strings.Contains(msg, "'"+named+"'"), strings.Contains(msg, "can't run this command"),
				missing[0] == '~' && strings.Contains(msg, "key"), missing[0] == '&' && strings.Contains(msg, "channel"):
			default:
				t.Errorf("%s: without %s: %q does not say what is missing", s.kind, missing, msg)
			}
		}
		first := errs[0].Error()
		if len(first) > 200 {
			first = first[:200] + "…"
		}
		redistest.Figure(t, "%s: without %-18s %d errors (%v), e.g. %s", s.kind, missing+":", len(errs), took.Round(time.Millisecond), first)
	}
}

// A user with ACLRules alone keeps working while its limiter's slot migrates (go-redis's
// cluster client sends ASKING to the node importing it, before each call there); a user
// without +asking gets errors wrapping ErrNoPermission that name it.
func TestACLRulesThroughAReshard(t *testing.T) {
	parallel(t)
	tc, admin := redistest.OwnCluster(t)
	ctx := context.Background()
	rules := ACLRules("jobthrottle:")
	for user, r := range map[string]string{"worker": rules, "noasking": strings.Replace(rules+" ", " +asking ", " ", 1)} {
		args := []any{"ACL", "SETUSER", user, "reset", "on", ">pw"}
		for _, f := range strings.Fields(r) {
			args = append(args, f)
		}
		if err := admin.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Do(ctx, args...).Err() }); err != nil {
			t.Fatal(err)
		}
	}
	limiter := func(user string) *Limiter {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: tc.Addrs(), Username: user, Password: "pw"})
		t.Cleanup(func() { c.Close() })
		l, err := New(c, "reshard", PerSecond(1000))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Allow(ctx); err != nil {
			t.Fatalf("%s: Allow before the move: %v", user, err)
		}
		return l
	}
	worker, noasking := limiter("worker"), limiter("noasking")
	move := redistest.NewSlotMove(t, tc, admin, worker.stateKey())
	move.Begin()
	move.Keys()
	for i := range 3 {
		if r, err := worker.Allow(ctx); err != nil || !r.Allowed {
			t.Fatalf("Allow %d while the slot migrates, as a user with ACLRules: %v, %v; want allowed", i+1, r, err)
		}
		if _, err := noasking.Allow(ctx); !errors.Is(err, ErrNoPermission) || !strings.Contains(err.Error(), "'asking'") {
			t.Fatalf("Allow %d while the slot migrates, as a user without +asking: %v; want ErrNoPermission naming asking", i+1, err)
		}
	}
	move.End()
	for _, l := range []*Limiter{worker, noasking} {
		if _, err := l.Allow(ctx); err != nil {
			t.Fatalf("Allow after the move: %v", err)
		}
	}
}
