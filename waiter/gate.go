package waiter

import (
	"context"
	"time"
)

// Gate is a Pauser that can also hold back, at once and in this process only, every
// caller of the same limit: *throttle.Limiter is one. A pause reaches the other
// processes through the store, one round trip later; a hold acts before that round
// trip starts, and also stops callers whose permits were granted but not yet used.
//
// Hold makes every Pass in this process wait until d from now (by the Gate's
// clock); a longer hold already set is kept, and d <= 0 does nothing. It does not
// call the store and never fails.
//
// Pass returns (false, nil) at once when nothing holds the gate. Otherwise it waits
// until the hold ends and returns (true, nil): the caller's permits, if it had any,
// fell inside the hold and must not be used (Wait books again). It returns ctx.Err()
// if ctx ends first, and at once an error wrapping ErrWouldExceedDeadline if the hold
// ends after ctx's deadline.
//
// Both must be safe for simultaneous use.
type Gate interface {
	Pauser
	Hold(d time.Duration)
	Pass(ctx context.Context) (held bool, err error)
}

// passer is the part of Gate that Wait uses.
type passer interface {
	Pass(ctx context.Context) (held bool, err error)
}
