package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// small is the example scaled down to a few seconds: 60 permits at 10 per second.
// The margin, half the limiter's period, is far wider than the default's: it lets a
// loaded CI host (and -race) deliver a request up to 500ms after its grant without a
// 429 from the API.
func small() config {
	return config{
		tasks: 40, final: 0.25, free: 40, freeWork: 10 * time.Millisecond,
		rate: 10, period: 500 * time.Millisecond, margin: 500 * time.Millisecond,
		servers: 2, concurrency: 10, check: 100 * time.Millisecond,
		loop: 10, httpCalls: 10, httpWorkers: 2, timeout: 30 * time.Second,
	}
}

// The example itself, on miniredis and on a real redis-server: it passes its own
// checks (every task once, none archived or failed, no 429, the limit held).
func TestExample(t *testing.T) {
	for _, k := range []redistest.Kind{redistest.Mini, redistest.Standalone} {
		t.Run(string(k), func(t *testing.T) {
			cfg := small()
			if k == redistest.Standalone {
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
			for _, want := range []string{
				"asynq 40/40 tasks (10 with MaxRetry(0)), 0 ran more than once; loop 10/10; HTTP 10/10",
				"60 requests, 0 × 429",
				"0 archived, 0 failed (Inspector), 0 retries spent",
				"unthrottled 40/40 tasks",
				"PASS:",
			} {
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
		{"no work", func(c *config) { c.tasks, c.loop, c.httpCalls = 0, 0, 0 }},
		{"negative tasks", func(c *config) { c.tasks = -1 }},
		{"negative free", func(c *config) { c.free = -1 }},
		{"final above 1", func(c *config) { c.final = 1.5 }},
		{"no servers", func(c *config) { c.servers = 0 }},
		{"zero check", func(c *config) { c.check = 0 }},
		{"negative margin", func(c *config) { c.margin = -time.Millisecond }},
	} {
		cfg := small()
		tc.edit(&cfg)
		var out bytes.Buffer
		if err := run(context.Background(), cfg, &out); err == nil || out.Len() != 0 {
			t.Errorf("%s: err %v, output %q; want an error and no output", tc.name, err, out.String())
		}
	}
}

// A call the vendor refuses with 429 is sent again with a new permit, twice at most.
func TestCallAgainOn429(t *testing.T) {
	for _, tc := range []struct {
		refuse, wantCalls, wantWaits int
		waitErr, wantErr             error
	}{
		{refuse: 0, wantCalls: 1, wantWaits: 0},
		{refuse: 1, wantCalls: 2, wantWaits: 1},
		{refuse: 2, wantCalls: 3, wantWaits: 2},
		{refuse: 3, wantCalls: 3, wantWaits: 2, wantErr: errTooMany},
		{refuse: 1, wantCalls: 1, wantWaits: 1, waitErr: context.Canceled, wantErr: context.Canceled},
	} {
		var calls atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if int(calls.Add(1)) <= tc.refuse {
				http.Error(w, "slow down", http.StatusTooManyRequests)
			}
		}))
		waits := 0
		err := callAgainOn429(context.Background(), srv.Client(), srv.URL, func(context.Context) error {
			waits++
			return tc.waitErr
		})
		srv.Close()
		if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) || int(calls.Load()) != tc.wantCalls || waits != tc.wantWaits {
			t.Errorf("refused %d times (wait error %v): err %v, %d calls, %d waits; want %v, %d calls, %d waits",
				tc.refuse, tc.waitErr, err, calls.Load(), waits, tc.wantErr, tc.wantCalls, tc.wantWaits)
		}
	}
}
