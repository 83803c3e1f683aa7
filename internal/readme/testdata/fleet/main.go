// Command fleet is one process of the README's fleet at a strict vendor (see
// ../../vendor_test.go, which builds it together with snippets.go, the README's code
// written into functions): the vendor itself, or a worker process that runs one of the
// README's snippets as written.
//
//	fleet -mode vendor -rate 20 -period 1s
//	fleet -mode loop|http|asynq|semaphore -redis ADDR -vendor URL -proc 1 -workers 4 -jobs 100
//
// The vendor prints "VENDOR <url>", serves until stdin ends, then prints "REPORT " and
// its report as JSON: the calls to /call (rate limited), and the most requests to
// /report (held reportHold each) it served at once. A worker prints "READY", waits
// for a line on stdin, then: loop runs loopSnippet in -workers goroutines over -jobs
// jobs; http sends -jobs requests from -workers goroutines through httpSnippet's
// client; asynq starts the server asynqSnippet sets up and runs the tasks the test
// enqueues until stdin ends; semaphore runs semaphoreSnippet -jobs times from
// -workers goroutines, its buildReport a request to /report. It prints "DONE" and
// exits 0, or says what failed on stderr and exits 1.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// Report is what the vendor saw.
type Report struct {
	Arrivals      []Arrival
	Reports       int // /report requests served
	MostReporting int // the most of them served at once
}

// reportHold is how long the vendor takes to answer a /report request.
const reportHold = 20 * time.Millisecond

// Arrival is a request to /call as the vendor saw it.
type Arrival struct {
	At     int64 // UnixNano, read under the vendor's lock: arrivals are in order
	Status int
	Src    string
}

func main() {
	mode := flag.String("mode", "", "vendor, loop, http or asynq")
	rate := flag.Int("rate", 0, "vendor: requests allowed in any -period")
	period := flag.Duration("period", 0, "vendor: the window of its limit")
	addr := flag.String("redis", "", "worker: Redis address")
	vendor := flag.String("vendor", "", "worker: the vendor's URL")
	proc := flag.Int("proc", 0, "worker: this process's number")
	workers := flag.Int("workers", 1, "worker: goroutines (loop, http)")
	jobs := flag.Int("jobs", 0, "worker: jobs (loop, http)")
	flag.Parse()
	var err error
	if *mode == "vendor" {
		err = serveVendor(*rate, *period)
	} else {
		err = work(*mode, *addr, *vendor, *proc, *workers, *jobs)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

// serveVendor answers 200 to a request that leaves at most rate accepted ones within
// the last period, counting itself, and 429 with Retry-After to any other, until stdin
// ends; it then prints its arrivals.
func serveVendor(rate int, period time.Duration) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	var (
		mu        sync.Mutex
		accepted  []time.Time // within the last period
		rep       Report
		reporting int
	)
	mux := http.NewServeMux()
	mux.HandleFunc("/report", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		reporting++
		rep.Reports++
		rep.MostReporting = max(rep.MostReporting, reporting)
		mu.Unlock()
		time.Sleep(reportHold)
		mu.Lock()
		reporting--
		mu.Unlock()
		_, _ = io.WriteString(w, "report\n")
	})
	mux.HandleFunc("/call", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		now := time.Now()
		for len(accepted) > 0 && now.Sub(accepted[0]) >= period {
			accepted = accepted[1:]
		}
		status, retry := http.StatusOK, time.Duration(0)
		if len(accepted) >= rate {
			status, retry = http.StatusTooManyRequests, accepted[0].Add(period).Sub(now)
		} else {
			accepted = append(accepted, now)
		}
		rep.Arrivals = append(rep.Arrivals, Arrival{At: now.UnixNano(), Status: status, Src: r.URL.Query().Get("src")})
		mu.Unlock()
		if status != http.StatusOK {
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(retry.Seconds()))))
			http.Error(w, "rate limit exceeded", status)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	fmt.Printf("VENDOR http://%s\n", ln.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = srv.Close()
	mu.Lock()
	defer mu.Unlock()
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	fmt.Printf("REPORT %s\n", b)
	return nil
}

// work runs one worker process of mode, calling the vendor at base for each job.
func work(mode, addr, base string, proc, workers, jobs int) error {
	url := func(path string) string { return base + path + "?src=" + strconv.Itoa(proc) }
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	in := bufio.NewReader(os.Stdin)
	fmt.Println("READY")
	if _, err := in.ReadString('\n'); err != nil {
		return fmt.Errorf("waiting for the start: %w", err)
	}
	var err error
	switch mode {
	case "loop":
		err = runLoop(ctx, rdb, url("/call"), workers, jobs)
	case "http":
		err = runHTTP(ctx, rdb, url("/call"), workers, jobs)
	case "asynq":
		err = runAsynq(ctx, rdb, url("/call"), in)
	case "semaphore":
		err = runSemaphore(ctx, rdb, url("/report"), workers, jobs)
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err == nil {
		fmt.Println("DONE")
	}
	return err
}

// feed returns a closed channel holding jobs jobs.
func feed(jobs int) chan string {
	ch := make(chan string, jobs)
	for i := range jobs {
		ch <- strconv.Itoa(i)
	}
	close(ch)
	return ch
}

// errs collects the errors of a process's goroutines.
type errs struct {
	mu    sync.Mutex
	first error
}

func (e *errs) add(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.first == nil {
		e.first = err
	}
}

// get sends a GET to url with c and reads the answer; a transport error is an error,
// any status is the vendor's to count.
func get(ctx context.Context, c *http.Client, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// runLoop runs the README's worker loop in workers goroutines, as written: each makes
// its limiter and takes jobs from the process's channel; call(job) is one request.
func runLoop(ctx context.Context, rdb *redis.Client, url string, workers, jobs int) error {
	ch := feed(jobs)
	var (
		wg sync.WaitGroup
		e  errs
	)
	call := func(string) {
		if _, err := get(ctx, http.DefaultClient, url); err != nil {
			e.add(err)
		}
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := loopSnippet(ctx, rdb, ch, call); err != nil {
				e.add(err)
			}
		}()
	}
	wg.Wait()
	return e.first
}

// runHTTP sends jobs requests from workers goroutines through the client of the
// README's HTTP snippet, around the limiter the README's loop makes.
func runHTTP(ctx context.Context, rdb *redis.Client, url string, workers, jobs int) error {
	lim, err := newLimiter(rdb)
	if err != nil {
		return err
	}
	client := httpSnippet(lim)
	ch := feed(jobs)
	var (
		wg sync.WaitGroup
		e  errs
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range ch {
				if _, err := get(ctx, client, url); err != nil {
					e.add(err)
				}
			}
		}()
	}
	wg.Wait()
	return e.first
}

// runAsynq runs the asynq server the README's snippet sets up, around the limiter the
// README's loop makes, until in ends. Its handler makes one request; a refusal is an
// error, for asynq to retry.
func runAsynq(ctx context.Context, rdb *redis.Client, url string, in io.Reader) error {
	lim, err := newLimiter(rdb)
	if err != nil {
		return err
	}
	handler := asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		status, err := get(ctx, http.DefaultClient, url)
		if err == nil && status != http.StatusOK {
			err = fmt.Errorf("vendor answered %d", status)
		}
		return err
	})
	srv, mux := asynqSnippet(ctx, rdb, lim, handler)
	if err := srv.Start(mux); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, in)
	srv.Shutdown()
	return nil
}

// runSemaphore runs the README's semaphore snippet jobs times from workers
// goroutines; its buildReport is one request to url.
func runSemaphore(ctx context.Context, rdb *redis.Client, url string, workers, jobs int) error {
	ch := feed(jobs)
	var (
		wg sync.WaitGroup
		e  errs
	)
	buildReport := func(ctx context.Context) error {
		status, err := get(ctx, http.DefaultClient, url)
		if err == nil && status != http.StatusOK {
			err = fmt.Errorf("vendor answered %d", status)
		}
		return err
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range ch {
				if err := semaphoreSnippet(ctx, rdb, buildReport); err != nil {
					e.add(err)
				}
			}
		}()
	}
	wg.Wait()
	return e.first
}
