-- control.lua: an operator's changes to a key's control key: override the rates of
-- its limits for every process until a time, clear the override, end a pause.
-- KEYS[1]  {<prefix><key>}:pause  the control key (see prelude.lua)
-- ARGV[1]  op          0 set an override, 1 clear the override, 2 end the pause
-- ARGV[2]  d_us        op 0: how long the override lasts, 1..2^45; else 0
-- ARGV[3]  m           op 0: number of limits overridden, 1..16; else 0
-- ARGV[4..] m pairs    op 0: rate (1..10^9), burst (0..10^9, 0: the rate)
-- Returns  {pause_us, override_us}: the time until the pause and the override end
--          after the call (0: none), integers
-- Writes   KEYS[1] with PX covering what it still holds, or deletes it when it holds
--          nothing (a pause and an override set by other calls are kept).
local op = jt_int(1, 0, 2)
if not op then return redis.error_reply('JTARG op') end
local key = KEYS[1]
local now = jt_now()
local pause, over = jt_control(key)
if op == 0 then
  local d = jt_int(2, 1, JT_MAX_PERIOD)
  if not d then return redis.error_reply('JTARG d') end
  local m = jt_int(3, 1, 16)
  if not m then return redis.error_reply('JTARG m') end
  if #ARGV ~= 3 + 2 * m then return redis.error_reply('JTARG argument count') end
  local rates = {}
  for i = 1, m do
    local r, b = jt_int(2 + 2 * i, 1, JT_MAX_RATE), jt_int(3 + 2 * i, 0, JT_MAX_RATE)
    if not r or not b then return redis.error_reply('JTARG limit ' .. i) end
    rates[i] = {r, b}
  end
  over = {now + d, rates, now} -- set now: bookings recorded before it are re-placed
elseif op == 1 then
  over = nil
else
  pause = 0
end
jt_ctl_pause, jt_ctl_over = pause, over
jt_control_write(key, pause, now)
local o = 0
if over and over[1] > now then o = over[1] - now end
return {math.max(0, pause - now), o}
