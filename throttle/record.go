package throttle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/redis/go-redis/v9"
)

// ErrNoRecord: the key has no record of its algorithm and limits (no process used it
// lately). ReadRecord returns it.
var ErrNoRecord = errors.New("jobthrottle: the key has no record of its limits")

// Record is what a key's record says: the algorithm and limits of the Limiters that
// use the key, as the last process to write it had them. Every Limiter writes it, in a
// call it makes anyway, once per quarter of its life per process; it lives 10 seconds
// or three times the longest period, whichever is longer, so it goes soon after the
// key falls idle. The operator's tools (cmd/jobthrottle) read it.
type Record struct {
	Algorithm Algorithm
	Limits    []Limit
	Buckets   int           // the sub-buckets (WithBuckets) a SlidingCounter counts by
	TTL       time.Duration // until the record expires, unless a process writes it again
}

// ReadRecord reads key's record (see Record), writing nothing. Among opts only
// WithKeyPrefix and WithCallTimeout matter. It returns an error wrapping ErrNoRecord
// when there is none, ErrCorruptState when the key holds something else, and Redis
// errors as Inspect, by ctx's deadline and the call timeout whatever Redis does.
func ReadRecord(ctx context.Context, rdb redis.UniversalClient, key string, opts ...Option) (Record, error) {
	c := newConfig()
	for _, o := range opts {
		o.applyLimiter(c)
	}
	tag, err := prepare(rdb, key, c)
	if err != nil {
		return Record{}, err
	}
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	name := keys.Name(tag, keys.RecordKey)
	var get *redis.StringCmd
	var ttl *redis.DurationCmd
	cl := clientFor(rdb)
	read := &request{ctx: ctx, t: &target{key: key, tag: tag}, ks: cl.key(tag), timeout: callTimeout(c.callTimeout, rdb)}
	err = cl.bounded(read, func(rctx context.Context) error {
		pipe := rdb.Pipeline() // one hash slot: one node
		get, ttl = pipe.Get(rctx, name), pipe.PTTL(rctx, name)
		if _, err := pipe.Exec(rctx); err != nil && !errors.Is(err, redis.Nil) { // Nil: no record
			return scriptError(ctx, key, err)
		}
		return nil
	})
	if err != nil {
		return Record{}, err
	}
	text, err := get.Result()
	if errors.Is(err, redis.Nil) {
		return Record{}, fmt.Errorf("%w: key %q (%s)", ErrNoRecord, key, name)
	}
	if err != nil {
		return Record{}, scriptError(ctx, key, err)
	}
	kr, err := keys.ParseRecord(text)
	if err != nil {
		return Record{}, fmt.Errorf("%w: key %q: %v", ErrCorruptState, key, err)
	}
	r := Record{Algorithm: Algorithm(slices.IndexFunc(algorithms[:], func(a algorithm) bool { return a.suffix == kr.State })),
		Buckets: kr.Buckets, TTL: max(0, ttl.Val())}
	for _, l := range kr.Limits {
		lim := Limit{Rate: l.Rate, Period: l.Period, Burst: l.Burst}
		if err := lim.validate(r.Algorithm); err != nil {
			return Record{}, fmt.Errorf("%w: key %q: record %q: %v", ErrCorruptState, key, text, err)
		}
		r.Limits = append(r.Limits, lim)
	}
	return r, nil
}
