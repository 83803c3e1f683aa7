// Command example runs two River clients (as two processes would) that share one rate
// limit through Redis: a backlog of "vendor_call" jobs throttled to -rate a second,
// and behind it, in the same queue, "send_receipt" jobs that must not wait for it. It
// prints a line a second and a summary, and exits 0 only if the limit held and every
// job ran once, on its first attempt, none failed or discarded.
//
//	go run ./example                                   # embedded: SQLite and miniredis
//	DATABASE_URL=postgres://... REDIS_ADDR=127.0.0.1:6379 go run ./example
//	go run ./example -jobs 100 -rate 10                # see -help for the numbers
//
// With DATABASE_URL it uses that PostgreSQL (River's tables are migrated into it).
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/x/river/rivermw"
	"github.com/redis/go-redis/v9"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
	_ "modernc.org/sqlite"
)

// config holds the numbers; main sets them from flags and the environment.
type config struct {
	databaseURL string // a PostgreSQL; empty: SQLite in a temporary directory
	redisAddr   string // a real Redis; empty: embedded miniredis
	jobs        int    // throttled jobs
	free        int    // unthrottled jobs, inserted after the throttled ones
	rate        int    // the limit: jobs a second, shared by the clients
	clients     int
	workers     int // each client's MaxWorkers
	timeout     time.Duration
}

func main() {
	cfg := config{databaseURL: os.Getenv("DATABASE_URL"), redisAddr: os.Getenv("REDIS_ADDR")}
	flag.IntVar(&cfg.jobs, "jobs", 50, "throttled vendor_call jobs")
	flag.IntVar(&cfg.free, "free", 100, "unthrottled send_receipt jobs, inserted after the throttled ones")
	flag.IntVar(&cfg.rate, "rate", 5, "the shared limit: vendor_call jobs a second")
	flag.IntVar(&cfg.clients, "clients", 2, "River clients (as separate processes would run)")
	flag.IntVar(&cfg.workers, "workers", 10, "MaxWorkers of each client")
	flag.DurationVar(&cfg.timeout, "timeout", 2*time.Minute, "give up after this long")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

// VendorCallArgs is a job that calls the vendor API: throttled.
type VendorCallArgs struct {
	N int `json:"n"`
}

func (VendorCallArgs) Kind() string { return "vendor_call" }

// SendReceiptArgs is a job of another kind: not throttled.
type SendReceiptArgs struct {
	N int `json:"n"`
}

func (SendReceiptArgs) Kind() string { return "send_receipt" }

// tally is what the workers and the middleware saw.
type tally struct {
	mu                   sync.Mutex
	runs                 map[int64]int
	starts               [][]time.Time // per client: the starts its middleware counted
	vendorRan, freeRan   atomic.Int64
	vendorLast, freeLast time.Time
}

func run(ctx context.Context, cfg config, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	rdb, closeRedis, err := openRedis(cfg.redisAddr)
	if err != nil {
		return err
	}
	defer closeRedis()
	// The limiter the clients share: one key in Redis.
	lim, err := throttle.New(rdb, fmt.Sprintf("vendor-api-%d", time.Now().UnixNano()), throttle.PerSecond(cfg.rate))
	if err != nil {
		return err
	}
	if cfg.databaseURL != "" {
		pool, err := openPostgres(ctx, cfg.databaseURL)
		if err != nil {
			return err
		}
		defer pool.Close()
		return work(ctx, cfg, out, lim, riverpgxv5.New(pool))
	}
	db, dir, err := openSQLite(ctx)
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	defer db.Close()
	return work(ctx, cfg, out, lim, riversqlite.New(db))
}

// work runs the clients on driver's database and checks what they did.
func work[TTx any](ctx context.Context, cfg config, out io.Writer, lim *throttle.Limiter, driver riverdriver.Driver[TTx]) error {
	t := &tally{runs: map[int64]int{}, starts: make([][]time.Time, cfg.clients)}
	var clients []*river.Client[TTx]
	for i := range cfg.clients {
		workers := river.NewWorkers()
		river.AddWorker(workers, river.WorkFunc(func(_ context.Context, j *river.Job[VendorCallArgs]) error {
			t.mu.Lock()
			t.runs[j.ID]++
			t.vendorLast = time.Now()
			t.mu.Unlock()
			t.vendorRan.Add(1)
			return nil
		}))
		river.AddWorker(workers, river.WorkFunc(func(_ context.Context, j *river.Job[SendReceiptArgs]) error {
			time.Sleep(10 * time.Millisecond)
			t.mu.Lock()
			t.runs[j.ID]++
			t.freeLast = time.Now()
			t.mu.Unlock()
			t.freeRan.Add(1)
			return nil
		}))
		started := func(_ context.Context, _ *rivertype.JobRow, at time.Time) {
			t.mu.Lock()
			t.starts[i] = append(t.starts[i], at)
			t.mu.Unlock()
		}

		// This is what throttling one job kind takes: a Setup, its Config around the
		// client's config, and its middleware for the kind.
		jt := rivermw.New(rivermw.WithHooks(rivermw.Hooks{Started: started}))
		client, err := river.NewClient(driver, jt.Config(&river.Config{
			Queues:     map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: cfg.workers}},
			Workers:    workers,
			Middleware: []rivertype.Middleware{jt.Throttle(lim, VendorCallArgs{}.Kind())},
			Logger:     quietLogger(),
		}))
		if err != nil {
			return err
		}
		if err := client.Start(ctx); err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = client.Stop(sctx)
		}()
		clients = append(clients, client)
	}

	t0 := time.Now()
	for i := range cfg.jobs {
		if _, err := clients[0].Insert(ctx, VendorCallArgs{N: i}, nil); err != nil {
			return err
		}
	}
	t1 := time.Now()
	for i := range cfg.free {
		if _, err := clients[i%len(clients)].Insert(ctx, SendReceiptArgs{N: i}, nil); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "%d vendor_call jobs (limit %d/s, shared by %d clients of %d workers), then %d send_receipt jobs\n",
		cfg.jobs, cfg.rate, cfg.clients, cfg.workers, cfg.free)

	// wait until River has finalized every job (it records a result just after the
	// worker returns)
	total := cfg.jobs + cfg.free
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		done, err := clients[0].JobList(ctx, river.NewJobListParams().First(total+1).States(
			rivertype.JobStateCompleted, rivertype.JobStateCancelled, rivertype.JobStateDiscarded))
		if err != nil {
			return err
		}
		if len(done.Jobs) >= total {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d jobs done before the timeout: %w", len(done.Jobs), total, ctx.Err())
		case <-tick.C:
			fmt.Fprintf(out, "%4.0fs  vendor_call ran %d/%d, send_receipt %d/%d\n",
				time.Since(t0).Seconds(), t.vendorRan.Load(), cfg.jobs, t.freeRan.Load(), cfg.free)
		}
	}
	return summary(ctx, out, cfg, t, clients[0], t0, t1)
}

// summary reads every job back from the database, prints what happened, and returns an
// error if a check failed.
func summary[TTx any](ctx context.Context, out io.Writer, cfg config, t *tally, client *river.Client[TTx], t0, t1 time.Time) error {
	list, err := client.JobList(ctx, river.NewJobListParams().First(cfg.jobs+cfg.free+1))
	if err != nil {
		return err
	}
	var failed []string
	snoozes := 0
	for _, j := range list.Jobs {
		if j.State != rivertype.JobStateCompleted || j.Attempt != 1 || len(j.Errors) != 0 {
			failed = append(failed, fmt.Sprintf("job %d (%s): %s, attempt %d, errors %v", j.ID, j.Kind, j.State, j.Attempt, j.Errors))
		}
		var meta struct {
			Snoozes int `json:"snoozes"`
		}
		_ = json.Unmarshal(j.Metadata, &meta)
		snoozes += meta.Snoozes
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	twice := 0
	for _, n := range t.runs {
		if n != 1 {
			twice++
		}
	}
	most := 0
	for _, s := range t.starts {
		slices.SortFunc(s, time.Time.Compare)
		most = max(most, mostInWindow(s, time.Second))
	}
	fmt.Fprintf(out, "vendor_call: %d jobs done after %v (the limit's pace: %v), %.2f snoozes a job, most starts a client counted in any second %d (limit %d)\n",
		cfg.jobs, t.vendorLast.Sub(t0).Round(time.Millisecond), time.Duration((cfg.jobs-1)/cfg.rate)*time.Second,
		float64(snoozes)/float64(max(cfg.jobs, 1)), most, cfg.rate)
	fmt.Fprintf(out, "send_receipt: %d jobs done %v after the first was inserted\n", cfg.free, t.freeLast.Sub(t1).Round(time.Millisecond))
	fmt.Fprintf(out, "%d jobs in the database, %d not completed on their first attempt, %d ran other than once\n", len(list.Jobs), len(failed), twice)
	var errs []error
	if len(list.Jobs) != cfg.jobs+cfg.free {
		errs = append(errs, fmt.Errorf("%d jobs in the database, want %d", len(list.Jobs), cfg.jobs+cfg.free))
	}
	for _, f := range failed {
		errs = append(errs, errors.New(f))
	}
	if twice != 0 {
		errs = append(errs, fmt.Errorf("%d jobs ran other than once", twice))
	}
	if most > cfg.rate {
		errs = append(errs, fmt.Errorf("a client started %d vendor_call jobs in a second, limit %d", most, cfg.rate))
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(out, "FAIL")
		return err
	}
	fmt.Fprintln(out, "PASS: the limit held; every job ran once, on its first attempt")
	return nil
}

// mostInWindow returns the most of the sorted times in any window [s, s+d).
func mostInWindow(sorted []time.Time, d time.Duration) int {
	best, j := 0, 0
	for i := range sorted {
		for sorted[i].Sub(sorted[j]) >= d {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

// openRedis returns a client of addr, or of an embedded miniredis when addr is empty.
func openRedis(addr string) (redis.UniversalClient, func(), error) {
	if addr != "" {
		c := redis.NewClient(&redis.Options{Addr: addr})
		return c, func() { c.Close() }, nil
	}
	m, err := miniredis.Run()
	if err != nil {
		return nil, nil, err
	}
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	return c, func() { c.Close(); m.Close() }, nil
}

// openPostgres opens the PostgreSQL at url and migrates River's tables into it.
func openPostgres(ctx context.Context, url string) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	if err := migrate(ctx, riverpgxv5.New(pool)); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// openSQLite opens SQLite in a new temporary directory, which the caller removes, and
// migrates River's tables into it.
func openSQLite(ctx context.Context) (*sql.DB, string, error) {
	dir, err := os.MkdirTemp("", "jobthrottle-river-example-")
	if err != nil {
		return nil, "", err
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "river.sqlite3")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)")
	if err == nil {
		db.SetMaxOpenConns(1) // SQLite runs one operation at a time (see riversqlite)
		if err = migrate(ctx, riversqlite.New(db)); err != nil {
			db.Close()
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", err
	}
	return db, dir, nil
}

// migrate brings River's tables up to date.
func migrate[TTx any](ctx context.Context, driver riverdriver.Driver[TTx]) error {
	m, err := rivermigrate.New(driver, &rivermigrate.Config{Logger: quietLogger()})
	if err != nil {
		return err
	}
	_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	return err
}

// quietLogger logs River's warnings and errors only.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
