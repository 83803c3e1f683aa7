-- pause.lua: no grants on a key, fleet-wide, until a time; every limiter script reads it.
-- KEYS[1]  {<prefix><key>}:pause  string: when the pause ends, µs (server clock)
-- ARGV[1]  d_us        pause length, 1..2^45; a longer pause already set is kept
-- Returns  the time until the pause ends, µs (>= d_us)
-- Writes   KEYS[1] with PX covering the pause, never shortening one already set.
local d = jt_int(1, 1, JT_MAX_PERIOD)
if not d then
  return redis.error_reply('JTARG d')
end
local key = KEYS[1]
local now = jt_now()
local till = math.max(now + d, jt_pause(key))
redis.call('SET', key, string.format('%d', till), 'PX', math.max(1, jt_cdiv(till - now, 1000)))
return till - now
