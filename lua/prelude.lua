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

-- jt_now returns the server's time, µs, read once per call: every use in a script
-- sees the same instant.
local jt_now_us
local function jt_now()
  if not jt_now_us then
    local t = redis.call('TIME')
    jt_now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return jt_now_us
end

-- jt_argv is the ARGV a script's body reads: ARGV itself, or, for a request of a
-- batch (batch.lua), that request's arguments laid out as a single call's.
local jt_argv = ARGV

-- jt_int returns ARGV[i] as an integer in [lo, hi], or nil when it is not a plain
-- decimal integer in that range. (tonumber alone would take '1e3', 'inf' or '0x10'
-- on Redis but not on every Lua, so the text is checked first.)
local function jt_int(i, lo, hi)
  local s = jt_argv[i]
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

-- State keys are read and written through jt_get, jt_set and jt_expire. In a single
-- call they are GET, SET … PX and PEXPIRE. In a batch (batch.lua; jt_batching) a key
-- is read once: later requests see the text the earlier ones read or wrote; the writes
-- wait in jt_dirty, and jt_flush makes each once, after the last request, with the
-- last request's value and TTL, which is what the batch's requests made one by one
-- would have left.
-- (batch.lua makes the tables when a batch starts: a single call makes none.)
local jt_batching = false
local jt_cache  -- key -> text read or written in this batch (false: absent)
local jt_dirty  -- keys to write when the batch ends, in order, each once
local jt_queued -- key -> true once in jt_dirty
local jt_ttl    -- key -> the TTL (ms, as text) to write it with
local jt_exp    -- key -> a TTL (ms, as text) to set with PEXPIRE when the batch ends

-- jt_ms is a TTL of us microseconds as whole milliseconds (rounded up, at least 1),
-- as text. (Numbers given to redis.call are sent as text made by a slow
-- printf("%.17g"); format them.)
local function jt_ms(us)
  return string.format('%d', math.max(1, jt_cdiv(us, 1000)))
end

-- jt_get returns the string at key, or false when there is none.
local function jt_get(key)
  if not jt_batching then
    return redis.call('GET', key)
  end
  local v = jt_cache[key]
  if v == nil then
    v = redis.call('GET', key)
    jt_cache[key] = v
  elseif type(v) == 'function' then -- the text of state kept decoded (see jt_set)
    v = v()
    jt_cache[key] = v
  end
  return v
end

-- jt_set sets key to text with a TTL of ttl_us microseconds (see jt_ms). In a batch
-- text may be a function that returns the text: a script that keeps its state decoded
-- between requests makes the text only when the batch ends or jt_get needs it.
local function jt_set(key, text, ttl_us)
  if not jt_batching then
    redis.call('SET', key, text, 'PX', jt_ms(ttl_us))
    return
  end
  if not jt_queued[key] then jt_dirty[#jt_dirty + 1], jt_queued[key] = key, true end
  jt_cache[key], jt_ttl[key], jt_exp[key] = text, jt_ms(ttl_us), nil
end

-- jt_expire sets a TTL of us microseconds on key (see jt_ms).
local function jt_expire(key, us)
  if not jt_batching then
    redis.call('PEXPIRE', key, jt_ms(us))
    return
  end
  if not jt_queued[key] then jt_dirty[#jt_dirty + 1], jt_queued[key] = key, true end
  jt_exp[key] = jt_ms(us)
end

-- The control key, {<prefix><key>}:pause, is one short string every limiter script
-- reads with one GET (nothing more when it is absent, the usual case):
--   "<pause_end>"                                   a pause only
--   "<pause_end> <override_end> <m> <r1> <b1> ... <rm> <bm> <set>"
-- pause_end: when a pause ends, µs (0: none). override_end: until when (µs) the
-- operator's rates override those the callers pass for limits 1..m, in order (bi is
-- limit i's burst, 0 for its rate; periods stay the callers'). set: when the override
-- was set, server µs (jt_claim re-places bookings recorded before it); a key written
-- before set was added ends at bm and reads as an override with no set time. Anything
-- else in the key reads as no pause and no override. Scripts cache what they read
-- (jt_control).
local jt_ctl_key, jt_ctl_pause, jt_ctl_over

-- jt_control returns the pause's end (µs, or 0) and the override in key ({end,
-- {{r1, b1}, ...}, set}, set nil when the key has none; or nil), reading the key once
-- per call.
local function jt_control(key)
  if jt_ctl_key == key then
    return jt_ctl_pause, jt_ctl_over
  end
  jt_ctl_key, jt_ctl_pause, jt_ctl_over = key, 0, nil
  local v = redis.call('GET', key)
  if not v then
    return 0, nil
  end
  if not string.find(v, ' ', 1, true) then
    jt_ctl_pause = jt_num(v) or 0
    return jt_ctl_pause, nil
  end
  -- one overridden limit (the usual case) is read with one match
  local p1, e1, r1, b1, sp, s1 = string.match(v, '^(%d+) (%d+) 1 (%d+) (%d+)( ?)(%d*)$')
  if p1 and #p1 <= 16 and #e1 <= 16 and #r1 <= 10 and #b1 <= 10 and #s1 <= 16
    and (sp == '') == (s1 == '') then -- no set time, or ' <set>'
    local r, b = tonumber(r1), tonumber(b1)
    if r < 1 or r > 1000000000 or b > 1000000000 then return 0, nil end
    jt_ctl_pause, jt_ctl_over = tonumber(p1), {tonumber(e1), {{r, b}}, tonumber(s1)}
    return jt_ctl_pause, jt_ctl_over
  end
  local w = {}
  for x in string.gmatch(v, '%S+') do
    w[#w + 1] = jt_num(x)
    if not w[#w] or w[#w] < 0 then return 0, nil end
  end
  local m = w[3]
  if #w < 3 or m < 1 or m > 16 or (#w ~= 3 + 2 * m and #w ~= 4 + 2 * m) then
    return 0, nil
  end
  local over = {w[2], {}, w[4 + 2 * m]}
  for i = 1, m do
    local r, b = w[2 + 2 * i], w[3 + 2 * i]
    if r < 1 or r > 1000000000 or b > 1000000000 then return 0, nil end
    over[2][i] = {r, b}
  end
  jt_ctl_pause, jt_ctl_over = w[1], over
  return jt_ctl_pause, jt_ctl_over
end

-- jt_pause returns when a pause set on this key ends (µs), or 0.
local function jt_pause(key)
  local p = jt_control(key)
  return p
end

-- jt_override applies an operator's override in the control key (see jt_control) to
-- an acquire's limits (limits[i] = {rate, period_us[, burst]}; width 3 has a burst):
-- until it ends, limit i's rate (and burst: the override's, or its rate) is the
-- override's. It returns the limits to enforce and the override's end (0: none), or
-- nil and a JTEXCEEDS error when n is above what the overridden limits can ever grant.
-- Other operations (a cancel) keep the callers' limits and do not read the key here.
-- While an override is in force it notes the callers' limits (jt_ov_given) and
-- whether the override lowers any of them, a rate or a burst (jt_ov_lower), for
-- jt_claim.
local jt_ov_given, jt_ov_lower

local function jt_override(key, limits, op, n)
  if op ~= 0 then
    return limits, 0
  end
  local _, over = jt_control(key)
  if not over or over[1] <= jt_now() then
    return limits, 0
  end
  jt_ov_given, jt_ov_lower = limits, false
  local mine = {} -- the callers' limits stay as they are (a batch reads them again)
  for i = 1, #limits do
    local l, o = limits[i], over[2][i]
    if o then
      l = {l[1], l[2], l[3]}
      mine[i] = l
      l[1] = o[1]
      if l[3] then
        l[3] = o[2] > 0 and o[2] or o[1]
        if l[3] * l[2] > 1125899906842624 then -- 2^50, as gcra.lua requires
          l[3] = math.floor(1125899906842624 / l[2])
        end
        if l[3] < limits[i][3] then jt_ov_lower = true end
      end
      if l[1] < limits[i][1] then jt_ov_lower = true end
      if n > (l[3] or l[1]) then
        return nil, 'JTEXCEEDS n above the overridden limit ' .. i
      end
    else
      mine[i] = l
    end
  end
  return mine, over[1]
end

-- Bookings by task (ops 2 and 3). A task handed back to its queue keeps its place:
-- op 2 books like an acquire and records the grant under KEYS[3]
-- ("{<prefix><key>}:bk:<task id>", a string "token n stamp" whose TTL ends a second
-- after the token), and when the task comes back, op 2 finds that record and answers
-- with it instead of booking again. A record whose token has passed (the task came
-- back late) or that a pause has overtaken is not used: op 2 books anew, at the
-- earliest slot free now, and records that. A task that never comes back leaves a
-- permit that is simply not used, and a record that expires by itself. Op 5 is op 2
-- that books as far ahead as it takes and uses a record whose token passed at most x
-- µs ago (jt_bk_late): the caller starts late on a permit Redis counted at its token,
-- and bounds its own starts.
--
-- The stamp says who holds the booking: op 2 writes a new one each time it books or
-- answers with the record (the server time, above the record's last stamp), and
-- returns it; op 3 names it (x) and cancels only the booking as that caller holds it:
-- when the stamp still matches, it gives the permits at the record's token back and
-- deletes the record; else it does nothing. So a give-back that reaches Redis after
-- the task's copy took the booking over (a server stopped while the task slept on
-- its slot, its task requeued and run elsewhere) cannot cancel a booking in use.
-- A record "token n" (no stamp: an older version wrote it) reads as stamp 0.
--
-- An override that lowers a limit re-places the bookings recorded before it: when op
-- 2 finds a record it would use, but an override in force now lowers a rate or a
-- burst below the callers' (jt_ov_lower) and was set after the record's stamp (the
-- control key's set time; a script runs for more than the microsecond both count in), it gives the record's permits back at its token, as
-- op 3 would with the callers' limits (jt_bk_give: the script does it before it
-- books), and books anew under the overridden limits at the earliest slot free now,
-- recording that with a stamp above the set time (so a retry after a lost reply finds
-- it and uses it). Denied (beyond max_wait), it deletes the record: its permits are
-- given back. The reply is an ordinary booking. An override that lowers nothing
-- (a raise) leaves bookings as they are: the slot free now is after every booking
-- (bookings stay in order), so re-placing would only move them later, and a booking
-- made at lower rates fits higher ones. A booking made before an override since
-- cleared or ended keeps its place too (it fits the callers' limits it was made under).
local jt_bk_op -- 2 or 3 while running a booking op, else nil
local jt_bk_had -- op 2 found a record it could not use (late, paused, other n)
local jt_bk_late = 0 -- op 5: how long past its token a record may still be used, µs
local jt_bk_now -- the call's server time, µs (jt_claim notes it)
local jt_bk_prev = 0 -- op 2: the stamp of the record it found, or 0
local jt_bk_token -- op 3: the token of the record the caller holds, or nil
local jt_bk_give -- op 2: the token of a record an override overtook, to give back, or nil

-- jt_bk_read returns the token, n and stamp of the task's record, or nil.
local function jt_bk_read()
  local v = redis.call('GET', KEYS[3])
  if not v then return nil end
  local a, b, c = string.match(v, '^(%d+) (%d+) (%d+)$')
  if not a then
    a, b = string.match(v, '^(%d+) (%d+)$')
    c = '0'
  end
  return jt_num(a) or false, jt_num(b), jt_num(c) or 0
end

-- jt_bk_write records a booking of n permits at token for the task with a new stamp
-- (now, above the last one), and returns the stamp.
local function jt_bk_write(token, n, now)
  local stamp = math.max(now, jt_bk_prev + 1)
  redis.call('SET', KEYS[3], string.format('%d %d %d', token, n, stamp),
    'PX', jt_ms(math.max(token - now, 0) + 1000000))
  return stamp
end

-- jt_claim notes now and returns the reply and x to go on with. For op 2, when the
-- booking recorded for the task is for n permits, not passed (token >= now; for op 5,
-- token >= now - jt_bk_late) and not inside a pause, the reply is
-- {1, 0, wait_us, 0, token, 0, stamp} (wait_us 0 when passed; the 0 says nothing new
-- was granted; the record gets the new stamp). For op 3, x becomes the record's
-- token when x is its stamp, else 0 (a token that cancels nothing). Otherwise the
-- reply is nil and x unchanged: the script books or cancels as for ops 0 and 1; when
-- a lowering override overtook the record, jt_bk_give is its token: the script first
-- gives its n permits back there with the callers' limits (jt_ov_given), as op 3.

local function jt_claim(n, now, pause_key, x)
  jt_bk_now = now
  if jt_bk_op == 3 then
    local token, k, stamp = jt_bk_read()
    if token and k == n and x > 0 and stamp == x then
      jt_bk_token = token
      return nil, token
    end
    return nil, 0
  end
  if jt_bk_op ~= 2 then return nil, x end
  local token, k, stamp = jt_bk_read()
  if token == nil then return nil, x end
  jt_bk_had, jt_bk_prev = true, stamp
  if not token or k ~= n or token < now - jt_bk_late or jt_pause(pause_key) > token then
    return nil, x
  end
  if jt_ov_lower then
    local _, over = jt_control(pause_key)
    if over[3] and over[3] > stamp then
      jt_bk_give, jt_bk_prev = token, math.max(stamp, over[3])
      return nil, x
    end
  end
  return {1, 0, math.max(token - now, 0), 0, token, 0, jt_bk_write(token, n, now)}, x
end

-- jt_booked finishes a reply {granted, remaining, wait_us, reset_us, token} of the
-- algorithm: for op 2 it records a grant booked ahead (wait > 0) under KEYS[3] and
-- appends 1 (a new grant) or 0 (denied) and the record's stamp (0: none); for op 3
-- it deletes the record if the caller held it and returns
-- {freed, 0, 0, reset_us, token, 0, 0}, token the booking's when the caller held it,
-- else 0; for ops 0 and 1, and for a reply of jt_claim, it returns the reply as it is.
local function jt_booked(r, n)
  if #r == 7 then return r end
  if jt_bk_op == 2 then
    local stamp = 0
    if r[1] == 1 and n > 0 then
      if r[3] > 0 then
        stamp = jt_bk_write(r[5], n, jt_bk_now)
      elseif jt_bk_had then
        redis.call('DEL', KEYS[3])
      end
      r[6] = 1
    else
      if jt_bk_give then -- its permits were given back: so is the booking
        redis.call('DEL', KEYS[3])
      end
      r[6] = 0
    end
    r[7] = stamp
  elseif jt_bk_op == 3 then
    if jt_bk_token then
      redis.call('DEL', KEYS[3])
    end
    r[5], r[6], r[7] = jt_bk_token or 0, 0, 0
  end
  return r
end

-- jt_one_algorithm keeps one algorithm per key: a limiter script calls it, before its
-- first write, when it is about to create its state key. The KEYS after the ones the
-- script uses (KEYS[3..], or KEYS[4..] after a booking op's KEYS[3]) name the other
-- algorithms' state keys of the same hash tag; if one exists it fails the call,
-- writing nothing: "JTALG <that key>". (A call given no such KEYS checks nothing.)
local function jt_one_algorithm()
  for i = (jt_bk_op and 4 or 3), #KEYS do
    if redis.call('EXISTS', KEYS[i]) == 1 then
      error('JTALG ' .. KEYS[i])
    end
  end
end

-- Bounds for limit fields: rates and bursts up to 10^9, periods up to 2^45 µs (about
-- 1.1 years), so rate × period and burst × period stay below 2^53 when it matters.
local JT_MAX_RATE = 1000000000
local JT_MAX_PERIOD = 35184372088832

-- jt_unfit returns what does not fit in the callers' limits (width 3: n <= burst and
-- burst × period <= 2^50, as gcra.lua requires; width 2: n <= rate), or nil. jt_args
-- checks this before any key is read, so that bad arguments get JTARG even when the
-- control key is foreign.
local function jt_unfit(n, limits, width)
  for i = 1, #limits do
    local l = limits[i]
    if width == 3 then
      if l[3] * l[2] > 1125899906842624 then -- 2^50
        return 'burst x period above 2^50'
      end
      if n > l[3] then return 'n above burst' end
    elseif n > l[1] then
      return 'n above rate'
    end
  end
  return nil
end

-- jt_args reads the arguments every limiter script shares:
--   ARGV[1] op  0 acquire, 1 cancel, 2 take for a task, 3 cancel for a task, 5 take
--               for a task, late (see jt_claim and jt_booked: ops 2, 3 and 5 need
--               KEYS[3], the booking key; jt_args returns them as 0, 1 and 0 and notes
--               them in jt_bk_op, op 5 as 2 with jt_bk_late; 4 marks a batch)
--   ARGV[2] n   permits, >= 0
--   ARGV[3] x   acquire: max_wait_us >= 0; cancel: the token the acquire returned;
--               op 3: the stamp op 2 returned (see jt_claim); op 5: late_us >= 0 (its max_wait is 2^53 - 1)
--   ARGV[4] m   number of limits, 1..16
--   ARGV[first ..] m groups of width (2 or 3) integers: rate (1..JT_MAX_RATE),
--               period_us (1..JT_MAX_PERIOD)[, burst (1..JT_MAX_RATE)]
-- It returns op, n, x, limits (limits[i][j]), or nil and what was wrong. Every ARGV
-- must be plain decimal digits: one pattern checks them all at once, so that each is
-- then read with a bare tonumber (the hot path of every script runs through here).
-- In a batch, the limits are read for the first request, and a later one checks only
-- its op, n and x (jt_req): the limits are the same text. The limits returned are
-- read only (jt_override copies what it changes).
local jt_req         -- in a batch, once jt_lim is known: the index of the request's op in ARGV
local jt_lim         -- in a batch: the limits the first request's jt_args read

local function jt_args(first, width)
  local argv = jt_argv
  local a1, a2, a3
  if jt_req and jt_lim then -- a batch's later request: only op, n and x are its own
    a1, a2, a3 = ARGV[jt_req], ARGV[jt_req + 1], ARGV[jt_req + 2]
    if not string.find(a1 .. ',' .. a2 .. ',' .. a3, '^[0-9]+,[0-9]+,[0-9]+$') then
      return nil, 'op, n or x is not a plain decimal integer'
    end
  else
    local nargs = #argv
    if not string.find(table.concat(argv, ','), '^[0-9,]*$') then
      for i = 1, nargs do
        if not string.find(argv[i], '^[0-9]+$') then
          return nil, 'argument ' .. i .. ' is not a plain decimal integer'
        end
      end
    end
    a1, a2, a3 = argv[1], argv[2], argv[3]
  end
  local op, n, x = tonumber(a1), tonumber(a2), tonumber(a3)
  if not op or op > 5 or op == 4 then return nil, 'op' end -- ARGV[1] 4 marks a batch
  if op >= 2 then
    if not KEYS[3] or not string.find(KEYS[3], '}:bk:', 1, true) then -- not another key
      return nil, 'op ' .. op .. ' without a booking key'
    end
    if op == 5 then -- op 2, late
      op = 2
      if x and x <= 9007199254740991 then
        jt_bk_late, x = x, 9007199254740991
      end
    end
    jt_bk_op = op
    op = op - 2 -- the algorithm acquires (2) or cancels (3); jt_booked does the rest
  end
  if not n or n > 1e15 then return nil, 'n' end
  if not x or x > 9007199254740991 then return nil, 'max_wait/token' end -- 2^53 - 1
  if jt_req and jt_lim then
    local bad = jt_unfit(n, jt_lim, #jt_lim[1])
    if bad then return nil, bad end
    return op, n, x, jt_lim
  end
  local nargs, m = #argv, tonumber(argv[4])
  if not m or m < 1 or m > 16 then return nil, 'm' end
  if nargs ~= first - 1 + m * width then return nil, 'argument count' end
  local limits, k = {}, first
  for i = 1, m do
    local l = {}
    for j = 1, width do
      local v = tonumber(argv[k])
      if not v or v < 1 or v > (j == 2 and JT_MAX_PERIOD or JT_MAX_RATE) then
        return nil, 'limit ' .. i .. ' field ' .. j
      end
      l[j] = v
      k = k + 1
    end
    limits[i] = l
  end
  if jt_batching then jt_lim = limits end
  local bad = jt_unfit(n, limits, width)
  if bad then return nil, bad end
  return op, n, x, limits
end

-- jt_limiter reads a limiter script's arguments (jt_args(first, width)) and applies
-- the operator's override in KEYS[2] (jt_override). It returns op, n, x, the limits
-- to enforce, the override's end and, when the limits start at ARGV[6], ARGV[5]
-- (the sliding counter's bucket_us, 1..JT_MAX_PERIOD), or nil and the text of the
-- error reply. Every argument is checked before the control key is read: it may
-- hold a foreign value, and bad arguments are JTARG whatever the keys hold.
local function jt_limiter(first, width)
  local bucket
  if first == 6 then
    bucket = jt_int(5, 1, JT_MAX_PERIOD)
    if not bucket then
      return nil, 'JTARG bucket'
    end
  end
  local op, n, x, limits = jt_args(first, width)
  if not op then
    return nil, 'JTARG ' .. n
  end
  local over
  limits, over = jt_override(KEYS[2], limits, op, n)
  if not limits then
    return nil, over
  end
  return op, n, x, limits, over, bucket
end
