package redistest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// fakeTime replaces redis.call('TIME') in a script: it answers the time stored (µs) in
// the key "<hash tag of KEYS[1]>:clock", or the server's TIME when that key is absent.
// The key shares the limiter's hash slot, so this works on Redis Cluster too.
const fakeTime = `local function jt_fake_time()
  local tag = string.match(KEYS[1], '^({[^}]*})')
  local v = tag and redis.call('GET', tag .. ':clock')
  if v then
    return {string.sub(v, 1, -7), string.sub(v, -6)}
  end
  return redis.call('TIME')
end
`

// FakeClockScript returns the script src with its clock replaced by one the test sets
// with Backend.SetTime: the same Lua, run by the real server's Lua, on a timeline the
// test controls. It panics if src does not read TIME.
func FakeClockScript(src string) *redis.Script {
	if !strings.Contains(src, "redis.call('TIME')") {
		panic("redistest: script does not read TIME")
	}
	return redis.NewScript(fakeTime + strings.ReplaceAll(src, "redis.call('TIME')", "jt_fake_time()"))
}

// SetTime moves the clock that scripts see to t: miniredis's own clock (TIME and TTLs),
// and, on every backend, the clock key of each hash tag given, which scripts made with
// FakeClockScript read. (A real server's TTLs keep real time; tests that jump far
// ahead must not rely on a key having expired there.)
func (b *Backend) SetTime(t testing.TB, now time.Time, tags ...string) {
	t.Helper()
	if b.Mini != nil {
		b.Mini.SetTime(now)
	}
	us := now.UnixMicro()
	for _, tag := range tags {
		if err := b.Client.Set(context.Background(), tag+":clock", strconv.FormatInt(us, 10), 10*time.Minute).Err(); err != nil {
			t.Fatalf("set clock %s: %v", tag, err)
		}
	}
}
