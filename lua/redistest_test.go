package lua

import (
	"context"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// internal/redistest reads this protocol: RecordGrants's hook finds the grants and
// give-backs of a call's requests (a booking found is not a new grant), and AuditScript
// records on the server what each request granted anew.
func TestRedistestReadsTheProtocol(t *testing.T) {
	b := redistest.NewMini(t)
	ctx := context.Background()
	grants := redistest.RecordGrants(b.Client)
	tag := tagOf(b, "grants")
	clk := newClock(t, b, tag)
	c := limiterCall{a: slidingWindow, limits: []limit{{2, sec, 0}}}
	bk := req{op: opAcquire, n: 1, x: 5 * sec, booking: "t"}
	out := c.run(t, b, tag, acquire(1, 0), acquire(1, 0), acquire(1, 0), bk)
	c.run(t, b, tag, bk) // found: not a new grant; its stamp moves on
	clk.add(t, time.Millisecond)
	c.run(t, b, tag, req{op: opCancel, n: 1, x: out[3].v[5], booking: "t"}, cancel(1, out[1].v[4]))
	list := grants.List()
	if len(list) != 3 || list[2].Booking != tag+":bk:t" || !list[2].At.Equal(time.UnixMicro(out[3].v[4])) || grants.Calls() != 3 {
		t.Fatalf("grants %+v, %d calls", list, grants.Calls())
	}
	if g := grants.GiveBacks(); len(g) != 2 || g[0].OK || !g[0].At.IsZero() || g[1].OK {
		t.Fatalf("give-backs %+v", g)
	}

	audited := redistest.AuditScript(Source("bucket"))
	tb := limiterCall{a: tokenBucket, limits: []limit{{2, sec, 2}}}
	keys, idx := tb.keys(tag, []req{acquire(1, 0), acquire(2, 0), acquire(0, 0), acquire(1, 0)})
	if err := audited.Run(ctx, b.Client, keys, tb.argv([]req{acquire(1, 0), acquire(2, 0), acquire(0, 0), acquire(1, 0)}, idx)...).Err(); err != nil {
		t.Fatal(err)
	}
	rows, err := redistest.ReadAudit(ctx, b.Client, tag+":tb")
	if err != nil || len(rows) != 2 || rows[0].N != 1 || rows[1].N != 1 || !rows[0].At.Equal(clk.now) {
		t.Fatalf("audit %+v %v", rows, err)
	}
}
