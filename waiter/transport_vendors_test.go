package waiter_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
)

// vendor emulates one vendor's rate limiting as its public documentation gives it: the
// headers of its ordinary answers, of the answer that says "none left until T", and of
// its refusals until T.
type vendor struct {
	name    string
	reserve int // WithRateLimitHeaders(reserve); -1: off, as a user who does not set it
	// ok returns the headers of an ordinary answer at now: plenty left.
	ok func(now time.Time) map[string]string
	// stop returns the answer at now that says none is left until the end it tells.
	stop func(now time.Time) (status int, h map[string]string, end told)
	// inside returns a refusal at now, before until (the stop's end by the vendor's
	// clock): the same end, rounded down where the form has whole seconds, so that no
	// refusal moves the end the fleet was told.
	inside func(now, until time.Time) (status int, h map[string]string, end told)
}

// told is the end an answer tells: a time (absolute forms), or a delay from when the
// transport reads it (relative ones: "in 1s").
type told struct {
	at time.Time
	in time.Duration
}

// from returns the end for an answer read at read.
func (e told) from(read time.Time) time.Time {
	if e.at.IsZero() {
		return read.Add(e.in)
	}
	return e.at
}

// in returns a relative end of d; at an absolute one.
func in(d time.Duration) told { return told{in: d} }
func at(t time.Time) told     { return told{at: t} }

// Stops are short so that the test does not sleep seconds: an absolute stop ends at
// the first whole second at least 300ms away (its forms have whole seconds), a
// relative one in 1s (whole seconds) or 400ms (decimals).
func wholeSecondAfter(now time.Time) time.Time {
	return now.Add(300*ms + time.Second).Truncate(time.Second)
}

func unix(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }

func rfc(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// secondsLeft is until - now in whole seconds, rounded down, as text and as told.
func secondsLeft(now, until time.Time) (string, told) {
	d := until.Sub(now).Truncate(time.Second)
	return strconv.Itoa(int(d / time.Second)), in(d)
}

var vendors = []vendor{
	{
		name: "GitHub primary limit, 403", reserve: -1, // x-ratelimit-remaining 0, x-ratelimit-reset epoch
		ok: func(now time.Time) map[string]string {
			return map[string]string{"x-ratelimit-limit": "5000", "x-ratelimit-remaining": "4000", "x-ratelimit-used": "1000",
				"x-ratelimit-reset": unix(now.Add(time.Hour)), "x-ratelimit-resource": "core"}
		},
		stop: func(now time.Time) (int, map[string]string, told) {
			until := wholeSecondAfter(now)
			return 403, map[string]string{"x-ratelimit-limit": "5000", "x-ratelimit-remaining": "0", "x-ratelimit-used": "5000",
				"x-ratelimit-reset": unix(until), "x-ratelimit-resource": "core"}, at(until)
		},
		inside: func(now, until time.Time) (int, map[string]string, told) {
			return 403, map[string]string{"x-ratelimit-remaining": "0", "x-ratelimit-reset": unix(until)}, at(until)
		},
	},
	{
		name: "GitHub primary limit, 429", reserve: 100, // a user who reads the headers on every answer
		ok: func(now time.Time) map[string]string {
			return map[string]string{"x-ratelimit-limit": "5000", "x-ratelimit-remaining": "4000", "x-ratelimit-reset": unix(now.Add(time.Hour))}
		},
		stop: func(now time.Time) (int, map[string]string, told) {
			until := wholeSecondAfter(now)
			return 429, map[string]string{"x-ratelimit-limit": "5000", "x-ratelimit-remaining": "0", "x-ratelimit-reset": unix(until)}, at(until)
		},
		inside: func(now, until time.Time) (int, map[string]string, told) {
			return 429, map[string]string{"x-ratelimit-remaining": "0", "x-ratelimit-reset": unix(until)}, at(until)
		},
	},
	{
		name: "GitHub secondary limit, 403 retry-after", reserve: -1, // the primary quota is not spent
		ok: func(now time.Time) map[string]string {
			return map[string]string{"x-ratelimit-remaining": "4000", "x-ratelimit-reset": unix(now.Add(time.Hour))}
		},
		stop: func(now time.Time) (int, map[string]string, told) {
			return 403, map[string]string{"retry-after": "1", "x-ratelimit-remaining": "3999", "x-ratelimit-reset": unix(now.Add(time.Hour))},
				in(time.Second)
		},
		inside: func(now, until time.Time) (int, map[string]string, told) {
			secs, end := secondsLeft(now, until)
			return 403, map[string]string{"retry-after": secs, "x-ratelimit-remaining": "3998"}, end
		},
	},
	{
		name: "OpenAI", reserve: 0, // x-ratelimit-*-requests, resets as Go durations
		ok: func(time.Time) map[string]string {
			return map[string]string{"x-ratelimit-limit-requests": "500", "x-ratelimit-remaining-requests": "450", "x-ratelimit-reset-requests": "6m0s",
				"x-ratelimit-limit-tokens": "30000", "x-ratelimit-remaining-tokens": "29000", "x-ratelimit-reset-tokens": "2s"}
		},
		stop: func(now time.Time) (int, map[string]string, told) {
			return 200, map[string]string{"x-ratelimit-limit-requests": "500", "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "400ms",
				"x-ratelimit-remaining-tokens": "28000", "x-ratelimit-reset-tokens": "4s"}, in(400 * ms)
		},
		inside: func(now, until time.Time) (int, map[string]string, told) {
			d := until.Sub(now).Truncate(ms)
			return 429, map[string]string{"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": d.String()}, in(d)
		},
	},
	{
		name: "Anthropic", reserve: 0, // anthropic-ratelimit-requests-*, resets in RFC 3339
		ok: func(now time.Time) map[string]string {
			return map[string]string{"anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-remaining": "40",
				"anthropic-ratelimit-requests-reset":   rfc(now.Add(time.Second)),
				"anthropic-ratelimit-tokens-remaining": "8000", "anthropic-ratelimit-tokens-reset": rfc(now.Add(time.Second))}
		},
		stop: func(now time.Time) (int, map[string]string, told) {
			until := wholeSecondAfter(now)
			return 200, map[string]string{"anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-remaining": "0",
				"anthropic-ratelimit-requests-reset": rfc(until)}, at(until)
		},
		inside: func(now, until time.Time) (int, map[string]string, told) {
			secs, _ := secondsLeft(now, until) // earlier than the reset: the reset wins
			return 429, map[string]string{"retry-after": secs, "anthropic-ratelimit-requests-remaining": "0",
				"anthropic-ratelimit-requests-reset": rfc(until)}, at(until)
		},
	},
	{
		name: "IETF RateLimit, draft -08 and later", reserve: 0,
		ok: func(time.Time) map[string]string {
			return map[string]string{"RateLimit": `"default";r=50;t=1`, "RateLimit-Policy": `"default";q=100;w=1`}
		},
		stop: func(now time.Time) (int, map[string]string, told) {
			return 200, map[string]string{"RateLimit": `"default";r=0;t=1`, "RateLimit-Policy": `"default";q=100;w=1`}, in(time.Second)
		},
		inside: func(now, until time.Time) (int, map[string]string, told) {
			secs, end := secondsLeft(now, until)
			return 429, map[string]string{"RateLimit": `"default";r=0;t=` + secs, "Retry-After": secs}, end
		},
	},
	{
		name: "IETF RateLimit, draft -07", reserve: 0,
		ok: func(time.Time) map[string]string {
			return map[string]string{"RateLimit": "limit=100, remaining=50, reset=1"}
		},
		stop: func(now time.Time) (int, map[string]string, told) {
			return 200, map[string]string{"RateLimit": "limit=100, remaining=0, reset=1"}, in(time.Second)
		},
		inside: func(now, until time.Time) (int, map[string]string, told) {
			secs, end := secondsLeft(now, until)
			return 429, map[string]string{"RateLimit": "limit=100, remaining=0, reset=" + secs}, end
		},
	},
	{
		name: "IETF RateLimit-*, draft -06", reserve: 0,
		ok: func(time.Time) map[string]string {
			return map[string]string{"RateLimit-Limit": "100", "RateLimit-Remaining": "50", "RateLimit-Reset": "1"}
		},
		stop: func(now time.Time) (int, map[string]string, told) {
			return 200, map[string]string{"RateLimit-Limit": "100", "RateLimit-Remaining": "0", "RateLimit-Reset": "1"}, in(time.Second)
		},
		inside: func(now, until time.Time) (int, map[string]string, told) {
			secs, end := secondsLeft(now, until)
			return 429, map[string]string{"RateLimit-Remaining": "0", "RateLimit-Reset": secs}, end
		},
	},
	{
		name: "X", reserve: -1, // x-rate-limit-*, reset in Unix seconds; its 429 has no Retry-After
		ok: func(now time.Time) map[string]string {
			return map[string]string{"x-rate-limit-limit": "900", "x-rate-limit-remaining": "800", "x-rate-limit-reset": unix(now.Add(15 * time.Minute))}
		},
		stop: func(now time.Time) (int, map[string]string, told) {
			until := wholeSecondAfter(now)
			return 429, map[string]string{"x-rate-limit-limit": "900", "x-rate-limit-remaining": "0", "x-rate-limit-reset": unix(until)}, at(until)
		},
		inside: func(now, until time.Time) (int, map[string]string, told) {
			return 429, map[string]string{"x-rate-limit-remaining": "0", "x-rate-limit-reset": unix(until)}, at(until)
		},
	},
	{
		name: "Shopify", reserve: -1, // a decimal Retry-After on 429; its call-limit header is not read
		ok: func(time.Time) map[string]string { return map[string]string{"X-Shopify-Shop-Api-Call-Limit": "12/40"} },
		stop: func(now time.Time) (int, map[string]string, told) {
			return 429, map[string]string{"Retry-After": "0.4", "X-Shopify-Shop-Api-Call-Limit": "40/40"}, in(400 * ms)
		},
		inside: func(now, until time.Time) (int, map[string]string, told) {
			d := until.Sub(now).Truncate(100 * ms)
			return 429, map[string]string{"Retry-After": fmt.Sprintf("%.1f", d.Seconds()), "X-Shopify-Shop-Api-Call-Limit": "40/40"}, in(d)
		},
	},
	{
		name: "Retry-After HTTP-date, 429", reserve: -1,
		ok: func(time.Time) map[string]string { return nil },
		stop: func(now time.Time) (int, map[string]string, told) {
			until := wholeSecondAfter(now)
			return 429, map[string]string{"Retry-After": until.UTC().Format(http.TimeFormat)}, at(until)
		},
		inside: func(now, until time.Time) (int, map[string]string, told) {
			return 429, map[string]string{"Retry-After": until.UTC().Format(http.TimeFormat)}, at(until)
		},
	},
	{
		name: "Retry-After seconds, 503", reserve: -1,
		ok: func(time.Time) map[string]string { return nil },
		stop: func(now time.Time) (int, map[string]string, told) {
			return 503, map[string]string{"Retry-After": "1"}, in(time.Second)
		},
		inside: func(now, until time.Time) (int, map[string]string, told) {
			secs, end := secondsLeft(now, until)
			return 503, map[string]string{"Retry-After": secs}, end
		},
	},
	{
		name: "Discord", reserve: 0, // x-ratelimit-reset-after, seconds with a fraction
		ok: func(now time.Time) map[string]string {
			return map[string]string{"X-RateLimit-Limit": "50", "X-RateLimit-Remaining": "40", "X-RateLimit-Reset-After": "1.000"}
		},
		stop: func(now time.Time) (int, map[string]string, told) {
			return 200, map[string]string{"X-RateLimit-Limit": "50", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset-After": "0.400",
				"X-RateLimit-Reset": fmt.Sprintf("%.3f", float64(now.Add(400*ms).UnixMilli())/1000)}, in(400 * ms)
		},
		inside: func(now, until time.Time) (int, map[string]string, told) {
			d := until.Sub(now).Truncate(ms)
			return 429, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset-After": fmt.Sprintf("%.3f", d.Seconds())}, in(d)
		},
	},
}

// For each vendor's documented form of "none left until T", a fleet of two processes
// (two clients, each with its own hold) × 3 goroutines sharing a limit of a request
// every 20ms sends into the vendor, which says it on its 8th request: the fleet sends
// nothing before T that it could have held back, and goes again at T.
//
// T is the end the fleet was told: the vendor's T for an absolute form, and for a
// relative one ("in 1s") that long after the transport read the answer.
//
// Checked by mechanism, not by timing: a request that reached the vendor before T must
// have booked its permit before the first pause reached Redis (its last WaitN began
// before Pause returned) and begun its WaitN before its process held (holdRecorder);
// those were on their way, and are counted as a figure. Each pause (and hold) lasts
// what its answer told, exactly: set between the answer's read and Pause's return, it
// ends at the told end. Going again: the first permit
// granted at or after T takes effect within 50ms of T, or of the pause's end in Redis,
// or of its own script's run, whichever is latest, by Redis's clock. The pause's end
// is taken as late as it can be: the end the answer told plus the time from reading
// it to Pause's return (the pause counts from when its script runs: its trip to Redis
// delays it on a busy machine), not from the pause the transport asked for, which
// could be wrong. A script that runs late is a waiter woken late by a busy machine.
// When the vendor then sees the request is scheduling, reported.
func TestTransportVendorsGoAgain(t *testing.T) {
	for _, v := range vendors {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) { goAgain(t, b, v) })
		})
	}
}

// fleetProc is one process of the fleet: its limiter, what it recorded, its requests.
type fleetProc struct {
	lim    *holdRecorder
	grants *redistest.Grants
	mu     sync.Mutex
	reqs   map[int]*tracked
	readAt map[int]time.Time // when the base transport returned each answer
}

type vendorArrival struct {
	proc, id int
	at       time.Time
	status   int
}

type pauseRecord struct {
	proc, id int       // of the request whose answer set it
	at       time.Time // when Paused ran: after Pause returned
	d        time.Duration
}

func goAgain(t *testing.T, b *redistest.Backend, v vendor) {
	const (
		procs    = 2
		workers  = 3
		spacing  = 20 * ms
		announce = 8
		after    = 6 // requests to see at or after T before stopping
		resumeBy = 50 * ms
	)
	key := "vendor-" + strconv.Itoa(int(time.Now().UnixNano()%1e9))
	var (
		mu        sync.Mutex
		n         int
		stopID    = -1
		stopAt    time.Time // when the vendor answered "none left"
		until     time.Time // the vendor's end, by its clock
		tells     = map[int]told{}
		arrivals  []vendorArrival
		pauses    []pauseRecord
		announced = make(chan struct{})
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		proc, _ := strconv.Atoi(r.Header.Get("X-Proc"))
		id, _ := strconv.Atoi(r.Header.Get("X-Req"))
		mu.Lock()
		n++
		status, h := http.StatusOK, v.ok(now)
		switch {
		case n == announce:
			var end told
			status, h, end = v.stop(now)
			stopID, stopAt, until, tells[id] = id, now, end.from(now), end
			close(announced)
		case stopID >= 0 && now.Before(until):
			status, h, tells[id] = v.inside(now, until)
		}
		arrivals = append(arrivals, vendorArrival{proc, id, now, status})
		mu.Unlock()
		for k, val := range h {
			w.Header().Set(k, val)
		}
		w.WriteHeader(status)
	}))
	defer srv.Close()

	ps := make([]*fleetProc, procs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for p := range ps {
		client := b.Client
		if p > 0 { // another process: a client of its own, so a hold of its own
			addrs, cluster := b.Addrs()
			client = redistest.Dial(addrs, cluster)
			defer client.Close()
		}
		fp := &fleetProc{grants: redistest.RecordGrants(client), reqs: map[int]*tracked{}, readAt: map[int]time.Time{}}
		l, err := throttle.New(client, key, throttle.Every(spacing), throttle.WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		fp.lim = &holdRecorder{Limiter: l}
		ps[p] = fp
		opts := []waiter.TransportOption{waiter.WithTransportHooks(waiter.TransportHooks{
			Paused: func(req *http.Request, _ int, d time.Duration) {
				id, _ := strconv.Atoi(req.Header.Get("X-Req"))
				mu.Lock()
				pauses = append(pauses, pauseRecord{p, id, time.Now(), d})
				mu.Unlock()
			},
			PauseFailed: func(_ *http.Request, d time.Duration, err error) { t.Errorf("Pause(%v): %v", d, err) },
			BadHeader: func(req *http.Request, status int, err *waiter.HeaderError) {
				// An answer that tells an end by the clock and is read after it (a
				// refusal made just before T) is rightly reported as past.
				id, _ := strconv.Atoi(req.Header.Get("X-Req"))
				fp.mu.Lock()
				read, ok := fp.readAt[id]
				fp.mu.Unlock()
				mu.Lock()
				end := tells[id].from(read)
				mu.Unlock()
				if err.Problem == "in the past" && ok && !time.Now().Before(end) {
					t.Logf("BadHeader(%d): %v (read %v after the end it told)", status, err, time.Since(end).Round(time.Millisecond))
					return
				}
				t.Errorf("BadHeader(%d): %v", status, err)
			},
		})}
		if v.reserve >= 0 {
			opts = append(opts, waiter.WithRateLimitHeaders(v.reserve))
		}
		base := stampSent(roundTripFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := http.DefaultTransport.RoundTrip(req)
			id, _ := strconv.Atoi(req.Header.Get("X-Req"))
			fp.mu.Lock()
			fp.readAt[id] = time.Now()
			fp.mu.Unlock()
			return resp, err
		}))
		client2 := &http.Client{Transport: waiter.NewTransport(fp.lim, base, opts...)}
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					tr := &tracked{id: (p*workers+w)*1_000_000 + i}
					fp.mu.Lock()
					fp.reqs[tr.id] = tr
					fp.mu.Unlock()
					req, _ := http.NewRequestWithContext(context.WithValue(ctx, trackedKey{}, tr), http.MethodGet, srv.URL, nil)
					req.Header.Set("X-Req", strconv.Itoa(tr.id))
					req.Header.Set("X-Proc", strconv.Itoa(p))
					if resp, err := client2.Do(req); err == nil {
						resp.Body.Close()
					} else if ctx.Err() == nil {
						t.Errorf("request %d: %v", tr.id, err)
					}
				}
			}()
		}
	}

	// T as the fleet was told it, once the stop's answer is read
	select {
	case <-announced:
	case <-time.After(30 * time.Second):
		t.Fatalf("the vendor got fewer than %d requests in 30s, the stop is announced on the %dth", announce, announce)
	}
	readAt := func(proc, id int) (time.Time, bool) {
		p := ps[proc]
		p.mu.Lock()
		defer p.mu.Unlock()
		read, ok := p.readAt[id]
		return read, ok
	}
	var end time.Time
	for end.IsZero() {
		mu.Lock()
		id := stopID
		tell := tells[id]
		mu.Unlock()
		if read, ok := readAt(id/(workers*1_000_000), id); ok {
			end = tell.from(read)
		} else {
			time.Sleep(ms)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for seen := 0; seen < after; time.Sleep(10 * ms) {
		if time.Now().After(deadline) {
			t.Fatalf("the vendor saw %d requests in the 30s after T, want %d: the fleet did not go again", seen, after)
		}
		mu.Lock()
		seen = 0
		for _, a := range arrivals {
			if !a.at.Before(end) {
				seen++
			}
		}
		mu.Unlock()
	}
	cancel()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if len(pauses) == 0 {
		t.Fatalf("no pause set")
	}
	// Each pause ends in Redis no later than the end its answer told plus the time
	// from the answer's read to Pause's return (the pause starts when its script runs).
	firstPaused, endUpper := pauses[0].at, end
	for _, pr := range pauses {
		if pr.at.Before(firstPaused) {
			firstPaused = pr.at
		}
		read, _ := readAt(pr.proc, pr.id)
		told := tells[pr.id].from(read)
		if e := told.Add(pr.at.Sub(read)); e.After(endUpper) {
			endUpper = e
		}
		// the pause (and this process's hold, of the same length) was set between the
		// read and Paused: it ends at the told end, no earlier and no later
		if lo, hi := told.Sub(pr.at), told.Sub(read); pr.d < lo || pr.d > hi {
			t.Errorf("request %d's answer told %v from its read; paused %v, want within [%v, %v]", pr.id, told.Sub(read), pr.d, lo, hi)
		}
	}
	// before T: each request on its way, or a failure of the fleet to hold it back
	onTheirWay := 0
	for _, a := range arrivals {
		if a.id == stopID || a.at.Before(stopAt) || !a.at.Before(end) {
			continue
		}
		p := ps[a.proc]
		p.mu.Lock()
		tr := p.reqs[a.id]
		p.mu.Unlock()
		booked := time.Unix(0, tr.waitAt.Load())
		held := false
		p.lim.mu.Lock()
		for _, h := range p.lim.holds {
			held = held || tr.waitSeq.Load() > h.seq && a.at.Before(h.until)
		}
		p.lim.mu.Unlock()
		switch {
		case booked.After(firstPaused):
			t.Errorf("request %d of process %d booked %v after the pause reached Redis and reached the vendor %v before T", a.id, a.proc, booked.Sub(firstPaused), end.Sub(a.at))
		case held:
			t.Errorf("request %d of process %d began its WaitN after its process held and reached the vendor %v before T", a.id, a.proc, end.Sub(a.at))
		default:
			onTheirWay++
		}
	}
	// going again
	var first redistest.Grant
	for _, p := range ps {
		for _, g := range p.grants.List() {
			if !g.At.Before(end) && (first.At.IsZero() || g.At.Before(first.At)) {
				first = g
			}
		}
	}
	if first.At.IsZero() {
		t.Fatalf("no permit granted at or after T")
	}
	ran := first.At.Add(-first.Wait)
	from := end
	for _, e := range []time.Time{endUpper, ran} {
		if e.After(from) {
			from = e
		}
	}
	if late := first.At.Sub(from); late > resumeBy {
		t.Errorf("the first permit at or after T took effect %v after T (the pause's end in Redis at most %v after T, its script ran %v after T), want within %v of the latest",
			first.At.Sub(end), endUpper.Sub(end), ran.Sub(end), resumeBy)
	}
	var firstArrival time.Time
	for _, a := range arrivals {
		if !a.at.Before(end) && (firstArrival.IsZero() || a.at.Before(firstArrival)) {
			firstArrival = a.at
		}
	}
	redistest.Figure(t, "%s: stop told at +0 for %v; pause in Redis by +%v; before T the vendor got %d requests, all on their way; first permit after T at T%+v, first request at the vendor T%+v",
		b.Kind, end.Sub(stopAt).Round(ms), firstPaused.Sub(stopAt).Round(ms), onTheirWay,
		first.At.Sub(end).Round(100*time.Microsecond), firstArrival.Sub(end).Round(100*time.Microsecond))
}
