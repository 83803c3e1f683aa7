package throttle

import (
	"cmp"
	"context"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/booking"
	"github.com/jobthrottle/jobthrottle/internal/clock"
	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
)

// Limiter enforces one or more rate limits on a key, shared by every process that uses
// the same Redis, key, prefix and algorithm.
//
// Every decision is one atomic script call, run at most once, that reads the clock of
// the Redis server. A denial is a Result with Allowed false and the exact RetryAfter,
// not an error; an error means bad input or a failed Redis call, and then nothing was
// granted. A Limiter is safe for simultaneous use and cheap to build: those of a
// process on the same Redis client and key share what the process knows of the key
// (its hold, failure policy, StateLost), so one built per task behaves as one built once.
//
// Tenant returns a tenant's handle: a Limiter whose calls take from the limits and from
// the tenant's own caps (WithTenantLimits) in one atomic decision, served in a weighted
// fair share with the key's other tenants.
type Limiter struct {
	rdb     redis.UniversalClient
	t       *target
	key     string
	alg     Algorithm
	a       *algorithm
	limits  []Limit
	caps    []Limit // every tenant's own caps (WithTenantLimits)
	maxN    int
	hooks   Hooks
	policy  FailurePolicy
	timeout time.Duration
	config  string          // the configuration's id on the key: target and policy
	counted time.Duration   // how long a grant counts against the limits
	tenant  *tenant         // a tenant's handle's; nil for the key's own
	costs   []protocol.Cost // a call's costs in units (Cost); nil: none
}

// New returns a limiter enforcing limit, and any limits added with WithLimits, on key.
//
// rdb may be any go-redis client: a Client, a Sentinel-backed FailoverClient or a
// ClusterClient. New does not contact Redis. It returns an error wrapping ErrNilClient
// for a nil client, ErrInvalidKey for an empty key or one longer than 512 bytes with
// its prefix, ErrInvalidLimit for a limit out of range (see Limit), or
// ErrInvalidArgument for an option with a bad value.
func New(rdb redis.UniversalClient, key string, limit Limit, opts ...Option) (*Limiter, error) {
	c, tag, err := prepare(rdb, key, opts, Option.applyLimiter)
	if err != nil {
		return nil, err
	}
	limits, caps := byUnit(append([]Limit{limit}, c.extra...)), byUnit(c.caps)
	if len(limits) > protocol.MaxLimits || len(caps) > protocol.MaxLimits {
		return nil, fmt.Errorf("%w: %d limits and %d caps, at most %d each", ErrInvalidArgument, len(limits), len(c.caps), protocol.MaxLimits)
	}
	a := c.algorithm.algo()
	l := &Limiter{rdb: rdb, key: key, alg: c.algorithm, a: a, limits: limits, caps: caps, hooks: c.hooks,
		policy: c.policy, timeout: callTimeout(c.callTimeout, rdb)}
	for _, lim := range append(slices.Clip(limits), caps...) {
		if err := lim.validate(c.algorithm); err != nil {
			return nil, fmt.Errorf("%w (key %q, limit %s)", err, key, lim)
		}
		l.counted = max(l.counted, a.counted(lim))
	}
	l.maxN = l.most("")
	var capsHead string
	if len(caps) > 0 {
		capsHead = a.head(caps, c.buckets).String()
	}
	ks := []string{keys.Name(tag, keys.State)}
	for _, u := range units(limits) {
		ks = append(ks, keys.Name(tag, keys.Part+u))
	}
	l.t = newLimiterTarget(key, tag, a.script, ks, a.head(limits, c.buckets).String(), capsHead)
	l.config = l.t.id + " " + c.policy.String()
	return l, nil
}

func (l *Limiter) client() *client { return clientFor(l.rdb) }

// Key returns the key the limiter was made for (without prefix).
func (l *Limiter) Key() string { return l.key }

// Algorithm returns the limiter's algorithm.
func (l *Limiter) Algorithm() Algorithm { return l.alg }

// Limits returns the limits the limiter enforces: those of calls first, in the order
// given, then each unit's, by the unit's name (the order Override and Inspect use).
func (l *Limiter) Limits() []Limit { return append([]Limit(nil), l.limits...) }

// byUnit returns limits in the order the scripts keep them (Limits).
func byUnit(limits []Limit) []Limit {
	limits = slices.Clone(limits)
	slices.SortStableFunc(limits, func(a, b Limit) int { return cmp.Compare(a.Unit, b.Unit) }) // "" first
	return limits
}

// units returns the units other than calls that limits (byUnit's order) count, in order.
func units(limits []Limit) []string {
	var out []string
	for _, l := range limits {
		if l.Unit != "" && (len(out) == 0 || out[len(out)-1] != l.Unit) {
			out = append(out, l.Unit)
		}
	}
	return out
}

// most returns the largest n of unit ("": calls) the handle can ever be granted at
// once: the least capacity of its limits of that unit (a tenant's: and of its caps).
func (l *Limiter) most(unit string) int {
	n := maxRate
	for i, lim := range append(slices.Clip(l.limits), l.caps...) {
		if lim.Unit == unit && (i < len(l.limits) || l.tenant != nil) {
			n = min(n, l.a.maxN(lim))
		}
	}
	return n
}

// Allow is shorthand for AllowN(ctx, 1).
func (l *Limiter) Allow(ctx context.Context) (Result, error) { return l.AllowN(ctx, 1) }

// AllowN takes n permits now if every limit has room for them, and otherwise takes
// nothing and reports in RetryAfter when they would fit. Queued reservations come
// first: while any wait, AllowN is denied. AllowN(ctx, 0) takes nothing and reports
// the state. Use it when a denied caller drops or defers its work; use Wait or
// Reserve to wait for the permits instead.
//
// It returns an error wrapping ErrInvalidArgument for n < 0, ErrExceedsLimit for n
// above what the limit can ever grant (without calling Redis), ctx.Err() for a done
// context, and the Redis error when the call fails; Allowed is false with any error.
func (l *Limiter) AllowN(ctx context.Context, n int) (Result, error) {
	if err := l.check(ctx, n); err != nil {
		return Result{}, err
	}
	g, err := l.acquire(ctx, n, 0, nil, 0, false)
	if err != nil {
		return Result{}, err
	}
	return g.result(), nil
}

// Reserve books n permits at the earliest time they are available that is not
// earlier than any booking already made on the key (first come, first served across
// every process), if that time comes within maxWait: the reservation is OK and its
// Delay says when they take effect; they count against the limit from then. Otherwise
// nothing is booked and Delay says when n permits would be available. Give back a
// booking you will not use with its Cancel. The token bucket books at most 2^50/Rate
// µs ahead. Unlike WaitN, a reservation keeps its booking across a Pause or Resume.
//
// A tenant's handle books only within its fair turn and the tenants' horizon (see
// Tenant): beyond them the reservation is not OK and Delay says when to ask again.
//
// Errors are those of AllowN, ErrInvalidArgument for a negative maxWait, and
// waiter.ErrNilReserver for a nil *Limiter.
func (l *Limiter) Reserve(ctx context.Context, n int, maxWait time.Duration) (*waiter.Reservation, error) {
	if err := l.check(ctx, n); err != nil {
		return nil, err
	}
	if maxWait < 0 {
		return nil, fmt.Errorf("%w: maxWait %v", ErrInvalidArgument, maxWait)
	}
	g, err := l.acquire(ctx, n, maxWait, booking.From(ctx), 0, false)
	if err != nil {
		return nil, err
	}
	// Cancel gives back only a booking ahead: one due now is not
	cancel := func(ctx context.Context) error { return l.giveBack(ctx, n, g) }
	if len(l.costs) > 0 {
		return waiter.NewCostReservation(g.granted, g.wait, cancel, l.settler(n, g)), nil
	}
	return waiter.NewReservation(g.granted, g.wait, cancel), nil
}

// check refuses a call that cannot be granted, before any Redis call.
func (l *Limiter) check(ctx context.Context, n int) error {
	if err := l.usable(); err != nil {
		return err
	}
	if n < 0 {
		return fmt.Errorf("%w: n = %d", ErrInvalidArgument, n)
	}
	if n > l.maxN {
		return fmt.Errorf("%w: n = %d, at most %d (key %q)", ErrExceedsLimit, n, l.maxN, l.key)
	}
	for _, c := range l.costs {
		if err := l.checkCost(c.Unit, c.N); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// usable returns the error of every call of a nil Limiter or a bad tenant's handle.
func (l *Limiter) usable() error {
	if l == nil {
		return fmt.Errorf("jobthrottle: %w: nil *throttle.Limiter", waiter.ErrNilReserver)
	}
	if l.tenant != nil {
		return l.tenant.err
	}
	return nil
}

// grant is a script's answer to an acquire.
type grant struct {
	granted   bool
	kept      bool // a task's booking was found (booking.Task)
	remaining int
	wait      time.Duration // granted: until the permits take effect; denied: until asking again can succeed
	reset     time.Duration
	token     int64 // when the grant takes effect, server µs: what a cancel sends back
	stamp     int64 // a task's booking's stamp: what its cancel sends back
	ticket    int64 // a tenant's place, held by the caller while it waits for its turn (0: none)
	flags     int64 // which limit denied; drift (internal/protocol's Flag*)
	task      string
	local     bool // decided without Redis (FailOpen, FailLocal)
}

// acquire asks for n permits within maxWait, for task's booking if task is not nil,
// decided by Redis or, while it is unreachable, by the failure policy. On a tenant's
// handle, ticket is the caller's place in its tenant's queue (0: none), and hold takes
// one when its turn has not come, for a caller that will ask again.
func (l *Limiter) acquire(ctx context.Context, n int, maxWait time.Duration, task *booking.Task, ticket int64, hold bool) (grant, error) {
	x := min(int64(maxWait/time.Microsecond), protocol.MaxWait)
	var key string
	var late int64
	var giveBack func(reply)
	if task != nil {
		if err := task.Check(); err != nil {
			return grant{}, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		}
		key, late = keys.Name(l.t.tag, keys.Booking+task.ID), int64(task.Late/time.Microsecond)
	} else if x > 0 {
		giveBack = l.late(n)
	}
	ks := l.client().key(l.t.tag)
	var mark stateMark
	var cs *configState
	if l.hooks.StateLost != nil {
		cs = l.configState(ks)
		cs.watch.mu.Lock() // the mark as it is before the call, which runs after its grant
		mark = cs.watch.mark
		cs.watch.mu.Unlock()
	}
	call := l.request(protocol.OpAcquire, n, x)
	call.Booking, call.Late = key, late
	if l.tenant != nil {
		call.Ticket, call.Hold = ticket, hold || task != nil
	}
	rep, err := l.send(ctx, ks, call, giveBack)
	if err != nil {
		return l.refused(ks, n, x, err)
	}
	g := decodeGrant(rep)
	if rep.drift != "" {
		l.drifted(ks, rep.drift)
	}
	if task != nil {
		g.task, task.Kept = key, g.kept
		task.Pass = func(ctx context.Context) (bool, error) {
			_, held, err := ks.pass(ctx, l)
			return held, err
		}
	}
	if l.hooks.StateLost != nil {
		l.observe(ctx, ks, cs, mark, n, g)
	}
	if !g.kept {
		l.report(n, g)
	}
	return g, nil
}

// refused is the answer to an acquire of n permits within maxWait µs whose call failed
// with err: the failure policy's decision where it covers err, else err. Every
// acquire's failure goes through it, a move's booking again included.
func (l *Limiter) refused(ks *keyState, n int, maxWait int64, err error) (grant, error) {
	if l.policy.degrades(err) {
		return l.degraded(ks, n, maxWait, err)
	}
	return grant{}, err
}

// request is a request of op on the limiter's key, for its tenant if it is a tenant's
// handle.
func (l *Limiter) request(op string, n int, x int64) *protocol.Request {
	r := &protocol.Request{Op: op, N: n, X: x}
	if op == protocol.OpAcquire || op == protocol.OpCancel {
		r.Costs = l.costs
	}
	if t := l.tenant; t != nil {
		r.Queue, r.Caps, r.CapKeys, r.Tenant = t.queue, t.caps, t.capKeys, t.name
		if t.units != unitWeight {
			r.Units = t.units
		}
	}
	return r
}

func (g grant) result() Result {
	r := Result{Allowed: g.granted, Remaining: g.remaining, ResetAfter: g.reset}
	if !g.granted {
		r.RetryAfter = g.wait
		r.ByCap, r.Turn = g.flags&protocol.FlagCap != 0, g.flags&protocol.FlagTurn != 0
	}
	return r
}

func decodeGrant(rep reply) grant {
	v := rep.v
	g := grant{granted: v[0] >= 1, kept: v[0] == 2, remaining: int(v[1]), wait: micros(v[2]),
		reset: micros(v[3]), token: v[4], flags: v[6]}
	if v[6]&protocol.FlagTicket != 0 {
		g.ticket = v[5]
	} else {
		g.stamp = v[5]
	}
	return g
}

// send makes one request of the limiter's script through the client.
func (l *Limiter) send(ctx context.Context, ks *keyState, call *protocol.Request, late func(reply)) (reply, error) {
	if l.policy.local(ks, call.Op == protocol.OpAcquire) {
		return reply{}, fmt.Errorf("%w: key %q: %w", ErrUnavailable, l.key, errRecentlyDown)
	}
	r := &request{ctx: ctx, t: l.t, ks: ks, call: call, late: late, timeout: l.timeout, detail: call.Op == protocol.OpInspect}
	rep, err := l.client().do(r)
	if err != nil {
		if ae, ok := err.(*AlgorithmError); ok {
			ae.Want = l.alg
		}
		if l.hooks.RedisError != nil && ctx.Err() == nil {
			l.hooks.RedisError(l.key, err)
		}
	}
	return rep, err
}

// drifted reports to LimitsDrift, once per set of theirs, that the key's state held
// another process's head, theirs.
func (l *Limiter) drifted(ks *keyState, theirs string) {
	if l.hooks.LimitsDrift == nil {
		return
	}
	if old := ks.drift.Swap(&theirs); old != nil && *old == theirs {
		return
	}
	h, err := keys.ParseHead(theirs)
	if err != nil {
		return
	}
	l.hooks.LimitsDrift(l.key, l.Limits(), limitsOf(h))
}

// report calls the Allowed or Denied hook for a decision.
func (l *Limiter) report(n int, g grant) {
	if g.granted {
		if l.hooks.Allowed != nil {
			l.hooks.Allowed(l.key, n, g.wait)
		}
	} else if l.hooks.Denied != nil {
		l.hooks.Denied(l.key, n, g.result())
	}
}

// giveBack cancels g, a booking of n permits ahead, so that a later caller can use
// them; a task's booking is cancelled only while it is still the caller's (its stamp).
func (l *Limiter) giveBack(ctx context.Context, n int, g grant) error {
	ks := l.client().key(l.t.tag)
	if g.local {
		now := clock.Now().UnixMicro()
		l.withLocalLogs(ks, now, func(logs []*localLog) {
			for _, lg := range logs { // (a cancel of none changes nothing)
				lg.cancel(now, g.token, l.need(lg.unit, n))
			}
		})
		return nil
	}
	x := g.token
	if g.task != "" {
		x = g.stamp
	}
	call := l.request(protocol.OpCancel, n, x)
	call.Booking, call.Ticket = g.task, g.ticket
	rep, err := l.send(ctx, ks, call, nil)
	if err != nil || rep.v[0] != 1 {
		return err
	}
	if l.hooks.StateLost != nil { // the latest grant StateLost compares with is no more
		w := &l.configState(ks).watch
		w.mu.Lock()
		if w.mark.token == g.token {
			w.mark = stateMark{}
		}
		w.mu.Unlock()
	}
	if l.hooks.Cancelled != nil {
		l.hooks.Cancelled(l.key, n)
	}
	return nil
}

// lateGiveBack gives back g, n permits, for a caller that has left, if it was booked
// ahead.
func (l *Limiter) lateGiveBack(n int, g grant) {
	if g.granted && g.wait > 0 {
		_ = l.giveBack(givingBack(context.Background()), n, g)
	}
}

// late returns an acquire's late function: it gives back the booking of n permits
// whose caller left before the reply came.
func (l *Limiter) late(n int) func(reply) {
	return func(rep reply) { l.lateGiveBack(n, decodeGrant(rep)) }
}

// configState returns the state this Limiter's configuration shares on ks.
func (l *Limiter) configState(ks *keyState) *configState {
	return ks.config(l.config, func() *configState {
		cs := &configState{}
		if l.policy.mode == failLocal {
			cs.local = newLocalLogs(l.limits, l.a, l.policy.fleet, false)
			if len(l.caps) > 0 {
				cs.caps = &localCaps{tenants: map[string][]*localLog{},
					make: func() []*localLog { return newLocalLogs(l.caps, l.a, l.policy.fleet, true) }}
			}
		}
		return cs
	})
}

// prepare returns the config opts set (apply: their method), after refusing a nil
// client and a bad option, and the key's hash tag.
func prepare[O any](rdb redis.UniversalClient, key string, opts []O, apply func(O, *config)) (*config, string, error) {
	c := newConfig()
	for _, o := range opts {
		apply(o, c)
	}
	if v := reflect.ValueOf(rdb); rdb == nil || v.Kind() == reflect.Pointer && v.IsNil() { // a typed nil too
		return nil, "", ErrNilClient
	}
	if c.err != nil {
		return nil, "", c.err
	}
	tag, err := keys.Tag(c.prefix, key)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", ErrInvalidKey, err)
	}
	return c, tag, nil
}

// callTimeout returns the bound of each Redis call: the one set (WithCallTimeout), else
// one try of rdb's: DialTimeout + WriteTimeout + ReadTimeout, go-redis's defaults (5s
// each) standing in for any unset or disabled.
func callTimeout(set time.Duration, rdb redis.UniversalClient) time.Duration {
	if set > 0 {
		return set
	}
	var dial, write, read time.Duration
	switch c := rdb.(type) {
	case *redis.Client:
		o := c.Options()
		dial, write, read = o.DialTimeout, o.WriteTimeout, o.ReadTimeout
	case *redis.ClusterClient:
		o := c.Options()
		dial, write, read = o.DialTimeout, o.WriteTimeout, o.ReadTimeout
	case *redis.Ring:
		o := c.Options()
		dial, write, read = o.DialTimeout, o.WriteTimeout, o.ReadTimeout
	}
	// max(v, 0) is 0 for unset and disabled alike: cmp.Or then takes the default
	const dflt = 5 * time.Second // go-redis's DialTimeout, WriteTimeout and ReadTimeout
	return cmp.Or(max(dial, 0), dflt) + cmp.Or(max(write, 0), dflt) + cmp.Or(max(read, 0), dflt)
}

func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
