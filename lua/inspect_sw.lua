-- inspect_sw.lua: the live state of a sliding window (slidingwindow.lua's state) by
-- the server clock, read only.
-- KEYS[1]  {<prefix><key>}:sw     the permit log (read only)
-- KEYS[2]  {<prefix><key>}:pause  the control key: a pause and an operator's override of
--                                 the rates (read only; see prelude.lua)
-- ARGV[1]  op, ARGV[2] n, ARGV[3] x: as in slidingwindow.lua, checked and not used (next_us
--          is the wait of an acquire of one permit)
-- ARGV[4]  m           number of limits, 1..16
-- ARGV[5..] m pairs    rate (1..10^9), period_us (1..2^45)
-- Returns  {remaining, next_us, reset_us, booked, ahead_us, paused_us, pttl_ms,
--          override_us, rate_1, cap_1, avail_1, ..., rate_m, cap_m, avail_m}, all integers:
--          remaining  what slidingwindow.lua would answer as remaining now
--          next_us    time until an acquire of one permit would take effect (0: now)
--          reset_us   time until every permit has left every window
--          booked     permits booked to take effect after now
--          ahead_us   time until the latest booking takes effect (0: none booked)
--          paused_us  time until a pause ends (0: not paused)
--          pttl_ms    the state key's PTTL: -2 absent, -1 without a TTL
--          override_us  time until an operator's override of the rates ends (0: none)
--          rate_i     limit i's rate as enforced now (the override's while one is set)
--          cap_i      limit i's capacity: its rate
--          avail_i    limit i's rate less the permits that took effect in the last
--                     period or are booked ahead (negative when bookings reach
--                     further than one period)
-- Writes   nothing.
local op, n, x, limits, over = jt_limiter(5, 2)
if not op then
  return redis.error_reply(n)
end
return jt_inspect_log(KEYS[1], KEYS[2], 0, limits, over)
