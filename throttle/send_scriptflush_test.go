package throttle

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// SCRIPT FLUSH every 200ms while every algorithm and a semaphore are in use: no caller
// sees an error (a round trip whose EVALSHA meets NOSCRIPT sends the script with EVAL,
// once),
// and nothing is charged twice: the grants the server made, recorded by the script
// itself in the same call (redistest.AuditSource), are exactly the grants the replies
// reported, which are exactly the permits callers were told they got. No period holds
// more than the bound. The test fails if no call had to fall back to EVAL (the flushes
// did not bite).
//
// Runs 2s (10 flushes) by default, 30s with JOBTHROTTLE_LONG=1. Tolerances: none.
func TestScriptFlushUnderLoad(t *testing.T) {
	const (
		period = 200 * ms
		every  = 200 * ms
	)
	run := 2 * time.Second
	if longFaultTests() {
		run = 30 * time.Second
	}
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		grants := redistest.RecordGrants(b.Client)
		evals := evalCount()
		b.Client.AddHook(evals)
		rate := 50
		if b.Kind == redistest.Mini {
			rate = 10 // miniredis runs in this process, re-reading the script per call
		}
		var lims []*Limiter
		for _, alg := range allAlgorithms {
			limit := Limit{Rate: rate, Period: period}
			if alg == TokenBucket {
				limit.Burst = 3
			}
			l, err := New(b.Client, "flush-"+alg.String(), limit, WithAlgorithm(alg), WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			l.useScript(audited[l.t.script])
			lims = append(lims, l)
		}
		sem, err := NewSemaphore(b.Client, "flush-sem", 4, WithKeyPrefix(b.Prefix), WithLeaseTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}

		var (
			done     = make(chan struct{})
			wg       sync.WaitGroup
			mu       sync.Mutex
			errs     []error
			believe  = map[string]int{}
			semRuns  atomic.Int64
			flushes  int
			flushErr error
		)
		fail := func(err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
		stopped := func() bool {
			select {
			case <-done:
				return true
			default:
				return false
			}
		}
		for _, l := range lims {
			for w := 0; w < 8; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					n := 1 + w%3
					for !stopped() {
						if w < 6 {
							if err := l.WaitN(ctx, n); err != nil {
								fail(err)
								return
							}
						} else {
							r, err := l.AllowN(ctx, n)
							if err != nil {
								fail(err)
								return
							}
							if !r.Allowed {
								time.Sleep(min(r.RetryAfter, 5*ms))
								continue
							}
						}
						mu.Lock()
						believe[l.stateKey()] += n
						mu.Unlock()
					}
				}()
			}
		}
		for w := 0; w < 6; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stopped() {
					err := sem.Do(ctx, func(context.Context) error { time.Sleep(2 * ms); return nil })
					if err != nil {
						fail(err)
						return
					}
					semRuns.Add(1)
				}
			}()
		}
		tick := time.NewTicker(every)
		end := time.After(run)
	flushing:
		for {
			select {
			case <-tick.C:
				if err := scriptFlush(ctx, b.Client); err != nil {
					flushErr = err
					break flushing
				}
				flushes++
			case <-end:
				break flushing
			}
		}
		tick.Stop()
		close(done)
		wg.Wait()
		if flushErr != nil {
			t.Fatalf("SCRIPT FLUSH: %v", flushErr)
		}
		for _, err := range errs {
			t.Errorf("a caller saw an error: got %v, want none", err)
		}
		if evals.n.Load() == 0 {
			t.Fatalf("%d flushes and no call fell back to EVAL: the flushes did not reach the scripts", flushes)
		}

		byKey := grants.ByKey()
		for _, l := range lims {
			key, limit := l.stateKey(), l.limits[0]
			server, err := redistest.ReadAudit(ctx, b.Client, key)
			if err != nil {
				t.Fatal(err)
			}
			charged := map[int64]int{}
			total := 0
			for _, gr := range server {
				charged[gr.At.UnixMicro()] += gr.N
				total += gr.N
			}
			told := byKey[key]
			if told == nil {
				t.Fatalf("%v: no grants recorded, want some", l.alg)
			}
			replied := map[int64]int{}
			for _, gr := range told.List() {
				replied[gr.At.UnixMicro()] += gr.N
			}
			double, missing := 0, 0
			for at, n := range charged {
				double += max(0, n-replied[at])
			}
			for at, n := range replied {
				missing += max(0, n-charged[at])
			}
			most := told.MaxInWindow(period)
			redistest.Figure(t, "%s: %v %v under %d SCRIPT FLUSHes: %d calls, %d permits charged by the server, %d reported by replies, %d believed by callers; charged twice %d, reported but not charged %d; most in any %v: %d (bound %d)",
				b.Kind, l.alg, limit, flushes, told.Calls(), total, told.Total(), believe[key], double, missing, period, most, bound(l.alg, limit))
			if double != 0 || missing != 0 || told.Total() != believe[key] {
				t.Errorf("%v: the server charged %d permits, replies reported %d, callers believe %d (%d charged without a reply saying so); want all equal",
					l.alg, total, told.Total(), believe[key], double)
			}
			if most > bound(l.alg, limit) {
				t.Errorf("%v: %d permits within one %v, want at most %d", l.alg, most, period, bound(l.alg, limit))
			}
		}
		redistest.Figure(t, "%s: %d flushes in %v; %d script calls fell back to EVAL; %d semaphore runs; %d caller-visible errors",
			b.Kind, flushes, run, evals.n.Load(), semRuns.Load(), len(errs))
		if semRuns.Load() == 0 {
			t.Error("the semaphore ran nothing, want runs")
		}
	})
}
