-- rratelimiter.lua: a Redisson-style RRateLimiter (RateType.OVERALL) for the benchmark,
-- written from the description of Redisson's script in the project's seed: a hash with
-- the configuration, a counter of available permits and a sorted set of grants scored
-- by the client's time (ms), each member a packed random id and permit count. Expired
-- grants are released lazily on the next call; a denied caller is told the time until
-- the oldest grant in the window expires, however many permits it needs.
-- KEYS[1]  {<name>}          hash: rate, interval (ms), type; set once by trySetRate
-- KEYS[2]  {<name>}:value    string: permits available
-- KEYS[3]  {<name>}:permits  zset: member struct.pack('Bc0I', #id, id, permits),
--                            score the client time of the grant, ms
-- ARGV[1]  permits     integer >= 1, at most rate
-- ARGV[2]  now_ms      the client's clock, ms
-- ARGV[3]  id          random bytes that make the member unique
-- Returns  nil when granted; otherwise the ms until the oldest grant in the window
--          expires (Redisson's acquire sleeps that long, then calls again)
-- Writes   KEYS[2] and KEYS[3], without a TTL (as Redisson's script)
local rate = redis.call('hget', KEYS[1], 'rate')
local interval = redis.call('hget', KEYS[1], 'interval')
local type = redis.call('hget', KEYS[1], 'type')
assert(rate ~= false and interval ~= false and type ~= false, 'RateLimiter is not initialized')

local valueName = KEYS[2]
local permitsName = KEYS[3]
assert(tonumber(rate) >= tonumber(ARGV[1]), 'Requested permits amount could not exceed defined rate')

local currentValue = redis.call('get', valueName)
if currentValue ~= false then
  local expiredValues = redis.call('zrangebyscore', permitsName, 0, tonumber(ARGV[2]) - interval)
  local released = 0
  for i, v in ipairs(expiredValues) do
    local random, permits = struct.unpack('Bc0I', v)
    released = released + permits
  end
  if released > 0 then
    redis.call('zrem', permitsName, unpack(expiredValues))
    currentValue = tonumber(currentValue) + released
    redis.call('set', valueName, currentValue)
  end

  if tonumber(currentValue) < tonumber(ARGV[1]) then
    local nearest = redis.call('zrangebyscore', permitsName, '(' .. (tonumber(ARGV[2]) - interval), tonumber(ARGV[2]), 'withscores', 'limit', 0, 1)
    return tonumber(nearest[2]) - (tonumber(ARGV[2]) - interval)
  else
    redis.call('zadd', permitsName, ARGV[2], struct.pack('Bc0I', string.len(ARGV[3]), ARGV[3], ARGV[1]))
    redis.call('decrby', valueName, ARGV[1])
    return nil
  end
else
  redis.call('set', valueName, rate)
  redis.call('zadd', permitsName, ARGV[2], struct.pack('Bc0I', string.len(ARGV[3]), ARGV[3], ARGV[1]))
  redis.call('decrby', valueName, ARGV[1])
  return nil
end
