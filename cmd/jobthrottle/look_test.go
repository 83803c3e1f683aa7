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
	case wrongType && typ == "zset":
		return rdb.SAdd(ctx, name, "someone else's").Err()
	case wrongType:
		return rdb.HSet(ctx, name, "owner", "someone else").Err()
	case typ == "zset":
		return rdb.ZAdd(ctx, name, redis.Z{Score: 100, Member: "alice"}).Err()
	}
	return rdb.Set(ctx, name, "someone else's", 0).Err() // not a state: no meta; not a booking
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
// watch, pause, resume, set, unset, weight and reset (a tenant's caps or a booking:
// ls and reset, the commands that look for them). Beside it the limiter's own keys
// are used as usual (reset deletes them). The commands that set something on the key
// refuse a foreign state: they would overwrite it. show and watch cannot read a key
// whose state, or fair share's queue of another type, is foreign (Inspect reads
// both), and say why.
func TestForeignKeys(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, s := range []string{keys.State, keys.FairQueue, keys.Tenant + "acme", keys.Booking + "task-1",
			keys.Leases, keys.Queue, keys.QueueExpiry} {
			for _, wrongType := range []bool{true, false} {
				what := "text"
				if wrongType {
					what = "type"
				}
				key := "f-" + strings.NewReplacer(":acme", "", ":task-1", "").Replace(s) + "-" + what
				t.Run(key, func(t *testing.T) {
					// the limiter's own keys: its state, a tenant's caps, the fair share's
					// queue and a task's booking
					lim, err := throttle.New(b.Client, key, throttle.PerMinute(10), throttle.WithTenantLimits(throttle.PerMinute(5)),
						throttle.WithKeyPrefix(b.Prefix))
					if err != nil {
						t.Fatal(err)
					}
					if r, err := lim.Tenant("acme").AllowN(ctx, 2); err != nil || !r.Allowed {
						t.Fatal(r, err)
					}
					if s != keys.Booking+"task-1" {
						if _, err := lim.Tenant("acme").Reserve(booking.With(ctx, &booking.Task{ID: "task-1"}), 1, time.Minute); err != nil {
							t.Fatal(err)
						}
					}
					tag, _ := keys.Tag(b.Prefix, key)
					name := keys.Name(tag, s)
					if err := plant(ctx, b.Client, name, s, wrongType); err != nil {
						t.Fatal(err)
					}
					before := snapshot(ctx, b.Client, name)
					named := "left alone: " + name + " is not jobthrottle's ("
					scanned := strings.HasPrefix(s, keys.Booking) || strings.HasPrefix(s, keys.Tenant)
					says := func(what, got string) {
						t.Helper()
						if !scanned {
							mustContain(t, what, got, named)
						}
					}

					code, out, errs := cli(t, b, "", "ls")
					if code != 0 {
						t.Fatalf("ls: status %d: %s", code, errs)
					}
					mustContain(t, "ls", out, named)
					unreadable := s == keys.State || s == keys.FairQueue && wrongType
					code, out, errs = cli(t, b, "", "show", key)
					says("show", out+errs)
					if unreadable != (code != 0) {
						t.Fatalf("show: status %d (%s), want it to fail: %v", code, errs, unreadable)
					}
					_, out, errs = cli(t, b, "", "watch", "-count", "1", key)
					says("watch", out+errs)
					for _, args := range [][]string{
						{"pause", key, "30s"}, {"resume", key}, {"set", key, "5/1m"}, {"unset", key},
						{"weight", key, "acme", "3", "1m"}, {"weight", key, "acme", "clear"},
					} {
						code, out, errs = cli(t, b, "", args...)
						says(args[0], out+errs)
						if refused := s == keys.State; refused != (code != 0) {
							t.Fatalf("%v: status %d (%s), want it refused: %v", args, code, errs, refused)
						}
					}
					var ours []string // the limiter's keys, which reset deletes
					for _, o := range []string{keys.State, keys.Tenant + "acme", keys.FairQueue, keys.Booking + "task-1"} {
						if o != s && b.Client.Exists(ctx, keys.Name(tag, o)).Val() == 1 {
							ours = append(ours, keys.Name(tag, o))
						}
					}
					if len(ours) == 0 {
						t.Fatal("the limiter has no key of its own beside the foreign one: the test proves nothing")
					}
					code, out, errs = cli(t, b, "", "reset", "-yes", key)
					if code != 0 {
						t.Fatalf("reset: status %d: %s", code, errs)
					}
					mustContain(t, "reset", out, named, "reset "+key+": deleted ")
					for _, o := range ours {
						if b.Client.Exists(ctx, o).Val() != 0 {
							t.Fatalf("reset left %s:\n%s", o, out)
						}
					}
					if after := snapshot(ctx, b.Client, name); after != before {
						t.Fatalf("%s was touched:\nbefore %s\nafter  %s", name, before, after)
					}
				})
			}
		}
	})
}

// Every key the library writes is one the command takes as jobthrottle's, of every
// algorithm: the state with a meta holding a pause, an override, the fair share's
// clock, an operator's weight and another process's head (drift), tenants' caps and
// the fair share's queue (tenants' names of any bytes), a task's booking, and a
// semaphore's leases, queue and queue expiries. (Should the scripts write another
// form, keys.Check must learn it: this test says so.)
func TestLibraryKeysAreOurs(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		opts := []throttle.Option{throttle.WithKeyPrefix(b.Prefix), throttle.WithLimits(throttle.PerHour(100)),
			throttle.WithTenantLimits(throttle.Limit{Rate: 5, Period: time.Minute, Burst: 6})}
		tenants := []string{"acme", "ten\n7 x", "w 1 2 3 b"} // names that look like meta lines and members
		var libKeys []string
		for _, a := range keys.Algorithms() {
			key := "lib-" + a
			libKeys = append(libKeys, key)
			lim, err := throttle.New(b.Client, key, throttle.Limit{Rate: 10, Period: time.Minute, Burst: 12},
				append(opts, throttle.WithAlgorithm(algorithm(a)))...)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := lim.AllowN(ctx, 3); err != nil {
				t.Fatal(err)
			}
			for i, name := range tenants {
				if r, err := lim.Tenant(name, throttle.Weight(float64(i+1))).Allow(ctx); err != nil || !r.Allowed {
					t.Fatal(r, err)
				}
			}
			if _, err := lim.Reserve(ctx, 4, time.Hour); err != nil { // the limit used up
				t.Fatal(err)
			}
			if _, err := lim.Reserve(booking.With(ctx, &booking.Task{ID: "task-1"}), 1, time.Hour); err != nil { // a booking key, ahead
				t.Fatal(err)
			}
			other, err := throttle.New(b.Client, key, throttle.Limit{Rate: 20, Period: time.Minute, Burst: 12}, // another process's limits
				append(opts, throttle.WithAlgorithm(algorithm(a)))...)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := other.Tenant(tenants[0]).Allow(ctx); err != nil {
				t.Fatal(err)
			}
			if err := lim.Tenant(tenants[1]).OverrideWeight(ctx, time.Hour, 2.5); err != nil {
				t.Fatal(err)
			}
			if err := lim.Override(ctx, time.Hour, throttle.Limit{Rate: 5, Burst: 6}); err != nil {
				t.Fatal(err)
			}
			if err := lim.Pause(ctx, time.Minute); err != nil {
				t.Fatal(err)
			}
			m := stateMeta(t, b, key)
			if m.PauseEnd == 0 || m.Override == nil || m.Fair == nil || len(m.Weights) != 1 || m.Drift == "" {
				t.Fatalf("%s: the meta lacks a line the test means to check: %+v", key, m)
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
		for _, key := range append(libKeys, "lib-sem") {
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
		want := []string{"bk:task-1", "l", "q", "sem", "semq", "semx"}
		for _, name := range tenants {
			want = append(want, keys.Tenant+name)
		}
		slices.Sort(want)
		if !slices.Equal(suffixes, want) {
			t.Errorf("suffixes written: %q; want %q", suffixes, want)
		}
	})
}

// stateMeta is the meta of key's state, as the command reads it.
func stateMeta(t *testing.T, b *redistest.Backend, key string) keys.Meta {
	t.Helper()
	tool := &tool{o: &options{prefix: b.Prefix}, rdb: b.Client}
	ks, err := tool.look(context.Background(), key, false)
	if err != nil {
		t.Fatal(err)
	}
	if e := ks.foreignOf(keys.State); e != nil || !ks.has(keys.State) {
		t.Fatalf("%s: no state of jobthrottle's (%v)", key, e)
	}
	return ks.meta()
}
