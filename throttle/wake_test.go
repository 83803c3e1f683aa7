package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The hub: one pub/sub subscription per client carrying the wake-ups of every key
// (semaphore handoffs, resumes).

// newSendHub returns a hub of its own on c (not the process's), closed when the test
// ends.
func newSendHub(t *testing.T, c redis.UniversalClient) *hub {
	h := &hub{rdb: c, chans: map[string]*channel{}}
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.idle != nil {
			h.idle.Stop()
		}
		if ps := h.ps; ps != nil {
			h.do(func() { _ = ps.Close() })
			h.ps = nil
		}
	})
	return h
}

// newSendListener returns a listener on channel for place.
func newSendListener(channel, place string) *listener {
	return &listener{channel: channel, place: place, handed: make(chan struct{}, 1), check: make(chan struct{}, 1)}
}

func wantSendSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(signalWait):
		t.Fatalf("no %s within %v, want one", what, signalWait)
	}
}

func wantNoSendSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("got a %s, want none", what)
	default:
	}
}

// sendHubState returns what the hub holds for channel: whether it is known, subscribed
// and live, and its number of listeners.
func sendHubState(h *hub, channel string) (known, subscribed, live bool, listeners int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.chans[channel]
	if c == nil {
		return false, false, false, 0
	}
	return true, c.subscribed, c.live, len(c.listeners)
}

// Every Limiter and Semaphore of the process on one Redis client shares one hub;
// another Redis client has its own.
func TestHubIsPerClient(t *testing.T) {
	a, b := redistest.NewMini(t), redistest.NewMini(t)
	s1, err := NewSemaphore(a.Client, "k", 1, WithKeyPrefix(a.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := NewSemaphore(a.Client, "other", 1, WithKeyPrefix(a.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(a.Client, "k", PerSecond(1), WithKeyPrefix(a.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	s3, err := NewSemaphore(b.Client, "k", 1, WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if s1.client().hub != s2.client().hub || s1.client().hub != l.client().hub {
		t.Fatal("two hubs for one Redis client, want one")
	}
	if s1.client().hub == s3.client().hub {
		t.Fatal("one hub for two Redis clients, want one each")
	}
}

// The first listener on a channel subscribes it; once Redis confirms, every listener
// is told to ask again (check) and later listeners find it live. A handoff wakes
// exactly the listeners whose places it names, a resume every listener with a resumed
// func. The last listener to leave unsubscribes, and the connection closes when the
// hub has been idle.
func TestHubWakesTheNamedListeners(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		h := newSendHub(t, b.Client)
		channel := keys.Name("{"+b.Prefix+"wake}", keys.Wake)

		la := newSendListener(channel, "a")
		resumes := make(chan int64, 4)
		la.resumed = func(end int64) { resumes <- end }
		if h.listen(la) {
			t.Fatal("a channel nobody subscribed is live, want it not")
		}
		if h.subscribe(la) {
			t.Fatal("subscribe reported a confirmation it cannot have had yet")
		}
		wantSendSignal(t, la.check, "check after the subscription was confirmed")
		if _, subscribed, live, n := sendHubState(h, channel); !subscribed || !live || n != 1 {
			t.Fatalf("after confirmation: subscribed %v live %v listeners %d; want true true 1", subscribed, live, n)
		}
		lb := newSendListener(channel, "b")
		if !h.listen(lb) || !h.subscribe(lb) {
			t.Fatal("a second listener does not find the channel live, want it live")
		}

		publish := func(payload string) {
			t.Helper()
			if err := b.Client.Publish(ctx, channel, payload).Err(); err != nil {
				t.Fatal(err)
			}
		}
		publish("h zz a")
		wantSendSignal(t, la.handed, "handoff to a")
		publish("h b")
		wantSendSignal(t, lb.handed, "handoff to b")
		// the notices arrive in order: once b's is in, a second for a would be too
		wantNoSendSignal(t, la.handed, "second handoff to a")
		publish("h a b")
		wantSendSignal(t, la.handed, "handoff to a")
		wantSendSignal(t, lb.handed, "handoff to b")
		publish("r 123")
		select {
		case end := <-resumes:
			if end != 123 {
				t.Fatalf("resume: got pause end %d, want 123", end)
			}
		case <-time.After(signalWait):
			t.Fatalf("no resume within %v, want one", signalWait)
		}
		wantNoSendSignal(t, la.check, "check without a new confirmation")

		h.unlisten(la)
		if known, _, _, n := sendHubState(h, channel); !known || n != 1 {
			t.Fatalf("after one of two listeners left: known %v listeners %d; want true 1", known, n)
		}
		h.unlisten(lb)
		if known, _, _, _ := sendHubState(h, channel); known {
			t.Fatal("the channel is still held after its last listener left, want it dropped")
		}
		h.mu.Lock()
		idle := h.idle != nil
		h.mu.Unlock()
		if !idle {
			t.Fatal("no idle timer once no channel is left, want one")
		}
		h.closeIdle() // what the timer runs after hubLinger
		h.mu.Lock()
		closed := h.ps == nil
		h.mu.Unlock()
		if !closed {
			t.Fatal("closeIdle left the subscription open, want it closed")
		}
	})
}

// When the subscription's connection closes, every listener is told to ask Redis
// again (a notice may have been missed) and its channel needs a new SUBSCRIBE, which
// works.
func TestHubRecoversFromAClosedSubscription(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		h := newSendHub(t, b.Client)
		channel := keys.Name("{"+b.Prefix+"closed}", keys.Wake)
		l := newSendListener(channel, "a")
		h.listen(l)
		defer h.unlisten(l)
		h.subscribe(l)
		wantSendSignal(t, l.check, "check after the first confirmation")

		h.mu.Lock()
		ps := h.ps
		h.mu.Unlock()
		if err := ps.Close(); err != nil {
			t.Fatal(err)
		}
		wantSendSignal(t, l.check, "check after the subscription closed")
		if known, subscribed, live, n := sendHubState(h, channel); !known || subscribed || live || n != 1 {
			t.Fatalf("after close: known %v subscribed %v live %v listeners %d; want true false false 1", known, subscribed, live, n)
		}

		if h.subscribe(l) {
			t.Fatal("subscribe again reported a confirmation it cannot have had yet")
		}
		wantSendSignal(t, l.check, "check after subscribing again")
		if err := b.Client.Publish(ctx, channel, "h a").Err(); err != nil {
			t.Fatal(err)
		}
		wantSendSignal(t, l.handed, "handoff on the new subscription")
	})
}

// The hub's bookkeeping of confirmations, driven by hand (no connection): a channel
// is live only when the SUBSCRIBE asked for is confirmed, and a channel whose
// listeners left before that is kept until then, and dropped at it.
func TestHubConfirmations(t *testing.T) {
	h := &hub{chans: map[string]*channel{}}
	const name = "{k}:wake"
	confirm := func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.confirmed(name)
	}
	sent := func() { // what subscribe does besides asking the worker
		h.mu.Lock()
		defer h.mu.Unlock()
		c := h.chans[name]
		c.subscribed, c.live = true, false
	}

	l := newSendListener(name, "a")
	h.listen(l)
	sent()
	if _, _, live, _ := sendHubState(h, name); live {
		t.Fatal("live before the confirmation, want not yet")
	}
	wantNoSendSignal(t, l.check, "check before the confirmation")
	confirm()
	if _, _, live, _ := sendHubState(h, name); !live {
		t.Fatal("not live after the confirmation, want live")
	}
	wantSendSignal(t, l.check, "check at the confirmation")
	confirm() // go-redis subscribing again after a reconnect: ask Redis again
	wantSendSignal(t, l.check, "check at a reconfirmation")

	sent()
	h.unlisten(l) // gone before the confirmation: the SUBSCRIBE is still in flight
	if known, _, _, n := sendHubState(h, name); !known || n != 0 {
		t.Fatalf("with a SUBSCRIBE in flight: known %v listeners %d; want kept, no listeners", known, n)
	}
	h.mu.Lock() // no subscription to unsubscribe from: the drop sends nothing
	h.ps = nil
	h.mu.Unlock()
	confirm()
	if known, _, _, _ := sendHubState(h, name); known {
		t.Fatal("channel kept after its confirmation came with no listener left, want it dropped")
	}
	confirm() // a confirmation for a channel the hub forgot changes nothing
	if known, _, _, _ := sendHubState(h, name); known {
		t.Fatal("a stray confirmation brought a channel back, want it forgotten")
	}
}

// Nothing a listener does waits for Redis: against a server that accepts connections
// and never answers (go-redis then waits out its read timeout dialling the
// subscription, under its lock), listen, subscribe, unlisten and closeIdle return at
// once.
func TestHubDoesNotWaitForRedis(t *testing.T) {
	hung := hungServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: hung.Addr, ReadTimeout: -1})
	defer rdb.Close()
	h := newSendHub(t, rdb)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 3 {
			l := newSendListener(keys.Name("{hung"+itoa(i)+"}", keys.Wake), "a")
			h.listen(l)
			h.subscribe(l)
			h.unlisten(l)
		}
		h.closeIdle()
	}()
	select {
	case <-done:
	case <-time.After(signalWait):
		t.Fatalf("listeners still waiting after %v for a Redis that never answers, want them back at once", signalWait)
	}
}
