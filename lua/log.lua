-- log.lua: the permit log behind slidingwindow.lua and slidingcounter.lua; lua.go puts
-- it after prelude.lua in front of both.
--
-- The log is one list:  [base, T1, S1, T2, S2, ..., TE, SE]
--   Ti    when entry i takes effect (µs, server clock); strictly rising
--   Si    permits granted up to and including entry i (cumulative); strictly rising,
--         so entry i holds Si - S(i-1) permits and grants at one time share an entry
--   base  S0: the count before T1, left by the entries already trimmed
-- Numbering the permits makes the exact wait one lookup: granting n permits at time T
-- keeps every window (T - period, T] at or under rate exactly when permit number
-- SE + n - rate took effect at or before T - period. So the wait is "until the permit
-- that must leave has left" (Redisson waits for the oldest grant instead, which is too
-- early whenever more than one permit is missing).
--
-- Entries are appended at or after the last one (FIFO), so a grant can take effect
-- in the future: a reservation is an entry with T > now, and a later caller books after
-- it. Entries older than the longest period no longer count; they are trimmed once
-- LOG_TRIM of them have gathered (or all of them have), so most calls write nothing
-- but the grant.
--
-- Cost: a call reads the head of the log (LOG_HEAD entries) and its last entry, two
-- LRANGEs, which answer the usual questions; anything further in is found by binary
-- search with LINDEX, O(log E) calls.

local LOG_HEAD = 4 -- entries read with the base in one LRANGE
local LOG_HEAD_END = '8' -- its last list index, 2 × LOG_HEAD, as text: redis.call
                          -- turns a number argument into text with a slow printf
local LOG_TRIM = 2 -- expired entries that make a call trim (fewer wait for a later one)

-- The log as the script sees it: lg_head holds the first elements of the list as read
-- (base and entries 1..lg_hE), lg_off how many entries were trimmed from the front
-- since; lg_E is the number of entries, nil until needed when the list is longer than
-- the head; lg_P is SE (or base), lg_Tlast is TE.
local lg_key, lg_head, lg_hE, lg_off, lg_E, lg_base, lg_P, lg_Tlast, lg_empty
-- lg_kept: in a batch, the log as the previous request (an acquire) left it, which
-- the next request uses instead of reading it again (every write of an acquire keeps
-- the variables above in step with the list)
local lg_kept

local function lg_bad(what)
  error('JTSTATE ' .. lg_key .. ': ' .. what)
end

-- lg_check fails unless every string of v is plain decimal digits, at most 17 of them
-- as jt_num wants (one pattern for all, one length per string; then each is read with
-- a bare tonumber). A longer number is not one this script wrote, and Luas disagree on
-- reading it.
local function lg_check(v, what)
  if not string.find(table.concat(v, ','), '^[0-9,]*$') then lg_bad(what) end
  for i = 1, #v do
    if #v[i] > 17 then lg_bad(what) end
  end
end

-- lg_cT and lg_cS: in a batch, the entries read with LINDEX so far, by their place in
-- the list as loaded (i + lg_off), so that later requests do not read them again
-- (nil in a single call)
local lg_cT, lg_cS

-- lg_T and lg_S read entry i (1 <= i <= E): from the head when it holds it, else LINDEX.
local function lg_T(i)
  local h = i + lg_off
  if h <= lg_hE then
    return tonumber(lg_head[2 * h]) or lg_bad('time ' .. i)
  end
  local v = lg_cT and lg_cT[h]
  if not v then
    v = jt_num(redis.call('LINDEX', lg_key, 2 * i - 1)) or lg_bad('time ' .. i)
    if lg_cT then lg_cT[h] = v end
  end
  return v
end
local function lg_S(i)
  if i == 0 then return lg_base end
  local h = i + lg_off
  if h <= lg_hE then
    return tonumber(lg_head[2 * h + 1]) or lg_bad('count ' .. i)
  end
  local v = lg_cS and lg_cS[h]
  if not v then
    v = jt_num(redis.call('LINDEX', lg_key, 2 * i)) or lg_bad('count ' .. i)
    if lg_cS then lg_cS[h] = v end
  end
  return v
end

-- lg_entries returns E, reading the list's length if it is not known yet.
local function lg_entries()
  if not lg_E then
    local len = redis.call('LLEN', lg_key)
    if len % 2 == 0 then lg_bad('length') end
    lg_E = (len - 1) / 2
  end
  return lg_E
end

-- lg_load reads the log's head (base and the first LOG_HEAD entries) and last entry.
local function lg_load(key)
  lg_key = key
  if jt_batching then lg_cT, lg_cS = {}, {} end
  local v = redis.call('LRANGE', key, '0', LOG_HEAD_END)
  local len = #v
  lg_head, lg_off, lg_base, lg_P, lg_Tlast, lg_empty = v, 0, 0, 0, nil, len == 0
  if len == 0 then
    lg_hE, lg_E = 0, 0
    return
  end
  lg_check(v, 'not a number')
  lg_base = tonumber(v[1]) or lg_bad('base')
  if len < 2 * LOG_HEAD + 1 then -- the whole list
    if len % 2 == 0 then lg_bad('length') end
    lg_hE = (len - 1) / 2
    lg_E = lg_hE
    lg_P = lg_base
    if lg_E > 0 then
      lg_Tlast = tonumber(v[len - 1]) or lg_bad('last time')
      lg_P = tonumber(v[len]) or lg_bad('last count')
    end
    return
  end
  lg_hE, lg_E = LOG_HEAD, nil
  local last = redis.call('LRANGE', key, '-2', '-1')
  lg_check(last, 'not a number')
  lg_Tlast = tonumber(last[1]) or lg_bad('last time')
  lg_P = tonumber(last[2]) or lg_bad('last count')
end

-- lg_last_at_or_before returns the largest j in [0, E] with Tj <= h (T0 counts as -inf).
local function lg_last_at_or_before(h)
  if lg_E == 0 or lg_T(1) > h then return 0 end
  if lg_Tlast <= h then return lg_entries() end
  -- the head covers the common case: a handful expired since the last call
  local k = 1
  while k + lg_off < lg_hE and (not lg_E or k < lg_E) do
    if lg_T(k + 1) > h then return k end
    k = k + 1
  end
  -- T(k) <= h < T(E): binary search
  local lo, hi = k, lg_entries()
  while hi - lo > 1 do
    local mid = math.floor((lo + hi) / 2)
    if lg_T(mid) <= h then lo = mid else hi = mid end
  end
  return lo
end

-- lg_first_count_at_least returns the smallest e in [1, E] with Se >= q, for
-- base < q <= P. Every entry holds at least one permit, so e <= q - base.
local function lg_first_count_at_least(q)
  local e = 1
  while e + lg_off <= lg_hE do
    if lg_S(e) >= q then return e end
    e = e + 1
  end
  -- S(e - 1) < q: binary search
  local lo, hi = e - 1, math.min(lg_entries(), q - lg_base)
  while hi - lo > 1 do
    local mid = math.floor((lo + hi) / 2)
    if lg_S(mid) >= q then hi = mid else lo = mid end
  end
  return hi
end

-- lg_trim drops the entries at or before h, keeping the count they leave as base,
-- once at least min of them have expired (or all of them have).
local function lg_trim(h, min)
  if lg_E == 0 or lg_T(1) > h then return end
  if lg_Tlast <= h then
    redis.call('UNLINK', lg_key) -- frees a long list off the main thread
    if jt_batching then lg_cT, lg_cS = {}, {} end
    lg_head, lg_hE, lg_off, lg_E, lg_base, lg_P, lg_Tlast, lg_empty = {}, 0, 0, 0, 0, 0, nil, true
    return
  end
  local j = lg_last_at_or_before(h)
  if j < min then return end
  lg_base = lg_S(j)
  redis.call('LTRIM', lg_key, string.format('%d', 2 * j), '-1') -- S(j) becomes the new base
  lg_off = lg_off + j
  if lg_E then lg_E = lg_E - j end
end

-- lg_in_window counts the permits of the log that took effect after h.
local function lg_in_window(h)
  return lg_P - lg_S(lg_last_at_or_before(h))
end

-- lg_span returns the lowest rate and the longest period of limits.
local function lg_span(limits)
  local rmin, pmax = JT_MAX_RATE, 0
  for i = 1, #limits do
    rmin = math.min(rmin, limits[i][1])
    pmax = math.max(pmax, limits[i][2])
  end
  return rmin, pmax
end

-- lg_remaining returns what an acquire made now could still get (rmin: the lowest
-- rate; prec as jt_log's; paused: when a pause ends): nothing while bookings wait.
local function lg_remaining(limits, rmin, prec, paused, now)
  if paused > now then
    return 0
  elseif lg_E == 0 then
    return rmin
  elseif lg_Tlast - prec > now then
    return 0
  end
  local remaining = rmin
  for i = 1, #limits do
    remaining = math.min(remaining, limits[i][1] - lg_in_window(now - limits[i][2]))
  end
  return math.max(0, remaining)
end

-- lg_push appends rows (a flat list of T, S values) in bounded batches.
local function lg_push(rows)
  local i = 1
  while i <= #rows do
    local j = math.min(#rows, i + 199)
    redis.call('RPUSH', lg_key, unpack(rows, i, j))
    i = j + 1
  end
end

-- lg_cancel gives back n permits of the entry recorded for the token x's time, if that
-- time is still in the future, and renumbers the entries after it (the log is loaded;
-- prec as jt_log's; pmax the longest period). Returns {freed, 0, 0, reset_us, 0}.
local function lg_cancel(key, prec, n, x, now, pmax)
  lg_trim(now - pmax, 1)
  local rt, freed = x, 0
  if prec > 0 then rt = (jt_fdiv(x, prec) + 1) * prec end
  if x > now and lg_E ~= 0 and rt <= lg_Tlast then
    local e = lg_last_at_or_before(rt)
    if e > 0 and lg_T(e) == rt then
      local rows = redis.call('LRANGE', key, 2 * e - 1, -1)
      local held = (jt_num(rows[2]) or lg_bad('count')) - lg_S(e - 1)
      freed = math.min(n, held)
      local out = {}
      for i = 1, #rows, 2 do
        if not (i == 1 and freed == held) then
          out[#out + 1] = rows[i]
          out[#out + 1] = (jt_num(rows[i + 1]) or lg_bad('count')) - freed
        end
      end
      redis.call('LTRIM', key, 0, 2 * e - 2)
      lg_push(out)
      lg_load(key)
      if lg_E == 0 then
        redis.call('DEL', key)
      else
        jt_expire(key, lg_Tlast + pmax - now)
      end
    end
  end
  local reset = 0
  if lg_E ~= 0 then reset = math.max(0, lg_Tlast + pmax - now) end
  return {freed > 0 and 1 or 0, 0, 0, reset, 0}
end

-- lg_acquire books n permits at the earliest time they fit within every limit, at or
-- after every earlier grant, when that is at most x away (the log is loaded; rmin the
-- lowest rate, pmax the longest period). Returns {granted, remaining, wait_us,
-- reset_us, token}.
local function lg_acquire(key, pause_key, prec, n, x, limits, now, rmin, pmax)
  local m = #limits
  local paused = jt_pause(pause_key)
  local t = math.max(now, paused)
  if lg_E ~= 0 then
    t = math.max(t, lg_Tlast - prec) -- prec > 0: the start of the last entry's bucket
  end
  if n > 0 then
    for i = 1, m do
      local q = lg_P + n - limits[i][1] -- this permit must have left the window
      if q > lg_base then
        t = math.max(t, lg_T(lg_first_count_at_least(q)) + limits[i][2])
      end
    end
  end
  local wait = t - now
  if n == 0 then wait = 0 end -- n = 0 only reads: it is granted and takes nothing
  local granted = wait <= x

  if granted and n > 0 then
    if lg_empty then
      jt_one_algorithm() -- this grant makes the state key: no other algorithm's may be there
    end
    local rt = t
    if prec > 0 then rt = (jt_fdiv(t, prec) + 1) * prec end
    if lg_E ~= 0 and rt < lg_Tlast then rt = lg_Tlast end
    -- expired entries go in the same call as the grant, in batches
    lg_trim(now - pmax, LOG_TRIM)
    lg_P = lg_P + n
    if lg_E ~= 0 and rt == lg_Tlast then
      redis.call('LSET', key, '-1', string.format('%d', lg_P))
      -- a batch's later requests read the head: when it holds this entry, it gets the
      -- new count (whether it does needs E; a single call reads no more)
      if jt_batching then lg_entries() end
      if lg_E and lg_E + lg_off <= lg_hE then lg_head[2 * (lg_E + lg_off) + 1] = lg_P end
      if lg_cS then
        if lg_E then lg_cS[lg_E + lg_off] = nil else lg_cS = {} end
      end
    elseif lg_empty then
      redis.call('RPUSH', key, string.format('%d', lg_base), string.format('%d', rt), string.format('%d', lg_P))
      lg_E, lg_empty = 1, false
    else
      redis.call('RPUSH', key, string.format('%d', rt), string.format('%d', lg_P))
      if lg_E then lg_E = lg_E + 1 end
    end
    lg_Tlast = rt
  end

  local remaining = lg_remaining(limits, rmin, prec, paused, now)
  local reset = 0
  if lg_E ~= 0 then reset = math.max(0, lg_Tlast + pmax - now) end
  if jt_batching then lg_kept = key end
  if granted then
    if n > 0 then
      -- the state matters until its last entry has left the longest window. Last, after
      -- every read: Redis can count a TTL of a millisecond or two as already over (its
      -- clock for PEXPIRE lags the script's), and the key is then gone at once.
      jt_expire(key, lg_Tlast + pmax - now)
    else
      t = 0
    end
    return {1, remaining, wait, reset, t}
  end
  return {0, remaining, wait, reset, 0}
end

-- jt_log runs an acquire or a cancel on the log.
--   prec      0 for an exact log; otherwise the sub-bucket width (µs): a grant at t is
--             recorded at the end of its bucket, (floor(t / prec) + 1) × prec, so a
--             permit may hold its place up to one bucket longer than period, never less.
--   op, n, x  as jt_args returns them; limits[i] = {rate, period_us}
-- Returns {granted, remaining, wait_us, reset_us, token}.
local function jt_log(key, pause_key, prec, op, n, x, limits)
  local rmin, pmax = lg_span(limits)
  -- n <= rmin: jt_limiter checked it
  local now = jt_now()
  local claimed
  claimed, x = jt_claim(n, now, pause_key, x)
  if claimed then return claimed end
  if lg_kept ~= key then lg_load(key) end
  lg_kept = nil
  if jt_bk_give then -- an override overtook the booking: give it back first (jt_claim)
    lg_cancel(key, prec, n, jt_bk_give, now, pmax)
    lg_load(key)
  end

  if op == 1 then
    return lg_cancel(key, prec, n, x, now, pmax)
  end
  return lg_acquire(key, pause_key, prec, n, x, limits, now, rmin, pmax)
end
