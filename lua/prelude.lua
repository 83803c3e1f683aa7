-- prelude.lua: helpers every jobthrottle script starts with; lua.go puts this file in
-- front of each script, so a script's own file begins where its header says.
--
-- Numbers: times are integer microseconds of the server clock (TIME), counts are
-- integers. Every value a script computes stays below 2^53, where Lua's doubles are
-- exact; ARGV bounds are checked before the first write, so a bad argument changes
-- nothing. Replies are integers only.
--
-- Errors a script returns start with a code the Go side maps to a sentinel:
--   JTARG   <what>  an argument is missing or out of range (nothing was written)
--   JTSTATE <what>  the key holds data this script did not write (nothing was written)

local function jt_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- jt_int returns ARGV[i] as an integer in [lo, hi], or nil when it is not a plain
-- decimal integer in that range. (tonumber alone would take '1e3', 'inf' or '0x10'
-- on Redis but not on every Lua, so the text is checked first.)
local function jt_int(i, lo, hi)
  local s = ARGV[i]
  if type(s) ~= 'string' or #s > 16 or not string.find(s, '^%-?%d+$') then
    return nil
  end
  local v = tonumber(s)
  if v < lo or v > hi then
    return nil
  end
  return v
end

-- jt_num returns a stored integer, or nil when the text is not one.
local function jt_num(s)
  if type(s) ~= 'string' or #s > 17 or not string.find(s, '^%-?%d+$') then
    return nil
  end
  return tonumber(s)
end

-- jt_fdiv is floor(a / b) for integers a and b > 0, exact whatever the rounding of a / b.
local function jt_fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- jt_cdiv is ceil(a / b) for integers a and b > 0.
local function jt_cdiv(a, b)
  return -jt_fdiv(-a, b)
end

-- jt_pause returns when a pause set on this key ends (µs), or 0.
local function jt_pause(key)
  local v = redis.call('GET', key)
  if v then
    return jt_num(v) or 0
  end
  return 0
end

-- jt_expire sets a TTL of us microseconds, rounded up to whole milliseconds. (Numbers
-- given to redis.call are sent as text made by a slow printf("%.17g"); format them.)
local function jt_expire(key, us)
  redis.call('PEXPIRE', key, string.format('%d', math.max(1, jt_cdiv(us, 1000))))
end

-- jt_args reads the arguments every limiter script shares:
--   ARGV[1] op  0 acquire, 1 cancel
--   ARGV[2] n   permits, >= 0
--   ARGV[3] x   acquire: max_wait_us >= 0; cancel: the token the acquire returned
--   ARGV[4] m   number of limits, 1..16
--   ARGV[first ..] m groups of width integers, each in [1, hi[j]]
-- It returns op, n, x, limits (limits[i][j]), or nil and what was wrong. Every ARGV
-- must be plain decimal digits: one pattern checks them all at once, so that each is
-- then read with a bare tonumber (the hot path of every script runs through here).
local function jt_args(first, hi)
  local nargs = #ARGV
  if not string.find(table.concat(ARGV, ','), '^[0-9,]*$') then
    for i = 1, nargs do
      if not string.find(ARGV[i], '^[0-9]+$') then
        return nil, 'argument ' .. i .. ' is not a plain decimal integer'
      end
    end
  end
  local op, n, x, m = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  if not op or op > 1 then return nil, 'op' end
  if not n or n > 1e15 then return nil, 'n' end
  if not x or x > 9007199254740991 then return nil, 'max_wait/token' end -- 2^53 - 1
  if not m or m < 1 or m > 16 then return nil, 'm' end
  local width = #hi
  if nargs ~= first - 1 + m * width then return nil, 'argument count' end
  local limits, k = {}, first
  for i = 1, m do
    local l = {}
    for j = 1, width do
      local v = tonumber(ARGV[k])
      if not v or v < 1 or v > hi[j] then return nil, 'limit ' .. i .. ' field ' .. j end
      l[j] = v
      k = k + 1
    end
    limits[i] = l
  end
  return op, n, x, limits
end

-- Bounds for limit fields: rates and bursts up to 10^9, periods up to 2^45 µs (about
-- 1.1 years), so rate × period and burst × period stay below 2^53 when it matters.
local JT_MAX_RATE = 1000000000
local JT_MAX_PERIOD = 35184372088832
