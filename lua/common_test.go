package lua

import (
	"context"
	"strings"
	"testing"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// Nothing lands on a key jobthrottle does not own (common.lua's read_key and foreign): a
// foreign state key fails every request of the call with ErrState, a control op too (the
// pause and override live in the state's meta), and nothing is written; a foreign
// booking key fails the requests that name it only, and is left as it was.
func TestForeignKeys(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, a := range allAlgos {
			stateType := map[bool]string{true: "list", false: "string"}[a.name == "log"]
			c := call{a: a, limits: []limit{{5, sec, 5}}, caps: []limit{{2, sec, 2}}}
			for _, kind := range []string{"type", "text"} {
				name := func(s string) string { return strings.Join([]string{a.tag, s, kind}, "-") }

				tag := tagOf(b, name("state"))
				state := tag + ":" + keys.State
				all := []string{state, tag + ":bk:t", tag + ":q", tag + ":t:A"}
				newClock(t, b, tag)
				putForeign(t, b.Client, state, stateType, kind)
				before := snapshot(t, b.Client, all...)
				out := c.run(t, b, tag, acquire(1, 0), inspect(), pause(sec), override(sec, 3, 3), resume(),
					booking(acquire(1, 5*sec), "t", 0), c.of("A", acquire(1, 0)), cancel(1, 1))
				for i, r := range out {
					if r.code() != protocol.ErrState || !strings.HasPrefix(r.err, state+": ") {
						t.Errorf("%s, foreign state (%s), request %d: %v, want ErrState", a.tag, kind, i+1, r)
					}
				}
				if after := snapshot(t, b.Client, all...); !sameKeys(b, before, after) {
					t.Errorf("%s, foreign state (%s): %v became %v", a.tag, kind, before, after)
				}
				if got := (call{a: a, limits: c.limits}).one(t, b, tag, acquire(1, 0)); got.code() != protocol.ErrState {
					t.Errorf("%s, foreign state (%s), a plain acquire: %v", a.tag, kind, got)
				}

				tag = tagOf(b, name("booking"))
				bk := tag + ":bk:t"
				newClock(t, b, tag)
				putForeign(t, b.Client, bk, "string", kind)
				before = snapshot(t, b.Client, bk)
				out = c.run(t, b, tag, acquire(1, 0), booking(acquire(1, 10*sec), "t", 0), booking(cancel(1, 1), "t", 0),
					booking(c.of("A", acquire(1, 0)), "t", 0))
				if out[0].v[0] != 1 || !strings.HasPrefix(out[1].err, bk+": ") || out[2].code() != protocol.ErrState ||
					out[3].code() != protocol.ErrState {
					t.Errorf("%s, foreign booking key (%s): %v", a.tag, kind, out)
				}
				if out[1].code() != protocol.ErrState {
					t.Errorf("%s, foreign booking key (%s): code %d, want ErrState", a.tag, kind, out[1].code())
				}
				if after := snapshot(t, b.Client, bk); !sameKeys(b, before, after) {
					t.Errorf("%s, foreign booking key (%s): %v became %v", a.tag, kind, before, after)
				}
			}
		}
	})
}

// Every state key's TTL is what its file's header says (miniredis keeps the test's
// clock for TTLs): the log's until its last entry leaves the longest window, the
// bucket's until every bucket is full, the window's to the end of the longest window
// holding the latest grant; a tenant's state likewise by its caps.
func TestStateTTLs(t *testing.T) {
	b := redistest.NewMini(t)
	ctx := context.Background()
	for _, tc := range []struct {
		a    algo
		ttl  int64 // ms
		note string
	}{
		{slidingWindow, 1500, "the 1.5s period"},
		{algo{"log", keys.SlidingCounter, 50, false}, 1510, "recorded at the end of its 10ms sub-bucket"},
		{tokenBucket, 1500, "4 tokens at 4 per 1.5s"},
		{fixedWindow, 1000, "Epoch is 500ms into its 1.5s window"},
	} {
		tag, ttag := tagOf(b, "ttl"+tc.a.tag), tagOf(b, "ttltenant"+tc.a.tag)
		newClock(t, b, tag, ttag)
		two := []limit{{4, 500 * ms, 4}, {4, 1500 * ms, 4}}
		c := call{a: tc.a, limits: two, caps: two}
		c.run(t, b, tag, acquire(4, 0))
		c.run(t, b, ttag, c.of("A", acquire(4, 0)))
		for _, k := range []string{tag + ":" + keys.State, ttag + ":t:A"} {
			if got := b.Client.PTTL(ctx, k).Val().Milliseconds(); got != tc.ttl {
				t.Errorf("%s: %s's TTL %dms, want %dms (%s)", tc.a.tag, k, got, tc.ttl, tc.note)
			}
		}
	}
}
