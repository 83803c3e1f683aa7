package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// newTestHub returns a hub of its own on c (not the process's shared one), closed
// when the test ends.
func newTestHub(t *testing.T, c redis.UniversalClient) *wakeHub {
	h := &wakeHub{rdb: c, chans: map[string]*wakeChan{}}
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.idle != nil {
			h.idle.Stop()
		}
		if h.ps != nil {
			_ = h.ps.Close()
		}
	})
	return h
}

func wantSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(signalWait):
		t.Fatalf("no %s within %v", what, signalWait)
	}
}

func wantNoSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("unexpected %s", what)
	default:
	}
}

// hubState returns what the hub holds for channel: whether it is known, subscribed
// and live, and its number of waiters.
func hubState(h *wakeHub, channel string) (known, subscribed, live bool, waiters int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.chans[channel]
	if c == nil {
		return false, false, false, 0
	}
	return true, c.subscribed, c.live, len(c.waiters)
}

// Every Semaphore of the process on one client shares one hub; another client has
// its own.
func TestWakeHubForIsPerClient(t *testing.T) {
	a, b := redistest.NewMini(t), redistest.NewMini(t)
	h1, h2, h3 := wakeHubFor(a.Client), wakeHubFor(a.Client), wakeHubFor(b.Client)
	if h1 != h2 {
		t.Fatal("two hubs for one client")
	}
	if h1 == h3 {
		t.Fatal("one hub for two clients")
	}
	sa, err := NewSemaphore(a.Client, "k", 1, WithKeyPrefix(a.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if sa.hub != h1 {
		t.Fatal("a Semaphore does not use its client's hub")
	}
}

// The first waiter on a channel subscribes it; once Redis confirms, every waiter is
// told to ask again (check) and later waiters find it live. A notice wakes exactly
// the waiters it names. The last waiter to leave unsubscribes, and the connection
// closes when the hub has been idle.
func TestWakeHubWakesTheNamedWaiters(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		h := newTestHub(t, b.Client)
		channel := "{" + b.Prefix + "wake}:sem:wake"

		wa, live := h.watch(channel, "a")
		if live {
			t.Fatal("a channel nobody subscribed is live")
		}
		if wa.subscribe(ctx) {
			t.Fatal("subscribe reported a confirmation it cannot have had yet")
		}
		wantSignal(t, wa.check, "check after the subscription was confirmed")
		if _, subscribed, live, n := hubState(h, channel); !subscribed || !live || n != 1 {
			t.Fatalf("after confirmation: subscribed %v live %v waiters %d; want true true 1", subscribed, live, n)
		}
		wb, live := h.watch(channel, "b")
		if !live || !wb.subscribe(ctx) {
			t.Fatal("a second waiter does not find the channel live")
		}

		publish := func(payload string) {
			t.Helper()
			if err := b.Client.Publish(ctx, channel, payload).Err(); err != nil {
				t.Fatal(err)
			}
		}
		publish("zz a")
		wantSignal(t, wa.handed, "wake for a")
		publish("b")
		wantSignal(t, wb.handed, "wake for b")
		// the notices arrive in order: once b's wake is in, a's second would be too
		wantNoSignal(t, wa.handed, "second wake for a")
		publish("a b")
		wantSignal(t, wa.handed, "wake for a")
		wantSignal(t, wb.handed, "wake for b")
		wantNoSignal(t, wa.check, "check without a new confirmation")

		wa.stop()
		if known, _, _, n := hubState(h, channel); !known || n != 1 {
			t.Fatalf("after one of two waiters left: known %v waiters %d; want true 1", known, n)
		}
		wb.stop()
		if known, _, _, _ := hubState(h, channel); known {
			t.Fatal("the channel is still held after its last waiter left")
		}
		h.mu.Lock()
		idle := h.idle != nil
		h.mu.Unlock()
		if !idle {
			t.Fatal("no idle timer once no channel is left")
		}
		h.closeIdle() // what the timer runs after wakeLinger
		h.mu.Lock()
		closed := h.ps == nil
		h.mu.Unlock()
		if !closed {
			t.Fatal("closeIdle left the subscription open")
		}
	})
}

// When the subscription's connection closes, every waiter is told to ask Redis again
// (a notice may have been missed) and its channel needs a new SUBSCRIBE, which works.
func TestWakeHubRecoversFromAClosedSubscription(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		h := newTestHub(t, b.Client)
		channel := "{" + b.Prefix + "closed}:sem:wake"
		w, _ := h.watch(channel, "a")
		defer w.stop()
		w.subscribe(ctx)
		wantSignal(t, w.check, "check after the first confirmation")

		h.mu.Lock()
		ps := h.ps
		h.mu.Unlock()
		if err := ps.Close(); err != nil {
			t.Fatal(err)
		}
		wantSignal(t, w.check, "check after the subscription closed")
		if known, subscribed, live, n := hubState(h, channel); !known || subscribed || live || n != 1 {
			t.Fatalf("after close: known %v subscribed %v live %v waiters %d; want true false false 1", known, subscribed, live, n)
		}

		if w.subscribe(ctx) {
			t.Fatal("subscribe again reported a confirmation it cannot have had yet")
		}
		wantSignal(t, w.check, "check after subscribing again")
		if err := b.Client.Publish(ctx, channel, "a").Err(); err != nil {
			t.Fatal(err)
		}
		wantSignal(t, w.handed, "wake on the new subscription")
	})
}

// The hub's bookkeeping of confirmations, driven by hand (no connection): a channel
// is live only when the last SUBSCRIBE sent is confirmed, and a channel whose waiters
// left before that is kept until then, and dropped at it.
func TestWakeHubConfirmations(t *testing.T) {
	h := &wakeHub{chans: map[string]*wakeChan{}}
	const channel = "{k}:sem:wake"
	confirm := func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.confirmed(channel)
	}
	sent := func() { // what subscribe does besides talking to Redis
		h.mu.Lock()
		defer h.mu.Unlock()
		c := h.chans[channel]
		c.subscribed, c.pending, c.live = true, c.pending+1, false
	}

	w, _ := h.watch(channel, "a")
	sent()
	sent() // a second SUBSCRIBE, e.g. after a reconnect, before the first was confirmed
	confirm()
	if _, _, live, _ := hubState(h, channel); live {
		t.Fatal("live after the first of two confirmations")
	}
	wantNoSignal(t, w.check, "check before the last confirmation")
	confirm()
	if _, _, live, _ := hubState(h, channel); !live {
		t.Fatal("not live after the last confirmation")
	}
	wantSignal(t, w.check, "check at the last confirmation")
	confirm() // go-redis subscribing again after a reconnect: ask Redis again
	wantSignal(t, w.check, "check at a reconfirmation")

	sent()
	w.stop() // gone before the confirmation: the SUBSCRIBE is still in flight
	if known, _, _, n := hubState(h, channel); !known || n != 0 {
		t.Fatalf("with a SUBSCRIBE in flight: known %v waiters %d; want kept, no waiters", known, n)
	}
	confirm()
	if known, _, _, _ := hubState(h, channel); known {
		t.Fatal("channel kept after its confirmation came with no waiter left")
	}
	confirm() // a confirmation for a channel the hub forgot changes nothing
	if known, _, _, _ := hubState(h, channel); known {
		t.Fatal("a stray confirmation brought a channel back")
	}
}
