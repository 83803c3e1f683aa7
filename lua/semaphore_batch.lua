-- semaphore_batch.lua: the semaphore script's batch form; lua.go wraps semaphore.lua's
-- body as the function jt_one and puts this after it, so that one script takes either
--   the single form  ARGV as semaphore.lua's header says: jt_one decides it; or
--   a batch          the form below: jt_one decides each request in order.
-- KEYS[1]..KEYS[4] as in semaphore.lua (one semaphore: every request is on the same keys)
-- ARGV[1]  '4' (no op of the single form)
-- ARGV[2]  k, the number of requests, 1..1000
-- ARGV[3..2+3k]  k triples: op, id, queue, each as in the single form
-- ARGV[3+3k], ARGV[4+3k]  max and ttl_us, as in the single form, shared by the k requests
-- Returns  one flat array of integers, so that a client reads it without an object per
--          request (as batch.lua's): three per request, in order, the single form's
--          reply {ok, wait_us, held}, or, for a request whose single call would have
--          failed, {-1, i, len}: the error it would have returned (JTARG, JTSTATE,
--          WRONGTYPE ...) is the text of len bytes, one byte per integer, at elements
--          i .. i+len-1 of the reply (1-based), after the 3k replies
-- Writes   what the k requests made one by one would, each exactly as a single call
--          with ARGV {op, id, max, ttl_us, queue} at the same server instant (one
--          TIME per batch: jt_now; the pause key read once: jt_control).

if ARGV[1] ~= '4' then
  return jt_one()
end

do
  -- sem_errtext returns the text of an error a request raised or returned.
  local function sem_errtext(e)
    if type(e) == 'table' then
      e = e.err or e.message or 'ERR unknown error'
    end
    return tostring(e)
  end

  local function sem_batch()
    local k = ARGV[2]
    if type(k) ~= 'string' or not string.find(k, '^%d%d?%d?%d?$') then
      return redis.error_reply('JTARG batch count')
    end
    k = tonumber(k)
    if k < 1 or k > 1000 or #ARGV ~= 4 + 3 * k then
      return redis.error_reply('JTARG batch count')
    end
    local max, ttl = ARGV[3 + 3 * k], ARGV[4 + 3 * k]
    local out, texts = {}, {}
    for r = 1, k do
      local j = 3 * r
      jt_argv = {ARGV[j], ARGV[j + 1], max, ttl, ARGV[j + 2]}
      local ok, res = pcall(jt_one)
      local text
      if not ok or (type(res) == 'table' and res.err) then
        text = sem_errtext(res)
      elseif type(res) ~= 'table' or #res ~= 3 then
        text = 'JTSTATE unexpected reply'
      end
      local b = 3 * r
      if text then
        texts[#texts + 1] = text
        out[b - 2], out[b - 1], out[b] = -1, 0, #text
      else
        out[b - 2], out[b - 1], out[b] = res[1], res[2], res[3]
      end
    end
    local at = 3 * k -- the texts go after the replies, in order
    local t = 0
    for r = 1, k do
      if out[3 * r - 2] == -1 then
        t = t + 1
        local text = texts[t]
        out[3 * r - 1] = at + 1
        for i = 1, #text do
          out[at + i] = string.byte(text, i)
        end
        at = at + #text
      end
    end
    return out
  end

  return sem_batch()
end
