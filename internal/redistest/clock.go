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
//
// fakeCall replaces every other redis.call: it passes the command on, but stretches
// the TTLs the script sets (PEXPIRE, SET … PX) to at least FakeTTL, because a real
// server counts TTLs in real time while the test's clock moves at its own pace: a
// bucket whose state lasts 3ms on the test's clock must not vanish because the test
// took 3ms of real time between two steps.
const fakeTime = `local function jt_fake_time()
  local tag = string.match(KEYS[1], '^({[^}]*})')
  local v = tag and redis.call('GET', tag .. ':clock')
  if v then
    return {string.sub(v, 1, -7), string.sub(v, -6)}
  end
  return redis.call('TIME')
end
local function jt_fake_call(cmd, ...)
  local args = {...}
  local c = string.upper(cmd)
  if c == 'PEXPIRE' then
    args[2] = math.max(tonumber(args[2]), FAKE_TTL_MS)
  elseif c == 'SET' then
    for i = 1, #args - 1 do
      if type(args[i]) == 'string' and string.upper(args[i]) == 'PX' then
        args[i + 1] = math.max(tonumber(args[i + 1]), FAKE_TTL_MS)
      end
    end
  end
  return redis.call(cmd, unpack(args))
end
`

// FakeTTL is the shortest TTL a FakeClockScript sets.
const FakeTTL = 10 * time.Minute

// FakeClockScript returns the script src with its clock replaced by one the test sets
// with Backend.SetTime: the same Lua, run by the real server's Lua, on a timeline the
// test controls; the TTLs it sets last at least FakeTTL (see fakeTime). Use it on real
// servers; on miniredis, whose clock moves TIME and TTLs together, run the production
// script. It panics if src does not read TIME.
func FakeClockScript(src string) *redis.Script { return redis.NewScript(FakeClockSource(src)) }

// FakeClockSource is the text of FakeClockScript(src).
func FakeClockSource(src string) string {
	if !strings.Contains(src, "redis.call('TIME')") {
		panic("redistest: script does not read TIME")
	}
	body := strings.ReplaceAll(src, "redis.call('TIME')", "jt_fake_time()")
	body = strings.ReplaceAll(body, "redis.call(", "jt_fake_call(")
	head := strings.ReplaceAll(fakeTime, "FAKE_TTL_MS", strconv.FormatInt(FakeTTL.Milliseconds(), 10))
	return head + body
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
