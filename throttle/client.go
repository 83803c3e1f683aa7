package throttle

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// client is what this process keeps for one Redis client: the queue and round trips of
// every call made through it (send.go), the subscription that carries wake-ups
// (wake.go), and the state of each key in use (docs/design.md, "Who owns what").
type client struct {
	rdb redis.UniversalClient
	// atMostOnce: rdb never re-sends a command, so round trips need no MULTI/EXEC (see
	// exec): only a go-redis Client built with MaxRetries < 0 (its options then hold 0).
	atMostOnce bool
	// inline: rdb ends every wait of a call by its context's deadline (a plain go-redis
	// Client with ContextTimeoutEnabled: its pool, dial, reads and writes), so a call
	// that no context can cut short may run on its caller's goroutine (see unending).
	// Not a FailoverClient, whose dialer asks the sentinels.
	inline bool
	hub    *hub

	mu      sync.Mutex
	queue   []*request  // arrival order
	flights []*flight   // round trips in flight, those the watchdog let go excepted
	calls   int         // requests under way: queued, in flight, or answered and not yet returned
	watch   *time.Timer // the watchdog: runs expire at watchAt
	watchAt time.Time
	lastErr atomic.Pointer[failure] // the last failed round trip's, for noReply
	dropped bool                    // taken out of clients (c.mu held)

	keys  sync.Map // hash tag → *keyState
	nkeys int      // keys in keys (c.mu held)
	sweep *time.Timer
}

// clients holds the client of every Redis client in use (redis.UniversalClient →
// *client), looked up on every call, so that one dropped (sweepIdle, close) is made
// anew by the next (docs/design.md, "Who owns what").
var clients sync.Map

func clientFor(rdb redis.UniversalClient) *client {
	if v, ok := clients.Load(rdb); ok {
		return v.(*client)
	}
	c := &client{rdb: rdb}
	if plain, ok := rdb.(*redis.Client); ok {
		o := plain.Options()
		c.atMostOnce = o.MaxRetries == 0
		c.inline = o.ContextTimeoutEnabled && o.Addr != "FailoverClient"
	}
	c.watch = time.AfterFunc(time.Hour, c.expire)
	c.watch.Stop() // set by doAll and expire
	c.sweep = time.AfterFunc(sweepEvery, c.sweepIdle)
	c.hub = &hub{rdb: rdb, gone: c.close, chans: map[string]*channel{}}
	v, _ := clients.LoadOrStore(rdb, c)
	return v.(*client)
}

// sweepEvery is how often a client looks for keys idle since its last look: a key's
// state goes at the second sweep after its last use once nothing of it matters. Each
// look locks the client once per key, never for the whole sweep.
const sweepEvery = 15 * time.Second

// key returns the state of the key whose hash tag is tag, and marks it in use.
func (c *client) key(tag string) *keyState {
	if v, ok := c.keys.Load(tag); ok {
		if ks := v.(*keyState); ks.used.Load() {
			return ks // the sweep drops only a key it finds unused (under c.mu)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dropped { // the sweep has just taken the client out: the key goes to the new one
		return clientFor(c.rdb).key(tag)
	}
	v, ok := c.keys.Load(tag)
	if !ok {
		v = &keyState{client: c, tag: tag, unhold: make(chan struct{}), configs: map[string]*configState{}}
		c.keys.Store(tag, v)
		c.nkeys++
	}
	ks := v.(*keyState)
	ks.used.Store(true)
	return ks
}

// sweepIdle drops the keys not used since the last sweep whose state no longer
// matters, and the client itself once it has none, nothing in flight and nothing
// listening on its subscription.
func (c *client) sweepIdle() {
	now := time.Now()
	c.keys.Range(func(k, v any) bool {
		ks := v.(*keyState)
		c.mu.Lock() // key marks a key used under it
		if !ks.used.Swap(false) && ks.idle(now) {
			c.keys.Delete(k)
			c.nkeys--
			ks.endNotices()
		}
		c.mu.Unlock()
		return true
	})
	c.mu.Lock()
	idle := !c.dropped && c.nkeys == 0 && c.calls == 0 && !c.hub.listening()
	if idle {
		c.drop()
	} else if !c.dropped {
		c.sweep.Reset(sweepEvery)
	}
	c.mu.Unlock()
	if idle {
		c.hub.close() // no listener: its lingering subscription would only hold the client
	}
}

// drop takes the client out of clients (c.mu held).
func (c *client) drop() {
	c.dropped = true
	clients.CompareAndDelete(c.rdb, c)
}

// close drops the client, whose Redis client was found closed (a call failed with
// redis.ErrClosed, or its subscription ended without being closed here), and closes
// its subscription: nothing of it can be used again.
func (c *client) close() {
	c.mu.Lock()
	if !c.dropped {
		c.drop()
		c.sweep.Stop()
	}
	c.mu.Unlock()
	c.keys.Range(func(_, v any) bool {
		v.(*keyState).endNotices()
		return true
	})
	c.hub.close()
}

// failure is a failed round trip's error, and when it came.
type failure struct {
	err error
	at  time.Time
}

// keyState is what this process knows of one key besides Redis: its hold (Pause), the
// failure policy's breaker and share, the StateLost watch, the drift last reported, and
// the callers sleeping on a booking.
type keyState struct {
	client *client
	tag    string
	used   atomic.Bool // used since the last sweep

	breaker breaker
	hold    atomic.Int64 // until when this process holds the key (UnixNano)
	// landed: the pause of the latest hold reached Redis, so a resume published
	// since ended it (or a later one), and ends the hold too
	landed atomic.Bool
	// ended: the ends of the pauses of the last len(ended) resumes handled, ring-wise from
	// nended (under heard). A resume of one of them was handled: a word of it come since
	// is its reply's or notice's twin, or was read before it, and moves nothing (resume,
	// paused). Those words come within moments of the resume: an end drops out only once
	// len(ended) other resumes were handled since. Pauses are told apart by their ends,
	// not ordered by them: a pause set after a resume may end before the pause resumed did.
	ended  [8]int64
	nended int
	// pauseEnd: the end of the latest pause heard of (server µs), 0 once it was
	// resumed: sleepers booked inside it are moved after it (paused)
	pauseEnd atomic.Int64
	// heard orders the handling of pauses and resumes (paused, resume), which come from
	// the key's listener, its pause checks and Resume's reply: each decides on pauseEnd
	// and ended and starts its move (which takes its sleepers at once) before the next
	// decides, so a pause not yet found resumed moves no sleeper after a resume of it
	// began moving them
	heard sync.Mutex
	drift atomic.Pointer[string] // the other process's head LimitsDrift was last told of
	// overridden: until when an override of the rates may be in force (UnixNano), as
	// this process set it or a read found it: StateLost cannot judge Remaining then
	overridden atomic.Int64
	// keep is until when something of this state matters (a local grant in its
	// window, a grant StateLost compares with, an open breaker): UnixNano
	keep atomic.Int64

	mu       sync.Mutex
	unhold   chan struct{}           // closed (and replaced) when a resume ends the hold early
	configs  map[string]*configState // by target id and policy
	sleepers map[*sleeper]struct{}
	flying   []chan struct{} // WaitN bookings on their way to the sleepers (see fly)
	notices  *listener       // the key's listener on the hub (listenNotices), until the key goes
	nlisten  int             // its users
	gone     bool            // the key was dropped: its listener ends with its last user
	unlisten chan struct{}   // closed as notices goes: ends its checkPauses
	leaving  []chan struct{} // give-backs under way of callers that left (see leave)
	nleaving atomic.Int32    // len(leaving)
}

// configState is what the Limiters (or Semaphores) of one configuration (target and
// failure policy) share on a key: the failure policy's share and the StateLost watch.
type configState struct {
	local []*localLog // a Limiter's, one per unit, under FailLocal
	caps  *localCaps  // its tenants' caps, under FailLocal
	sem   *localSem   // a Semaphore's, under FailOpen and FailLocal
	watch stateWatch
}

// config returns the state of the configuration id, made by fresh the first time.
func (ks *keyState) config(id string, fresh func() *configState) *configState {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	cs := ks.configs[id]
	if cs == nil {
		cs = fresh()
		ks.configs[id] = cs
	}
	return cs
}

// keepFor notes that something of the state matters until d from now.
func (ks *keyState) keepFor(d time.Duration) { raise(&ks.keep, time.Now().Add(d).UnixNano()) }

// idle reports whether nothing of the state matters at now.
func (ks *keyState) idle(now time.Time) bool {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	t := now.UnixNano()
	return len(ks.sleepers) == 0 && ks.keep.Load() < t && ks.hold.Load() < t && ks.breaker.idle(now)
}

// leave runs giveBack (its calls under givingBack) in the background for a caller that
// leaves now. Every call this process makes on the key afterwards waits in doAll until
// giveBack has returned (settle), so that it finds what was given back.
func (ks *keyState) leave(giveBack func()) {
	done := make(chan struct{})
	ks.mu.Lock()
	ks.leaving = append(ks.leaving, done)
	ks.nleaving.Store(int32(len(ks.leaving)))
	ks.mu.Unlock()
	go func() {
		defer close(done)
		giveBack()
		ks.mu.Lock()
		ks.leaving = slices.DeleteFunc(ks.leaving, func(c chan struct{}) bool { return c == done })
		ks.nleaving.Store(int32(len(ks.leaving)))
		ks.mu.Unlock()
	}()
}

// settle waits until the give-backs leave started before it have returned (before
// the flight of a WaitN's booking: fly), or ctx ends (false), or until at.
func (ks *keyState) settle(ctx context.Context, at time.Time) bool {
	if ks.nleaving.Load() == 0 || ctx.Value(givingBackKey{}) != nil { // a give-back does not wait for another
		return true
	}
	pending, flight := ctx.Value(flightKey{}).([]chan struct{})
	if !flight {
		ks.mu.Lock()
		pending = slices.Clone(ks.leaving)
		ks.mu.Unlock()
	}
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	for _, done := range pending {
		select {
		case <-done:
		case <-ctx.Done():
			return false
		case <-t.C:
			return false
		}
	}
	return true
}

// givingBack returns ctx without its cancellation, marked as a give-back's: its calls
// do not wait for other give-backs (see leave), are bounded by the call timeout alone
// (their caller has left), and a failure goes to the RedisError hook.
func givingBack(ctx context.Context) context.Context {
	return context.WithValue(context.WithoutCancel(ctx), givingBackKey{}, true)
}

type givingBackKey struct{}

var errRecentlyDown = errors.New("redis was unreachable moments ago")
