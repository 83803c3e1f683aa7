-- slidingwindow.lua: the permit log (Redisson's RRateLimiter, corrected): at most rate
-- permits take effect in any window of period, for every limit given, exactly.
-- KEYS[1]  {<prefix><key>}:sw     list [base, T1, S1, ...], see log.lua
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
-- ARGV[3]  x           acquire: max_wait_us >= 0, book a future slot if it comes within
--                      this; cancel: the token an acquire returned;
--                      op 3: the stamp op 2 returned
-- ARGV[4]  m           number of limits, 1..16
-- ARGV[5..] m pairs    rate (1..10^9), period_us (1..2^45)
-- Returns  {granted 0|1, remaining, wait_us, reset_us, token}, all integers:
--          remaining  permits a call made now could still get (after this one)
--          wait_us    granted: the time until the grant takes effect (0 unless
--                     booked ahead); denied: the exact time until n permits fit (>= 1)
--          reset_us   time until every permit has left every window
--          token      when granted, the server time the grant takes effect (what a
--                     cancel passes back); else 0
--          cancel returns {freed 0|1, 0, 0, reset_us, 0}
--          ops 2 and 3 append two integers: 1 when op 2 granted anew, else 0,
--          and the stamp of op 2's record (0: none); op 2 answering with a booking
--          returns {1, 0, wait_us, 0, token, 0, stamp}; op 3 returns {freed 0|1, 0,
--          0, reset_us, token, 0, 0}, token the booking's when x was its stamp, else
--          0 (nothing given back: the booking is another caller's; see prelude.lua)
-- Writes   KEYS[1] only, and only to grant or cancel: appends or merges the grant,
--          trims entries older than the longest period (in batches, see log.lua),
--          PEXPIRE until the last entry leaves the longest window.
--          Ops 2 and 3 also write KEYS[3] (SET PX a second past the token; DEL).
local op, n, x, limits, over = jt_limiter(5, 2)
if not op then
  return redis.error_reply(n)
end
return jt_booked(jt_log(KEYS[1], KEYS[2], 0, op, n, x, limits), n)
