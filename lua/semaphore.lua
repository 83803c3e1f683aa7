-- semaphore.lua: at most max leases live at once; callers that wait queue in arrival
-- order and are handed freed slots by whichever call frees them.
-- KEYS[1]  {<prefix><key>}:sem    zset: lease id -> when it expires, µs (server clock)
-- KEYS[2]  {<prefix><key>}:semq   zset: place "id:ttl_us" -> arrival (µs, unique, rising)
-- KEYS[3]  {<prefix><key>}:semx   zset: place "id:ttl_us" -> when it lapses, µs
-- KEYS[4]  {<prefix><key>}:pause  string: when a pause ends, µs (read only)
-- ARGV[1]  op      0 acquire, 1 extend, 2 release (also gives up a place in the queue)
-- ARGV[2]  id      the lease id, 32 lowercase hex digits
-- ARGV[3]  max     leases live at once, 1..10^9
-- ARGV[4]  ttl_us  how long a lease (and a place in the queue) lives, 1000..2^45
-- ARGV[5]  queue   acquire: 1 takes or renews a place in the queue when denied; else 0
-- Returns  {ok 0|1, wait_us, held}, all integers:
--          ok       acquire: the lease is granted (or was handed to id while it
--                   queued); extend: the lease was live and now expires in ttl_us;
--                   release: the lease was live and is gone
--          wait_us  denied acquire: the time until, by expiry alone, a slot comes to
--                   this caller (the (held - max + place + 1)th earliest expiry, or
--                   the end of a pause if later), >= 1; else 0
--          held     live leases after the call
-- Writes   every call first drops expired leases and lapsed places, then hands free
--          slots to the places at the head of the queue (unless paused): each gets a
--          lease of its own ttl_us under its id, and one PUBLISH on channel
--          "<KEYS[1]>:wake" names them, space-separated. KEYS[1..3] get a PEXPIRE
--          covering their latest expiry; empty sets disappear.
-- A lease is live while its expiry is after now. While paused (KEYS[4]) nothing is
-- granted or handed; extend and release still work.
local op = jt_int(1, 0, 2)
if not op then return redis.error_reply('JTARG op') end
local id = jt_argv[2]
if type(id) ~= 'string' or #id ~= 32 or string.find(id, '[^0-9a-f]') then
  return redis.error_reply('JTARG id')
end
local max = jt_int(3, 1, JT_MAX_RATE)
if not max then return redis.error_reply('JTARG max') end
local ttl = jt_int(4, 1000, JT_MAX_PERIOD)
if not ttl then return redis.error_reply('JTARG ttl') end
local queue = jt_int(5, 0, 1)
if not queue then return redis.error_reply('JTARG queue') end
if #jt_argv ~= 5 then return redis.error_reply('JTARG argument count') end

local sem, q, x = KEYS[1], KEYS[2], KEYS[3]
local me = id .. ':' .. string.format('%d', ttl)
local now = jt_now()

-- reads first: a key of another type fails here (WRONGTYPE), before any write
redis.call('ZCARD', sem)
local queued_n = redis.call('ZCARD', q)
redis.call('ZCARD', x)
local pause_end = jt_pause(KEYS[4])
local paused = pause_end > now

local function bad(key, what)
  error('JTSTATE ' .. key .. ': ' .. what)
end

-- score returns the score of member m of key, or nil when m is absent.
local function score(key, m)
  local v = redis.call('ZSCORE', key, m)
  if not v then return nil end
  return jt_num(v) or bad(key, 'score')
end

-- us reads a score as whole µs: rounded up, and no further ahead than the longest
-- TTL. Scores this script wrote are whole µs already; a foreign member's may be
-- anything Redis takes (a fraction, inf), and since these reads also come after the
-- call's writes, they must not fail on one (Redis does not roll scripts back).
local function us(key, v)
  local n = tonumber(v)
  if not n or n ~= n then bad(key, 'score') end
  return math.ceil(math.min(n, now + JT_MAX_PERIOD))
end

-- latest returns the highest score in key, or nil when it is empty.
local function latest(key)
  local v = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #v == 0 then return nil end
  return us(key, v[2])
end

-- place returns the lease id and TTL of place m, or fails (JTSTATE) for a place this
-- script did not write.
local function place(m)
  local hid, hs = string.match(m, '^(%x+):(%d+)$')
  local httl = jt_num(hs)
  if not hid or #hid ~= 32 or not httl or httl < 1 then bad(q, 'place ' .. m) end
  return hid, httl
end

-- Before the first write, read the places a hand-off of this call can reach (the
-- head of the queue, lapsed places skipped as they go), so that a foreign one fails
-- the call with nothing changed. A release frees one slot more.
if not paused and queued_n > 0 then
  local free = max - redis.call('ZCOUNT', sem, '(' .. string.format('%d', now), '+inf')
  if op == 2 then free = free + 1 end
  local from = 0
  while free > 0 do
    local head = redis.call('ZRANGE', q, from, from + math.min(free, 100) - 1)
    if #head == 0 then break end
    for _, m in ipairs(head) do
      local lapse = score(x, m)
      if free > 0 and (not lapse or lapse > now) then
        place(m)
        free = free - 1
      end
    end
    from = from + #head
  end
end

-- drop expired leases and lapsed places
redis.call('ZREMRANGEBYSCORE', sem, '-inf', now)
while true do
  local gone = redis.call('ZRANGEBYSCORE', x, '-inf', now, 'LIMIT', 0, 100)
  if #gone == 0 then break end
  for _, m in ipairs(gone) do
    redis.call('ZREM', q, m)
    redis.call('ZREM', x, m)
  end
end

-- handoff gives free slots to the places at the head of the queue, oldest first.
local function handoff()
  if paused then return end
  local free = max - redis.call('ZCARD', sem)
  local handed = {}
  while free > 0 do
    local head = redis.call('ZRANGE', q, 0, math.min(free, 100) - 1)
    if #head == 0 then break end
    for _, m in ipairs(head) do
      local hid, httl = place(m)
      redis.call('ZREM', q, m)
      redis.call('ZREM', x, m)
      redis.call('ZADD', sem, now + httl, hid)
      handed[#handed + 1] = hid
      free = free - 1
    end
  end
  if #handed > 0 then
    redis.call('PUBLISH', sem .. ':wake', table.concat(handed, ' '))
  end
end

-- finish sets each key's TTL to cover its latest expiry and builds the reply.
local function finish(ok, wait)
  local last = latest(sem)
  if last then jt_expire(sem, last - now) end
  last = latest(x)
  if last then
    jt_expire(q, last - now)
    jt_expire(x, last - now)
  end
  return {ok, wait, redis.call('ZCARD', sem)}
end

handoff() -- the queue goes before the caller

if op == 2 then
  local was = redis.call('ZREM', sem, id)
  redis.call('ZREM', q, me)
  redis.call('ZREM', x, me)
  handoff()
  return finish(was, 0)
end

if op == 1 then
  if score(sem, id) then
    redis.call('ZADD', sem, now + ttl, id)
    return finish(1, 0)
  end
  return finish(0, 0)
end

-- acquire
if score(sem, id) then -- handed to id while it queued, or asked again
  redis.call('ZADD', sem, now + ttl, id)
  redis.call('ZREM', q, me)
  redis.call('ZREM', x, me)
  return finish(1, 0)
end
local held = redis.call('ZCARD', sem)
if not paused and held < max then -- handoff left the queue empty
  redis.call('ZADD', sem, now + ttl, id)
  return finish(1, 0)
end
local place = redis.call('ZRANK', q, me)
local queued = place ~= false and place ~= nil
if not queued then place = redis.call('ZCARD', q) end
local wait = 0
local k = math.min(held - max + place, held - 1) -- 0-based rank of the lease to wait for
if k >= 0 then
  local v = redis.call('ZRANGE', sem, k, k, 'WITHSCORES')
  wait = us(sem, v[2]) - now
end
if paused then wait = math.max(wait, pause_end - now) end
wait = math.max(wait, 1)
if queue == 1 then
  if not queued then
    local arrival = now
    local last = latest(q)
    if last and last >= arrival then arrival = last + 1 end
    redis.call('ZADD', q, arrival, me)
  end
  redis.call('ZADD', x, now + ttl, me)
end
return finish(0, wait)
