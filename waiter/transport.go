package waiter

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Pauser is a Reserver that can stop granting for a while, across every process that
// shares it: *throttle.Limiter is one. Pause must make every Reserve of the same
// limiter, in any process, book nothing earlier than d from now; a longer pause
// already set must be kept. It must be safe for simultaneous use.
type Pauser interface {
	Pause(ctx context.Context, d time.Duration) error
}

// DefaultMaxPause is the longest pause a Retry-After makes the transport set unless
// WithMaxPause says otherwise. A longer Retry-After (a maintenance window, or a
// proxy's mistake) is cut to it, so that a fleet stalled by one answer asks the
// server again after at most five minutes.
const DefaultMaxPause = 5 * time.Minute

// pauseTimeout bounds the call that pauses the Reserver. It does not end with the
// request's context: the response is in hand, and the fleet should back off even if
// the caller gives up at once.
const pauseTimeout = 2 * time.Second

// NewTransport returns an http.RoundTripper that waits for permits from r before each
// request and then sends it with base; a nil base means http.DefaultTransport. Wrap
// it in an http.Client to throttle every request the client makes:
//
//	client := &http.Client{Transport: waiter.NewTransport(lim, nil)}
//
// Waiting is Wait(req.Context(), r, n), n being 1 unless WithPermits says otherwise:
// requests are sent in arrival order at the limiter's rate, across every process
// that shares it, and a request whose context ends first (or whose deadline comes
// before its permits could) is not sent. RoundTrip then returns the error Wait
// returned (ctx.Err(), or one wrapping ErrWouldExceedDeadline), the http.Client
// wrapping it in a *url.Error. On every such early return the request's body is
// closed and the request is left as it was, as http.RoundTripper requires.
//
// When the server answers 429 (Too Many Requests) or 503 (Service Unavailable) with a
// Retry-After, and r is a Pauser, the transport pauses r for that long, so the whole
// fleet backs off, not only this request. Retry-After is delay-seconds or an
// HTTP-date (RFC 9110, section 10.2.3); a date counts from the response's Date header
// when it has a valid one (so the server's and this host's clocks need not agree),
// else from now. A Retry-After longer than the cap (DefaultMaxPause, or WithMaxPause)
// is cut to the cap; one that is missing, unparsable, negative or in the past sets no
// pause. Each of these is reported to TransportHooks.BadRetryAfter. Retry-After: 0
// sets no pause and is not reported.
//
// The transport never retries: it returns the server's response as it came, 429s
// included, and leaves retrying to the caller. A failed Pause is reported to
// TransportHooks.PauseFailed and does not change the response.
//
// A nil r, or an option out of range, does not panic: every RoundTrip returns an
// error wrapping ErrNilReserver or ErrInvalidOption, sending nothing.
//
// The transport is safe for simultaneous use by multiple goroutines.
func NewTransport(r Reserver, base http.RoundTripper, opts ...TransportOption) http.RoundTripper {
	t := &transport{r: r, base: base, n: 1, maxPause: DefaultMaxPause, clock: SystemClock}
	for _, o := range opts {
		if o != nil {
			o.apply(t)
		}
	}
	if isNilReserver(r) {
		t.err = ErrNilReserver
	}
	if p, ok := r.(Pauser); ok && t.err == nil {
		t.pauser = p
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
	return transportOption(func(t *transport) {
		if n < 1 {
			t.fail("%w: permits %d, want at least 1", ErrInvalidOption, n)
			return
		}
		t.n = n
	})
}

// WithMaxPause sets the longest pause a Retry-After makes the transport set; the
// default is DefaultMaxPause (5 minutes). A longer Retry-After pauses for d and is
// reported to TransportHooks.BadRetryAfter. d must be positive (an error wrapping
// ErrInvalidOption otherwise).
func WithMaxPause(d time.Duration) TransportOption {
	return transportOption(func(t *transport) {
		if d <= 0 {
			t.fail("%w: max pause %v, want > 0", ErrInvalidOption, d)
			return
		}
		t.maxPause = d
	})
}

// WithTransportHooks sets callbacks the transport calls (see TransportHooks).
func WithTransportHooks(h TransportHooks) TransportOption {
	return transportOption(func(t *transport) { t.hooks = h })
}

// WithTransportClock sets the clock an HTTP-date Retry-After counts from when the
// response has no valid Date header; the default is SystemClock. Waiting uses the
// Reserver's clock, not this one. A nil clock is an error wrapping ErrInvalidOption.
func WithTransportClock(c Clock) TransportOption {
	return transportOption(func(t *transport) {
		if c == nil {
			t.fail("%w: nil clock", ErrInvalidOption)
			return
		}
		t.clock = c
	})
}

// TransportHooks are callbacks the transport calls, to count or log what it did
// without wrapping it. Any of them may be nil. They run on the goroutine of
// RoundTrip, must not block, must be safe for simultaneous use, and must neither
// modify the request nor read its body.
type TransportHooks struct {
	// NotSent is called when RoundTrip returns err without sending req: waiting for
	// its permits failed (the context ended, the permits would come after its
	// deadline, the Reserver failed) or the transport is misconfigured.
	NotSent func(req *http.Request, err error)

	// Paused is called after the transport paused the Reserver for d because the
	// server answered req with status (429 or 503) and a Retry-After.
	Paused func(req *http.Request, status int, d time.Duration)

	// BadRetryAfter is called when the server answered req with status (429 or 503)
	// and a Retry-After the transport could not use as it stood. err wraps
	// ErrRetryAfterMissing, ErrRetryAfterInvalid or ErrRetryAfterPast (no pause was
	// set) or ErrRetryAfterTooLong (the pause was cut to the cap; Paused follows),
	// and quotes the header. It is called whether or not the Reserver is a Pauser.
	BadRetryAfter func(req *http.Request, status int, err error)

	// PauseFailed is called when pausing the Reserver for d failed with err; the
	// response is returned all the same.
	PauseFailed func(req *http.Request, d time.Duration, err error)
}

// transport is what NewTransport returns.
type transport struct {
	r        Reserver
	pauser   Pauser // r, when it is one
	base     http.RoundTripper
	n        int
	maxPause time.Duration
	clock    Clock
	hooks    TransportHooks
	err      error // the first bad option, or a nil Reserver
}

func (t *transport) fail(format string, args ...any) {
	if t.err == nil {
		t.err = fmt.Errorf(format, args...)
	}
}

// RoundTrip waits for the request's permits, sends it, and pauses the Reserver if the
// response asks the client to back off. See NewTransport.
func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	err := t.err
	if err == nil {
		err = Wait(req.Context(), t.r, t.n)
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
	base := t.base
	if base == nil {
		base = http.DefaultTransport
	}
	resp, err := base.RoundTrip(req)
	if err == nil && resp != nil &&
		(resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) {
		t.backOff(req, resp)
	}
	return resp, err
}

// CloseIdleConnections closes the idle connections of the base transport, if it
// has that method; http.Client.CloseIdleConnections calls it.
func (t *transport) CloseIdleConnections() {
	base := t.base
	if base == nil {
		base = http.DefaultTransport
	}
	if c, ok := base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// backOff pauses the Reserver for as long as the response's Retry-After asks.
func (t *transport) backOff(req *http.Request, resp *http.Response) {
	d, err := t.retryAfter(resp.Header)
	if err != nil && t.hooks.BadRetryAfter != nil {
		t.hooks.BadRetryAfter(req, resp.StatusCode, err)
	}
	if d <= 0 || t.pauser == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(req.Context()), pauseTimeout)
	defer cancel()
	if err := t.pauser.Pause(ctx, d); err != nil {
		if t.hooks.PauseFailed != nil {
			t.hooks.PauseFailed(req, d, err)
		}
		return
	}
	if t.hooks.Paused != nil {
		t.hooks.Paused(req, resp.StatusCode, d)
	}
}

// retryAfter returns the pause h's Retry-After asks for, cut to the cap, and why the
// header could not be used as it stood (nil when it could). A pause of 0 means none.
func (t *transport) retryAfter(h http.Header) (time.Duration, error) {
	vs := h.Values("Retry-After")
	if len(vs) == 0 {
		return 0, ErrRetryAfterMissing
	}
	v := strings.TrimSpace(vs[0])
	var d time.Duration
	if secs, neg, ok := parseSeconds(v); ok {
		switch {
		case neg && secs > 0:
			return 0, fmt.Errorf("%w: %q", ErrRetryAfterPast, v)
		case secs > uint64(t.maxPause/time.Second):
			return t.maxPause, fmt.Errorf("%w: %q, paused %v", ErrRetryAfterTooLong, v, t.maxPause)
		}
		d = time.Duration(secs) * time.Second
	} else {
		at, err := http.ParseTime(v)
		if err != nil {
			return 0, fmt.Errorf("%w: %q", ErrRetryAfterInvalid, v)
		}
		from := t.clock.Now()
		if date, err := http.ParseTime(h.Get("Date")); err == nil {
			from = date
		}
		d = at.Sub(from)
		if d < 0 {
			return 0, fmt.Errorf("%w: %q is %v before %s", ErrRetryAfterPast, v, -d, from.UTC().Format(http.TimeFormat))
		}
	}
	if d > t.maxPause {
		return t.maxPause, fmt.Errorf("%w: %q, paused %v", ErrRetryAfterTooLong, v, t.maxPause)
	}
	return d, nil
}

// parseSeconds reads delay-seconds (1*DIGIT), and a negative number as such so that
// it is reported as in the past rather than unparsable. A number too large for a
// uint64 reads as math.MaxUint64: it is far too long either way.
func parseSeconds(v string) (secs uint64, neg, ok bool) {
	if strings.HasPrefix(v, "-") {
		neg, v = true, v[1:]
	}
	if v == "" {
		return 0, false, false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false, false
		}
	}
	secs, err := strconv.ParseUint(v, 10, 64)
	if err != nil { // only a range error is left
		secs = math.MaxUint64
	}
	return secs, neg, true
}

// isNilReserver reports whether r is nil, or a nil pointer (or map, func…) in a
// non-nil interface, on which Reserve would panic.
func isNilReserver(r Reserver) bool {
	if r == nil {
		return true
	}
	v := reflect.ValueOf(r)
	switch v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice, reflect.Interface:
		return v.IsNil()
	}
	return false
}
