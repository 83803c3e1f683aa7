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

// epoch returns t0 + d in Unix seconds.
func epoch(d time.Duration) string { return strconv.FormatInt(t0.Add(d).Unix(), 10) }

// rfc3339 returns t0 + d as Anthropic writes its resets.
func rfc3339(d time.Duration) string { return t0.Add(d).Format(time.RFC3339) }

// Which rate-limit headers pause the Reserver, for how long, and which are reported
// as unusable; on a clock stopped at t0 with a reserve of 2 requests.
func TestTransportRateLimitHeaders(t *testing.T) {
	date := func(d time.Duration) string { return t0.Add(d).Format(http.TimeFormat) }
	const capped = 5 * time.Minute
	for _, c := range []headerCase{
		{name: "ietf spent", status: 200, header: map[string]string{"RateLimit": `"default";r=0;t=30`}, pause: 30 * time.Second},
		{name: "ietf within reserve", status: 200, header: map[string]string{"RateLimit": `"default";r=2;t=30`}, pause: 30 * time.Second},
		{name: "ietf above reserve", status: 200, header: map[string]string{"RateLimit": `"default";r=3;t=30`}},
		{name: "ietf two policies, longest spent wins", status: 200, header: map[string]string{"RateLimit": `"burst";r=0;t=1, "day";r=1;t=100, "hour";r=50;t=3000`}, pause: 100 * time.Second},
		{name: "ietf with policy header", status: 200, header: map[string]string{"RateLimit": `"default";r=1;t=7`, "RateLimit-Policy": `"default";q=100;w=60`}, pause: 7 * time.Second},
		{name: "ietf no t", status: 200, header: map[string]string{"RateLimit": `"default";r=0`}, bad: "Ratelimit: missing"},
		{name: "ietf bad r", status: 200, header: map[string]string{"RateLimit": `"default";r=lots;t=3`}, bad: "Ratelimit: unreadable"},
		{name: "ietf negative r", status: 200, header: map[string]string{"RateLimit": `"default";r=-1;t=3`}, bad: "Ratelimit: unreadable"},
		{name: "ietf bad t", status: 200, header: map[string]string{"RateLimit": `"default";r=0;t=soon`}, bad: "Ratelimit: unreadable"},
		{name: "ietf negative t", status: 200, header: map[string]string{"RateLimit": `"default";r=0;t=-3`}, bad: "Ratelimit: unreadable"},
		{name: "ietf t beyond the cap", status: 200, header: map[string]string{"RateLimit": `"default";r=0;t=86400`}, pause: capped, bad: "Ratelimit: longer than the cap"},
		{name: "ietf t overflowing", status: 200, header: map[string]string{"RateLimit": `"default";r=0;t=99999999999999999999999`}, pause: capped, bad: "Ratelimit: longer than the cap"},
		{name: "ietf t zero: reset now", status: 200, header: map[string]string{"RateLimit": `"default";r=0;t=0`}},
		{name: "ietf one bad item, one good", status: 200, header: map[string]string{"RateLimit": `"a";r=x;t=1, "b";r=0;t=4`}, pause: 4 * time.Second},
		{name: "ietf garbage", status: 200, header: map[string]string{"RateLimit": `;;;,,=;`}, bad: "Ratelimit: unreadable"},
		{name: "draft-07 dictionary", status: 200, header: map[string]string{"RateLimit": `limit=100, remaining=0, reset=12`}, pause: 12 * time.Second},
		{name: "draft-07 no remaining", status: 200, header: map[string]string{"RateLimit": `limit=100, reset=12`}, bad: "Ratelimit: unreadable"},
		{name: "draft-06 headers", status: 200, header: map[string]string{"RateLimit-Limit": "100", "RateLimit-Remaining": "1", "RateLimit-Reset": "9"}, pause: 9 * time.Second},
		{name: "draft-06 plenty left", status: 200, header: map[string]string{"RateLimit-Remaining": "80", "RateLimit-Reset": "9"}},
		{name: "draft-06 no reset", status: 200, header: map[string]string{"RateLimit-Remaining": "0"}, bad: "Ratelimit-Reset: missing"},
		{name: "x- epoch reset (GitHub)", status: 200, header: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": epoch(42 * time.Second)}, pause: 42 * time.Second},
		{name: "x- epoch, server clock 5s ahead: from its Date", status: 200, header: map[string]string{"X-RateLimit-Remaining": "0",
			"X-RateLimit-Reset": epoch(25 * time.Second), "Date": date(5 * time.Second)}, pause: 20 * time.Second},
		{name: "x- epoch, Date an hour ahead: from the clock", status: 200, header: map[string]string{"X-RateLimit-Remaining": "0",
			"X-RateLimit-Reset": epoch(20 * time.Second), "Date": date(time.Hour)}, pause: 20 * time.Second, bad: "Date: too far from the local clock"},
		{name: "x- epoch, Date an hour behind: 2s stays 2s", status: 200, header: map[string]string{"X-RateLimit-Remaining": "0",
			"X-RateLimit-Reset": epoch(2 * time.Second), "Date": date(-time.Hour)}, pause: 2 * time.Second, bad: "Date: too far from the local clock"},
		{name: "x- epoch in the past", status: 200, header: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": epoch(-time.Minute)}, bad: "X-Ratelimit-Reset: in the past"},
		{name: "x- epoch far away", status: 200, header: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "99999999999999"}, pause: capped, bad: "X-Ratelimit-Reset: longer than the cap"},
		{name: "x- epoch with a fraction", status: 200, header: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": epoch(3*time.Second) + ".25"}, pause: 3250 * ms},
		{name: "x- seconds reset", status: 200, header: map[string]string{"X-RateLimit-Remaining": "2", "X-RateLimit-Reset": "15"}, pause: 15 * time.Second},
		{name: "x- reset-after wins", status: 200, header: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": epoch(time.Minute), "X-RateLimit-Reset-After": "1.25"}, pause: 1250 * ms},
		{name: "x- reset-after bad", status: 200, header: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset-After": "-3"}, bad: "X-Ratelimit-Reset-After: unreadable"},
		{name: "x- reset-after NaN", status: 200, header: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset-After": "NaN"}, bad: "X-Ratelimit-Reset-After: unreadable"},
		{name: "x- no reset", status: 200, header: map[string]string{"X-RateLimit-Remaining": "0"}, bad: "X-Ratelimit-Reset: missing"},
		{name: "x- bad remaining", status: 200, header: map[string]string{"X-RateLimit-Remaining": "none", "X-RateLimit-Reset": "5"}, bad: "X-Ratelimit-Remaining: unreadable"},
		{name: "x- huge remaining", status: 200, header: map[string]string{"X-RateLimit-Remaining": "99999999999999999999999", "X-RateLimit-Reset": "5"}},
		{name: "x- huge negative remaining", status: 200, header: map[string]string{"X-RateLimit-Remaining": "-99999999999999999999999", "X-RateLimit-Reset": "5"}, bad: "X-Ratelimit-Remaining: unreadable"},
		{name: "x-rate-limit spelling (X)", status: 200, header: map[string]string{"X-Rate-Limit-Remaining": "0", "X-Rate-Limit-Reset": epoch(4 * time.Second)}, pause: 4 * time.Second},
		{name: "OpenAI spent", status: 200, header: map[string]string{"X-RateLimit-Limit-Requests": "60", "X-RateLimit-Remaining-Requests": "0", "X-RateLimit-Reset-Requests": "1s"}, pause: time.Second},
		{name: "OpenAI milliseconds", status: 200, header: map[string]string{"X-RateLimit-Remaining-Requests": "1", "X-RateLimit-Reset-Requests": "20ms"}, pause: 20 * ms},
		{name: "OpenAI minutes and seconds", status: 200, header: map[string]string{"X-RateLimit-Remaining-Requests": "0", "X-RateLimit-Reset-Requests": "1m30.5s"}, pause: 90500 * ms},
		{name: "OpenAI bare seconds", status: 200, header: map[string]string{"X-RateLimit-Remaining-Requests": "0", "X-RateLimit-Reset-Requests": "17"}, pause: 17 * time.Second},
		{name: "OpenAI 6m0s beyond the cap", status: 200, header: map[string]string{"X-RateLimit-Remaining-Requests": "0", "X-RateLimit-Reset-Requests": "6m0s"}, pause: capped, bad: "X-Ratelimit-Reset-Requests: longer than the cap"},
		{name: "OpenAI days", status: 200, header: map[string]string{"X-RateLimit-Remaining-Requests": "0", "X-RateLimit-Reset-Requests": "1d2h"}, pause: capped, bad: "X-Ratelimit-Reset-Requests: longer than the cap"},
		{name: "OpenAI overflowing", status: 200, header: map[string]string{"X-RateLimit-Remaining-Requests": "0", "X-RateLimit-Reset-Requests": "99999999999999999h"}, pause: capped, bad: "X-Ratelimit-Reset-Requests: longer than the cap"},
		{name: "OpenAI plenty left", status: 200, header: map[string]string{"X-RateLimit-Remaining-Requests": "59", "X-RateLimit-Reset-Requests": "1s"}},
		{name: "OpenAI negative reset", status: 200, header: map[string]string{"X-RateLimit-Remaining-Requests": "0", "X-RateLimit-Reset-Requests": "-1s"}, bad: "X-Ratelimit-Reset-Requests: unreadable"},
		{name: "OpenAI unit without number", status: 200, header: map[string]string{"X-RateLimit-Remaining-Requests": "0", "X-RateLimit-Reset-Requests": "ms"}, bad: "X-Ratelimit-Reset-Requests: unreadable"},
		{name: "OpenAI unknown unit", status: 200, header: map[string]string{"X-RateLimit-Remaining-Requests": "0", "X-RateLimit-Reset-Requests": "3w"}, bad: "X-Ratelimit-Reset-Requests: unreadable"},
		{name: "OpenAI no reset", status: 200, header: map[string]string{"X-RateLimit-Remaining-Requests": "0"}, bad: "X-Ratelimit-Reset-Requests: missing"},
		{name: "Anthropic spent", status: 200, header: map[string]string{"Anthropic-RateLimit-Requests-Limit": "50",
			"Anthropic-RateLimit-Requests-Remaining": "0", "Anthropic-RateLimit-Requests-Reset": rfc3339(7 * time.Second)}, pause: 7 * time.Second},
		{name: "Anthropic fraction and offset", status: 200, header: map[string]string{"Anthropic-RateLimit-Requests-Remaining": "0",
			"Anthropic-RateLimit-Requests-Reset": t0.Add(1500 * ms).In(time.FixedZone("", 3600)).Format(time.RFC3339Nano)}, pause: 1500 * ms},
		{name: "Anthropic, Date an hour behind", status: 200, header: map[string]string{"Anthropic-RateLimit-Requests-Remaining": "0",
			"Anthropic-RateLimit-Requests-Reset": rfc3339(2 * time.Second), "Date": date(-time.Hour)}, pause: 2 * time.Second, bad: "Date: too far from the local clock"},
		{name: "Anthropic in the past", status: 200, header: map[string]string{"Anthropic-RateLimit-Requests-Remaining": "0",
			"Anthropic-RateLimit-Requests-Reset": rfc3339(-time.Second)}, bad: "Anthropic-Ratelimit-Requests-Reset: in the past"},
		{name: "Anthropic not RFC 3339", status: 200, header: map[string]string{"Anthropic-RateLimit-Requests-Remaining": "0",
			"Anthropic-RateLimit-Requests-Reset": date(5 * time.Second)}, bad: "Anthropic-Ratelimit-Requests-Reset: unreadable"},
		{name: "Anthropic plenty left", status: 200, header: map[string]string{"Anthropic-RateLimit-Requests-Remaining": "40",
			"Anthropic-RateLimit-Requests-Reset": rfc3339(7 * time.Second)}},
		{name: "tokens spent: not paused on", status: 200, header: map[string]string{"X-RateLimit-Remaining-Tokens": "0", "X-RateLimit-Reset-Tokens": "6m0s",
			"Anthropic-RateLimit-Tokens-Remaining": "0", "Anthropic-RateLimit-Tokens-Reset": rfc3339(time.Minute)}},
		{name: "no headers", status: 200},
		{name: "429 with both: the longer wins", status: 429, header: map[string]string{"Retry-After": "3", "RateLimit": `"default";r=0;t=8`}, pause: 8 * time.Second},
		{name: "429 Retry-After longer", status: 429, header: map[string]string{"Retry-After": "20", "RateLimit": `"default";r=0;t=8`}, pause: 20 * time.Second},
		{name: "403 with quota left: an ordinary answer", status: 403, header: map[string]string{"X-RateLimit-Remaining": "4999", "X-RateLimit-Reset": epoch(time.Hour)}},
		{name: "403 within the reserve: pauses as a 200 would", status: 403, header: map[string]string{"X-RateLimit-Remaining": "1", "X-RateLimit-Reset": epoch(time.Minute)}, pause: time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t, waiter.WithRateLimitHeaders(2)) })
	}
	t.Run("off by default", func(t *testing.T) {
		r := &fakePauser{}
		tr := waiter.NewTransport(r, answer(200, map[string]string{"RateLimit": `"default";r=0;t=30`}))
		if _, err := tr.RoundTrip(newRequest(t, context.Background(), nil)); err != nil {
			t.Fatal(err)
		}
		if got := r.pauses(); len(got) != 0 {
			t.Errorf("paused %v without WithRateLimitHeaders, want none", got)
		}
	})
	t.Run("negative reserve", func(t *testing.T) {
		tr := waiter.NewTransport(&fakePauser{}, answer(200, nil), waiter.WithRateLimitHeaders(-1))
		if _, err := tr.RoundTrip(newRequest(t, context.Background(), nil)); !errors.Is(err, waiter.ErrInvalidOption) {
			t.Errorf("RoundTrip with a negative reserve: %v, want ErrInvalidOption", err)
		}
	})
}

// Without WithRateLimitHeaders, a refusal's quota headers still say when to come back
// (GitHub's primary limit on 403 and 429, X's 429, which carry no Retry-After), read as
// if the reserve were 0; an answer that is not a refusal is left alone.
func TestTransportRefusalQuota(t *testing.T) {
	for _, c := range []headerCase{
		{name: "GitHub primary, 403", status: 403, header: map[string]string{"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "0",
			"X-RateLimit-Used": "5000", "X-RateLimit-Reset": epoch(40 * time.Second), "X-RateLimit-Resource": "core"}, pause: 40 * time.Second},
		{name: "GitHub primary, 429", status: 429, header: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": epoch(40 * time.Second)}, pause: 40 * time.Second},
		{name: "GitHub secondary, 403, both", status: 403, header: map[string]string{"Retry-After": "60", "X-RateLimit-Remaining": "0",
			"X-RateLimit-Reset": epoch(30 * time.Second)}, pause: time.Minute},
		{name: "GitHub secondary, 403, quota left", status: 403, header: map[string]string{"Retry-After": "30", "X-RateLimit-Remaining": "4000",
			"X-RateLimit-Reset": epoch(time.Hour)}, pause: 30 * time.Second},
		{name: "X, 429", status: 429, header: map[string]string{"X-Rate-Limit-Limit": "900", "X-Rate-Limit-Remaining": "0",
			"X-Rate-Limit-Reset": epoch(90 * time.Second)}, pause: 90 * time.Second},
		{name: "OpenAI, 429", status: 429, header: map[string]string{"X-RateLimit-Remaining-Requests": "0", "X-RateLimit-Reset-Requests": "350ms"}, pause: 350 * ms},
		{name: "Anthropic, 429: the later of the two", status: 429, header: map[string]string{"Retry-After": "3",
			"Anthropic-RateLimit-Requests-Remaining": "0", "Anthropic-RateLimit-Requests-Reset": rfc3339(5 * time.Second)}, pause: 5 * time.Second},
		{name: "403, spent, no reset", status: 403, header: map[string]string{"X-RateLimit-Remaining": "0"}, bad: "X-Ratelimit-Reset: missing"},
		{name: "403, spent, reset unreadable", status: 403, header: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "soon"}, bad: "X-Ratelimit-Reset: unreadable"},
		{name: "403, quota left: an ordinary answer", status: 403, header: map[string]string{"X-RateLimit-Remaining": "1", "X-RateLimit-Reset": epoch(time.Minute)}},
		{name: "403, unreadable quota: an ordinary answer", status: 403, header: map[string]string{"X-RateLimit-Remaining": "?"}},
		{name: "403, nothing: an ordinary answer", status: 403},
		{name: "200, spent: not read without the option", status: 200, header: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": epoch(time.Minute)}},
		{name: "429, quota left, no Retry-After", status: 429, header: map[string]string{"X-RateLimit-Remaining": "5", "X-RateLimit-Reset": epoch(time.Minute)}, bad: "Retry-After: missing"},
		{name: "429, spent, resets now", status: 429, header: map[string]string{"RateLimit": `"default";r=0;t=0`}},
		{name: "429, spent, resets now (draft -06)", status: 429, header: map[string]string{"RateLimit-Remaining": "0", "RateLimit-Reset": "0"}},
		{name: "429, spent, unreadable reset", status: 429, header: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "soon"}, bad: "X-Ratelimit-Reset: unreadable"},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t) })
	}
}

// With WithRateLimitHeaders, the token quotas of OpenAI and Anthropic go to the Quota
// hook, parsed; a request quota and Retry-After work as ever beside them.
func TestTransportTokenQuotas(t *testing.T) {
	cases := []struct {
		name   string
		header map[string]string
		want   []waiter.Quota
		bad    string
	}{
		{"OpenAI", map[string]string{
			"X-RateLimit-Limit-Requests": "60", "X-RateLimit-Remaining-Requests": "59", "X-RateLimit-Reset-Requests": "1s",
			"X-RateLimit-Limit-Tokens": "150000", "X-RateLimit-Remaining-Tokens": "149984", "X-RateLimit-Reset-Tokens": "6m0s",
		}, []waiter.Quota{{Name: "tokens", Remaining: 149984, Limit: 150000, Reset: 6 * time.Minute}}, ""},
		{"Anthropic", map[string]string{
			"Anthropic-RateLimit-Requests-Remaining": "49", "Anthropic-RateLimit-Requests-Reset": rfc3339(time.Second),
			"Anthropic-RateLimit-Tokens-Remaining": "7000", "Anthropic-RateLimit-Tokens-Reset": rfc3339(8 * time.Second),
			"Anthropic-RateLimit-Input-Tokens-Remaining": "5000", "Anthropic-RateLimit-Input-Tokens-Reset": rfc3339(6 * time.Second),
			"Anthropic-RateLimit-Output-Tokens-Remaining": "2000", "Anthropic-RateLimit-Output-Tokens-Reset": rfc3339(2 * time.Second),
		}, []waiter.Quota{
			{Name: "tokens", Remaining: 7000, Reset: 8 * time.Second},
			{Name: "input-tokens", Remaining: 5000, Reset: 6 * time.Second},
			{Name: "output-tokens", Remaining: 2000, Reset: 2 * time.Second},
		}, ""},
		{"reset missing or past: 0", map[string]string{
			"X-RateLimit-Remaining-Tokens":         "10",
			"Anthropic-RateLimit-Tokens-Remaining": "20", "Anthropic-RateLimit-Tokens-Reset": rfc3339(-time.Second),
		}, []waiter.Quota{{Name: "tokens", Remaining: 10}, {Name: "tokens", Remaining: 20}}, ""},
		{"unreadable: reported, left out", map[string]string{
			"X-RateLimit-Remaining-Tokens": "lots", "X-RateLimit-Reset-Tokens": "1s",
			"Anthropic-RateLimit-Input-Tokens-Remaining": "5", "Anthropic-RateLimit-Input-Tokens-Reset": "tomorrow",
		}, nil, "X-Ratelimit-Remaining-Tokens: unreadable; Anthropic-Ratelimit-Input-Tokens-Reset: unreadable"},
		{"Azure's -1", map[string]string{"X-RateLimit-Remaining-Tokens": "-1", "X-RateLimit-Reset-Tokens": "0"},
			nil, "X-Ratelimit-Remaining-Tokens: unreadable"},
		{"limit unreadable: reported, 0", map[string]string{
			"X-RateLimit-Limit-Tokens": "-5", "X-RateLimit-Remaining-Tokens": "10", "X-RateLimit-Reset-Tokens": "1s",
		}, []waiter.Quota{{Name: "tokens", Remaining: 10, Reset: time.Second}}, "X-Ratelimit-Limit-Tokens: unreadable"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &fakePauser{}
			var got []waiter.Quota
			var bad badLog
			tr := waiter.NewTransport(r, answer(200, c.header), waiter.WithRateLimitHeaders(0),
				waiter.WithTransportClock(stoppedClock(t0)),
				waiter.WithTransportHooks(waiter.TransportHooks{
					Quota:     func(_ *http.Request, q waiter.Quota) { got = append(got, q) },
					BadHeader: bad.hook,
				}))
			if _, err := tr.RoundTrip(newRequest(t, context.Background(), nil)); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("Quota got %+v, want %+v", got, c.want)
			}
			bad.check(t, c.bad, 0)
			if p := r.pauses(); len(p) != 0 {
				t.Errorf("paused %v, want none: no request quota is spent", p)
			}
		})
	}
	t.Run("not without the option", func(t *testing.T) {
		tr := waiter.NewTransport(&fakePauser{}, answer(429, cases[0].header), waiter.WithTransportHooks(waiter.TransportHooks{
			Quota: func(_ *http.Request, q waiter.Quota) {
				t.Errorf("Quota called with %+v without WithRateLimitHeaders", q)
			},
		}))
		if _, err := tr.RoundTrip(newRequest(t, context.Background(), nil)); err != nil {
			t.Fatal(err)
		}
	})
}
