package rivermw

import (
	"context"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/jobmw"
)

// pacer is jobmw's Pacer, which keeps a process's worker starts within each limit,
// with how a job waits for it.
type pacer struct{ jobmw.Pacer }

// start takes the job a run slot and returns when the job may start through li (at
// once, mostly), with the time it counted as the job's start; or ctx.Err() if ctx ends
// first. A job the pacer delays gives its run slot back while it waits, so that jobs
// of other kinds run meanwhile.
func (p *pacer) start(ctx context.Context, li jobmw.Limit, slot *runSlot) (time.Time, error) {
	for {
		if err := slot.take(ctx); err != nil {
			return time.Time{}, err
		}
		d, at := p.Wait(li, time.Now)
		if d == 0 {
			return at, nil
		}
		slot.leave()
		if err := jobmw.Sleep(ctx, d); err != nil {
			return time.Time{}, err
		}
	}
}
