-- window.lua: FixedWindow, a counter per aligned window (windows start at multiples of the
-- period since the Unix epoch) for every limit: at most rate permits take effect in each
-- window; two windows' worth can meet at a boundary, the known cost of O(1) state.
-- limiter.lua's header says what it defines.
--
-- Head   "fw <r1> <p1> ...": rate, period_us per limit.
-- State  a string "<L> <c1> ... <cm>\n<meta>": L when the latest grant took or takes effect,
--   µs; ci the permits limit i counted in its window holding L; meta the meta text
--   (internal/protocol). Its TTL lasts to the end of the longest window holding L (or the
--   meta's pause or override, if later). An absent key is empty windows.
-- Rules: an acquire books n at the earliest t >= max(t0, L) at which every limit's window
--   holding t has room for n (a window after L's starts empty); bookings are FIFO, so the
--   state never needs more than the latest window's counts.
-- Cancel of n booked at token (token > now): each limit whose window holding token is the
--   one holding L gives back min(n, ci); a booking in an earlier window is kept (never over
--   the limit). freed is 1 when any limit gave permits back.
-- Remaining: min over limits of rate - count in the window holding now, 0 while a booking
--   waits (L > now) or paused; reset_us: until the windows holding grants have all ended.

local LIMIT_FIELDS = 2 -- a limit's numbers in a head: rate, period_us
local LIMIT_TEXT = '^ ([1-9]%d*) ([1-9]%d*)()' -- a limit's text in a head as Go writes it
local ONE_LIMIT = '^(fw) ([1-9]%d*) ([1-9]%d*)$' -- the usual head, as Go writes it
local TAGS, PARAM_TAG, CAP = ' fw ', '', 1 -- the heads it serves; the one with a parameter; n's bound

local function load(key, head)
  local v = redis.pcall('GET', key)
  if not v then
    return {0, L = 0, key = key, absent = true}
  elseif type(v) == 'table' then -- another type: a meta alone in a list (the log's) is
    -- empty windows
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
  if nl == 1 then -- a meta alone: empty windows
    return {0, L = 0, key = key, absent = true, exists = true, bare = true, meta = meta}
  end
  -- one limit's state (the usual case) is read with one match, any other word by word;
  -- a number tonumber cannot read (gopher-lua past 2^63) is out of range
  local st = {0, L = 0, key = key, exists = true, meta = meta}
  local L, c = string.match(v, '^(%d+) (%d+)\n')
  if L then
    st.L, st[1] = tonumber(L) or -1, tonumber(c) or -1
  else
    local w = {}
    for f in string.gmatch(string.sub(v, 1, nl - 1), '%S+') do
      w[#w + 1] = string.find(f, '^%d+$') and tonumber(f) or -1
    end
    if #w < 2 then
      return nil, false
    end
    st.L = w[1]
    for i = 2, #w do
      if w[i] < 0 or w[i] > MAX_WAIT then
        return nil, false
      end
      st[i - 1] = w[i]
    end
  end
  if st.L < 0 or st.L > MAX_WAIT or st[1] < 0 or st[1] > MAX_WAIT then
    return nil, false
  end
  return st
end

-- setup: limits the state does not hold yet start at 0, those the callers no longer have go.
local function setup(st, lim)
  for i = 2, #lim do
    st[i] = st[i] or 0
  end
  for i = #st, #lim + 1, -1 do
    st[i] = nil
  end
end

-- t - t % P is the start of t's window, floor(t / P) · P, written out (common.lua).

-- fit moves t to the next window of any limit that has no room; a move can fill no
-- window it leaves, so #lim + 1 passes settle it.
local function fit(st, lim, n, t, now)
  local L = st.L
  if L > t then
    t = L
  end
  for _ = 0, #lim do
    local moved = false
    for i = 1, #lim do
      local R, P = lim[i][1], lim[i][2]
      local w = t - t % P
      if (w == L - L % P and st[i] or 0) + n > R then
        t, moved = w + P, true
      end
    end
    if not moved then
      break
    end
  end
  return t
end

local function take(st, lim, n, t, now)
  local L = st.L
  for i = 1, #lim do
    local P = lim[i][2]
    st[i] = (t - t % P == L - L % P and st[i] or 0) + n
  end
  st.L, st.dirty = t, true
end

local function report(st, lim, now)
  local remaining, reset, keep, L = MAX_RATE, 0, 0, st.L
  for i = 1, #lim do
    local R, P = lim[i][1], lim[i][2]
    local lw = L - L % P
    local ends, left = lw + P - now, R - (lw == now - now % P and st[i] or 0)
    if left < remaining then
      remaining = left
    end
    if st[i] > 0 and ends > reset then
      reset = ends
    end
    if ends > keep then
      keep = ends
    end
  end
  if L > now or remaining < 0 then
    remaining = 0
  end
  return remaining, reset, keep
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
  local text = string.format('%d %d', st.L, st[1])
  for i = 2, #st do
    text = text .. string.format(' %d', st[i])
  end
  redis.call('SET', key, text .. '\n' .. (meta or st.meta), 'PX', ms(keep))
end

-- @cold: what follows only the driver's request loop needs (see lua/internal/gen).

local function adjust(st, lim, d, token, now)
  local moved = 0
  for i = 1, #lim do
    local P = lim[i][2] -- (only the window holding L is kept)
    if (st[i] > 0 or d > 0) and token - token % P == st.L - st.L % P then
      st[i], moved = math.max(0, st[i] + d), 1
    end
  end
  st.dirty = st.dirty or moved == 1
  return moved
end

local function give(st, lim, n, token, now)
  return token > now and adjust(st, lim, -n, token, now) or 0
end

-- detail: avail_i is limit i's rate less its count in the window holding now (0 when the
-- latest grant lies in a later window: bookings go there); booked the permits counted in
-- the latest grant's window when that starts after now; ahead_us until the latest grant.
local function detail(st, lim, now)
  local booked, avail = 0, {}
  for i = 1, #lim do
    local R, P = lim[i][1], lim[i][2]
    local lw, nw = math.floor(st.L / P), math.floor(now / P)
    avail[i] = R - (lw == nw and st[i] or 0)
    if lw > nw then
      avail[i], booked = 0, math.max(booked, st[i])
    end
  end
  return booked, math.max(0, st.L - now), avail
end

local function rates(st, new, at)
end
