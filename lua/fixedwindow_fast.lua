-- fixedwindow_fast.lua: the fixed window's usual call, decided before any helper is
-- made (lua.go puts fast.lua and this first in the FixedWindow script): acquires as
-- fast.lua takes them, under one limit within fixedwindow.lua's bounds, no control
-- key (no pause, no override), state absent or in its one-limit form. A single call or
-- a batch whose every request is such an acquire is decided here, a batch's requests
-- in order at one instant: one TIME, one MGET of the state and the control key, at
-- most one SET. Anything else runs on into the full script, which decides it alike
-- (TestFastPathEqualsFullScript); nothing is written before that. This repeats
-- fixedwindow.lua's arithmetic for this one case, on purpose: the full script makes
-- its helper functions on every run, which costs more than all of this.
do
  local A, K, k, o = jf_A, jf_K, jf_k, jf_o
  local floor = math.floor -- exact: every value is an integer below 2^53
  local R, P = jf_l1, jf_l2
  local key, now, v = K[1], jf_now, jf_v
  if v ~= nil and not jf_l3 and R <= 1000000000 and P <= 35184372088832 and jf_nmax <= R then
    local L, c -- when the latest grant takes effect, the permits of its window
    if v then
      local a, b = string.match(v, '^([0-9]+) ([0-9]+)$')
      -- no leading 0 (see fast.lua); neither field is 0 in a state a grant wrote (its
      -- time and count are >= 1), so plain finds do (an unanchored pattern would cost a
      -- match per character)
      if a and #a <= 17 and #b <= 17 and string.byte(v) ~= 48 and not string.find(v, ' 0', 1, true) then
        L, c = a + 0, b + 0
      end
    else
      L, c = 0, 0 -- no state
    end
    if L then
      local out, one, granted = o == 2 and {}, nil, false
      local w = floor(L / P) -- L's window
      for r = 1, k do
        local j = o + 3 * r - 2
        local n, x = A[j + 1] + 0, A[j + 2] + 0
        -- the earliest time at or after the latest grant whose window has room for n
        local tt = now > L and now or L
        local tw = floor(tt / P)
        local held = tw == w and c or 0
        if held + n > R then
          tw, held = tw + 1, 0
          tt = tw * P
        end
        local wait, g = tt - now, 0
        if wait <= x then
          L, w, c, g, granted = tt, tw, held + n, 1, true
        else
          tt = 0
        end
        -- what a call made now could still get; until L's window has ended
        local f = R - (floor(now / P) == w and c or 0)
        if L > now or f < 0 then f = 0 end
        local reset = 0 -- until L's window ends, when it holds permits
        if c > 0 and (w + 1) * P > now then reset = (w + 1) * P - now end
        if out then -- batch.lua's flat reply: five integers per request
          local b = 5 * r
          out[b - 4], out[b - 3], out[b - 2], out[b - 1], out[b] = g, f, wait, reset, tt
        else
          one = {g, f, wait, reset, tt}
        end
      end
      if granted then -- the state as fixedwindow.lua writes it, until L's window ends
        local ttl = (w + 1) * P - now
        redis.call('SET', key, string.format('%d %d', L, c),
          'PX', string.format('%d', -floor(-ttl / 1000))) -- ttl >= 1: L >= now
      end
      return out or one -- a batch's replies, or a single call's
    end
  end
end
