package asynqmw

import (
	"context"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/jobmw"
)

// pacer is jobmw's Pacer, which keeps a process's handler starts within each limit,
// with how a task waits for it.
type pacer struct{ jobmw.Pacer }

// start returns when the task may start through li (at once, mostly), with the time
// it counted as the task's start; or ctx.Err() if ctx ends first. With sleep false it
// does not wait: it returns how long the task would have to (0 and the start counted
// when it may go at once).
func (p *pacer) start(ctx context.Context, li jobmw.Limit, sleep bool) (time.Time, time.Duration, error) {
	for {
		d, at := p.Wait(li, time.Now)
		if d == 0 {
			return at, 0, nil
		}
		if !sleep {
			return time.Time{}, d, nil
		}
		if err := jobmw.Sleep(ctx, d); err != nil {
			return time.Time{}, 0, err
		}
	}
}
