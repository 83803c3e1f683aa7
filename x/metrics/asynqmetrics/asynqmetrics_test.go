package asynqmetrics

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/asynqmw"
	"github.com/jobthrottle/jobthrottle/x/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The hooks count hand-backs and inline sleeps by task type; the collector registers
// beside metrics.Collector without a clash, and its names and help pass Prometheus's
// linter.
func TestHooks(t *testing.T) {
	am := New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.New(), am)
	h := am.Hooks()
	task := asynq.NewTask("email:send", nil)
	h.Throttled(context.Background(), task, &asynqmw.ThrottledError{RetryIn: time.Second})
	h.Waited(context.Background(), task, 300*time.Millisecond)
	want := `
# HELP jobthrottle_asynq_handed_back_total Tasks the asynq middleware handed back to asynq to run at their slot.
# TYPE jobthrottle_asynq_handed_back_total counter
jobthrottle_asynq_handed_back_total{task_type="email:send"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "jobthrottle_asynq_handed_back_total"); err != nil {
		t.Fatal(err)
	}
	if got, want := testutil.CollectAndCount(am, "jobthrottle_asynq_inline_sleep_seconds"), 1; got != want {
		t.Errorf("inline sleep series = %v, want %v", got, want)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}
