-- log.lua: SlidingWindow ("sw") and SlidingCounter ("sc"), a log of numbered permits: at
-- most rate permits take effect in any window of period, for every limit, exactly (the
-- counter: counted at the end of their sub-bucket). limiter.lua's header lists what it
-- defines.
--
-- Head   "sw <r1> <p1> ..." or "sc <buckets> <r1> <p1> ...": rate, period_us per limit;
--        the counter's sub-buckets of the shortest period, 1..10000.
-- State  a list [meta, base, T1, S1, ..., TE, SE]: the meta text (internal/protocol); Ti
--   when entry i takes effect, µs, and Si the permits granted up to and including it, both
--   strictly rising (grants at one time share an entry); base S0, the count of the entries
--   trimmed. Its TTL lasts until the last entry has left the longest window (or the meta's
--   lines end); an absent key is an empty log. The counter records a grant at t at the end
--   of its sub-bucket, (floor(t / bucket_us) + 1) × bucket_us (bucket_us: the shortest
--   period / buckets, rounded up; the exact log: 0), one entry per sub-bucket.
-- Rules: granting n at t keeps every window (t - period, t] at or under rate exactly when
--   permit number SE + n - rate took effect at or before t - period: an acquire books at
--   the earliest t >= t0, at or after the last entry (FIFO), where that holds for every
--   limit, one lookup per limit.
-- Cancel of n booked at token (token > now) removes min(n, held) permits from the entry
--   recorded for token's time and renumbers the entries after it (freed 1 when there was
--   one); a settle adds d (d < 0: at most the permits it holds) to it alike.
-- Remaining: min over limits of rate - permits in (now - period, now], 0 while a booking
--   waits or paused; reset_us: until the last entry has left the longest window.
--
-- A call reads the head (meta, base and LOG_HEAD entries) and the last entry, which answer
-- the usual lookups; one further in is a binary search, an LRANGE per probe. Writes wait
-- in the state until save: the entries trimmed from the front (off), those replaced at the
-- back (drop), the stored last entry's new count (lset) and the entries appended (tail),
-- so a batch's requests write the list once.

local LIMIT_FIELDS = 2   -- a limit's numbers in a head: rate, period_us
local LIMIT_TEXT = '^ ([1-9]%d*) ([1-9]%d*)()' -- a limit's text in a head as Go writes it
local ONE_LIMIT = '^(sw) ([1-9]%d*) ([1-9]%d*)$' -- the usual head, as Go writes it
local TAGS, PARAM_TAG, CAP = ' sw sc ', 'sc', 1 -- the heads it serves; the one with a parameter; n's bound
local LOG_HEAD, LOG_HEAD_END = 3, '7' -- the head's entries, its last list index (meta, base, the entries)
local LOG_TRIM = 2       -- expired entries that make an acquire trim (fewer wait for a later one)

-- entry returns the time and count an entry's texts hold, or nil when they are not
-- ours (times and counts are never 0 and have no leading zero: then coercion reads them,
-- as parse_head).
local function entry(T, S)
  if T and S and #T < 18 and #S < 18 and string.find(T, '^[1-9]%d*$') and string.find(S, '^[1-9]%d*$') then
    return T + 0, S + 0
  end
end

-- at returns the time and count of entry i (1 <= i <= E; entry 0: -1 and base). An
-- entry of the stored list is read once (st[2s - 1], st[2s]), from the head's texts or
-- one LRANGE; the stored last entry's count is its new one (lset); entries past the
-- stored ones are the tail. An entry not ours sets st.err (the driver fails the state's
-- requests) and reads as 0 and base, so that what reads it still ends.
local function at(st, i)
  if i == 0 then
    return -1, st.base
  end
  local s = st.off + i
  if st.send and s > st.send then
    local k = 2 * (s - st.send)
    return st.tail[k - 1], st.tail[k]
  end
  local T, S = st[2 * s - 1], st[2 * s] -- (st's array: the entries read, by list position)
  if not T then
    local v, o = st.head, 2 * s -- (v[o + 1], v[o + 2]: the entry's texts)
    if s > st.hn then
      v, o = redis.call('LRANGE', st.key, string.format('%d', 2 * s), string.format('%d', 2 * s + 1)), 0
    end
    T, S = entry(v[o + 1], v[o + 2])
    if not T then
      st.err = st.err or st.key .. ': entry ' .. st.off + i
      return 0, st.base
    end
    st[2 * s - 1], st[2 * s] = T, S
  end
  if T == st.slastT then
    S = st.slastS
  end
  return T, S
end

-- entries returns E, reading the list's length once if the head did not hold it all.
local function entries(st)
  if not st.send then
    local len = redis.call('LLEN', st.key)
    if len % 2 == 1 then
      st.err = st.err or st.key .. ': length'
    end
    st.send = (len - 2 - len % 2) / 2 - st.drop
  end
  return st.send - st.off + #st.tail / 2
end

-- search returns the largest j in [0, E] whose time (f = 1) or count (f = 2) is below v,
-- for v at most that of entry E (so j < E) and above that of entry 0.
local function search(st, f, v)
  local j = 0
  while st.off + j < st.hn and (not st.send or st.off + j < st.send) do
    local T, S = at(st, j + 1)
    if (f == 1 and T or S) >= v then
      return j
    end
    j = j + 1
  end
  local hi = entries(st)
  while hi - j > 1 do
    local mid = (j + hi - (j + hi) % 2) / 2
    local T, S = at(st, mid)
    if (f == 1 and T or S) < v then
      j = mid
    else
      hi = mid
    end
  end
  return j
end

local function load(key, head)
  local v = redis.pcall('LRANGE', key, '0', LOG_HEAD_END)
  if v.err then -- another type: a meta alone in a string (the bucket's or the window's)
    -- is an empty log
    local s = string.find(v.err, 'WRONGTYPE', 1, true) and redis.pcall('GET', key)
    if type(s) ~= 'string' or string.sub(s, 1, 1) ~= '\n' then
      return nil, v
    end
    v = {string.sub(s, 2)}
  end
  local len = #v
  -- made at its size: the head's entries (at) and the fields a usual call sets
  local st = {false, false, false, false, false, false, false, false,
    key = key, head = v, hn = 0, off = 0, drop = 0, tail = {}, base = 0, P = 0, meta = v[1],
    exists = len > 0, absent = len < 2, send = false, slastT = false, slastS = false, lastT = false, prec = 0,
    pmax = 0, dirty = false}
  if len < 2 then -- absent, or a meta alone (the state's data is empty)
    st.send, st.bare = 0, len == 1
    return st
  end
  -- the last entry at once: it decides where a grant goes; the head's entries are
  -- checked as they are read (at), so a call reads no more than it needs
  local whole = len < 2 * LOG_HEAD + 2 -- the head read the whole list
  local last = whole and v or redis.call('LRANGE', key, '-2', '-1')
  local base = v[2]
  if len % 2 == 1 or #base > 17 or not string.find(base, '^%d+$') or not (base == '0' or base >= '1') then
    return nil, false
  end
  st.base, st.hn = base + 0, whole and (len - 2) / 2 or LOG_HEAD
  st.send = whole and st.hn
  if len > 2 then
    st.slastT, st.slastS = entry(last[#last - 1], last[#last])
    if not st.slastT then
      return nil, false
    end
  end
  st.lastT, st.P = st.slastT, st.slastS or st.base
  return st
end

-- setup counts the state with the limits in force (lim) and the head's parameter: the
-- counter's sub-buckets of the shortest period (0: the exact log).
local function setup(st, lim, param)
  local pmax, pmin = 0, MAX_PERIOD
  for i = 1, #lim do
    local p = lim[i][2]
    if p > pmax then
      pmax = p
    end
    if p < pmin then
      pmin = p
    end
  end
  st.prec, st.pmax = param > 0 and math.ceil(pmin / param) or 0, pmax
end

local function fit(st, lim, n, t, now)
  if st.lastT and st.lastT - st.prec > t then
    t = st.lastT - st.prec
  end
  for i = 1, #lim do
    local q = st.P + n - lim[i][1] -- this permit must have left the window
    if q > st.base then
      local T = at(st, search(st, 2, q) + 1) + lim[i][2]
      if T > t then
        t = T
      end
    end
  end
  return t
end

local function take(st, lim, n, t, now)
  local rt, prec = t, st.prec
  if prec > 0 then
    rt = t - t % prec + prec -- (floor(t / prec) + 1) * prec
  end
  if st.lastT and rt < st.lastT then
    rt = st.lastT
  end
  -- entries that left the longest window go: all at once, or LOG_TRIM of them or more; a
  -- log the call's cancels emptied starts anew, as the call after them would find it
  local h = now - st.pmax
  if st.lastT and st.lastT <= h or not st.lastT and st.base > 0 then
    st.gone, st.off, st.send, st.hn, st.base, st.P = true, 0, 0, 0, 0, 0
    st.lastT, st.slastT, st.lset, st.drop = nil, nil, false, 0
  elseif st.lastT and at(st, 1) <= h then
    local j = search(st, 1, h + 1)
    if j >= LOG_TRIM then
      local _, S = at(st, j)
      st.base, st.off = S, st.off + j
    end
  end
  st.P = st.P + n
  local tail = st.tail
  if rt == st.lastT and #tail == 0 and st.slastT ~= rt then
    -- the last entry is stored before those a cancel dropped: it moves to the tail
    tail[1], tail[2] = at(st, entries(st))
    st.drop, st.send = st.drop + 1, st.send - 1
  end
  if rt == st.lastT and #tail > 0 then
    tail[#tail] = st.P
  elseif rt == st.lastT then
    st.slastS, st.lset = st.P, true
  else
    tail[#tail + 1], tail[#tail + 2] = rt, st.P
  end
  st.lastT, st.dirty = rt, true
end

-- window returns the permits of the log that take effect after h.
local function window(st, h)
  if not st.lastT or st.lastT <= h then
    return 0
  end
  local _, S = at(st, search(st, 1, h + 1))
  return st.P - S
end

local function report(st, lim, now)
  local remaining, reset, lastT = MAX_RATE, 0, st.lastT
  if lastT and lastT + st.pmax > now then
    reset = lastT + st.pmax - now
  end
  for i = 1, #lim do
    local left = lim[i][1] - window(st, now - lim[i][2])
    if left < remaining then
      remaining = left
    end
  end
  if lastT and lastT - st.prec > now or remaining < 0 then
    remaining = 0
  end
  return remaining, reset, reset
end

-- save writes only what changed: the log (st.dirty) and the meta (a text).
local function save(st, key, keep, meta, bare)
  local tail = st.tail
  if keep <= 0 or bare then
    if st.exists then
      redis.call('UNLINK', key) -- frees a long list off the main thread
    end
    if keep > 0 then
      redis.call('RPUSH', key, meta or st.meta)
      redis.call('PEXPIRE', key, ms(keep))
    end
    return
  end
  local row, m = {}, 0 -- RPUSH's values, 200 at a time: meta and base first when the list is new
  if st.absent or st.gone then
    if st.exists then
      redis.call('UNLINK', key)
    end
    row[1], row[2], m = meta or st.meta, string.format('%d', st.base), 2
  else
    if st.lset then
      redis.call('LSET', key, '-1', string.format('%d', st.slastS))
    end
    if st.off > 0 or st.drop > 0 then
      -- trimming off entries keeps T_off, S_off first: S_off is the new base, and the
      -- meta goes where T_off was
      redis.call('LTRIM', key, string.format('%d', 2 * st.off), string.format('%d', -1 - 2 * st.drop))
    end
    if meta or st.off > 0 then
      redis.call('LSET', key, '0', meta or st.meta)
    end
  end
  for i = 1, #tail do
    m = m + 1
    row[m] = string.format('%d', tail[i])
    if m == 200 then
      redis.call('RPUSH', key, unpack(row, 1, m))
      m = 0
    end
  end
  if m > 0 then
    redis.call('RPUSH', key, unpack(row, 1, m))
  end
  redis.call('PEXPIRE', key, ms(keep))
end

-- @cold: what follows only the driver's request loop needs (see lua/internal/gen).

-- adjust changes the permits of the entry recorded for token's time by d (given back, at
-- most what it holds, when d < 0), and renumbers the entries after it; 1 when there was
-- such an entry.
local function adjust(st, lim, d, token, now)
  if not st.lastT then
    return 0
  end
  local rt = token
  if st.prec > 0 then
    rt = (math.floor(token / st.prec) + 1) * st.prec
  end
  if rt > st.lastT then
    return 0
  end
  local e = rt == st.lastT and entries(st) or search(st, 1, rt + 1)
  local T, S = at(st, e)
  if e == 0 or T ~= rt then
    return 0
  end
  local _, S0 = at(st, e - 1)
  local held = S - S0
  if d < -held then
    d = -held
  end
  -- entries e..E move to the tail, to be renumbered there
  local E, tail = entries(st), st.tail
  local s = st.off + e
  if s <= st.send then
    local moved = redis.call('LRANGE', st.key, string.format('%d', 2 * s), string.format('%d', 2 * st.send + 1))
    if #moved ~= 2 * (st.send - s + 1) or not string.find(table.concat(moved, ','), '^[%d,]*$') then
      st.err = st.err or st.key .. ': not a permit log'
      return 0
    end
    for i = 1, #moved do
      moved[i] = tonumber(moved[i])
    end
    if st.lset then -- the stored last entry's new count
      moved[#moved] = st.slastS
    end
    for i = 1, #tail do
      moved[#moved + 1] = tail[i]
    end
    st.drop, st.send, st.tail, st.lset, st.slastT = st.drop + st.send - s + 1, s - 1, moved, false, nil
    tail = moved
  end
  local k = 2 * (s - st.send) -- entry e's count in the tail
  for i = k, #tail, 2 do
    tail[i] = tail[i] + d
  end
  if d == -held then -- the entry goes
    table.remove(tail, k)
    table.remove(tail, k - 1)
    if E == e then
      st.lastT = E > 1 and (at(st, E - 1)) or nil
    end
  end
  st.P, st.dirty = st.P + d, true
  return 1
end

local function give(st, lim, n, token, now)
  return token > now and adjust(st, lim, -n, token, now) or 0
end

-- detail: avail_i is limit i's rate less the permits holding a place in the window that
-- ends now, bookings included (negative when bookings reach further than one window);
-- booked the permits whose (sub-bucket) time starts after now; ahead_us until the latest
-- of them starts.
local function detail(st, lim, now)
  local avail = {}
  for i = 1, #lim do
    avail[i] = lim[i][1] - window(st, now - lim[i][2])
  end
  local booked = window(st, now + st.prec)
  return booked, booked > 0 and st.lastT - st.prec - now or 0, avail
end

local function rates(st, new, at)
end
