-- multi.lua: the driver of a script's multi form (lua.go: Name.Multi), which runs the
-- calls of several keys in one script call. lua.go makes the script's whole text (its
-- fast path, helpers, body and batch.lua) the function jt_key(KEYS, ARGV) and puts
-- this after it: the parameters shadow the globals, so each call runs the script
-- unchanged on its own KEYS and ARGV, its functions and locals made anew as in a call
-- of its own (and its own TIME).
-- KEYS[1]..  the calls' KEYS, one after the other
-- ARGV[1]    '9' (marks the form, as '4' a batch: lua.MultiForm)
-- ARGV[2]    g (1..1000), the number of calls
-- ARGV[3..2+2g]  each call's number of keys and of arguments (a pair per call, in
--            order); then the calls' ARGV, one after the other
-- Returns    one flat array of integers (no object per call for the client to read):
--            per call, in order, a kind, a length l, then l integers:
--              kind 0  the call's reply, an array of l integers
--              kind 1  the error the call would have returned: its text, one byte
--                      per integer
--              kind 2  the call returned something that is not an array of integers
--                      (l = 0)
--            What a call's reply holds (a batch's flat reply, with its own errors
--            inside) is the script's: the client reads it as that script's reply.
-- Writes     what the calls made one after another would: they run in order, each in
--            a pcall, so one whose script raises an error (a WRONGTYPE key, a Lua
--            error) or returns one (JTARG, JTALG ...) fails alone, what the calls
--            before it wrote stands, as it would had each been a call of its own, and
--            the calls after it run. Writes cannot be undone, so the layout is checked
--            before any call runs: a bad one fails the whole call (JTARG multi) and
--            nothing runs. (Under maxmemory, Redis lets a script write once it has
--            written: a call after one that wrote may write where, as a call of its
--            own, it would have got OOM.)
do
  local function jt_multi()
    local g = ARGV[2]
    if ARGV[1] ~= '9' or type(g) ~= 'string' or not string.find(g, '^[1-9]%d?%d?%d?$') then
      return redis.error_reply('JTARG multi count')
    end
    g = tonumber(g)
    local nk, na = #KEYS, #ARGV
    local first = 2 + 2 * g -- the calls' ARGV start after it
    if g > 1000 or na < first then
      return redis.error_reply('JTARG multi count')
    end
    -- counts are checked by value (tonumber, cheaper than a pattern): what matters is
    -- that they are whole, in range, and add up to KEYS and ARGV exactly
    local counts, sk, sa = {}, 0, first
    for i = 3, first do
      local c = tonumber(ARGV[i])
      if not c or c < 0 or c > 7000 or c % 1 ~= 0 then -- 7000: what unpack takes
        return redis.error_reply('JTARG multi layout')
      end
      counts[i - 2] = c
      if i % 2 == 1 then sk = sk + c else sa = sa + c end
    end
    if sk ~= nk or sa ~= na then
      return redis.error_reply('JTARG multi layout')
    end
    local out, o, ki, ai = {}, 0, 0, first
    local byte = string.byte
    for c = 1, g do
      local ck, ca = counts[2 * c - 1], counts[2 * c]
      -- each call's own KEYS and ARGV, made at their size at once
      local keys, argv = {unpack(KEYS, ki + 1, ki + ck)}, {unpack(ARGV, ai + 1, ai + ca)}
      ki, ai = ki + ck, ai + ca
      local ok, res = pcall(jt_key, keys, argv)
      local text
      if not ok then
        if type(res) == 'table' then
          res = res.err or res.message or 'ERR unknown error'
        end
        text = tostring(res)
      elseif type(res) == 'table' and res.err then
        text = tostring(res.err)
      end
      if text then
        out[o + 1], out[o + 2] = 1, #text
        for i = 1, #text do
          out[o + 2 + i] = byte(text, i)
        end
        o = o + 2 + #text
      else
        -- copied as it is checked: all integers, or kind 2 and nothing copied
        local n, kind = type(res) == 'table' and #res or -1, 0
        for i = 1, n do
          local v = res[i]
          if type(v) ~= 'number' then
            for j = o + 3, o + 1 + i do out[j] = nil end
            kind = 2
            break
          end
          out[o + 2 + i] = v
        end
        if n < 0 then kind = 2 end
        if kind == 2 then n = 0 end
        out[o + 1], out[o + 2] = kind, n
        o = o + 2 + n
      end
    end
    return out
  end

  return jt_multi()
end
