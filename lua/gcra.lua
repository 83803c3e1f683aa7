-- gcra.lua: token bucket as GCRA; burst permits at once, then rate per period, for
-- every limit given. O(1) state: each limit's theoretical arrival time (TAT).
-- KEYS[1]  {<prefix><key>}:tb     string "q1:r1:q2:r2:...:qm:rm:d" in lowercase hex:
--                                 limit i's TAT is qi + ri/ratei µs (exact; 0 <= ri <
--                                 ratei), and the latest grant took or takes effect at
--                                 q1 - d; d is negative ("-" and hex) only when a
--                                 cancel gave back more than its booking took, which
--                                 leaves the TAT below the latest grant. (Hex and the
--                                 offset keep one limit's state at
--                                 20 characters when period/rate < 65ms: a 40-byte value
--                                 in Redis, as redis_rate's.)
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
-- ARGV[2]  n           permits, 0..min(burst); 0 reads the state and takes nothing
-- ARGV[3]  x           acquire: max_wait_us >= 0 (at most 2^50/rate is booked ahead);
--                      cancel: the token an acquire returned;
--                      op 3: the stamp op 2 returned
-- ARGV[4]  m           number of limits, 1..16
-- ARGV[5..] m triples  rate (1..10^9), period_us (1..2^45), burst (1..10^9),
--                      burst × period_us <= 2^50
-- Returns  {granted 0|1, remaining, wait_us, reset_us, token}, all integers:
--          remaining  permits a call made now could still get (after this one)
--          wait_us    granted: the time until the grant takes effect (0 unless
--                     booked ahead); denied: the exact time until n permits conform (>= 1)
--          reset_us   time until every bucket is full again
--          token      when granted, the server time the grant takes effect; else 0
--          cancel returns {freed 0|1, 0, 0, reset_us, 0}
--          ops 2 and 3 append two integers: 1 when op 2 granted anew, else 0,
--          and the stamp of op 2's record (0: none); op 2 answering with a booking
--          returns {1, 0, wait_us, 0, token, 0, stamp}; op 3 returns {freed 0|1, 0,
--          0, reset_us, token, 0, 0}, token the booking's when x was its stamp, else
--          0 (nothing given back: the booking is another caller's; see prelude.lua)
-- Writes   KEYS[1] only when granting or cancelling, with a PEXPIRE at which every
--          bucket is full again (so an absent key means full buckets).
-- Cancel gives back what x/time/rate gives back: n permits less those booked after
-- the cancelled one, so nothing booked later can end up over the limit.
--          Ops 2 and 3 also write KEYS[3] (SET PX a second past the token; DEL).

-- What follows is what the token bucket does in decide.lua's steps (its body).
local AL_WIDTH = 3 -- rate, period_us, burst

-- al_maxwait: an acquire books at most 2^50 / rate ahead, so every TAT stays below 2^53
-- (n <= burst and burst x period <= 2^50: jt_limiter checked them).
local function al_maxwait(limits, x)
  for i = 1, #limits do
    x = math.min(x, math.floor(1125899906842624 / limits[i][1]))
  end
  return x
end

-- al_load: s is d (d[i]: limit i's TAT minus now, in units of 1/rate µs; tb_state).
local function al_load(key, limits, now)
  if tb_kept == key and tb_lim == limits then -- a batch's earlier request left it
    return tb_v, tb_L, tb_d
  end
  local v, L, d = tb_state(key, limits, now)
  tb_kept = nil
  if jt_batching then tb_kept, tb_v, tb_lim, tb_L, tb_d, tb_now = key, v, limits, L, d, now end
  return v, L, d
end

-- al_cancel: see "Cancel" in the header.
local function al_cancel(key, limits, v, L, d, x, n, now)
  local freed = 0
  for i = 1, #limits do
    local R, P = limits[i][1], limits[i][2]
    local back = math.min(n * P, n * P - (L - x) * R)
    if back > 0 then
      d[i] = math.max(0, d[i] - back)
      freed = 1
    end
  end
  if freed == 1 then tb_save(key, v, limits, L, d, now) end
  return freed
end

-- al_earliest: the earliest time every bucket has n permits
local function al_earliest(limits, v, L, d, t, n, now)
  for i = 1, #limits do
    local R, P, B = limits[i][1], limits[i][2], limits[i][3]
    t = math.max(t, now + jt_cdiv(d[i] + (n - B) * P, R))
  end
  return t
end

local function al_take(key, limits, v, L, d, t, wait, n, now)
  for i = 1, #limits do
    local R, P = limits[i][1], limits[i][2]
    d[i] = math.max(d[i], wait * R) + n * P -- TAT = max(TAT, t) + n × period / rate
  end
  tb_save(key, v, limits, t, d, now)
end

local function al_report(limits, v, L, d, now, paused)
  return tb_report(limits, L, d, now, paused)
end
