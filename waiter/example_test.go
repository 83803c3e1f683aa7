package waiter_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
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

	lim, err := throttle.New(rdb, "vendor-api", throttle.PerSecond(10))
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
