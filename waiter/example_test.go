package waiter_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
)

// An HTTP client that keeps every process of the fleet under a vendor's limit, and
// backs the whole fleet off when the vendor answers 429 with Retry-After.
func ExampleNewTransport() {
	mr, err := miniredis.Run() // stands in for your Redis
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	// the vendor's API: busy on /busy, for 30 seconds
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/busy" {
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		fmt.Fprintln(w, "ok")
	}))
	defer api.Close()

	// the vendor allows 10 requests in any second: the period has room for the spread
	// of the requests' ways to it (the README's "What holds at the vendor")
	lim, err := throttle.New(rdb, "vendor-api", throttle.Limit{Rate: 10, Period: time.Second + 40*time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: waiter.NewTransport(lim, nil,
		waiter.WithTransportHooks(waiter.TransportHooks{
			Paused: func(_ *http.Request, status int, d time.Duration) {
				fmt.Printf("%d: every process pauses for %v\n", status, d)
			},
		}))}

	for _, path := range []string{"/items", "/busy"} {
		resp, err := client.Get(api.URL + path)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(path, resp.Status)
	}

	// the limiter is paused for everyone using its key
	res, err := lim.Allow(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("allowed: %v, retry in %v\n", res.Allowed, res.RetryAfter.Round(time.Second))
	// Output:
	// /items 200 OK
	// 429: every process pauses for 30s
	// /busy 429 Too Many Requests
	// allowed: false, retry in 30s
}

// One limiter per endpoint: the vendor's search API has a limit of its own, and a
// search costs two permits of it.
func ExampleNewTransportFunc() {
	mr, err := miniredis.Run() // stands in for your Redis
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	}))
	defer api.Close()

	search, err := throttle.New(rdb, "vendor-search", throttle.PerMinute(30))
	if err != nil {
		log.Fatal(err)
	}
	rest, err := throttle.New(rdb, "vendor-api", throttle.Limit{Rate: 10, Period: time.Second + 40*time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	choose := func(req *http.Request) (waiter.Reserver, int, error) {
		if strings.HasPrefix(req.URL.Path, "/search") {
			return search, 2, nil
		}
		return rest, 1, nil
	}
	client := &http.Client{Transport: waiter.NewTransportFunc(choose, nil,
		waiter.WithRateLimitHeaders(4), // pause when the vendor says at most 4 are left
		waiter.WithRetries(1))}         // send a 429 again once, after the pause

	for _, path := range []string{"/items", "/search?q=x"} {
		resp, err := client.Get(api.URL + path)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(path, resp.Status)
	}
	res, err := search.AllowN(context.Background(), 0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("search permits left this minute:", res.Remaining)
	// Output:
	// /items 200 OK
	// /search?q=x 200 OK
	// search permits left this minute: 28
}
