-- batch.lua: the end of every limiter script; lua.go wraps the script's body (its own
-- file) as the function jt_one and puts this after it. A call is either
--   the single form  ARGV as the script's header says: jt_one decides it; or
--   a batch          ARGV[1] '4', ARGV[2] k (1..1000), ARGV[3..2+3k] k triples
--                    op n x (op 0 acquire or 1 cancel; n and x as in the single
--                    form), ARGV[3+3k..] the rest of the single form's ARGV (m and the
--                    limits, from its ARGV[4] on), shared by the k requests.
-- A batch decides its requests in order, each exactly as a single call with ARGV
-- {op, n, x, rest...} made at the same server instant would (one TIME per batch:
-- jt_now), and returns one flat array of integers, so that a client reads it without
-- an object per request: five per request, in order, the single form's reply
-- {granted, remaining, wait_us, reset_us, token}, or, for a request whose single call
-- would have failed, {-1, i, len, 0, 0}: the error it would have returned (JTARG,
-- JTEXCEEDS, JTALG, JTSTATE, WRONGTYPE ...) is the text of len bytes, one byte per
-- integer, at elements i .. i+len-1 of the reply (1-based), after the 5k replies. The control key is read once per batch (jt_control caches it), the
-- state once (jt_get; the log: lg_kept), and the state written once, at the end
-- (jt_set, jt_expire, jt_flush); only the log's appends are made request by request.
-- Booking ops (2 and 3) are not batched: their KEYS[3] is the task's own.

-- A single call runs jt_one at once; the batch's helpers are made only for a batch
-- (every function a script defines is made anew on each run of it).
if ARGV[1] ~= '4' then
  return jt_one()
end

do
  -- jt_errtext returns the text of an error a request raised or returned.
  local function jt_errtext(e)
    if type(e) == 'table' then
      e = e.err or e.message or 'ERR unknown error'
    end
    return tostring(e)
  end

  -- jt_flush makes the writes a batch's requests left waiting, each key once.
  local function jt_flush()
    for _, key in ipairs(jt_dirty) do
      if jt_ttl[key] then
        local text = jt_cache[key]
        if type(text) == 'function' then text = text() end
        redis.call('SET', key, text, 'PX', jt_ttl[key])
        jt_ttl[key] = nil
      end
      if jt_exp[key] then
        redis.call('PEXPIRE', key, jt_exp[key])
        jt_exp[key] = nil
      end
      jt_queued[key] = nil
    end
    jt_dirty = {}
  end

  local function jt_batch()
    local k = ARGV[2]
    if type(k) ~= 'string' or not string.find(k, '^%d%d?%d?%d?$') then
      return redis.error_reply('JTARG batch count')
    end
    k = tonumber(k)
    local first = 3 + 3 * k -- the shared rest starts here
    if k < 1 or k > 1000 or #ARGV < first then
      return redis.error_reply('JTARG batch count')
    end
    local rest, nrest = {}, #ARGV - first + 1
    for i = 1, nrest do
      rest[i] = ARGV[first - 1 + i]
    end
    local out, texts = {}, {}
    jt_batching, jt_cache, jt_dirty, jt_queued, jt_ttl, jt_exp = true, {}, {}, {}, {}, {}
    for r = 1, k do
      local j = 3 * r
      if jt_lim then -- the limits are read: the request's op, n and x are enough
        jt_req = j
      else
        local argv = {ARGV[j], ARGV[j + 1], ARGV[j + 2]}
        for i = 1, nrest do
          argv[3 + i] = rest[i]
        end
        jt_argv = argv
      end
      jt_bk_op, jt_bk_had = nil, nil
      local ok, res = pcall(jt_one)
      local b = 5 * r
      local text
      if not ok or (type(res) == 'table' and res.err) then
        text = jt_errtext(res)
      elseif type(res) ~= 'table' or #res ~= 5 then
        text = 'JTSTATE unexpected reply'
      end
      if not text then
        out[b - 4], out[b - 3], out[b - 2], out[b - 1], out[b] = res[1], res[2], res[3], res[4], res[5]
      else
        texts[#texts + 1] = text
        out[b - 4], out[b - 3], out[b - 2], out[b - 1], out[b] = -1, 0, #text, 0, 0
      end
    end
    jt_flush()
    local at = 5 * k -- the texts go after the replies, in order
    for r = 1, k do
      if out[5 * r - 4] == -1 then
        local text = table.remove(texts, 1)
        out[5 * r - 3] = at + 1
        for i = 1, #text do
          out[at + i] = string.byte(text, i)
        end
        at = at + #text
      end
    end
    return out
  end

  return jt_batch()
end
