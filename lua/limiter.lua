-- limiter.lua: the driver every limiter script ends with; the generator puts it after
-- common.lua and the algorithm's file, which defines WIDTH (a limit's ARGV), CAP (the
-- field of a limit that bounds n), PARAMS (how many parameters), RATED (the state counts
-- at the rates in force) and (docs/design.md, "One script per algorithm"; oend: when the
-- override in force ends):
--   load(key, lim, now, param, given, oend) -> st (absent: empty), or nil and JTSTATE text
--   fit(st, lim, n, t, now) -> t'    the earliest time >= t at which n fit every limit
--   take(st, lim, n, t, now)         book n at t
--   give(st, lim, n, token, now) -> freed 0|1   give back n booked at token (Cancel)
--   report(st, lim, now[, oend]) -> remaining, reset_us, keep_us (how long the state matters)
--   detail(st, lim, now) -> booked, ahead_us, avail (per limit)   (Inspect)
--   rates(st, old, new, at, now)     the limits in force change at `at`
--   save(st, key, lim, now, oend, keep)  write the changed state (st.dirty), with its TTL
--                                    keep: report's for the state as it is
-- Each takes the state as an argument; st.dirty says it changed, st.absent that the key
-- was absent, st.err (the JTSTATE text) that a read after load found it foreign (the log
-- reads lazily). lim[i] = {rate, period_us, burst (bucket only)}: the limits in force.
-- Nothing raises an error: a request's failure is a value, so no pcall is needed (nor its
-- cost, nor gopher-lua's way with upvalues after one).
--
-- KEYS[1]  {<prefix><key>}:<sw|sc|tb|fw>  the algorithm's state (its file's header)
-- KEYS[2]  {<prefix><key>}:pause  the control key: a pause and an override (common.lua)
-- KEYS[3]  {<prefix><key>}:conf   the record: the algorithm and limits, for the operator
-- KEYS[4 .. 3+A]  the other algorithms' state keys under the tag (read only): a grant
--          that would create KEYS[1] while one of them exists fails with "JTALG <key>"
-- KEYS[4+A ..]    the requests' booking keys, {<prefix><key>}:bk:<task id>, any order
-- ARGV[1]  k, the number of requests, 1..1000
-- ARGV[2 .. 1+5k]  k requests of five integers: op, n, x, y, key
--   op  name      n          x                       y                   key
--   0   acquire   0..cap     max wait µs, < 2^53     late µs, < 2^53     booking's index in KEYS, or 0
--   1   cancel    0..cap     token, or the booking's stamp   0           booking's index in KEYS, or 0
--   2   inspect   1          0                       0                   0
--   3   pause     0          length µs, 1..2^45      0                   0
--   4   resume    0          0                       0                   0
--   5   override  m', 1..m   length µs, 0..2^45      index in ARGV of m' pairs     0
--                            (0: 2^45)               rate (1..10^9), burst (0..10^9, 0: the rate)
--   6   clear     0          0                       0                   0
--   cap: every limit's rate (the bucket: burst); y only with a booking key (late use)
-- then     m, the number of limits (1..16), and m limits of WIDTH integers: rate (1..10^9),
--          period_us (1..2^45)[, burst (1..10^9), burst × period_us <= 2^50]
-- then     PARAMS integers, 0..2^45: the algorithm's parameters (the log's bucket_us)
-- then     A, the number of other algorithms' state keys in KEYS
-- then     the record's text ("1 <sw|sc|tb|fw> <buckets> <limit> ...", internal/keys) and
--          its TTL in ms, 1..2^45/1000 ("" and 0: not due)
-- then     extra arguments that requests point at (an override's pairs)
-- An error in the arguments shared by all (k, the limits, the parameters, A, the record)
-- fails the call: its error reply. Any other error fails its request only.
-- Returns  one flat array: six integers per request, then the extras (common.lua, reply)
--   acquire  granted (0 denied, 1 granted, 2 the task's booking found), remaining,
--            wait_us, reset_us, token, stamp
--   cancel   freed 0|1, 0, 0, reset_us, token of the booking cancelled (booking only), 0
--   inspect  1, remaining, next_us, reset_us, at, len; extra: booked, ahead_us, paused_us,
--            pttl_ms, override_us, then rate, capacity, available per limit
--   control  1, 0, paused_us, override_us, ended, 0   (pause, resume, override, clear)
--            ended: resume's, the end of the pause it ended, µs, as published on :wake
--            (0: none was in force; the other ops: 0)
--   error    -1, at, len, 0, 0, 0; extra: the error's text, one byte per integer
--   remaining: permits an acquire made now could still get (after this request), 0 while
--   paused; wait_us: granted, until the grant takes effect (0: now); denied, until n would
--   fit (>= 1); token: when a grant takes effect, µs (a plain Cancel passes it back);
--   next_us: the wait of an acquire of 1 now; stamp: see Bookings.
-- Requests are decided in order at one instant, each as a call of its own at that instant
-- would be: a pause or an override earlier in a call applies to the requests after it.
-- An acquire of n = 0 is granted at once and takes nothing.
-- Pause: nothing is booked before its end (an acquire's t0); a longer pause set is kept;
-- it publishes "p <pause_end_us>" (the end in force) on {<prefix><key>}:wake.
-- Resume ends the pause and publishes "r <pause_end_us>" there.
-- Override: until it ends, limit i (i <= m') runs at the rate and burst given (periods stay
-- the callers'); an acquire above what it can ever grant fails with JTEXCEEDS.
-- Bookings (acquire with a booking key): a task's booking survives the task handed back to
--   its queue. The record "token n stamp" (common.lua) is found again by the task's next
--   acquire of the same n when its token is at most y µs past and no pause lies after it:
--   granted 2, wait_us until token, and a new stamp (above the last; the server time).
--   Otherwise the acquire books anew (a grant booked ahead is recorded; one taking effect
--   now deletes a record it did not use). A record found that an override set after its
--   stamp overtakes, lowering a rate or a burst below the callers', is re-placed: its
--   permits are given back at its token, and the acquire books anew, with a stamp above the
--   override's set time (denied, the record is deleted). A cancel with a booking key gives
--   the booking back only when x is its stamp (the caller still holds it) and n its n, and
--   deletes it; so a stale give-back does nothing.
-- Writes   after every read and check, once per call: the state (save; its file says when
--   and its TTL), the control key (control ops; PX covering what it holds, DEL when
--   nothing), booking records (PX a second past their token), the record when due and a
--   request was decided (PX its TTL; only over nothing or one of ours: a foreign one is left
--   alone). A request that fails writes nothing; nor does a call whose requests all failed.
--   A key of another type or with text that is not ours is foreign: the requests that need
--   it fail with JTSTATE (the control key: every request; the state: all but pause and
--   resume, and override and clear when the state is not RATED), and it is not written;
--   nor, for the state, are the bookings and the record.

local ARGV, KEYS = ARGV, KEYS -- (locals cost less to read than globals)
local nargv, nkeys = #ARGV, #KEYS
local k = int(ARGV[1], 1, MAX_REQUESTS)
if not k or nargv < 2 + 5 * k or nkeys < 3 then
  return redis.error_reply('JTARG k')
end
local p = 2 + 5 * k -- the shared arguments
local m = int(ARGV[p], 1, MAX_LIMITS)
if not m then
  return redis.error_reply('JTARG m')
elseif nargv < p + WIDTH * m + PARAMS + 3 then
  return redis.error_reply('JTARG argument count')
end
local given, cap = {}, MAX_RATE -- the callers' limits, and the largest n they allow
for i = 1, m do
  local b = p + WIDTH * (i - 1)
  local rate, period = int(ARGV[b + 1], 1, MAX_RATE), int(ARGV[b + 2], 1, MAX_PERIOD)
  local burst = WIDTH == 3 and int(ARGV[b + 3], 1, MAX_RATE) or nil
  if not rate or not period or (WIDTH == 3 and (not burst or burst * period > MAX_TICKS)) then
    return redis.error_reply('JTARG limit ' .. i)
  end
  given[i] = {rate, period, burst}
  cap = math.min(cap, given[i][CAP])
end
p = p + WIDTH * m + 1
local param = PARAMS > 0 and int(ARGV[p], 0, MAX_PERIOD)
if param == nil then
  return redis.error_reply('JTARG parameter')
end
p = p + PARAMS
local A, record, record_ttl = int(ARGV[p], 0, nkeys - 3), ARGV[p + 1], int(ARGV[p + 2], 0, MAX_PERIOD / 1000)
if not A then
  return redis.error_reply('JTARG A')
elseif not record_ttl or (record_ttl == 0) ~= (record == '') then -- (its text: below)
  return redis.error_reply('JTARG record')
end
local extra = p + 3 -- the first extra argument

-- The fast path: a call whose every request is a plain acquire (op 0, no booking key, y
-- 0, each field "0" as such) with no record due and no control key (no pause, no
-- override) is decided here, request by request as the loop below decides an acquire,
-- by the same algorithm functions, without the loop's bookkeeping; the generator puts
-- the functions it does not use after it ("@cold"), so such a call never makes them
-- (bench/cmd/luaexec measures what it saves). Anything else goes on below, nothing
-- written: another request, a control key, a request the loop fails or grants n = 0, a
-- state that needs more (absent while another algorithm's key exists, or found foreign).
local fast = record_ttl == 0
for j = 2, fast and 5 * k - 3 or 0, 5 do -- request r's op, n, x, y, key: ARGV[5r-3 .. 5r+1]
  if ARGV[j] ~= '0' or ARGV[j + 3] ~= '0' or ARGV[j + 4] ~= '0' then
    fast = false
    break
  end
end
if fast and not redis.pcall('GET', KEYS[2]) then
  local st = load(KEYS[1], given, now, param, given, 0)
  if st and st.absent and A > 0 and redis.call('EXISTS', unpack(KEYS, 4, 3 + A)) > 0 then
    st = nil -- creating the state beside another algorithm's: the loop's JTALG
  end
  local out, remaining, reset, keep = k == 1 and {0, 0, 0, 0, 0, 0} or {}, nil, nil, nil
  local nt, xt, n, x -- the texts of n and x, and their numbers: a batch's repeat
  for r = 1, st and k or 0 do
    local j = 5 * r - 3
    if ARGV[j + 1] ~= nt or ARGV[j + 2] ~= xt then
      nt, xt = ARGV[j + 1], ARGV[j + 2]
      n, x = int(nt, 1, cap), int(xt, 0, MAX_WAIT)
      if not n or not x then
        st = nil
        break
      end
    end
    local t = fit(st, given, n, now, now)
    local granted = t - now <= x and t - now <= (st.horizon or MAX_WAIT)
    if granted then
      take(st, given, n, t, now)
      remaining = nil
    end
    if not remaining then
      remaining, reset, keep = report(st, given, now)
    end
    local b = 6 * r - 6
    out[b + 1], out[b + 2], out[b + 3], out[b + 4], out[b + 5], out[b + 6] =
      granted and 1 or 0, remaining, t - now, reset, granted and t or 0, 0
  end
  if st and not st.err then
    if st.dirty then
      save(st, KEYS[1], given, now, 0, keep) -- keep: report's after the last request
    end
    return out
  end
end

-- @cold: the request loop, for every call the fast path did not decide.

-- is_record reports whether v is a record's text: "1 <sw|sc|tb|fw> <buckets> <limit> ..."
-- (internal/keys writes and reads it; a stored text that is not one is foreign).
local function is_record(v)
  local alg = type(v) == 'string' and string.match(v, '^1 (%l%l) %d+ %S')
  return alg and string.find(' sw sc tb fw ', ' ' .. alg .. ' ', 1, true) ~= nil or false
end
if record_ttl > 0 and not is_record(record) then
  return redis.error_reply('JTARG record')
end

-- Each request's fields, read once: ops[r], ns[r], xs[r], ys[r], ks[r]; ext[r] the text
-- of its error (or Inspect's detail).
local ops, ns, xs, ys, ks, ext = {}, {}, {}, {}, {}, {}
local tag -- "{<prefix><key>}:", once needed
for r = 1, k do
  local j, bad = 5 * r - 3, nil
  local huge = math.huge
  local op, n, x, y, key = int(ARGV[j], 0, huge), int(ARGV[j + 1], 0, huge), int(ARGV[j + 2], 0, huge),
    int(ARGV[j + 3], 0, huge), int(ARGV[j + 4], 0, huge)
  for i = j, op and n and x and y and key and 0 or j + 4 do
    if not int(ARGV[i], 0, huge) then
      bad = 'JTARG request ' .. r .. ': argument ' .. i .. ' is not a plain integer'
    end
  end
  if not bad then
    ops[r], ns[r], xs[r], ys[r], ks[r] = op, n, x, y, key
    if op > OP_CLEAR then
      bad = 'op'
    elseif op <= OP_CANCEL then
      if n > cap then
        bad = CAP == 3 and 'n above burst' or 'n above rate'
      elseif x > MAX_WAIT or y > MAX_WAIT or (y > 0 and (key == 0 or op == OP_CANCEL)) then
        bad = 'x or y'
      elseif key ~= 0 then
        tag = tag or string.match(KEYS[1], '^(.*:)') or ''
        if key < 4 + A or key > nkeys or #KEYS[key] <= #tag + 3
          or string.sub(KEYS[key], 1, #tag + 3) ~= tag .. 'bk:' then
          bad = 'key: not a booking key of this limiter'
        end
      end
    elseif op == OP_OVERRIDE then
      if n < 1 or n > m or x > MAX_PERIOD or key ~= 0 or y < extra or y + 2 * n - 1 > nargv then
        bad = 'override'
      else
        for i = y, y + 2 * n - 1, 2 do
          if not int(ARGV[i], 1, MAX_RATE) or not int(ARGV[i + 1], 0, MAX_RATE) then
            bad = 'override rates'
          end
        end
      end
    elseif n ~= (op == OP_INSPECT and 1 or 0) or y ~= 0 or key ~= 0
      or (op == OP_PAUSE and (x < 1 or x > MAX_PERIOD)) or (op ~= OP_PAUSE and x ~= 0) then
      bad = 'arguments of op ' .. op
    end
    if bad then
      bad = 'JTARG request ' .. r .. ': ' .. bad
    end
  end
  ext[r] = bad
end

local pause, over = control_read(KEYS[2])
if not pause then -- every request needs the control key
  local e = over
  for r = 1, k do
    ext[r] = ext[r] or e
  end
  return reply({}, k, ext)
end

-- in_force returns the limits in force: the callers' (given), with the override's rates
-- until it ends; whether it lowers a rate or a burst below the callers'; when it ends (0:
-- none); the largest n they allow.
local function in_force(over)
  if not over or over[1] <= now then
    return given, false, 0, cap
  end
  local lim, lower, limit = {}, false, cap
  for i = 1, m do
    local l, o = given[i], over[2][i]
    if o then
      local burst = l[3] and math.min(o[2] > 0 and o[2] or o[1], math.floor(MAX_TICKS / l[2]))
      lower = lower or o[1] < l[1] or (burst and burst < l[3])
      l = {o[1], l[2], burst}
      limit = math.min(limit, l[CAP])
    end
    lim[i] = l
  end
  return lim, lower, over[1], limit
end
local lim, lower, oend, limit = in_force(over)

local out, used, wakes = {}, {}, {}
local st, failed -- the state, once a request needed it; the JTSTATE text it failed with
local alg        -- nil until checked: the JTALG text, or false
local books, booked = {}, {} -- booking records by KEYS index (false: none), those to write
local changed, decided = false, false -- a control op ran; a request was decided
-- report's answer while the state has not changed since (take, give and rates change it)
local remaining, reset, keep

for r = 1, k do
  local op, n, x, y, key, b, e = ops[r], ns[r], xs[r], ys[r], ks[r], 6 * r - 6, ext[r]
  repeat -- request r: a break ends it, e the text of its error
    if e then
      break
    end
    if op < OP_PAUSE or (RATED and op >= OP_OVERRIDE) then -- the request needs the state
      if failed then
        e = failed
        break
      end
      used[r] = true
      if not st then
        st, failed = load(KEYS[1], lim, now, param, given, oend)
        if not st then
          e = failed
          break
        end
      end
      -- creating the state: one algorithm per key (the other algorithms' keys read once)
      if st.absent and alg == nil and (op == OP_ACQUIRE or op >= OP_OVERRIDE) then
        alg = false
        for i = 4, 3 + A do
          if redis.call('EXISTS', KEYS[i]) == 1 then
            alg = 'JTALG ' .. KEYS[i]
            break
          end
        end
      end
    end

    if op >= OP_PAUSE then -- control ops
      local ended = 0 -- resume: the end of the pause it ends
      if op == OP_PAUSE then
        pause = math.max(pause, now + x)
        wakes[#wakes + 1] = string.format('p %d', pause)
      elseif op == OP_RESUME then
        if pause > now then
          ended = pause
          wakes[#wakes + 1] = string.format('r %d', ended)
        end
        pause = 0
      else
        if RATED and st.absent and alg then -- the state is settled at the change: it may be created
          e = alg
          break
        end
        if op == OP_OVERRIDE then
          local rates = {}
          for i = 1, n do
            rates[i] = {tonumber(ARGV[y + 2 * i - 2]), tonumber(ARGV[y + 2 * i - 1])}
          end
          over = {now + (x > 0 and x or MAX_PERIOD), rates, now}
        else
          over = nil
        end
        local old = lim
        lim, lower, oend, limit = in_force(over)
        if st then
          rates(st, old, lim, now, now)
          remaining = nil
        end
      end
      changed = true
      out[b + 1], out[b + 2], out[b + 3], out[b + 4], out[b + 5], out[b + 6] =
        1, 0, math.max(0, pause - now), math.max(0, oend - now), ended, 0
      break
    end

    local t0 = math.max(now, pause)
    if op == OP_INSPECT then
      local t = fit(st, lim, 1, t0, now)
      if not remaining then
        remaining, reset, keep = report(st, lim, now, oend)
      end
      local booked_n, ahead, avail = detail(st, lim, now)
      local pttl = -2
      if not st.dirty then
        pttl = redis.call('PTTL', KEYS[1])
      elseif keep > 0 then
        pttl = math.ceil(keep / 1000)
      end
      local d = {booked_n, ahead, math.max(0, pause - now), pttl, math.max(0, oend - now)}
      for i = 1, m do
        d[3 * i + 3], d[3 * i + 4], d[3 * i + 5] = lim[i][1], lim[i][CAP], avail[i]
      end
      ext[r] = d
      out[b + 1], out[b + 2], out[b + 3], out[b + 4] = 1, pause > now and 0 or remaining, t - now, reset
      break
    end

    local rec = false -- the task's booking record
    if key > 0 then
      rec = books[key]
      if rec == nil then
        local why
        rec, why = booking_read(KEYS[key])
        if rec == nil then
          e = why
          break
        end
        books[key] = rec
      end
    end

    if op == OP_CANCEL then
      local token = x
      if key > 0 then -- x is the stamp of the caller's booking
        token = 0
        if rec and rec[2] == n and x > 0 and rec[3] == x then
          token, books[key], booked[#booked + 1] = rec[1], false, key
        end
      end
      local freed = token > 0 and give(st, lim, n, token, now) or 0
      if freed == 1 or not remaining then
        remaining, reset, keep = report(st, lim, now, oend)
      end
      out[b + 1], out[b + 2], out[b + 3], out[b + 4], out[b + 5], out[b + 6] =
        freed, 0, 0, reset, key > 0 and token or 0, 0
      break
    end

    -- acquire
    if n > limit then
      e = 'JTEXCEEDS n above the overridden limits'
      break
    end
    local last, replace = 0, false -- the stamp a new record must be above; re-place rec
    if rec then
      last = rec[3]
      if rec[2] == n and rec[1] >= now - y and pause <= rec[1] then
        replace = lower and over[3] and over[3] > rec[3]
        if not replace then -- found: kept, with a new stamp
          local stamp = math.max(now, last + 1)
          books[key], booked[#booked + 1] = {rec[1], n, stamp}, key
          if not remaining then
            remaining, reset, keep = report(st, lim, now, oend)
          end
          out[b + 1], out[b + 2], out[b + 3], out[b + 4], out[b + 5], out[b + 6] =
            2, pause > now and 0 or remaining, math.max(0, rec[1] - now), reset, rec[1], stamp
          break
        end
      end
    end
    local t, granted = now, true
    if n > 0 then
      if replace and not st.absent then -- an override set since lowers the limits: it goes back
        give(st, lim, n, rec[1], now)
        remaining = nil
      end
      t = fit(st, lim, n, t0, now)
      granted = t - now <= x and t - now <= (st.horizon or MAX_WAIT)
      if granted and st.absent and alg then
        e = alg
        break
      end
      if granted then
        take(st, lim, n, t, now)
        remaining = nil
      end
    end
    local stamp = 0
    if replace then
      last, books[key], booked[#booked + 1] = math.max(last, over[3]), false, key
    end
    if granted and n > 0 and key > 0 then
      if t > now then
        stamp = math.max(now, last + 1)
        books[key], booked[#booked + 1] = {t, n, stamp}, key
      elseif rec then
        books[key], booked[#booked + 1] = false, key
      end
    end
    if not remaining then
      remaining, reset, keep = report(st, lim, now, oend)
    end
    out[b + 1], out[b + 2], out[b + 3], out[b + 4], out[b + 5], out[b + 6] =
      granted and 1 or 0, pause > now and 0 or remaining, t - now, reset,
      granted and n > 0 and t or 0, stamp
  until true
  if st and st.err then
    failed = st.err
  end
  if e then
    ext[r] = e
  elseif ext[r] == nil or type(ext[r]) == 'table' then
    decided = true
  end
end

-- Writes, after every read and check. A state found foreign fails every request that used
-- it; their bookings are not written either.
if failed then
  for r in pairs(used) do
    ext[r] = failed
  end
  decided = false
  for r = 1, k do
    decided = decided or type(ext[r]) ~= 'string'
  end
else
  if st and st.dirty then
    local _, kept = nil, remaining and keep -- report's, unless the state changed since
    if not kept then
      _, _, kept = report(st, lim, now, oend)
    end
    save(st, KEYS[1], lim, now, oend, kept)
  end
  for _, i in ipairs(booked) do
    if books[i] ~= nil then
      booking_write(KEYS[i], books[i])
      books[i] = nil
    end
  end
end
if changed then
  control_write(KEYS[2], pause, over)
end
for _, text in ipairs(wakes) do
  redis.call('PUBLISH', (string.match(KEYS[1], '^(.*:)') or '') .. 'wake', text)
end
if record_ttl > 0 and decided and not failed then
  local v = redis.pcall('GET', KEYS[3])
  if not v or is_record(v) then -- pcall: a refused write (a user without SET) fails no call
    redis.pcall('SET', KEYS[3], record, 'PX', string.format('%d', record_ttl))
  end
end
return reply(out, k, ext)
