package throttle

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/booking"
	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/waiter"
)

// ReserveCost is Reserve for one call whose costs are known only after it: it books the
// call and its estimated cost in each unit (cost, by unit: the limits with that Unit
// count it; a unit cost does not name costs 0), at once on every limit, as Reserve
// books n. Once the call's actual costs are known (an LLM answer's usage), settle them
// with the reservation's Settle: the difference is charged at the booking's place, so a
// refund frees room for the callers behind it and a debt holds them back, for every
// process. A booking never settled keeps its estimate; nothing outlives the limits'
// longest period.
//
// Errors are Reserve's, ErrInvalidArgument for a negative cost or one in a unit no
// limit (nor the tenant's caps) counts, and ErrExceedsLimit for a cost above what its
// unit's limits can ever grant.
func (l *Limiter) ReserveCost(ctx context.Context, cost map[string]int, maxWait time.Duration) (*waiter.Reservation, error) {
	c, err := l.costed(cost)
	if err != nil {
		return nil, err
	}
	if err := c.check(ctx, 1); err != nil {
		return nil, err
	}
	if maxWait < 0 {
		return nil, fmt.Errorf("%w: maxWait %v", ErrInvalidArgument, maxWait)
	}
	g, err := c.acquire(ctx, 1, maxWait, booking.From(ctx), 0, false)
	if err != nil {
		return nil, err
	}
	return waiter.NewCostReservation(g.granted, g.wait, func(ctx context.Context) error { return c.giveBack(ctx, 1, g) },
		c.settler(g)), nil
}

// WaitCost is WaitN for one call whose costs are known only after it: it waits for the
// call and its estimated cost (see ReserveCost) and returns the reservation to settle
// the actual costs with, its Delay 0. Errors are WaitN's and ReserveCost's.
func (l *Limiter) WaitCost(ctx context.Context, cost map[string]int) (*waiter.Reservation, error) {
	c, err := l.costed(cost)
	if err != nil {
		return nil, err
	}
	g, err := c.waitN(ctx, 1)
	if err != nil {
		return nil, err
	}
	return waiter.NewCostReservation(true, 0, nil, c.settler(g)), nil
}

// costed returns the handle whose calls cost cost, checked.
func (l *Limiter) costed(cost map[string]int) (*Limiter, error) {
	if l == nil {
		return nil, fmt.Errorf("jobthrottle: %w: nil *throttle.Limiter", waiter.ErrNilReserver)
	}
	var costs []protocol.Cost
	for unit, n := range cost {
		if err := l.checkCost(unit, n); err != nil {
			return nil, err
		}
		if n > 0 {
			costs = append(costs, protocol.Cost{Unit: unit, N: n})
		}
	}
	slices.SortFunc(costs, func(a, b protocol.Cost) int { return cmp.Compare(a.Unit, b.Unit) })
	h := *l
	h.costs = costs
	return &h, nil
}

// checkCost refuses a cost of n in unit that no call can have.
func (l *Limiter) checkCost(unit string, n int) error {
	counted := false
	for _, lim := range l.limits {
		counted = counted || lim.Unit == unit
	}
	for _, lim := range l.caps {
		counted = counted || l.tenant != nil && lim.Unit == unit
	}
	switch {
	case unit == "":
		return fmt.Errorf("%w: a cost in calls (each call is one)", ErrInvalidArgument)
	case !counted:
		return fmt.Errorf("%w: key %q: no limit counts %q", ErrInvalidArgument, l.key, unit)
	case n < 0:
		return fmt.Errorf("%w: a cost of %d %s", ErrInvalidArgument, n, unit)
	case n > l.most(unit):
		return fmt.Errorf("%w: %d %s, at most %d (key %q)", ErrExceedsLimit, n, unit, l.most(unit), l.key)
	}
	return nil
}

// settler returns the settle of g, a grant of the handle's costs (waiter.Reservation's
// Settle): its record, under a random id, makes a second one change nothing. A grant
// decided without Redis (FailOpen, FailLocal) settles nothing.
func (l *Limiter) settler(g grant) func(ctx context.Context, actual map[string]int) error {
	var id [12]byte
	_, _ = rand.Read(id[:])
	record := keys.Name(l.t.tag, keys.Settled+hex.EncodeToString(id[:]))
	return func(ctx context.Context, actual map[string]int) error {
		est := map[string]int{}
		for _, c := range l.costs {
			est[c.Unit] = c.N
		}
		var costs []protocol.Cost
		for unit, n := range actual {
			if err := l.checkCost(unit, 0); err != nil {
				return err
			}
			if n < 0 || n > maxRate {
				return fmt.Errorf("%w: an actual cost of %d %s", ErrInvalidArgument, n, unit)
			}
			if n != est[unit] {
				costs = append(costs, protocol.Cost{Unit: unit, N: est[unit], Actual: n})
			}
		}
		if len(costs) == 0 || g.local || !g.granted {
			return nil
		}
		slices.SortFunc(costs, func(a, b protocol.Cost) int { return cmp.Compare(a.Unit, b.Unit) })
		call := l.request(protocol.OpSettle, 1, g.token)
		call.Costs, call.Record = costs, record
		rep, err := l.send(ctx, l.client().key(l.t.tag), call, nil)
		if err != nil {
			return err
		}
		if rep.v[0] == protocol.SettleTooLate {
			return fmt.Errorf("jobthrottle: key %q: %w", l.key, waiter.ErrSettleTooLate)
		}
		return nil
	}
}
