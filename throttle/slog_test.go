package throttle

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// SlogHooks log each decision with its key and figures, at the levels documented.
func TestSlogHooks(t *testing.T) {
	b := redistest.NewMiniRealTime(t)
	ctx := context.Background()
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l, err := New(b.Client, "mail", PerMinute(1), WithKeyPrefix(b.Prefix), WithHooks(SlogHooks(logger)))
	if err != nil {
		t.Fatal(err)
	}
	l.Allow(ctx)
	l.Allow(ctx)
	if err := l.Pause(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	b.SetError("LOADING Redis is loading the dataset in memory")
	l.Allow(ctx)
	b.SetError("")
	out := buf.String()
	for _, want := range []string{
		`level=DEBUG msg="jobthrottle: granted" key=mail n=1 wait=0s`,
		`level=DEBUG msg="jobthrottle: denied" key=mail n=1 retry_after=`,
		`level=INFO msg="jobthrottle: paused" key=mail d=1s`,
		`level=WARN msg="jobthrottle: redis call failed" key=mail err="jobthrottle: redis unavailable: key \"mail\": LOADING Redis is loading`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	h := SlogHooks(logger)
	h.Degraded("mail", FailOpen, errors.New("down"))
	h.StateLost("mail")
	h.Waited("mail", 2, 30*time.Millisecond)
	h.Cancelled("mail", 2)
	for _, want := range []string{
		`level=WARN msg="jobthrottle: decided without redis" key=mail policy=FailOpen err=down`,
		`level=ERROR msg="jobthrottle: state lost`,
		`level=DEBUG msg="jobthrottle: waited" key=mail n=2 waited=30ms`,
		`level=DEBUG msg="jobthrottle: booking given back" key=mail n=2`,
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, buf.String())
		}
	}
}

func TestSlogSemaphoreHooks(t *testing.T) {
	b := redistest.NewMiniRealTime(t)
	ctx := context.Background()
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := NewSemaphore(b.Client, "reports", 1, WithKeyPrefix(b.Prefix), WithSemaphoreHooks(SlogSemaphoreHooks(logger)))
	if err != nil {
		t.Fatal(err)
	}
	l, _, err := s.TryAcquire(ctx)
	if err != nil || l == nil {
		t.Fatal(l, err)
	}
	s.TryAcquire(ctx)
	l.Release(ctx)
	for _, want := range []string{
		`level=DEBUG msg="jobthrottle: lease acquired" key=reports waited=0s`,
		`level=DEBUG msg="jobthrottle: lease denied" key=reports retry_after=`,
		`level=DEBUG msg="jobthrottle: lease released" key=reports held=`,
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, buf.String())
		}
	}
}
