-- fwstate.lua: reading the fixed window's state (fixedwindow.lua's KEYS[1]); lua.go
-- puts it after prelude.lua in front of fixedwindow.lua and inspect_fw.lua.

-- fw_state reads key's state for m limits. It returns v (the stored text, nil when
-- the key is absent), L (when the latest grant took or takes effect, µs; 0 without
-- state) and c (c[i]: the permits limit i counted in its window holding L). A value
-- jobthrottle did not write fails the call (JTSTATE), a key of another type too.
local function fw_state(key, m)
  local L, c = 0, {}
  local v = jt_get(key)
  if v then
    -- one limit's state (the usual case) is read with one match, anything else word by word
    local nums
    local a, b = string.match(v, '^([0-9]+) ([0-9]+)$')
    if a and #a <= 17 and #b <= 17 then
      nums = {tonumber(a), tonumber(b)}
    else
      nums = {}
      for w in string.gmatch(v, '%S+') do
        nums[#nums + 1] = jt_num(w) or error('JTSTATE ' .. key .. ': not a number')
      end
      if #nums < 1 then
        error('JTSTATE ' .. key .. ': empty')
      end
    end
    L = nums[1]
    for i = 1, m do
      c[i] = math.max(0, nums[i + 1] or 0)
    end
  else
    for i = 1, m do c[i] = 0 end
  end
  return v, L, c
end

-- fw_text is the state's text: L and the counts c (see fixedwindow.lua's KEYS[1]).
local function fw_text(L, c)
  if #c == 1 then
    return string.format('%d %d', L, c[1])
  end
  local parts = {string.format('%d', L)}
  for i = 1, #c do
    parts[i + 1] = string.format('%d', c[i])
  end
  return table.concat(parts, ' ')
end

-- In a batch (batch.lua), the state as the last request that wrote it left it
-- (fw_kept is its key, nil: none; fw_v whether it exists), for the next request to take from here instead of
-- reading the text again; the text is made once (fw_pending), when the batch ends.
local fw_kept, fw_v, fw_L, fw_c

local function fw_pending()
  return fw_text(fw_L, fw_c)
end

-- fw_counted returns the permits limit i holds in its window containing t (t at or
-- after L's window), for the state v, L, c read or left by fw_state.
local function fw_counted(limits, v, L, c, t, i)
  local P = limits[i][2]
  if v and jt_fdiv(t, P) == jt_fdiv(L, P) then return c[i] end
  return 0
end

-- fw_save writes key's state, L and c, with a TTL at the end of the longest window
-- that holds L. In a batch it is written when the batch ends, as the last request
-- left it.
local function fw_save(key, limits, L, c, now)
  local ttl = 1
  for i = 1, #limits do
    local P = limits[i][2]
    ttl = math.max(ttl, (jt_fdiv(L, P) + 1) * P - now)
  end
  if jt_batching then
    fw_kept, fw_v, fw_L, fw_c = key, true, L, c
    jt_set(key, fw_pending, ttl)
  else
    jt_set(key, fw_text(L, c), ttl)
  end
end

-- fw_report returns what a call made now could still get and the time until every
-- window holding a grant has ended.
local function fw_report(limits, v, L, c, now, paused)
  local remaining, reset = JT_MAX_RATE, 0
  for i = 1, #limits do
    local R, P = limits[i][1], limits[i][2]
    remaining = math.min(remaining, R - fw_counted(limits, v, L, c, now, i))
    if v and c[i] > 0 then
      reset = math.max(reset, (jt_fdiv(L, P) + 1) * P - now)
    end
  end
  if paused > now or L > now then remaining = 0 end
  return math.max(0, remaining), reset
end
