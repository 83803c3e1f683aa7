package throttle

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
)

// WithTenantLimits sets each tenant's own caps: a tenant's handle (Limiter.Tenant) is
// granted only when the limiter's limits and every cap of the tenant have room, and
// takes from all or none, in one atomic call. "The vendor allows 20 a second for all of
// us, each customer at most 5" is New(rdb, "vendor", PerSecond(20),
// WithTenantLimits(PerSecond(5))). The caps are counted as the limiter's algorithm
// counts, each tenant apart; up to 16 of them.
func WithTenantLimits(limits ...Limit) Option {
	return limiterOption(func(c *config) { c.caps = append(c.caps, limits...) })
}

// TenantOption configures a tenant's handle; pass options to Limiter.Tenant.
type TenantOption interface {
	applyTenant(*tenant)
}

type tenantOption func(*tenant)

func (f tenantOption) applyTenant(t *tenant) { f(t) }

// Weight sets a tenant's weight in the fair share, 0.000001..1000000; the default is 1.
// While several tenants have requests waiting, each gets the limiter's rate in
// proportion to its weight: a tenant of weight 3 gets three times the permits of one of
// weight 1. An operator's weight (OverrideWeight) takes its place while it lasts. A
// weight out of range makes every call of the handle return an error wrapping
// ErrInvalidArgument.
func Weight(w float64) TenantOption {
	return tenantOption(func(t *tenant) {
		if math.IsNaN(w) || w < protocol.MinWeight || w > protocol.MaxWeight {
			t.err = fmt.Errorf("%w: weight %v is not in %v..%v", ErrInvalidArgument, w, protocol.MinWeight, protocol.MaxWeight)
			return
		}
		t.units = max(1, int64(math.Round(w*unitWeight)))
	})
}

const unitWeight = 1000000 // a weight of 1, in the units the scripts count weights in (millionths)

// tenant is what a tenant's handle adds to its Limiter.
type tenant struct {
	name    string
	units   int64    // its weight, in millionths
	caps    string   // its state key (its caps), "" without caps
	capKeys []string // the state keys of its caps of other units than calls
	queue   string   // the fair share's key
	err     error    // a bad name or weight: every call returns it
}

// Tenant returns the handle of one tenant of the limiter: a Limiter with every method,
// whose calls take from the limiter's limits and the tenant's own caps
// (WithTenantLimits) together, and share the limiter's rate with its other tenants in
// proportion to their weights (Weight); a tenant alone gets all of it. No tenant books
// further ahead than the tenants' horizon: a quarter of a second, or two of the
// limiter's permit intervals (Period/Rate of its first limit) when that is longer. A
// request whose turn has not come, or whose permits would come beyond the horizon, is
// told when to ask again (RetryAfter, Reservation's Delay): WaitN sleeps and asks again,
// keeping its place; an asynq task is handed back, keeping its place under its ID. Every
// limit and cap stays exact. docs/tenants.md says what the fair share guarantees.
//
// name is any text of 1 to 256 bytes; another makes every call of the handle return an
// error wrapping ErrInvalidKey. Tenant of a tenant's handle is Tenant of the limiter.
// Pause, Resume, Override and ClearOverride act on the limiter's key, whichever handle
// makes them; Inspect reads the tenant's caps and place.
func (l *Limiter) Tenant(name string, opts ...TenantOption) *Limiter {
	if l == nil {
		return nil
	}
	t := &tenant{name: name, units: unitWeight, queue: keys.Name(l.t.tag, keys.FairQueue)}
	if err := keys.CheckTenant(name); err != nil {
		t.err = fmt.Errorf("%w: key %q: %v", ErrInvalidKey, l.key, err)
	}
	for _, o := range opts {
		o.applyTenant(t)
	}
	if len(l.caps) > 0 {
		t.caps = keys.Name(l.t.tag, keys.Tenant+name)
		for _, u := range units(l.caps) {
			t.capKeys = append(t.capKeys, keys.Name(l.t.tag, keys.Part+u+":"+name))
		}
	}
	h := *l
	h.tenant = t
	h.maxN = h.most("")
	return &h
}

// OverrideWeight sets the weight of the tenant whose handle l is, for every process,
// for d (0: until ClearWeight; at most 2^45µs), in place of the weight its callers pass
// (Weight). It returns an error wrapping ErrInvalidArgument for a handle that is not a
// tenant's, a weight out of range or d < 0; Redis errors are as AllowN's.
func (l *Limiter) OverrideWeight(ctx context.Context, d time.Duration, w float64) error {
	if err := l.tenantControl(ctx); err != nil {
		return err
	}
	t := *l.tenant
	Weight(w).applyTenant(&t)
	if t.err != nil || d < 0 {
		return fmt.Errorf("%w: weight %v for %v", ErrInvalidArgument, w, d)
	}
	if d == 0 || d > maxPeriodUS*time.Microsecond {
		d = maxPeriodUS * time.Microsecond
	}
	_, err := l.controlCall(ctx, &protocol.Request{Op: protocol.OpWeight, X: ceilMicros(d), Units: t.units,
		Queue: t.queue, Tenant: t.name})
	return err
}

// ClearWeight ends an operator's weight of the tenant whose handle l is (OverrideWeight):
// its callers' weight counts again. Errors are OverrideWeight's.
func (l *Limiter) ClearWeight(ctx context.Context) error {
	if err := l.tenantControl(ctx); err != nil {
		return err
	}
	_, err := l.controlCall(ctx, &protocol.Request{Op: protocol.OpWeight, X: 0, Units: 1, Queue: l.tenant.queue,
		Tenant: l.tenant.name})
	return err
}

// tenantControl refuses a tenant's control call that cannot be made.
func (l *Limiter) tenantControl(ctx context.Context) error {
	if l == nil || l.tenant == nil {
		return fmt.Errorf("%w: not a tenant's handle", ErrInvalidArgument)
	}
	if l.tenant.err != nil {
		return l.tenant.err
	}
	return ctx.Err()
}
