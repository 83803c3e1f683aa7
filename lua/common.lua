-- common.lua: what every jobthrottle script shares; the generator puts it first in each
-- script (lua/gen/*.lua), so the files after it use its locals, and writes the protocol's
-- constants (internal/protocol: OP_*, E_*, F_*, MAX_*, WIDTH, HORIZON) as literals.
--
-- Numbers: times are integer µs of the server's clock, read once per call (TIME): every
-- request of a call sees the same instant. Every value stays below 2^53, where doubles are
-- exact, and so do floor(a / b) and ceil(a / b) of such integers. An integer argument is
-- plain decimal digits in range. Where speed matters (bench/cmd/luaexec's lone acquire),
-- floor(a / b) is written (a - a % b) / b, min and max as comparisons, and a number read
-- as text that has no leading zero by coercion (x + 0): tonumber reads the text twice, and
-- gopher-lua (miniredis's Lua) would read a leading zero as octal. On the request loop's
-- path too (luaexec's tenant acquire, lone and in a batch), a loop over a sequence counts
-- (for i = 1, #t) rather than calling ipairs, and a table is made at its size (a table
-- grown key by key is rehashed as it grows). A failed string.match
-- passed straight to a function is wrapped in parentheses: gopher-lua's returns no value,
-- and tonumber() raises. gopher-lua also miscompiles a multiple assignment that sets an
-- upvalue beside a table field: write separate statements.
--
-- Errors: a request that fails gets fail(code, text), code one of internal/protocol's
-- (E_ARG, JTARG; E_STATE, JTSTATE; ...) or 0 for an error Redis gave (an ACL refusal, OOM)
-- with Redis's text. An error in the shared arguments fails the call ("JTARG ..."). A
-- request that fails writes nothing.
--
-- Provides: (the fast paths use only the first two; the rest come after "@cold")
--   now                    the call's server time, µs
--   ms(us)                 a TTL of us µs as PX text: whole ms, rounded up, >= 1
--   int(s, lo, hi)         an argument as an integer in [lo, hi], or nil
--   fail(code, text)       a request's error value
--   read_key(what, cmd, key, ...)  a read of a key that may be foreign; or nil, its failure
--   foreign(key, e, own)   the failure of a state key of another type or content
--   reply(out, k, ext, why)  the flat reply: WIDTH integers per request, then the extras

local now
do
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end

-- (ms formats its number itself: redis.call would write it with printf("%.17g").)
local function ms(us)
  return string.format('%d', us > 1000 and math.ceil(us / 1000) or 1)
end

-- @cold: what follows only the slow paths need (see lua/internal/gen).

-- int reads s, plain decimal digits, as an integer in [lo, hi], or nil.
local function int(s, lo, hi)
  local v = s and string.find(s, '^%d+$') and (tonumber(s) or math.huge)
  return v and v >= lo and v <= hi and v or nil
end

local function fail(code, text)
  return {code = code, text = text}
end

-- read_key runs a read of a key that may be foreign (cmd on key, with args): it returns
-- the reply; or nil and the failure: E_STATE when the key holds another type than a
-- `what` (WRONGTYPE), else Redis's error as it came (an ACL refusal, say: the key is not
-- to blame, and must not be reported foreign).
local function read_key(what, cmd, key, ...)
  local v = redis.pcall(cmd, key, ...)
  if type(v) == 'table' and v.err then
    if string.find(v.err, 'WRONGTYPE', 1, true) then
      return nil, fail(E_STATE, key .. ': not a ' .. what)
    end
    return nil, fail(0, v.err)
  end
  return v
end

-- foreign returns the failure of a state key that the script's own read (its error e,
-- nil when the key held its own type; own: then the tags the script serves) found not to
-- be this algorithm's: Redis's own error when that was not WRONGTYPE; E_ALG when the key
-- holds another algorithm's state, of another type or of its own (the text starts with
-- that state's head tag); else E_STATE.
local function foreign(key, e, own)
  if e and not string.find(e.err, 'WRONGTYPE', 1, true) then
    return fail(0, e.err)
  end
  local meta -- a state of another algorithm's, of another type or of this one's?
  local typ = redis.call('TYPE', key).ok
  if typ == 'list' then
    meta = redis.pcall('LINDEX', key, '0')
  elseif typ == 'string' then
    meta = string.match(redis.call('GET', key), '\n(.*)$')
  end
  local tag = type(meta) == 'string' and string.match(meta, '^(%l%l) ')
  if tag and string.find(' sw sc tb fw ', ' ' .. tag .. ' ', 1, true)
    and not string.find(own or '', ' ' .. tag .. ' ', 1, true) then
    return fail(E_ALG, tag .. ' ' .. key)
  end
  return fail(E_STATE, key .. ': not a jobthrottle state')
end

-- reply appends each request's extra to out (WIDTH integers per request, k requests):
-- ext[r] with a code is request r's error, {-1, code, at, len, 0, 0, 0} with the text one
-- byte per integer; any other table is its detail (inspect), whose at and len go in
-- fields 5 and 6. at is 1-based in the whole reply. why (nil: none) is the error of every
-- request without an extra.
local function reply(out, k, ext, why)
  local at = WIDTH * k
  for r = 1, k do
    local e, b = ext[r] or why, WIDTH * r - WIDTH
    if e then
      local text = e.code and e.text
      local len = text and #text or #e
      if text then
        out[b + 1], out[b + 2], out[b + 3], out[b + 4], out[b + 5], out[b + 6], out[b + 7] =
          -1, e.code, at + 1, len, 0, 0, 0
      else
        out[b + 5], out[b + 6] = at + 1, len
      end
      for i = 1, len do
        out[at + i] = text and string.byte(text, i) or e[i]
      end
      at = at + len
    end
  end
  return out
end
