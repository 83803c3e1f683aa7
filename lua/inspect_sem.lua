-- inspect_sem.lua: the live state of a semaphore (semaphore.lua's keys) by the server
-- clock, read only.
-- KEYS[1]  {<prefix><key>}:sem    zset: lease id -> when it expires, µs (read only)
-- KEYS[2]  {<prefix><key>}:semq   zset: the queue's places (read only)
-- KEYS[3]  {<prefix><key>}:semx   zset: place -> when it lapses, µs (read only)
-- KEYS[4]  {<prefix><key>}:pause  string: when a pause ends, µs (read only)
-- ARGV[1]  k       how many lease expiries to list, 0..1000
-- Returns  {held, waiting, paused_us, pttl_ms, k', e_1, ..., e_k'}, all integers:
--          held       live leases (expiry after now)
--          waiting    places in the queue that have not lapsed
--          paused_us  time until a pause ends (0: not paused)
--          pttl_ms    the lease set's PTTL: -2 absent, -1 without a TTL
--          k'         how many expiries follow: min(k, held)
--          e_i        time until the i-th earliest live lease expires, µs (>= 1)
-- Writes   nothing (expired leases and lapsed places are not counted, and left for
--          semaphore.lua to drop).
local k = jt_int(1, 0, 1000)
if not k then return redis.error_reply('JTARG k') end
if #ARGV ~= 1 then return redis.error_reply('JTARG argument count') end
local now = jt_now()
local after = '(' .. string.format('%d', now)
redis.call('ZCARD', KEYS[2]) -- a key of another type fails here (WRONGTYPE)
local held = redis.call('ZCOUNT', KEYS[1], after, '+inf')
local waiting = redis.call('ZCOUNT', KEYS[3], after, '+inf')
local paused = jt_pause(KEYS[4])
local reply = {held, waiting, math.max(0, paused - now), redis.call('PTTL', KEYS[1]), 0}
if k > 0 and held > 0 then
  local v = redis.call('ZRANGEBYSCORE', KEYS[1], after, '+inf', 'WITHSCORES', 'LIMIT', '0', string.format('%d', k))
  for i = 2, #v, 2 do
    local e = tonumber(v[i])
    if not e or e ~= e then error('JTSTATE ' .. KEYS[1] .. ': score') end
    reply[#reply + 1] = math.ceil(math.min(e, now + JT_MAX_PERIOD)) - now
  end
  reply[5] = #v / 2
end
return reply
