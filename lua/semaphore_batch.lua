-- semaphore_batch.lua: the semaphore script's batch form; lua.go wraps semaphore.lua's
-- body as the function jt_one and puts this after it, so that one script takes either
--   the single form  ARGV as semaphore.lua's header says: jt_one decides it; or
--   a batch          the form below: jt_one decides each request in order.
-- KEYS[1]..KEYS[4] as in semaphore.lua (one semaphore: every request is on the same keys)
-- ARGV[1]  '4' (no op of the single form)
-- ARGV[2]  k, the number of requests, 1..1000
-- ARGV[3..2+3k]  k triples: op, id, queue, each as in the single form
-- ARGV[3+3k], ARGV[4+3k]  max and ttl_us, as in the single form, shared by the k requests
-- Returns  k replies in request order: each the single form's reply {ok, wait_us, held},
--          or a string, the error that request alone would have returned (JTARG,
--          JTSTATE, WRONGTYPE ...)
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
    local out = {}
    for r = 1, k do
      local j = 3 * r
      jt_argv = {ARGV[j], ARGV[j + 1], max, ttl, ARGV[j + 2]}
      local ok, res = pcall(jt_one)
      if not ok or (type(res) == 'table' and res.err) then
        res = sem_errtext(res)
      end
      out[r] = res
    end
    return out
  end

  return sem_batch()
end
