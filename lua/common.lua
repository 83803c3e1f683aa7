-- common.lua: what every jobthrottle script shares; the generator puts it first in each
-- script (lua/gen/*.lua), so the files after it use its locals.
--
-- Numbers: times are integer µs of the server's clock, read once per call (TIME), so
-- every request of a call sees the same instant; counts are integers. Every value a
-- script computes stays below 2^53, where Lua's doubles are exact; so is math.floor(a / b)
-- (and math.ceil) for integers |a| < 2^53 and b >= 1: the quotient's rounding could only
-- reach the next integer if |a| were 2^53 or more. The functions a usual call runs write
-- floor(a / b) out as (a - a % b) / b, and min and max as comparisons: a call of math.*
-- costs several times the arithmetic. An integer argument is plain decimal digits (leading
-- zeros allowed) with its value in range; one tonumber cannot read (gopher-lua: past
-- 2^63) is out of range.
--
-- Errors start with a code the Go side maps to a sentinel:
--   JTARG      an argument is missing or out of range
--   JTSTATE    a key holds what jobthrottle did not write (another type, or text not ours)
--   JTALG      a grant would create the state key while another algorithm's exists
--   JTEXCEEDS  n is above what the overridden limits can ever grant
-- An error of the call (its shared arguments) is the script's error reply; an error of one
-- request is that request's reply (see reply). A request that fails writes nothing.
--
-- Provides:
--   now                         the call's server time, µs
--   MAX_*                       bounds; OP_* the limiter's op codes
--   int(s, lo, hi)              an argument as an integer in [lo, hi], or nil
--   ms(us)                      a TTL of us µs as SET/PEXPIRE text: whole ms, rounded up, >= 1
--   read_key(what, cmd, key, ...)  a read of a key that may be foreign; or nil, the failure
--   control_read(key)           the control key: pause_end, override; or nil, the failure
--   control_write(key, p, o)    writes it back (SET PX, or DEL when nothing lies ahead)
--   booking_read(key)           a task's booking record; or nil, the failure
--   booking_write(key, rec)     writes it back (SET PX, or DEL for false)
--   reply(out, k, ext)          the flat reply: six integers per request, then the extras
-- (control_read and those after it come after the fast path: see "@cold" below)

local MAX_REQUESTS = 1000
local MAX_LIMITS = 16
local MAX_RATE = 1000000000          -- rates, bursts, semaphore max
local MAX_PERIOD = 35184372088832    -- 2^45 µs (about 407 days): periods, pauses, overrides
local MAX_TICKS = 1125899906842624   -- 2^50: burst x period, and how far a bucket books ahead
local MAX_WAIT = 9007199254740991    -- 2^53 - 1: max waits, tokens, stamps
local BOOKING_SLACK = 1000000        -- a booking record outlives its token by this, µs

local OP_ACQUIRE, OP_CANCEL, OP_INSPECT = 0, 1, 2
local OP_PAUSE, OP_RESUME, OP_OVERRIDE, OP_CLEAR = 3, 4, 5, 6

local now
do
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- int remembers the texts it has read, "0" and "1" from the start: a batch's fields
-- repeat, so do the limits in a state's text, and a pattern and tonumber cost more than a
-- table lookup.
local int
do
  local seen = {['0'] = 0, ['1'] = 1}
  function int(s, lo, hi)
    local v = seen[s]
    if v == nil and s then
      v = string.find(s, '^%d+$') and (tonumber(s) or math.huge) or false
      seen[s] = v
    end
    if v and v >= lo and v <= hi then
      return v
    end
    return nil
  end
end

-- ms formats its number itself: redis.call turns a number into text with a slow
-- printf("%.17g").
local function ms(us)
  return string.format('%d', math.max(1, math.ceil(us / 1000)))
end

-- read_key runs a read of a key that may be foreign (cmd on key, with args): it returns
-- the reply; or nil and the failure's text: JTSTATE when the key holds another type than
-- a `what` (WRONGTYPE), else Redis's error as it came (an ACL refusal, say: the key is not
-- to blame, and must not be reported foreign).
local function read_key(what, cmd, key, ...)
  local v = redis.pcall(cmd, key, ...)
  if type(v) == 'table' and v.err then
    if string.find(v.err, 'WRONGTYPE', 1, true) then
      return nil, 'JTSTATE ' .. key .. ': not a ' .. what
    end
    return nil, v.err
  end
  return v
end

-- @cold: what follows only the driver's request loop needs (see lua/internal/gen).

-- The control key, {<prefix><key>}:pause, holds
--   "<pause_end>"  or  "<pause_end> <override_end> <m> <r1> <b1> ... <rm> <bm> [<set>]"
-- pause_end: when a pause ends, µs (0: none). override_end: until when limits 1..m run at
-- the rates ri (and a token bucket at the bursts bi; 0: the rate) in place of the callers';
-- periods stay the callers'. set: when the override was set, µs (bookings recorded before
-- it are re-placed; absent in texts of older versions). Every number is a canonical
-- decimal below 2^53, each rate 1..10^9 and burst 0..10^9 (internal/keys reads and writes
-- the same texts); anything else is foreign.
-- control_read returns pause_end and the override {end, {{r1, b1}, ...}, set or nil} or nil;
-- or nil and the failure's text (read_key's, or JTSTATE for a text not ours).
local function control_read(key)
  local v, err = read_key('string', 'GET', key)
  if err then
    return nil, err
  elseif not v then
    return 0, nil
  end
  local w = {}
  for f in string.gmatch(v, '%S+') do
    if #f > 16 or not string.find(f, '^%d+$') or (#f > 1 and string.byte(f) == 48) then
      return nil, 'JTSTATE ' .. key .. ': not a control text'
    end
    w[#w + 1] = tonumber(f)
    if w[#w] > MAX_WAIT then
      return nil, 'JTSTATE ' .. key .. ': not a control text'
    end
  end
  local nw = #w
  if nw == 1 then
    return w[1], nil
  end
  local m = w[3]
  if nw < 5 or m < 1 or m > MAX_LIMITS or (nw ~= 3 + 2 * m and nw ~= 4 + 2 * m) then
    return nil, 'JTSTATE ' .. key .. ': not a control text'
  end
  local rates = {}
  for i = 1, m do
    local r, b = w[2 + 2 * i], w[3 + 2 * i]
    if r < 1 or r > MAX_RATE or b > MAX_RATE then
      return nil, 'JTSTATE ' .. key .. ': not a control text'
    end
    rates[i] = {r, b}
  end
  return w[1], {w[2], rates, w[4 + 2 * m]}
end

-- control_write keeps what still lies ahead of the pause and the override, with PX until
-- the later of their ends.
local function control_write(key, pause, over)
  if over and over[1] <= now then
    over = nil
  end
  if pause <= now then
    pause = 0
  end
  local till = math.max(pause, over and over[1] or 0)
  if till <= now then
    redis.call('DEL', key)
    return
  end
  local text = string.format('%d', pause)
  if over then
    local parts = {text, string.format('%d %d', over[1], #over[2])}
    for i, o in ipairs(over[2]) do
      parts[i + 2] = string.format('%d %d', o[1], o[2])
    end
    if over[3] then
      parts[#parts + 1] = string.format('%d', over[3])
    end
    text = table.concat(parts, ' ')
  end
  redis.call('SET', key, text, 'PX', ms(till - now))
end

-- A task's booking record, {<prefix><key>}:bk:<task id>, is "<token> <n> <stamp>" (or
-- "<token> <n>" from older versions: stamp 0): n permits booked at token, held by the
-- caller that got stamp. booking_read returns {token, n, stamp}, false when the key is
-- absent, or nil and the failure's text (read_key's, or JTSTATE for a text not ours).
local function booking_read(key)
  local v, err = read_key('string', 'GET', key)
  if err then
    return nil, err
  elseif not v then
    return false
  end
  local a, b, c = string.match(v, '^(%d+) (%d+) (%d+)$')
  if not a then
    a, b = string.match(v, '^(%d+) (%d+)$')
    c = '0'
  end
  if not a or #a > 16 or #b > 16 or #c > 16 then
    return nil, 'JTSTATE ' .. key .. ': not a booking'
  end
  return {tonumber(a), tonumber(b), tonumber(c)}
end

-- booking_write writes rec with a TTL a second past its token, or deletes the key (false).
local function booking_write(key, rec)
  if not rec then
    redis.call('DEL', key)
    return
  end
  redis.call('SET', key, string.format('%d %d %d', rec[1], rec[2], rec[3]),
    'PX', ms(math.max(rec[1] - now, 0) + BOOKING_SLACK))
end

-- reply appends each request's extra to out (six integers per request, k requests):
-- ext[r] a string is request r's error, {-1, at, len, 0, 0, 0} with the text one byte per
-- integer; a table is its detail (Inspect), whose at and len go in fields 5 and 6. at is
-- 1-based in the whole reply.
local function reply(out, k, ext)
  local at = 6 * k
  for r = 1, k do
    local e = ext[r]
    if e then
      local b, len = 6 * r - 6, #e
      if type(e) == 'string' then
        out[b + 1], out[b + 2], out[b + 3], out[b + 4], out[b + 5], out[b + 6] = -1, at + 1, len, 0, 0, 0
        for i = 1, len do
          out[at + i] = string.byte(e, i)
        end
      else
        out[b + 5], out[b + 6] = at + 1, len
        for i = 1, len do
          out[at + i] = e[i]
        end
      end
      at = at + len
    end
  end
  return out
end
