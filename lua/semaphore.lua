-- semaphore.lua: at most max leases live at once; callers that wait queue in arrival
-- order and are handed freed slots by whichever call frees them. The generator puts it
-- after common.lua. Its keys, arguments, ops and replies are docs/design.md's ("The
-- semaphore protocol"); what they hold and how it decides:
--
-- KEYS[1]  sem: zset, lease -> when it expires, µs; a lease's member is its holder's token,
--          or a place's id for a slot handed to that place
-- KEYS[2]  semq: zset, place "<id>:<ttl_us>" -> arrival, µs (unique, rising)
-- KEYS[3]  semx: zset, place -> when it lapses, µs
-- KEYS[4]  l: the limiter's state of the key, read only: the pause in its meta
-- ARGV[1]  k (1..1000), then k requests of four fields, max (1..10^9) and ttl_us (how long
--          a lease and a place live, 1000..2^45); an error in k, max or ttl_us fails the call.
--   op  name     token                          place                 join
--   0   acquire  the caller's, 32 lowercase hex  its place's id        1: take or keep a place
--                                                                      in the queue when denied; 0
--   1   extend   the holder's                   "" or an id (not used)  0
--   2   release  the holder's                   its place's id, or ""   0
--   3   inspect  "" or a token (not used)       "" or an id (not used)  expiries to list, 0..1000
--   an id: 1..200 printable bytes without spaces (Acquire: the token; asynq: the task's id)
-- Returns  ok is, for extend, that the lease was live and now expires in ttl_us; for
--   release, that it was live and is gone. held: live leases after the request; inspect's
--   pttl_ms is the lease set's (-2 absent, -1 none). wait_us (denied): until, by expiry
--   alone, a slot comes to this caller (the (held - max + place + 1)th earliest expiry,
--   or the end of a pause if later), >= 1; paused_us (denied): until the end of the pause
--   that denied it (a slot released meanwhile is handed out then), 0 if none.
-- Acquire: granted when the token holds a lease (renewed), when a slot was handed to its
--   place (the lease passes to the token), or when a slot is free and nothing is paused;
--   each takes the place out of the queue. A task's retry (a new token, the same place)
--   never shares a lease an abandoned handler still holds.
-- Writes   only when a request is not an inspect, after every read and check: expired
--   leases and lapsed places go; before each request free slots are handed to the places
--   at the head of the queue (unless paused), each a lease of its place's ttl_us under its
--   id; a release also drops its place and a slot handed to it. KEYS[1..3] get a PEXPIRE
--   at their latest expiry; empty sets disappear.

local SEM_ACQUIRE, SEM_EXTEND, SEM_RELEASE, SEM_INSPECT = 0, 1, 2, 3

-- pause_read returns the end of the pause in the meta of the limiter state at key (0:
-- none), or nil and the failure.
local function pause_read(key)
  local v = redis.pcall('GET', key)
  local meta
  if type(v) == 'table' and string.find(v.err, 'WRONGTYPE', 1, true) then -- a log's list?
    local why
    meta, why = read_key('limiter state', 'LINDEX', key, '0')
    if why then -- neither a string nor a list (E_STATE), or a refusal (an ACL): Redis's error
      return nil, why
    end
  elseif type(v) == 'table' then
    return nil, fail(0, v.err)
  elseif v then
    meta = string.match(v, '\n(.*)$')
  else
    return 0
  end
  if type(meta) ~= 'string' or not string.find(meta, '^%l%l? ') then
    return nil, fail(E_STATE, key .. ': not a limiter state')
  end
  return tonumber((string.match(meta, '\np (%d+)'))) or 0
end

local k = int(ARGV[1], 1, MAX_REQUESTS)
if not k or #ARGV ~= 3 + 4 * k or #KEYS ~= 4 then
  return redis.error_reply('JTARG k')
end
local max, ttl = int(ARGV[2 + 4 * k], 1, MAX_RATE), int(ARGV[3 + 4 * k], 1000, MAX_PERIOD)
if not max or not ttl then
  return redis.error_reply('JTARG max or ttl_us')
end
local sem, q, x = KEYS[1], KEYS[2], KEYS[3]
local now_text, ttl_text = string.format('%d', now), string.format('%d', ttl)

-- id returns a place's id and TTL from its member "<id>:<ttl_us>", or nil.
local function id(member)
  local place, t = string.match(member, '^(.+):(%d+)$')
  t = place and #place <= 200 and not string.find(place, '[^!-~]') and int(t, 1, MAX_PERIOD)
  return t and place, t
end

local ext, writers, frees = {}, 0, 0
for r = 1, k do
  local j, bad = 4 * r - 2, nil
  local op, token, place = int(ARGV[j], SEM_ACQUIRE, SEM_INSPECT), ARGV[j + 1], ARGV[j + 2]
  if not op then
    bad = 'op'
  elseif not ((#token == 32 and not string.find(token, '[^0-9a-f]')) or (op == SEM_INSPECT and token == '')) then
    bad = 'token'
  elseif #place > 200 or string.find(place, '[^!-~]') or (op == SEM_ACQUIRE and place == '') then
    bad = 'place'
  elseif not int(ARGV[j + 3], 0, op == SEM_INSPECT and 1000 or op == SEM_ACQUIRE and 1 or 0) then
    bad = 'join'
  end
  if bad then
    ext[r] = fail(E_ARG, 'JTARG request ' .. r .. ': ' .. bad)
  elseif op ~= SEM_INSPECT then
    writers = writers + 1
    frees = frees + (op == SEM_RELEASE and 1 or 0)
  end
end

-- Reads first: a foreign key fails the requests before anything is written.
local foreign, pause_end
for i = 1, 3 do
  foreign = foreign or select(2, read_key('sorted set', 'ZCARD', KEYS[i]))
end
if not foreign then
  pause_end, foreign = pause_read(KEYS[4])
end
if foreign then
  return reply({}, k, ext, foreign)
end
local paused = pause_end > now

-- The places a hand-off of this call can reach (the head of the queue, lapsed places
-- skipped; each release frees one slot more) must be ours.
if writers > 0 and not paused and redis.call('ZCARD', q) > 0 then
  local free, from = max - redis.call('ZCOUNT', sem, '(' .. now_text, '+inf') + frees, 0
  while free > 0 and not foreign do
    local head = redis.call('ZRANGE', q, from, from + math.min(free, 100) - 1)
    if #head == 0 then
      break
    end
    for _, member in ipairs(head) do
      local lapse = redis.call('ZSCORE', x, member)
      if free > 0 and (not lapse or (tonumber(lapse) or math.huge) > now) then
        if not id(member) then
          foreign = fail(E_STATE, q .. ': a place not ours')
        end
        free = free - 1
      end
    end
    from = from + #head
  end
  if foreign then
    for r = 1, k do
      if not ext[r] and tonumber(ARGV[4 * r - 2]) ~= SEM_INSPECT then
        ext[r], writers = foreign, writers - 1
      end
    end
  end
end

-- latest returns the highest score in key as whole µs (at most 2^45 ahead), or nil.
local function latest(key)
  local v = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  return v[2] and math.ceil(math.min(tonumber(v[2]) or math.huge, now + MAX_PERIOD))
end

if writers > 0 then -- expired leases and lapsed places go
  redis.call('ZREMRANGEBYSCORE', sem, '-inf', now_text)
  while true do
    local gone = redis.call('ZRANGEBYSCORE', x, '-inf', now_text, 'LIMIT', '0', '100')
    if #gone == 0 then
      break
    end
    redis.call('ZREM', q, unpack(gone))
    redis.call('ZREM', x, unpack(gone))
  end
end

local out, handed, wrote = {}, {}, false

-- handoff gives free slots to the places at the head of the queue, oldest first.
local function handoff()
  if paused then
    return
  end
  local free = max - redis.call('ZCARD', sem)
  while free > 0 do
    local head = redis.call('ZRANGE', q, '0', string.format('%d', math.min(free, 100) - 1))
    if #head == 0 then
      break
    end
    for _, member in ipairs(head) do
      local place, t = id(member)
      redis.call('ZREM', q, member)
      redis.call('ZREM', x, member)
      redis.call('ZADD', sem, string.format('%d', now + t), place)
      handed[#handed + 1], free = place, free - 1
    end
  end
end

for r = 1, k do
  if not ext[r] then
    local j, b = 4 * r - 2, WIDTH * r - WIDTH
    local op, token, place, join = tonumber(ARGV[j]), ARGV[j + 1], ARGV[j + 2], tonumber(ARGV[j + 3])
    local ok, wait, pause_left = 0, 0, 0
    if op == SEM_INSPECT then
      local after = '(' .. now_text
      local held = redis.call('ZCOUNT', sem, after, '+inf')
      local last = wrote and latest(sem) -- (wrote: what the call's writes set)
      local pttl = not wrote and redis.call('PTTL', sem) or last and math.ceil((last - now) / 1000) or -2
      local d = {held, redis.call('ZCOUNT', x, after, '+inf'), math.max(0, pause_end - now), pttl, 0}
      if join > 0 and held > 0 then
        local v = redis.call('ZRANGEBYSCORE', sem, after, '+inf', 'WITHSCORES', 'LIMIT', '0', string.format('%d', join))
        for i = 2, #v, 2 do
          d[#d + 1] = math.ceil(math.min(tonumber(v[i]) or math.huge, now + MAX_PERIOD)) - now
        end
        d[5] = #v / 2
      end
      ext[r] = d
      out[b + 1], out[b + 2], out[b + 3], out[b + 4], out[b + 7] = 1, 0, held, 0, 0
    else
      wrote = true
      handoff() -- the queue goes before the caller
      local me, expiry = place .. ':' .. ttl_text, string.format('%d', now + ttl)
      if op == SEM_RELEASE then
        ok = redis.call('ZREM', sem, token)
        if place ~= '' then
          redis.call('ZREM', q, me)
          redis.call('ZREM', x, me)
          redis.call('ZREM', sem, place)
        end
        handoff()
      elseif op == SEM_EXTEND then
        if redis.call('ZSCORE', sem, token) then
          redis.call('ZADD', sem, expiry, token)
          ok = 1
        end
      else
        if redis.call('ZSCORE', sem, token) or redis.call('ZREM', sem, place) == 1
          or (not paused and redis.call('ZCARD', sem) < max) then
          redis.call('ZADD', sem, expiry, token)
          redis.call('ZREM', q, me)
          redis.call('ZREM', x, me)
          ok = 1
        else
          local held, queued = redis.call('ZCARD', sem), redis.call('ZRANK', q, me)
          local rank = queued or redis.call('ZCARD', q)
          local e = math.min(held - max + rank, held - 1) -- the lease to wait for
          if e >= 0 then
            local v = redis.call('ZRANGE', sem, e, e, 'WITHSCORES')
            wait = math.ceil(math.min(tonumber(v[2]) or math.huge, now + MAX_PERIOD)) - now
          end
          if paused then
            pause_left = pause_end - now
            wait = math.max(wait, pause_left)
          end
          wait = math.max(wait, 1)
          if join == 1 then
            if not queued then
              local arrival = math.max(now, (latest(q) or 0) + 1)
              redis.call('ZADD', q, string.format('%d', arrival), me)
            end
            redis.call('ZADD', x, expiry, me)
          end
        end
      end
      out[b + 1], out[b + 2], out[b + 3], out[b + 4], out[b + 5], out[b + 6], out[b + 7] =
        ok, wait, redis.call('ZCARD', sem), pause_left, 0, 0, 0
    end
  end
end

if wrote then -- each set lives until its latest expiry
  local last = latest(sem)
  if last then
    redis.call('PEXPIRE', sem, ms(last - now))
  end
  last = latest(x)
  if last then
    redis.call('PEXPIRE', q, ms(last - now))
    redis.call('PEXPIRE', x, ms(last - now))
  end
  if #handed > 0 then
    redis.call('PUBLISH', (string.match(sem, '^(.*:)[^:]*$') or '') .. 'wake', 'h ' .. table.concat(handed, ' '))
  end
end
return reply(out, k, ext)
