package redistest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Pair is a miniredis and a real redis-server that a fuzz target runs every input on,
// side by side: the same script calls on the same state at the same (test-set) time,
// so their replies and the state they leave must be identical.
//
// Run the production scripts on miniredis, whose clock (SetTime) moves TIME and TTLs
// together, and FakeClockScript copies on the real server. Only miniredis keeps the
// test's clock for TTLs, so it is the reference for the state: Sync copies the
// tracked keys' values from miniredis to the real server before each call (with their
// TTL plus SyncSlack, so that the real server expires nothing while the fake clock
// stands), and Compare reads both after it. Both servers are shared by all the inputs a
// process runs; each Pair gets a fresh Prefix, and its tracked keys are deleted from
// the real server when the test ends (miniredis is flushed by the next NewPair).
type Pair struct {
	Mini *Backend
	Real *Backend
	keys []string
}

// SyncSlack is what Sync adds to the TTL of each key it copies to the real server.
const SyncSlack = 10 * time.Second

var (
	pairOnce sync.Once
	pairMini *miniredis.Miniredis
	pairMC   *redis.Client
	pairRC   *redis.Client
	pairErr  error
)

// NewPair returns the pair for one fuzz input: miniredis flushed, its clock at Epoch
// (TTLs follow it), and the real redis-server (REDIS_ADDR, or one started for the
// process). Without a real server the test is skipped, or fails under
// JOBTHROTTLE_REQUIRE_REAL.
func NewPair(t testing.TB) *Pair {
	t.Helper()
	pairOnce.Do(func() {
		m, err := miniredis.Run()
		if err != nil {
			pairErr = err
			return
		}
		m.ClockTTL(true)
		pairMini = m
		pairMC = redis.NewClient(&redis.Options{Addr: m.Addr()})
		addr, err := StandaloneAddr()
		if err != nil {
			pairErr = err
			return
		}
		pairRC = redis.NewClient(&redis.Options{Addr: addr})
	})
	if pairMini == nil {
		t.Fatalf("miniredis: %v", pairErr)
	}
	if pairRC == nil {
		unavailable(t, pairErr, noRealRedis)
	}
	pairMini.FlushAll()
	pairMini.SetTime(Epoch)
	prefix := uniquePrefix(t)
	p := &Pair{
		Mini: &Backend{Kind: Mini, Client: pairMC, Mini: pairMini, Prefix: prefix},
		Real: &Backend{Kind: Standalone, Client: pairRC, Prefix: prefix},
	}
	t.Cleanup(func() {
		if len(p.keys) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			pairRC.Del(ctx, p.keys...)
		}
	})
	return p
}

// Track adds keys to those Sync copies, Compare reads and the end of the test deletes.
func (p *Pair) Track(keys ...string) {
	for _, k := range keys {
		if !slices.Contains(p.keys, k) {
			p.keys = append(p.keys, k)
		}
	}
}

// Keys returns the tracked keys.
func (p *Pair) Keys() []string { return slices.Clone(p.keys) }

// SetTime moves both servers' script clock to now (see Backend.SetTime); tags are the
// hash tags whose clock keys to set. It also tracks the clock keys.
func (p *Pair) SetTime(t testing.TB, now time.Time, tags ...string) {
	t.Helper()
	for _, tag := range tags {
		p.Track(tag + ":clock")
	}
	p.Mini.SetTime(t, now, tags...)
	p.Real.SetTime(t, now, tags...)
}

// KeyState is what a key holds: its type ("none", "string", "list", "zset", "hash",
// "set"), its value as text and its TTL.
type KeyState struct {
	Type string
	// Value: string [v]; list its elements; zset member, score pairs by rank (scores
	// as integers when they are); hash field, value pairs and set members, sorted.
	Value []string
	// TTL is the time left, in whole milliseconds (under 1ms reads 0), or -1 for a
	// key without one (and for a missing key).
	TTL time.Duration
}

func (s KeyState) String() string {
	return fmt.Sprintf("%s %q ttl %v", s.Type, s.Value, s.TTL)
}

// Same reports whether two states have the same type and value (TTLs aside).
func (s KeyState) Same(o KeyState) bool {
	return s.Type == o.Type && slices.Equal(s.Value, o.Value)
}

// Snapshot is the state of some keys.
type Snapshot map[string]KeyState

// Read returns the state of keys on c in one round trip.
func Read(ctx context.Context, c redis.UniversalClient, keys ...string) (Snapshot, error) {
	pipe := c.Pipeline()
	type cmds struct {
		typ  *redis.StatusCmd
		pttl *redis.DurationCmd
		get  *redis.StringCmd
		list *redis.StringSliceCmd
		zset *redis.ZSliceCmd
		hash *redis.MapStringStringCmd
		set  *redis.StringSliceCmd
	}
	all := make([]cmds, len(keys))
	for i, k := range keys {
		all[i] = cmds{
			typ:  pipe.Type(ctx, k),
			pttl: pipe.PTTL(ctx, k),
			get:  pipe.Get(ctx, k),
			list: pipe.LRange(ctx, k, 0, -1),
			zset: pipe.ZRangeWithScores(ctx, k, 0, -1),
			hash: pipe.HGetAll(ctx, k),
			set:  pipe.SMembers(ctx, k),
		}
	}
	_, _ = pipe.Exec(ctx) // WRONGTYPE errors are expected: each key has one type
	snap := Snapshot{}
	for i, k := range keys {
		c := all[i]
		typ, err := c.typ.Result()
		if err != nil {
			return nil, fmt.Errorf("TYPE %q: %w", k, err)
		}
		s := KeyState{Type: typ, TTL: -1}
		ttl, err := c.pttl.Result()
		if err == nil && ttl >= 0 {
			s.TTL = ttl
		}
		if err == nil && ttl == -2 { // expired between TYPE and PTTL
			typ, s.Type = "none", "none"
		}
		switch typ {
		case "none":
		case "string":
			s.Value = []string{c.get.Val()}
		case "list":
			s.Value = c.list.Val()
		case "zset":
			for _, z := range c.zset.Val() {
				s.Value = append(s.Value, fmt.Sprint(z.Member), formatScore(z.Score))
			}
		case "hash":
			for f, v := range c.hash.Val() {
				s.Value = append(s.Value, f+"\x00"+v)
			}
			slices.Sort(s.Value)
		case "set":
			s.Value = c.set.Val()
			slices.Sort(s.Value)
		default:
			return nil, fmt.Errorf("key %q has type %s, which Pair does not copy", k, typ)
		}
		snap[k] = s
	}
	return snap, nil
}

func formatScore(f float64) string {
	if f == float64(int64(f)) {
		return strconv.FormatInt(int64(f), 10)
	}
	return strconv.FormatFloat(f, 'g', 17, 64)
}

// Sync makes the real server hold what miniredis holds in the tracked keys, each with
// miniredis's TTL plus SyncSlack (none if it has none), and returns that state.
func (p *Pair) Sync(t testing.TB) Snapshot {
	t.Helper()
	ctx := context.Background()
	snap, err := Read(ctx, p.Mini.Client, p.keys...)
	if err != nil {
		t.Fatalf("read miniredis: %v", err)
	}
	pipe := p.Real.Client.TxPipeline()
	for _, k := range p.keys {
		s := snap[k]
		pipe.Del(ctx, k)
		switch s.Type {
		case "none":
			continue
		case "string":
			pipe.Set(ctx, k, s.Value[0], 0)
		case "list":
			pipe.RPush(ctx, k, toAny(s.Value)...)
		case "zset":
			var zs []redis.Z
			for i := 0; i < len(s.Value); i += 2 {
				f, _ := strconv.ParseFloat(s.Value[i+1], 64)
				zs = append(zs, redis.Z{Member: s.Value[i], Score: f})
			}
			pipe.ZAdd(ctx, k, zs...)
		case "hash":
			for _, fv := range s.Value {
				f, v, _ := strings.Cut(fv, "\x00")
				pipe.HSet(ctx, k, f, v)
			}
		case "set":
			pipe.SAdd(ctx, k, toAny(s.Value)...)
		}
		if s.TTL >= 0 {
			pipe.PExpire(ctx, k, s.TTL+SyncSlack)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatalf("copy state to the real server: %v", err)
	}
	return snap
}

func toAny(v []string) []any {
	out := make([]any, len(v))
	for i, s := range v {
		out[i] = s
	}
	return out
}

// Compare reads the tracked keys on both servers after a call and fails the test
// unless they hold the same values, each with a TTL on both or on neither. (The TTLs
// themselves differ: FakeClockScript stretches those it sets on the real server, so
// check TTLs on miniredis, whose clock is the test's.) A key whose TTL on miniredis is
// within 50ms may have expired on the real server's clock meanwhile. It returns
// miniredis's state.
func (p *Pair) Compare(t testing.TB, what string) Snapshot {
	t.Helper()
	ctx := context.Background()
	mini, err := Read(ctx, p.Mini.Client, p.keys...)
	if err != nil {
		t.Fatalf("%s: read miniredis: %v", what, err)
	}
	real, err := Read(ctx, p.Real.Client, p.keys...)
	if err != nil {
		t.Fatalf("%s: read redis: %v", what, err)
	}
	for _, k := range p.keys {
		m, r := mini[k], real[k]
		if r.Type == "none" && m.TTL >= 0 && m.TTL <= 50*time.Millisecond {
			continue
		}
		if !m.Same(r) {
			t.Fatalf("%s: key %q differs:\n  miniredis %v\n  redis     %v", what, k, m, r)
		}
		if m.Type != "none" && (m.TTL < 0) != (r.TTL < 0) {
			t.Fatalf("%s: key %q: TTL on miniredis %v, on redis %v", what, k, m.TTL, r.TTL)
		}
	}
	return mini
}

// MiniKeys returns every key miniredis holds that starts with "{" + Prefix.
func (p *Pair) MiniKeys() []string {
	var out []string
	for _, k := range p.Mini.Mini.Keys() {
		if strings.HasPrefix(k, "{"+p.Mini.Prefix) {
			out = append(out, k)
		}
	}
	return out
}
