package throttle

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// hub is a client's one pub/sub subscription: it listens on a key's channel, {…}:wake,
// while something of this process waits on the key, and tells the listeners what the
// scripts publish there ("h <place> ...": a semaphore's handoffs; "p <pause_end>", "r
// <pause_end>": a pause, a resume) and when the subscription is (re)confirmed, since a
// notice may have been missed before. It closes after hubLinger without listeners.
//
// Its worker makes the subscription's calls (subscribe, unsubscribe, close) in order on a
// goroutine of its own: go-redis makes them holding the subscription's lock, for up to
// the client's ReadTimeout (for ever without one). No caller, and nothing under h.mu,
// waits for Redis.
type hub struct {
	rdb   redis.UniversalClient
	gone  func() // called when the subscription ends because rdb was closed
	mu    sync.Mutex
	ps    *redis.PubSub // nil while closed
	chans map[string]*channel
	idle  *time.Timer // closes ps once no channel is left
	ops   []func()    // the worker's queue; it runs while the queue is not empty
}

const hubLinger = 30 * time.Second

// channel is the hub's state for one key's channel. A channel subscribed and not live
// awaits the confirmation of its SUBSCRIBE.
type channel struct {
	listeners  map[*listener]struct{}
	subscribed bool // SUBSCRIBE asked for, no UNSUBSCRIBE since
	live       bool // confirmed: every notice published from now on arrives
}

// listener is one waiter on a key's channel: a semaphore's Acquire, or a limiter key's
// waiters in this process (keyState.listenNotices).
type listener struct {
	channel string
	place   string        // a semaphore waiter's place in the queue, or ""
	handed  chan struct{} // a notice named place: a slot was handed to it
	check   chan struct{} // the subscription was (re)confirmed, or (a semaphore waiter) a pause began or ended: ask Redis again
	paused  func(pauseEnd int64)
	resumed func(pauseEnd int64)
}

// listen registers l on its channel and reports whether the subscription is live
// already; subscribe makes it so. Call unlisten when done.
func (h *hub) listen(l *listener) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := h.chans[l.channel]
	if ch == nil {
		ch = &channel{listeners: map[*listener]struct{}{}}
		h.chans[l.channel] = ch
	}
	ch.listeners[l] = struct{}{}
	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
	return ch.live
}

// subscribe makes sure the hub listens on l's channel and reports whether that is
// confirmed; if not, l.check is signalled once it is. It does not wait for Redis.
func (h *hub) subscribe(l *listener) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := h.chans[l.channel]
	if ch.subscribed {
		return ch.live
	}
	if h.ps == nil {
		h.ps = h.rdb.Subscribe(context.Background()) // no channel yet: nothing is sent
		go h.receive(h.ps, h.ps.ChannelWithSubscriptions())
	}
	ch.subscribed, ch.live = true, false
	ps := h.ps
	h.do(func() { _ = ps.Subscribe(context.Background(), l.channel) })
	return false
}

// unlisten unregisters l; the last listener of a channel unsubscribes it.
func (h *hub) unlisten(l *listener) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := h.chans[l.channel]
	delete(ch.listeners, l)
	if len(ch.listeners) == 0 && (ch.live || !ch.subscribed) { // else confirmed drops it
		h.drop(l.channel, ch)
	}
}

// drop forgets a channel without listeners (h.mu held).
func (h *hub) drop(name string, ch *channel) {
	if ps := h.ps; ch.subscribed && ps != nil {
		h.do(func() { _ = ps.Unsubscribe(context.Background(), name) })
	}
	delete(h.chans, name)
	if len(h.chans) == 0 && h.ps != nil && h.idle == nil {
		h.idle = time.AfterFunc(hubLinger, h.closeIdle)
	}
}

// closeIdle closes the subscription if no channel came back meanwhile.
func (h *hub) closeIdle() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.idle = nil
	if len(h.chans) == 0 {
		h.shut()
	}
}

// close closes the subscription, whatever listens (its Redis client is closed).
func (h *hub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
	h.shut()
}

// shut closes the subscription, if open (h.mu held). go-redis stops its health check
// only when the subscription is closed, even after its client was.
func (h *hub) shut() {
	if ps := h.ps; ps != nil {
		h.do(func() { _ = ps.Close() })
		h.ps = nil
	}
}

// listening reports whether any channel is listened to or awaits its confirmation.
func (h *hub) listening() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.chans) > 0
}

// do queues op for the worker, starting it if it is not running (h.mu held). go-redis
// sends a failed subscribe again when it reconnects; listeners fall back on their timers
// meanwhile.
func (h *hub) do(op func()) {
	h.ops = append(h.ops, op)
	if len(h.ops) > 1 { // the worker runs
		return
	}
	go func() {
		h.mu.Lock()
		for len(h.ops) > 0 {
			op := h.ops[0]
			h.mu.Unlock()
			op()
			h.mu.Lock()
			h.ops = slices.Delete(h.ops, 0, 1)
		}
		h.mu.Unlock()
	}()
}

// receive dispatches what ps delivers until it is closed.
func (h *hub) receive(ps *redis.PubSub, in <-chan any) {
	for m := range in {
		var notices []func(int64) // of a pause or a resume
		var at int64
		h.mu.Lock()
		switch m := m.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				h.confirmed(m.Channel)
			}
		case *redis.Message:
			ch := h.chans[m.Channel]
			if ch == nil {
				break
			}
			kind, rest, _ := strings.Cut(m.Payload, " ")
			places := strings.Fields(rest)         // "h": the places handed a slot
			at, _ = strconv.ParseInt(rest, 10, 64) // "p", "r": the end of the pause set, or resumed
			for l := range ch.listeners {
				switch {
				case kind == "h" && slices.Contains(places, l.place):
					signal(l.handed)
				case kind == "p" && l.paused != nil:
					notices = append(notices, l.paused)
				case kind == "r" && l.resumed != nil:
					notices = append(notices, l.resumed)
				}
			}
		}
		h.mu.Unlock()
		for _, f := range notices { // outside the lock: they book again
			f(at)
		}
	}
	// ps was closed: by shut, or with the Redis client, whose subscriptions end when
	// it closes, theirs health checks left running until they are closed too.
	// Listeners fall back on their timers and subscribe again on their next round.
	h.mu.Lock()
	if h.ps != ps {
		h.mu.Unlock()
		return
	}
	h.shut()
	for name, ch := range h.chans {
		ch.subscribed, ch.live = false, false
		if len(ch.listeners) == 0 {
			delete(h.chans, name)
		}
		for l := range ch.listeners {
			signal(l.check)
		}
	}
	h.mu.Unlock()
	if h.gone != nil {
		h.gone()
	}
}

// confirmed handles a subscribe confirmation: one asked for, or go-redis subscribing
// again after a reconnect (notices published in between are lost, so every listener
// asks Redis again). h.mu held.
func (h *hub) confirmed(name string) {
	ch := h.chans[name]
	if ch == nil || !ch.subscribed {
		return
	}
	if len(ch.listeners) == 0 {
		h.drop(name, ch)
		return
	}
	ch.live = true
	for l := range ch.listeners {
		signal(l.check)
	}
}

// signal wakes a listener without blocking; a wake already pending is enough.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
