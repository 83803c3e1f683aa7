package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// stats counts what the fleet did.
type stats struct {
	mu   sync.Mutex
	runs map[string]int // task payload → successful runs

	freeMu     sync.Mutex
	freeRuns   map[string]int       // unthrottled task payload → runs
	freeIn     map[string]time.Time // unthrottled task payload → just before its enqueue
	freeWait   time.Duration        // the longest an unthrottled task took from its enqueue to done
	freeFrom   time.Time            // the first unthrottled task enqueued
	freeLatest time.Time            // the last unthrottled task done

	loopDone, httpDone   atomic.Int64 // calls that got 200
	loopTried, httpTried atomic.Int64 // calls made (or given up)
	archived             atomic.Int64 // tasks that failed on their last attempt
	slept, handedBack    atomic.Int64 // the middleware's decisions
	failures             atomic.Int64 // task errors asynq saw (other than throttling)
	retriesSpent         atomic.Int64 // task runs with a retry count above 0
	otherErrs            atomic.Int64
	firstErrMu           sync.Mutex
	errText              string // the first of otherErrs
}

func (s *stats) taskRan(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runs == nil {
		s.runs = map[string]int{}
	}
	s.runs[id]++
}

func (s *stats) freeStart(t time.Time) {
	s.freeMu.Lock()
	defer s.freeMu.Unlock()
	s.freeFrom = t
}

// freeEnqueued records when the enqueue of unthrottled task id began.
func (s *stats) freeEnqueued(id string, t time.Time) {
	s.freeMu.Lock()
	defer s.freeMu.Unlock()
	if s.freeIn == nil {
		s.freeIn = map[string]time.Time{}
	}
	s.freeIn[id] = t
}

func (s *stats) freeRan(id string) {
	s.freeMu.Lock()
	defer s.freeMu.Unlock()
	if s.freeRuns == nil {
		s.freeRuns = map[string]int{}
	}
	s.freeRuns[id]++
	s.freeLatest = time.Now()
	if in, ok := s.freeIn[id]; ok {
		s.freeWait = max(s.freeWait, s.freeLatest.Sub(in))
	}
}

// freeLongest is the longest an unthrottled task took from its enqueue to done: how
// long the throttled backlog held it, without the time the enqueueing loop took.
func (s *stats) freeLongest() time.Duration {
	s.freeMu.Lock()
	defer s.freeMu.Unlock()
	return s.freeWait
}

// freeDone returns how many distinct unthrottled tasks ran.
func (s *stats) freeDone() int {
	s.freeMu.Lock()
	defer s.freeMu.Unlock()
	return len(s.freeRuns)
}

// freeLatency is the time from the first unthrottled task enqueued to the last done.
func (s *stats) freeLatency() time.Duration {
	s.freeMu.Lock()
	defer s.freeMu.Unlock()
	if s.freeLatest.IsZero() {
		return 0
	}
	return s.freeLatest.Sub(s.freeFrom)
}

// tasksDone returns how many distinct tasks ran.
func (s *stats) tasksDone() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.runs)
}

// ranTwice returns how many tasks ran more than once.
func (s *stats) ranTwice() int {
	s.mu.Lock()
	n := 0
	for _, k := range s.runs {
		if k > 1 {
			n++
		}
	}
	s.mu.Unlock()
	s.freeMu.Lock()
	defer s.freeMu.Unlock()
	for _, k := range s.freeRuns {
		if k > 1 {
			n++
		}
	}
	return n
}

// otherErr counts an error of the loop or the HTTP client (not the end of the run).
func (s *stats) otherErr(err error) {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return
	}
	s.otherErrs.Add(1)
	s.firstErrMu.Lock()
	defer s.firstErrMu.Unlock()
	if s.errText == "" {
		s.errText = err.Error()
	}
}

// summary is the end-of-run report.
type summary struct {
	cfg     config
	where   string
	limit   throttle.Limit
	elapsed time.Duration
	stopped string // why the run ended early, if it did
	st      *stats
	nFinal  int
	grants  *redistest.Grants
	api     *upstream
	queue   *asynq.QueueInfo

	peakSleeping, sleepBound int   // tasks asleep in one server's middleware
	bounced                  int64 // returns handed back again without a script call (Stats.Bounced)
}

// print writes the summary and returns an error naming every promise that was broken.
func (s summary) print(out io.Writer) error {
	cfg, st, q := s.cfg, s.st, s.queue
	permits := s.grants.Total()
	first, last := s.grants.Span()
	span := last.Sub(first)
	limitRate := float64(s.limit.Rate) / s.limit.Period.Seconds()
	vendorRate := float64(cfg.rate) / cfg.period.Seconds()
	// The sliding window lets N permits take effect in no less than (⌈N/rate⌉-1)
	// periods (a full window at once, then one each period): the share of that in
	// the time they took is the share of the limiter's rate the fleet used.
	minSpan := time.Duration((permits+s.limit.Rate-1)/s.limit.Rate-1) * s.limit.Period
	util := 0.0
	if span > 0 {
		util = min(minSpan.Seconds()/span.Seconds(), 1)
	}
	maxLimiter := s.grants.MaxInWindow(s.limit.Period)
	maxVendor := s.grants.MaxInWindow(cfg.period)
	apiTotal, api429, _ := s.api.counts(0)
	apiMax := s.api.maxInWindow(cfg.period)

	fmt.Fprintf(out, "\nSummary: %s; %d asynq servers × %d workers, a goroutine loop, an HTTP client with %d goroutines\n",
		s.where, cfg.servers, cfg.concurrency, cfg.httpWorkers)
	fmt.Fprintf(out, "  limit       vendor API %d per %v (%.1f/s); shared limiter %v (%.2f/s): the %v margin covers the way from Redis to the API\n",
		cfg.rate, cfg.period, vendorRate, s.limit, limitRate, cfg.margin)
	fmt.Fprintf(out, "  work        asynq %d/%d tasks (%d with MaxRetry(0)), %d ran more than once; loop %d/%d; HTTP %d/%d; in %.1fs\n",
		st.tasksDone(), cfg.tasks, s.nFinal, st.ranTwice(), st.loopDone.Load(), cfg.loop, st.httpDone.Load(), cfg.httpCalls, s.elapsed.Seconds())
	fmt.Fprintf(out, "  rate        %d permits took effect over %.2fs; the limiter allows them in no less than %.2fs: %.1f%% of its rate used (%.2f/s, %.1f%% of the vendor's)\n",
		permits, span.Seconds(), minSpan.Seconds(), 100*util, util*limitRate, 100*util*limitRate/vendorRate)
	fmt.Fprintf(out, "  windows     most grants in any %v (Redis server time): %d (limit %d); in any %v: %d\n",
		s.limit.Period, maxLimiter, s.limit.Rate, cfg.period, maxVendor)
	fmt.Fprintf(out, "  vendor API  %d requests, %d × 429, most arrivals in any %v: %d (limit %d); %d permits went unused (slots passed before their task came back)\n",
		apiTotal, api429, cfg.period, apiMax, cfg.rate, max(permits-apiTotal, 0))
	fmt.Fprintf(out, "  asynq       %d archived, %d failed (Inspector), %d retries spent; %d hand-backs to asynq (%.2f per throttled task; %d of them back before their slot with the sleeping bound full, without a script call), %d sleeps in the handler\n",
		q.Archived, q.FailedTotal, st.retriesSpent.Load(), st.handedBack.Load(),
		float64(st.handedBack.Load())/float64(max(cfg.tasks, 1)), s.bounced, st.slept.Load())
	fmt.Fprintf(out, "  workers     unthrottled %d/%d tasks of %v done %v after the first was enqueued, behind the throttled backlog (the longest any one took from its enqueue to done: %v); most tasks asleep in one server's middleware at once: %d (bound %d of its %d workers: the others stay free for tasks that run)\n",
		st.freeDone(), cfg.free, cfg.freeWork, st.freeLatency().Round(time.Millisecond), st.freeLongest().Round(time.Millisecond), s.peakSleeping, s.sleepBound, cfg.concurrency)

	var broken []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			broken = append(broken, fmt.Sprintf(format, args...))
		}
	}
	check(s.stopped == "", "%s", s.stopped)
	check(st.tasksDone() == cfg.tasks, "%d of %d tasks ran", st.tasksDone(), cfg.tasks)
	check(st.freeDone() == cfg.free, "%d of %d unthrottled tasks ran", st.freeDone(), cfg.free)
	check(s.peakSleeping <= s.sleepBound, "%d tasks asleep in the middleware, above the bound %d", s.peakSleeping, s.sleepBound)
	check(st.ranTwice() == 0, "%d tasks ran more than once", st.ranTwice())
	check(int(st.loopDone.Load()) == cfg.loop && int(st.httpDone.Load()) == cfg.httpCalls, "loop or HTTP calls missing")
	check(maxLimiter <= s.limit.Rate, "%d grants in one %v window", maxLimiter, s.limit.Period)
	// a 429 while the grants kept the limit is a request that arrived more than the
	// margin after its grant (see the note below): the host's delay, sent again
	check(api429 == 0 || maxLimiter <= s.limit.Rate, "the vendor API answered 429 %d times, with %d grants in one %v window", api429, maxLimiter, s.limit.Period)
	check(q.Archived == 0 && q.FailedTotal == 0 && st.failures.Load() == 0, "tasks archived or failed")
	check(st.retriesSpent.Load() == 0, "%d task runs had spent a retry", st.retriesSpent.Load())
	check(st.otherErrs.Load() == 0, "%d errors in the loop or HTTP client, first: %s", st.otherErrs.Load(), st.errText)
	if api429 > 0 && maxLimiter <= s.limit.Rate {
		fmt.Fprintf(out, "note: the grants kept the limit, yet the API saw %d requests within %v: some arrived more than the %v margin after their grant (a starved host delays wake-ups and requests); the %d refused were sent again with new permits; a fleet whose requests take longer to arrive needs a larger -margin\n",
			apiMax, cfg.period, cfg.margin, api429)
	}
	if len(broken) > 0 {
		fmt.Fprintln(out, "FAIL:", strings.Join(broken, "; "))
		return errors.New(strings.Join(broken, "; "))
	}
	if api429 > 0 {
		fmt.Fprintf(out, "PASS: the fleet's grants stayed inside the limit (the vendor refused %d late arrivals, sent again); no task was lost, run twice, failed or archived.\n", api429)
		return nil
	}
	fmt.Fprintln(out, "PASS: the fleet stayed inside the limit; no task was lost, run twice, failed or archived.")
	return nil
}
