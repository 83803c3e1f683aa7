package throttle

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/waiter"
)

// Cost returns a handle of the limiter whose every call also costs cost, by unit: the
// limits with that Unit (and a tenant's caps of it) count it, at once with the call's n
// and on every limit, or not at all. Use it for calls whose cost is known only after
// them (an LLM call's tokens): book an estimate, then settle the actual with the
// Reservation's Settle (Reserve on the handle, WaitCost, or a job queue's middleware
// given the handle, whose job settles with waiter.Settle). The difference is charged at
// the booking's place, for every process: a refund frees room for the callers behind
// it, a debt holds them back. A booking never settled keeps its estimate; nothing
// outlives the limits' longest period. Tenant and Cost combine, in either order.
//
// A call of costs books no further ahead than a horizon: a quarter of a second, two
// permit intervals of the first limit, or the time its cost takes its unit's limits,
// whichever is longest. Beyond it, it is told when to ask again (Reserve: not OK, its
// Delay at most a horizon; WaitCost and WaitN ask again by themselves): an estimate held
// further ahead would keep room that the settles before it give back. A job queue's task
// is booked however far ahead, as it is handed back to its queue until then.
//
// A cost in a unit no limit (nor the tenant's caps) counts, or a negative one, makes
// every call of the handle return an error wrapping ErrInvalidArgument; one above what
// its unit's limits can ever grant, ErrExceedsLimit. A settle may charge only the units
// the cost names above 0 (else ErrInvalidArgument, nothing charged): estimate each unit
// the call may use.
func (l *Limiter) Cost(cost map[string]int) *Limiter {
	if l == nil {
		return nil
	}
	h := *l
	h.costs = nil
	for unit, n := range cost {
		if n != 0 {
			h.costs = append(h.costs, protocol.Cost{Unit: unit, N: n})
		}
	}
	slices.SortFunc(h.costs, func(a, b protocol.Cost) int { return cmp.Compare(a.Unit, b.Unit) })
	return &h
}

// WaitCost is WaitN(ctx, 1) on Cost(cost) that returns the reservation to settle the
// actual costs with (see Cost), its Delay 0 as its permits have taken effect. Errors are
// WaitN's and Cost's.
func (l *Limiter) WaitCost(ctx context.Context, cost map[string]int) (*waiter.Reservation, error) {
	c := l.Cost(cost)
	g, err := c.waitN(ctx, 1)
	if err != nil {
		return nil, err
	}
	return waiter.NewCostReservation(true, 0, nil, c.settler(1, g)), nil
}

// checkCost refuses a cost of n in unit that no call can have.
func (l *Limiter) checkCost(unit string, n int) error {
	ofUnit := func(lim Limit) bool { return lim.Unit == unit }
	counted := slices.ContainsFunc(l.limits, ofUnit) || l.tenant != nil && slices.ContainsFunc(l.caps, ofUnit)
	switch {
	case unit == "":
		return fmt.Errorf("%w: a cost in calls (a call's n counts them)", ErrInvalidArgument)
	case !counted:
		return fmt.Errorf("%w: key %q: no limit counts %q", ErrInvalidArgument, l.key, unit)
	case n < 0:
		return fmt.Errorf("%w: a cost of %d %s", ErrInvalidArgument, n, unit)
	case n > l.most(unit):
		return fmt.Errorf("%w: %d %s, at most %d (key %q)", ErrExceedsLimit, n, unit, l.most(unit), l.key)
	}
	return nil
}

// settler returns the Reservation's Settle of g, a grant of n and the handle's costs:
// its record, under a random id, makes a second one change nothing. A grant decided
// without Redis settles nothing. An actual cost in a unit the handle's costs do not name
// is refused: the booking has no place in that unit's limits to be charged at.
func (l *Limiter) settler(n int, g grant) func(ctx context.Context, actual map[string]int) error {
	var id [12]byte
	_, _ = rand.Read(id[:])
	record := keys.Name(l.t.tag, keys.Settled+hex.EncodeToString(id[:]))
	return func(ctx context.Context, actual map[string]int) error {
		est := map[string]int{}
		for _, c := range l.costs {
			est[c.Unit] = c.N
		}
		var costs []protocol.Cost
		for unit, a := range actual {
			if err := l.checkCost(unit, 0); err != nil {
				return err
			}
			if a < 0 || a > maxRate {
				return fmt.Errorf("%w: an actual cost of %d %s", ErrInvalidArgument, a, unit)
			}
			switch {
			case a == est[unit]:
			case est[unit] == 0: // its limits hold no entry of the booking to charge at
				return fmt.Errorf("%w: an actual cost of %d %s for a booking that estimated none (key %q)",
					ErrInvalidArgument, a, unit, l.key)
			default:
				costs = append(costs, protocol.Cost{Unit: unit, N: est[unit], Actual: a})
			}
		}
		if len(costs) == 0 || g.local || !g.granted {
			return nil
		}
		slices.SortFunc(costs, func(a, b protocol.Cost) int { return cmp.Compare(a.Unit, b.Unit) })
		call := l.request(protocol.OpSettle, n, g.token)
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
