package rivermw_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/x/river/internal/pgtest"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Stop()
	redistest.StopAll()
	os.Exit(code)
}

// The end-to-end tests run real River clients on a real PostgreSQL (a database of
// their own, see pgtest) against every Redis backend for the limiter (miniredis on the
// real clock, a real redis-server, a Redis Cluster). River's own timing sets their
// length: a snoozed job comes back at the first fetch after it is due, up to a
// FetchPollInterval (a second by default) later; so each takes a few seconds, kept
// short by small numbers of jobs.

// throttledArgs and freeArgs are the tests' two job kinds: N numbers the job.
type throttledArgs struct {
	N int `json:"n"`
}

func (throttledArgs) Kind() string { return "throttled" }

type freeArgs struct {
	N int `json:"n"`
}

func (freeArgs) Kind() string { return "free" }

// fleet is River clients, each with a pool of its own (as processes would have), on
// one database, sharing limiters on one Redis backend.
type fleet struct {
	t       *testing.T
	b       *redistest.Backend
	url     string
	pool    *pgxpool.Pool         // for the test's own queries and inserts
	client  *river.Client[pgx.Tx] // insert-only
	clients []*river.Client[pgx.Tx]
	pools   []*pgxpool.Pool // the clients'
	log     *riverLog
}

func newFleet(t *testing.T, b *redistest.Backend) *fleet {
	t.Helper()
	pool, url := pgtest.DB(t)
	f := &fleet{t: t, b: b, url: url, pool: pool, log: &riverLog{t: t}}
	c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: f.log.logger()})
	if err != nil {
		t.Fatal(err)
	}
	f.client = c
	t.Cleanup(f.stop)
	return f
}

// limiter returns a limiter under the backend's test prefix.
func (f *fleet) limiter(key string, l throttle.Limit) *throttle.Limiter {
	f.t.Helper()
	lim, err := throttle.New(f.b.Client, key, l, throttle.WithKeyPrefix(f.b.Prefix))
	if err != nil {
		f.t.Fatal(err)
	}
	return lim
}

// semaphore returns a semaphore under the backend's test prefix.
func (f *fleet) semaphore(key string, n int) *throttle.Semaphore {
	f.t.Helper()
	sem, err := throttle.NewSemaphore(f.b.Client, key, n, throttle.WithKeyPrefix(f.b.Prefix))
	if err != nil {
		f.t.Fatal(err)
	}
	return sem
}

// start starts a River client of cfg on a pool of its own; cfg gets the fleet's logger
// and TestOnly (no staggered start of River's services) unless it has them.
func (f *fleet) start(cfg *river.Config) *river.Client[pgx.Tx] {
	f.t.Helper()
	pool, err := pgxpool.New(context.Background(), f.url)
	if err != nil {
		f.t.Fatal(err)
	}
	if cfg.Logger == nil {
		cfg.Logger = f.log.logger()
	}
	cfg.TestOnly = true
	c, err := river.NewClient(riverpgxv5.New(pool), cfg)
	if err != nil {
		pool.Close()
		f.t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		pool.Close()
		f.t.Fatal(err)
	}
	f.clients = append(f.clients, c)
	f.pools = append(f.pools, pool)
	return c
}

// stop stops the clients, cancelling jobs still running after a few seconds.
func (f *fleet) stop() {
	var wg sync.WaitGroup
	for _, c := range f.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := c.Stop(ctx); err != nil {
				_ = c.StopAndCancel(context.Background())
			}
		}()
	}
	wg.Wait()
	for _, p := range f.pools {
		p.Close()
	}
	f.clients, f.pools = nil, nil
}

// jobs returns every job of the database, by ID.
func (f *fleet) jobs() map[int64]*rivertype.JobRow {
	f.t.Helper()
	res := map[int64]*rivertype.JobRow{}
	params := river.NewJobListParams().First(10000)
	list, err := f.client.JobList(context.Background(), params)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, j := range list.Jobs {
		res[j.ID] = j
	}
	return res
}

// waitDone waits until every job is finalized (completed, cancelled or discarded)
// and there are want of them, and returns them; it fails the test after limit.
func (f *fleet) waitDone(want int, limit time.Duration) map[int64]*rivertype.JobRow {
	f.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		jobs := f.jobs()
		done := 0
		for _, j := range jobs {
			if j.FinalizedAt != nil {
				done++
			}
		}
		if done == want && len(jobs) == want {
			return jobs
		}
		if time.Now().After(deadline) {
			states := map[rivertype.JobState]int{}
			var open []string
			for _, j := range jobs {
				states[j.State]++
				if j.FinalizedAt == nil {
					open = append(open, fmt.Sprintf("job %d %s, scheduled in %v, attempt %d, metadata %s", j.ID, j.State,
						time.Until(j.ScheduledAt).Round(time.Millisecond), j.Attempt, j.Metadata))
				}
			}
			f.t.Fatalf("after %v: %d jobs, %d finalized, want %d; states %v; not finalized: %s", limit, len(jobs), done, want, states, strings.Join(open, "; "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// snoozes returns the snoozes River counted for the job (its metadata's "snoozes").
func snoozes(j *rivertype.JobRow) int {
	var m struct {
		Snoozes int `json:"snoozes"`
	}
	_ = json.Unmarshal(j.Metadata, &m)
	return m.Snoozes
}

// checkRanOnce checks that every job completed on its first attempt with no error
// recorded: none failed, discarded, cancelled or retried, no attempt spent by a snooze.
func checkRanOnce(t *testing.T, jobs map[int64]*rivertype.JobRow) {
	t.Helper()
	for _, j := range jobs {
		if j.State != rivertype.JobStateCompleted || j.Attempt != 1 || len(j.Errors) != 0 {
			t.Errorf("job %d (%s): state %s, attempt %d, errors %v; want completed on attempt 1, no error",
				j.ID, j.Kind, j.State, j.Attempt, j.Errors)
		}
	}
}

// runLog counts each job's runs of its worker, and their start times.
type runLog struct {
	mu     sync.Mutex
	runs   map[int64]int
	starts map[int64]time.Time
}

func newRunLog() *runLog {
	return &runLog{runs: map[int64]int{}, starts: map[int64]time.Time{}}
}

func (r *runLog) add(id int64, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs[id]++
	r.starts[id] = at
}

// count returns how many times the job ran.
func (r *runLog) count(id int64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[id]
}

// checkOnce checks that each of the jobs ran exactly once.
func (r *runLog) checkOnce(t *testing.T, jobs map[int64]*rivertype.JobRow) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range jobs {
		if n := r.runs[id]; n != 1 {
			t.Errorf("job %d ran %d times, want 1", id, n)
		}
	}
	if len(r.runs) != len(jobs) {
		t.Errorf("%d jobs ran, want %d", len(r.runs), len(jobs))
	}
}

// riverLog sends River's log to the test log, keeping what it logs at warn level and
// above.
type riverLog struct {
	t     *testing.T
	mu    sync.Mutex
	warns []string
}

func (l *riverLog) logger() *slog.Logger { return slog.New(l) }

func (l *riverLog) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l *riverLog) Handle(_ context.Context, r slog.Record) error {
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool { msg += fmt.Sprintf(" %s=%v", a.Key, a.Value); return true })
	l.mu.Lock()
	l.warns = append(l.warns, r.Level.String()+" "+msg)
	l.mu.Unlock()
	l.t.Log("river " + r.Level.String() + ": " + msg)
	return nil
}
func (l *riverLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *riverLog) WithGroup(string) slog.Handler      { return l }

// logged returns what River logged at warn level and above.
func (l *riverLog) logged() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.warns)
}
