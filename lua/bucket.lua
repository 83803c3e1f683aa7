-- bucket.lua: TokenBucket ("tb"), with golang.org/x/time/rate's semantics decision for
-- decision; limiter.lua's header says what it defines.
--
-- Head   "tb <r1> <p1> <b1> ...": rate, period_us and burst per limit, b·p <= 2^50.
-- State  a string "<last> <u1> <e1> ... <um> <em>\n<meta>":
--   last   when the tokens were counted, µs (the time of the write)
--   ui     limit i's tokens at last, in ticks: a token is pi ticks and the bucket refills
--          ri ticks per µs, so everything is an exact integer; negative when booked ahead
--   ei     the time of limit i's latest booking, µs, while it lies ahead (x/time/rate's
--          lastEvent; 0: none ahead, as a cancel gives back only a booking ahead)
--   meta   the meta text (internal/protocol); the tokens are counted with its head's
--          limits, at its override's rates until the override's end
--   A unit's state (settles may come) adds " r <R> <Z> [<t> <v>]...", what its refunds
--   need (below): R the tokens given back so far (refunds, cancels' restores), Z since
--   when its takes are noted, and up to REFUNDS notes of a take at t, v its room plus R
--   then, rising in t: the least v of any take at t or after.
-- An absent key is full buckets, at the limits in force when it is read. The key's TTL is
-- the time until every bucket is full, at the limits in force and, from an override's end
-- on, at the callers' (keep_us), or until the latest booking when that is later: limits
-- changed since a booking (a faster rate or a lower burst: an override, its clear or end, a
-- deploy) can fill a bucket while the booking still lies ahead, and its time e still counts
-- (a cancel's restore, Inspect's ahead_us), so that full state is kept, not written as
-- absent; a full state with nothing booked ahead goes as before.
--
-- Rules (x/time/rate's advance, reserveN, CancelAt, SetLimitAt, SetBurstAt), per limit:
--   tokens at t >= last: min(b·p, u + (t - last)·r)
--   acquire n at now, earliest start t0 (now, or a pause's end): limit i's own time
--     ti = now + ceil(max(0, n·p - u(now)) / r); t = max(t0, max ti), booked only when
--     t - now <= max wait and <= 2^50/r (else wait_us = t - now); then each limit takes n
--     at t: u <- min(u(now), b·p - (t - now)·r + s) - n·p and e <- t, where s < r is the
--     rounding of ti up to the µs. With t = ti that is x/time/rate's tokens -= n; a booking
--     a pause or another limit put later also spends the refill the burst would have cut.
--   a change of rate, period or burst keeps the tokens held at the change and counts from
--     then on with the new limits (a lower burst cuts the tokens above it at once, a higher
--     one fills at the rate): an override or a clear settles at the call's time, an
--     override that has expired at its end, any other difference (a deploy with new
--     limits) at the call that finds it. A new period converts the whole tokens held.
-- Cancel (x/time/rate's CancelAt at now) of n booked at token: nothing when token < now;
--   else each limit gets back restore = n·p - r·max(0, e - token) ticks (the n less what was
--   booked after it; never more than n: a booking made since may lie before it, held later
--   by another limit or a tenant's cap, and more would let the bucket grant beyond its burst
--   and refill), up to its burst, when restore > 0; and when token = e, e moves back
--   to token - floor(n·p/r) if that is not before now, so that cancelling the booking before
--   it gives its tokens back too. freed is 1 when any limit got tokens back.
-- Settle (adjust) of a grant at token: d more is taken at its place; d less comes back as
--   if the grant had cost that from the start, which the burst cuts: the tokens it gives
--   back stay in the bucket until the bucket would have been full with them, so no more
--   than the least room any take after the grant found (a take's room: how far below full
--   the bucket was before it, or below what a booking ahead keeps), nor than the room now.
--   A unit's state notes the rooms of its takes since Z (a new state's, or since its limits
--   changed: a grant before gets nothing back), each less whatever came back since (R then
--   and now): the least after a grant bounds its refund. A note a later take's room is
--   under goes; over REFUNDS, the two of the closest v are one (the later t, the lower v:
--   less back, never more), and a note older than a bucket's fill time goes (no settle
--   reaches back so far). Takes between a booking and its time find room for its whole
--   estimate.
-- The only differences from x/time/rate: a cancel gives back no more than n (CancelAt gives
--   back more when its lastEvent lies before the booking, or is past); and rounding: times
--   are whole µs and a booking's time is rounded up to the µs (waits are x/time/rate's,
--   rounded up: the same grants for whole-µs max waits); a cancel counts the time between
--   its token and e in those rounded times and with the rate in force at the cancel
--   (x/time/rate: the reservation's rate).
-- Remaining: floor(min u(now)/p) (0 while paused); reset_us: until every bucket is full.

local LIMIT_FIELDS = 3 -- a limit's numbers in a head: rate, period_us, burst
local REFUNDS = 8 -- the most takes a unit's state notes for refunds
local LIMIT_TEXT = '^ ([1-9]%d*) ([1-9]%d*) ([1-9]%d*)()' -- a limit's text in a head as Go writes it
local ONE_LIMIT = '^(tb) ([1-9]%d*) ([1-9]%d*) ([1-9]%d*)$' -- the usual head, as Go writes it
local TAGS, PARAM_TAG, CAP = ' tb ', '', 3 -- the heads it serves; the one with a parameter; n's bound

-- rates settles st, counted at st.at, at `at` (>= st.at) with the limits it holds, and
-- counts with new from then on.
local function rates(st, new, at)
  local horizon = MAX_WAIT
  for i = 1, #new do
    local j, l = 5 * i - 5, new[i]
    local u, r, p, b = st[j + 1], st[j + 2], st[j + 3], st[j + 4]
    if r then
      if at > st.at then
        u = u + (at - st.at) * r
        u = u < b * p and u or b * p
      end
      if r ~= l[1] or p ~= l[2] or b ~= l[3] then
        if p ~= l[2] then
          local whole = math.min(math.floor(u / p), l[3])
          u = math.max(whole * l[2] + math.floor((u - whole * p) / p * l[2]), -MAX_TICKS)
        end
        r, p, b = l[1], l[2], l[3]
        st.dirty, st.rf = true, nil
      end
      st[j + 1], st[j + 2], st[j + 3], st[j + 4] = u < b * p and u or b * p, r, p, b
      local h = (MAX_TICKS - MAX_TICKS % r) / r
      if h < horizon then
        horizon = h
      end
    end
  end
  st.at, st.horizon = at, horizon
end

local function load(key, head)
  local v = redis.pcall('GET', key)
  if not v then -- (made at the size setup fills)
    return {false, false, false, false, false, at = now, key = key, absent = true, horizon = false, given = false,
      dirty = false}
  elseif type(v) == 'table' then -- another type: a meta alone in a list (the log's) is
    -- full buckets
    local l = string.find(v.err, 'WRONGTYPE', 1, true) and redis.pcall('LRANGE', key, '0', '1')
    if type(l) ~= 'table' or l.err or #l ~= 1 then
      return nil, v
    end
    v = '\n' .. l[1]
  end
  local nl = string.find(v, '\n', 1, true)
  if not nl then
    return nil, false
  end
  local meta = (#v - nl == #head and string.find(v, head, nl + 1, true)) and head or string.sub(v, nl + 1)
  if nl == 1 then -- a meta alone: full buckets
    return {at = now, key = key, absent = true, exists = true, bare = true, meta = meta}
  end
  -- one limit's state (the usual case) is read with one match, any other field by field
  local st
  local last, u, e = string.match(v, '^([1-9]%d*) (%-?%d+) (%d+)\n')
  if last and nl < 300 and (e == '0' or e >= '1') and (u == '0' or u >= '1' or u < '.' and u >= '-1') then
    -- (no leading zero: then coercion reads them, as parse_head; made at the size setup fills)
    st = {u + 0, false, false, false, e + 0, at = last + 0, meta = meta, key = key, exists = true, horizon = false,
      given = false, dirty = false}
  else
    local w, line, rf = {}, string.sub(v, 1, nl - 1), nil
    local nums, notes = string.match(line, '^(.-) r ([%d %-]+)$')
    if nums then
      line, rf = nums, {}
      for f in string.gmatch(notes, '%S+') do
        local x = string.find(f, '^%d+$') and tonumber(f)
        if not x or x > MAX_WAIT then -- (none is negative: R, Z, t and v count up from 0)
          return nil, false
        end
        rf[#rf + 1] = x
      end
      if #rf < 2 or #rf % 2 == 1 or #rf > 2 + 2 * REFUNDS then
        return nil, false
      end
    end
    for f in string.gmatch(line, '%S+') do
      w[#w + 1] = string.find(f, '^%-?%d+$') and tonumber(f) or -MAX_WAIT
    end
    if #w < 3 or #w % 2 == 0 then
      return nil, false
    end
    st = {at = w[1], meta = meta, key = key, exists = true, rf = rf}
    for i = 1, (#w - 1) / 2 do
      st[5 * i - 4], st[5 * i - 3], st[5 * i - 2], st[5 * i - 1], st[5 * i] = w[2 * i], false, false, false, w[2 * i + 1]
    end
  end
  if st.at < 0 or st.at > MAX_WAIT then
    return nil, false
  end
  for j = 0, #st - 5, 5 do
    if st[j + 1] < -2 * MAX_TICKS or st[j + 5] < 0 or st[j + 5] > MAX_WAIT then
      return nil, false
    end
  end
  return st
end

-- setup counts the state with the limits in force (lim): its tokens were counted with cw
-- (the stored head's limits, at its override's rates), cw's override ending at cwend (0:
-- none); given are the callers' limits, in force again after a stored override's end.
local function setup(st, lim, param, cw, cwend, given, now)
  if not st.absent then
    if #st ~= 5 * #cw then -- the numbers are not of the limits the meta says
      st.err = st.key .. ': not a token bucket'
      return
    end
    for i = 1, #cw do
      local j, c = 5 * i - 5, cw[i]
      if st[j + 1] > c[3] * c[2] then -- more tokens than the burst they were counted with
        st.err = st.key .. ': not a token bucket'
        return
      end
      st[j + 2], st[j + 3], st[j + 4] = c[1], c[2], c[3]
    end
    if cwend > 0 and cwend <= now then -- the override ended: its rates until then, the callers' after
      local at = math.max(cwend, st.at)
      rates(st, given, at)
      st.dirty = true
    end
  end
  for i = 1, #lim do -- limits the state does not hold yet are full
    local j, l = 5 * i - 5, lim[i]
    if not st[j + 2] then
      st[j + 1], st[j + 2], st[j + 3], st[j + 4], st[j + 5] = l[3] * l[2], l[1], l[2], l[3], 0
      st.rf = nil
    end
  end
  for j = #st, 5 * #lim + 1, -1 do -- limits the callers no longer have go
    st[j] = nil
  end
  rates(st, lim, now)
  st.given = given
end

local function fit(st, lim, n, t, now)
  for j = 0, 5 * #lim - 5, 5 do
    local d, r = n * st[j + 3] - st[j + 1], st[j + 2]
    if d > 0 then
      local ti = now + (d - d % r) / r -- now + ceil(d / r)
      if d % r > 0 then
        ti = ti + 1
      end
      if ti > t then
        t = ti
      end
    end
  end
  return t
end

local function take(st, lim, n, t, now)
  for j = 0, 5 * #lim - 5, 5 do
    local u, r, p, b = st[j + 1], st[j + 2], st[j + 3], st[j + 4]
    local d, s = n * p - u, 0
    if d > 0 then
      s = (r - d % r) % r -- ceil(d / r) * r - d
    end
    local full = b * p - (t - now) * r + s
    st[j + 1] = (u < full and u or full) - n * p
    st[j + 5] = t
  end
  st.dirty = true
end

-- keep_us is how long the state must be kept from now (µs; <= 0: not at all), oend the end of
-- the override whose limits lim are (0: none): until every bucket is full, at lim and, from
-- oend on, at the callers' limits (st.given) with the tokens held at oend. A bucket an
-- override refills faster than the callers' may not be full by then, and one full at an
-- override's lower burst is not full at the callers': an absent key would be.
local function keep_us(st, lim, now, oend, reset)
  if oend <= now then
    return reset
  end
  local k = 0
  for i = 1, #lim do
    local j, g = 5 * i - 5, st.given[i]
    local u, r, p, b = st[j + 1], st[j + 2], st[j + 3], st[j + 4]
    local full = math.ceil((b * p - u) / r)
    if g[2] == p and (full > oend - now or b < g[3]) then
      local ue = math.min(b * p, u + (oend - now) * r, g[3] * p)
      full = oend - now + math.ceil((g[3] * p - ue) / g[1])
    end
    k = math.max(k, full)
  end
  return k
end

local function report(st, lim, now, oend)
  local remaining, reset, ahead = MAX_RATE, 0, 0
  for j = 0, 5 * #lim - 5, 5 do
    local u, r, p, b, e = st[j + 1], st[j + 2], st[j + 3], st[j + 4], st[j + 5] - now
    local whole, short = (u - u % p) / p, b * p - u -- floor(u / p); ticks short of full
    local wait = (short - short % r) / r -- ceil(short / r)
    if short % r > 0 then
      wait = wait + 1
    end
    if whole < remaining then
      remaining = whole
    end
    if wait > reset then
      reset = wait
    end
    if e > ahead then
      ahead = e
    end
  end
  local keep = oend and oend > 0 and keep_us(st, lim, now, oend, reset) or reset
  return remaining > 0 and remaining or 0, reset, keep > ahead and keep or ahead
end

local function save(st, key, keep, meta, bare)
  if keep <= 0 then
    if st.exists then
      redis.call('DEL', key)
    end
    return
  elseif bare then
    redis.call('SET', key, '\n' .. (meta or st.meta), 'PX', ms(keep))
    return
  end
  local more = '' -- the limits after the first, a unit's notes for refunds
  for j = 5, #st - 5, 5 do
    more = more .. string.format(' %d %d', st[j + 1], st[j + 5] > now and st[j + 5] or 0)
  end
  if st.rf then
    more = more .. string.format(' r' .. string.rep(' %d', #st.rf), unpack(st.rf))
  end
  redis.call('SET', key, string.format('%d %d %d%s\n%s', now, st[1], st[5] > now and st[5] or 0, more, meta or st.meta),
    'PX', ms(keep))
end

-- @cold: what follows only the driver's request loop needs (see lua/internal/gen).

-- refunds returns a unit's state's notes for refunds (the header's "r"): new, nothing before
-- now counted, when it had none (or its limits changed), less those no settle reaches.
local function refunds(st, lim, now)
  local rf, span = st.rf, 0
  if not rf or rf[2] > now then
    rf = {0, now}
    st.rf = rf
  end
  for j = 0, 5 * #lim - 5, 5 do
    span = math.max(span, math.ceil(st[j + 4] * st[j + 3] / st[j + 2]))
  end
  while rf[3] and rf[3] <= now - span do
    table.remove(rf, 3)
    table.remove(rf, 3)
  end
  return rf
end

-- note notes a take of n at t, before it takes: the room it finds, in tokens, the least of
-- its limits' (below full, or below what a booking ahead keeps: take's full).
local function note(st, lim, n, t, now)
  local room = MAX_TICKS
  for j = 0, 5 * #lim - 5, 5 do
    local u, r, p, b = st[j + 1], st[j + 2], st[j + 3], st[j + 4]
    local d = n * p - u
    local full = b * p - (t - now) * r + (d > 0 and (r - d % r) % r or 0)
    room = math.min(room, math.floor(math.max(0, full - u) / p))
  end
  local rf = refunds(st, lim, now)
  local v, k = room + rf[1], #rf
  while k > 2 and rf[k] >= v do -- (a note a later take's room is under)
    rf[k], rf[k - 1] = nil, nil
    k = k - 2
  end
  rf[k + 1], rf[k + 2] = now, v
  if k > 2 * REFUNDS then
    local c = 3
    for i = 5, k - 1, 2 do
      if rf[i + 3] - rf[i + 1] < rf[c + 3] - rf[c + 1] then
        c = i
      end
    end
    rf[c] = rf[c + 2]
    table.remove(rf, c + 2)
    table.remove(rf, c + 2)
  end
end

-- In the loop, a take from a unit's state is noted first (the fast paths take from none,
-- and their take, defined before, pays nothing for it).
local take_unnoted = take
take = function(st, lim, n, t, now)
  if st.costs then
    note(st, lim, n, t, now)
  end
  take_unnoted(st, lim, n, t, now)
end

local function give(st, lim, n, token, now)
  if token < now then
    return 0
  end
  local freed = 0
  for j = 0, 5 * #lim - 5, 5 do
    local u, r, p, b, e = st[j + 1], st[j + 2], st[j + 3], st[j + 4], st[j + 5]
    -- less what was booked after token: to the latest booking, or to now once it is past
    -- (a past one is not kept); never more than n (the header says why)
    local after = (e > now and e or now) - token
    local restore = n * p - (after > 0 and after or 0) * r
    if restore > 0 then
      st[j + 1], freed = math.min(b * p, u + restore), 1
      if st.rf then -- (the takes since have that much less room)
        st.rf[1] = st.rf[1] + math.ceil(restore / p)
      end
      if token == e and token - math.floor(n * p / r) >= now then
        st[j + 5] = token - math.floor(n * p / r)
      end
    end
  end
  st.dirty = st.dirty or freed == 1
  return freed
end

local function adjust(st, lim, d, token, now)
  if d < 0 then -- back: no more than the least room after the grant (the header)
    local rf = refunds(st, lim, now)
    local least = token < rf[2] and 0 or math.huge
    for i = 3, #rf, 2 do
      if rf[i] > token then
        least = rf[i + 1] - rf[1]
        break
      end
    end
    d = -math.max(0, math.min(-d, least))
    rf[1] = rf[1] - d
  end
  for j = 0, 5 * #lim - 5, 5 do
    local u, r, p, b = st[j + 1], st[j + 2], st[j + 3], st[j + 4]
    if token + math.ceil(b * p / r) > now then -- the bucket has not refilled since
      st[j + 1], st.dirty = math.max(-MAX_TICKS, math.min(b * p, u - d * p)), true
    end
  end
end

-- detail: booked is the most permits any bucket owes (its negative tokens), ahead_us the
-- time until the latest booking, avail_i limit i's whole tokens (negative when it owes).
local function detail(st, lim, now)
  local booked, ahead, avail = 0, 0, {}
  for i = 1, #lim do
    local j = 5 * i - 5
    avail[i] = math.floor(st[j + 1] / st[j + 3])
    booked = math.max(booked, -avail[i])
    ahead = math.max(ahead, st[j + 5] - now)
  end
  return booked, ahead, avail
end
