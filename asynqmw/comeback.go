package asynqmw

import (
	"time"

	"github.com/jobthrottle/jobthrottle/internal/jobmw"
)

// lateGrace bounds how long after its slot a task that comes back may still run on
// it (at most a quarter of the limit's shortest period): about the time its call
// takes to reach Redis. A later one books anew, its passed permit unused: started on
// it, it would lag its permit by as much, and a start that lags its permit more than
// another process's next ones puts more than the limit's Rate in a window of its
// Period across processes (see jobmw.Pacer).
const lateGrace = 20 * time.Millisecond

// retryDue is when asynq makes a task handed back now due, asked to after back:
// asynq stores the retry time in whole seconds, truncated; one truncated into the
// past is due at once, not then (else a short hand-back would read to jobmw.ComeBack
// as late by up to a second, and a longer margin would make more tasks bounce: a
// feedback loop).
func retryDue(now time.Time, back time.Duration) time.Time {
	return jobmw.Later(time.Unix(now.Add(back).Unix(), 0), now.Round(0))
}
