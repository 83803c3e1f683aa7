-- fixedwindow.lua: a counter per aligned window (windows start at multiples of period
-- since the Unix epoch), for every limit given. At most rate permits take effect in
-- each window; two windows' worth can meet at a boundary, the known cost of O(1) state.
-- KEYS[1]  {<prefix><key>}:fw     string "L c1 c2 ... cm": L is when the latest grant
--                                 took or takes effect (µs), ci the permits limit i
--                                 counted in its window holding L
-- KEYS[2]  {<prefix><key>}:pause  the control key: a pause and an operator's override of
--                                 the rates (read only; see prelude.lua)
-- KEYS[3]  {<prefix><key>}:bk:<task id>  ops 2 and 3 only: string "token n", the
--                                 task's booking (see prelude.lua, jt_claim)
-- KEYS[3..] (after the booking key for ops 2 and 3) optional: the other algorithms'
--          state keys under the same tag (read only): a grant that would create
--          KEYS[1] while one of them exists fails with JTALG <that key>, writing
--          nothing (one algorithm per key)
-- ARGV[1]  op          0 acquire, 1 cancel; 2 acquire for a task (uses the booking
--                      in KEYS[3] when there is one), 3 cancel for a task
-- ARGV[2]  n           permits, 0..min(rate); 0 reads the state and takes nothing
-- ARGV[3]  x           acquire: max_wait_us >= 0, book a slot in a later window if it
--                      comes within this; cancel: the token an acquire returned
-- ARGV[4]  m           number of limits, 1..16
-- ARGV[5..] m pairs    rate (1..10^9), period_us (1..2^45)
-- Returns  {granted 0|1, remaining, wait_us, reset_us, token}, all integers:
--          remaining  permits a call made now could still get (after this one)
--          wait_us    granted: the time until the grant takes effect (0 unless
--                     booked ahead); denied: the exact time until a window has room (>= 1)
--          reset_us   time until the windows holding grants have all ended
--          token      when granted, the server time the grant takes effect; else 0
--          cancel returns {freed 0|1, 0, 0, reset_us, 0}
--          ops 2 and 3 append a sixth integer: 1 when op 2 granted anew, else 0;
--          op 2 answering with a booking returns {1, 0, wait_us, 0, token, 0}
-- Writes   KEYS[1] only when granting or cancelling, with a PEXPIRE at the end of the
--          longest window that holds the latest grant.
-- Bookings go to the window of the latest grant or a later one (FIFO), so the state
-- never needs more than that window's counts; a cancel gives its permits back when its
-- window is still the latest one, and otherwise keeps them (never over the limit).
--          Ops 2 and 3 also write KEYS[3] (SET PX a second past the token; DEL).
local op, n, x, limits, over = jt_limiter(5, 2)
if not op then
  return redis.error_reply(n)
end
local m = #limits -- n <= every rate: jt_limiter checked it

local key = KEYS[1]
local now = jt_now()
local claimed = jt_claim(n, now, KEYS[2])
if claimed then
  return claimed
end
local v, L, c
if fw_kept == key then -- a batch's earlier request left it
  v, L, c = fw_v, fw_L, fw_c
else
  v, L, c = fw_state(key, m)
  fw_kept = nil
  if jt_batching then fw_kept, fw_v, fw_L, fw_c = key, v, L, c end
end

local paused = jt_pause(KEYS[2])

if op == 1 then
  local freed = 0
  if v and x > now then
    for i = 1, m do
      if n > 0 and jt_fdiv(x, limits[i][2]) == jt_fdiv(L, limits[i][2]) and c[i] > 0 then
        c[i] = math.max(0, c[i] - n)
        freed = 1
      end
    end
    if freed == 1 then fw_save(key, limits, L, c, now) end
  end
  local _, reset = fw_report(limits, v, L, c, now, paused)
  return jt_booked({freed, 0, 0, reset, 0}, n)
end

-- acquire: the earliest time, at or after the latest grant, when every limit's window
-- has room for n; moving to a limit's next window empties it, so m + 1 passes settle it
local t = math.max(now, paused, L)
if n > 0 then
  for _ = 0, m do
    local moved = false
    for i = 1, m do
      if fw_counted(limits, v, L, c, t, i) + n > limits[i][1] then
        t = (jt_fdiv(t, limits[i][2]) + 1) * limits[i][2]
        moved = true
      end
    end
    if not moved then break end
  end
end
local wait = t - now
if n == 0 then wait = 0 end
if wait > x then
  local remaining, reset = fw_report(limits, v, L, c, now, paused)
  return jt_booked({0, remaining, wait, reset, 0}, n)
end
if n == 0 then
  local remaining, reset = fw_report(limits, v, L, c, now, paused)
  return jt_booked({1, remaining, 0, reset, 0}, n)
end
for i = 1, m do
  c[i] = fw_counted(limits, v, L, c, t, i) + n
end
if not v then
  jt_one_algorithm() -- this grant makes the state key: no other algorithm's may be there
end
L = t
v = true
fw_save(key, limits, L, c, now)
local remaining, reset = fw_report(limits, v, L, c, now, paused)
return jt_booked({1, remaining, wait, reset, t}, n)
