package throttle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// The tests' fake-clock scripts (helpers_test.go) have fake-clock multi forms, so
// that timelines on a real server put several keys in one script call as the
// production scripts do. A fake multi form reads the clock of its first key's hash
// tag: a timeline sets every tag of its keys to the same time.
func init() {
	names := map[Algorithm]lua.Name{SlidingWindow: lua.SlidingWindow, TokenBucket: lua.GCRA,
		FixedWindow: lua.FixedWindow, SlidingCounter: lua.SlidingCounter}
	for alg, s := range fakeClock {
		multiForms[s] = redistest.FakeClockScript(names[alg].MultiSource())
	}
	multiForms[fakeSemaphore] = redistest.FakeClockScript(lua.Semaphore.MultiSource())
}

// keyCalls counts the script calls (EVALSHA, EVAL) that go to the server in
// pipelines, and how many of them are multi forms (ARGV[1] lua.MultiForm).
type keyCalls struct{ calls, multi atomic.Int64 }

func (c *keyCalls) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (c *keyCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (c *keyCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if !isEval(cmd) {
				continue
			}
			c.calls.Add(1)
			a := cmd.Args()
			nk, _ := a[2].(int)
			if len(a) > 3+nk && fmt.Sprint(a[3+nk]) == fmt.Sprint(lua.MultiForm) {
				c.multi.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

func (c *keyCalls) reset() { c.calls.Store(0); c.multi.Store(0) }

// A round trip that carries the requests of several keys of one algorithm runs them in
// ONE script call on a client of one server (miniredis, redis-server), and each key's
// requests are decided exactly as calls of their own: on a timeline, a forced round
// trip of AllowN and Reserve calls on five keys (a key's several requests a batch, a
// lone one a single call) and one key of the wrong type gets what the same calls made
// one by one on other keys get, errors included (the wrong-type key's requests fail
// alone, ErrCorruptState), and leaves the same state. On the cluster each key keeps
// its own call (a transaction keeps to one slot): same answers, one call per key.
func TestMultiKeyDecidesAsSeparateCalls(t *testing.T) {
	type keyCall struct {
		key int
		c   call
	}
	calls := []keyCall{
		{0, call{false, 1, 0}}, {1, call{true, 2, 0}}, {2, call{false, 3, 0}}, {5, call{false, 1, 0}},
		{3, call{true, 1, time.Second}}, {0, call{false, 1, 0}}, {4, call{true, 2, 300 * ms}},
		{1, call{true, 3, 5 * time.Second}}, {0, call{false, 0, 0}}, {5, call{true, 1, time.Second}},
		{2, call{true, 1, 0}}, {3, call{true, 2, 2 * time.Second}}, {4, call{false, 9, 0}},
	}
	const keys = 6 // key 5 holds a hash
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		sc := &keyCalls{}
		b.Client.AddHook(sc)
		for _, alg := range allAlgorithms {
			t.Run(alg.String(), func(t *testing.T) {
				tl := newTimeline(t, b)
				lim := Limit{Rate: 4, Period: time.Second, Burst: 4}
				var batched, alone []*Limiter
				ctx := context.Background()
				for i := range keys {
					batched = append(batched, tl.limiter(fmt.Sprintf("mk-b%d-%v", i, alg), lim, WithAlgorithm(alg)))
					alone = append(alone, tl.limiter(fmt.Sprintf("mk-a%d-%v", i, alg), lim, WithAlgorithm(alg), WithCoalescing(false)))
				}
				for _, l := range []*Limiter{batched[keys-1], alone[keys-1]} {
					if err := b.Client.HSet(ctx, l.keys[0], "f", "v").Err(); err != nil {
						t.Fatal(err)
					}
				}
				loadScripts(t, b.Client, batched[0].script)
				for step := range 3 {
					tl.at(time.Duration(step) * 1700 * ms)
					want := make([]outcome, len(calls))
					for i, c := range calls {
						want[i] = c.c.run(ctx, alone[c.key])
					}
					sc.reset()
					got := runBatch(t, batched[0].src.batch, len(calls), func(i int) outcome {
						return calls[i].c.run(ctx, batched[calls[i].key])
					})
					for i, c := range calls {
						g, w := got[i], want[i]
						// a Redis error's text as a call of its own got it ends with where the
						// script raised it, which a call in a batch or a multi form does not say
						// (miniredis words a Lua error its own way): the key's and the error's alike
						w.err = strings.ReplaceAll(w.err, "mk-a", "mk-b")
						if c.key == keys-1 {
							w.err, _, _ = strings.Cut(w.err, ": key ")
							g.err, _, _ = strings.Cut(g.err, ": key ")
						}
						if g.res != w.res || g.ok != w.ok || g.delay != w.delay || g.err != w.err {
							t.Fatalf("step %d call %d %+v: in one script call %+v, alone %+v", step, i, c, g, w)
						}
						if c.key == keys-1 && !errors.Is(g.errv, ErrCorruptState) {
							t.Fatalf("step %d call %d on the wrong-type key: %v, want ErrCorruptState", step, i, g.errv)
						}
						if c.key != keys-1 && c.c.n <= lim.Burst && g.err != "" {
							t.Fatalf("step %d call %d: %v", step, i, g.errv)
						}
					}
					wantCalls, wantMulti := int64(1), int64(1)
					if b.Kind == redistest.Cluster {
						wantCalls, wantMulti = keys, 0
					}
					if n, m := sc.calls.Load(), sc.multi.Load(); n != wantCalls || m != wantMulti {
						t.Fatalf("step %d: %d requests on %d keys went in %d script calls (%d multi forms), want %d (%d)",
							step, len(calls), keys, n, m, wantCalls, wantMulti)
					}
					for i := range keys - 1 { // the state each key was left with
						g, w := (call{false, 0, 0}).run(ctx, batched[i]), (call{false, 0, 0}).run(ctx, alone[i])
						if g.res != w.res {
							t.Fatalf("step %d key %d: state after: in one script call %+v, alone %+v", step, i, g.res, w.res)
						}
					}
				}
			})
		}
	})
}

// Semaphores' requests on several keys go in one script call too, each decided as
// its own call: four semaphores of one slot each, two acquires each in one round trip:
// each grants its first and denies its second.
func TestMultiKeySemaphores(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		sc := &keyCalls{}
		b.Client.AddHook(sc)
		tl := newTimeline(t, b)
		var sems []*Semaphore
		for i := range 4 {
			sems = append(sems, tl.semaphore(fmt.Sprintf("mk-sem%d", i), 1, WithLeaseTTL(time.Second)))
		}
		ctx := context.Background()
		loadScripts(t, b.Client, sems[0].script)
		sc.reset()
		got := make([]semOutcome, 8)
		runBatch(t, sems[0].src.batch, len(got), func(i int) outcome {
			got[i] = semCall{semAcquire, semID(i), false}.run(ctx, sems[i%4])
			return outcome{}
		})
		for i, g := range got {
			if g.err != "" || g.r.ok != (i < 4) {
				t.Fatalf("acquire %d on semaphore %d: %+v, want ok %v", i, i%4, g, i < 4)
			}
		}
		want := int64(1)
		if b.Kind == redistest.Cluster {
			want = 4
		}
		if n := sc.calls.Load(); n != want {
			t.Fatalf("8 acquires on 4 semaphores: %d script calls, want %d", n, want)
		}
	})
}

// A lost reply of a round trip that carried several keys in one script call fails
// each caller with ErrUnavailable, and what the call granted stands once on every
// key (the round trip is MULTI/EXEC, never re-sent).
func TestMultiKeyLostReply(t *testing.T) {
	direct, proxy, rdb := redistest.NewProxied(t)
	sc := &keyCalls{}
	rdb.AddHook(sc)
	ctx := context.Background()
	for _, alg := range allAlgorithms {
		var lims []*Limiter
		for i := range 4 {
			l, err := New(rdb, fmt.Sprintf("mklost%d%v", i, alg), PerHour(10), WithAlgorithm(alg), WithKeyPrefix(direct.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			lims = append(lims, l)
		}
		loadScripts(t, rdb, lims[0].script) // so the lost reply is the script's
		sc.reset()
		proxy.DropReplyTo("exec")
		got := runBatch(t, lims[0].src.batch, 8, func(i int) outcome { return (call{false, 1, 0}).run(ctx, lims[i%4]) })
		for i, g := range got {
			if !errors.Is(g.errv, ErrUnavailable) {
				t.Fatalf("%v: call %d of a round trip whose reply was lost: %+v, want ErrUnavailable", alg, i, g)
			}
		}
		if n, m := sc.calls.Load(), sc.multi.Load(); n != 1 || m != 1 {
			t.Fatalf("%v: 8 requests on 4 keys: %d script calls (%d multi forms), want 1 (1)", alg, n, m)
		}
		for i, l := range lims {
			res, err := l.AllowN(ctx, 0)
			if err != nil || res.Remaining != 8 {
				t.Fatalf("%v: key %d after the lost round trip: %+v, %v; want its 2 grants charged once (8 remaining)", alg, i, res, err)
			}
		}
	}
}

// After SCRIPT FLUSH the multi form goes again by EVAL (NOSCRIPT ran nothing): every
// request is answered once, and the next round trip finds the script loaded.
func TestMultiKeyScriptFlush(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		if b.Kind == redistest.Cluster {
			t.Skip("no multi form on a cluster (TestMultiKeyDecidesAsSeparateCalls shows it)")
		}
		evals := evalCount()
		b.Client.AddHook(evals)
		ctx := context.Background()
		var lims []*Limiter
		for i := range 3 {
			l, err := New(b.Client, fmt.Sprintf("mkflush%d", i), PerHour(4), WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			lims = append(lims, l)
		}
		for round := range 2 {
			if round == 0 {
				if err := scriptFlush(ctx, b.Client); err != nil {
					t.Fatal(err)
				}
			}
			before := evals.n.Load()
			got := runBatch(t, lims[0].src.batch, 6, func(i int) outcome { return (call{false, 1, 0}).run(ctx, lims[i%3]) })
			for i, g := range got {
				if g.err != "" || !g.res.Allowed || g.res.Remaining != 3-2*round-i/3 {
					t.Fatalf("round %d request %d: %+v, want allowed with %d remaining", round, i, g, 3-2*round-i/3)
				}
			}
			if n := evals.n.Load() - before; n != int64(1-round) {
				t.Fatalf("round %d: %d EVALs, want %d", round, n, 1-round)
			}
		}
	})
}

// Only a client of one server puts several keys in one call: a cluster's and a Ring's
// groups keep their own calls.
func TestMultiKeyClients(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1", "b": "127.0.0.1:2"}})
	defer ring.Close()
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cluster.Close()
	failover := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}})
	defer failover.Close()
	plain := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer plain.Close()
	for _, c := range []struct {
		rdb  redis.UniversalClient
		want bool
	}{{ring, false}, {cluster, false}, {failover, true}, {plain, true}} {
		if got := multiKeys(c.rdb); got != c.want {
			t.Fatalf("%T: multiKeys %v, want %v", c.rdb, got, c.want)
		}
		g := []*group{{script: lua.GCRA.Script()}, {script: lua.GCRA.Script()}, {script: lua.Pause.Script()}}
		calls := combine(c.rdb, g)
		if want := map[bool]int{true: 2, false: 3}[c.want]; len(calls) != want {
			t.Fatalf("%T: %d calls of 3 groups (2 of one script), want %d", c.rdb, len(calls), want)
		}
	}
}

// loadScripts loads s and its multi form on every server behind rdb (a call that finds
// them loaded is one script call, not NOSCRIPT and EVAL).
func loadScripts(t *testing.T, rdb redis.UniversalClient, s *redis.Script) {
	t.Helper()
	for _, x := range []*redis.Script{s, multiForms[s]} {
		if err := x.Load(context.Background(), rdb).Err(); err != nil {
			t.Fatal(err)
		}
	}
}
