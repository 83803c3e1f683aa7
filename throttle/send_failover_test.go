package throttle

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// sendRequireReal skips a test that needs something it could not get, or fails it when
// real dependencies are required (JOBTHROTTLE_REQUIRE_REAL, as in CI).
func sendRequireReal(t *testing.T, err error) {
	t.Helper()
	if os.Getenv("JOBTHROTTLE_REQUIRE_REAL") != "" {
		t.Fatalf("required (JOBTHROTTLE_REQUIRE_REAL is set): %v", err)
	}
	t.Skipf("skipped: %v", err)
}

// sendOddKeys are limiter keys holding the characters Redis Cluster reads as a hash tag.
var sendOddKeys = []string{"{", "}", "}{", "{}", "{x}", "a{b", "a}b", "a}{b", "x{y}z", "{{", "}}", "{a}{b}",
	"tenant:{42}:jobs", "}x{", "ü{é}", "{}{}"}

// sendNodeInfo returns the value of field (e.g. "role", "cluster_state") in INFO section
// (or CLUSTER INFO when section is "cluster") of the node at addr, or "down".
func sendNodeInfo(ctx context.Context, addr, section, field string) string {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * ms})
	defer c.Close()
	var info string
	var err error
	if section == "cluster" {
		info, err = c.ClusterInfo(ctx).Result()
	} else {
		info, err = c.Info(ctx, section).Result()
	}
	if err != nil {
		return "down"
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return "?"
}

// sendWaitFor polls cond every 10ms for up to d and returns how long it took.
func sendWaitFor(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("after %v: got no %s, want it", d, what)
		}
		time.Sleep(10 * ms)
	}
	return time.Since(start)
}

// A Redis Cluster of 3 masters and 3 replicas, under load on many keys (keys holding
// '{', '}' and '}{' among them) with every algorithm, goes through a manual CLUSTER
// FAILOVER on a replica, a master killed with SIGKILL, and a master killed after its
// replica's link was cut (so the replica that takes over lacks the latest writes):
//
//   - every key of a limiter is in one slot (CLUSTER KEYSLOT), the library's hash tag
//     winning over the braces in the key; no call ever fails with CROSSSLOT;
//   - every error a caller sees is ErrUnavailable (or, releasing a semaphore lease a
//     failover lost, ErrLeaseLost), and callers that retry get through once the
//     cluster has failed over (the time until each limiter key and semaphore whose
//     master failed is served again is reported);
//   - nothing is charged twice, and no period holds more than the bound on any key,
//     except by grants a failover lost: the server-side record of grants
//     (redistest.AuditSource), replicated with the state, shows which grants callers
//     were told of are gone from the new master; a key can admit those again, so the
//     excess over the bound in a period may be at most the grants the key lost, and
//     never more than the bound (the surviving state and the lost grants each keep to
//     it). Keys with a 4s period, polled with AllowN, show the effect: the replica
//     takes over after their grants of the last 300ms were lost, within one period.
//
// Tolerances: none on the bounds. The manual failover loses nothing (the replica takes
// over only once it has every write); the plain kill usually loses nothing on one
// machine (replication takes microseconds); the figures say what each lost. How soon
// keys are served again is reported, not asserted: it depends on go-redis's retries and
// on when it reads the slot map again.
func TestClusterFailover(t *testing.T) {
	parallel(t)
	const (
		period      = 250 * ms
		longPeriod  = 4 * time.Second
		nodeTimeout = time.Second
	)
	cl, err := redistest.StartClusterWithReplicas(3, 1, nodeTimeout)
	if err != nil {
		sendRequireReal(t, fmt.Errorf("a Redis Cluster with replicas: %w", err))
	}
	defer func() {
		for _, s := range append(cl.Masters, cl.Replicas...) {
			s.Kill()
		}
	}()
	ctx := context.Background()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer rdb.Close()
	grants := redistest.RecordGrants(rdb)
	const prefix = "jt-failover:"
	slotOf := func(key string) int64 {
		t.Helper()
		s, err := rdb.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", key, err)
		}
		return s
	}
	masterOf := func(slot int64) int { // by the slots StartClusterWithReplicas gave each master
		m := 0
		for slot > int64((m+1)*16384/3-1) {
			m++
		}
		return m
	}

	// hot keys, each with callers of its own (WaitN and AllowN): the odd keys and, on
	// each master, one per algorithm; cold keys picked at random by a pool of callers;
	// long keys (4s period) polled with AllowN, one sliding window and one bucket on
	// each master
	mk := func(key string, limit Limit, alg Algorithm, opts ...Option) *Limiter {
		t.Helper()
		if alg == TokenBucket && limit.Burst == 0 {
			limit.Burst = 3
		}
		l, err := New(rdb, key, limit, append([]Option{WithAlgorithm(alg), WithKeyPrefix(prefix)}, opts...)...)
		if err != nil {
			t.Fatalf("New(%q): %v", key, err)
		}
		l.useScript(audited[l.t.script])
		return l
	}
	onMaster := func(base string, m int) string { // a key whose slot is master m's
		for i := 0; ; i++ {
			key := fmt.Sprintf("%s-%d", base, i)
			if masterOf(slotOf(prefix+key)) == m {
				return key
			}
		}
	}
	var hot, cold, long []*Limiter
	for i, alg := range allAlgorithms {
		for _, key := range sendOddKeys[4*i : 4*i+4] {
			hot = append(hot, mk("hot"+key, Limit{Rate: 20, Period: period}, alg))
		}
		for m := 0; m < 3; m++ {
			hot = append(hot, mk(onMaster("hot-"+alg.String(), m), Limit{Rate: 20, Period: period}, alg))
		}
		for _, key := range append(append([]string(nil), sendOddKeys...), keyNames("cold", 16)...) {
			// one algorithm per key: the algorithm goes after the odd characters
			cold = append(cold, mk(key+"/"+alg.String(), Limit{Rate: 10, Period: period}, alg))
		}
		cold = append(cold, mk("{"+alg.String()+"}", Limit{Rate: 10, Period: period}, alg, WithKeyPrefix(""))) // tag "{{…"
	}
	for m := 0; m < 3; m++ {
		long = append(long, mk(onMaster("long-sw", m), Limit{Rate: 20, Period: longPeriod}, SlidingWindow),
			mk(onMaster("long-tb", m), Limit{Rate: 20, Period: longPeriod, Burst: 5}, TokenBucket))
	}
	sem, err := NewSemaphore(rdb, "sem}{", 2, WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	// one semaphore on each master, on a client of their own (so that they do not
	// benefit from what the limiters' calls do to the client), with a short lease TTL:
	// a lease whose release a failover lost holds its slot until then
	semClient := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer semClient.Close()
	var sems []*Semaphore
	for m := 0; m < 3; m++ {
		s, err := NewSemaphore(semClient, onMaster("sem", m), 4, WithKeyPrefix(prefix), WithLeaseTTL(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		sems = append(sems, s)
	}
	all := append(append(append([]*Limiter(nil), hot...), cold...), long...)

	// every key of a limiter (and of the semaphore) is in the slot of its hash tag
	tagged := [][]string{sem.t.keys}
	for _, s := range sems {
		tagged = append(tagged, s.t.keys)
	}
	for _, l := range all {
		tagged = append(tagged, append(append([]string(nil), l.t.keys...), l.stateKey()+":audit"))
	}
	for _, keys := range tagged {
		tag := keys[0][1 : strings.Index(keys[0][1:], "}")+1] // from the first '{' to the first '}' after it
		want := slotOf(tag)
		for _, k := range keys {
			if got := slotOf(k); got != want {
				t.Fatalf("key %q is in slot %d, its tag %q in slot %d: a limiter's keys must share the slot", k, got, tag, want)
			}
		}
	}
	master := map[*Limiter]int{}
	for _, l := range all {
		master[l] = masterOf(slotOf(l.stateKey()))
	}

	var (
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		mu      sync.Mutex
		seen    []time.Time // when callers saw ErrUnavailable
		other   []error
		okCalls atomic.Int64
	)
	call := func(l *Limiter, n int, wait bool) (Result, error) {
		var r Result
		var err error
		if wait {
			err = l.WaitN(ctx, n)
			r.Allowed = err == nil
		} else {
			r, err = l.AllowN(ctx, n)
		}
		switch {
		case err == nil:
			okCalls.Add(1)
		case errors.Is(err, ErrUnavailable):
			mu.Lock()
			seen = append(seen, time.Now())
			mu.Unlock()
			time.Sleep(20 * ms) // and retry
		default:
			mu.Lock()
			other = append(other, err)
			mu.Unlock()
			time.Sleep(20 * ms)
		}
		return r, err
	}
	worker := func(pick func(*rand.Rand) *Limiter, seed int64, poll bool) {
		defer wg.Done()
		rng := rand.New(rand.NewSource(seed))
		for {
			select {
			case <-stop:
				return
			default:
			}
			l := pick(rng)
			n := 1 + rng.Intn(3)
			if poll {
				n = 1 + rng.Intn(2)
			}
			r, err := call(l, n, !poll && rng.Intn(4) != 0)
			if err == nil && !r.Allowed {
				time.Sleep(min(r.RetryAfter, 20*ms))
			}
		}
	}
	for i, l := range hot {
		for w := 0; w < 2; w++ {
			wg.Add(1)
			go worker(func(*rand.Rand) *Limiter { return l }, int64(100*i+w), false)
		}
	}
	for i, l := range long {
		for w := 0; w < 2; w++ {
			wg.Add(1)
			go worker(func(*rand.Rand) *Limiter { return l }, int64(5000+100*i+w), true)
		}
	}
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go worker(func(r *rand.Rand) *Limiter { return cold[r.Intn(len(cold))] }, int64(10000+w), false)
	}
	semGot := make([][]time.Time, len(sems)) // when each TryAcquire that got a lease was made
	for i, s := range sems {
		for w := 0; w < 2; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					start := time.Now()
					lease, wait, err := s.TryAcquire(ctx)
					if err == nil && lease != nil {
						mu.Lock()
						semGot[i] = append(semGot[i], start)
						mu.Unlock()
						time.Sleep(2 * ms)
						// a lease whose grant a failover lost is gone: ErrLeaseLost is right
						if err = lease.Release(ctx); errors.Is(err, ErrLeaseLost) {
							err = nil
						}
					} else if err == nil {
						time.Sleep(min(wait, 10*ms))
					}
					if err != nil {
						mu.Lock()
						if errors.Is(err, ErrUnavailable) {
							seen = append(seen, time.Now())
						} else {
							other = append(other, err)
						}
						mu.Unlock()
						time.Sleep(20 * ms)
					}
				}
			}()
		}
	}
	semServed := func(m int, from time.Time) (after time.Duration, ok bool) {
		mu.Lock()
		defer mu.Unlock()
		for _, at := range semGot[m] {
			if at.After(from) {
				return at.Sub(from), true
			}
		}
		return 0, false
	}

	// firstSent returns when the first call on l sent after from that got a grant was
	// sent (zero if none yet)
	firstSent := func(byKey map[string]*redistest.Grants, l *Limiter, from time.Time) (first time.Time) {
		for _, g := range byKey[l.stateKey()].List() {
			if g.Sent.After(from) && (first.IsZero() || g.Sent.Before(first)) {
				first = g.Sent
			}
		}
		return first
	}
	// served reports whether every hot key on master m has had a call sent after from
	// get a grant
	served := func(m int, from time.Time) bool {
		if _, ok := semServed(m, from); !ok {
			return false
		}
		byKey := grants.ByKey()
		for _, l := range hot {
			if master[l] == m && firstSent(byKey, l, from).IsZero() {
				return false
			}
		}
		return true
	}
	// recovery returns how long after from the last hot key of master m was first
	// served, and the longest a hot key of another master went without a grant
	recovery := func(m int, from time.Time) (back, stall time.Duration) {
		byKey := grants.ByKey()
		for _, l := range hot {
			if master[l] == m {
				back = max(back, firstSent(byKey, l, from).Sub(from))
			}
		}
		for _, l := range hot {
			if master[l] == m {
				continue
			}
			var sent []time.Time
			for _, g := range byKey[l.stateKey()].List() {
				if g.Sent.After(from) && g.Sent.Before(from.Add(back)) {
					sent = append(sent, g.Sent)
				}
			}
			sort.Slice(sent, func(i, j int) bool { return sent[i].Before(sent[j]) })
			last := from
			for _, at := range append(sent, from.Add(back)) {
				stall = max(stall, at.Sub(last))
				last = at
			}
		}
		return back, stall
	}
	errorsBetween := func(from, to time.Time) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, at := range seen {
			if !at.Before(from) && at.Before(to) {
				n++
			}
		}
		return n
	}
	phase := func(what string, m int, at time.Time, healed time.Duration) {
		t.Helper()
		sendWaitFor(t, 30*time.Second, "every hot key of the failed master served again", func() bool { return served(m, at) })
		back, stall := recovery(m, at)
		semBack, _ := semServed(m, at)
		redistest.Figure(t, "%s: the cluster had failed over %v after it; every limiter key of that master was served again %v after it, its semaphore %v after it; callers saw %d ErrUnavailable; the longest a limiter key of another master went unserved: %v",
			what, healed.Round(ms), back.Round(ms), semBack.Round(ms), errorsBetween(at, at.Add(max(back, semBack)+time.Second)), stall.Round(ms))
	}
	time.Sleep(time.Second)

	// 1. CLUSTER FAILOVER on a replica: it takes over once it has every write
	m1, r1 := cl.Masters[0], cl.Replicas[0]
	r1c := redis.NewClient(&redis.Options{Addr: r1.Addr})
	defer r1c.Close()
	at := time.Now()
	if err := r1c.Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		t.Fatalf("CLUSTER FAILOVER: %v", err)
	}
	healed := sendWaitFor(t, 30*time.Second, "the replica to take over", func() bool {
		return sendNodeInfo(ctx, r1.Addr, "replication", "role") == "master" && sendNodeInfo(ctx, m1.Addr, "replication", "role") == "slave"
	})
	phase("CLUSTER FAILOVER", 0, at, healed)
	time.Sleep(500 * ms)

	// 2. kill -9 a master; its replica takes over after the node timeout
	m2, r2 := cl.Masters[1], cl.Replicas[1]
	at = time.Now()
	m2.Kill()
	healed = sendWaitFor(t, 30*time.Second, "the killed master's replica to take over", func() bool {
		return sendNodeInfo(ctx, r2.Addr, "replication", "role") == "master" && sendNodeInfo(ctx, r2.Addr, "cluster", "cluster_state") == "ok"
	})
	phase("master killed (SIGKILL)", 1, at, healed)
	time.Sleep(500 * ms)

	// 3. cut a replica's link (it can no longer authenticate to resync), let its master
	// take writes for 300ms, then kill the master: the replica takes over without them
	m3, r3 := cl.Masters[2], cl.Replicas[2]
	rc := redis.NewClient(&redis.Options{Addr: r3.Addr})
	defer rc.Close()
	sendWaitFor(t, 30*time.Second, "the third master's keys served", func() bool { return served(2, time.Now().Add(-200*ms)) })
	if err := rc.ConfigSet(ctx, "masterauth", "jt-cut-the-link").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.Do(ctx, "CLIENT", "KILL", "TYPE", "master").Err(); err != nil {
		t.Fatal(err)
	}
	sendWaitFor(t, 5*time.Second, "the replica's link to go down", func() bool {
		return sendNodeInfo(ctx, r3.Addr, "replication", "master_link_status") == "down"
	})
	cut := time.Now()
	time.Sleep(300 * ms)
	at = time.Now()
	killed := at
	m3.Kill()
	healed = sendWaitFor(t, 30*time.Second, "the cut-off replica to take over", func() bool {
		return sendNodeInfo(ctx, r3.Addr, "replication", "role") == "master" && sendNodeInfo(ctx, r3.Addr, "cluster", "cluster_state") == "ok"
	})
	_ = rc.ConfigSet(ctx, "masterauth", "").Err()
	phase(fmt.Sprintf("master killed %v after its replica's link was cut", at.Sub(cut).Round(ms)), 2, at, healed)

	time.Sleep(2 * period)
	close(stop)
	wg.Wait()
	for _, err := range other {
		if strings.Contains(err.Error(), "CROSSSLOT") {
			t.Errorf("got CROSSSLOT: %v, want none", err)
		} else {
			t.Errorf("got an error that is not ErrUnavailable: %v, want ErrUnavailable only", err)
		}
	}

	// what the new masters kept (the audit, replicated with the state) against what
	// callers were told (the replies)
	byKey := grants.ByKey()
	var (
		lostAll, unreported, inCut, lostKeys, mostLost, overKeys, mostOver int
		lostOn                                                             [3]int
		overs                                                              []string
	)
	for _, l := range all {
		key, limit := l.stateKey(), l.limits[0]
		told := byKey[key]
		if told == nil {
			continue // a cold key no caller picked
		}
		kept, err := redistest.ReadAudit(ctx, rdb, key)
		if err != nil {
			t.Fatalf("audit of %s: %v", key, err)
		}
		charged := map[int64]int{}
		for _, gr := range kept {
			charged[gr.At.UnixMicro()] += gr.N
		}
		lost := 0
		for _, gr := range told.List() {
			at := gr.At.UnixMicro()
			take := min(gr.N, charged[at])
			charged[at] -= take
			lost += gr.N - take
			if master[l] == 2 && gr.Sent.After(cut) && gr.Sent.Before(killed) {
				inCut += gr.N
			}
		}
		for _, n := range charged {
			unreported += n // ran, but its caller got ErrUnavailable (the reply was lost)
		}
		most := told.MaxInWindow(limit.Period)
		over := max(0, most-bound(l.alg, limit))
		if l.alg == TokenBucket {
			b, _ := told.MaxOverBucket(limit.Rate, limit.Period, limit.Burst)
			over = max(over, b)
		}
		lostAll += lost
		lostOn[master[l]] += lost
		if lost > 0 {
			lostKeys++
			mostLost = max(mostLost, lost)
		}
		if over > 0 {
			overKeys++
			mostOver = max(mostOver, over)
			overs = append(overs, fmt.Sprintf("%s (%v %v): %d over the bound in one period, %d grants lost", key, l.alg, limit, over, lost))
		}
		if over > min(lost, bound(l.alg, limit)) {
			t.Errorf("%s (%v %v): %d permits over the bound in one period, having lost %d grants in the failovers; want at most what it lost",
				key, l.alg, limit, over, lost)
		}
	}
	sort.Strings(overs)
	redistest.Figure(t, "%d calls succeeded. Grants lost by the failovers (told to callers, gone from the new masters): %d permits on %d keys (masters 1/2/3: %d/%d/%d), at most %d on one key; %d were granted on the third master while its replica was cut off. Keys over the bound in a period: %d, at most %d permits over; each within what it lost. Charged but never reported (the caller got ErrUnavailable): %d",
		okCalls.Load(), lostAll, lostKeys, lostOn[0], lostOn[1], lostOn[2], mostLost, inCut, overKeys, mostOver, unreported)
	for _, line := range overs {
		t.Logf("  %s", line)
	}
	if inCut == 0 {
		t.Errorf("nothing was granted on the third master while its replica was cut off, want grants: the test did not test lost writes")
	} else if lostOn[2] < inCut {
		t.Errorf("%d permits granted while the replica was cut off, but %d lost, want all of them lost: the replica had them after all?", inCut, lostOn[2])
	}
	if lostOn[0] != 0 {
		t.Errorf("the manual failover lost %d permits' grants, want 0", lostOn[0])
	}
}
