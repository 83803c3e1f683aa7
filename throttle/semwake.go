package throttle

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// wakeHub is the one pub/sub subscription a process holds per Redis client for the
// waiters of all its Semaphores: it subscribes to a semaphore's channel while some
// Acquire of this process waits on it, and tells each waiter when the script names it
// (its lease was handed over) or when the subscription was (re)confirmed (a notice may
// have been missed: ask again). Waiters cost no connection of their own, so any
// number of them never exhausts the client's pool; the subscription uses one
// connection of go-redis's separate pub/sub pool, closed after wakeLinger without
// waiters.
type wakeHub struct {
	rdb   redis.UniversalClient
	mu    sync.Mutex
	ps    *redis.PubSub // nil while closed
	chans map[string]*wakeChan
	idle  *time.Timer // closes ps once no channel is left
}

// wakeLinger is how long the hub keeps its connection open without waiters.
const wakeLinger = 30 * time.Second

// wakeChan is the hub's state for one channel.
type wakeChan struct {
	waiters    map[string]*watch // by lease id
	subscribed bool              // SUBSCRIBE sent, no UNSUBSCRIBE since
	pending    int               // SUBSCRIBEs sent whose confirmation has not come
	live       bool              // confirmed: every notice published from now on arrives
}

// watch is one waiter's registration.
type watch struct {
	hub     *wakeHub
	channel string
	id      string
	handed  chan struct{} // a notice named id: its lease was handed over
	check   chan struct{} // the subscription was (re)confirmed: ask Redis again
}

// watch registers waiter id on channel; it reports whether the subscription to the
// channel is live already. Call stop when done waiting.
func (h *wakeHub) watch(channel, id string) (*watch, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.chans[channel]
	if c == nil {
		c = &wakeChan{waiters: map[string]*watch{}}
		h.chans[channel] = c
	}
	w := &watch{hub: h, channel: channel, id: id, handed: make(chan struct{}, 1), check: make(chan struct{}, 1)}
	c.waiters[id] = w
	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
	return w, c.live
}

// subscribe makes sure the hub listens on w's channel and reports whether that is
// confirmed; if not, w.check is signalled once it is.
func (w *watch) subscribe(ctx context.Context) bool {
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.chans[w.channel]
	if c.subscribed {
		return c.live
	}
	if h.ps == nil {
		h.ps = h.rdb.Subscribe(context.WithoutCancel(ctx))
		go h.receive(h.ps, h.ps.ChannelWithSubscriptions())
	}
	c.subscribed, c.pending, c.live = true, c.pending+1, false
	// On failure go-redis keeps the channel and subscribes again when it reconnects;
	// the waiter meanwhile renews its place on its timer.
	_ = h.ps.Subscribe(ctx, w.channel)
	return false
}

// stop unregisters the waiter; the last waiter of a channel unsubscribes it.
func (w *watch) stop() {
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.chans[w.channel]
	delete(c.waiters, w.id)
	if len(c.waiters) == 0 && c.pending == 0 {
		h.drop(w.channel, c)
	}
}

// drop forgets a channel without waiters whose subscription is not in flight; the
// caller holds h.mu.
func (h *wakeHub) drop(channel string, c *wakeChan) {
	if c.subscribed && h.ps != nil {
		_ = h.ps.Unsubscribe(context.Background(), channel)
	}
	delete(h.chans, channel)
	if len(h.chans) == 0 && h.ps != nil && h.idle == nil {
		h.idle = time.AfterFunc(wakeLinger, h.closeIdle)
	}
}

// closeIdle closes the subscription if no channel came back meanwhile.
func (h *wakeHub) closeIdle() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.idle = nil
	if len(h.chans) == 0 && h.ps != nil {
		_ = h.ps.Close()
		h.ps = nil
	}
}

// receive dispatches what ps delivers until it is closed.
func (h *wakeHub) receive(ps *redis.PubSub, in <-chan any) {
	for m := range in {
		h.mu.Lock()
		switch m := m.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				h.confirmed(m.Channel)
			}
		case *redis.Message:
			if c := h.chans[m.Channel]; c != nil {
				for _, id := range strings.Fields(m.Payload) {
					if w := c.waiters[id]; w != nil {
						signal(w.handed)
					}
				}
			}
		}
		h.mu.Unlock()
	}
	// ps was closed: by closeIdle, or with the client. Waiters fall back on their
	// timers and subscribe again on their next round.
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ps != ps {
		return
	}
	h.ps = nil
	for channel, c := range h.chans {
		c.subscribed, c.pending, c.live = false, 0, false
		if len(c.waiters) == 0 {
			delete(h.chans, channel)
		}
		for _, w := range c.waiters {
			signal(w.check)
		}
	}
}

// confirmed handles a subscribe confirmation: one we asked for, or go-redis
// subscribing again after a reconnect (notices published in between are lost, so
// every waiter asks Redis again). The caller holds h.mu.
func (h *wakeHub) confirmed(channel string) {
	c := h.chans[channel]
	if c == nil || !c.subscribed {
		return
	}
	if c.pending > 0 {
		c.pending--
	}
	if c.pending > 0 {
		return
	}
	if len(c.waiters) == 0 {
		h.drop(channel, c)
		return
	}
	c.live = true
	for _, w := range c.waiters {
		signal(w.check)
	}
}

// signal wakes a waiter without blocking; a wake already pending is enough.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// hubs holds the hub of every client some Semaphore of this process uses, weakly: an
// entry goes when the last Semaphore on its client is collected.
var hubs registry[redis.UniversalClient, wakeHub]

// wakeHubFor returns the hub shared by every Semaphore of this process on rdb.
func wakeHubFor(rdb redis.UniversalClient) *wakeHub {
	return hubs.get(rdb, func() *wakeHub { return &wakeHub{rdb: rdb, chans: map[string]*wakeChan{}} })
}
