package main

import (
	"bytes"
	"context"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// small is the example scaled down to a few seconds: two periods of 2s. The margin,
// half the period, is far wider than the default's: it lets a loaded CI host (and
// -race) deliver a request up to a second after its grant without a 429.
func small(vendor string, stream bool) config {
	limits := map[string]int{"requests": 30, "tokens": 20000}
	if vendor == "anthropic" {
		limits = map[string]int{"requests": 30, "input-tokens": 4000, "output-tokens": 15000}
	}
	return config{vendor: vendor, limits: limits, period: 2 * time.Second, margin: time.Second,
		processes: 2, goroutines: 4, duration: 4 * time.Second, maxTokens: 1000, stream: stream,
		tokenTime: 20 * time.Microsecond, settle: true}
}

// The example itself, on miniredis and on a real redis-server, each vendor, streamed
// and not: it passes its own checks (no request refused, none failed).
func TestExample(t *testing.T) {
	for _, c := range []struct {
		kind   redistest.Kind
		vendor string
		stream bool
	}{
		{redistest.Mini, "openai", false},
		{redistest.Standalone, "anthropic", true},
	} {
		t.Run(string(c.kind)+"/"+c.vendor, func(t *testing.T) {
			cfg := small(c.vendor, c.stream)
			if c.kind == redistest.Standalone {
				addr, err := redistest.StandaloneAddr()
				if err != nil {
					redistest.NewStandalone(t) // skips, or fails under JOBTHROTTLE_REQUIRE_REAL
				}
				cfg.redisAddr = addr
			}
			var out bytes.Buffer
			err := run(context.Background(), cfg, &out)
			t.Log("\n" + out.String())
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			// (A request still running when the run ends is cut: its estimate stands,
			// unsettled, as the summary counts.)
			for _, want := range []string{"0 × 429 (refused), 0 failed", "PASS: no request refused"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("summary lacks %q", want)
				}
			}
		})
	}
}

func TestExampleRejectsBadNumbers(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*config)
	}{
		{"unknown vendor", func(c *config) { c.vendor = "other" }},
		{"no processes", func(c *config) { c.processes = 0 }},
		{"no goroutines", func(c *config) { c.goroutines = 0 }},
		{"no max tokens", func(c *config) { c.maxTokens = 0 }},
		{"zero period", func(c *config) { c.period = 0 }},
		{"negative margin", func(c *config) { c.margin = -time.Millisecond }},
		{"zero limit", func(c *config) { c.limits["tokens"] = 0 }},
	} {
		cfg := small("openai", false)
		tc.edit(&cfg)
		var out bytes.Buffer
		if err := run(context.Background(), cfg, &out); err == nil || out.Len() != 0 {
			t.Errorf("%s: err %v, output %q; want an error and no output", tc.name, err, out.String())
		}
	}
}

// The estimate reads the request's body from GetBody; the actual reads the last usage
// in the body, zeros for a refusal, nil for a 200 without one.
func TestCosts(t *testing.T) {
	req, err := http.NewRequest(http.MethodPost, "http://vendor/", strings.NewReader(`{"input":"`+strings.Repeat("a", 400)+`","max_tokens":1000}`))
	if err != nil {
		t.Fatal(err)
	}
	for vendor, want := range map[string]map[string]int{
		"openai": {"tokens": 1100}, "anthropic": {"input-tokens": 100, "output-tokens": 1000},
	} {
		if got := estimateCost(vendor, req); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: estimate %v, want %v", vendor, got, want)
		}
	}
	stream := "data: {\"delta\":\"x\"}\n\ndata: {\"usage\":{\"input_tokens\":5,\"output_tokens\":7}}\n\ndata: [DONE]\n\n"
	for _, c := range []struct {
		vendor string
		status int
		body   string
		want   map[string]int
	}{
		{"openai", 200, `{"content":"x","usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`, map[string]int{"tokens": 3}},
		{"anthropic", 200, stream, map[string]int{"input-tokens": 5, "output-tokens": 7}},
		{"openai", 429, `{"error":{"type":"rate_limit_error"}}`, map[string]int{"tokens": 0}},
		{"anthropic", 429, "", map[string]int{"input-tokens": 0, "output-tokens": 0}},
		{"openai", 200, "data: {\"delta\":\"x\"}\n\n", nil},
	} {
		got := actualCost(c.vendor, &http.Response{StatusCode: c.status}, []byte(c.body))
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s %d %q: actual %v, want %v", c.vendor, c.status, c.body, got, c.want)
		}
	}
}
