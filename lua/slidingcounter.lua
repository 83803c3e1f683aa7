-- slidingcounter.lua: sub-bucket counters; the permit log of log.lua with times rounded
-- up to the end of their bucket, so it keeps one entry per bucket (memory O(buckets))
-- and never admits more than rate in any period: a permit holds its place for between
-- period and period + bucket, so a saturated limiter reaches period / (period + bucket)
-- of the rate.
-- KEYS[1]  {<prefix><key>}:sc     list [base, B1, S1, ...]: Bi = end of a bucket, µs
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
-- ARGV[3]  x           acquire: max_wait_us >= 0; cancel: the token an acquire returned;
--                      op 3: the stamp op 2 returned
-- ARGV[4]  m           number of limits, 1..16
-- ARGV[5]  bucket_us   sub-bucket width, 1..2^45
-- ARGV[6..] m pairs    rate (1..10^9), period_us (1..2^45)
-- Returns  {granted 0|1, remaining, wait_us, reset_us, token} as slidingwindow.lua,
--          and for ops 2 and 3 the two integers it describes
-- Writes   KEYS[1] only, and only to grant or cancel: appends or adds to the current
--          bucket, trims buckets older than the longest period (in batches, see
--          log.lua), PEXPIRE.
--          Ops 2 and 3 also write KEYS[3] (SET PX a second past the token; DEL).
local op, n, x, limits, over, bucket = jt_limiter(6, 2)
if not op then
  return redis.error_reply(n)
end
return jt_booked(jt_log(KEYS[1], KEYS[2], bucket, op, n, x, limits), n)
