package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/x/river/internal/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Stop()
	redistest.StopAll()
	os.Exit(code)
}

// The example itself, as `go run` runs it (SQLite and miniredis), and on PostgreSQL
// with a real redis-server: it passes its own checks (every job once, on its first
// attempt, none failed or discarded, no client over the limit).
func TestExample(t *testing.T) {
	small := config{jobs: 15, free: 30, rate: 5, clients: 2, workers: 5, timeout: time.Minute}
	t.Run("sqlite+miniredis", func(t *testing.T) { check(t, small) })
	t.Run("postgres+redis", func(t *testing.T) {
		_, url := pgtest.DB(t)
		addr, err := redistest.StandaloneAddr()
		if err != nil {
			redistest.NewStandalone(t) // skips, or fails under JOBTHROTTLE_REQUIRE_REAL
		}
		cfg := small
		cfg.databaseURL, cfg.redisAddr = url, addr
		check(t, cfg)
	})
}

func check(t *testing.T, cfg config) {
	t.Helper()
	var out bytes.Buffer
	err := run(context.Background(), cfg, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	for _, want := range []string{
		"45 jobs in the database, 0 not completed on their first attempt, 0 ran other than once",
		"PASS:",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q", want)
		}
	}
}
