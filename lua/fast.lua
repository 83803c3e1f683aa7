-- fast.lua: the start of every limiter script's fast path (lua.go puts it in front of
-- the algorithm's *_fast.lua, which decides the call or leaves it to the full script).
-- It reads the shape of the call, a single call or a batch (batch.lua's layout), and
-- finds whether every request in it is an acquire the fast path takes: op 0, n >= 1,
-- 0 <= x < 2^53, each plain decimal digits (tonumber alone takes '1e3', ' 5' or
-- '0x10', which are JTARG). If so it reads the state key (a string: the token bucket
-- and the fixed window) and the control key with one MGET, and the clock. Nothing
-- here makes a function or writes.
--   jf_k     the number of requests, or nil: leave the call to the full script
--   jf_o     request r's op, n and x are ARGV[jf_o + 3r - 2 ..] (0 single, 2 batch)
--   jf_m     where the shared rest (m and the limits) starts in ARGV
--   jf_nmax  the largest n of the requests
--   jf_R, jf_P, jf_B  the one limit (m = 1): rate (1..10^9) and period_us (1..2^45),
--            and the field after them (the token bucket's burst; nil: none)
--   jf_v     the state key's text, or false: there is none, and no other algorithm's
--            state key (KEYS[3..]) exists; nil: leave the call to the full script
--            (the control key exists: a pause or an override; or another
--            algorithm's state, or a key of another type, is there)
--   jf_now   the server time (µs), when jf_v is not nil
local jf_A, jf_K = ARGV, KEYS
local jf_k, jf_o, jf_m, jf_nmax, jf_R, jf_P, jf_B, jf_v, jf_now
do
  local A, find = jf_A, string.find
  local nA = #A
  if A[1] == '4' then
    local k = tonumber(A[2])
    if k and #A[2] <= 4 and k >= 1 and k <= 1000 and nA > 2 + 3 * k
      and not find(table.concat(A, ',', 2, 2 + 3 * k), '[^0-9,]') then
      jf_k, jf_o = k, 2
    end
  elseif A[1] == '0' and nA > 3 and find(A[2] .. ',' .. A[3], '^%d+,%d+$') then
    jf_k, jf_o = 1, 0
  end
  if jf_k then
    jf_m, jf_nmax = jf_o + 3 * jf_k + 1, 0
    local l = jf_m
    if A[l] ~= '1' or nA < l + 2 or nA > l + 3
      or not find(table.concat(A, ',', l + 1, nA), '^%d+,%d+,?%d*$') or A[nA] == '' then
      jf_k = nil
    else
      jf_R, jf_P, jf_B = A[l + 1] + 0, A[l + 2] + 0, nA == l + 3 and A[nA] + 0 or nil
      if jf_R < 1 or jf_R > 1000000000 or jf_P < 1 or jf_P > 35184372088832 then jf_k = nil end
    end
  end
  if jf_k then
    for j = jf_o + 1, jf_o + 3 * jf_k - 2, 3 do
      local n, x = A[j + 1], A[j + 2]
      if A[j] ~= '0' or n == '' or x == '' then jf_k = nil break end
      n, x = n + 0, x + 0 -- plain digits (above): arithmetic reads them, cheaper than tonumber
      if n < 1 or x > 9007199254740991 then jf_k = nil break end
      if n > jf_nmax then jf_nmax = n end
    end
  end
  local s = jf_k and redis.call('MGET', jf_K[1], jf_K[2])
  if s and not s[2] then
    jf_v = s[1]
    if not jf_v and redis.call('EXISTS', jf_K[1], unpack(jf_K, 3)) ~= 0 then jf_v = nil end
    if jf_v ~= nil then
      local t = redis.call('TIME')
      jf_now = t[1] * 1000000 + t[2]
    end
  end
end
