package main

import (
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// upstream is the vendor API the fleet calls: an HTTP server that enforces its own
// rate limit, as a real one does, and answers 429 Too Many Requests (with a
// Retry-After) to a request that would make more than rate requests arrive within any
// period. It knows nothing of Redis or of the fleet's limiter.
type upstream struct {
	*httptest.Server
	rate   int
	period time.Duration

	mu       sync.Mutex
	window   []time.Time // accepted arrivals within the last period
	arrivals []time.Time // every arrival
	rejected int
	bySource map[string]int
}

func newUpstream(rate int, period time.Duration) *upstream {
	u := &upstream{rate: rate, period: period, bySource: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	u.mu.Lock()
	u.arrivals = append(u.arrivals, now)
	u.bySource[r.URL.Query().Get("src")]++
	i := 0
	for i < len(u.window) && now.Sub(u.window[i]) >= u.period {
		i++
	}
	u.window = u.window[i:]
	over := len(u.window) >= u.rate
	if over {
		u.rejected++
	} else {
		u.window = append(u.window, now)
	}
	u.mu.Unlock()
	if over {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

// counts returns the requests received, those answered 429, and those received
// within the last d.
func (u *upstream) counts(d time.Duration) (total, rejected, recent int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	now := time.Now()
	for i := len(u.arrivals) - 1; i >= 0 && now.Sub(u.arrivals[i]) < d; i-- {
		recent++
	}
	return len(u.arrivals), u.rejected, recent
}

// maxInWindow returns the most requests that arrived within any window [s, s+d).
func (u *upstream) maxInWindow(d time.Duration) int {
	u.mu.Lock()
	a := append([]time.Time(nil), u.arrivals...)
	u.mu.Unlock()
	sort.Slice(a, func(i, j int) bool { return a[i].Before(a[j]) })
	return redistest.MaxTimesInWindow(a, d)
}
