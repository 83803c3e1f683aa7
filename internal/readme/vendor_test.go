package readme_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// The vendor the README's snippets are measured against, as the README says next to
// its worker loop: a strict sliding window of the published limit, 20 requests in any
// second, answering 429 to the 21st.
const (
	vendorRate   = 20
	vendorPeriod = time.Second
)

// The fleet: 2 processes, each with 4 goroutines of the loop or of HTTP requests, or
// one asynq server as the README sets it up; 200 jobs (requests, tasks) in all.
const (
	fleetProcs   = 2
	fleetWorkers = 4
	fleetJobs    = 200
)

// TestREADMEAtAStrictVendor runs the README's worker loop, HTTP client and asynq
// setup as written (testdata/fleet builds them from the README's text, with the
// limiter the loop makes) in fleetProcs processes against a strict vendor of the
// published limit, on miniredis and a real redis-server, and reports what the vendor
// refused and how much of its limit the fleet used. It fails if a snippet does not
// build or run, or a job is not done; the figures are measured, not asserted: a
// request's way from its permit to the vendor is the host's (see the README).
func TestREADMEAtAStrictVendor(t *testing.T) {
	prog := buildFleet(t)
	for _, mode := range []string{"loop", "http", "asynq"} {
		for _, k := range []redistest.Kind{redistest.Mini, redistest.Standalone} {
			t.Run(mode+"/"+string(k), func(t *testing.T) {
				addr := redisFor(t, k)
				vendor, stuck := runFleet(t, prog, mode, addr)
				arrivals := vendor.Arrivals
				accepted := 0
				for _, a := range arrivals {
					if a.Status == 200 {
						accepted++
					}
				}
				// every job made one request (loop, http); every task was done once, or
				// waits in asynq's retry set after the vendor refused it
				if mode != "asynq" && len(arrivals) != fleetJobs || mode == "asynq" && accepted+stuck != fleetJobs {
					t.Errorf("%d jobs: the vendor got %d requests, accepted %d; %d tasks wait for a retry after a refusal",
						fleetJobs, len(arrivals), accepted, stuck)
				}
				fleet := fmt.Sprintf("%d processes × %d goroutines", fleetProcs, fleetWorkers)
				if mode == "asynq" {
					fleet = fmt.Sprintf("%d processes, each an asynq server as the README sets it up", fleetProcs)
				}
				reportVendor(t, mode+" on "+string(k)+", "+fleet, arrivals)
			})
		}
	}
}

// redisFor returns the address of a Redis of kind k of the test's own: a real-time
// miniredis, or a redis-server started for it, as the snippets use fixed keys and
// asynq's default queue.
func redisFor(t *testing.T, k redistest.Kind) string {
	if k == redistest.Mini {
		return redistest.NewMiniRealTime(t).Mini.Addr()
	}
	s, err := redistest.StartServer()
	if err != nil {
		if os.Getenv("JOBTHROTTLE_REQUIRE_REAL") != "" {
			t.Fatalf("real Redis required (JOBTHROTTLE_REQUIRE_REAL is set): %v", err)
		}
		t.Skipf("redis-server could not be started: %v", err)
	}
	return s.Addr
}

// Report and Arrival are testdata/fleet's: what its vendor saw.
type Report struct {
	Arrivals      []Arrival
	Reports       int
	MostReporting int
}

type Arrival struct {
	At     int64
	Status int
	Src    string
}

// semaphoreMax is the max of the README's semaphore, "at most 5 run at once".
const semaphoreMax = 5

// TestREADMESemaphore runs the README's semaphore snippet as written in fleetProcs
// processes of fleetWorkers goroutines, fleetJobs times in all, each buildReport a
// request the vendor holds a moment: the vendor never serves more than the
// semaphore's max at once.
func TestREADMESemaphore(t *testing.T) {
	prog := buildFleet(t)
	for _, k := range []redistest.Kind{redistest.Mini, redistest.Standalone} {
		t.Run(string(k), func(t *testing.T) {
			vendor, _ := runFleet(t, prog, "semaphore", redisFor(t, k))
			if vendor.Reports != fleetJobs || vendor.MostReporting > semaphoreMax {
				t.Fatalf("the vendor served %d reports, at most %d at once; want %d, at most %d", vendor.Reports, vendor.MostReporting, fleetJobs, semaphoreMax)
			}
			redistest.Figure(t, "semaphore on %s, %d processes × %d goroutines: %d reports, at most %d at once (max %d)",
				k, fleetProcs, fleetWorkers, vendor.Reports, vendor.MostReporting, semaphoreMax)
		})
	}
}

// reportVendor reports the vendor's figures: requests, refusals, the most in any of
// its windows, the share of its limit used, and the shortest time in which rate + 1
// requests arrived. The share is k periods over the time from the first accepted
// request to the (k × rate + 1)th, for the largest k: the vendor could have accepted
// those requests in k periods; a fleet that has the rate accepted every 1.04 periods
// scores 1/1.04. The shortest time is the period the fleet's limit enforces less the
// worst spread of the requests' ways from their permits to the vendor; below the
// vendor's period, the vendor refuses.
func reportVendor(t *testing.T, what string, arrivals []Arrival) {
	var accepted, all []time.Time
	refused := 0
	for _, a := range arrivals {
		at := time.Unix(0, a.At)
		all = append(all, at)
		if a.Status == 200 {
			accepted = append(accepted, at)
		} else {
			refused++
		}
	}
	used := 0.0
	if k := (len(accepted) - 1) / vendorRate; k > 0 {
		used = float64(k) * float64(vendorPeriod) / float64(accepted[k*vendorRate].Sub(accepted[0]))
	}
	shortest := time.Duration(-1)
	for i := vendorRate; i < len(all); i++ {
		if d := all[i].Sub(all[i-vendorRate]); shortest < 0 || d < shortest {
			shortest = d
		}
	}
	redistest.Figure(t, "%s, vendor %d per %v: %d requests, refused %d (%.1f%%), limit used %.1f%%; most in one window %d, %d arrived within %v",
		what, vendorRate, vendorPeriod, len(arrivals), refused, 100*float64(refused)/float64(max(1, len(arrivals))),
		100*used, redistest.MaxTimesInWindow(all, vendorPeriod), vendorRate+1, shortest.Round(100*time.Microsecond))
}

// buildFleet builds testdata/fleet with snippets.go, written from the README, laid
// over it (go build -overlay): nothing is written into the module.
func buildFleet(t *testing.T) string {
	text, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := fleetSnippets(string(text))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gen := filepath.Join(dir, "snippets.go")
	if err := os.WriteFile(gen, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	here, err := filepath.Abs("testdata/fleet")
	if err != nil {
		t.Fatal(err)
	}
	overlay, _ := json.Marshal(map[string]any{"Replace": map[string]string{filepath.Join(here, "snippets.go"): gen}})
	if err := os.WriteFile(filepath.Join(dir, "overlay.json"), overlay, 0o644); err != nil {
		t.Fatal(err)
	}
	prog := filepath.Join(dir, "fleet")
	out, err := exec.Command("go", "build", "-overlay", filepath.Join(dir, "overlay.json"), "-o", prog, "./testdata/fleet").CombinedOutput()
	if err != nil {
		t.Fatalf("building the README's snippets: %v\n%s\nsnippets.go:\n%s", err, out, src)
	}
	return prog
}

// fleetSnippets writes the README's worker loop, HTTP client, asynq setup and
// semaphore into the functions testdata/fleet calls. newLimiter is the loop's
// throttle.New call.
func fleetSnippets(readme string) (string, error) {
	var loop, client, setup, sem string
	for _, b := range goBlock.FindAllStringSubmatch(readme, -1) {
		for _, s := range []struct {
			mark string
			to   *string
		}{{"range jobs", &loop}, {"waiter.NewTransport(", &client}, {"asynqmw.New(", &setup}, {"NewSemaphore(", &sem}} {
			if s.mark == "waiter.NewTransport(" && strings.Contains(b[1], "WithCost(") {
				continue // the LLM APIs' client needs a vendor of tokens: examples/llm runs the same client
			}
			if strings.Contains(b[1], s.mark) {
				if *s.to != "" {
					return "", fmt.Errorf("two README snippets have %q", s.mark)
				}
				*s.to = b[1]
			}
		}
	}
	if loop == "" || client == "" || setup == "" || sem == "" {
		return "", fmt.Errorf("the README lacks the worker loop, the HTTP client, the asynq setup or the semaphore")
	}
	newCall, err := throttleNew(loop)
	if err != nil {
		return "", err
	}
	return `package main

import (
	"context"
	"net/http"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/asynqmw"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
)

var (
	_ = http.Client{}
	_ = time.Second
	_ = asynqmw.New
	_ = waiter.NewTransport
)

func loopSnippet(ctx context.Context, rdb *redis.Client, jobs chan string, call func(string)) error {
` + loop + `	return nil
}

func newLimiter(rdb *redis.Client) (*throttle.Limiter, error) {
	return ` + newCall + `
}

func httpSnippet(lim *throttle.Limiter) *http.Client {
` + client + `	return client
}

func asynqSnippet(ctx context.Context, rdb *redis.Client, lim *throttle.Limiter, handler asynq.Handler) (*asynq.Server, *asynq.ServeMux) {
` + setup + `	return srv, mux
}

func semaphoreSnippet(ctx context.Context, rdb *redis.Client, buildReport func(context.Context) error) (err error) {
` + sem + `	return err
}
`, nil
}

// throttleNew returns the text of the throttle.New call in a snippet.
func throttleNew(snippet string) (string, error) {
	src := "package p\nfunc f() {\n" + snippet + "}\n"
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "loop.go", src, 0)
	if err != nil {
		return "", fmt.Errorf("the README's loop: %w", err)
	}
	var call string
	ast.Inspect(f, func(n ast.Node) bool {
		c, ok := n.(*ast.CallExpr)
		if !ok || call != "" {
			return call == ""
		}
		if sel, ok := c.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "New" {
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "throttle" {
				call = src[fset.Position(c.Pos()).Offset:fset.Position(c.End()).Offset]
			}
		}
		return true
	})
	if call == "" {
		return "", fmt.Errorf("the README's loop makes no throttle.New")
	}
	return call, nil
}

// proc is a running process of testdata/fleet.
type proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *bufio.Reader
	stderr bytes.Buffer
}

// start starts prog with args and reads its first line, which must begin with want.
func start(t *testing.T, prog, want string, args ...string) (*proc, string) {
	p := &proc{cmd: exec.Command(prog, args...)}
	p.cmd.Stderr = &p.stderr
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.out = bufio.NewReaderSize(stdout, 1<<20)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() })
	line, err := p.out.ReadString('\n')
	if !strings.HasPrefix(line, want) {
		t.Fatalf("%s %v: first line %q (%v), want %s...; stderr:\n%s", prog, args, line, err, want, p.stderr.String())
	}
	return p, strings.TrimSpace(strings.TrimPrefix(line, want))
}

// runFleet runs the vendor and fleetProcs processes of mode against Redis at addr
// until every job is done, and returns the vendor's report and, for asynq, the tasks
// left waiting for a retry after the vendor refused them.
func runFleet(t *testing.T, prog, mode, addr string) (vendorSaw Report, stuck int) {
	vendor, url := start(t, prog, "VENDOR ", "-mode", "vendor", "-rate", fmt.Sprint(vendorRate), "-period", vendorPeriod.String())
	var procs []*proc
	for i := range fleetProcs {
		p, _ := start(t, prog, "READY", "-mode", mode, "-redis", addr, "-vendor", url, "-proc", fmt.Sprint(i+1),
			"-workers", fmt.Sprint(fleetWorkers), "-jobs", fmt.Sprint(fleetJobs/fleetProcs))
		procs = append(procs, p)
	}
	if mode == "asynq" {
		enqueue(t, addr)
	}
	for _, p := range procs {
		if _, err := io.WriteString(p.stdin, "GO\n"); err != nil {
			t.Fatal(err)
		}
	}
	if mode == "asynq" {
		stuck = drain(t, addr)
		for _, p := range procs {
			p.stdin.Close()
		}
	}
	for i, p := range procs {
		rest, _ := io.ReadAll(p.out)
		if err := p.cmd.Wait(); err != nil || !strings.Contains(string(rest), "DONE") {
			t.Errorf("process %d: %v; stdout %q; stderr:\n%s", i+1, err, rest, p.stderr.String())
		}
	}
	vendor.stdin.Close()
	line, err := vendor.out.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "REPORT ") {
		t.Fatalf("vendor: %q, %v; stderr:\n%s", line, err, vendor.stderr.String())
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "REPORT ")), &vendorSaw); err != nil {
		t.Fatal(err)
	}
	return vendorSaw, stuck
}

// enqueue puts fleetJobs "vendor:call" tasks in asynq's default queue.
func enqueue(t *testing.T, addr string) {
	c := asynq.NewClient(asynq.RedisClientOpt{Addr: addr})
	defer c.Close()
	for i := range fleetJobs {
		if _, err := c.Enqueue(asynq.NewTask("vendor:call", fmt.Appendf(nil, "%d", i))); err != nil {
			t.Fatal(err)
		}
	}
}

// drain waits until asynq's default queue holds no task but those the vendor refused,
// which asynq retries tens of seconds later (the vendor has counted them), for at most
// two minutes, and returns how many those are. The queue's counts are read before and
// after the retry set is listed, and must agree: a handed-back task may come due
// between two reads. An archived task fails the test.
func drain(t *testing.T, addr string) int {
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: addr})
	defer insp.Close()
	idle := func() (int, bool) {
		q, err := insp.GetQueueInfo("default")
		if err != nil {
			t.Fatal(err)
		}
		if q.Archived > 0 {
			t.Fatalf("asynq archived %d tasks: %+v", q.Archived, q)
		}
		return q.Retry, q.Pending+q.Active+q.Scheduled+q.Aggregating == 0
	}
	deadline := time.Now().Add(2 * time.Minute)
	for ; time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if _, ok := idle(); !ok {
			continue
		}
		retry, err := insp.ListRetryTasks("default", asynq.PageSize(fleetJobs))
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(retry, func(ti *asynq.TaskInfo) bool { return !strings.Contains(ti.LastErr, "vendor answered") }) {
			continue
		}
		if n, ok := idle(); ok && n == len(retry) {
			return n
		}
	}
	t.Fatalf("asynq's queue not drained in two minutes")
	return 0
}
