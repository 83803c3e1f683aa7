package waiter_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
)

// ---- the estimate and the actual, as a user writes them ----

// estimateHeader is WithCost's estimate: the X-Estimate header's tokens.
func estimateHeader(req *http.Request) map[string]int {
	n, _ := strconv.Atoi(req.Header.Get("X-Estimate"))
	return map[string]int{"tokens": n}
}

// usageOf is WithCost's actual: the tokens of the last usage object in the body (a
// JSON answer's, or a stream's final event), nothing for a refusal, nil when the body
// holds none.
func usageOf(resp *http.Response, body []byte) map[string]int {
	if resp.StatusCode == http.StatusTooManyRequests {
		return map[string]int{"tokens": 0}
	}
	i := bytes.LastIndex(body, []byte(`{"total_tokens":`))
	if i < 0 {
		return nil
	}
	var u struct {
		Total int `json:"total_tokens"`
	}
	if err := json.NewDecoder(bytes.NewReader(body[i:])).Decode(&u); err != nil {
		return nil
	}
	return map[string]int{"tokens": u.Total}
}

// unsettledLog records TransportHooks.Unsettled's calls as "status err".
type unsettledLog struct {
	mu  sync.Mutex
	got []string
}

func (l *unsettledLog) hook(_ *http.Request, status int, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, fmt.Sprintf("%d %v", status, err))
}

func (l *unsettledLog) calls() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.got...)
}

// costLimiter returns a limiter of 100 calls and 10,000 tokens a minute in this process,
// and the same key's limiter on a client of its own, another process.
func costLimiter(t *testing.T, b *redistest.Backend, key string) (here, other *throttle.Limiter) {
	t.Helper()
	tokens := throttle.WithLimits(throttle.Limit{Rate: 10000, Period: time.Minute, Unit: "tokens"})
	here, err := throttle.New(b.Client, key, throttle.PerMinute(100), tokens, throttle.WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	c := redistest.Dial(b.Addrs())
	t.Cleanup(func() { c.Close() })
	other, err = throttle.New(c, key, throttle.PerMinute(100), tokens, throttle.WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	return here, other
}

// used returns the calls and tokens l's limits have used, as Inspect reads them.
func used(t *testing.T, l *throttle.Limiter) (calls, tokens int) {
	t.Helper()
	st, err := l.Inspect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st.Limits[0].Used, st.Limits[1].Used
}

// costRequest is a GET to url estimated at estimate tokens.
func costRequest(t *testing.T, url string, estimate int) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Estimate", strconv.Itoa(estimate))
	return req
}

// ---- on every backend ----

// An answer's actual cost is settled once, when its body is read to the end or closed,
// whichever comes first: the refund is there for another process at once. An answer
// closed unread has no usage: its estimate stands and the hook is told.
func TestTransportCostSettles(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		srv := newRecordingServer(t, func(_ int, w http.ResponseWriter, _ *recordingServer) {
			fmt.Fprint(w, `{"id":"x","choices":[],"usage":{"total_tokens":300}}`)
		})
		t.Run("read to the end", func(t *testing.T) {
			here, other := costLimiter(t, b, "settle-eof")
			var actuals int
			var un unsettledLog
			client := &http.Client{Transport: waiter.NewTransport(here, nil, waiter.WithCost(estimateHeader,
				func(resp *http.Response, body []byte) map[string]int { actuals++; return usageOf(resp, body) }),
				waiter.WithTransportHooks(waiter.TransportHooks{Unsettled: un.hook}))}
			resp, err := client.Do(costRequest(t, srv.URL, 1000))
			if err != nil {
				t.Fatal(err)
			}
			if calls, tokens := used(t, other); calls != 1 || tokens != 1000 {
				t.Fatalf("before the body is read: %d calls, %d tokens, want 1 and the estimate, 1000", calls, tokens)
			}
			if _, err := io.ReadAll(resp.Body); err != nil {
				t.Fatal(err)
			}
			if calls, tokens := used(t, other); calls != 1 || tokens != 300 {
				t.Fatalf("read to the end, not closed: %d calls, %d tokens, want 1 and the actual, 300", calls, tokens)
			}
			if r, err := other.Cost(map[string]int{"tokens": 9700}).Reserve(context.Background(), 1, 0); err != nil || !r.OK() {
				t.Fatalf("the other process's 9,700 tokens beside the 300 settled: %v %v, want OK", r, err)
			}
			resp.Body.Close()
			resp.Body.Close()
			if calls, tokens := used(t, other); actuals != 1 || calls != 2 || tokens != 10000 {
				t.Errorf("closed twice after its end: actual called %d times, %d calls, %d tokens; want once, 2 and 10,000", actuals, calls, tokens)
			}
			if got := un.calls(); got != nil {
				t.Errorf("Unsettled got %v, want no call", got)
			}
		})
		t.Run("closed unread", func(t *testing.T) {
			here, other := costLimiter(t, b, "settle-close")
			var un unsettledLog
			client := &http.Client{Transport: waiter.NewTransport(here, nil, waiter.WithCost(estimateHeader, usageOf),
				waiter.WithTransportHooks(waiter.TransportHooks{Unsettled: un.hook}))}
			resp, err := client.Do(costRequest(t, srv.URL, 1000))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got, want := un.calls(), []string{"200 <nil>"}; !reflect.DeepEqual(got, want) {
				t.Errorf("Unsettled got %v, want %v", got, want)
			}
			if _, tokens := used(t, other); tokens != 1000 {
				t.Errorf("closed unread: %d tokens, want the estimate, 1000", tokens)
			}
		})
	})
}

// A streamed answer (server-sent events) settles from its final usage event, once the
// stream has ended; a stream cut before it, or that ends without one, keeps its
// estimate and tells the hook.
func TestTransportCostStream(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		type stream struct{ usage, ended chan struct{} }
		streams := make(chan stream, 1)
		srv := newRecordingServer(t, func(_ int, w http.ResponseWriter, _ *recordingServer) {
			s := <-streams
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"word %d\"}}]}\n\n", i)
			}
			w.(http.Flusher).Flush()
			if _, ok := <-s.usage; ok { // closed without a value: end without usage
				fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"total_tokens\":420}}\n\ndata: [DONE]\n\n")
			}
			close(s.ended)
		})
		for _, c := range []struct {
			name      string
			usage     bool // the server sends the usage event
			readAll   bool // the client reads to the end (else it closes after the first event)
			tokens    int
			unsettled []string
		}{
			{"usage at the end", true, true, 420, nil},
			{"ended without usage", false, true, 1000, []string{"200 <nil>"}},
			{"cut by the client", true, false, 1000, []string{"200 <nil>"}},
		} {
			t.Run(c.name, func(t *testing.T) {
				here, other := costLimiter(t, b, "stream-"+c.name)
				var un unsettledLog
				client := &http.Client{Transport: waiter.NewTransport(here, nil, waiter.WithCost(estimateHeader, usageOf),
					waiter.WithTransportHooks(waiter.TransportHooks{Unsettled: un.hook}))}
				s := stream{usage: make(chan struct{}, 1), ended: make(chan struct{})}
				release := sync.OnceFunc(func() { close(s.usage) })
				defer release() // the server's handler ends, whatever the test does
				streams <- s
				resp, err := client.Do(costRequest(t, srv.URL, 1000))
				if err != nil {
					t.Fatal(err)
				}
				lines := bufio.NewScanner(resp.Body)
				lines.Scan()
				if _, tokens := used(t, other); tokens != 1000 {
					t.Fatalf("while the stream runs: %d tokens, want the estimate, 1000", tokens)
				}
				if c.usage {
					s.usage <- struct{}{}
				}
				release()
				if c.readAll {
					for lines.Scan() {
					}
				}
				resp.Body.Close()
				<-s.ended
				if _, tokens := used(t, other); tokens != c.tokens {
					t.Errorf("%d tokens, want %d", tokens, c.tokens)
				}
				if got := un.calls(); !reflect.DeepEqual(got, c.unsettled) {
					t.Errorf("Unsettled got %v, want %v", got, c.unsettled)
				}
			})
		}
	})
}

// With WithRetries, each send books its own estimate, and the answer discarded for the
// retry is settled too: a refusal charged nothing.
func TestTransportCostRetries(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		srv := newRecordingServer(t, func(i int, w http.ResponseWriter, _ *recordingServer) {
			if i == 1 {
				w.Header().Set("Retry-After", "0")
				http.Error(w, "slow down", http.StatusTooManyRequests)
				return
			}
			fmt.Fprint(w, `{"usage":{"total_tokens":250}}`)
		})
		here, other := costLimiter(t, b, "retries")
		var estimates int
		var un unsettledLog
		client := &http.Client{Transport: waiter.NewTransport(here, nil, waiter.WithRetries(1),
			waiter.WithCost(func(req *http.Request) map[string]int { estimates++; return estimateHeader(req) }, usageOf),
			waiter.WithTransportHooks(waiter.TransportHooks{Unsettled: un.hook}))}
		resp, err := client.Do(costRequest(t, srv.URL, 1000))
		if err != nil {
			t.Fatal(err)
		}
		if calls, tokens := used(t, other); calls != 2 || tokens != 1000 {
			t.Fatalf("after the retry, its body unread: %d calls, %d tokens; want 2, and the refusal settled at 0 beside the retry's estimate", calls, tokens)
		}
		if _, err := io.ReadAll(resp.Body); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if calls, tokens := used(t, other); calls != 2 || tokens != 250 || estimates != 1 || resp.StatusCode != 200 {
			t.Errorf("%d: %d calls, %d tokens, estimate called %d times; want 200, 2 calls, 250 tokens, once", resp.StatusCode, calls, tokens, estimates)
		}
		if got := un.calls(); got != nil {
			t.Errorf("Unsettled got %v, want no call", got)
		}
	})
}

// With WithRateLimitHeaders, an answer saying fewer tokens remain than the request's
// estimate pauses the key for every process; one with enough left does not. (The
// pause is long, so that the other process finds it however late it looks.)
func TestTransportCostHeaderPause(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		remaining := make(chan string, 1)
		srv := newRecordingServer(t, func(_ int, w http.ResponseWriter, _ *recordingServer) {
			w.Header().Set("X-Ratelimit-Limit-Tokens", "10000")
			w.Header().Set("X-Ratelimit-Remaining-Tokens", <-remaining)
			w.Header().Set("X-Ratelimit-Reset-Tokens", "600s")
			fmt.Fprint(w, `{"usage":{"total_tokens":100}}`)
		})
		here, other := costLimiter(t, b, "header-pause")
		var paused []time.Duration
		client := &http.Client{Transport: waiter.NewTransport(here, nil, waiter.WithCost(estimateHeader, usageOf),
			waiter.WithRateLimitHeaders(0),
			waiter.WithTransportHooks(waiter.TransportHooks{Paused: func(_ *http.Request, _ int, d time.Duration) { paused = append(paused, d) }}))}
		send := func() {
			resp, err := client.Do(costRequest(t, srv.URL, 1000))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		remaining <- "1000"
		send()
		if st, err := other.Inspect(context.Background()); err != nil || st.PausedFor != 0 || paused != nil {
			t.Fatalf("1,000 tokens left for an estimate of 1,000: paused %v (%v, %v), want not", paused, st.PausedFor, err)
		}
		remaining <- "0"
		send()
		want := time.Minute // until 1,000 tokens of 10,000 are back
		if st, err := other.Inspect(context.Background()); err != nil || len(paused) != 1 || paused[0] != want || st.PausedFor <= 0 {
			t.Fatalf("no tokens left: paused %v (the other process sees %v, %v), want %v", paused, st.PausedFor, err, want)
		}
	})
}

// ---- no Redis ----

// fakeCoster is a fakePauser with WaitCost: it books at once and records each estimate
// and each settle.
type fakeCoster struct {
	fakePauser
	estimates []map[string]int
	settles   []map[string]int
	settleErr error
	ctxErrs   []error // each settle's context's Err
}

func (r *fakeCoster) WaitCost(ctx context.Context, cost map[string]int) (*waiter.Reservation, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.estimates = append(r.estimates, cost)
	return waiter.NewCostReservation(true, 0, nil, func(ctx context.Context, actual map[string]int) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.settles = append(r.settles, actual)
		r.ctxErrs = append(r.ctxErrs, ctx.Err())
		return r.settleErr
	}), nil
}

func (r *fakeCoster) settled() []map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]map[string]int(nil), r.settles...)
}

// bodyOf is a base transport that answers 200 with body.
func bodyOf(body string) roundTripFunc {
	return func(req *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(body)), Request: req}, nil
	}
}

// actual sees the whole body up to a MiB, the last MiB of a longer one (a long stream
// keeps its final usage); the caller reads every byte as sent.
func TestTransportCostBodyTail(t *testing.T) {
	for _, size := range []int{0, 100, 1 << 20, 3<<20 + 12345} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			usage := `{"total_tokens":77}`
			filler := strings.Repeat("data: x\n\n", size/9+1)[:size]
			var seen []byte
			r := &fakeCoster{}
			tr := waiter.NewTransport(r, bodyOf(filler+usage), waiter.WithCost(estimateHeader,
				func(resp *http.Response, body []byte) map[string]int {
					seen = append([]byte(nil), body...)
					return usageOf(resp, body)
				}))
			resp, err := tr.RoundTrip(costRequest(t, "http://127.0.0.1:1/", 100))
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			if _, err := io.CopyBuffer(&got, struct{ io.Reader }{resp.Body}, make([]byte, 4096)); err != nil {
				t.Fatal(err)
			}
			if got.String() != filler+usage {
				t.Fatalf("the caller read %d bytes, want the %d sent", got.Len(), size+len(usage))
			}
			whole := filler + usage
			if want := whole[max(0, len(whole)-1<<20):]; string(seen) != want {
				t.Errorf("actual saw %d bytes, want the last %d", len(seen), len(want))
			}
			if got, want := r.settled(), []map[string]int{{"tokens": 77}}; !reflect.DeepEqual(got, want) {
				t.Errorf("settled %v, want %v", got, want)
			}
		})
	}
}

// The settle comes once, whatever the caller does after: Close after the end, Close
// twice, Read after Close. Its context is not the request's, which has ended.
func TestTransportCostSettlesOnce(t *testing.T) {
	r := &fakeCoster{}
	var actuals int
	tr := waiter.NewTransport(r, bodyOf(`{"usage":{"total_tokens":5}}`), waiter.WithCost(estimateHeader,
		func(resp *http.Response, body []byte) map[string]int { actuals++; return usageOf(resp, body) }))
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := tr.RoundTrip(costRequest(t, "http://127.0.0.1:1/", 100).WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	_, _ = io.ReadAll(resp.Body)
	_, _ = resp.Body.Read(make([]byte, 10))
	resp.Body.Close()
	resp.Body.Close()
	if got, want := r.settled(), []map[string]int{{"tokens": 5}}; actuals != 1 || !reflect.DeepEqual(got, want) {
		t.Errorf("actual called %d times, settled %v; want once, %v", actuals, got, want)
	}
	if r.ctxErrs[0] != nil {
		t.Errorf("the settle's context: %v, want one not ended with the request's", r.ctxErrs[0])
	}
}

// A settle that fails, or an answer that never came, is reported to Unsettled; a nil
// hook is fine.
func TestTransportCostUnsettled(t *testing.T) {
	failed := errors.New("store down")
	t.Run("settle fails", func(t *testing.T) {
		r := &fakeCoster{settleErr: failed}
		var un unsettledLog
		tr := waiter.NewTransport(r, bodyOf(`{"total_tokens":5}`), waiter.WithCost(estimateHeader, usageOf),
			waiter.WithTransportHooks(waiter.TransportHooks{Unsettled: un.hook}))
		resp, err := tr.RoundTrip(costRequest(t, "http://127.0.0.1:1/", 100))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(resp.Body)
		if got, want := un.calls(), []string{"200 store down"}; !reflect.DeepEqual(got, want) {
			t.Errorf("Unsettled got %v, want %v", got, want)
		}
	})
	t.Run("no answer", func(t *testing.T) {
		r := &fakeCoster{}
		var un unsettledLog
		tr := waiter.NewTransport(r, roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, failed }),
			waiter.WithCost(estimateHeader, usageOf), waiter.WithTransportHooks(waiter.TransportHooks{Unsettled: un.hook}))
		if _, err := tr.RoundTrip(costRequest(t, "http://127.0.0.1:1/", 100)); !errors.Is(err, failed) {
			t.Fatalf("RoundTrip: %v, want the base transport's error", err)
		}
		if got, want := un.calls(), []string{"0 <nil>"}; !reflect.DeepEqual(got, want) || r.settled() != nil {
			t.Errorf("Unsettled got %v, settled %v; want %v, no settle", got, r.settled(), want)
		}
	})
	t.Run("no hook", func(t *testing.T) {
		tr := waiter.NewTransport(&fakeCoster{}, bodyOf(""), waiter.WithCost(estimateHeader, usageOf))
		resp, err := tr.RoundTrip(costRequest(t, "http://127.0.0.1:1/", 100))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	})
}

// A token quota below the request's estimate in its unit pauses until that much is
// back (the reset's share of what is missing, or the reset when the limit is not
// stated), cut to the cap; quotas of units the estimate does not name, or with enough
// left, do not.
func TestTransportCostTokenQuotas(t *testing.T) {
	part := func(d time.Duration, num, den int64) time.Duration {
		return time.Duration(math.Ceil(float64(d) * (float64(num) / float64(den))))
	}
	for _, c := range []struct {
		name     string
		estimate map[string]int
		header   map[string]string
		pause    time.Duration
		bad      string
	}{
		{"OpenAI, enough left", map[string]int{"tokens": 1000}, map[string]string{
			"X-Ratelimit-Limit-Tokens": "10000", "X-Ratelimit-Remaining-Tokens": "1000", "X-Ratelimit-Reset-Tokens": "6s"}, 0, ""},
		{"OpenAI, less left", map[string]int{"tokens": 1000}, map[string]string{
			"X-Ratelimit-Limit-Tokens": "10000", "X-Ratelimit-Remaining-Tokens": "300", "X-Ratelimit-Reset-Tokens": "6s"}, part(6*time.Second, 700, 9700), ""},
		{"OpenAI, no limit stated: the reset", map[string]int{"tokens": 1000}, map[string]string{
			"X-Ratelimit-Remaining-Tokens": "300", "X-Ratelimit-Reset-Tokens": "6s"}, 6 * time.Second, ""},
		{"OpenAI, unreadable limit: the reset", map[string]int{"tokens": 1000}, map[string]string{
			"X-Ratelimit-Limit-Tokens": "many", "X-Ratelimit-Remaining-Tokens": "0", "X-Ratelimit-Reset-Tokens": "6s"}, 6 * time.Second,
			"X-Ratelimit-Limit-Tokens: unreadable"},
		{"OpenAI, no reset", map[string]int{"tokens": 1000}, map[string]string{
			"X-Ratelimit-Limit-Tokens": "10000", "X-Ratelimit-Remaining-Tokens": "0"}, 0, ""},
		{"OpenAI, reset above the cap", map[string]int{"tokens": 1000}, map[string]string{
			"X-Ratelimit-Remaining-Tokens": "0", "X-Ratelimit-Reset-Tokens": "1h"}, 5 * time.Minute, "X-Ratelimit-Reset-Tokens: longer than the cap"},
		{"a unit the estimate does not name", map[string]int{"input-tokens": 10}, map[string]string{
			"X-Ratelimit-Limit-Tokens": "10000", "X-Ratelimit-Remaining-Tokens": "0", "X-Ratelimit-Reset-Tokens": "6s"}, 0, ""},
		{"Anthropic, the longer of two", map[string]int{"input-tokens": 500, "output-tokens": 200}, map[string]string{
			"Anthropic-Ratelimit-Input-Tokens-Limit": "40000", "Anthropic-Ratelimit-Input-Tokens-Remaining": "100",
			"Anthropic-Ratelimit-Input-Tokens-Reset":  rfc3339(30 * time.Second),
			"Anthropic-Ratelimit-Output-Tokens-Limit": "8000", "Anthropic-Ratelimit-Output-Tokens-Remaining": "0",
			"Anthropic-Ratelimit-Output-Tokens-Reset": rfc3339(60 * time.Second)},
			max(part(30*time.Second, 400, 39900), part(60*time.Second, 200, 8000)), ""},
		{"Anthropic, input enough, output short", map[string]int{"input-tokens": 500, "output-tokens": 200}, map[string]string{
			"Anthropic-Ratelimit-Input-Tokens-Limit": "40000", "Anthropic-Ratelimit-Input-Tokens-Remaining": "30000",
			"Anthropic-Ratelimit-Input-Tokens-Reset":  rfc3339(30 * time.Second),
			"Anthropic-Ratelimit-Output-Tokens-Limit": "8000", "Anthropic-Ratelimit-Output-Tokens-Remaining": "199",
			"Anthropic-Ratelimit-Output-Tokens-Reset": rfc3339(60 * time.Second)}, part(60*time.Second, 1, 7801), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &fakeCoster{}
			var bad badLog
			tr := waiter.NewTransport(r, answer(200, c.header), waiter.WithRateLimitHeaders(0),
				waiter.WithCost(func(*http.Request) map[string]int { return c.estimate }, usageOf),
				waiter.WithTransportClock(stoppedClock(t0)), waiter.WithTransportHooks(waiter.TransportHooks{BadHeader: bad.hook}))
			resp, err := tr.RoundTrip(newRequest(t, context.Background(), nil))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			var want []time.Duration
			if c.pause > 0 {
				want = []time.Duration{c.pause}
			}
			if got := r.pauses(); !reflect.DeepEqual(got, want) {
				t.Errorf("paused %v, want %v", got, want)
			}
			bad.check(t, c.bad, c.pause)
		})
	}
}

// Bad options and a Reserver that cannot book costs send nothing: RoundTrip returns an
// error wrapping ErrInvalidOption, the body closed, NotSent told.
func TestTransportCostBadOptions(t *testing.T) {
	est := func(*http.Request) map[string]int { return map[string]int{"tokens": 1} }
	act := func(*http.Response, []byte) map[string]int { return nil }
	for _, c := range []struct {
		name string
		tr   func(base http.RoundTripper, hooks waiter.TransportOption) http.RoundTripper
	}{
		{"nil estimate", func(base http.RoundTripper, h waiter.TransportOption) http.RoundTripper {
			return waiter.NewTransport(&fakeCoster{}, base, waiter.WithCost(nil, act), h)
		}},
		{"nil actual", func(base http.RoundTripper, h waiter.TransportOption) http.RoundTripper {
			return waiter.NewTransport(&fakeCoster{}, base, waiter.WithCost(est, nil), h)
		}},
		{"permits 2", func(base http.RoundTripper, h waiter.TransportOption) http.RoundTripper {
			return waiter.NewTransport(&fakeCoster{}, base, waiter.WithCost(est, act), waiter.WithPermits(2), h)
		}},
		{"2 permits chosen", func(base http.RoundTripper, h waiter.TransportOption) http.RoundTripper {
			return waiter.NewTransportFunc(func(*http.Request) (waiter.Reserver, int, error) { return &fakeCoster{}, 2, nil },
				base, waiter.WithCost(est, act), h)
		}},
		{"a Reserver without WaitCost", func(base http.RoundTripper, h waiter.TransportOption) http.RoundTripper {
			return waiter.NewTransport(&fakePauser{}, base, waiter.WithCost(est, act), h)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sent := 0
			base := roundTripFunc(func(*http.Request) (*http.Response, error) { sent++; return nil, errors.New("sent") })
			var notSent error
			tr := c.tr(base, waiter.WithTransportHooks(waiter.TransportHooks{NotSent: func(_ *http.Request, err error) { notSent = err }}))
			body := &closeRecorder{Reader: strings.NewReader("x")}
			_, err := tr.RoundTrip(newRequest(t, context.Background(), body))
			if !errors.Is(err, waiter.ErrInvalidOption) || sent != 0 || body.closed.Load() != 1 || notSent != err {
				t.Errorf("err %v, sent %d, body closed %d times, NotSent %v; want ErrInvalidOption, nothing sent, closed once, told", err, sent, body.closed.Load(), notSent)
			}
		})
	}
}

// An estimate the limiter refuses (a negative cost, a unit no limit counts) is its
// error, and nothing is sent.
func TestTransportCostBadEstimate(t *testing.T) {
	here, _ := costLimiter(t, redistest.NewMini(t), "bad-estimate")
	for _, cost := range []map[string]int{{"tokens": -1}, {"words": 3}} {
		sent := 0
		tr := waiter.NewTransport(here, roundTripFunc(func(*http.Request) (*http.Response, error) { sent++; return nil, errors.New("sent") }),
			waiter.WithCost(func(*http.Request) map[string]int { return cost }, usageOf))
		if _, err := tr.RoundTrip(newRequest(t, context.Background(), nil)); !errors.Is(err, throttle.ErrInvalidArgument) || sent != 0 {
			t.Errorf("estimate %v: %v, sent %d; want ErrInvalidArgument, nothing sent", cost, err, sent)
		}
	}
}
