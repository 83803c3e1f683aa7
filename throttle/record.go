package throttle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A key's record, {<prefix><key>}:conf, says which algorithm and limits the
// Limiters on the key use, so that an operator's tools (jobthrottle show, watch,
// set) need not be told them. Redis's state keys do not say it: a permit log holds
// grants, a token bucket one time.
//
// It costs the hot path nothing: no script reads it, and a Limiter writes it (SET …
// PX) inside the transaction (or, for a client that never re-sends, the pipeline) of
// a call it makes anyway, once per recordEvery per process (the first call of a
// process writes it), never as a round trip of its own. Only calls that may grant
// carry it (acquires of n >= 1, bookings): AllowN(0) and cancels write nothing. It
// lives recordMinTTL or more (see there).
// Processes with different limits on one key write each their own: the record shows
// the last writer's.

// ErrNoRecord: the key has no record of its algorithm and limits (no process used it
// in the last 10 seconds, or 3 of its periods; or its Limiters predate records).
// ReadRecord returns it.
var ErrNoRecord = errors.New("jobthrottle: the key has no record of its limits")

// Record is what a key's record says: the algorithm and limits of the Limiters that
// use the key, as the last process to write it had them.
type Record struct {
	Algorithm Algorithm
	Limits    []Limit
	Buckets   int           // the sub-buckets (WithBuckets); SlidingCounter counts by them
	TTL       time.Duration // until the record expires, unless a process writes it again
}

// ReadRecord reads key's record (see Record): one GET and one PTTL in a pipeline,
// read-only. Only WithKeyPrefix among opts matters. It returns an error wrapping
// ErrNoRecord when there is none, ErrCorruptState when the key holds something else,
// and Redis errors as Inspect.
func ReadRecord(ctx context.Context, rdb redis.UniversalClient, key string, opts ...Option) (Record, error) {
	c := newConfig()
	for _, o := range opts {
		o.applyLimiter(c)
	}
	tag, err := prepare(rdb, key, c)
	if err != nil {
		return Record{}, err
	}
	pipe := rdb.Pipeline() // one hash slot: one node
	get := pipe.Get(ctx, tag+":conf")
	ttl := pipe.PTTL(ctx, tag+":conf")
	_, _ = pipe.Exec(ctx)
	text, err := get.Result()
	if errors.Is(err, redis.Nil) {
		return Record{}, fmt.Errorf("%w: key %q (%s:conf)", ErrNoRecord, key, tag)
	}
	if err != nil {
		return Record{}, scriptError(ctx, key, err)
	}
	r, err := parseRecord(text)
	if err != nil {
		return Record{}, fmt.Errorf("%w: key %q: record %q: %v", ErrCorruptState, key, text, err)
	}
	r.TTL = max(0, ttl.Val())
	return r, nil
}

// recordMinTTL is the shortest life of a record; tests shorten it. A record lives
// max(recordMinTTL, 3 × the longest time a grant counts) and is written anew every
// quarter of that (at least 2.5s apart) while the key is in use: it outlasts the
// key's state then, and goes soon after it when the key is idle. A longer life would
// cost memory where it hurts: per-tenant keys used once each would leave a record
// (about 200 B of used_memory) for each tenant of the whole life, where their states
// go after a period.
var recordMinTTL = 10 * time.Second

// recordText is the record of a Limiter: "1 <suffix> <buckets> <limit>...", each
// limit as RATE/PERIOD or RATE/PERIOD:BURST (the period as time.Duration prints it),
// e.g. "1 sw 50 20/1.1s".
func recordText(alg Algorithm, limits []Limit, buckets int) string {
	parts := []string{"1", alg.algo().suffix, strconv.Itoa(buckets)}
	for _, l := range limits {
		s := strconv.Itoa(l.Rate) + "/" + l.Period.String()
		if l.Burst != 0 {
			s += ":" + strconv.Itoa(l.Burst)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// parseRecord reads recordText's text.
func parseRecord(text string) (Record, error) {
	f := strings.Fields(text)
	if len(f) < 4 || f[0] != "1" {
		return Record{}, errors.New("not a version-1 record")
	}
	alg, ok := stateSuffixes[f[1]]
	if !ok {
		return Record{}, fmt.Errorf("algorithm %q", f[1])
	}
	b, err := strconv.Atoi(f[2])
	if err != nil || b < 1 {
		return Record{}, fmt.Errorf("buckets %q", f[2])
	}
	r := Record{Algorithm: alg, Buckets: b}
	for _, s := range f[3:] {
		var l Limit
		rate, rest, ok1 := strings.Cut(s, "/")
		period, burst, hasBurst := strings.Cut(rest, ":")
		var e1, e2, e3 error
		l.Rate, e1 = strconv.Atoi(rate)
		l.Period, e2 = time.ParseDuration(period)
		if hasBurst {
			l.Burst, e3 = strconv.Atoi(burst)
		}
		if !ok1 || e1 != nil || e2 != nil || e3 != nil {
			return Record{}, fmt.Errorf("limit %q", s)
		}
		if err := l.validate(alg); err != nil {
			return Record{}, fmt.Errorf("limit %q: %v", s, err)
		}
		r.Limits = append(r.Limits, l)
	}
	return r, nil
}

// record is a Limiter's record and when its process writes it next; shared by the
// Limiters built alike (limiterState).
type record struct {
	id    recordID
	ttl   time.Duration
	every time.Duration // how often a process writes it
	due   atomic.Int64  // Unix ns from which the next call writes it; 0: now
}

// recordID names a record's write: the client, the record key and its text.
type recordID struct {
	rdb  redis.UniversalClient
	key  string
	text string
}

func newRecord(rdb redis.UniversalClient, tag string, alg Algorithm, limits []Limit, buckets int) *record {
	ttl := max(recordMinTTL, 3*grantMatters(limits, alg))
	return &record{id: recordID{rdb, tag + ":conf", recordText(alg, limits, buckets)}, ttl: ttl, every: ttl / 4}
}

// written remembers, across shared states, when each record was last written, so
// Limiters built per call (whose shared state the garbage collector may take between
// calls) write it once per interval too. Bounded: it is emptied when full.
var written struct {
	mu sync.Mutex
	m  map[recordID]int64 // Unix ns when it is due again
}

const writtenCap = 4096

// take returns r when the call made at now should carry the record's write (see
// command.rec), else nil: one atomic load on the hot path.
func (r *record) take(now time.Time) *record {
	due := r.due.Load()
	ns := now.UnixNano()
	if ns < due || !r.due.CompareAndSwap(due, ns+int64(r.every)) {
		return nil
	}
	written.mu.Lock()
	defer written.mu.Unlock()
	if at, ok := written.m[r.id]; ok && ns < at {
		r.due.Store(at)
		return nil
	}
	if written.m == nil || len(written.m) >= writtenCap {
		written.m = map[recordID]int64{}
	}
	written.m[r.id] = ns + int64(r.every)
	return r
}

// failedIf notes, when err is not nil, that the call carrying the write failed: the
// next call writes it. r may be nil (the call carried no write).
func (r *record) failedIf(err error) {
	if r == nil || err == nil {
		return
	}
	r.due.Store(0)
	written.mu.Lock()
	delete(written.m, r.id)
	written.mu.Unlock()
}

// recordIf returns the key's record for a call that may grant, when its write is due
// (see record.take), for command.rec; else nil.
func (l *Limiter) recordIf(mayGrant bool) *record {
	if !mayGrant {
		return nil
	}
	return l.shared.rec.take(l.clock.Now())
}

// queue adds the write to pipe.
func (r *record) queue(ctx context.Context, pipe redis.Pipeliner) *redis.StatusCmd {
	return pipe.Set(ctx, r.id.key, r.id.text, r.ttl)
}

// execAborted reports whether a transaction that carried a record's write (set) was
// discarded because Redis refused that write when it was queued (an OOM error under
// maxmemory's noeviction; a user without SET): nothing in it ran, and the call goes
// again without the write.
func execAborted(set *redis.StatusCmd, cmd redis.Cmder) bool {
	return set != nil && set.Err() != nil && cmd.Err() != nil && redis.HasErrorPrefix(cmd.Err(), "EXECABORT")
}

// execRecorded is exec of one of the Limiter's own booking ops (see runFor): a
// booking that may grant carries the key's record's write when it is due, as run's
// acquires do.
func (l *Limiter) execRecorded(ctx context.Context, keys []string, args []any) (any, error) {
	c := newCommand(l.script, keys, args)
	op, n := args[0], args[1]
	c.rec = l.recordIf((op == opAcquireFor || op == opAcquireForLate) && n != 0)
	val, err := l.execLate(ctx, c, nil)
	c.rec.failedIf(err)
	return val, err
}
