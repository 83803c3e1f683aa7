package throttle

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/booking"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// keyspace returns the keys and the keys with a TTL that INFO keyspace reports for db0.
func keyspace(ctx context.Context, c *redis.Client) (keys, expires int64, err error) {
	info, err := c.Info(ctx, "keyspace").Result()
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "db0:") {
			continue
		}
		for _, f := range strings.Split(strings.TrimSpace(line[4:]), ",") {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "keys":
				keys = n
			case "expires":
				expires = n
			}
		}
	}
	return keys, expires, nil
}

// 20k keys across every algorithm, the pause, bookings (plain and a task's) and the
// semaphore (leases leaked, places in the queue left) are touched once and left idle,
// on a real redis-server of the test's own: while they live, every key has a TTL
// (INFO keyspace's expires equals its keys at every sample, every 100ms, and a full
// SCAN with PTTL finds none without one); after the longest TTL Redis's own expiry
// removes them all, with no client touching a key. Periods are short (1s; bookings and
// leases up to 2s; the keys' records, whose life the test cuts from its floor of 10s
// to three periods, 3s) so it takes seconds.
// Tolerances: the last keys must be gone 1s after the longest TTL (Redis's active
// expiry runs 10 times a second and is budgeted; the measured time is logged).
func TestIdleKeysExpire(t *testing.T) {
	parallel(t)
	_, c := startOwnServer(t)
	ctx := context.Background()
	const (
		perKind = 2_223 // 9 kinds: 20k keys
		workers = 64
	)
	limit := Limit{Rate: 5, Period: time.Second}
	// the longest TTL: a booking 1s ahead lasts a period after it, a task's booking
	// record a second after it; leases 2s
	longest := 2*time.Second + 50*ms
	type kind struct {
		name  string
		touch func(i int) error
	}
	lim := func(alg Algorithm, i int, key string) (*Limiter, error) {
		return New(c, fmt.Sprintf("%s%d", key, i), limit, WithAlgorithm(alg))
	}
	kinds := []kind{}
	for _, alg := range allAlgorithms {
		kinds = append(kinds, kind{alg.String(), func(i int) error {
			l, err := lim(alg, i, "idle-"+alg.String())
			if err == nil {
				_, err = l.AllowN(ctx, 1)
			}
			return err
		}})
	}
	kinds = append(kinds,
		kind{"booked ahead", func(i int) error { // a full window, then a booking a period ahead
			l, err := lim(allAlgorithms[i%4], i, "idle-booked-")
			if err == nil {
				_, err = l.AllowN(ctx, 5)
			}
			if err == nil {
				_, err = l.Reserve(ctx, 1, 2*time.Second)
			}
			return err
		}},
		kind{"booked for a task", func(i int) error { // a full window, then a task's booking ahead (asynq)
			l, err := lim(allAlgorithms[i%4], i, "idle-task-")
			if err == nil {
				_, err = l.AllowN(ctx, 5)
			}
			if err == nil {
				_, err = l.Reserve(booking.With(ctx, &booking.Task{ID: fmt.Sprintf("task-%d", i)}), 1, 2*time.Second)
			}
			return err
		}},
		kind{"paused", func(i int) error {
			l, err := lim(SlidingWindow, i, "idle-paused-")
			if err == nil {
				err = l.Pause(ctx, time.Second)
			}
			return err
		}},
		kind{"semaphore lease leaked", func(i int) error {
			s, err := NewSemaphore(c, fmt.Sprintf("idle-sem%d", i), 1, WithLeaseTTL(2*time.Second))
			if err == nil {
				_, _, err = s.TryAcquire(ctx) // never released
			}
			return err
		}},
		kind{"semaphore place left", func(i int) error { // a lease, and a place in its queue
			s, err := NewSemaphore(c, fmt.Sprintf("idle-semq%d", i), 1, WithLeaseTTL(time.Second))
			if err == nil {
				_, _, err = s.TryAcquire(ctx)
			}
			if err == nil {
				token := newToken()
				_, err = s.call(ctx, semAcquire, token, token, true, false)
			}
			return err
		}},
	)

	// sample the keyspace while the keys are made and while they idle
	var samples, bad atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan error, 1)
	go func() {
		tick := time.NewTicker(100 * ms)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				sampled <- nil
				return
			case <-tick.C:
			}
			keys, expires, err := keyspace(ctx, c)
			if err != nil {
				sampled <- err
				return
			}
			samples.Add(1)
			if keys != expires {
				bad.Add(1)
				t.Errorf("INFO keyspace: %d keys, %d with a TTL", keys, expires)
			}
		}
	}()

	start := time.Now()
	var failed atomic.Value
	for _, k := range kinds {
		var wg sync.WaitGroup
		next := atomic.Int64{}
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := int(next.Add(1)); i <= perKind; i = int(next.Add(1)) {
					if err := k.touch(i); err != nil {
						failed.Store(fmt.Errorf("%s %d: %w", k.name, i, err))
						return
					}
				}
			}()
		}
		wg.Wait()
		if err, _ := failed.Load().(error); err != nil {
			t.Fatal(err)
		}
	}
	lastTouch := time.Now()
	made, _ := c.DBSize(ctx).Result()
	redistest.Figure(t, "touched %d keys of %d kinds in %v; %d keys live at the end (the first have expired)",
		perKind*len(kinds), len(kinds), lastTouch.Sub(start).Round(ms), made)

	// one full pass: every live key has a TTL
	var scanned, noTTL int
	iter := c.Scan(ctx, 0, "*", 5000).Iterator()
	var batch []string
	flush := func() {
		pipe := c.Pipeline()
		cmds := make([]*redis.DurationCmd, len(batch))
		for i, k := range batch {
			cmds[i] = pipe.PTTL(ctx, k)
		}
		_, _ = pipe.Exec(ctx)
		for i, cmd := range cmds {
			if d := cmd.Val(); d == -1 { // -2: expired meanwhile
				noTTL++
				t.Errorf("key %q has no TTL", batch[i])
			}
		}
		scanned += len(batch)
		batch = batch[:0]
	}
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 1000 {
			flush()
		}
	}
	flush()
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}

	// gone after the longest TTL, by Redis's expiry alone
	var goneAfter time.Duration
	for {
		n, err := c.DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			goneAfter = time.Since(lastTouch)
			break
		}
		if time.Since(lastTouch) > longest+time.Second {
			t.Fatalf("%d keys still there %v after the last touch (longest TTL %v)", n, time.Since(lastTouch), longest)
		}
		time.Sleep(10 * ms)
	}
	close(stop)
	if err := <-sampled; err != nil {
		t.Fatal(err)
	}
	redistest.Figure(t, "SCAN with PTTL: %d keys, %d without a TTL; INFO keyspace sampled %d times every 100ms, keys != expires in %d",
		scanned, noTTL, samples.Load(), bad.Load())
	redistest.Figure(t, "all gone %v after the last touch (longest TTL %v)", goneAfter.Round(ms), longest)
}

// Leaked semaphore leases free their slots within TTL + 100ms: on a real server (the
// test's own), holders take the only slot of 200 semaphores and vanish without
// releasing it. Each semaphore is tried twice, at its own times, each check on its
// own goroutine (a sequential loop of 1000 checks fell behind on a loaded machine):
//   - halfway through its lease's TTL (counted from when the call that got it was
//     sent), the slot must still be taken. Such a check proves something only if it
//     returned before the TTL ended: one later (the machine kept it from running for
//     TTL/2 = 500ms; under load, with 500 semaphores and TTL 500ms, 385 were late by
//     250ms) is counted, not judged, and a lease it got is released. At least one
//     must be on time;
//   - 100ms after its TTL (counted from when the grant came back), a newcomer must
//     get it; being late does not change that answer, so every such check counts.
//
// (TestSemaphoreHoldersKilled checks the same with holder processes killed -9.)
func TestLeakedLeasesFreeTheirSlots(t *testing.T) {
	_, c := startOwnServer(t)
	ctx := context.Background()
	const n, ttl = 200, time.Second
	sems := make([]*Semaphore, n)
	var (
		wg                    sync.WaitGroup
		held, freed, lateHeld atomic.Int64
	)
	for i := range sems {
		s, err := NewSemaphore(c, fmt.Sprintf("leak%d", i), 1, WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		sems[i] = s
		sent := time.Now()
		if l, _, err := s.TryAcquire(ctx); err != nil || l == nil {
			t.Fatalf("TryAcquire: %v %v", l, err)
		}
		got := time.Now()
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(sent.Add(ttl / 2)))
			l, _, err := s.TryAcquire(ctx)
			switch {
			case err != nil:
				t.Error(err)
				return
			case time.Now().After(sent.Add(ttl)):
				lateHeld.Add(1)
				if l != nil { // the leaked lease may have expired: give the slot back
					if err := l.Release(ctx); err != nil {
						t.Error(err)
					}
				}
			case l != nil:
				t.Errorf("semaphore %d: slot free before the leaked lease's TTL", i)
			default:
				held.Add(1)
			}
			time.Sleep(time.Until(got.Add(ttl + 100*ms)))
			if l, _, err := s.TryAcquire(ctx); err != nil {
				t.Error(err)
			} else if l == nil {
				t.Errorf("semaphore %d: slot still taken 100ms after the leaked lease's TTL", i)
			} else {
				freed.Add(1)
			}
		}()
	}
	wg.Wait()
	if held.Load() == 0 {
		t.Fatalf("only %d of %d still-taken checks returned before the TTL ended (%d late)", held.Load(), n, lateHeld.Load())
	}
	redistest.Figure(t, "%d leases leaked (TTL %v): slot still taken at TTL/2 in %d checks (%d late, not judged), free again by TTL + 100ms in %d checks",
		n, ttl, held.Load(), lateHeld.Load(), freed.Load())
}
