package waiter

import (
	"context"
	"io"
	"net/http"
	"sync"
)

// costWaiter is a Reserver that books a call's estimated costs and settles the actual
// ones: *throttle.Limiter is one.
type costWaiter interface {
	WaitCost(ctx context.Context, cost map[string]int) (*Reservation, error)
}

// costBodyTail is how much of an answer's body WithCost keeps for actual: its last
// MiB, so that a streamed answer of any length keeps its final usage event.
const costBodyTail = 1 << 20

// WithCost makes each request cost what estimate(req) says, by unit, besides the call
// itself, and the transport settle the actual cost once the answer is read (see
// throttle.Limiter's WaitCost and the Reservation's Settle; docs/costs.md). The Reserver
// must have WaitCost, and each request takes one call: WithPermits (or a
// NewTransportFunc choice) other than 1, a Reserver without WaitCost or a nil function
// is an error wrapping ErrInvalidOption on every request.
//
// estimate must be safe for simultaneous use and must not modify the request nor read
// req.Body; it may read a copy from req.GetBody. It names every unit actual may return
// (a settle cannot charge a unit the booking did not). A negative cost, or one in a unit no
// limit counts, is WaitCost's error: the request is not sent.
//
// When the caller has read the answer's body to its end or closes it, whichever comes
// first, the transport calls actual(resp, body) once, body being what was read (its
// last MiB), and settles with it on that goroutine, bounded by the Reserver's own bound
// on a call, not by the request's context. actual returns nil when the answer carries no
// actual cost: the estimate stands, and TransportHooks.Unsettled is told, as it is when
// no answer came or the settle fails. An answer discarded for a retry is settled too.
// With WithRateLimitHeaders, a token quota with less left than the estimate in its unit
// ("tokens", "input-tokens", "output-tokens") pauses the Reserver until that much is back.
func WithCost(estimate func(req *http.Request) map[string]int, actual func(resp *http.Response, body []byte) map[string]int) TransportOption {
	return checked(estimate != nil && actual != nil, func(t *transport) { t.estimate, t.actual = estimate, actual },
		"WithCost with a nil function")
}

// settleOn makes the end or close of resp's body settle res with resp's actual cost.
func (t *transport) settleOn(req *http.Request, resp *http.Response, res *Reservation) {
	if resp.Body == nil { // a base transport breaking the RoundTripper contract: nothing to read
		t.settle(req, resp, res, nil)
		return
	}
	resp.Body = &costBody{ReadCloser: resp.Body, settle: func(body []byte) { t.settle(req, resp, res, body) }}
}

// settle settles res with the actual cost of resp (nil: no answer came), whose body was
// body, and tells TransportHooks.Unsettled when it could not.
func (t *transport) settle(req *http.Request, resp *http.Response, res *Reservation, body []byte) {
	var (
		actual map[string]int
		status int
		err    error
	)
	if resp != nil {
		actual, status = t.actual(resp, body), resp.StatusCode
	}
	if actual != nil {
		err = res.Settle(context.WithoutCancel(req.Context()), actual)
	}
	if (actual == nil || err != nil) && t.hooks.Unsettled != nil {
		t.hooks.Unsettled(req, status, err)
	}
}

// costBody is an answer's body that keeps its last costBodyTail bytes read and calls
// settle with them once, at its end or its close.
type costBody struct {
	io.ReadCloser
	settle func(body []byte)
	once   sync.Once
	mu     sync.Mutex
	tail   []byte
}

func (b *costBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.mu.Lock()
	b.tail = append(b.tail, p[:n]...)
	if len(b.tail) > 2*costBodyTail { // keep the last costBodyTail, copying once per costBodyTail read
		b.tail = append(b.tail[:0], b.tail[len(b.tail)-costBodyTail:]...)
	}
	b.mu.Unlock()
	if err == io.EOF {
		b.done()
	}
	return n, err
}

func (b *costBody) Close() error {
	err := b.ReadCloser.Close()
	b.done()
	return err
}

// done settles, once.
func (b *costBody) done() {
	b.once.Do(func() {
		b.mu.Lock()
		body := b.tail[max(0, len(b.tail)-costBodyTail):]
		b.tail = nil
		b.mu.Unlock()
		b.settle(body)
	})
}
