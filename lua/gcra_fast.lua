-- gcra_fast.lua: the token bucket's usual call, decided before any helper is made
-- (lua.go puts fast.lua and this first in the GCRA script): acquires as fast.lua
-- takes them, under one limit within gcra.lua's bounds, no control key (no pause, no
-- override), state absent or in its one-limit form. A single call or a
-- batch (batch.lua's layout) whose every request is such an acquire is decided here,
-- a batch's requests in order at one instant: one TIME, one MGET of the state and the
-- control key, at most one SET. Anything else runs on into the full script, which
-- decides it alike (TestFastPathEqualsFullScript); nothing is written before that.
-- This repeats gcra.lua's arithmetic for this one case, on purpose: the full script
-- makes its helper functions on every run, which costs more than all of this (see
-- bench/RESULTS.md, "Lean scripts").
do
  local A, K, k, o = jf_A, jf_K, jf_k, jf_o
  local floor = math.floor
  -- Every value here is an integer below 2^53, so floor(a / b) is exact as Lua
  -- computes it (no correction as prelude.lua's jt_fdiv makes for any a).
  local R, P, B = jf_l1, jf_l2, jf_l3
  local key, now, v = K[1], jf_now, jf_v
  if v ~= nil and B and R <= 1000000000 and P <= 35184372088832 and B <= 1000000000
    and B * P <= 1125899906842624 and jf_nmax <= B then
    local L, d -- when the latest grant takes effect; the TAT minus now, in 1/R µs
    if v then
      local a, b, sg, c = string.match(v, '^([0-9a-f]+):([0-9a-f]+):(%-?)([0-9a-f]+)$')
      if a and #a <= 13 and #b <= 13 and #c <= 13 then
        local q, rr = tonumber(a, 16), tonumber(b, 16)
        L = sg == '' and q - tonumber(c, 16) or q + tonumber(c, 16)
        if rr >= R then q, rr = q + 1, 0 end -- the rate went down: round the TAT up
        d = q >= now and (q - now) * R + rr or 0
      end
    else
      L, d = 0, 0 -- no state: a full bucket
    end
    if L then
      local out, one, granted, BP, xmax = o == 2 and {}, nil, false, B * P, floor(1125899906842624 / R)
      for r = 1, k do
        local j = o + 3 * r - 2
        local n, x = A[j + 1] + 0, A[j + 2] + 0
        if x > xmax then x = xmax end -- gcra.lua books at most 2^50 / R ahead
        -- the earliest time the bucket holds n permits, at or after the latest grant
        local tt = now - floor(((B - n) * P - d) / R) -- now + ceil((d - (B - n) P) / R)
        if tt < now then tt = now end
        if tt < L then tt = L end
        local wait, g = tt - now, 0
        if wait <= x then
          if wait * R > d then d = wait * R end
          d, L, g, granted = d + n * P, tt, 1, true
        else
          tt = 0
        end
        local f = floor((BP - d) / P) -- what a call made now could still get
        if f > 1000000000 then f = 1000000000 end
        if L > now or f < 0 then f = 0 end
        if out then -- batch.lua's flat reply: five integers per request
          local b = 5 * r
          out[b - 4], out[b - 3], out[b - 2], out[b - 1], out[b] = g, f, wait, -floor(-d / R), tt
        else
          one = {g, f, wait, -floor(-d / R), tt}
        end
      end
      if granted then -- the state as gcra.lua writes it; TTL: until the bucket is full
        local q = floor(d / R)
        local off = now + q - L
        redis.call('SET', key, off >= 0 and string.format('%x:%x:%x', now + q, d - q * R, off)
          or string.format('%x:%x:-%x', now + q, d - q * R, -off),
          'PX', string.format('%d', -floor(-d / (R * 1000))))
      end
      return out or one -- a batch's replies, or a single call's
    end
  end
end
