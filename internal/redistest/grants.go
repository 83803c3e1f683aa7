package redistest

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/redis/go-redis/v9"
)

// Grants records what limiter scripts granted, by the server time each grant takes
// effect (the token in the script's reply), and how many script calls were made. Add
// it to a client with RecordGrants; it reads replies, it changes nothing.
type Grants struct {
	mu        sync.Mutex
	grants    []Grant
	giveBacks []GiveBack
	calls     int
	keyCalls  map[string]int
}

// GiveBack is a cancel that gave back the booking taking effect at At, or tried to: the
// script refuses once the booking has taken effect by the server's clock. At is zero for
// a task's give-back (a cancel with a booking key) refused because the booking was no
// longer the caller's (its task's copy had taken it over) or was gone.
type GiveBack struct {
	Key string
	At  time.Time
	N   int
	// OK reports whether the script gave the permits back.
	OK bool
	// Sent and Replied are when the call was sent and its reply read, by this
	// process's clock: the script ran in between.
	Sent, Replied time.Time
}

// Grant is n permits taking effect at At (server clock).
type Grant struct {
	At time.Time
	N  int
	// Key is the limiter's state key (the script's KEYS[1]).
	Key string
	// Wait is how long after the call the grant takes effect, as the script said
	// (At - Wait is the server's clock when the script ran).
	Wait time.Duration
	// Sent is when the call was sent, by this process's clock.
	Sent time.Time
	// Booking is the task's booking key of a grant booked for a task, else "".
	Booking string
	// Tenant is the tenant whose handle made the grant, else "".
	Tenant string
}

// RecordGrants adds a hook to c that records every grant and cancel of the limiter
// scripts run through it.
func RecordGrants(c redis.UniversalClient) *Grants {
	g := &Grants{}
	c.AddHook(g)
	return g
}

func (g *Grants) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *Grants) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		sent := time.Now()
		err := next(ctx, cmd)
		g.observe(cmd, sent, time.Now())
		return err
	}
}

func (g *Grants) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		sent := time.Now()
		err := next(ctx, cmds)
		replied := time.Now()
		for _, c := range cmds {
			g.observe(c, sent, replied)
		}
		return err
	}
}

// observe records the grants and cancels of a limiter script call (its KEYS[1] is the
// state key, ":l"): args are [evalsha, sha, numkeys, keys..., head, caps, requests...]
// (internal/protocol) and the reply Width integers per request, each read as a call of
// its own would be.
func (g *Grants) observe(cmd redis.Cmder, sent, replied time.Time) {
	name := strings.ToLower(cmd.Name())
	if (name != "evalsha" && name != "eval") || cmd.Err() != nil {
		return
	}
	args := cmd.Args()
	if len(args) < 4 {
		return
	}
	nkeys, ok := args[2].(int)
	if !ok || nkeys < 1 || len(args) < 3+nkeys+3 {
		return
	}
	key, _ := args[3].(string)
	if !strings.HasSuffix(key, "}:"+keys.State) {
		return // the semaphore, or another script
	}
	ks, argv := args[3:3+nkeys], args[5+nkeys:]
	var reply []int64 // the reply's integers; -1 for any other element
	switch c := cmd.(type) {
	case *redis.Cmd:
		s, ok := c.Val().([]any)
		if !ok {
			return
		}
		reply = int64s(s)
	case *redis.IntSliceCmd: // how package throttle reads a script's reply
		reply = c.Val()
	default:
		return
	}
	k := len(argv)
	if len(reply) < protocol.Width*k {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.countCall(key)
	for i := range k {
		v := reply[protocol.Width*i : protocol.Width*(i+1)]
		text, _ := argv[i].(string)
		if v[0] == -1 || text == "" {
			continue // this request's error
		}
		g.record(key, parseRequest(text, ks), v, sent, replied)
	}
}

// request is what Grants reads of a request's text (internal/protocol).
type request struct {
	op      string
	n, x    int64
	booking string // a task's booking key
	tenant  string
}

// parseRequest reads a request's text, naming its keys from ks (the call's KEYS).
func parseRequest(text string, ks []any) request {
	var r request
	body, tenant, _ := strings.Cut(text, " t")
	r.tenant = tenant
	f := strings.Fields(body)
	r.op = f[0]
	if len(f) >= 3 && (r.op == protocol.OpAcquire || r.op == protocol.OpCancel) {
		r.n, _ = strconv.ParseInt(f[1], 10, 64)
		r.x, _ = strconv.ParseInt(f[2], 10, 64)
	}
	for _, o := range f[1:] {
		if strings.HasPrefix(o, "b") {
			if i, err := strconv.Atoi(o[1:]); err == nil && i >= 1 && i <= len(ks) {
				r.booking, _ = ks[i-1].(string)
			}
		}
	}
	return r
}

func (g *Grants) countCall(key string) {
	g.calls++
	if g.keyCalls == nil {
		g.keyCalls = map[string]int{}
	}
	g.keyCalls[key]++
}

// int64s reads a reply's integers; a non-integer element reads as -1.
func int64s(s []any) []int64 {
	v := make([]int64, len(s))
	for i, e := range s {
		x, ok := e.(int64)
		if !ok {
			x = -1
		}
		v[i] = x
	}
	return v
}

// record notes one request's grant or cancel: r is the request, v its reply.
func (g *Grants) record(key string, r request, v []int64, sent, replied time.Time) {
	switch {
	case r.op == protocol.OpAcquire && r.n > 0 && (v[0] == 1 || (v[0] == 2 && !g.seen(key, time.UnixMicro(v[4])))):
		// A booking found (2) was counted when it was made. One this recorder never saw
		// made (the call that made it ran in Redis but its caller had left: an error here,
		// e.g. the handler's context cancelled at shutdown) is counted now, when the task
		// uses it.
		g.grants = append(g.grants, Grant{At: time.UnixMicro(v[4]), N: int(r.n), Key: key,
			Wait: time.Duration(v[2]) * time.Microsecond, Sent: sent, Booking: r.booking, Tenant: r.tenant})
	case r.op == protocol.OpCancel:
		x := r.x
		if r.booking != "" { // x is the caller's stamp; the reply names the booking's token
			x = v[4]
		}
		at := time.UnixMicro(x)
		if x == 0 {
			at = time.Time{}
		}
		g.giveBacks = append(g.giveBacks, GiveBack{Key: key, At: at, N: int(r.n), OK: v[0] == 1, Sent: sent, Replied: replied})
		if v[0] == 1 {
			g.cancel(key, time.UnixMicro(x), int(r.n), r.booking)
		}
	}
}

// seen reports whether a grant on key at t was recorded (given back since or not).
func (g *Grants) seen(key string, t time.Time) bool {
	for _, r := range g.grants {
		if r.Key == key && r.At.Equal(t) {
			return true
		}
	}
	return false
}

// cancel removes n permits recorded on key at t (a booking that was given back); a
// task's (booking, its booking key) from that task's grant, not another's at the
// same time, so that Overtaken finds the grant that stands.
func (g *Grants) cancel(key string, t time.Time, n int, booking string) {
	for i := len(g.grants) - 1; i >= 0 && n > 0; i-- {
		if g.grants[i].Key == key && g.grants[i].At.Equal(t) && (booking == "" || g.grants[i].Booking == booking) {
			take := min(n, g.grants[i].N)
			g.grants[i].N -= take
			n -= take
		}
	}
}

// Add records grants observed elsewhere, e.g. reported by another process.
func (g *Grants) Add(grants ...Grant) {
	g.mu.Lock()
	g.grants = append(g.grants, grants...)
	g.mu.Unlock()
}

// AddCalls counts n script calls on key made elsewhere.
func (g *Grants) AddCalls(key string, n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls += n
	if g.keyCalls == nil {
		g.keyCalls = map[string]int{}
	}
	g.keyCalls[key] += n
}

// ByKey returns the grants that stand, and the calls made, split by state key.
func (g *Grants) ByKey() map[string]*Grants {
	out := map[string]*Grants{}
	get := func(key string) *Grants {
		if out[key] == nil {
			out[key] = &Grants{keyCalls: map[string]int{}}
		}
		return out[key]
	}
	for _, gr := range g.List() {
		k := get(gr.Key)
		k.grants = append(k.grants, gr)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for key, n := range g.keyCalls {
		k := get(key)
		k.calls += n
		k.keyCalls[key] = n
	}
	return out
}

// Calls returns how many limiter script calls were made.
func (g *Grants) Calls() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls
}

// List returns the grants that stand (cancelled ones left out), sorted by time.
func (g *Grants) List() []Grant {
	g.mu.Lock()
	var list []Grant
	for _, gr := range g.grants {
		if gr.N > 0 {
			list = append(list, gr)
		}
	}
	g.mu.Unlock()
	sort.SliceStable(list, func(i, j int) bool { return list[i].At.Before(list[j].At) })
	return list
}

// Overtaken returns the standing grants booked for a task that the same task booked
// anew after they had taken effect: the task came back to its booking too late to
// use it (the script books anew when the recorded token has passed, by the server's
// clock), so each is a permit that took effect unused. Whether one was overtaken is
// read from the server's clock alone: the later call ran at At - Wait.
func (g *Grants) Overtaken() []Grant {
	var out []Grant
	list := g.List()
	for i, a := range list {
		if a.Booking == "" {
			continue
		}
		for _, b := range list[i+1:] {
			if b.Key == a.Key && b.Booking == a.Booking && b.At.Add(-b.Wait).After(a.At) {
				out = append(out, a)
				break
			}
		}
	}
	return out
}

// GiveBacks returns the calls that gave back a booking or tried to, in the order
// their replies were read.
func (g *Grants) GiveBacks() []GiveBack {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]GiveBack(nil), g.giveBacks...)
}

// Total returns the permits granted.
func (g *Grants) Total() int {
	n := 0
	for _, gr := range g.List() {
		n += gr.N
	}
	return n
}

// MaxInWindow returns the most permits that took effect in any window [s, s+d).
func (g *Grants) MaxInWindow(d time.Duration) int {
	list := g.List()
	best, sum, j := 0, 0, 0
	for i := range list {
		sum += list[i].N
		for list[i].At.Sub(list[j].At) >= d {
			sum -= list[j].N
			j++
		}
		best = max(best, sum)
	}
	return best
}

// MaxTimesInWindow returns the most of the times sorted (in rising order) that fall
// in any window [s, s+d).
func MaxTimesInWindow(sorted []time.Time, d time.Duration) int {
	best, j := 0, 0
	for i := range sorted {
		for sorted[i].Sub(sorted[j]) >= d {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

// MaxOverBucket checks the grants against a token bucket of burst permits refilled
// at rate per period, full before the first grant: it returns the most permits any
// grant took beyond what the bucket held at its time (0: every grant conformed), and
// when that was. The arithmetic is exact (integers, in units of 1/rate µs).
func (g *Grants) MaxOverBucket(rate int, period time.Duration, burst int) (excess int, at time.Time) {
	list := g.List()
	if len(list) == 0 {
		return 0, time.Time{}
	}
	p := period.Microseconds()
	r := int64(rate)
	t0 := list[0].At.UnixMicro()
	var tat int64 // theoretical arrival time × rate, from t0
	for _, gr := range list {
		t := (gr.At.UnixMicro() - t0) * r
		tat = max(tat, t) + int64(gr.N)*p
		if over := tat - t - int64(burst)*p; over > 0 {
			if n := int((over + p - 1) / p); n > excess {
				excess, at = n, gr.At
			}
		}
	}
	return excess, at
}

// Span returns the first and last grant times.
func (g *Grants) Span() (first, last time.Time) {
	list := g.List()
	if len(list) == 0 {
		return
	}
	return list[0].At, list[len(list)-1].At
}

// Between returns the permits that took effect in [from, to].
func (g *Grants) Between(from, to time.Time) int {
	n := 0
	for _, gr := range g.List() {
		if !gr.At.Before(from) && !gr.At.After(to) {
			n += gr.N
		}
	}
	return n
}

// Utilization is the share of the rate used after the first period, while demand
// lasted: the permits that took effect in the whole periods [first+p, first+k·p) that
// end by the last grant, over (k-1)·rate. Bursty algorithms grant at period edges, so
// whole periods are what compare fairly, and the period holding the last grant is left
// out because demand ended in it; 1.0 means every permit the limit allowed was used.
func (g *Grants) Utilization(p time.Duration, rate int) float64 {
	first, last := g.Span()
	k := int64(last.Sub(first) / p)
	if k < 2 {
		return 0
	}
	from, to := first.Add(p), first.Add(time.Duration(k)*p)
	n := 0
	for _, gr := range g.List() {
		if !gr.At.Before(from) && gr.At.Before(to) {
			n += gr.N
		}
	}
	return float64(n) / float64((k-1)*int64(rate))
}
