package throttle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/redis/go-redis/v9"
)

// ErrNoRecord: the key has no record of its algorithm and limits (no process used it
// lately). ReadRecord returns it.
var ErrNoRecord = errors.New("jobthrottle: the key has no record of its limits")

// Record is what a key's record says: the algorithm and limits of the Limiters that
// use the key, as the last process to write its state had them (the head of its meta,
// internal/protocol). It lives as long as the key's state. The operator's tools
// (cmd/jobthrottle) read it.
type Record struct {
	Algorithm Algorithm
	Limits    []Limit
	Buckets   int           // the sub-buckets (WithBuckets) a SlidingCounter counts by
	TTL       time.Duration // until the state, and so the record, expires
}

// ReadRecord reads key's record (see Record), writing nothing. Among opts only
// WithKeyPrefix and WithCallTimeout matter. It returns an error wrapping ErrNoRecord
// when there is none, ErrCorruptState when the key holds something else, and Redis
// errors as Inspect, by ctx's deadline and the call timeout whatever Redis does.
func ReadRecord(ctx context.Context, rdb redis.UniversalClient, key string, opts ...Option) (Record, error) {
	c, tag, err := prepare(rdb, key, opts, Option.applyLimiter)
	if err != nil {
		return Record{}, err
	}
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	name := keys.Name(tag, keys.State)
	var get, first *redis.StringCmd
	var ttl *redis.DurationCmd
	cl := clientFor(rdb)
	read := &request{ctx: ctx, t: &target{key: key, tag: tag}, ks: cl.key(tag), timeout: callTimeout(c.callTimeout, rdb)}
	err = cl.bounded(read, func(rctx context.Context) error {
		pipe := rdb.Pipeline() // one hash slot: one node
		get, first, ttl = pipe.Get(rctx, name), pipe.LIndex(rctx, name, 0), pipe.PTTL(rctx, name)
		_, _ = pipe.Exec(rctx)
		for _, err := range []error{get.Err(), first.Err(), ttl.Err()} { // Nil: no state; WRONGTYPE: the other read's
			if err != nil && !errors.Is(err, redis.Nil) && !redis.HasErrorPrefix(err, "WRONGTYPE") {
				return scriptError(ctx, key, err)
			}
		}
		return nil
	})
	if err != nil {
		return Record{}, err
	}
	text, err := get.Result() // a string's "<numbers>\n<meta>", or a list's first element
	if redis.HasErrorPrefix(err, "WRONGTYPE") {
		text, err = first.Result()
	} else if err == nil {
		_, text, _ = strings.Cut(text, "\n")
	}
	if errors.Is(err, redis.Nil) {
		return Record{}, fmt.Errorf("%w: key %q (%s)", ErrNoRecord, key, name)
	}
	if err != nil {
		return Record{}, scriptError(ctx, key, err)
	}
	m, err := keys.ParseMeta(text)
	if err != nil {
		return Record{}, fmt.Errorf("%w: key %q: %v", ErrCorruptState, key, err)
	}
	h, _ := keys.ParseHead(m.Head) // ParseMeta read it
	r := Record{Algorithm: Algorithm(slices.IndexFunc(algorithms[:], func(a algorithm) bool { return a.tag == h.Alg })),
		Limits: limitsOf(h), Buckets: h.Buckets, TTL: max(0, ttl.Val())}
	for _, lim := range r.Limits {
		if err := lim.validate(r.Algorithm); err != nil {
			return Record{}, fmt.Errorf("%w: key %q: record %q: %v", ErrCorruptState, key, m.Head, err)
		}
	}
	return r, nil
}

// limitsOf returns a head's limits.
func limitsOf(h keys.Head) []Limit {
	var limits []Limit
	for _, l := range h.Limits {
		limits = append(limits, Limit{Rate: l.Rate, Period: l.Period, Burst: l.Burst, Unit: l.Unit})
	}
	return limits
}
