package waiter

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/clock"
)

// pauser is a Reserver that can stop granting for d, in every process that shares it,
// holding this process's waiters at once: *throttle.Limiter is one.
type pauser interface {
	Pause(ctx context.Context, d time.Duration) error
}

// DefaultMaxPause is the longest pause a response's headers make the transport set
// unless WithMaxPause says otherwise. A longer one (a maintenance window, or a
// proxy's mistake) is cut to it, so that a fleet stalled by one answer asks the
// server again after at most five minutes.
const DefaultMaxPause = 5 * time.Minute

// NewTransport returns an http.RoundTripper that waits for n permits from r (1, or
// WithPermits) through Wait(req.Context(), r, n) before sending each request with base
// (nil: http.DefaultTransport); a request whose context ends first, or whose deadline
// comes before its permits, is not sent: RoundTrip returns Wait's error, the body closed.
// With WithCost it books one call and the request's estimated costs instead, and
// settles the actual ones from the answer.
//
// An answer refusing for a rate limit (429, 503, or a 403 with Retry-After or a spent
// quota) pauses r (and, a *throttle.Limiter, holds this process at once) until the time
// its headers give, at most WithMaxPause; docs/http.md lists the headers read. The
// response is returned as it came, once r's Pause has returned: its call is bounded by
// r's own (a *throttle.Limiter's call timeout), not by the request's context. A nil r
// or a bad option makes every RoundTrip return an error wrapping ErrNilReserver or
// ErrInvalidOption. It is safe for concurrent use.
func NewTransport(r Reserver, base http.RoundTripper, opts ...TransportOption) http.RoundTripper {
	choose := func(*http.Request) (Reserver, int, error) { return r, 0, nil }
	// A nil pointer in a non-nil interface is the Reserver's to refuse: a nil
	// *throttle.Limiter's Reserve returns ErrNilReserver.
	if r == nil {
		choose = nil
	}
	return NewTransportFunc(choose, base, opts...)
}

// NewTransportFunc is NewTransport with the Reserver and permits chosen for each
// request by choose: one limiter per host, or a vendor's search endpoint limited apart
// from the rest of its API. Every guarantee of NewTransport holds for the Reserver
// chosen. choose must be safe for simultaneous use and must neither modify the request
// nor read its body; n = 0 means the transport's permits (1, or WithPermits). If choose
// returns an error, a nil Reserver or n < 0, RoundTrip sends nothing and returns an
// error wrapping it, ErrNilReserver or ErrInvalidOption (the body is closed and
// TransportHooks.NotSent called, as for any request not sent). A nil choose is
// ErrNilReserver on every request.
func NewTransportFunc(choose func(req *http.Request) (r Reserver, n int, err error), base http.RoundTripper, opts ...TransportOption) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	t := &transport{choose: choose, base: base, n: 1, maxPause: DefaultMaxPause, clock: clock.System, reserve: -1}
	for _, o := range opts {
		if o != nil {
			o.apply(t)
		}
	}
	if choose == nil && t.err == nil {
		t.err = ErrNilReserver
	}
	return t
}

// TransportOption configures the transport NewTransport returns.
type TransportOption interface {
	apply(*transport)
}

type transportOption func(*transport)

func (f transportOption) apply(t *transport) { f(t) }

// WithPermits sets how many permits each request takes; the default is 1. n must be
// at least 1 (an error wrapping ErrInvalidOption otherwise), and at most what the
// Reserver can ever grant at once (its error otherwise, on every request).
func WithPermits(n int) TransportOption {
	return checked(n >= 1, func(t *transport) { t.n = n }, "permits %d, want at least 1", n)
}

// WithMaxPause sets the longest pause a response's headers make the transport set; the
// default is DefaultMaxPause (5 minutes). A longer one pauses for d and is reported to
// TransportHooks.BadHeader ("longer than the cap"). d must be positive (an error wrapping
// ErrInvalidOption otherwise).
func WithMaxPause(d time.Duration) TransportOption {
	return checked(d > 0, func(t *transport) { t.maxPause = d }, "max pause %v, want > 0", d)
}

// WithRetries makes the transport send a request refused for a rate limit (see
// NewTransport) again, up to n times, after the pause the answer set, waiting for its
// permits like the first send. The default, 0, never retries; n must not be negative
// (an error wrapping ErrInvalidOption otherwise). Only a request without a body or with
// GetBody (http.NewRequest sets it for bytes, strings and bytes.Reader bodies) is
// retried. When GetBody fails, the last response is returned before the retry takes
// any permit or books any cost. When the retry cannot be sent before the request's
// deadline, or the Reserver fails, the last response is returned; when the context ends
// while the retry waits, ctx.Err(). Each response discarded for a retry is drained (up
// to 64KiB, so its connection can be reused) and closed, and TransportHooks.Retrying is
// called.
func WithRetries(n int) TransportOption {
	return checked(n >= 0, func(t *transport) { t.retries = n }, "retries %d, want >= 0", n)
}

// WithTransportHooks sets callbacks the transport calls (see TransportHooks).
func WithTransportHooks(h TransportHooks) TransportOption {
	return transportOption(func(t *transport) { t.hooks = h })
}

// withTransportClock sets the local clock the absolute times in a response's headers
// count from (tests; waiting uses the Reserver's clock).
func withTransportClock(c clock.Clock) TransportOption {
	return checked(c != nil, func(t *transport) { t.clock = c }, "nil clock")
}

// TransportHooks are callbacks the transport calls, to count or log what it did
// without wrapping it. Any of them may be nil. They run on the goroutine of
// RoundTrip, must not block, must be safe for simultaneous use, and must neither
// modify the request nor read its body.
type TransportHooks struct {
	// NotSent is called when RoundTrip returns err without sending req: waiting for
	// its permits failed, choosing its Reserver failed, or the transport is
	// misconfigured.
	NotSent func(req *http.Request, err error)

	// Paused is called after the transport paused the Reserver for d because the
	// answer to req, with status, asked it to back off (see NewTransport and
	// WithRateLimitHeaders).
	Paused func(req *http.Request, status int, d time.Duration)

	// BadHeader is called, before any pause and whether or not the Reserver can
	// pause, once for each header of the answer to req (with status) that the
	// transport could not use as it stood: err says which, and what it did instead.
	BadHeader func(req *http.Request, status int, err *HeaderError)

	// Quota is called, with WithRateLimitHeaders, for each token quota the answer to
	// req states (OpenAI's and Anthropic's token headers). The transport pauses on one
	// only with WithCost, when less of it remains than req's estimate.
	Quota func(req *http.Request, q Quota)

	// PauseFailed is called when pausing the Reserver for d failed with err; the
	// response is returned all the same (and this process is held all the same).
	PauseFailed func(req *http.Request, d time.Duration, err error)

	// Retrying is called when the transport discarded a response with status to
	// send req again (see WithRetries); retry counts from 1.
	Retrying func(req *http.Request, status int, retry int)

	// Unsettled is called, with WithCost, when the booking of req's estimate was not
	// settled with the actual cost of its answer with status (0: no answer came, the
	// base transport failed): err is nil when there was no actual cost (no answer, or
	// actual returned nil), and the estimate stands; else it is Settle's error. It runs
	// on the goroutine that read the answer's body to its end or closed it.
	Unsettled func(req *http.Request, status int, err error)
}

type transport struct {
	choose   func(*http.Request) (Reserver, int, error)
	base     http.RoundTripper
	n        int
	maxPause time.Duration
	retries  int
	reserve  int // WithRateLimitHeaders; -1: off
	clock    clock.Clock
	hooks    TransportHooks
	err      error // the first bad option, or a nil choose

	estimate func(*http.Request) map[string]int          // WithCost; nil: off
	actual   func(*http.Response, []byte) map[string]int // WithCost
}

// checked returns the option that calls set when ok, else records an error wrapping
// ErrInvalidOption (format, args), unless one is recorded already.
func checked(ok bool, set func(*transport), format string, args ...any) TransportOption {
	return transportOption(func(t *transport) {
		switch {
		case ok:
			set(t)
		case t.err == nil:
			t.err = fmt.Errorf("%w: %s", ErrInvalidOption, fmt.Sprintf(format, args...))
		}
	})
}

// RoundTrip waits for the request's permits, sends it, pauses the Reserver if the
// response asks the client to back off, and retries if told to. See NewTransport.
func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	r, n, cost, err := t.pick(req)
	var res *Reservation // WithCost's booking of the attempt under way
	if err == nil {
		res, err = t.wait(req.Context(), r, n, cost)
	}
	if err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		if t.hooks.NotSent != nil {
			t.hooks.NotSent(req, err)
		}
		return nil, err
	}
	ctx, out := req.Context(), req
	hasBody := req.Body != nil && req.Body != http.NoBody
	for retry := 1; ; retry++ {
		resp, err := t.base.RoundTrip(out)
		if err != nil || resp == nil {
			if res != nil {
				t.settle(req, nil, res, nil)
			}
			return resp, err
		}
		if res != nil {
			t.settleOn(req, resp, res)
		}
		d, refused := t.backOff(req, r, resp, cost)
		if retry > t.retries || !refused || hasBody && req.GetBody == nil { // cannot be replayed
			return resp, nil
		}
		// the body first: a retry that cannot be sent takes no permits, and books no cost
		next := req.Clone(ctx)
		if hasBody {
			if next.Body, err = req.GetBody(); err != nil { // the answer stands
				return resp, nil
			}
		}
		if _, ok := r.(pauser); !ok && d > 0 {
			// nothing holds this process: sleep out the pause here, unless it ends too late
			err = ErrWouldExceedDeadline
			if d <= clock.MaxWait(ctx) {
				err = NewReservation(true, d, nil).Wait(ctx)
			}
		}
		if err == nil {
			res, err = t.wait(ctx, r, n, cost)
		}
		if err != nil {
			if hasBody && next.Body != nil {
				_ = next.Body.Close()
			}
			if ctx.Err() == nil { // no retry before the deadline, or the Reserver failed
				return resp, nil
			}
			discard(resp)
			return nil, err
		}
		discard(resp)
		if t.hooks.Retrying != nil {
			t.hooks.Retrying(req, resp.StatusCode, retry)
		}
		out = next
	}
}

// pick returns the Reserver and permits for req, and its estimated cost with WithCost.
func (t *transport) pick(req *http.Request) (Reserver, int, map[string]int, error) {
	if t.err != nil {
		return nil, 0, nil, t.err
	}
	r, n, err := t.choose(req)
	switch {
	case err != nil:
		return nil, 0, nil, fmt.Errorf("waiter: choosing the Reserver for %s %s: %w", req.Method, req.URL.Redacted(), err)
	case r == nil:
		return nil, 0, nil, fmt.Errorf("%w: chosen for %s %s", ErrNilReserver, req.Method, req.URL.Redacted())
	case n < 0:
		return nil, 0, nil, fmt.Errorf("%w: permits %d chosen for %s %s, want >= 0", ErrInvalidOption, n, req.Method, req.URL.Redacted())
	case n == 0:
		n = t.n
	}
	if t.estimate == nil {
		return r, n, nil, nil
	}
	if _, ok := r.(costWaiter); !ok {
		return nil, 0, nil, fmt.Errorf("%w: WithCost needs a Reserver with WaitCost, not %T", ErrInvalidOption, r)
	}
	if n != 1 {
		return nil, 0, nil, fmt.Errorf("%w: WithCost books one call per request, not %d permits", ErrInvalidOption, n)
	}
	return r, n, t.estimate(req), nil
}

// wait books n permits of r, or with WithCost one call and its cost, and sleeps until
// they take effect; it returns WithCost's booking.
func (t *transport) wait(ctx context.Context, r Reserver, n int, cost map[string]int) (*Reservation, error) {
	if t.estimate == nil {
		return nil, Wait(ctx, r, n)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return r.(costWaiter).WaitCost(ctx, cost)
}

// discard drains (a little, so the connection can be reused) and closes resp.
func discard(resp *http.Response) {
	_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
	_ = resp.Body.Close()
}

// CloseIdleConnections closes the idle connections of the base transport, if it
// has that method; http.Client.CloseIdleConnections calls it.
func (t *transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// backOff holds and pauses r for as long as the response asks (see judge), calling
// the hooks. It returns that pause (0: none) and whether the response refused for a
// rate limit.
func (t *transport) backOff(req *http.Request, r Reserver, resp *http.Response, cost map[string]int) (time.Duration, bool) {
	d, refused, bad, quotas := t.judge(resp.StatusCode, resp.Header, cost)
	if t.hooks.BadHeader != nil {
		for _, e := range bad {
			t.hooks.BadHeader(req, resp.StatusCode, e)
		}
	}
	if t.hooks.Quota != nil {
		for _, q := range quotas {
			t.hooks.Quota(req, q)
		}
	}
	if p, ok := r.(pauser); ok && d > 0 {
		// Bounded by the Reserver's own bound on a call, not by the request's context: the
		// fleet must back off even if the caller gives up, and Pause holds this process
		// before it calls the store.
		if err := p.Pause(context.WithoutCancel(req.Context()), d); err != nil {
			if t.hooks.PauseFailed != nil {
				t.hooks.PauseFailed(req, d, err)
			}
		} else if t.hooks.Paused != nil {
			t.hooks.Paused(req, resp.StatusCode, d)
		}
	}
	return d, refused
}

// judge reads a response with status and headers h to a request of estimated cost
// (WithCost): how long to back off, cut to the cap (0: not at all), whether it refused
// for a rate limit (see NewTransport), the headers it could not use and, with
// WithRateLimitHeaders, the token quotas. A refusal backs off for the longer of its
// Retry-After and its spent quota's reset, read even without WithRateLimitHeaders: the
// vendor has said when to come back.
func (t *transport) judge(status int, h http.Header, cost map[string]int) (pause time.Duration, refused bool, bad []*HeaderError, quotas []Quota) {
	rd := &reader{h: h, now: t.clock.Now(), maxPause: t.maxPause}
	hasRetryAfter := len(h.Values("Retry-After")) > 0
	tooMany := status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable
	refused = tooMany || status == http.StatusForbidden && hasRetryAfter
	if refused && hasRetryAfter {
		pause, _ = rd.pauseFor(family{reset: "Retry-After", form: delayOrDate})
	}
	if t.reserve >= 0 || refused || status == http.StatusForbidden {
		q, empty := rd.requestQuota(max(t.reserve, 0))
		if status == http.StatusForbidden && empty {
			refused = true
		}
		if t.reserve < 0 && !refused { // a 403 like any other: its headers are not ours to read
			return 0, false, nil, nil
		}
		pause = max(pause, q)
	}
	if tooMany && !hasRetryAfter && !rd.told && len(rd.bad) == 0 {
		rd.report("Retry-After", "", "missing", 0)
	}
	if t.reserve >= 0 {
		var d time.Duration
		quotas, d = rd.tokenQuotas(cost)
		pause = max(pause, d)
	}
	for _, e := range rd.bad {
		if e.Problem == "too far from the local clock" {
			e.Pause = pause
		}
	}
	return pause, refused, rd.bad, quotas
}
