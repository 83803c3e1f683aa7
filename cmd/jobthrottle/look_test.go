package main

import (
	"context"
	"fmt"
	"github.com/jobthrottle/jobthrottle/internal/booking"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// plant writes a foreign key: of another Redis type than jobthrottle's for suffix s
// (wrongType), or of its type with content jobthrottle does not write.
func plant(ctx context.Context, rdb redis.UniversalClient, name, s string, wrongType bool) error {
	if err := rdb.Del(ctx, name).Err(); err != nil { // one of the limiter's own, maybe
		return err
	}
	typ := keys.Type(s)
	switch {
	case wrongType && typ == "string":
		return rdb.HSet(ctx, name, "owner", "someone else").Err()
	case wrongType && typ == "list":
		return rdb.Set(ctx, name, "someone else's", 0).Err()
	case wrongType:
		return rdb.SAdd(ctx, name, "someone else's").Err()
	case typ == "string":
		return rdb.Set(ctx, name, "someone else's", 0).Err()
	case typ == "list":
		return rdb.RPush(ctx, name, "12", "someone else's").Err()
	}
	return rdb.ZAdd(ctx, name, redis.Z{Score: 100, Member: "alice"}).Err()
}

// snapshot is a key's type and whole content, to tell whether a command touched it.
func snapshot(ctx context.Context, rdb redis.UniversalClient, name string) string {
	typ := rdb.Type(ctx, name).Val()
	var v any
	switch typ {
	case "string":
		v = rdb.Get(ctx, name).Val()
	case "list":
		v = rdb.LRange(ctx, name, 0, -1).Val()
	case "zset":
		v = rdb.ZRangeWithScores(ctx, name, 0, -1).Val()
	case "hash":
		v = rdb.HGetAll(ctx, name).Val()
	case "set":
		v = rdb.SMembers(ctx, name).Val()
	}
	return fmt.Sprintf("%s %v ttl=%v", typ, v, rdb.TTL(ctx, name).Val())
}

// A key under a limiter's tag whose type or content is not jobthrottle's, of every
// suffix, is left alone by every command, which names it and says why: ls, show,
// watch, pause, resume, set, unset and reset (a booking's key: ls and reset, the
// commands that look for bookings). Beside it the limiter's own keys are used as
// usual (reset deletes its state). pause, resume, set and unset refuse a foreign
// control key: they would overwrite it.
func TestForeignKeys(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, s := range append(keys.Suffixes(), keys.Booking+"task-1") {
			for _, wrongType := range []bool{true, false} {
				what := "text"
				if wrongType {
					what = "type"
				}
				key := "f-" + strings.TrimSuffix(s, ":task-1") + "-" + what
				t.Run(key, func(t *testing.T) {
					// the limiter's own keys: a state (a token bucket's where the foreign key
					// is a sliding window's) and the record
					alg, state := throttle.SlidingWindow, keys.SlidingWindow
					if s == keys.SlidingWindow {
						alg, state = throttle.TokenBucket, keys.TokenBucket
					}
					lim, err := throttle.New(b.Client, key, throttle.PerMinute(10), throttle.WithAlgorithm(alg), throttle.WithKeyPrefix(b.Prefix))
					if err != nil {
						t.Fatal(err)
					}
					if _, err := lim.AllowN(ctx, 2); err != nil {
						t.Fatal(err)
					}
					tag, _ := keys.Tag(b.Prefix, key)
					name := keys.Name(tag, s)
					if err := plant(ctx, b.Client, name, s, wrongType); err != nil {
						t.Fatal(err)
					}
					before := snapshot(ctx, b.Client, name)
					named := "left alone: " + name + " is not jobthrottle's ("
					booking := strings.HasPrefix(s, keys.Booking)
					says := func(what, got string) {
						t.Helper()
						if !booking {
							mustContain(t, what, got, named)
						}
					}

					code, out, errs := cli(t, b, "", "ls")
					if code != 0 {
						t.Fatalf("ls: status %d: %s", code, errs)
					}
					mustContain(t, "ls", out, named)
					code, out, errs = cli(t, b, "", "show", key)
					says("show", out+errs)
					if s != keys.ControlKey && s != keys.RecordKey && code != 0 { // the key can be shown
						t.Fatalf("show: status %d: %s", code, errs)
					}
					_, out, errs = cli(t, b, "", "watch", "-count", "1", key)
					says("watch", out+errs)
					for _, args := range [][]string{
						{"pause", key, "30s"}, {"resume", key}, {"set", key, "5/1m"}, {"unset", key},
					} {
						code, out, errs = cli(t, b, "", args...)
						says(args[0], out+errs)
						if refused := s == keys.ControlKey; refused != (code != 0) {
							t.Fatalf("%s: status %d (%s), want it refused: %v", args[0], code, errs, refused)
						}
					}
					code, out, errs = cli(t, b, "", "reset", "-yes", key)
					if code != 0 {
						t.Fatalf("reset: status %d: %s", code, errs)
					}
					mustContain(t, "reset", out, named, "reset "+key+": deleted "+keys.Name(tag, state))
					if n := b.Client.Exists(ctx, keys.Name(tag, state)).Val(); n != 0 {
						t.Fatalf("reset left the limiter's state")
					}
					if after := snapshot(ctx, b.Client, name); after != before {
						t.Fatalf("%s was touched:\nbefore %s\nafter  %s", name, before, after)
					}
				})
			}
		}
	})
}

// Every key the library writes is one the command takes as jobthrottle's: the four
// algorithms' states, the control key with a pause and an override, the record, a
// task's booking, and a semaphore's leases, queue and queue expiries. (Should the
// scripts write another form, keys.Check must learn it: this test says so.)
func TestLibraryKeysAreOurs(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		opts := []throttle.Option{throttle.WithKeyPrefix(b.Prefix)}
		for _, s := range keys.States() {
			lim, err := throttle.New(b.Client, "lib-"+s, throttle.Limit{Rate: 10, Period: time.Minute, Burst: 12},
				append(opts, throttle.WithAlgorithm(algorithm(s)), throttle.WithLimits(throttle.PerHour(100)))...)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := lim.AllowN(ctx, 3); err != nil {
				t.Fatal(err)
			}
			if _, err := lim.Reserve(ctx, 10, time.Hour); err != nil { // booked ahead
				t.Fatal(err)
			}
			if _, err := lim.Reserve(booking.With(ctx, &booking.Task{ID: "task-1"}), 1, time.Hour); err != nil { // a booking key
				t.Fatal(err)
			}
			if err := lim.Override(ctx, time.Hour, throttle.Limit{Rate: 5, Burst: 6}); err != nil {
				t.Fatal(err)
			}
			if err := lim.Pause(ctx, time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		sem, err := throttle.NewSemaphore(b.Client, "lib-sem", 1, throttle.WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		lease, _, err := sem.TryAcquire(ctx)
		if err != nil || lease == nil {
			t.Fatal(lease, err)
		}
		defer lease.Release(ctx)
		actx, cancel := context.WithCancel(ctx)
		queued := make(chan error, 1)
		go func() { // waits in the queue until cancelled
			l, err := sem.Acquire(actx)
			if l != nil {
				l.Release(ctx)
			}
			queued <- err
		}()
		defer func() { cancel(); <-queued }()
		tag, _ := keys.Tag(b.Prefix, "lib-sem")
		for i := 0; b.Client.Exists(ctx, keys.Name(tag, keys.Queue)).Val() == 0; i++ {
			if i == 500 {
				t.Fatal("the waiter did not queue in 5s")
			}
			time.Sleep(10 * time.Millisecond)
		}

		code, out, errs := cli(t, b, "", "ls")
		if code != 0 || strings.Contains(out, "left alone") {
			t.Fatalf("ls: status %d %s:\n%s", code, errs, out)
		}
		tool := &tool{o: &options{prefix: b.Prefix}, rdb: b.Client}
		var suffixes []string
		for _, key := range []string{"lib-sw", "lib-sc", "lib-tb", "lib-fw", "lib-sem"} {
			ks, err := tool.look(ctx, key, true)
			if err != nil {
				t.Fatal(err)
			}
			if len(ks.foreign) > 0 {
				t.Errorf("%s: %s", key, notes(ks.foreign))
			}
			for s := range ks.ours {
				suffixes = append(suffixes, s)
			}
		}
		slices.Sort(suffixes)
		suffixes = slices.Compact(suffixes)
		if got, want := strings.Join(suffixes, " "), "bk:task-1 conf fw pause sc sem semq semx sw tb"; got != want {
			t.Errorf("suffixes written: %s; want %s", got, want)
		}
	})
}
