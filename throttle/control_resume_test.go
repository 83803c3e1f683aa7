package throttle

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// ctlOtherClient returns a second client of the backend's server: another process, as
// far as this package can tell (its own client, subscription and key states).
func ctlOtherClient(t *testing.T, b *redistest.Backend) redis.UniversalClient {
	t.Helper()
	addrs, cluster := b.Addrs()
	c := redistest.Dial(addrs, cluster)
	t.Cleanup(func() { c.Close() })
	return c
}

// ctlLimiterOn makes a limiter of tl's key through rdb (another client of the same
// server), on the fake-clock script on real servers, as tl.limiter does.
func ctlLimiterOn(tl *timeline, rdb redis.UniversalClient, key string, limit Limit, opts ...Option) *Limiter {
	tl.t.Helper()
	opts = append([]Option{WithKeyPrefix(tl.b.Prefix)}, opts...)
	l, err := New(rdb, key, limit, opts...)
	if err != nil {
		tl.t.Fatalf("New(%q, %v): %v", key, limit, err)
	}
	if tl.b.Real() {
		l.useScript(fakeClock[l.t.script])
	}
	return l
}

// ctlReturned takes n results from returned, each nil, within signalWait, and returns
// each one's time since from; when they do not all come in time it fails with why(k), k
// the results taken.
func ctlReturned(t *testing.T, returned <-chan error, n int, from time.Time, why func(k int) string) []time.Duration {
	t.Helper()
	var lags []time.Duration
	timeout := time.After(signalWait)
	for range n {
		select {
		case err := <-returned:
			if err != nil {
				t.Fatal(err)
			}
			lags = append(lags, time.Since(from).Round(ms))
		case <-timeout:
			t.Fatalf("after %v: %s", signalWait, why(len(lags)))
		}
	}
	return lags
}

// ctlListening waits until n waiters of l's process count on resumes of l's key
// (sleepers and callers held: the key's listener's count) and the process's
// subscription to the key's channel is confirmed: from then on a resume's notice
// reaches them.
func ctlListening(t *testing.T, l *Limiter, n int) {
	t.Helper()
	h, ks := l.client().hub, l.client().key(l.t.tag)
	deadline := time.Now().Add(signalWait)
	for {
		ks.mu.Lock()
		got, ear := ks.nlisten, ks.notices
		ks.mu.Unlock()
		h.mu.Lock()
		ch := h.chans[keys.Name(l.t.tag, keys.Wake)]
		live := ch != nil && ch.live
		if ch != nil && ear != nil {
			if _, ok := ch.listeners[ear]; !ok {
				got = 0
			}
		}
		h.mu.Unlock()
		if got >= n && live {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %d waiters listening (subscription live %v), want %d", signalWait, got, live, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitRecorder collects the waits of the grants a limiter's Allowed hook reports.
type waitRecorder struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (w *waitRecorder) hooks() Hooks {
	return Hooks{Allowed: func(_ string, _ int, wait time.Duration) {
		w.mu.Lock()
		w.waits = append(w.waits, wait)
		w.mu.Unlock()
	}}
}

func (w *waitRecorder) since(i int) []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.waits[min(i, len(w.waits)):])
}

func (w *waitRecorder) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.waits)
}

// A key paused for an hour with four waiters, resumed after a second: every waiter
// books again from the resume, in order, and goes on at its new slot. The pause is set
// by this process (its waiters are then held by the Go side's hold, and the hold must
// end with the pause) or by another (a second Redis client stands for it: the waiters
// book behind the pause), and resumed by either: this process's waiters move on
// Resume's reply or on the notice the other's Resume publishes. The four grants booked
// again take effect at the resume plus 0, 100, 200 and 300ms (server clock), and no
// booking behind the pause is left. Nothing here waits on the pause: a waiter still on
// its old booking or held would return after an hour, so the test's bound is only how
// long a loaded machine may take.
//
// The waiters are all in one process: waiters of several processes booked behind one
// pause book again as each process hears of the resume, and one that books again
// before another has given its bookings back queues behind them (see Resume).
func TestResumeMovesTheWaiters(t *testing.T) {
	for _, c := range []struct{ pauser, resumer string }{
		{"this", "this"}, {"this", "other"}, {"other", "this"}, {"other", "other"},
	} {
		t.Run(fmt.Sprintf("paused-by-%s-resumed-by-%s", c.pauser, c.resumer), func(t *testing.T) {
			redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
				ctx := context.Background()
				tl := newTimeline(t, b)
				var waits waitRecorder
				this := tl.limiter("resume", Every(100*ms), WithHooks(waits.hooks()))
				other := ctlLimiterOn(tl, ctlOtherClient(t, b), "resume", Every(100*ms))
				pauser, resumer := this, other
				if c.pauser == "other" {
					pauser = other
				}
				if c.resumer == "this" {
					resumer = this
				}
				if err := pauser.Pause(ctx, time.Hour); err != nil {
					t.Fatal(err)
				}
				returned := make(chan error, 4)
				for range 4 {
					go func() { returned <- this.Wait(ctx) }()
				}
				ctlListening(t, this, 4)
				before := waits.count() // booked behind the pause: 0 when held, else 4
				if c.pauser == "other" {
					for deadline := time.Now().Add(signalWait); waits.count() < 4; time.Sleep(ms) {
						if time.Now().After(deadline) {
							t.Fatalf("%d waiters booked behind the pause after %v, want 4", waits.count(), signalWait)
						}
					}
					before = 4
				} else if before != 0 {
					t.Fatalf("%d waiters booked during this process's hold, want none", before)
				}
				tl.at(time.Second)
				resumed := time.Now()
				if err := resumer.Resume(ctx); err != nil {
					t.Fatal(err)
				}
				lags := ctlReturned(t, returned, 4, resumed, func(k int) string {
					return fmt.Sprintf("%d waiters went on after the resume, want 4: the others wait on the pause; grants %v",
						k, waits.since(0))
				})
				t.Logf("on %s: waiters went on %v after the resume (slots 0, 100, 200, 300ms)", b.Kind, lags)
				got := waits.since(before)
				slices.Sort(got)
				if want := []time.Duration{0, 100 * ms, 200 * ms, 300 * ms}; !slices.Equal(got, want) {
					t.Fatalf("grants booked after the resume wait %v, want %v: booked again from the resume, in order", got, want)
				}
				st, err := this.Inspect(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if st.PausedFor != 0 || st.Booked != 3 || st.BookedAhead != 300*ms {
					t.Fatalf("after the resume: paused %v, %d booked, the latest %v ahead; want no pause, 3 booked, 300ms ahead (the bookings behind the pause given back)",
						st.PausedFor, st.Booked, st.BookedAhead)
				}
			})
		})
	}
}

// A resume handled between a waiter's booking behind the pause coming back and the
// waiter going to sleep on it still moves it: the waiter books again from the resume
// and goes on, instead of sleeping out the pause. A key paused for an hour by another
// process; this process's Wait books behind the pause, and in the Allowed hook of that
// booking (before the Wait sleeps) the key is resumed: by this process's Resume (its
// waiters move on the reply), or by the other's (they move on the notice, which a first
// waiter, asleep behind the pause, listens for; the hook waits until the notice's move
// took that one). 20 times each: the Wait's booking again is now (after the first
// waiter's, 100ms later). A Wait still on its booking behind the pause would return
// after an hour: the test's bound is only how long a loaded machine may take.
func TestResumeMovesAWaiterAsItBooks(t *testing.T) {
	for _, resumer := range []string{"this", "other"} {
		t.Run("resumed-by-"+resumer, func(t *testing.T) {
			redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
				ctx := context.Background()
				tl := newTimeline(t, b)
				otherClient := ctlOtherClient(t, b)
				for i := range 20 {
					wctx, cancel := context.WithCancel(ctx) // ends the waiters of a failed try
					defer cancel()
					key := fmt.Sprintf("resume-as-booked-%d", i)
					var waits waitRecorder
					var armed atomic.Bool // the next booking behind the pause is the one to race
					var this, other *Limiter
					var hookErr atomic.Pointer[string]
					this = tl.limiter(key, Every(100*ms), WithHooks(Hooks{Allowed: func(k string, n int, wait time.Duration) {
						waits.hooks().Allowed(k, n, wait)
						if wait < time.Minute || !armed.CompareAndSwap(true, false) {
							return
						}
						resumerL := this
						if resumer == "other" {
							resumerL = other
						}
						if err := resumerL.Resume(ctx); err != nil {
							msg := err.Error()
							hookErr.Store(&msg)
							return
						}
						ks := this.client().key(this.t.tag)
						for deadline := time.Now().Add(signalWait); ks.lastResumed() == 0 || sendSleepers(this) != 0; time.Sleep(ms) {
							if time.Now().After(deadline) {
								msg := fmt.Sprintf("the resume was not handled within %v (resumed %d, %d asleep)", signalWait, ks.lastResumed(), sendSleepers(this))
								hookErr.Store(&msg)
								return
							}
						}
					}}))
					other = ctlLimiterOn(tl, otherClient, key, Every(100*ms))
					waits.waits = nil
					if err := other.Pause(ctx, time.Hour); err != nil {
						t.Fatal(err)
					}
					returned := make(chan error, 2)
					want := []time.Duration{0}
					if resumer == "other" { // a first waiter asleep behind the pause hears the notice
						go func() { returned <- this.Wait(wctx) }()
						sendEventually(t, signalWait, "the first waiter asleep", func() bool { return sendSleepers(this) == 1 })
						ctlListening(t, this, 1)
						want = []time.Duration{0, 100 * ms}
					}
					before := waits.count()
					armed.Store(true)
					go func() { returned <- this.Wait(wctx) }()
					ctlReturned(t, returned, len(want), time.Now(), func(int) string {
						return fmt.Sprintf("try %d: a waiter did not go on after the resume made as it booked: still on its booking behind the pause; bookings %v",
							i+1, waits.since(0))
					})
					if msg := hookErr.Load(); msg != nil {
						t.Fatalf("try %d: in the Allowed hook: %s", i+1, *msg)
					}
					got := waits.since(before + 1) // the bookings after the racing one's
					slices.Sort(got)
					if !slices.Equal(got, want) {
						t.Fatalf("try %d: bookings after the resume wait %v, want %v: booked again from the resume", i+1, got, want)
					}
					cancel()
				}
			})
		})
	}
}

// A check for a missed pause (checkPauses) that read the pause before another process
// resumed it, and whose reply comes after this process handled the resume, moves
// nothing: the pause it found is over, and the waiters the resume booked again from
// now keep those bookings. A key paused for an hour by another process, one slot a
// minute; two waiters of this process asleep behind the pause, the check made as the
// key's subscription was confirmed handled. The test has the key checked again and
// holds that check's reply (a hook on this process's client) until the resume's notice
// has booked both waiters again (at the resume, and a minute after it: the second
// sleeps on), then lets it go. Asked for a third check, the loop sends its inspect only
// once it has handled the second's reply: the second waiter must then still be asleep
// on its booking, none taken, no booking added.
func TestResumeOvertakesAPauseCheck(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel() // ends the waiter asleep on the resume's booking
		held := &heldInspect{sent: make(chan struct{}, 4), ran: make(chan struct{}), released: make(chan struct{})}
		b.Client.AddHook(held)
		defer held.release()
		tl := newTimeline(t, b)
		var waits waitRecorder
		this := tl.limiter("resume-overtakes-check", Every(time.Minute), WithHooks(waits.hooks()))
		other := ctlLimiterOn(tl, ctlOtherClient(t, b), "resume-overtakes-check", Every(time.Minute))
		if err := other.Pause(ctx, time.Hour); err != nil {
			t.Fatal(err)
		}
		ks := this.client().key(this.t.tag)
		returned := make(chan error, 2)
		for range 2 {
			go func() { returned <- this.Wait(ctx) }()
		}
		sendEventually(t, signalWait, "both waiters asleep behind the pause", func() bool { return sendSleepers(this) == 2 })
		ctlListening(t, this, 2)
		// the pause's notice went before the subscription: the first check found it
		sendEventually(t, signalWait, "the first check's pause handled", func() bool { return ks.pauseEnd.Load() != 0 })
		end := ks.pauseEnd.Load()
		check := func() {
			ks.mu.Lock()
			signal(ks.notices.check)
			ks.mu.Unlock()
		}
		held.armed.Store(true)
		check()
		select {
		case <-held.ran: // the second check has read the pause: its reply is held
		case <-time.After(signalWait):
			t.Fatalf("no check's inspect within %v", signalWait)
		}
		if err := other.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		ctlReturned(t, returned, 1, time.Now(), func(int) string {
			return fmt.Sprintf("the first waiter did not go on after the resume; bookings %v", waits.since(0))
		})
		sendEventually(t, signalWait, "the second waiter asleep on its booking from the resume", func() bool {
			return waits.count() == 4 && sendSleepers(this) == 1
		})
		if got, want := waits.since(2), []time.Duration{0, time.Minute}; !slices.Equal(got, want) {
			t.Fatalf("bookings from the resume wait %v, want %v", got, want)
		}
		if got := ks.lastResumed(); got != end {
			t.Fatalf("resume handled of the pause ending at %d, want %d (the one the check found)", got, end)
		}
		for len(held.sent) > 0 { // the checks' inspects so far
			<-held.sent
		}
		held.release()
		check()
		var asleep, flying int
		sendEventually(t, signalWait, "the third check's inspect sent (the second's reply handled), or the waiter taken", func() bool {
			ks.mu.Lock()
			asleep, flying = len(ks.sleepers), len(ks.flying)
			ks.mu.Unlock()
			if asleep != 1 || flying != 0 || waits.count() != 4 {
				return true // taken: the loop may find none asleep or in flight, and not check
			}
			select {
			case <-held.sent:
				return true
			default:
				return false
			}
		})
		if asleep != 1 || flying != 0 || waits.count() != 4 {
			t.Fatalf("after the check that read the pause before its resume: %d asleep, %d bookings in flight, bookings %v; want 1 asleep on its booking from the resume, none in flight, none added",
				asleep, flying, waits.since(0))
		}
	})
}

// heldInspect reports on sent each script call with an inspect request sent, and once
// armed holds the reply of the next one until released.
type heldInspect struct {
	armed         atomic.Bool
	sent          chan struct{}
	ran, released chan struct{}
	once          sync.Once
}

func (h *heldInspect) release() { h.once.Do(func() { close(h.released) }) }

func (h *heldInspect) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *heldInspect) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return h.around([]redis.Cmder{cmd}, func() error { return next(ctx, cmd) })
	}
}

func (h *heldInspect) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return h.around(cmds, func() error { return next(ctx, cmds) })
	}
}

func (h *heldInspect) around(cmds []redis.Cmder, call func() error) error {
	if !slices.ContainsFunc(cmds, ctlInspects) {
		return call()
	}
	select {
	case h.sent <- struct{}{}:
	default:
	}
	err := call()
	if h.armed.CompareAndSwap(true, false) {
		close(h.ran)
		<-h.released
	}
	return err
}

// ctlInspects reports whether cmd is a limiter script call with an inspect request
// (internal/protocol: op "i", alone or with its options).
func ctlInspects(cmd redis.Cmder) bool {
	if !sendIsEval(cmd) {
		return false
	}
	a := cmd.Args() // evalsha sha numkeys keys… heads… requests…
	nk, _ := strconv.Atoi(fmt.Sprint(a[2]))
	for _, r := range a[min(3+nk, len(a)):] {
		if s := fmt.Sprint(r); s == "i" || strings.HasPrefix(s, "i ") {
			return true
		}
	}
	return false
}

// A resume moves the waiters booked behind the pause it ends whatever pauses were
// resumed before, a later pause ending earlier than an earlier one included. Another
// process pauses the key for an hour; a first Wait of this process sleeps behind it and
// the key is resumed: the Wait goes on. The other pauses it again, for ten minutes (a
// pause ending fifty minutes before the first's end); a second Wait sleeps behind it
// and the key is resumed again, by this process (its waiters move on Resume's reply) or
// by the other (on the notice): the second Wait must book again from the resume and go
// on. Still on its booking behind the second pause it would return after ten minutes:
// the test's bound is only how long a loaded machine may take.
func TestResumeMovesTheWaitersOfAPauseEndingEarlier(t *testing.T) {
	for _, resumer := range []string{"this", "other"} {
		t.Run("resumed-by-"+resumer, func(t *testing.T) {
			redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel() // ends a waiter left asleep by a failed run
				tl := newTimeline(t, b)
				var waits waitRecorder
				this := tl.limiter("resume-earlier", Every(100*ms), WithHooks(waits.hooks()))
				other := ctlLimiterOn(tl, ctlOtherClient(t, b), "resume-earlier", Every(100*ms))
				resumerL := this
				if resumer == "other" {
					resumerL = other
				}
				pauseWaitResume := func(d, at time.Duration) {
					t.Helper()
					if err := other.Pause(ctx, d); err != nil {
						t.Fatal(err)
					}
					before := waits.count()
					returned := make(chan error, 1)
					go func() { returned <- this.Wait(ctx) }()
					sendEventually(t, signalWait, "the waiter asleep behind the pause", func() bool {
						return waits.count() == before+1 && sendSleepers(this) == 1
					})
					if got := waits.since(before)[0]; got < d-time.Second {
						t.Fatalf("the waiter booked %v ahead, want behind the %v pause", got, d)
					}
					ctlListening(t, this, 1)
					tl.at(at)
					if err := resumerL.Resume(ctx); err != nil {
						t.Fatal(err)
					}
					ctlReturned(t, returned, 1, time.Now(), func(int) string {
						return fmt.Sprintf("the waiter behind the %v pause did not go on after its resume: still on its booking behind the pause; bookings %v",
							d, waits.since(0))
					})
					if got := waits.since(before + 1); !slices.Equal(got, []time.Duration{0}) {
						t.Fatalf("bookings after the resume of the %v pause wait %v, want [0s]: booked again from the resume", d, got)
					}
				}
				pauseWaitResume(time.Hour, time.Second)
				tl.at(2 * time.Second)
				pauseWaitResume(10*time.Minute, 3*time.Second)
			})
		})
	}
}
