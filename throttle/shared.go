package throttle

import (
	"runtime"
	"sync"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"
)

// What a process knows about a key besides Redis (the breaker, FailLocal's share, the
// counters, the latest grant for Hooks.StateLost) lives in one entry per client, key
// and configuration, shared by every Limiter (or Semaphore) of the process built alike.
// So a Limiter built per call, or per task, is as correct as one built once: it finds
// the entry the previous one used.
//
// An entry lives while a Limiter holds it, and while it holds something that still
// matters after its last Limiter is gone: a local grant still in its window, an open
// breaker, a grant StateLost may compare with. Until then it is pinned (a pending
// timer holds it); after that it is held only weakly, and goes with the next garbage
// collection. Per-tenant keys made and dropped by the million leave nothing behind.

// sharedKey names an entry: the client, the key's hash tag and a fingerprint of the
// configuration that shapes the state (kind, algorithm, limits, policy, ...).
type sharedKey struct {
	rdb    redis.UniversalClient
	tag    string
	config string
}

// registry holds values weakly by key: get returns the value an earlier get made while
// something still holds it, else a new one.
type registry[K comparable, V any] struct {
	mu sync.Mutex
	m  map[K]weak.Pointer[V]
}

// get returns the live value for k, or the one made by fresh.
func (r *registry[K, V]) get(k K, fresh func() *V) *V {
	r.mu.Lock()
	defer r.mu.Unlock()
	if v := r.m[k].Value(); v != nil {
		return v
	}
	if r.m == nil {
		r.m = map[K]weak.Pointer[V]{}
	}
	v := fresh()
	r.m[k] = weak.Make(v)
	runtime.AddCleanup(v, r.drop, k)
	return v
}

// drop forgets k once its value was collected (unless a new one took its place).
func (r *registry[K, V]) drop(k K) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m[k].Value() == nil {
		delete(r.m, k)
	}
}

// len returns how many entries the registry holds (tests).
func (r *registry[K, V]) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m)
}

// pin keeps a shared entry alive for a while after its last user is gone: a pending
// timer's function is reachable by the runtime, and the function holds the entry.
type pin struct {
	mu    sync.Mutex
	until time.Time
	timer *time.Timer
}

// hold keeps v alive for at least d (wall-clock time). To stay cheap on hot paths it
// moves the timer only when d reaches past the current pin, and then pins for 2d.
func (p *pin) hold(v any, d time.Duration) {
	if d <= 0 {
		return
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !now.Add(d).After(p.until) {
		return
	}
	p.until = now.Add(2 * d)
	if p.timer == nil {
		p.timer = time.AfterFunc(2*d, func() { p.release(v) })
		return
	}
	p.timer.Reset(2 * d)
}

// release runs when the pin's time is over; v is only referenced to be held until then.
func (p *pin) release(v any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Now().Before(p.until) { // moved meanwhile; the timer was reset
		return
	}
	p.timer = nil
	runtime.KeepAlive(v)
}

// keyState is the part of the shared state a Limiter and a Semaphore both have.
type keyState struct {
	breaker breaker
	stats   counters
	pin     pin
	pipes   pipePool // the pipelines of the key's calls (see evalOnce)
}

// newRunner returns the runner of a Limiter or Semaphore on key whose shared state
// (owner) holds ks; redisError is its RedisError hook.
func newRunner(rdb redis.UniversalClient, key string, c *config, ks *keyState, owner any, redisError func(string, error)) runner {
	return runner{rdb: rdb, key: key, clock: c.clock, policy: c.policy, breaker: &ks.breaker, redisError: redisError, pin: &ks.pin, owner: owner,
		callTimeout: callTimeout(c.callTimeout, rdb), pipes: &ks.pipes, direct: honoursDeadlines(rdb)}
}

// prepare is the start New and NewSemaphore share once their options are applied to
// c: it refuses a nil client and a bad option, and returns the key's hash tag.
func prepare(rdb redis.UniversalClient, key string, c *config) (tag string, err error) {
	if isNilClient(rdb) {
		return "", ErrNilClient
	}
	if c.err != nil {
		return "", c.err
	}
	return hashTag(c.prefix, key)
}

// limiterState is what every Limiter of this process on one client, key and
// configuration shares.
type limiterState struct {
	keyState
	local  *localLog  // FailLocal's share; nil under other policies
	latest stateWatch // the latest grant, for Hooks.StateLost
	rec    *record    // the key's record (see record.go)
}

var limiterStates registry[sharedKey, limiterState]

// semaphoreState is what every Semaphore of this process on one client, key and
// configuration shares.
type semaphoreState struct {
	keyState
	local *localSem // stands in while Redis is unreachable (FailOpen, FailLocal)
}

var semaphoreStates registry[sharedKey, semaphoreState]
