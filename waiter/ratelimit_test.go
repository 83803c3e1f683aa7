package waiter_test

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/waiter"
)

// Which rate-limit headers pause the Reserver, for how long, and which are reported
// as unusable; on a clock stopped at t0 with a reserve of 2 requests.
func TestTransportRateLimitHeaders(t *testing.T) {
	epoch := func(d time.Duration) string { return strconv.FormatInt(t0.Add(d).Unix(), 10) }
	cases := []struct {
		name   string
		status int
		header map[string]string
		pause  time.Duration // 0: Pause not called
		bad    error         // what BadRateLimit gets; nil: not called
	}{
		{"ietf spent", 200, map[string]string{"RateLimit": `"default";r=0;t=30`}, 30 * time.Second, nil},
		{"ietf within reserve", 200, map[string]string{"RateLimit": `"default";r=2;t=30`}, 30 * time.Second, nil},
		{"ietf above reserve", 200, map[string]string{"RateLimit": `"default";r=3;t=30`}, 0, nil},
		{"ietf two policies, longest spent wins", 200, map[string]string{"RateLimit": `"burst";r=0;t=1, "day";r=1;t=100, "hour";r=50;t=3000`}, 100 * time.Second, nil},
		{"ietf with policy header", 200, map[string]string{"RateLimit": `"default";r=1;t=7`, "RateLimit-Policy": `"default";q=100;w=60`}, 7 * time.Second, nil},
		{"ietf no t", 200, map[string]string{"RateLimit": `"default";r=0`}, 0, waiter.ErrRateLimitNoReset},
		{"ietf bad r", 200, map[string]string{"RateLimit": `"default";r=lots;t=3`}, 0, waiter.ErrRateLimitInvalid},
		{"ietf negative r", 200, map[string]string{"RateLimit": `"default";r=-1;t=3`}, 0, waiter.ErrRateLimitInvalid},
		{"ietf bad t", 200, map[string]string{"RateLimit": `"default";r=0;t=soon`}, 0, waiter.ErrRateLimitInvalid},
		{"ietf t beyond the cap", 200, map[string]string{"RateLimit": `"default";r=0;t=86400`}, 5 * time.Minute, waiter.ErrRateLimitTooLong},
		{"ietf t overflowing", 200, map[string]string{"RateLimit": `"default";r=0;t=99999999999999999999999`}, 5 * time.Minute, waiter.ErrRateLimitTooLong},
		{"ietf t zero: reset now", 200, map[string]string{"RateLimit": `"default";r=0;t=0`}, 0, nil},
		{"draft-07 dictionary", 200, map[string]string{"RateLimit": `limit=100, remaining=0, reset=12`}, 12 * time.Second, nil},
		{"draft-07 no remaining", 200, map[string]string{"RateLimit": `limit=100, reset=12`}, 0, waiter.ErrRateLimitInvalid},
		{"draft-06 headers", 200, map[string]string{"RateLimit-Limit": "100", "RateLimit-Remaining": "1", "RateLimit-Reset": "9"}, 9 * time.Second, nil},
		{"draft-06 plenty left", 200, map[string]string{"RateLimit-Remaining": "80", "RateLimit-Reset": "9"}, 0, nil},
		{"draft-06 no reset", 200, map[string]string{"RateLimit-Remaining": "0"}, 0, waiter.ErrRateLimitNoReset},
		{"x- epoch reset (GitHub)", 200, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": epoch(42 * time.Second)}, 42 * time.Second, nil},
		{"x- epoch from Date", 200, map[string]string{"X-RateLimit-Remaining": "0", // the server's clock is an hour ahead
			"X-RateLimit-Reset": epoch(time.Hour + 20*time.Second), "Date": t0.Add(time.Hour).Format(http.TimeFormat)}, 20 * time.Second, nil},
		{"x- epoch in the past", 200, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": epoch(-time.Minute)}, 0, waiter.ErrRateLimitNoReset},
		{"x- epoch far away", 200, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "99999999999999"}, 5 * time.Minute, waiter.ErrRateLimitTooLong},
		{"x- seconds reset", 200, map[string]string{"X-RateLimit-Remaining": "2", "X-RateLimit-Reset": "15"}, 15 * time.Second, nil},
		{"x- reset-after wins", 200, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": epoch(time.Minute), "X-RateLimit-Reset-After": "1.25"}, 1250 * time.Millisecond, nil},
		{"x- reset-after bad", 200, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset-After": "-3"}, 0, waiter.ErrRateLimitInvalid},
		{"x- no reset", 200, map[string]string{"X-RateLimit-Remaining": "0"}, 0, waiter.ErrRateLimitNoReset},
		{"x- bad remaining", 200, map[string]string{"X-RateLimit-Remaining": "none", "X-RateLimit-Reset": "5"}, 0, waiter.ErrRateLimitInvalid},
		{"x- huge remaining", 200, map[string]string{"X-RateLimit-Remaining": "99999999999999999999999", "X-RateLimit-Reset": "5"}, 0, nil},
		{"x-rate-limit spelling", 200, map[string]string{"X-Rate-Limit-Remaining": "0", "X-Rate-Limit-Reset": "4"}, 4 * time.Second, nil},
		{"no headers", 200, nil, 0, nil},
		{"429 with both: the longer wins", 429, map[string]string{"Retry-After": "3", "RateLimit": `"default";r=0;t=8`}, 8 * time.Second, nil},
		{"429 Retry-After longer", 429, map[string]string{"Retry-After": "20", "RateLimit": `"default";r=0;t=8`}, 20 * time.Second, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &fakeGate{}
			var bad []error
			tr := waiter.NewTransport(r, answer(c.status, c.header),
				waiter.WithTransportClock(stoppedClock(t0)), waiter.WithRateLimitHeaders(2),
				waiter.WithTransportHooks(waiter.TransportHooks{
					BadRateLimit: func(_ *http.Request, _ int, err error) { bad = append(bad, err) },
				}))
			resp, err := tr.RoundTrip(newRequest(t, context.Background(), nil))
			if err != nil || resp.StatusCode != c.status {
				t.Fatalf("RoundTrip: %v, %v; want the %d as answered", resp, err, c.status)
			}
			var want []time.Duration
			if c.pause > 0 {
				want = []time.Duration{c.pause}
			}
			if got := r.pauses(); !reflect.DeepEqual(got, want) {
				t.Errorf("paused %v, want %v", got, want)
			}
			if got := r.holds(); !reflect.DeepEqual(got, want) {
				t.Errorf("held %v, want %v (each pause holds this process first)", got, want)
			}
			switch {
			case c.bad == nil && len(bad) > 0:
				t.Errorf("BadRateLimit called with %v, want no call", bad)
			case c.bad != nil && (len(bad) != 1 || !errors.Is(bad[0], c.bad)):
				t.Errorf("BadRateLimit called with %v, want once with %v", bad, c.bad)
			}
		})
	}
	t.Run("off by default", func(t *testing.T) {
		r := &fakeGate{}
		tr := waiter.NewTransport(r, answer(200, map[string]string{"RateLimit": `"default";r=0;t=30`}))
		if _, err := tr.RoundTrip(newRequest(t, context.Background(), nil)); err != nil {
			t.Fatal(err)
		}
		if got := r.pauses(); len(got) != 0 {
			t.Errorf("paused %v without WithRateLimitHeaders, want none", got)
		}
	})
	t.Run("negative reserve", func(t *testing.T) {
		tr := waiter.NewTransport(&fakeGate{}, answer(200, nil), waiter.WithRateLimitHeaders(-1))
		if _, err := tr.RoundTrip(newRequest(t, context.Background(), nil)); !errors.Is(err, waiter.ErrInvalidOption) {
			t.Errorf("RoundTrip with a negative reserve: %v, want ErrInvalidOption", err)
		}
	})
}
