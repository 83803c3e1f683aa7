-- inspect_sc.lua: the live state of a sliding counter (slidingcounter.lua's state) by
-- the server clock, read only.
-- KEYS[1]  {<prefix><key>}:sc     the sub-bucket log (read only)
-- KEYS[2]  {<prefix><key>}:pause  the control key: a pause and an operator's override of
--                                 the rates (read only; see prelude.lua)
-- ARGV[1]  op, ARGV[2] n, ARGV[3] x: as in slidingcounter.lua, checked and not used (next_us
--          is the wait of an acquire of one permit)
-- ARGV[4]  m           number of limits, 1..16
-- ARGV[5]  bucket_us   sub-bucket width, 1..2^45
-- ARGV[6..] m pairs    rate (1..10^9), period_us (1..2^45)
-- Returns  as inspect_sw.lua, with permits counted at the end of their sub-bucket:
--          booked counts the permits of sub-buckets that start after now, ahead_us is
--          the time until the latest of them starts, avail_i counts a permit while
--          its sub-bucket's end is in the last period.
-- Writes   nothing.
local op, n, x, limits, over, bucket = jt_limiter(6, 2)
if not op then
  return redis.error_reply(n)
end
return jt_inspect_log(KEYS[1], KEYS[2], bucket, limits, over)
