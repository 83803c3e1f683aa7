-- fast.lua: the start of every limiter script's fast path (lua.go puts it in front of
-- the algorithm's *_fast.lua, which decides the call or leaves it to the full script).
-- It reads the shape of the call, a single call or a batch (batch.lua's layout), and
-- finds whether every request in it is an acquire the fast path takes: op 0, n >= 1,
-- 0 <= x < 2^53, each plain decimal digits (tonumber alone takes '1e3', ' 5' or
-- '0x10', which are JTARG), under one limit (m = 1) of plain digits. A number with a
-- leading zero goes to the full script: miniredis's Lua reads '010' + 0 as octal (8),
-- Redis's as 10, and the full script reads it with tonumber, 10 in both. Nothing here
-- reads a key; a single call's check is one join and one anchored pattern (an
-- unanchored one costs a match per character) and makes no function.
--   jf_k     the number of requests, or nil: leave the call to the full script
--   jf_o     request r's op, n and x are ARGV[jf_o + 3r - 2 ..] (0 single, 2 batch)
--   jf_m     where the shared rest (m and the limits) starts in ARGV
--   jf_nmax  the largest n of the requests
--   jf_l1, jf_l2, jf_l3  the limit's fields after m, each >= 1 (jf_l3 nil: two):
--            rate, period_us (and burst) for the token bucket and the windows;
--            bucket_us, rate, period_us for the sliding counter
local jf_A, jf_K = ARGV, KEYS
local jf_k, jf_o, jf_m, jf_nmax, jf_l1, jf_l2, jf_l3
do
  local A, find = jf_A, string.find
  local nA = #A
  if A[1] == '4' then
    local k = tonumber(A[2])
    if k and #A[2] <= 4 and k >= 1 and k <= 1000 and nA > 2 + 3 * k then
      -- digits and commas (anchored: one pass in C), no leading 0
      local s = ',' .. table.concat(A, ',', 2, 2 + 3 * k)
      if find(s, '^[0-9,]*$') and not find(s, ',0%d') then
        jf_k, jf_o = k, 2
      end
    end
  elseif A[1] == '0' then
    -- a single call: one join and one pattern for all of it, the usual call's whole
    -- check (n and the limit's fields >= 1 have no leading 0 by the pattern; x is
    -- checked for one after). No field holds a comma: the pattern wants nA - 1 of them.
    local s = (nA == 6 or nA == 7) and table.concat(A, ',', 2)
    local x = A[3]
    if s and find(s, nA == 6 and '^[1-9]%d*,%d+,1,[1-9]%d*,[1-9]%d*$'
        or '^[1-9]%d*,%d+,1,[1-9]%d*,[1-9]%d*,[1-9]%d*$') and (#x == 1 or string.byte(x) ~= 48) then
      x = x + 0
      if x <= 9007199254740991 then
        jf_k, jf_o, jf_m, jf_nmax = 1, 0, 4, A[2] + 0
        jf_l1, jf_l2, jf_l3 = A[5] + 0, A[6] + 0, nA == 7 and A[7] + 0 or nil
      end
    end
  end
  if jf_k and jf_o == 2 then
    jf_m, jf_nmax = jf_o + 3 * jf_k + 1, 0
    local l = jf_m
    local s = nA >= l + 2 and ',' .. table.concat(A, ',', l + 1, nA)
    -- as many commas as fields: none holds one
    if A[l] ~= '1' or not s or nA > l + 3
      or not find(s, nA == l + 2 and '^,%d+,%d+$' or '^,%d+,%d+,%d+$') or find(s, ',0%d') then
      jf_k = nil
    else
      jf_l1, jf_l2, jf_l3 = A[l + 1] + 0, A[l + 2] + 0, nA == l + 3 and A[nA] + 0 or nil
      if jf_l1 < 1 or jf_l2 < 1 or jf_l3 == 0 then jf_k = nil end
    end
  end
  if jf_k and jf_o == 2 then
    -- plain digits or '' (above): arithmetic reads them, cheaper than tonumber; a field
    -- holding a comma fails it, and pcall leaves the batch to the full script
    if not pcall(function()
      for j = jf_o + 1, jf_o + 3 * jf_k - 2, 3 do
        local n, x = A[j + 1], A[j + 2]
        if A[j] ~= '0' or n == '' or x == '' then jf_k = nil break end
        n, x = n + 0, x + 0
        if n < 1 or x > 9007199254740991 then jf_k = nil break end
        if n > jf_nmax then jf_nmax = n end
      end
    end) then
      jf_k = nil
    end
  end
end
