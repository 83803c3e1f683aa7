-- tbstate.lua: reading the token bucket's state (gcra.lua's KEYS[1]); lua.go puts it
-- after prelude.lua in front of gcra.lua and inspect_tb.lua.

-- tb_state reads key's state for limits (limits[i] = {rate, period_us, burst}) at now.
-- It returns v (the stored text, nil when the key is absent), L (when the latest
-- grant takes or took effect, µs; 0 without state) and d (d[i]: limit i's TAT minus
-- now, in units of 1/rate µs; 0 when the bucket is full). A value jobthrottle did not
-- write fails the call (JTSTATE), a key of another type too (WRONGTYPE).
local function tb_state(key, limits, now)
  local m = #limits
  -- nums: the stored q1, r1, ..., qm, rm; L: when the latest grant takes effect. One
  -- limit's state (the usual case) is read with one match, anything else field by field.
  local nums, L
  local v = jt_get(key)
  if v then
    local a, b, s, c = string.match(v, '^([0-9a-f]+):([0-9a-f]+):(%-?)([0-9a-f]+)$')
    if a and #a <= 13 and #b <= 13 and #c <= 13 then -- (no table for the usual case)
      local q, r, R = tonumber(a, 16), tonumber(b, 16), limits[1][1]
      L = q - (s == '' and tonumber(c, 16) or -tonumber(c, 16))
      if r >= R then -- the rate went down since this was written: round the TAT up
        q, r = q + 1, 0
      end
      local d = {0}
      if q >= now then d[1] = (q - now) * R + r end
      for i = 2, m do d[i] = 0 end
      return v, L, d
    else
      if not string.find(v, ':', 1, true) then
        error('JTSTATE ' .. key .. ': not a token bucket state')
      end
      nums = {}
      for w in string.gmatch(v, '[^:]+') do
        local sign, h = string.match(w, '^(%-?)([0-9a-f]+)$')
        local x = h and #h <= 14 and tonumber(h, 16)
        if not x or x > 9007199254740992 then
          error('JTSTATE ' .. key .. ': not a number')
        end
        nums[#nums + 1] = sign == '' and x or -x
      end
      if #nums % 2 ~= 1 then
        error('JTSTATE ' .. key .. ': length')
      end
      for i = 1, #nums - 1 do -- only the offset may be negative
        if nums[i] < 0 then error('JTSTATE ' .. key .. ': negative') end
      end
      L = nums[1] - nums[#nums]
    end
  end

  -- d[i]: limit i's TAT minus now, in units of 1/rate µs; 0 when the bucket is full
  local d = {}
  if nums then
    for i = 1, m do
      local R = limits[i][1]
      local q, r = nums[2 * i - 1], nums[2 * i]
      d[i] = 0
      if q and r and r >= 0 then
        if r >= R then -- the rate went down since this was written: round the TAT up
          q, r = q + 1, 0
        end
        if q >= now then
          d[i] = (q - now) * R + r
        end
      end
    end
  else
    L = 0
    for i = 1, m do d[i] = 0 end
  end
  return v, L, d
end

-- tb_text is the state's text for limits, L and d at now (see gcra.lua's KEYS[1]).
local function tb_text(limits, L, d, now)
  local m = #limits
  -- grants keep every TAT at or after L; a cancel of more than was booked can leave
  -- q1 below L, and L must survive that: the offset is then written negative
  local R = limits[1][1]
  local q1 = now + jt_fdiv(d[1], R)
  local off = q1 - L
  off = off >= 0 and string.format('%x', off) or string.format('-%x', -off)
  if m == 1 then
    return string.format('%x:%x:', q1, d[1] - (q1 - now) * R) .. off
  end
  local parts = {}
  for i = 1, m do
    R = limits[i][1]
    local q = now + jt_fdiv(d[i], R)
    parts[i] = string.format('%x:%x:', q, d[i] - (q - now) * R)
  end
  parts[m + 1] = off
  return table.concat(parts)
end

-- In a batch (batch.lua), the state as the last request that wrote it left it:
-- tb_kept is its key (nil: none), tb_v whether it exists, and the next request with the same limits takes it
-- from here instead of reading the text again; the text is made once (tb_pending),
-- when the batch ends or a request with other limits (a cancel while an override
-- holds) reads the key.
local tb_kept, tb_v, tb_lim, tb_L, tb_d, tb_now

local function tb_pending()
  return tb_text(tb_lim, tb_L, tb_d, tb_now)
end

-- tb_save writes key's state: L and d at now for limits (v: the text read, nil when the
-- key was absent), with a TTL at which every bucket is full again. In a batch it is
-- written when the batch ends, as the last request left it.
local function tb_save(key, v, limits, L, d, now)
  if not v then
    jt_one_algorithm() -- this makes the state key: no other algorithm's may be there
  end
  local ttl = 0
  for i = 1, #limits do
    local q = jt_cdiv(d[i], limits[i][1])
    if q > ttl then ttl = q end
  end
  if jt_batching then
    tb_kept, tb_v, tb_lim, tb_L, tb_d, tb_now = key, true, limits, L, d, now
    jt_set(key, tb_pending, ttl)
  else
    jt_set(key, tb_text(limits, L, d, now), ttl)
  end
end

-- tb_report returns what a call made now could still get and the time until every
-- bucket is full again.
local function tb_report(limits, L, d, now, paused)
  local remaining, reset = JT_MAX_RATE, 0
  for i = 1, #limits do
    local l = limits[i]
    local P = l[2]
    remaining = math.min(remaining, jt_fdiv(l[3] * P - d[i], P))
    reset = math.max(reset, jt_cdiv(d[i], l[1]))
  end
  if paused > now or L > now then remaining = 0 end
  return math.max(0, remaining), reset
end
