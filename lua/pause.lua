-- pause.lua: no grants on a key, fleet-wide, until a time; every limiter script reads it.
-- KEYS[1]  {<prefix><key>}:pause  the control key (see prelude.lua): its pause's end, µs
--                                 (server clock), then any override of the rates
-- ARGV[1]  d_us        pause length, 1..2^45; a longer pause already set is kept
-- Returns  the time until the pause ends, µs (>= d_us)
-- Writes   KEYS[1]: the pause's end, keeping an override set in it, with PX covering
--          the pause and the override, never shortening one already set.
local d = jt_int(1, 1, JT_MAX_PERIOD)
if not d then
  return redis.error_reply('JTARG d')
end
local key = KEYS[1]
local now = jt_now()
local till = math.max(now + d, jt_pause(key))
jt_control_write(key, till, now)
return till - now
