-- inspect_tb.lua: the live state of a token bucket (gcra.lua's state) by the server
-- clock, read only.
-- KEYS[1]  {<prefix><key>}:tb     the TATs (read only), see gcra.lua
-- KEYS[2]  {<prefix><key>}:pause  the control key: a pause and an operator's override of
--                                 the rates (read only; see prelude.lua)
-- ARGV[1]  op, ARGV[2] n, ARGV[3] x: as in gcra.lua, checked and not used (next_us
--          is the wait of an acquire of one permit)
-- ARGV[4]  m           number of limits, 1..16
-- ARGV[5..] m triples  rate (1..10^9), period_us (1..2^45), burst (1..10^9)
-- Returns  {remaining, next_us, reset_us, booked, ahead_us, paused_us, pttl_ms,
--          override_us, rate_1, cap_1, avail_1, ..., rate_m, cap_m, avail_m}, all
--          integers, as
--          inspect_sw.lua, where:
--          cap_i      limit i's burst as enforced now (the override's while one is set)
--          reset_us   time until every bucket is full again
--          avail_i    the tokens in limit i's bucket now, floor(burst - (TAT - now)
--                     × rate / period); negative when bookings took more than it held
--          booked     the permits booked ahead: the largest -avail_i (0 if none is
--                     negative)
--          ahead_us   time until the latest grant takes effect (0: it has)
-- Writes   nothing.
local op, n, x, limits, over = jt_limiter(5, 3)
if not op then
  return redis.error_reply(n)
end
local m = #limits -- burst x period <= 2^50: jt_limiter checked it
local now = jt_now()
local _, L, d = tb_state(KEYS[1], limits, now)
local paused = jt_pause(KEYS[2])

local t = math.max(now, paused, L) -- gcra.lua's acquire, n = 1
local remaining, reset, booked = JT_MAX_RATE, 0, 0
local avail = {}
for i = 1, m do
  local R, P, B = limits[i][1], limits[i][2], limits[i][3]
  t = math.max(t, now + jt_cdiv(d[i] + (1 - B) * P, R))
  avail[i] = jt_fdiv(B * P - d[i], P)
  remaining = math.min(remaining, avail[i])
  reset = math.max(reset, jt_cdiv(d[i], R))
  booked = math.max(booked, -avail[i])
end
if paused > now or L > now then remaining = 0 end
return jt_inspect_reply(KEYS[1], now, remaining, t, reset, booked, math.max(0, L - now),
  paused, over, limits, 3, avail)
