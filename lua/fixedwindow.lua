-- fixedwindow.lua: a counter per aligned window (windows start at multiples of period
-- since the Unix epoch), for every limit given. At most rate permits take effect in
-- each window; two windows' worth can meet at a boundary, the known cost of O(1) state.
-- KEYS[1]  {<prefix><key>}:fw     string "L c1 c2 ... cm": L is when the latest grant
--                                 took or takes effect (µs), ci the permits limit i
--                                 counted in its window holding L
-- KEYS[2]  {<prefix><key>}:pause  the control key: a pause and an operator's override of
--                                 the rates (read only; see prelude.lua)
-- KEYS[3]  {<prefix><key>}:bk:<task id>  ops 2 and 3 only: string "token n stamp", the
--                                 task's booking (see prelude.lua, jt_claim)
-- KEYS[3..] (after the booking key for ops 2 and 3) optional: the other algorithms'
--          state keys under the same tag (read only): a grant that would create
--          KEYS[1] while one of them exists fails with JTALG <that key>, writing
--          nothing (one algorithm per key)
-- ARGV[1]  op          0 acquire, 1 cancel; 2 acquire for a task (uses the booking
--                      in KEYS[3] when there is one), 3 cancel for a task, 5 is 2
--                      that also uses a booking passed <= x µs ago (see prelude.lua)
-- ARGV[2]  n           permits, 0..min(rate); 0 reads the state and takes nothing
-- ARGV[3]  x           acquire: max_wait_us >= 0, book a slot in a later window if it
--                      comes within this; cancel: the token an acquire returned;
--                      op 3: the stamp op 2 returned
-- ARGV[4]  m           number of limits, 1..16
-- ARGV[5..] m pairs    rate (1..10^9), period_us (1..2^45)
-- Returns  {granted 0|1, remaining, wait_us, reset_us, token}, all integers:
--          remaining  permits a call made now could still get (after this one)
--          wait_us    granted: the time until the grant takes effect (0 unless
--                     booked ahead); denied: the exact time until a window has room (>= 1)
--          reset_us   time until the windows holding grants have all ended
--          token      when granted, the server time the grant takes effect; else 0
--          cancel returns {freed 0|1, 0, 0, reset_us, 0}
--          ops 2 and 3 append two integers: 1 when op 2 granted anew, else 0,
--          and the stamp of op 2's record (0: none); op 2 answering with a booking
--          returns {1, 0, wait_us, 0, token, 0, stamp}; op 3 returns {freed 0|1, 0,
--          0, reset_us, token, 0, 0}, token the booking's when x was its stamp, else
--          0 (nothing given back: the booking is another caller's; see prelude.lua)
-- Writes   KEYS[1] only when granting or cancelling, with a PEXPIRE at the end of the
--          longest window that holds the latest grant.
-- Bookings go to the window of the latest grant or a later one (FIFO), so the state
-- never needs more than that window's counts; a cancel gives its permits back when its
-- window is still the latest one, and otherwise keeps them (never over the limit).
--          Ops 2 and 3 also write KEYS[3] (SET PX a second past the token; DEL).

-- What follows is what the fixed window does in decide.lua's steps (its body).
local AL_WIDTH = 2 -- rate, period_us (n <= every rate: jt_limiter checks it)

-- al_maxwait: any wait within max_wait may be booked.
local function al_maxwait(limits, x)
  return x
end

-- al_load: s is c (c[i]: the permits limit i counted in its window holding L; fw_state).
local function al_load(key, limits, now)
  if fw_kept == key then -- a batch's earlier request left it
    return fw_v, fw_L, fw_c
  end
  local v, L, c = fw_state(key, #limits)
  fw_kept = nil
  if jt_batching then fw_kept, fw_v, fw_L, fw_c = key, v, L, c end
  return v, L, c
end

-- al_cancel: see "Bookings" in the header.
local function al_cancel(key, limits, v, L, c, x, n, now)
  local freed = 0
  for i = 1, #limits do
    if n > 0 and jt_fdiv(x, limits[i][2]) == jt_fdiv(L, limits[i][2]) and c[i] > 0 then
      c[i] = math.max(0, c[i] - n)
      freed = 1
    end
  end
  if freed == 1 then fw_save(key, limits, L, c, now) end
  return freed
end

-- al_earliest: the earliest time every limit's window has room for n; moving to a
-- limit's next window empties it, so m + 1 passes settle it
local function al_earliest(limits, v, L, c, t, n, now)
  local m = #limits
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
  return t
end

local function al_take(key, limits, v, L, c, t, wait, n, now)
  for i = 1, #limits do
    c[i] = fw_counted(limits, v, L, c, t, i) + n
  end
  if not v then
    jt_one_algorithm() -- this grant makes the state key: no other algorithm's may be there
  end
  fw_save(key, limits, t, c, now)
end

local al_report = fw_report
