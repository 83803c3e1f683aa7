package throttle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// infoInt returns a field of INFO section.
func infoInt(ctx context.Context, c *redis.Client, section, field string) int64 {
	info, _ := c.Info(ctx, section).Result()
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return -1
}

// A flood of unique keys on a server with a small maxmemory (4mb, of which an empty
// Redis uses about 1mb) while ten limiters are in use (sliding window, 100/s, called
// every 2ms so that their windows stay full, with StateLost hooks): each
// eviction policy's effect on their state. The flood is 30k one-grant sliding-window
// script calls on unique tenants (1-minute period), sent in pipelines as the
// production script call of a key's first grant: it writes the state and, in the same
// call, the key's record. Measured and logged: keys evicted, flood keys kept, the busy
// limiters' state evictions (Redis's keyspace notices) and StateLost's calls, and calls
// that failed. Asserted:
//   - nothing is over-admitted: in any second a busy key granted at most the rate for
//     each state it had (the state it started with, and one more per eviction of it),
//     by the server times of the grants its replies carried; a call that failed
//     granted nothing;
//   - StateLost is never called more often than their state was evicted;
//   - volatile-ttl, which evicts the shortest TTLs first, evicts the busy state and the
//     hook reports it;
//   - noeviction refuses writes with an OOM error, which callers get as ErrUnavailable,
//     and evicts nothing.
func TestMaxmemoryFlood(t *testing.T) {
	parallel(t)
	for _, policy := range []string{"allkeys-lru", "allkeys-lfu", "volatile-lru", "volatile-ttl", "allkeys-random", "noeviction"} {
		t.Run(policy, func(t *testing.T) {
			_, c := startOwnServer(t, "--maxmemory", "4mb", "--maxmemory-policy", policy, "--notify-keyspace-events", "Ee")
			ctx := context.Background()
			const active, floodN, rate = 10, 30_000, 100

			// the evictions of the busy limiters' keys, as Redis reports them
			sub := c.Subscribe(ctx, "__keyevent@0__:evicted")
			defer sub.Close()
			if _, err := sub.Receive(ctx); err != nil {
				t.Fatal(err)
			}
			var (
				busyEvicted atomic.Int64
				evictedMu   sync.Mutex
				evictedKey  = map[string]int{} // busy keys' evictions, by key
			)
			const marker = "end of the test's writes"
			allHeard := make(chan struct{})
			go func() {
				for m := range sub.Channel() {
					if strings.HasPrefix(m.Payload, "{jobthrottle:busy-") {
						busyEvicted.Add(1)
						evictedMu.Lock()
						evictedKey[m.Payload]++
						evictedMu.Unlock()
					}
					if m.Payload == marker {
						close(allHeard)
					}
				}
			}()

			grants := redistest.RecordGrants(c)
			var lost, calls, failed atomic.Int64
			var firstErr atomic.Pointer[error] // errors of several types: a Value would panic
			run, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			busy := make([]*Limiter, active)
			for i := range busy {
				l, err := New(c, fmt.Sprintf("busy-%d", i), PerSecond(rate),
					WithHooks(Hooks{StateLost: func(string) { lost.Add(1) }}))
				if err != nil {
					t.Fatal(err)
				}
				busy[i] = l
				wg.Add(1)
				go func() {
					defer wg.Done()
					for run.Err() == nil {
						calls.Add(1)
						if _, err := l.Allow(ctx); err != nil {
							failed.Add(1)
							firstErr.CompareAndSwap(nil, &err)
						}
						time.Sleep(2 * time.Millisecond)
					}
				}()
			}
			time.Sleep(300 * time.Millisecond) // their windows fill

			// the flood's script calls, on a client of their own: each is the call of a
			// key's first grant (one acquire of 1 permit, the limit), as a Limiter of
			// PerMinute(10) makes it
			script := lua.Script("log")
			flood := redis.NewClient(c.Options())
			defer flood.Close()
			if err := script.Load(ctx, flood).Err(); err != nil {
				t.Fatal(err)
			}
			tenant, err := New(flood, "flood", PerMinute(10))
			if err != nil {
				t.Fatal(err)
			}
			args := []any{tenant.t.head, tenant.t.caps, "a 1 0"}
			var floodFailed int
			var floodErr error
			for i := 0; i < floodN; i += 500 {
				pipe := flood.Pipeline()
				for j := i; j < i+500; j++ {
					tag, err := keys.Tag(keys.DefaultPrefix, fmt.Sprintf("flood-%06d", j))
					if err != nil {
						t.Fatal(err)
					}
					script.EvalSha(ctx, pipe, []string{keys.Name(tag, keys.State)}, args...)
				}
				cmds, _ := pipe.Exec(ctx)
				for _, cmd := range cmds {
					if err := cmd.Err(); err != nil {
						floodFailed++
						floodErr = err
					}
				}
			}
			time.Sleep(300 * time.Millisecond) // the busy limiters go on after the flood
			stop()
			wg.Wait()
			// every eviction notice has arrived once a message published after the
			// last write has (a channel's messages come in order; nothing writes now,
			// so nothing is evicted)
			if err := c.Publish(ctx, "__keyevent@0__:evicted", marker).Err(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-allHeard:
			case <-time.After(30 * time.Second):
				t.Fatal("the message published after the last write did not come back within 30s")
			}

			evicted := infoInt(ctx, c, "stats", "evicted_keys")
			kept, _ := c.DBSize(ctx).Result()
			used := infoInt(ctx, c, "memory", "used_memory")
			errText := ""
			if p := firstErr.Load(); p != nil {
				err := *p
				errText = err.Error()
				if strings.Contains(errText, "OOM") && !errors.Is(err, ErrUnavailable) {
					t.Errorf("a full Redis's refusal not reported as unavailable: %v", err)
				}
			}
			byKey := grants.ByKey()
			most, stateEvicted := 0, 0
			for _, l := range busy {
				evictedMu.Lock()
				states := 1 + evictedKey[l.stateKey()]
				evictedMu.Unlock()
				stateEvicted += states - 1
				g := byKey[l.stateKey()]
				if g == nil {
					continue // every call refused (noeviction)
				}
				m := g.MaxInWindow(time.Second)
				most = max(most, m)
				if m > states*rate {
					t.Errorf("%s: %d permits took effect within one second, with %d state(s) (%d evictions): bound %d",
						l.Key(), m, states, states-1, states*rate)
				}
			}
			redistest.Figure(t, "%s: flood of %d keys (%d refused: %v); evicted %d keys, %d left, used_memory %d B; "+
				"%d busy limiters made %d calls, %d failed (%s); their keys were evicted %d times (state keys %d), StateLost called %d times; "+
				"most permits in one second on a busy key %d (rate %d)",
				policy, floodN, floodFailed, floodErr, evicted, kept, used, active, calls.Load(), failed.Load(), errText,
				busyEvicted.Load(), stateEvicted, lost.Load(), most, rate)
			if lost.Load() > busyEvicted.Load() {
				t.Errorf("StateLost called %d times for %d evictions", lost.Load(), busyEvicted.Load())
			}

			switch policy {
			case "volatile-ttl":
				if evicted == 0 || lost.Load() == 0 {
					t.Errorf("volatile-ttl: %d evicted, StateLost called %d times; want the busy states evicted and reported", evicted, lost.Load())
				}
			case "noeviction":
				if evicted != 0 || floodFailed == 0 || floodErr == nil || !strings.Contains(floodErr.Error(), "OOM") {
					t.Errorf("noeviction: %d evicted, %d flood calls refused (%v); want none evicted, OOM refusals", evicted, floodFailed, floodErr)
				}
			default:
				if evicted == 0 {
					t.Errorf("%s: nothing evicted; the flood is too small to test eviction", policy)
				}
			}
		})
	}
}
