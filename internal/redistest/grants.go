package redistest

import (
	"context"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Grants records what limiter scripts granted, by the server time each grant takes
// effect (the token in the script's reply), and how many script calls were made. Add
// it to a client with RecordGrants; it reads replies, it changes nothing.
type Grants struct {
	mu     sync.Mutex
	grants []Grant
	calls  int
}

// Grant is n permits taking effect at At (server clock).
type Grant struct {
	At time.Time
	N  int
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
		err := next(ctx, cmd)
		g.observe(cmd)
		return err
	}
}

func (g *Grants) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			g.observe(c)
		}
		return err
	}
}

// observe reads an EVAL/EVALSHA of a limiter script: args are
// [evalsha, sha, numkeys, keys..., op, n, x, ...], the reply
// [granted, remaining, wait_us, reset_us, token].
func (g *Grants) observe(cmd redis.Cmder) {
	name := strings.ToLower(cmd.Name())
	if (name != "evalsha" && name != "eval") || cmd.Err() != nil {
		return
	}
	args := cmd.Args()
	if len(args) < 3 {
		return
	}
	nkeys, ok := args[2].(int)
	if !ok || len(args) < 3+nkeys+3 {
		return
	}
	op, _ := toInt(args[3+nkeys])
	n, _ := toInt(args[4+nkeys])
	x, _ := toInt(args[5+nkeys])
	c, ok := cmd.(*redis.Cmd)
	if !ok {
		return
	}
	v, err := c.Int64Slice()
	if err != nil || len(v) != 5 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls++
	switch {
	case op == 0 && v[0] == 1 && n > 0:
		g.grants = append(g.grants, Grant{At: time.UnixMicro(v[4]), N: int(n)})
	case op == 1 && v[0] == 1:
		g.cancel(time.UnixMicro(x), int(n))
	}
}

// cancel removes n permits recorded at t (a booking that was given back).
func (g *Grants) cancel(t time.Time, n int) {
	for i := len(g.grants) - 1; i >= 0 && n > 0; i-- {
		if g.grants[i].At.Equal(t) {
			take := min(n, g.grants[i].N)
			g.grants[i].N -= take
			n -= take
		}
	}
}

func toInt(v any) (int64, bool) {
	switch v := v.(type) {
	case int:
		return int64(v), true
	case int64:
		return v, true
	}
	return 0, false
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
