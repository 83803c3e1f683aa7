package waiter_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
)

// The fleet tests run transports in several OS processes: this test binary again,
// told by transportChildEnv (a JSON childOrders) to run TestTransportFleetChild. A
// child makes its client, limiter and transport, prints "READY", waits for a line on
// stdin, sends from Workers goroutines until the next line (or the end of stdin),
// which cancels the requests under way, and prints "RESULT " and its childReport as
// JSON. The parent stops the fleet when what it tests has happened, not after a
// fixed time: a loaded machine starts and runs the children late.
const transportChildEnv = "JOBTHROTTLE_TRANSPORT_CHILD"

type childOrders struct {
	Proc     int
	Addrs    []string
	Cluster  bool
	Prefix   string
	Key      string
	Spacing  time.Duration // the fleet's limit: a permit every Spacing
	URL      string
	Workers  int
	Reserve  int // WithRateLimitHeaders(Reserve); -1: off
	MaxPause time.Duration
}

type childReport struct {
	Proc      int
	Holds     []childHold
	Reqs      []childReq
	Pauses    []childPause
	FirstRead int64 // UnixNano: when the first response was read
	Errors    []string
}

// childPause is a pause a child set: when Pause returned, and the vendor's quota window
// (a Unix second, from the answer's X-Window header; 0 without) of the answer that set it.
type childPause struct {
	At     int64 // UnixNano
	Window int64
}

type childHold struct {
	Seq   int64
	Until int64 // UnixNano
}

type childReq struct {
	ID      int
	WaitSeq int64 // its last WaitN's place in the order of holds and WaitN calls (see holdRecorder)
	WaitAt  int64 // UnixNano: when its last WaitN began
	SentAt  int64 // UnixNano
	Status  int
}

// TestTransportFleetChild is the child's side; it does nothing in a normal run.
func TestTransportFleetChild(t *testing.T) {
	raw := os.Getenv(transportChildEnv)
	if raw == "" {
		t.Skip("run by the fleet tests in a child process")
	}
	var o childOrders
	if err := json.Unmarshal([]byte(raw), &o); err != nil {
		t.Fatal(err)
	}
	rdb := redistest.Dial(o.Addrs, o.Cluster)
	defer rdb.Close()
	l, err := throttle.New(rdb, o.Key, throttle.Every(o.Spacing), throttle.WithKeyPrefix(o.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	lim := &holdRecorder{Limiter: l}
	rep := childReport{Proc: o.Proc}
	var mu sync.Mutex
	windows := map[string]int64{} // by X-Req: the window the answer to it was in
	opts := []waiter.TransportOption{waiter.WithMaxPause(o.MaxPause), waiter.WithTransportHooks(waiter.TransportHooks{
		Paused: func(req *http.Request, _ int, _ time.Duration) {
			at := time.Now().UnixNano()
			mu.Lock()
			rep.Pauses = append(rep.Pauses, childPause{at, windows[req.Header.Get("X-Req")]})
			mu.Unlock()
		},
		PauseFailed: func(_ *http.Request, _ time.Duration, err error) {
			mu.Lock()
			rep.Errors = append(rep.Errors, "pause: "+err.Error())
			mu.Unlock()
		},
	})}
	if o.Reserve >= 0 {
		opts = append(opts, waiter.WithRateLimitHeaders(o.Reserve))
	}
	base := stampSent(roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err == nil {
			w, _ := strconv.ParseInt(resp.Header.Get("X-Window"), 10, 64)
			mu.Lock()
			windows[req.Header.Get("X-Req")] = w
			mu.Unlock()
		}
		return resp, err
	}))
	client := &http.Client{Transport: waiter.NewTransport(lim, base, opts...)}
	fmt.Println("READY")
	in := bufio.NewReader(os.Stdin)
	if _, err := in.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	running, stop := context.WithCancel(context.Background())
	go func() { // "STOP", or the end of stdin: the parent is gone
		_, _ = in.ReadString('\n')
		stop()
	}()
	var (
		next int
		reqs []*tracked
		wg   sync.WaitGroup
	)
	statuses := map[*tracked]int{}
	for w := 0; w < o.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for running.Err() == nil {
				mu.Lock()
				tr := &tracked{id: o.Proc*1_000_000 + next}
				next++
				reqs = append(reqs, tr)
				mu.Unlock()
				ctx, cancel := context.WithCancel(context.WithValue(running, trackedKey{}, tr))
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, o.URL, nil)
				req.Header.Set("X-Req", strconv.Itoa(tr.id))
				req.Header.Set("X-Proc", strconv.Itoa(o.Proc))
				resp, err := client.Do(req)
				if err != nil {
					cancel()
					if ctx.Err() == nil {
						mu.Lock()
						rep.Errors = append(rep.Errors, err.Error())
						mu.Unlock()
					}
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				cancel()
				mu.Lock()
				if rep.FirstRead == 0 {
					rep.FirstRead = time.Now().UnixNano()
				}
				statuses[tr] = resp.StatusCode
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	lim.mu.Lock()
	for _, h := range lim.holds {
		rep.Holds = append(rep.Holds, childHold{h.seq, h.until.UnixNano()})
	}
	lim.mu.Unlock()
	for _, tr := range reqs {
		if tr.sentAt.Load() == 0 {
			continue
		}
		rep.Reqs = append(rep.Reqs, childReq{tr.id, tr.waitSeq.Load(), tr.waitAt.Load(), tr.sentAt.Load(), statuses[tr]})
	}
	b, _ := json.Marshal(rep)
	fmt.Println("RESULT " + string(b))
}

// runFleet starts procs children with orders o (Proc set for each), starts them
// together once all are ready, stops them when done is closed (or, failing that, after
// limit), and returns their reports.
func runFleet(t *testing.T, procs int, o childOrders, done <-chan struct{}, limit time.Duration) []childReport {
	t.Helper()
	type child struct {
		cmd   *exec.Cmd
		in    io.WriteCloser
		out   *bufio.Reader
		stdio strings.Builder
	}
	children := make([]*child, procs)
	for p := range children {
		o.Proc = p
		raw, _ := json.Marshal(o)
		cmd := exec.Command(os.Args[0], "-test.run=^TestTransportFleetChild$", "-test.v=false")
		cmd.Env = append(os.Environ(), transportChildEnv+"="+string(raw))
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		c := &child{cmd: cmd, in: in, out: bufio.NewReader(out)}
		cmd.Stderr = &c.stdio
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		children[p] = c
	}
	for p, c := range children {
		for {
			line, err := c.out.ReadString('\n')
			if err != nil {
				t.Fatalf("child %d: %v before READY (stderr: %s)", p, err, c.stdio.String())
			}
			if strings.TrimSpace(line) == "READY" {
				break
			}
		}
	}
	for _, c := range children {
		fmt.Fprintln(c.in, "GO")
	}
	select {
	case <-done:
	case <-time.After(limit):
		t.Logf("the fleet stopped after %v, what the test waits for had not happened", limit)
	}
	for _, c := range children {
		fmt.Fprintln(c.in, "STOP")
	}
	reports := make([]childReport, procs)
	for p, c := range children {
		for {
			line, err := c.out.ReadString('\n')
			if err != nil {
				t.Fatalf("child %d: %v before RESULT (stderr: %s)", p, err, c.stdio.String())
			}
			if rest, ok := strings.CutPrefix(line, "RESULT "); ok {
				if err := json.Unmarshal([]byte(rest), &reports[p]); err != nil {
					t.Fatal(err)
				}
				break
			}
		}
		for _, e := range reports[p].Errors {
			t.Errorf("child %d: %s", p, e)
		}
	}
	return reports
}

// heldViolations returns the requests of rep's process whose WaitN began after the
// process was held and that were sent before the hold's end.
func heldViolations(rep childReport) []string {
	var bad []string
	for _, r := range rep.Reqs {
		for _, h := range rep.Holds {
			if r.WaitSeq > h.Seq && r.SentAt < h.Until {
				bad = append(bad, fmt.Sprintf("request %d of process %d, whose WaitN began after its process was held, was sent %v before the hold's end",
					r.ID, rep.Proc, time.Duration(h.Until-r.SentAt)))
			}
		}
	}
	return bad
}

// fleetOrders returns the orders shared by every child on backend b.
func fleetOrders(t *testing.T, b *redistest.Backend, key, url string) childOrders {
	o := childOrders{Prefix: b.Prefix, Key: key, URL: url, Workers: 8, Reserve: -1, MaxPause: 5 * time.Minute}
	o.Addrs, o.Cluster = b.Addrs()
	return o
}

// vendorLog is what the local vendor saw: each request's process, id and arrival.
type vendorLog struct {
	mu   sync.Mutex
	hits []vendorHit
}

// pauseSeen is a pause of the fleet test's process proc, in Redis by at (UnixNano).
type pauseSeen struct {
	proc int
	at   int64
}

type vendorHit struct {
	proc, id int
	at       time.Time
	status   int
}

// add records r, answered status by a vendor that decided at at.
func (v *vendorLog) add(r *http.Request, status int, at time.Time) {
	proc, _ := strconv.Atoi(r.Header.Get("X-Proc"))
	id, _ := strconv.Atoi(r.Header.Get("X-Req"))
	v.mu.Lock()
	v.hits = append(v.hits, vendorHit{proc, id, at, status})
	v.mu.Unlock()
}

// 8 processes × 8 goroutines share a limiter of 100 requests a second; the vendor
// announces a 1s pause (429, Retry-After: 1) on its 60th request, and answers 429
// to everything inside it. In the process that read the announcement, no request
// whose WaitN began after its hold is sent inside the pause (checked exactly, by the
// order of the hold and the WaitN calls); requests of other processes that reach the
// vendor inside the pause are counted, with how many of them began their WaitN after
// the pause reached Redis (none should: those book after it). The fleet runs until
// the vendor has had 20 requests after the pause: it goes again.
func TestTransportFleetRetryAfter(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process figure")
	}
	const (
		procs    = 8
		announce = 60
		pause    = time.Second
		after    = 20 // requests after the pause before the fleet stops
	)
	b := redistest.NewStandalone(t)
	var (
		log     vendorLog
		mu      sync.Mutex
		n       int
		start   time.Time // of the announced pause
		readBy  = -1      // the process it was announced to
		readReq int
		again   int // requests after the pause
		wentOn  = make(chan struct{})
	)
	vendor := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		now := time.Now()
		status := http.StatusOK
		switch {
		case n == announce:
			start, status = now, http.StatusTooManyRequests
			readBy, _ = strconv.Atoi(r.Header.Get("X-Proc"))
			readReq, _ = strconv.Atoi(r.Header.Get("X-Req"))
			w.Header().Set("Retry-After", "1")
		case !start.IsZero() && now.Before(start.Add(pause)):
			status = http.StatusTooManyRequests
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(start.Add(pause).Sub(now).Seconds()))))
		case !start.IsZero():
			if again++; again == after {
				close(wentOn)
			}
		}
		mu.Unlock()
		log.add(r, status, now)
		w.WriteHeader(status)
	}))
	defer vendor.Close()
	o := fleetOrders(t, b, "fleet-retry-after", vendor.URL)
	o.Spacing = 10 * time.Millisecond
	reports := runFleet(t, procs, o, wentOn, time.Minute)
	for _, rep := range reports {
		for _, v := range heldViolations(rep) {
			t.Error(v)
		}
	}
	mu.Lock() // the vendor's handlers are done, but no lock of theirs says so
	got, readBy, readReq, start, again := n, readBy, readReq, start, again
	mu.Unlock()
	if readBy < 0 {
		t.Fatalf("the vendor got %d requests, fewer than the %d it announces the pause on", got, announce)
	}
	if again < after {
		t.Errorf("the vendor got %d requests after the pause, want %d: the fleet did not go again", again, after)
	}
	reader := reports[readBy]
	if len(reader.Holds) == 0 || len(reader.Pauses) == 0 {
		t.Fatalf("process %d read the 429 but held %d times and paused %d times", readBy, len(reader.Holds), len(reader.Pauses))
	}
	firstHold := reader.Holds[0]
	byID := map[int]childReq{}
	for _, rep := range reports {
		for _, r := range rep.Reqs {
			byID[r.ID] = r
		}
	}
	pausedInRedis := time.Unix(0, reader.Pauses[0].At)
	var sameOnWay, sameAfter, other, otherBookedAfter int
	log.mu.Lock()
	for _, h := range log.hits {
		if h.id == readReq || h.at.Before(start) || !h.at.Before(start.Add(pause)) {
			continue
		}
		r := byID[h.id]
		switch {
		case h.proc == readBy && r.WaitSeq < firstHold.Seq:
			sameOnWay++
		case h.proc == readBy:
			sameAfter++
			t.Errorf("request %d of process %d began its WaitN after the 429 held its process and reached the vendor %v inside the pause", h.id, h.proc, h.at.Sub(start))
		default:
			other++
			if time.Unix(0, r.WaitAt).After(pausedInRedis) {
				otherBookedAfter++
			}
		}
	}
	total := len(log.hits)
	log.mu.Unlock()
	redistest.Figure(t, "%d processes × 8 goroutines, 100/s shared, 1s pause announced to process %d (Pause returned %v after the 429): inside the pause the vendor got %d requests from that process whose WaitN began after its hold (%d begun before), %d from other processes (%d of them begun after the pause reached Redis); %d requests in all",
		procs, readBy, pausedInRedis.Sub(start).Round(time.Millisecond), sameAfter, sameOnWay, other, otherBookedAfter, total)
	if otherBookedAfter > 0 {
		t.Errorf("%d requests of other processes began their WaitN after the pause reached Redis and reached the vendor inside it", otherBookedAfter)
	}
}

// 8 processes × 8 goroutines share a limiter of 100 requests a second, above the
// vendor's quota of 50 per wall-clock second, which an unthrottled client also uses
// (20 a second). The vendor sends its quota in RateLimit headers on every answer;
// with WithRateLimitHeaders(24) no request is refused that the fleet could have held
// back: none booked after a pause reached Redis, none of the process that paused
// (checked by mechanism, see below). How many were on their way while a pause spread
// depends on the machine's speed: reported (none on an idle machine, where 24 cover
// the requests in flight). Without the option, the figure shows what the headers save.
// The fleet runs for 3s from its first request at the vendor.
func TestTransportFleetRateLimitHeaders(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process figure")
	}
	const (
		procs   = 8
		quota   = 50
		reserve = 24 // 3 per process: each may send a few before its own answer tells it
	)
	for _, withHeaders := range []bool{true, false} {
		b := redistest.NewStandalone(t)
		var (
			mu      sync.Mutex
			window  int64
			used    int
			log     vendorLog
			started bool
			first   = make(chan struct{}) // the fleet's first request came
		)
		vendor := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			now := time.Now()
			mu.Lock()
			if s := now.Unix(); s != window {
				window, used = s, 0
			}
			status := http.StatusOK
			if used < quota {
				used++
			} else {
				status = http.StatusTooManyRequests
			}
			left, win := quota-used, window
			mu.Unlock()
			reset := int(math.Ceil(time.Unix(win+1, 0).Sub(now).Seconds()))
			w.Header().Set("RateLimit-Policy", fmt.Sprintf(`"default";q=%d;w=1`, quota))
			w.Header().Set("RateLimit", fmt.Sprintf(`"default";r=%d;t=%d`, left, reset))
			if status != http.StatusOK {
				w.Header().Set("Retry-After", strconv.Itoa(reset))
			}
			w.Header().Set("X-Window", strconv.FormatInt(win, 10))
			if r.Header.Get("X-Proc") != "" {
				log.add(r, status, now)
				mu.Lock()
				if !started {
					started = true
					close(first)
				}
				mu.Unlock()
			}
			w.WriteHeader(status)
		}))
		stop := make(chan struct{})
		var unthrottled sync.WaitGroup
		unthrottled.Add(1)
		go func() { // another client of the same quota, not throttled by the fleet
			defer unthrottled.Done()
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					if resp, err := http.Get(vendor.URL); err == nil {
						resp.Body.Close()
					}
				}
			}
		}()
		o := fleetOrders(t, b, "fleet-headers", vendor.URL)
		o.Spacing = 10 * time.Millisecond
		if withHeaders {
			o.Reserve = reserve
		}
		ran, stopped := make(chan struct{}), make(chan struct{})
		go func() {
			select {
			case <-first:
				time.Sleep(3 * time.Second)
				close(ran)
			case <-stopped:
			}
		}()
		reports := runFleet(t, procs, o, ran, time.Minute)
		close(stopped)
		close(stop)
		unthrottled.Wait()
		vendor.Close()
		// A pause set on an answer runs to the end of that answer's vendor second (its
		// quota window) at least: the headers' reset counts from the answer. So a
		// request refused 429 in a window is the transport's fault when its WaitN
		// began after a pause set on an answer of that window had reached Redis (every
		// process books after such a pause), and any request of a process is when its
		// WaitN began after that process was held and it was sent before the hold's
		// end (holdRecorder's order). Other 429s are of requests already on their way
		// while the pause spread (between the vendor's answer and the Pause reaching
		// Redis): how many depends on how fast the machine runs them (at 100/s,
		// reserve 24 covers 240ms), a figure, not asserted.
		firstRead := map[int]time.Time{}
		paused := map[int64][]pauseSeen{} // by the vendor window of the answer that set the pause
		for _, rep := range reports {
			firstRead[rep.Proc] = time.Unix(0, rep.FirstRead)
			for _, p := range rep.Pauses {
				paused[p.Window] = append(paused[p.Window], pauseSeen{rep.Proc, p.At})
			}
			for _, v := range heldViolations(rep) {
				t.Error(v)
			}
		}
		refused, refusedAfter, onTheirWay, ok := 0, 0, 0, 0
		byID := map[int]childReq{}
		for _, rep := range reports {
			for _, r := range rep.Reqs {
				byID[r.ID] = r
			}
		}
		log.mu.Lock()
		for _, h := range log.hits {
			if h.status == http.StatusOK {
				ok++
				continue
			}
			refused++
			r := byID[h.id]
			if time.Unix(0, r.SentAt).After(firstRead[h.proc]) {
				refusedAfter++
			}
			held := false
			for _, p := range paused[h.at.Unix()] {
				if p.at < r.WaitAt {
					held = true
					t.Errorf("request %d of process %d, whose WaitN began %v after process %d's pause set in the same vendor second reached Redis, was refused 429",
						h.id, h.proc, time.Duration(r.WaitAt-p.at), p.proc)
					break
				}
			}
			if !held {
				onTheirWay++
			}
		}
		log.mu.Unlock()
		if withHeaders {
			redistest.Figure(t, "with WithRateLimitHeaders(%d): %d processes × 8 goroutines at 100/s, vendor quota %d/s shared with an unthrottled client at 20/s, 3s: %d answered 200, %d refused 429 (%d sent after the process read its first header; %d on their way while a pause spread)",
				reserve, procs, quota, ok, refused, refusedAfter, onTheirWay)
		} else {
			redistest.Figure(t, "without WithRateLimitHeaders: the same fleet: %d answered 200, %d refused 429", ok, refused)
		}
	}
}
