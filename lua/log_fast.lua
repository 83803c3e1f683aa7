-- log_fast.lua: the permit log's usual call (slidingwindow.lua's and
-- slidingcounter.lua's), decided before any helper is made: acquires as fast.lua
-- takes them, a single call or a batch (batch.lua's layout), under one limit within
-- the script's bounds, no control key (no pause, no override) and no other
-- algorithm's state key, the log's head and last entry plain numbers. A batch's requests are decided in order at one instant
-- in one loop: one TIME, one read of the log's head and last entry, the entries
-- appended and merged in memory, and at the end at most one trim (LTRIM or UNLINK),
-- one LSET of the last entry, one RPUSH of every new entry and one PEXPIRE. The
-- replies and the list and TTL left are those of log.lua's jt_log run request by
-- request (TestFastPathEqualsFullScript, TestLogBatchFastPath). The fast path makes
-- every read of the list the full script would make (and perhaps more); anything
-- unusual (a number that is not one, a list of the wrong length, anything else) sends
-- the call, of which nothing has been written, on into the full script, which decides
-- it. This repeats log.lua's lookups and acquire for this one case, on purpose: the
-- full script makes its 35 helper functions on every run, which costs more than all
-- of this. A single call whose lookups fall in the head makes no function at all.
do
  local K, A, floor = jf_K, jf_A, math.floor -- floor(a / b) is exact: values are below 2^53
  local prec, R, P
  if lf_counter then
    if jf_k and #A[jf_m + 1] <= 16 then prec, R, P = jf_l1, jf_l2, jf_l3 end -- as jt_int
  elseif not jf_l3 then
    prec, R, P = 0, jf_l1, jf_l2
  end
  local key = K[1]
  local head -- the log's first 9 elements: base and 4 entries (log.lua's LOG_HEAD)
  -- One EXISTS of the control key and the other algorithms' state keys (KEYS[3..]): any
  -- of them there leaves the call to the full script (a pause or an override; or, for
  -- a log about to be made, JTALG; with a log already there, the full script decides
  -- it as this would, only slower: two algorithms on one key are not the usual case).
  if jf_k and P and prec <= 35184372088832 and R <= 1000000000 and P <= 35184372088832
    and jf_nmax <= R and redis.call('EXISTS', unpack(K, 2)) == 0 then
    head = redis.pcall('LRANGE', key, '0', '8')
    if head.err then head = nil end
  end
  local len = head and #head
  if len == 9 then -- the last entry, as elements 10 and 11 of head, checked with it
    local last = redis.call('LRANGE', key, '-2', '-1')
    head[10], head[11] = last[1], last[2]
  end
  -- every element plain digits, at most 17, no leading 0 (see fast.lua); after the base
  -- no element is 0 either (every time and count is >= 1), so a plain ',0' is the check
  -- for all of them. Anchored or plain, each find is one pass in C (an unanchored
  -- pattern costs a match per character; a range, 0-9, is cheaper than %d).
  if len and len > 0 then
    local s = table.concat(head, ',')
    if not string.find(s, '^[0-9,]*$') or string.find(s, ',0', 1, true) or string.find(s, '^0%d') then
      len = nil
    else
      for i = 1, #head do
        local e = head[i]
        if #e > 17 or e == '' then len = nil break end
      end
    end
  end
  if len and len > 0 and len % 2 == 0 or len == 1 then
    len = nil -- JTSTATE, or a log of no entries: the full script's
  end
  if len then
    local k, o = jf_k, jf_o
    local t = redis.call('TIME')
    local now = t[1] * 1000000 + t[2]
    -- The log as log.lua sees it, written or not: hE entries in head, off trimmed
    -- since, E entries (nil: unknown), base, the last count Pn and time Tlast. The
    -- list in Redis is the original one until the end: E0 of its entries (nil:
    -- unknown) are original, and after them na entries appended in memory (ap: T, S,
    -- T, S ...); lastS is the original last entry's count once a grant merged into it.
    local hE, off, E, base, Pn, Tlast, empty = 0, 0, 0, 0, 0, nil, len == 0
    local E0, na, ap, lastS, cT, cS = 0, 0, nil, nil, nil, nil
    if len > 0 then
      base = head[1] + 0
      if len < 9 then
        hE = (len - 1) / 2
        E, E0, Tlast, Pn = hE, hE, head[len - 1] + 0, head[len] + 0
      else
        hE, E, E0, Tlast, Pn = 4, nil, nil, head[10] + 0, head[11] + 0
      end
    end
    -- A single call whose lookups all fall in the head (the usual one) is decided
    -- here straight through, making no function (the helpers below capture a dozen
    -- upvalues each, which costs more than this whole decision). It is the loop below
    -- for one request, with its lookups written out: at_or_before(h) in the list as
    -- read (c), lg_first_count_at_least(q) by the head. Anything else (a lookup past
    -- the head) runs on into the loop below, which decides every case: nothing has
    -- been written. Its locals shadow the log's, which the loop starts from.
    if o == 0 then
      local base, Pn, E, Tlast = base, Pn, E, Tlast
      local n, x, h = jf_nmax, A[3] + 0, now - P
      local T1 = E ~= 0 and head[2] + 0 -- E ~= 0: the head holds entry 1
      local c -- at_or_before(h) in the list as read; false: past the head
      if E == 0 or T1 > h then
        c = 0
      elseif Tlast <= h then
        c = E or false
      else
        c = false
        for j = 1, hE - 1 do
          if head[2 * j + 2] + 0 > h then c = j break end
        end
      end
      local tt, ok = now, true
      if E ~= 0 and Tlast - prec > tt then tt = Tlast - prec end
      local q = Pn + n - R -- this permit must have left the window
      if q > base then
        local e = 1
        while e <= hE and head[2 * e + 1] + 0 < q do e = e + 1 end
        if e > hE then
          ok = false
        elseif head[2 * e] + P > tt then
          tt = head[2 * e] + P
        end
      end
      local wait = tt - now
      local granted = ok and wait <= x
      local inw, cut, unlinked, lastS, rt -- inw: the count S at the window's start
      if granted then
        rt = tt
        if prec > 0 then rt = (floor(tt / prec) + 1) * prec end
        if E ~= 0 and rt < Tlast then rt = Tlast end
        if E == 0 or T1 > h then
          inw = base -- nothing has left the window
        elseif Tlast <= h then -- all of it has: the log starts anew
          unlinked, E, base, Pn, Tlast, inw = true, 0, 0, 0, nil, 0
        elseif not c then
          ok = false
        elseif c >= 2 then -- trimmed: entry c + 1, in the head, is the first left
          base, cut = head[2 * c + 1] + 0, c
          if E then E = E - c end
          inw = base
        else
          inw = head[3] + 0 -- c == 1: entry 2, in the head, took effect after h
        end
        Pn = Pn + n
        if E ~= 0 and rt == Tlast then
          lastS = Pn -- merged into the last entry
        elseif E then
          E = E + 1
        end
        Tlast = rt
      else
        tt = 0
        if c == 0 then
          inw = base
        elseif c and c <= hE then
          inw = head[2 * c + 1] + 0
        end
      end
      local remaining = R -- log.lua's lg_remaining
      if E ~= 0 then
        if Tlast - prec > now then
          remaining = 0
        elseif inw then
          remaining = math.min(R, R - (Pn - inw))
          if remaining < 0 then remaining = 0 end
        else
          ok = false
        end
      end
      if ok then
        local reset = 0
        if E ~= 0 and Tlast + P > now then reset = Tlast + P - now end
        if not granted then
          return {0, remaining, wait, reset, 0}
        end
        if unlinked then
          redis.call('UNLINK', key)
        elseif cut then
          redis.call('LTRIM', key, string.format('%d', 2 * cut), '-1')
        end
        if lastS then
          redis.call('LSET', key, '-1', string.format('%d', lastS))
        elseif unlinked or len == 0 then
          redis.call('RPUSH', key, '0', string.format('%d', rt), string.format('%d', Pn))
        else
          redis.call('RPUSH', key, string.format('%d', rt), string.format('%d', Pn))
        end
        local ttl = Tlast + P - now
        redis.call('PEXPIRE', key, string.format('%d', ttl > 1000 and -floor(-ttl / 1000) or 1))
        return {1, remaining, wait, reset, tt}
      end
    end

    -- leave: something unusual was read; the call goes on to the full script, which
    -- decides it (nothing is written before the loop ends). Once it is set, T and S
    -- answer at once with a harmless number, and the loop stops after the request.
    local leave = false
    local function orig() -- E0, read with LLEN when unknown
      if not E0 then
        local l = redis.call('LLEN', key)
        if l % 2 == 0 then -- JTSTATE: the full script's; lookups stop (T and S)
          leave, E0 = true, 1099511627776
          return E0
        end
        E0 = (l - 1) / 2
      end
      return E0
    end
    local function T(i)
      if leave then return 0 end
      local h = i + off
      if h <= hE then return head[2 * h] + 0 end
      if na > 0 and h > orig() then return ap[2 * (h - E0) - 1] end
      local v = cT and cT[h]
      if not v then
        local s = redis.call('LINDEX', key, 2 * h - 1)
        if type(s) ~= 'string' or #s > 17 or not string.find(s, '^%-?%d+$') then leave = true return 0 end
        v = tonumber(s)
        if not cT then cT = {} end
        cT[h] = v
      end
      return v
    end
    local function S(i)
      if i == 0 or leave then return base end
      local h = i + off
      -- lastS: E0 is known in a batch; a single call reads no S of its last entry after it
      if lastS and h == E0 then return lastS end
      if h <= hE then return head[2 * h + 1] + 0 end
      if na > 0 and h > orig() then return ap[2 * (h - E0)] end
      local v = cS and cS[h]
      if not v then
        local s = redis.call('LINDEX', key, 2 * h)
        if type(s) ~= 'string' or #s > 17 or not string.find(s, '^%-?%d+$') then leave = true return 0 end
        v = tonumber(s)
        if not cS then cS = {} end
        cS[h] = v
      end
      return v
    end
    local function entries()
      if not E then E = orig() - off + na end
      return E
    end
    local function at_or_before(h) -- log.lua's lg_last_at_or_before
      if E == 0 or T(1) > h then return 0 end
      if Tlast <= h then return entries() end
      local j = 1
      while j + off < hE and (not E or j < E) do
        if T(j + 1) > h then return j end
        j = j + 1
      end
      local lo, hi = j, entries()
      while hi - lo > 1 do
        local mid = floor((lo + hi) / 2)
        if T(mid) <= h then lo = mid else hi = mid end
      end
      return lo
    end

    -- log.lua's lg_acquire (no pause) for each request, in order
    local out = o == 2 and {} -- a batch's flat reply; a single call's is r1 .. r5
    local r1, r2, r3, r4, r5
    -- what the writes at the end make of the original list: a grant was made, the
    -- entries trimmed from its front (cut), or all of it dropped (unlinked)
    local granted, cut, unlinked
    local h = now - P -- what took effect at or before h has left the window
    local inw -- the count S at the window's start, once known (it changes only when the log is emptied)
    local mq, mt -- the last lookup: q and when its permit leaves the window
    for r = 1, k do
      local j = o + 3 * r - 2
      local n, x = A[j + 1] + 0, A[j + 2] + 0
      local tt = now
      if E ~= 0 and Tlast - prec > tt then tt = Tlast - prec end
      local q = Pn + n - R -- this permit must have left the window
      if q > base and q ~= mq then -- log.lua's lg_first_count_at_least(q)
        local e = 1
        while e + off <= hE and S(e) < q do e = e + 1 end
        if e + off > hE then
          local lo, hi = e - 1, math.min(entries(), q - base)
          while hi - lo > 1 do
            local mid = floor((lo + hi) / 2)
            if S(mid) >= q then hi = mid else lo = mid end
          end
          e = hi
        end
        mq, mt = q, T(e) + P
      end
      if q > base and mt > tt then tt = mt end
      local wait = tt - now
      local g = wait <= x and 1 or 0
      if g == 1 then
        local rt = tt
        if prec > 0 then rt = (floor(tt / prec) + 1) * prec end
        if E ~= 0 and rt < Tlast then rt = Tlast end
        -- trim what has left the window, once 2 entries have (log.lua's LOG_TRIM);
        -- later grants of the batch, at the same instant, find nothing more to trim
        if not granted and E ~= 0 and T(1) <= h then
          if Tlast <= h then
            unlinked, off, E, E0, na, ap, lastS = true, 0, 0, 0, 0, nil, nil
            head, hE, base, Pn, Tlast, empty, inw, mq = {}, 0, 0, 0, nil, true, nil, nil
          else
            local c = at_or_before(h)
            if c >= 2 then
              base = S(c)
              cut, off = c, off + c
              if E then E = E - c end
            end
          end
        end
        granted = true
        Pn = Pn + n
        if E ~= 0 and rt == Tlast then
          -- a batch's full script reads E here (log.lua: whether its head holds the
          -- last entry), so this does too; a single call's reads no more
          if o == 2 then entries() end
          if na > 0 then ap[2 * na] = Pn else lastS = Pn end
        else
          if not ap then ap = {} end
          na = na + 1
          ap[2 * na - 1], ap[2 * na] = rt, Pn
          if empty then E, empty = 1, false elseif E then E = E + 1 end
        end
        Tlast = rt
      else
        tt = 0
      end
      local remaining = R -- log.lua's lg_remaining
      if E ~= 0 then
        if Tlast - prec > now then
          remaining = 0
        else
          if not inw then inw = S(at_or_before(h)) end
          remaining = math.min(R, R - (Pn - inw))
          if remaining < 0 then remaining = 0 end
        end
      end
      local reset = 0
      if E ~= 0 and Tlast + P > now then reset = Tlast + P - now end
      if leave then break end
      if out then
        local b = 5 * r
        out[b - 4], out[b - 3], out[b - 2], out[b - 1], out[b] = g, remaining, wait, reset, tt
      else
        r1, r2, r3, r4, r5 = g, remaining, wait, reset, tt
      end
    end
    if not leave then
      if granted then -- the writes log.lua's requests would have made, merged
        if unlinked then
          redis.call('UNLINK', key)
        elseif cut then
          redis.call('LTRIM', key, string.format('%d', 2 * cut), '-1')
        end
        if lastS then redis.call('LSET', key, '-1', string.format('%d', lastS)) end
        if na == 1 and not unlinked and len > 0 then
          redis.call('RPUSH', key, string.format('%d', ap[1]), string.format('%d', ap[2]))
        elseif na > 0 then
          local rows, i = {}, 0
          if unlinked or len == 0 then rows[1], i = '0', 1 end -- the base of a new list
          for e = 1, 2 * na do rows[i + e] = string.format('%d', ap[e]) end
          redis.call('RPUSH', key, unpack(rows))
        end
        local ttl = Tlast + P - now
        redis.call('PEXPIRE', key, string.format('%d', ttl > 1000 and -floor(-ttl / 1000) or 1))
      end
      return out or {r1, r2, r3, r4, r5} -- a batch's replies, or a single call's
    end
  end
end
