-- inspect_fw.lua: the live state of a fixed window (fixedwindow.lua's state) by the
-- server clock, read only.
-- KEYS[1]  {<prefix><key>}:fw     "L c1 ... cm" (read only), see fixedwindow.lua
-- KEYS[2]  {<prefix><key>}:pause  the control key: a pause and an operator's override of
--                                 the rates (read only; see prelude.lua)
-- ARGV[1]  op, ARGV[2] n, ARGV[3] x: as in fixedwindow.lua, checked and not used (next_us
--          is the wait of an acquire of one permit)
-- ARGV[4]  m           number of limits, 1..16
-- ARGV[5..] m pairs    rate (1..10^9), period_us (1..2^45)
-- Returns  {remaining, next_us, reset_us, booked, ahead_us, paused_us, pttl_ms,
--          override_us, rate_1, cap_1, avail_1, ..., rate_m, cap_m, avail_m}, all
--          integers, as
--          inspect_sw.lua, where:
--          cap_i      limit i's rate as enforced now (the override's while one is set)
--          avail_i    limit i's rate less the permits it counts in its window
--                     holding now; 0 when the latest grant lies in a later window
--                     (bookings go there, so the window holding now is closed)
--          booked     the permits counted in the latest grant's window, if that
--                     window starts after now (the largest over the limits; the
--                     state keeps only that window's counts, so bookings in the
--                     current window show in avail_i only)
--          ahead_us   time until the latest grant takes effect (0: it has)
--          reset_us   time until the windows holding grants have all ended
-- Writes   nothing.
local op, n, x, limits, over = jt_limiter(5, 2)
if not op then
  return redis.error_reply(n)
end
local m = #limits
local now = jt_now()
local v, L, c = fw_state(KEYS[1], m)
local paused = jt_pause(KEYS[2])

local function window(t, i)
  return jt_fdiv(t, limits[i][2])
end
local function counted(t, i)
  if v and window(t, i) == window(L, i) then return c[i] end
  return 0
end

-- next: fixedwindow.lua's acquire of one permit
local t = math.max(now, paused, L)
for _ = 0, m do
  local moved = false
  for i = 1, m do
    if counted(t, i) + 1 > limits[i][1] then
      t = (window(t, i) + 1) * limits[i][2]
      moved = true
    end
  end
  if not moved then break end
end

local remaining, reset, booked = JT_MAX_RATE, 0, 0
local avail = {}
for i = 1, m do
  avail[i] = limits[i][1] - counted(now, i)
  if v and window(L, i) > window(now, i) then avail[i] = 0 end
  remaining = math.min(remaining, avail[i])
  if v and c[i] > 0 then
    reset = math.max(reset, (window(L, i) + 1) * limits[i][2] - now)
  end
  if v and L > now and window(L, i) > window(now, i) then
    booked = math.max(booked, c[i])
  end
end
if paused > now or L > now then remaining = 0 end
return jt_inspect_reply(KEYS[1], now, remaining, t, reset, booked, math.max(0, L - now),
  paused, over, limits, 1, avail)
