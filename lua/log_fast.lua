-- log_fast.lua: the permit log's usual call (slidingwindow.lua's and
-- slidingcounter.lua's), decided before any helper is made: a single acquire as
-- fast.lua takes it, under one limit within the script's bounds, no control key (no
-- pause, no override), the log's head and last entry plain numbers. It makes the
-- same reads, writes and errors, in the same order, as log.lua's jt_log would
-- (TestFastPathEqualsFullScript); anything else runs on into the full script, and
-- nothing is written before that. A batch is left to the full script. This repeats
-- log.lua's lookups and acquire for this one case, on purpose: the full script makes
-- its 35 helper functions on every run, which costs more than all of this.
do
  local K, floor = jf_K, math.floor -- floor(a / b) is exact: every value is below 2^53
  local prec, R, P
  if lf_counter then
    if jf_k and #jf_A[jf_m + 1] <= 16 then prec, R, P = jf_l1, jf_l2, jf_l3 end -- as jt_int
  elseif not jf_l3 then
    prec, R, P = 0, jf_l1, jf_l2
  end
  local key = K[1]
  local head -- the log's first 9 elements: base and 4 entries (log.lua's LOG_HEAD)
  if jf_k == 1 and jf_o == 0 and P and prec <= 35184372088832 and R <= 1000000000
    and P <= 35184372088832 and jf_nmax <= R and redis.call('EXISTS', K[2]) == 0 then
    head = redis.pcall('LRANGE', key, '0', '8')
    if head.err or not string.find(table.concat(head, ','), '^[0-9,]*$') then
      head = nil
    else
      for i = 1, #head do
        if #head[i] > 17 or head[i] == '' then head = nil break end
      end
    end
  end
  local len = head and #head
  local last -- the last entry, when the head does not hold it
  if len == 9 then
    last = redis.call('LRANGE', key, '-2', '-1')
    if not string.find(last[1] .. ',' .. last[2], '^%d+,%d+$') or #last[1] > 17 or #last[2] > 17 then
      len = nil
    end
  elseif len and (len % 2 == 0 or len == 1) then
    len = nil -- JTSTATE, or a log of no entries: the full script's
  elseif len == 0 and #K >= 3 and redis.call('EXISTS', unpack(K, 3)) ~= 0 then
    len = nil -- another algorithm's state: JTALG
  end
  if len then
    local n, x = jf_A[2] + 0, jf_A[3] + 0
    local t = redis.call('TIME')
    local now = t[1] * 1000000 + t[2]
    -- log.lua's state: hE entries in head, off trimmed since, E entries (nil:
    -- unknown), base, the last count Pn and time Tlast
    local hE, off, E, base, Pn, Tlast, empty = 0, 0, 0, 0, 0, nil, len == 0
    if len > 0 then
      base = head[1] + 0
      if len < 9 then
        hE = (len - 1) / 2
        E, Tlast, Pn = hE, head[len - 1] + 0, head[len] + 0
      else
        hE, E, Tlast, Pn = 4, nil, last[1] + 0, last[2] + 0
      end
    end
    local function bad(what) error('JTSTATE ' .. key .. ': ' .. what) end
    local function num(s) -- prelude.lua's jt_num
      if type(s) ~= 'string' or #s > 17 or not string.find(s, '^%-?%d+$') then return nil end
      return tonumber(s)
    end
    local function T(i)
      local h = i + off
      if h <= hE then return head[2 * h] + 0 end
      return num(redis.call('LINDEX', key, 2 * i - 1)) or bad('time ' .. i)
    end
    local function S(i)
      if i == 0 then return base end
      local h = i + off
      if h <= hE then return head[2 * h + 1] + 0 end
      return num(redis.call('LINDEX', key, 2 * i)) or bad('count ' .. i)
    end
    local function entries()
      if not E then
        local l = redis.call('LLEN', key)
        if l % 2 == 0 then bad('length') end
        E = (l - 1) / 2
      end
      return E
    end
    local function at_or_before(h) -- log.lua's lg_last_at_or_before
      if E == 0 or T(1) > h then return 0 end
      if Tlast <= h then return entries() end
      local k = 1
      while k + off < hE and (not E or k < E) do
        if T(k + 1) > h then return k end
        k = k + 1
      end
      local lo, hi = k, entries()
      while hi - lo > 1 do
        local mid = floor((lo + hi) / 2)
        if T(mid) <= h then lo = mid else hi = mid end
      end
      return lo
    end

    -- the acquire (log.lua's lg_acquire; no pause)
    local tt = now
    if E ~= 0 and Tlast - prec > tt then tt = Tlast - prec end
    local q = Pn + n - R -- this permit must have left the window
    if q > base then -- log.lua's lg_first_count_at_least(q)
      local e = 1
      while e + off <= hE and S(e) < q do e = e + 1 end
      if e + off > hE then
        local lo, hi = e - 1, math.min(entries(), q - base)
        while hi - lo > 1 do
          local mid = floor((lo + hi) / 2)
          if S(mid) >= q then hi = mid else lo = mid end
        end
        e = hi
      end
      local at = T(e) + P
      if at > tt then tt = at end
    end
    local wait = tt - now
    local granted = wait <= x
    if granted then
      local rt = tt
      if prec > 0 then rt = (floor(tt / prec) + 1) * prec end
      if E ~= 0 and rt < Tlast then rt = Tlast end
      -- trim what has left the window, once 2 entries have (log.lua's LOG_TRIM)
      local h = now - P
      if E ~= 0 and T(1) <= h then
        if Tlast <= h then
          redis.call('UNLINK', key)
          head, hE, off, E, base, Pn, Tlast, empty = {}, 0, 0, 0, 0, 0, nil, true
        else
          local j = at_or_before(h)
          if j >= 2 then
            base = S(j)
            redis.call('LTRIM', key, string.format('%d', 2 * j), '-1')
            off = off + j
            if E then E = E - j end
          end
        end
      end
      Pn = Pn + n
      if E ~= 0 and rt == Tlast then
        redis.call('LSET', key, '-1', string.format('%d', Pn))
        if E and E + off <= hE then head[2 * (E + off) + 1] = Pn end
      elseif empty then
        redis.call('RPUSH', key, string.format('%d', base), string.format('%d', rt), string.format('%d', Pn))
        E, empty = 1, false
      else
        redis.call('RPUSH', key, string.format('%d', rt), string.format('%d', Pn))
        if E then E = E + 1 end
      end
      Tlast = rt
    end
    local remaining = R -- log.lua's lg_remaining
    if E ~= 0 then
      if Tlast - prec > now then
        remaining = 0
      else
        remaining = math.min(R, R - (Pn - S(at_or_before(now - P))))
        if remaining < 0 then remaining = 0 end
      end
    end
    local reset = 0
    if E ~= 0 and Tlast + P > now then reset = Tlast + P - now end
    if not granted then
      return {0, remaining, wait, reset, 0}
    end
    local ttl = Tlast + P - now
    redis.call('PEXPIRE', key, string.format('%d', ttl > 1000 and -floor(-ttl / 1000) or 1))
    return {1, remaining, wait, reset, tt}
  end
end
