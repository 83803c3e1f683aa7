package rivermw_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/x/river/rivermw"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// Config adds MaxSleepingWorkers (by default the largest MaxWorkers) to each queue's
// workers, puts its plugin first among the client's, leaves the rest (and the caller's
// config) as it was, and refuses a second client.
func TestConfig(t *testing.T) {
	jt := rivermw.New()
	own := &river.PluginDefaults{}
	cfg := &river.Config{
		Queues: map[string]river.QueueConfig{
			river.QueueDefault: {MaxWorkers: 10},
			"slow":             {MaxWorkers: 2, FetchPollInterval: 3 * time.Second},
		},
		Plugins:           []rivertype.Plugin{own},
		FetchPollInterval: 2 * time.Second,
	}
	got := jt.Config(cfg)
	if w := got.Queues[river.QueueDefault].MaxWorkers; w != 20 {
		t.Errorf("default queue: MaxWorkers %d, want 20 (10 + 10 sleeping)", w)
	}
	if q := got.Queues["slow"]; q.MaxWorkers != 12 || q.FetchPollInterval != 3*time.Second {
		t.Errorf("slow queue: %+v, want MaxWorkers 12, FetchPollInterval 3s", q)
	}
	if cfg.Queues[river.QueueDefault].MaxWorkers != 10 || len(cfg.Plugins) != 1 {
		t.Errorf("the caller's config changed: %+v", cfg)
	}
	if len(got.Plugins) != 2 || got.Plugins[1] != own {
		t.Errorf("plugins %v: want the Setup's, then the client's own", got.Plugins)
	}
	if _, ok := got.Plugins[0].(rivertype.HookWorkBegin); !ok {
		t.Errorf("the Setup's plugin %T is not a WorkBegin hook", got.Plugins[0])
	}
	if got.FetchPollInterval != 2*time.Second {
		t.Errorf("FetchPollInterval %v, want the caller's 2s", got.FetchPollInterval)
	}
	st := jt.Stats()
	if st.SleepBound != 10 {
		t.Errorf("SleepBound %d, want 10", st.SleepBound)
	}
	// the longest poll, 3s, and its tenth of jitter, and 20ms
	if want := 3300*time.Millisecond + 20*time.Millisecond; st.ComeBackEarly != want {
		t.Errorf("ComeBackEarly %v, want %v", st.ComeBackEarly, want)
	}
	mustPanic(t, "Config called twice", func() { jt.Config(cfg) })

	jt = rivermw.New(rivermw.MaxSleepingWorkers(3))
	if w := jt.Config(cfg).Queues["slow"].MaxWorkers; w != 5 {
		t.Errorf("MaxSleepingWorkers(3): slow queue's MaxWorkers %d, want 5", w)
	}
}

// Bad arguments panic when the client is built, naming the call.
func TestBadArguments(t *testing.T) {
	jt := rivermw.New()
	mustPanic(t, "rivermw: Throttle(nil)", func() { jt.Throttle(nil) })
	mustPanic(t, "rivermw: ThrottleFunc(nil)", func() { jt.ThrottleFunc(nil) })
	mustPanic(t, "rivermw: Concurrency(nil)", func() { jt.Concurrency(nil) })
	mustPanic(t, "rivermw: Config(nil)", func() { jt.Config(nil) })
	mustPanic(t, "MaxSleepingWorkers(0): below 1", func() { rivermw.New(rivermw.MaxSleepingWorkers(0)) })
}

func mustPanic(t *testing.T, want string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if r == nil {
			t.Errorf("no panic, want one saying %q", want)
			return
		}
		if s := errString(r); !strings.Contains(s, want) {
			t.Errorf("panic %q, want one saying %q", s, want)
		}
	}()
	f()
}

func errString(r any) string {
	if err, ok := r.(error); ok {
		return err.Error()
	}
	s, _ := r.(string)
	return s
}

// An error of the middleware names the job; a throttled job's error is a snooze that
// River understands and names the job and the limit.
func TestErrorsNameTheJob(t *testing.T) {
	b := redistest.NewMiniRealTime(t)
	jt := rivermw.New()
	job := &rivertype.JobRow{ID: 42, Kind: "vendor_call", Queue: river.QueueDefault, CreatedAt: time.Now()}
	ran := false
	run := func(context.Context) error { ran = true; return nil }

	mw := jt.ThrottleFunc(func(context.Context, *rivertype.JobRow) (*throttle.Limiter, error) {
		return nil, errors.New("no tenant")
	})
	err := mw.Work(context.Background(), job, run)
	if err == nil || err.Error() != "rivermw: job 42 (vendor_call): choosing its limiter: no tenant" || ran {
		t.Errorf("pick failed: %v (ran %v)", err, ran)
	}

	lim, err := throttle.New(b.Client, "vendor-api", throttle.Every(time.Hour), throttle.WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	mw = jt.Throttle(lim, "vendor_call")
	if err := mw.Work(context.Background(), job, run); err != nil || !ran {
		t.Fatalf("first job: %v (ran %v), want it run on the first permit", err, ran)
	}
	ran = false
	job2 := &rivertype.JobRow{ID: 43, Kind: "vendor_call", Queue: river.QueueDefault, CreatedAt: time.Now()}
	err = mw.Work(context.Background(), job2, run)
	var te *rivermw.ThrottledError
	var snooze *rivertype.JobSnoozeError
	if !errors.As(err, &te) || !rivermw.IsThrottled(err) || !errors.As(err, &snooze) || ran {
		t.Fatalf("second job: %v (ran %v), want a *ThrottledError wrapping a snooze", err, ran)
	}
	if te.JobID != 43 || te.Kind != "vendor_call" || !te.Booked || te.Key != "vendor-api" || te.Limit != "1 per 1h0m0s" ||
		te.RetryIn < 59*time.Minute || snooze.Duration != te.Snooze || te.Snooze >= te.RetryIn || te.Snooze < te.RetryIn-2*time.Second {
		t.Errorf("second job: %+v, snooze %v; want job 43 booked an hour ahead, snoozed to about a second before", te, snooze.Duration)
	}
	if want := `rivermw: job 43 (vendor_call): throttled by "vendor-api" (1 per 1h0m0s): slot in `; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("message %q, want it to begin %q", err.Error(), want)
	}
	// a job of another kind runs at once, the limit untouched
	other := &rivertype.JobRow{ID: 44, Kind: "report", Queue: river.QueueDefault, CreatedAt: time.Now()}
	if err := mw.Work(context.Background(), other, run); err != nil || !ran {
		t.Errorf("job of another kind: %v (ran %v), want it run at once", err, ran)
	}
	if st := jt.Stats(); st.Snoozed != 1 {
		t.Errorf("Stats.Snoozed %d, want 1", st.Snoozed)
	}
}
