package rivermw

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/jobmw"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// shared is the state of a Setup that its middlewares share: the client's queues as
// Config found them, the bound on the jobs asleep in the middlewares, and what they
// have counted.
type shared struct {
	lanes          atomic.Pointer[map[string]*lane] // set once, by Config
	jobmw.Sleepers                                  // the bound on the jobs asleep in the middlewares
	snoozed        atomic.Int64                     // snoozes
	kept           atomic.Int64                     // returns that found their booking
	bounced        atomic.Int64                     // returns snoozed again without a script call (see bounce)
	pacer          pacer
	cb             jobmw.ComeBack // how early to make snoozed jobs due
}

// lane is one queue of the client whose config went through Config.
type lane struct {
	// gate lets at most the queue's MaxWorkers (as the user gave it to Config) of its
	// jobs run at once, awake: Config gives River MaxSleepingWorkers more workers than
	// that, for the jobs asleep in the middleware. Waiting jobs get in in arrival
	// order (a channel's senders queue first in, first out).
	gate chan struct{}
	// interval is how late River may bring a due job of the queue to a worker: its
	// FetchPollInterval and the poll's jitter.
	interval time.Duration
}

// defaultInterval is interval for a queue Config did not see: River's default
// FetchPollInterval and its jitter.
const defaultInterval = river.FetchPollIntervalDefault + river.FetchPollIntervalDefault/10

// laneOf returns the lane of queue, or nil for a queue Config did not see.
func (sh *shared) laneOf(queue string) *lane {
	if m := sh.lanes.Load(); m != nil {
		return (*m)[queue]
	}
	return nil
}

// interval returns how late River may bring a due job of queue to a worker.
func (sh *shared) interval(queue string) time.Duration {
	if l := sh.laneOf(queue); l != nil {
		return l.interval
	}
	return defaultInterval
}

// runKey is the context key of a job's *runSlot.
type runKey struct{}

// runSlot is a job's place among those of its queue that run (held) or not; the job's
// own goroutine is its only user. g is nil for a queue Config did not see.
type runSlot struct {
	sh   *shared
	g    chan struct{}
	held bool
}

// enter returns ctx with the job's run slot, making one (not held) for a job the
// first of the Setup's middlewares sees, and reports whether this is the first.
func (sh *shared) enter(ctx context.Context, job *rivertype.JobRow) (context.Context, *runSlot, bool) {
	if rs, ok := ctx.Value(runKey{}).(*runSlot); ok && rs.sh == sh {
		return ctx, rs, false
	}
	rs := &runSlot{sh: sh}
	if l := sh.laneOf(job.Queue); l != nil {
		rs.g = l.gate
	}
	return context.WithValue(ctx, runKey{}, rs), rs, true
}

// middleware returns the worker middleware that runs step for each job, with the
// job's run slot and the rest of the chain: step gets the job past its limit, gives the
// slot up while it may sleep (leave), takes it back before the worker runs (take), and
// calls doInner. The first of the Setup's middlewares gives the slot back when the job
// is done, also when the worker panics.
func (sh *shared) middleware(step func(ctx context.Context, job *rivertype.JobRow, slot *runSlot, doInner func(context.Context) error) error) *Middleware {
	return &Middleware{work: func(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
		ctx, slot, first := sh.enter(ctx, job)
		if first {
			defer slot.leave()
		}
		return step(ctx, job, slot, doInner)
	}}
}

// leave gives the slot back, if held: the job sleeps, or is done.
func (rs *runSlot) leave() {
	if rs.held {
		<-rs.g
		rs.held = false
	}
}

// take gets the job a slot to run in, waiting for one if every one is taken; it
// returns ctx.Err() if ctx ends first.
func (rs *runSlot) take(ctx context.Context) error {
	if rs.g == nil || rs.held {
		return nil
	}
	select {
	case rs.g <- struct{}{}:
		rs.held = true
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// gatePlugin is what Config installs in the client: as worker middleware (outermost of
// the client's own) it gives each job its run slot, and as a WorkBegin hook, which
// River calls after every middleware, just before the worker, it takes the slot for a
// job none of the Setup's middlewares took one for (a kind not throttled). So every
// job of a queue Config saw runs within the queue's MaxWorkers, wherever the Setup's
// middlewares are installed.
type gatePlugin struct {
	river.PluginDefaults
	sh *shared
	mw *Middleware
}

func newGatePlugin(sh *shared) *gatePlugin {
	return &gatePlugin{sh: sh, mw: sh.middleware(func(ctx context.Context, _ *rivertype.JobRow, _ *runSlot, doInner func(context.Context) error) error {
		return doInner(ctx)
	})}
}

// Work implements rivertype.WorkerMiddleware.
func (g *gatePlugin) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	return g.mw.Work(ctx, job, doInner)
}

// WorkBegin implements rivertype.HookWorkBegin.
func (g *gatePlugin) WorkBegin(ctx context.Context, _ *rivertype.JobRow) error {
	if rs, ok := ctx.Value(runKey{}).(*runSlot); ok && rs.sh == g.sh {
		return rs.take(ctx)
	}
	return nil
}

var (
	_ rivertype.WorkerMiddleware = (*gatePlugin)(nil)
	_ rivertype.HookWorkBegin    = (*gatePlugin)(nil)
	_ rivertype.Plugin           = (*gatePlugin)(nil)
)
