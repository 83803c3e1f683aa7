-- window.lua: FixedWindow, a counter per aligned window (windows start at multiples of the
-- period since the Unix epoch) for every limit: at most rate permits take effect in each
-- window; two windows' worth can meet at a boundary, the known cost of O(1) state.
-- limiter.lua's header says what it defines.
--
-- State  KEYS[1], string "<L> <c1> ... <cm>": L when the latest grant took or takes effect,
--   µs; ci the permits limit i counted in its window holding L. Its TTL lasts to the end of
--   the longest window holding L. An absent key is empty windows.
-- Rules: an acquire books n at the earliest t >= max(t0, L) at which every limit's window
--   holding t has room for n (a window after L's starts empty); bookings are FIFO, so the
--   state never needs more than the latest window's counts.
-- Cancel of n booked at token (token > now): each limit whose window holding token is the
--   one holding L gives back min(n, ci); a booking in an earlier window is kept (never over
--   the limit). freed is 1 when any limit gave permits back.
-- Remaining: min over limits of rate - count in the window holding now, 0 while a booking
--   waits (L > now) or paused; reset_us: until the windows holding grants have all ended.

local WIDTH, CAP, PARAMS, RATED = 2, 1, 0, false

local function load(key, lim, now)
  local v, err = read_key('string', 'GET', key)
  if err then
    return nil, err
  end
  local st = {0, L = 0, absent = not v, dirty = false}
  if v then
    -- one limit's state (the usual case) is read with one match, any other word by word;
    -- a number tonumber cannot read (gopher-lua past 2^63) is out of range
    local L, c = string.match(v, '^(%d+) (%d+)$')
    if L then
      st.L, st[1] = tonumber(L) or -1, tonumber(c) or -1
    else
      local w = {}
      for f in string.gmatch(v, '%S+') do
        w[#w + 1] = string.find(f, '^%d+$') and tonumber(f) or -1
      end
      if #w < 1 then
        return nil, 'JTSTATE ' .. key .. ': not a fixed window'
      end
      st.L, st[1] = w[1], w[2] or 0
      for i = 3, #w do
        if w[i] < 0 or w[i] > MAX_WAIT then
          return nil, 'JTSTATE ' .. key .. ': not a fixed window'
        end
        st[i - 1] = i <= #lim + 1 and w[i] or nil
      end
    end
    if st.L < 0 or st.L > MAX_WAIT or st[1] < 0 or st[1] > MAX_WAIT then
      return nil, 'JTSTATE ' .. key .. ': not a fixed window'
    end
  end
  for i = 2, #lim do
    st[i] = st[i] or 0
  end
  return st
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

-- report returns remaining, reset_us and how long the state must be kept (µs; <= 0: not
-- at all): to the end of the longest window holding L.
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

local function save(st, key, lim, now, _, keep)
  if keep <= 0 then
    if not st.absent then
      redis.call('DEL', key)
    end
    return
  end
  local text = string.format('%d %d', st.L, st[1])
  for i = 2, #lim do
    text = text .. string.format(' %d', st[i])
  end
  redis.call('SET', key, text, 'PX', ms(keep))
end

-- @cold: what follows only the driver's request loop needs (see lua/internal/gen).

local function give(st, lim, n, token, now)
  local freed = 0
  if token > now and n > 0 then
    for i = 1, #lim do
      local P = lim[i][2]
      if st[i] > 0 and math.floor(token / P) == math.floor(st.L / P) then
        st[i], freed = math.max(0, st[i] - n), 1
      end
    end
  end
  if freed == 1 then
    st.dirty = true
  end
  return freed
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

local function rates(st, old, new, at, now)
end
