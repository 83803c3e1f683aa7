package asynqmw

import (
	"context"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/jobmw"
)

// shared is the state of a Setup that its middlewares share: the bound on the tasks
// asleep in them, the server's forwarding interval, the logger, and what they have
// counted.
type shared struct {
	jobmw.Sleepers              // the bound on the tasks asleep in the middlewares
	interval       atomic.Int64 // how late the server may bring a due task: DelayedTaskCheckInterval + TaskCheckInterval, ns
	handed         atomic.Int64 // hand-backs
	requeued       atomic.Int64 // of them, last attempts handed back as copies
	kept           atomic.Int64 // returns that found their booking
	bounced        atomic.Int64 // returns handed back again without a script call (see bounce)
	logger         atomic.Pointer[asynq.Logger]
	pacer          pacer
	cb             jobmw.ComeBack // how early to make handed-back tasks due

	mu     sync.Mutex
	warned bool
}

func newShared() *shared {
	sh := &shared{}
	sh.interval.Store(int64(2 * checkInterval))
	return sh
}

// serverKey is the context key under which Config's BaseContext marks the tasks of
// the server it configured with the Setup's *shared.
type serverKey struct{}

// ours reports whether ctx is a task's of a server whose Config went through the
// Setup's Config: only then does asynq treat a hand-back as the middleware needs.
func (sh *shared) ours(ctx context.Context) bool {
	s, _ := ctx.Value(serverKey{}).(*shared)
	return s == sh
}

func (sh *shared) setLogger(l asynq.Logger) { sh.logger.Store(&l) }

// notConfigured says once, at error level, that a middleware runs on a server whose
// Config did not go through Setup.Config: its tasks sleep for their permits in their
// workers instead of being handed back.
func (sh *shared) notConfigured() {
	sh.mu.Lock()
	seen := sh.warned
	sh.warned = true
	sh.mu.Unlock()
	if seen {
		return
	}
	const msg = "asynqmw: a Setup's middleware runs on a server whose asynq.Config did not go through " +
		"Setup.Config: throttled tasks sleep in their workers until their permits instead of being handed back. " +
		"Build the server with asynq.NewServerFromRedisClient(rdb, jt.Config(cfg))."
	if l := sh.logger.Load(); l != nil {
		(*l).Error(msg)
		return
	}
	log.Print(msg)
}

// checkInterval returns how late the server may bring a due task to a worker.
func (sh *shared) checkInterval() time.Duration { return time.Duration(sh.interval.Load()) }
