package throttle

import (
	"context"
	"fmt"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
)

// LimiterState is a rate-limited key's live state as Inspect reads it: one read-only
// script call, every figure by the Redis server's clock at the moment of the call.
//
// For a sliding window of 10 per second where 4 permits took effect in the last
// second (the oldest 300ms ago) and 2 more are booked to take effect 200ms from now,
// Inspect reports Limits[0].Used 6 of Capacity 10, Remaining 0 (bookings wait),
// Booked 2, BookedAhead 200ms, NextFree 200ms (the next permit is booked after the
// last booking), and ResetAfter 1.2s.
type LimiterState struct {
	// Algorithm is the limiter's algorithm; the figures below are read as it counts.
	Algorithm Algorithm

	// Limits holds one entry per limit, in the order of Limiter.Limits.
	Limits []LimitState

	// Remaining is how many permits AllowN could take now: what Result.Remaining
	// would say. It is 0 while the key is paused or bookings wait.
	Remaining int

	// NextFree is the time until an acquire of one permit would take effect: 0 when
	// Allow would succeed now; else what Allow's RetryAfter would say.
	NextFree time.Duration

	// ResetAfter is Result.ResetAfter: the time until the limiter is back to full
	// capacity.
	ResetAfter time.Duration

	// Booked is how many permits are booked to take effect after now (reservations
	// and waiting WaitN calls): exact for SlidingWindow; SlidingCounter counts the
	// sub-buckets that start after now; TokenBucket, the largest deficit over the
	// limits; FixedWindow, the latest grant's window's count when that window starts
	// after now, else 0 (a booking in the current window shows in Used only).
	Booked int

	// BookedAhead is the time until the latest booking takes effect (SlidingCounter:
	// its sub-bucket starts); 0 when nothing is booked ahead.
	BookedAhead time.Duration

	// PausedFor is the time until a pause on the key ends; 0 when it is not paused.
	PausedFor time.Duration

	// Override is the time until an operator's override of the rates (see
	// Limiter.Override) ends; 0 when none is set. While it lasts, Limits hold the
	// rates enforced.
	Override time.Duration

	// TTL is the state key's time to live, in whole milliseconds as Redis keeps it;
	// 0 when the key is absent (the limiter is idle and at full capacity), negative
	// when the key has no TTL (jobthrottle never leaves one so).
	TTL time.Duration

	// Tenant is the tenant's part, for a tenant's handle (Limiter.Tenant); nil otherwise.
	Tenant *TenantState

	// Tenants, for the limiter's own handle, are the tenants with the most requests
	// queued in the fair share, the most first, at most 10 of them; empty when none is.
	Tenants []TenantState

	// QueuedWeight, for the limiter's own handle, is the sum of the weights of all the
	// tenants with requests queued in the fair share (Tenants lists 10 at most): while
	// they stay queued, each gets about its Weight / QueuedWeight of the rate. 0 when
	// none is.
	QueuedWeight float64
}

// TenantState is one tenant's part of a LimiterState.
type TenantState struct {
	// Name is the tenant's name.
	Name string

	// Weight is the tenant's weight in the fair share: its handle's (Weight), or an
	// operator's (OverrideWeight) while one lasts; for Tenants, the weight its requests
	// were queued with.
	Weight float64

	// Queued is how far the tenant's place in the fair share lies ahead of its turn:
	// about how long, at the tenants' present shares, until the requests it has queued
	// or booked (its share of them) are served, a pause's rest included; 0 when it has
	// none.
	Queued time.Duration

	// Caps holds one entry per cap (WithTenantLimits), in their order: what the tenant
	// has used of each. Empty for Tenants.
	Caps []LimitState
}

// LimitState is one limit's part of a LimiterState.
type LimitState struct {
	// Limit is the limit as enforced now: as the Limiter was given it, with the
	// Rate (and Burst) of an override while one is set.
	Limit Limit

	// Capacity is the most permits the limit holds: Rate, or the burst for
	// TokenBucket. A limit with a Unit counts in its unit, here and in Used (the
	// estimates booked ahead included, where bookings count).
	Capacity int

	// Used is how much of Capacity is taken, in permits: SlidingWindow, the permits
	// that took effect in the last Period plus those booked ahead (SlidingCounter: each
	// counted from the end of its sub-bucket); FixedWindow, the permits counted in the
	// window holding now, or Capacity once bookings were made in a later window;
	// TokenBucket, Capacity less the tokens in the bucket now, rounded down. It exceeds
	// Capacity when bookings reach further ahead than one window (the token bucket:
	// than a full bucket's worth).
	Used int
}

// Available is how many permits the limit has left now: Capacity - Used, at least 0.
func (s LimitState) Available() int { return max(0, s.Capacity-s.Used) }

// SemaphoreState is a semaphore's live state as Inspect reads it: one read-only
// script call, by the Redis server's clock.
type SemaphoreState struct {
	// Max is the semaphore's Max (from this process's configuration).
	Max int

	// Held is how many leases are live (their expiry is after now).
	Held int

	// Waiting is how many callers hold a place in the queue (places that have not
	// lapsed).
	Waiting int

	// Expiries holds the time until each live lease expires, earliest first, for at
	// most the first 100 of them (Held says how many there are). A lease is renewed
	// by its holder every LeaseTTL/3 while it works, so these are what a dead
	// holder's slot would take to come back.
	Expiries []time.Duration

	// PausedFor is the time until a pause on the key ends; 0 when it is not paused.
	PausedFor time.Duration

	// TTL is the lease set's time to live, in whole milliseconds; 0 when it is
	// absent (no lease held), negative when it has no TTL.
	TTL time.Duration
}

// Inspect reads the key's live state (see LimiterState), asking the algorithm what an
// acquire of one permit would. It writes nothing and calls no hook, so it changes no
// decision and may run as often as a dashboard likes.
//
// It returns ctx.Err() for a done context, an error wrapping ErrCorruptState when the
// key holds data jobthrottle did not write, ErrUnavailable when Redis cannot be
// reached, and other Redis errors wrapped.
func (l *Limiter) Inspect(ctx context.Context) (LimiterState, error) {
	if err := l.usable(); err != nil {
		return LimiterState{}, err
	}
	if err := ctx.Err(); err != nil {
		return LimiterState{}, err
	}
	call := l.request(protocol.OpInspect, 0, 0)
	if l.tenant == nil { // the tenants with the most queued
		call.Queue = keys.Name(l.t.tag, keys.FairQueue)
	}
	rep, err := l.client().do(&request{ctx: ctx, t: l.t, ks: l.client().key(l.t.tag), call: call, timeout: l.timeout, detail: true})
	if err != nil {
		return LimiterState{}, err
	}
	v, x := rep.v, rep.extra
	bad := func() (LimiterState, error) {
		return LimiterState{}, fmt.Errorf("%w: key %q: inspect's detail %v", ErrUnexpectedReply, l.key, x)
	}
	n := inspectFixed + 3*len(l.limits)
	if len(x) < n {
		return bad()
	}
	st := LimiterState{
		Algorithm:   l.alg,
		Remaining:   int(v[1]),
		NextFree:    micros(v[2]),
		ResetAfter:  micros(v[3]),
		Booked:      int(x[0]),
		BookedAhead: micros(x[1]),
		PausedFor:   micros(x[2]),
		TTL:         pttl(x[3]),
		Override:    micros(x[4]),
		Limits:      make([]LimitState, len(l.limits)),
	}
	for i, lim := range l.limits {
		rate, capacity, avail := x[inspectFixed+3*i], x[inspectFixed+1+3*i], x[inspectFixed+2+3*i]
		if st.Override > 0 { // the rates enforced now
			lim.Rate = int(rate)
			if l.a.bursts {
				lim.Burst = int(capacity)
			}
		}
		st.Limits[i] = LimitState{Limit: lim, Capacity: int(capacity), Used: int(capacity - avail)}
	}
	x = x[n:]
	if t := l.tenant; t != nil { // its place and weight units, then capacity and available per cap
		if len(x) != 2+2*len(l.caps) {
			return bad()
		}
		ts := &TenantState{Name: t.name, Weight: float64(x[1]) / unitWeight, Queued: micros(max(0, x[0]))}
		for i, c := range l.caps {
			ts.Caps = append(ts.Caps, LimitState{Limit: c, Capacity: int(x[2+2*i]), Used: int(x[2+2*i] - x[3+2*i])})
		}
		st.Tenant = ts
		return st, nil
	}
	if len(x) < 2 { // W, k, then per tenant: place, units, name's length and bytes
		return bad()
	}
	st.QueuedWeight = float64(x[0]) / unitWeight
	for i, k := 2, x[1]; k > 0; k-- {
		if i+3 > len(x) || int64(i+3)+x[i+2] > int64(len(x)) {
			return bad()
		}
		name := replyText(x[i+3 : int64(i+3)+x[i+2]])
		st.Tenants = append(st.Tenants, TenantState{Name: name, Weight: float64(x[i+1]) / unitWeight, Queued: micros(x[i])})
		i += 3 + len(name)
	}
	return st, nil
}

// inspectFixed is how many figures an inspect's detail starts with (internal/protocol):
// booked, ahead_us, paused_us, pttl_ms, override_us and pause_end.
const inspectFixed = 6

// pauseEnd asks Redis until when the key is paused, in server µs (what grants' tokens
// and pause notices are in): 0 when it is not. It calls no hook.
func (l *Limiter) pauseEnd(ctx context.Context) (int64, error) {
	rep, err := l.client().do(&request{ctx: ctx, t: l.t, ks: l.client().key(l.t.tag), call: &protocol.Request{Op: protocol.OpInspect},
		timeout: l.timeout, detail: true})
	if err != nil {
		return 0, err
	}
	if len(rep.extra) < inspectFixed {
		return 0, fmt.Errorf("%w: key %q: inspect's detail %v", ErrUnexpectedReply, l.key, rep.extra)
	}
	return rep.extra[inspectFixed-1], nil
}

// semInspectLimit is how many lease expiries Semaphore.Inspect lists.
const semInspectLimit = 100

// Inspect reads the semaphore's live state: leases held and their expiries, callers
// waiting, the pause and the lease set's TTL (see SemaphoreState). It writes nothing
// and does not call the hooks. Leases granted without Redis by a failure policy are not
// in Redis and not counted. Errors are those of Limiter.Inspect.
func (s *Semaphore) Inspect(ctx context.Context) (SemaphoreState, error) {
	if err := ctx.Err(); err != nil {
		return SemaphoreState{}, err
	}
	rep, err := s.client().do(&request{ctx: ctx, t: s.t, ks: s.client().key(s.t.tag), fields: []any{semInspect, "", "", semInspectLimit},
		timeout: s.timeout, detail: true})
	if err != nil {
		return SemaphoreState{}, err
	}
	x := rep.extra // held, waiting, paused_us, pttl_ms, k, then k expiries
	if len(x) < 5 || int64(len(x)) != 5+x[4] {
		return SemaphoreState{}, fmt.Errorf("%w: key %q: inspect returned %v", ErrUnexpectedReply, s.key, x)
	}
	st := SemaphoreState{
		Max:       s.max,
		Held:      int(x[0]),
		Waiting:   int(x[1]),
		PausedFor: micros(x[2]),
		TTL:       pttl(x[3]),
		Expiries:  make([]time.Duration, x[4]),
	}
	for i := range st.Expiries {
		st.Expiries[i] = micros(x[5+i])
	}
	return st, nil
}

// pttl maps a PTTL reply: -2 (absent) is 0, -1 (no TTL) stays negative.
func pttl(ms int64) time.Duration {
	if ms == -2 {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}
