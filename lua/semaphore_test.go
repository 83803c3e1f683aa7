package lua

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// semReq is one semaphore request: op, token, place, join.
type semReq struct {
	op           int
	token, place string
	join         int
}

const (
	semAcquire = iota
	semExtend
	semRelease
	semInspect
)

func token(c byte) string { return strings.Repeat(string(c), 32) }

// semKeys are a semaphore's KEYS under tag: its leases, queue, places' expiries, and the
// key's limiter state (whose meta's pause it honours).
func semKeys(tag string) []string {
	return []string{tag + ":" + keys.Leases, tag + ":" + keys.Queue, tag + ":" + keys.QueueExpiry, tag + ":" + keys.State}
}

// semCall runs reqs in one call on the semaphore under tag (max leases, ttl µs).
func semCall(t testing.TB, b *redistest.Backend, tag string, max, ttl int64, reqs ...semReq) []res {
	t.Helper()
	args := []any{len(reqs)}
	detail := make([]bool, len(reqs))
	for i, r := range reqs {
		args = append(args, r.op, r.token, r.place, r.join)
		detail[i] = r.op == semInspect
	}
	args = append(args, max, ttl)
	out, err := exec(b, "semaphore", semKeys(tag), args, detail)
	if err != nil {
		t.Fatalf("semaphore %v: %v", reqs, err)
	}
	return out
}

// A lease's member is its holder's token; a place in the queue has its own id. A slot
// freed while a place heads the queue is handed to it under the place's id (published
// "h <id>"), and the next acquire with that place claims it under its own token; a
// token that holds no lease (a stale holder, a task's other handler) extends and releases
// nothing; the queue is FIFO; places lapse; the key's pause (a limiter's meta) hands
// nothing, and a limiter state without a pause is no pause.
func TestSemaphoreTokensAndPlaces(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tag := tagOf(b, "sem")
		clk := newClock(t, b, tag)
		sub := b.Client.Subscribe(ctx, tag+":"+keys.Wake)
		defer sub.Close()
		if _, err := sub.Receive(ctx); err != nil {
			t.Fatal(err)
		}
		ttl := 10 * sec
		sem := func(reqs ...semReq) []res { return semCall(t, b, tag, 1, ttl, reqs...) }
		A, B, C, D := token('a'), token('b'), token('c'), token('d')
		out := sem(semReq{semAcquire, A, A, 1})
		if out[0].v != [7]int64{1, 0, 1, 0, 0, 0, 0} {
			t.Fatalf("acquire: %v", out)
		}
		// full: the task "task1" queues (its handler's token B), then "task2" (C)
		out = sem(semReq{semAcquire, B, "task1", 1}, semReq{semAcquire, C, "task2", 1})
		if out[0].v != [7]int64{0, ttl, 1, 0, 0, 0, 0} || out[1].v[0] != 0 {
			t.Fatalf("denied: %v", out)
		}
		// a stale holder's extend and release act on nothing
		out = sem(semReq{semExtend, D, "", 0}, semReq{semRelease, D, "", 0})
		if out[0].v[0] != 0 || out[1].v[0] != 0 || out[1].v[2] != 1 {
			t.Fatalf("a token holding nothing: %v", out)
		}
		// A releases: the slot goes to the head of the queue, task1, under its id
		clk.add(t, time.Second)
		out = sem(semReq{semRelease, A, A, 0}, semReq{semInspect, "", "", 5})
		if out[0].v[0] != 1 || out[0].v[2] != 1 {
			t.Fatalf("release: %v", out)
		}
		if e := out[1].extra; e[0] != 1 || e[1] != 1 || e[4] != 1 || e[5] != ttl {
			t.Fatalf("inspect after the hand-off: %v", out[1])
		}
		if msg, err := sub.ReceiveMessage(ctx); err != nil || msg.Payload != "h task1" {
			t.Fatalf("hand-off published %v %v", msg, err)
		}
		if s := b.Client.ZScore(ctx, tag+":sem", "task1").Val(); s != float64(clk.us()+ttl) {
			t.Fatalf("the slot handed to task1: score %v", s)
		}
		// task1's retry, with a new token E, claims it; its old handler's token B holds nothing
		E := token('e')
		out = sem(semReq{semAcquire, E, "task1", 1}, semReq{semExtend, B, "", 0})
		if out[0].v[0] != 1 || out[1].v[0] != 0 {
			t.Fatalf("claim: %v", out)
		}
		if b.Client.ZScore(ctx, tag+":sem", E).Err() != nil || b.Client.ZScore(ctx, tag+":sem", "task1").Err() == nil {
			t.Fatalf("the lease did not pass from the place to the token")
		}
		// task2 gives up its place: nothing is handed when E releases
		sem(semReq{semRelease, C, "task2", 0})
		out = sem(semReq{semRelease, E, "task1", 0}, semReq{semInspect, "", "", 0})
		if out[0].v[0] != 1 || out[1].extra[0] != 0 || out[1].extra[1] != 0 {
			t.Fatalf("after task2 left: %v", out)
		}
		// a place lapses after ttl_us unless renewed
		sem(semReq{semAcquire, A, A, 0})
		sem(semReq{semAcquire, B, "late", 1})
		clk.add(t, 11*time.Second) // A's lease expired too
		out = sem(semReq{semAcquire, C, C, 0}, semReq{semInspect, "", "", 0})
		if out[0].v[0] != 1 || out[1].extra[1] != 0 {
			t.Fatalf("a lapsed place: %v", out)
		}
		for _, k := range semKeys(tag)[:3] {
			if b.Client.Exists(ctx, k).Val() == 1 && b.Client.PTTL(ctx, k).Val() <= 0 {
				t.Fatalf("%s has no TTL", k)
			}
		}
		// a limiter's state on the key without a pause: no pause
		lim := call{a: slidingWindow, limits: []limit{{5, sec, 0}}}
		lim.one(t, b, tag, acquire(1, 0))
		out = sem(semReq{semRelease, C, C, 0}, semReq{semAcquire, A, A, 0})
		if out[0].v[0] != 1 || out[1].v[0] != 1 {
			t.Fatalf("beside a limiter's state: %v", out)
		}
		// the key paused (by a limiter's pause): nothing is granted or handed; the wait
		// covers the pause, the denial says how long it lasts, and inspect shows it
		lim.one(t, b, tag, pause(5*sec))
		out = sem(semReq{semRelease, A, A, 0}, semReq{semAcquire, B, B, 0}, semReq{semInspect, "", "", 0})
		if out[0].v[0] != 1 || out[1].v != [7]int64{0, 5 * sec, 0, 5 * sec, 0, 0, 0} || out[2].extra[2] != 5*sec {
			t.Fatalf("paused: %v", out)
		}
		b.Client.Del(ctx, tag+":"+keys.State)
		(call{a: tokenBucket, limits: []limit{{5, sec, 5}}}).one(t, b, tag, pause(2*sec)) // a meta alone in a string
		if out := sem(semReq{semAcquire, B, B, 0}); out[0].v[0] != 0 || out[0].v[1] != 2*sec {
			t.Fatalf("paused by a bucket's pause: %v", out)
		}
	})
}

// The semaphore's argument errors: k, max and ttl_us fail the call with JTARG; a
// request's own fail it alone (ErrArg); foreign keys fail the requests (ErrState; a
// place not ours in reach: those that hand off), writing nothing.
func TestSemaphoreErrors(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tag := tagOf(b, "semerr")
		newClock(t, b, tag)
		ks := semKeys(tag)
		A := token('a')
		for name, args := range map[string][]any{
			"k 0": {0, 1, 1000}, "max 0": {1, 0, A, A, 0, 0, 1000}, "ttl 999": {1, 0, A, A, 0, 1, 999},
			"too many": {1, 0, A, A, 0, 1, 1000, 1}, "no arguments": {}, "k 1001": {1001, 1, 1000},
		} {
			if err := script(b, "semaphore").Run(ctx, b.Client, ks, args...).Err(); err == nil || !strings.Contains(err.Error(), "JTARG") {
				t.Errorf("%s: %v, want JTARG", name, err)
			}
		}
		if err := script(b, "semaphore").Run(ctx, b.Client, ks[:3], 1, 0, A, A, 0, 1, 1000).Err(); err == nil || !strings.Contains(err.Error(), "JTARG") {
			t.Errorf("three keys: %v, want JTARG", err)
		}
		out := semCall(t, b, tag, 1, sec,
			semReq{4, A, A, 0}, semReq{semAcquire, "A", A, 0}, semReq{semAcquire, A, "", 0},
			semReq{semAcquire, A, "a b", 0}, semReq{semAcquire, A, A, 2}, semReq{semExtend, A, "", 1},
			semReq{semInspect, "", "", 1001}, semReq{semAcquire, A, A, 0})
		for i, r := range out[:7] {
			if r.code() != protocol.ErrArg || !strings.HasPrefix(r.err, "JTARG request ") {
				t.Errorf("request %d: %v, want ErrArg", i+1, r)
			}
		}
		if out[7].v[0] != 1 {
			t.Errorf("the good request: %v", out[7])
		}
		// a place not ours at the head of the queue: a hand-off would reach it
		b.Client.Del(ctx, ks...)
		b.Client.ZAdd(ctx, tag+":semq", redis.Z{Score: 1, Member: "not a place"})
		before := snapshot(t, b.Client, ks...)
		out = semCall(t, b, tag, 1, sec, semReq{semAcquire, A, A, 0}, semReq{semInspect, "", "", 0})
		if out[0].code() != protocol.ErrState || !strings.HasPrefix(out[0].err, tag+":semq") || out[1].failed() {
			t.Errorf("a foreign place: %v", out)
		}
		if after := snapshot(t, b.Client, ks...); !sameKeys(b, before, after) {
			t.Errorf("a foreign place: %v became %v", before, after)
		}
		for _, k := range ks {
			wants := []string{"zset"}
			if k == tag+":"+keys.State { // a limiter's state: a string, or a log's list
				wants = []string{"string", "list"}
			}
			for _, want := range wants {
				for _, kind := range []string{"type", "text"} {
					if kind == "text" && k != tag+":"+keys.State {
						continue // a sorted set's members are checked when a hand-off reaches them
					}
					b.Client.Del(ctx, ks...)
					putForeign(t, b.Client, k, want, kind)
					before := snapshot(t, b.Client, ks...)
					for _, r := range semCall(t, b, tag, 1, sec, semReq{semAcquire, A, A, 0}, semReq{semInspect, "", "", 0}) {
						if r.code() != protocol.ErrState || !strings.HasPrefix(r.err, k) {
							t.Errorf("%s of another %s than a %s: %v", k, kind, want, r)
						}
					}
					if after := snapshot(t, b.Client, ks...); !sameKeys(b, before, after) {
						t.Errorf("%s of another %s than a %s: %v became %v", k, kind, want, before, after)
					}
				}
			}
		}
	})
}

// semBatchVsLone is batchVsLone for the semaphore: tokens a..d, places p, q and the
// tokens themselves.
func semBatchVsLone(t *testing.T, b *redistest.Backend, rounds int, pick func(n int) int) {
	t.Helper()
	tagA, tagB := tagOf(b, "semA"), tagOf(b, "semB")
	clk := newClock(t, b, tagA, tagB)
	for round := range rounds {
		clk.add(t, time.Duration(pick(400))*time.Millisecond)
		k := 1 + pick(8)
		reqs := make([]semReq, k)
		for i := range reqs {
			tok := token("abcd"[pick(4)])
			place := []string{"p", "q", tok}[pick(3)]
			switch op := pick(9); {
			case op < 4:
				reqs[i] = semReq{semAcquire, tok, place, pick(2)}
			case op < 5:
				reqs[i] = semReq{semExtend, tok, "", 0}
			case op < 7:
				reqs[i] = semReq{semRelease, tok, []string{"", place}[pick(2)], 0}
			case op < 8:
				reqs[i] = semReq{semInspect, "", "", pick(3)}
			default:
				reqs[i] = semReq{semAcquire, "bad", place, 0}
			}
		}
		var want []res
		for _, r := range reqs {
			want = append(want, semCall(t, b, tagA, 2, sec, r)[0])
		}
		got := semCall(t, b, tagB, 2, sec, reqs...)
		for i := range got {
			g, w := got[i], want[i]
			if b.Real() && g.extra != nil && w.extra != nil {
				g.extra[3] = w.extra[3]
			}
			g.err, w.err = requestNumber.ReplaceAllString(g.err, "request N:"), requestNumber.ReplaceAllString(w.err, "request N:")
			if comparable(g) != comparable(w) {
				t.Fatalf("round %d, request %d of %v: batch %v, lone %v", round, i+1, reqs, g, w)
			}
		}
		ka, kb := semKeys(tagA)[:3], semKeys(tagB)[:3]
		sa, sb := snapshot(t, b.Client, ka...), snapshot(t, b.Client, kb...)
		for i := range ka {
			x, y := sa[ka[i]], sb[kb[i]]
			if b.Real() {
				x, y = x[:strings.LastIndex(x, " ttl ")], y[:strings.LastIndex(y, " ttl ")]
			}
			if x != y {
				t.Fatalf("round %d: %s holds %s after lone calls, %s after the batch", round, ka[i], x, y)
			}
		}
	}
}

var requestNumber = regexp.MustCompile(`request \d+:`)
