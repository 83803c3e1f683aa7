// Command llm runs a fleet of processes calling a fake LLM API through one limiter
// shared in Redis, which counts requests and tokens: each request books its estimated
// tokens (its input and max_tokens) and settles the actual ones from the answer's
// usage, so the fleet uses its token budget without being refused. The vendor, in this
// process, enforces requests and tokens per period on the actual tokens (OpenAI's
// limits, or Anthropic's requests, input and output tokens with -vendor anthropic) and
// answers 429 beyond. It prints a line a period and a summary, and exits non-zero if
// the vendor refused a request.
//
//	go run ./examples/llm                         # embedded miniredis
//	REDIS_ADDR=127.0.0.1:6379 go run ./examples/llm
//	go run ./examples/llm -vendor anthropic -stream -duration 2m   # see -help
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
)

// config holds the numbers; main sets them from flags and REDIS_ADDR.
type config struct {
	redisAddr  string         // a real Redis; empty: embedded miniredis
	vendor     string         // "openai" or "anthropic"
	limits     map[string]int // the vendor's limits per period, by unit
	period     time.Duration  // the vendor's limit period
	margin     time.Duration  // added to the limiter's period: the way from Redis to the vendor
	processes  int
	goroutines int           // per process
	duration   time.Duration // how long the fleet calls
	maxTokens  int           // each request's max_tokens
	stream     bool          // ask for streamed answers
	tokenTime  time.Duration // the vendor's time per output token
	settle     bool          // settle the actual tokens (false: keep the estimates, for comparison)
}

func main() {
	cfg := config{redisAddr: os.Getenv("REDIS_ADDR")}
	var requests, tokens, inputTokens, outputTokens int
	flag.StringVar(&cfg.vendor, "vendor", "openai", `"openai" (requests and tokens) or "anthropic" (requests, input and output tokens)`)
	flag.IntVar(&requests, "requests", 600, "the vendor's limit of requests per -period")
	flag.IntVar(&tokens, "tokens", 100000, "-vendor openai: its limit of tokens per -period")
	flag.IntVar(&inputTokens, "input-tokens", 40000, "-vendor anthropic: its limit of input tokens per -period")
	flag.IntVar(&outputTokens, "output-tokens", 30000, "-vendor anthropic: its limit of output tokens per -period")
	flag.DurationVar(&cfg.period, "period", time.Minute, "the vendor's limit period")
	flag.DurationVar(&cfg.margin, "margin", 500*time.Millisecond, "added to the limiter's period, to cover the time from a grant to the request's arrival")
	flag.IntVar(&cfg.processes, "processes", 4, "processes in the fleet (each with a Redis client of its own)")
	flag.IntVar(&cfg.goroutines, "goroutines", 16, "goroutines calling the vendor in each process")
	flag.DurationVar(&cfg.duration, "duration", 2*time.Minute, "how long the fleet calls")
	flag.IntVar(&cfg.maxTokens, "max-tokens", 1000, "each request's max_tokens; the answer's output is 10-100 % of it")
	flag.BoolVar(&cfg.stream, "stream", false, "ask for streamed answers (server-sent events, the usage in the last)")
	flag.DurationVar(&cfg.tokenTime, "token-time", 20*time.Microsecond, "the vendor's time per output token")
	flag.BoolVar(&cfg.settle, "settle", true, "settle the actual tokens; false books the estimates only, for comparison")
	flag.Parse()
	cfg.limits = map[string]int{"requests": requests, "tokens": tokens}
	if cfg.vendor == "anthropic" {
		cfg.limits = map[string]int{"requests": requests, "input-tokens": inputTokens, "output-tokens": outputTokens}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "llm:", err)
		os.Exit(1)
	}
}

func (c config) validate() error {
	switch {
	case c.vendor != "openai" && c.vendor != "anthropic":
		return fmt.Errorf("-vendor %q: want openai or anthropic", c.vendor)
	case c.processes < 1 || c.goroutines < 1 || c.maxTokens < 1:
		return errors.New("-processes, -goroutines and -max-tokens must be >= 1")
	case c.period <= 0 || c.duration <= 0 || c.margin < 0 || c.tokenTime < 0:
		return errors.New("-period and -duration must be > 0, -margin and -token-time >= 0")
	}
	for unit, n := range c.limits {
		if n < 1 {
			return fmt.Errorf("the limit of %s must be >= 1", unit)
		}
	}
	return nil
}

// stats are the fleet's counts, kept by its hooks and calls.
type stats struct {
	answered, failed, unsettled, paused atomic.Int64

	mu     sync.Mutex
	ratios []float64 // each settled request's actual tokens ÷ its estimate
}

// run starts the vendor and the fleet, lets it call for cfg.duration, and prints the
// summary; it returns an error if the fleet could not run or the vendor refused.
func run(parent context.Context, cfg config, out io.Writer) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	addr, where, closeRedis, err := redisAddr(cfg.redisAddr)
	if err != nil {
		return err
	}
	defer closeRedis()
	api := newVendor(cfg.vendor, cfg.limits, cfg.period, cfg.tokenTime)
	defer api.Close()

	// The limiter's limits are the vendor's, by unit, over its period plus the margin.
	var limits []throttle.Limit
	for _, unit := range units(cfg.limits) {
		l := throttle.Limit{Rate: cfg.limits[unit], Period: cfg.period + cfg.margin, Unit: unit}
		if unit == "requests" {
			l.Unit = "" // a limit without a unit counts calls
		}
		limits = append(limits, l)
	}
	fmt.Fprintf(out, "jobthrottle LLM example on %s: %d processes × %d goroutines for %v, a fake %s vendor allowing %s per %v\n",
		where, cfg.processes, cfg.goroutines, cfg.duration, cfg.vendor, describe(cfg.limits), cfg.period)

	ctx, cancel := context.WithTimeout(parent, cfg.duration)
	defer cancel()
	var (
		st     stats
		wg     sync.WaitGroup
		prefix = "jobthrottle-example:" + randomID() + ":"
	)
	for range cfg.processes {
		// A process: a Redis client of its own, its limiter and its HTTP client.
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
		lim, err := throttle.New(rdb, "llm-vendor", limits[0], throttle.WithLimits(limits[1:]...), throttle.WithKeyPrefix(prefix))
		if err != nil {
			return err
		}
		client := newClient(lim, cfg, &st)
		for range cfg.goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for call(ctx, client, api.URL, cfg, &st) {
				}
			}()
		}
	}
	start := time.Now()
	progress(ctx, api, cfg, start, out)
	wg.Wait()
	if parent.Err() != nil {
		return errors.New("interrupted")
	}
	return summary(api, cfg, &st, time.Since(start), out)
}

// newClient returns the HTTP client of a process: every request waits for its
// estimated cost from lim and settles the actual cost from the answer's usage. With
// WithRateLimitHeaders the vendor's token headers pause the fleet too, should someone
// else use the same quota.
func newClient(lim *throttle.Limiter, cfg config, st *stats) *http.Client {
	actual := func(resp *http.Response, body []byte) map[string]int {
		a := actualCost(cfg.vendor, resp, body)
		if !cfg.settle {
			return map[string]int{} // the estimates stand
		}
		if a != nil && resp.StatusCode == http.StatusOK {
			st.noteRatio(a, estimateCost(cfg.vendor, resp.Request))
		}
		return a
	}
	return &http.Client{Transport: waiter.NewTransport(lim, nil,
		waiter.WithCost(func(req *http.Request) map[string]int { return estimateCost(cfg.vendor, req) }, actual),
		waiter.WithRateLimitHeaders(0),
		waiter.WithRetries(2),
		waiter.WithTransportHooks(waiter.TransportHooks{
			Unsettled: func(*http.Request, int, error) { st.unsettled.Add(1) },
			Paused:    func(*http.Request, int, time.Duration) { st.paused.Add(1) },
		}))}
}

// estimateCost is the most req can cost: its input, counted as the vendor counts
// it, and its max_tokens. It reads the body from GetBody, which http.NewRequest sets
// for a bytes.Reader.
func estimateCost(vendor string, req *http.Request) map[string]int {
	var body request
	if req.GetBody != nil {
		if rc, err := req.GetBody(); err == nil {
			_ = json.NewDecoder(rc).Decode(&body)
			rc.Close()
		}
	}
	in := countTokens(body.Input)
	if vendor == "anthropic" {
		return map[string]int{"input-tokens": in, "output-tokens": body.MaxTokens}
	}
	return map[string]int{"tokens": in + body.MaxTokens}
}

// actualCost is what an answer cost: the usage in its body (a stream's is in its last
// event), nothing for a refusal, nil when a 200 has no usage (a stream cut short).
func actualCost(vendor string, resp *http.Response, body []byte) map[string]int {
	var u usage
	if resp.StatusCode == http.StatusOK {
		i := bytes.LastIndex(body, []byte(`"usage":`))
		if i < 0 || json.NewDecoder(bytes.NewReader(body[i+len(`"usage":`):])).Decode(&u) != nil {
			return nil
		}
	}
	if vendor == "anthropic" {
		return map[string]int{"input-tokens": u.InputTokens, "output-tokens": u.OutputTokens}
	}
	return map[string]int{"tokens": u.TotalTokens}
}

// call sends one completion request, of a random input and cfg.maxTokens, and reads
// the answer to its end. It returns false when the run is over: ctx has ended, or the
// request's turn would come after its deadline.
func call(ctx context.Context, client *http.Client, url string, cfg config, st *stats) bool {
	body, _ := json.Marshal(request{Input: strings.Repeat("a", 40+mrand.IntN(361)), MaxTokens: cfg.maxTokens, Stream: cfg.stream})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	var resp *http.Response
	if err == nil {
		resp, err = client.Do(req)
	}
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			return false
		}
		st.failed.Add(1)
		fmt.Fprintln(os.Stderr, "llm: call:", err)
		return true
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode == http.StatusOK {
		st.answered.Add(1)
	}
	return true
}

// noteRatio records a settled request's actual tokens ÷ its estimate.
func (st *stats) noteRatio(actual, estimate map[string]int) {
	a, e := 0, 0
	for unit, n := range estimate {
		a, e = a+actual[unit], e+n
	}
	st.mu.Lock()
	st.ratios = append(st.ratios, float64(a)/float64(e))
	st.mu.Unlock()
}

// progress prints a line each sixth of a period until ctx ends: what the vendor
// accepted and refused so far.
func progress(ctx context.Context, api *vendor, cfg config, start time.Time, out io.Writer) {
	tick := time.NewTicker(cfg.period / 6)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			acc, refused := api.totals()
			fmt.Fprintf(out, "%6.1fs  vendor accepted %s; refused %d\n", time.Since(start).Seconds(), describe(acc), refused)
		}
	}
}

// summary prints the budget used of each limit and the refusals, and returns an
// error if the vendor refused any request or a call failed.
func summary(api *vendor, cfg config, st *stats, elapsed time.Duration, out io.Writer) error {
	acc, refused := api.totals()
	periods := int((cfg.duration + cfg.period - 1) / cfg.period) // a sliding window allows its limit once per period begun
	fmt.Fprintf(out, "after %v: %d requests answered, %d × 429 (refused), %d failed\n", elapsed.Round(time.Millisecond), st.answered.Load(), refused, st.failed.Load())
	binding, most := "", -1.0
	for _, unit := range units(cfg.limits) {
		used := float64(acc[unit]) / float64(cfg.limits[unit]*periods)
		fmt.Fprintf(out, "  %-14s %9d of %9d (%d × %d): %5.1f %%\n", unit, acc[unit], cfg.limits[unit]*periods, periods, cfg.limits[unit], 100*used)
		if used > most {
			binding, most = unit, used
		}
	}
	fmt.Fprintf(out, "budget used of the binding limit (%s): %.1f %%\n", binding, 100*most)
	st.mu.Lock()
	if r := st.ratios; len(r) > 0 {
		slices.Sort(r)
		sum := 0.0
		for _, x := range r {
			sum += x
		}
		fmt.Fprintf(out, "actual tokens ÷ estimate: %.0f–%.0f %%, mean %.0f %%\n", 100*r[0], 100*r[len(r)-1], 100*sum/float64(len(r)))
	}
	st.mu.Unlock()
	fmt.Fprintf(out, "estimates left unsettled: %d; fleet pauses from the vendor's headers: %d\n", st.unsettled.Load(), st.paused.Load())
	if refused > 0 || st.failed.Load() > 0 {
		fmt.Fprintf(out, "FAIL: the vendor refused %d requests, %d calls failed\n", refused, st.failed.Load())
		return fmt.Errorf("the vendor refused %d requests, %d calls failed", refused, st.failed.Load())
	}
	fmt.Fprintln(out, "PASS: no request refused")
	return nil
}

// units returns the units of limits, requests first.
func units(limits map[string]int) []string {
	var us []string
	for unit := range limits {
		us = append(us, unit)
	}
	slices.SortFunc(us, func(a, b string) int {
		return strings.Compare(strings.Replace(a, "requests", "", 1), strings.Replace(b, "requests", "", 1))
	})
	return us
}

// describe writes counts by unit: "600 requests, 100000 tokens".
func describe(counts map[string]int) string {
	var s []string
	for _, unit := range units(counts) {
		s = append(s, fmt.Sprintf("%d %s", counts[unit], unit))
	}
	return strings.Join(s, ", ")
}

// redisAddr returns the address of the Redis at addr or, when addr is empty, of an
// embedded miniredis whose TTLs follow the real clock.
func redisAddr(addr string) (string, string, func(), error) {
	if addr != "" {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
		if err := rdb.Ping(context.Background()).Err(); err != nil {
			return "", "", nil, fmt.Errorf("REDIS_ADDR=%s: %w", addr, err)
		}
		return addr, "Redis at " + addr, func() {}, nil
	}
	m, err := miniredis.Run()
	if err != nil {
		return "", "", nil, fmt.Errorf("starting miniredis: %w", err)
	}
	m.ClockTTL(true) // keys expire on the real clock, as in Redis
	return m.Addr(), "embedded miniredis (REDIS_ADDR is unset)", m.Close, nil
}

func randomID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
