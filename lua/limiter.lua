-- limiter.lua: the driver every limiter script ends with; the generator puts it after
-- common.lua and the algorithm's file. The protocol it speaks (KEYS, ARGV, requests,
-- replies, codes) is internal/protocol's package doc, described there once; this header
-- says how the driver decides.
--
-- KEYS[1]  the limiter's state: the algorithm's data and the meta (internal/protocol)
-- KEYS[2..]  the requests' own keys: bookings, tenants' states, the fair share's queue
-- ARGV[1]  the group's head; ARGV[2] the tenants' caps' head or ""; ARGV[3..] the requests
-- Returns  WIDTH integers per request, then the extras (common.lua, reply)
-- Writes   after every read and check, once per call: the state with its meta, the
--   tenants' states, the fair share's queue, the bookings; a request that fails writes
--   nothing, and a state found foreign is written by none.
--
-- The algorithm's file defines, each taking its state as an argument (no module-level
-- variable carries state between functions):
--   LIMIT_FIELDS, CAP           a limit's numbers in a head; which of them bounds n
--   TAGS, PARAM_TAG             the head tags it serves; the one with a parameter
--   LIMIT_TEXT, ONE_LIMIT       patterns of a limit's text in a head, of the usual head (parse_head)
--   load(key, head) -> st       st.meta (nil: absent; head itself when equal to it); or nil
--                               and its read's error (common.lua's foreign reads it)
--   setup(st, lim, param, cw, cwend, given, now)   count the state with lim, the limits
--                               in force; cw: those it was counted with, to cwend
--   fit(st, lim, n, t, now) -> t'    the earliest time >= t at which n fit every limit
--   take(st, lim, n, t, now)         book n at t
--   give(st, lim, n, token, now) -> freed 0|1   give back n booked at token (Cancel)
--   report(st, lim, now, oend) -> remaining, reset_us, keep_us (how long the state matters)
--   detail(st, lim, now) -> booked, ahead_us, avail (per limit)   (Inspect)
--   rates(st, old, new, at, now)     the limits in force change at `at`
--   save(st, key, keep, meta)        write the state to live keep µs more (<= 0: delete it),
--                                    meta the new meta (nil: unchanged)
-- st.dirty says the state changed, st.absent that the key was absent (or held a meta
-- alone, st.bare), st.err (a text) that a read after load found it foreign (the log
-- reads lazily). lim[i] = {rate,
-- period_us, burst (bucket only)}: the limits in force. Nothing raises an error: a
-- request's failure is a value, so no pcall is needed.
--
-- Decisions. Requests are decided in order at one instant (now), each as a call of its
-- own at that instant would be: a pause or an override earlier in a call applies to the
-- requests after it. An acquire books n at fit(t0), t0 = now or a pause's end, if that
-- comes within its max wait; else it is denied with the wait until n fits. A task's
-- booking (b) survives the task handed back to its queue: the record "token n stamp" is
-- found again by the task's next acquire of the same n when its token is at most late
-- µs past and no pause lies after it (status 2, a new stamp above the last); a record an
-- override set since overtakes, lowering a rate or a burst, is re-placed (given back, and
-- booked anew); a cancel with b gives the booking back only when its token field is the
-- record's stamp (the caller still holds it).
-- Tenants (t): a tenant's request is granted only when the group's limits and the
--   tenant's caps (c) all have room, booking on both at the same time, and when its fair
--   turn has come. The turn is start-time fair queueing over the group's service
--   (generalized processor sharing, its clock V advancing 1/W per µs while W, the weight
--   of the tenants with requests ahead, is above 0): a request's start tag S is max(V,
--   the tenant's finish tag F) and its finish tag S + cost × slot / weight (slot: the
--   group's first limit's period / rate). It may book while S <= V + horizon / W and the
--   booking takes effect within the horizon (max(HORIZON, 2 slots)); otherwise it is told
--   when asking again can succeed, and with h takes its place: F moves on and the reply
--   carries S as a ticket (a task's record keeps it), which the next ask sends back. The
--   queue (q) holds each tenant whose F is ahead of V, "<weight units> <name>" scored F;
--   the clock lives in the meta's f line.
-- Pause: nothing is booked before its end; a longer pause set is kept; it publishes
--   "p <pause_end>" (the end in force) on {…}:wake. Resume ends it and publishes "r <pause_end>".
-- Override: until it ends, limit i (i <= m') runs at the rate and burst given (periods stay
--   the callers'); an acquire above what it can ever grant fails with E_EXCEEDS.

local ARGV, KEYS = ARGV, KEYS -- (locals cost less to read than globals)
local nargv = #ARGV

-- parse_head reads a head "<tag> [<param>] <limit>... [/<unit> <limit>...]..." of this
-- algorithm's: its limits (each LIMIT_FIELDS numbers in range), its parameter (0 without
-- one), its tag and, when it names a unit, its parts, the limits of each unit in the
-- head's order: {unit, from, to, head} (unit '': the calls', first when there are any;
-- head: the part's own head, its state's meta when it has a key of its own); nil for any
-- other text; and the text read. A head as Go writes it (single spaces, no leading zeros) is read at the cost
-- of a match per limit; any other spacing or zeros are written so first (normal).
local function parse_head(text, normal)
  local tag, r, p, b = string.match(text, ONE_LIMIT)
  if tag and #r < 11 and #p < 15 and (not b or #b < 11) then -- (at the cost of one match)
    r, p, b = r + 0, p + 0, b and b + 0
    if r <= MAX_RATE and p <= MAX_PERIOD and (not b or b <= MAX_RATE and b * p <= MAX_TICKS) then
      return {{r, p, b}}, 0, tag, nil, text
    end
  end
  local i
  tag, i = string.match(text, '^(%l%l)()')
  local param, lim, parts, n = 0, {}, nil, #text
  if tag and not string.find(TAGS, tag, 1, true) then
    i = nil
  elseif tag == PARAM_TAG then
    param, i = string.match(text, '^ ([1-9]%d?%d?%d?%d?)()', i)
    param = param and param + 0
  end
  local prefix = i and param and param <= 10000 and string.sub(text, 1, i - 1)
  local from = i -- where the current part's limits start
  while prefix and i <= n do
    local r, p, b, j = string.match(text, LIMIT_TEXT, i) -- (coercion: tonumber reads the text twice)
    if LIMIT_FIELDS == 2 then
      j, b = b, nil
    end
    if r and #r < 11 and #p < 15 and (not b or #b < 11) then
      r, p, b = r + 0, p + 0, b and b + 0
      if r > MAX_RATE or p > MAX_PERIOD or b and (b > MAX_RATE or b * p > MAX_TICKS) then
        prefix = nil
      end
      lim[#lim + 1], i = {r, p, b}, j
    else -- a unit's limits follow: the part before them ends
      local unit
      unit, j = string.match(text, '^ /([%l%d_.%-]+)()', i)
      if not unit or #unit > MAX_UNIT or (parts and parts[#parts].from > #lim) then
        prefix = nil
      else
        parts = parts or {}
        if #lim > 0 and not parts[1] then
          parts[1] = {unit = '', from = 1, to = #lim, head = string.sub(text, 1, i - 1)}
        elseif parts[1] then
          parts[#parts].to, parts[#parts].head = #lim, prefix .. string.sub(text, from, i - 1)
        end
        for _, q in ipairs(parts) do
          if q.unit == unit then
            prefix = nil
          end
        end
        parts[#parts + 1], from, i = {unit = unit, from = #lim + 1}, i, j
      end
    end
  end
  if prefix and #lim > 0 and #lim <= MAX_LIMITS and (not parts or parts[#parts].from <= #lim) then
    if parts then
      parts[#parts].to, parts[#parts].head = #lim, prefix .. string.sub(text, from)
    end
    return lim, param, tag, parts, text
  elseif not normal then -- single spaces, no leading zeros: read again
    text = string.gsub(string.gsub(' ' .. text .. ' ', '%s+', ' '), ' 0+(%d)', ' %1')
    return parse_head(string.sub(text, 2, -2), true)
  end
end

-- The fast path: a call whose every request is a plain acquire "a <n> <wait_us>" (n >= 1),
-- on an absent key or a state whose meta is the callers' head (no pause, override or fair
-- share: nothing but the head; a meta alone is not absent), is decided here, request by
-- request as the loop below decides an acquire, by the same algorithm functions, without
-- the loop's bookkeeping; the generator puts the functions it does not use after it
-- ("@cold"), so such a call never makes them (bench/cmd/luaexec measures what it saves).
-- Anything else goes on below, nothing written.
if nargv >= 3 and nargv <= 2 + MAX_REQUESTS and ARGV[2] == '' then
  local head = ARGV[1]
  local lim, param, _, parts = parse_head(head)
  local st = lim and not parts and load(KEYS[1], head) -- (parts: units other than calls)
  if st and ((st.absent and not st.bare) or st.meta == head) then
    setup(st, lim, param, lim, 0, lim, now)
    local cap = lim[1][CAP]
    for i = 2, #lim do
      if lim[i][CAP] < cap then
        cap = lim[i][CAP]
      end
    end
    -- (out made at one reply's size)
    local k, out, text, n, w = nargv - 2, {false, false, false, false, false, false, false}, nil, nil, nil
    local remaining, reset, keep
    for r = 1, st.err and 0 or k do
      if ARGV[r + 2] ~= text then -- a batch's requests repeat: read each text once
        text = ARGV[r + 2]
        n, w = string.match(text, '^a ([1-9]%d*) (%d+)$')
        -- (coercion, as parse_head; w with a leading zero goes to the loop, which reads it)
        n, w = n and #n < 11 and n + 0, w and #w < 17 and (w == '0' or w >= '1') and w + 0
        if not n or not w or n > cap or w > MAX_WAIT then
          st = nil
          break
        end
      end
      local t = fit(st, lim, n, now, now)
      local granted = t - now <= w and t - now <= (st.horizon or MAX_WAIT)
      if granted then
        take(st, lim, n, t, now)
        remaining = nil
      end
      if not remaining then
        remaining, reset, keep = report(st, lim, now)
      end
      local b = WIDTH * r - WIDTH
      out[b + 1], out[b + 2], out[b + 3], out[b + 4], out[b + 5], out[b + 6], out[b + 7] =
        granted and 1 or 0, remaining, t - now, reset, granted and t or 0, 0, granted and 0 or F_GROUP
    end
    if st and not st.err then
      if st.dirty then
        save(st, KEYS[1], keep, st.absent and head or nil) -- keep: report's after the last request
      end
      return out
    end
  end
end

-- @cold: the request loop, for every call the fast path did not decide.

-- read_head is parse_head with the parts always given: a head of calls alone is one part.
local function read_head(text)
  local lim, param, tag, parts, read = parse_head(text)
  return lim, param, tag, parts or (lim and {{unit = '', from = 1, to = #lim, head = read}})
end

local given, param, tag, gparts = read_head(ARGV[1] or '')
if not given or nargv < 3 or nargv > 2 + MAX_REQUESTS then
  return redis.error_reply('JTARG head or request count')
end
local cparts = {} -- the caps' parts (parse_head's), each with its limits and cap
if ARGV[2] ~= '' then
  local caps, _, ctag, parts = read_head(ARGV[2])
  if not caps or ctag ~= tag then
    return redis.error_reply('JTARG caps head')
  end
  cparts = parts
  for _, p in ipairs(parts) do
    p.lim = {unpack(caps, p.from, p.to)}
  end
end
-- cap_of sets a part's cap: the largest n its limits p.lim allow.
local function cap_of(p)
  p.cap = MAX_RATE
  for i = 1, #p.lim do
    if p.lim[i][CAP] < p.cap then
      p.cap = p.lim[i][CAP]
    end
  end
end
local known = {} -- the units a request's cost may name: the group's and the caps'
for _, p in ipairs(gparts) do
  known[p.unit] = true
end
for _, p in ipairs(cparts) do
  known[p.unit] = true
  cap_of(p)
end
local k = nargv - 2

-- base is "{…}:", the tag of KEYS[1] ("{…}:l"): a key option must name a key of its kind
-- under it (b a booking, q the fair share's queue, c the request's tenant's state, e a
-- settle's record), and a part's key is its unit's, so no request writes a key that is not
-- its own.
local base = string.match(KEYS[1] or '', '^(.*:)l$')

-- score reads a number of the fair share's (a sorted set's score, the clock's V and
-- Fmax): gopher-lua's tonumber reads no mantissa without a point before an exponent
-- ("8e+10", as miniredis gives a large score), so one is put in.
local function score(s)
  return tonumber(s) or tonumber((string.gsub(s or '', '^(%-?%d+)e', '%1.0e')))
end

-- The meta (internal/protocol): the head, then while they matter a pause "p <end>", an
-- override "o <end> <set> <r1> <b1> ...", the fair share's clock "f <V> <W> <tV> <Fmax>",
-- the head another process wrote that this one's replaced "d <at> <head>" (for
-- DRIFT_SHOWN µs) and operators' weights "w <end> <units> <len> <name>". parse_meta
-- returns {head, pause, over = {end, set, {{r, b}, ...}}, fair = {V, W, tV, Fmax}, drift
-- = {at, head}, weights = {[name] = {end, units}}}, or nil for a text not ours.
local DRIFT_SHOWN = 60000000
local function parse_meta(text)
  local nl = string.find(text, '\n', 1, true)
  local m = {head = nl and string.sub(text, 1, nl - 1) or text, pause = 0, weights = {}}
  local i, len = nl and nl + 1, #text
  while i and i <= len do
    local kind = string.sub(text, i, i)
    if kind == 'w' then
      local e, u, n, j = string.match(text, '^w (%d+) (%d+) (%d+) ()', i)
      e, u, n = tonumber(e or ''), tonumber(u or ''), tonumber(n or '')
      if not e or n < 1 or n > MAX_TENANT or j + n - 1 > len then
        return nil
      end
      m.weights[string.sub(text, j, j + n - 1)] = {e, u}
      i = j + n + 1
    else
      local stop = string.find(text, '\n', i, true) or len + 1
      local line = string.sub(text, i, stop - 1)
      if kind == 'p' then
        m.pause = tonumber((string.match(line, '^p (%d+)$')))
      elseif kind == 'o' then -- its numbers after the 'o': rates 1..MAX_RATE, bursts 0..MAX_RATE
        local w = {}
        for f in string.gmatch(string.sub(line, 2), '%S+') do
          w[#w + 1] = int(f, 0, MAX_WAIT) or -1
        end
        local over = {w[1], w[2], {}}
        for r = 3, #w - 1, 2 do
          if w[r] < 1 or w[r] > MAX_RATE or w[r + 1] < 0 or w[r + 1] > MAX_RATE then
            return nil
          end
          over[3][#over[3] + 1] = {w[r], w[r + 1]}
        end
        if #w < 4 or #w % 2 ~= 0 or w[1] < 0 or w[2] < 0 then
          return nil
        end
        m.over = over
      elseif kind == 'f' then
        local V, W, tV, Fmax = string.match(line, '^f (%S+) (%d+) (%d+) (%S+)$')
        V, W, tV, Fmax = score(V), tonumber(W), tonumber(tV), score(Fmax)
        if not V or not Fmax or V ~= V or Fmax ~= Fmax or math.abs(V) == math.huge
          or math.abs(Fmax) == math.huge then -- (x ~= x: NaN)
          return nil
        end
        m.fair = {V = V, W = W, tV = tV, Fmax = Fmax}
      elseif kind == 'd' then
        local at, head = string.match(line, '^d (%d+) (.+)$')
        if not at then
          return nil
        end
        m.drift = {tonumber(at), head}
      else
        return nil
      end
      if (kind == 'p' and not m.pause) then
        return nil
      end
      i = stop + 1
    end
  end
  return m
end

-- format_meta writes m back, leaving out what no longer matters at now.
local function format_meta(m)
  local parts = {m.head}
  if m.pause > now then
    parts[#parts + 1] = string.format('p %d', m.pause)
  end
  local o = m.over
  if o and o[1] > now then
    local line = string.format('o %d %d', o[1], o[2])
    for _, rb in ipairs(o[3]) do
      line = line .. string.format(' %d %d', rb[1], rb[2])
    end
    parts[#parts + 1] = line
  end
  local f = m.fair
  if f and f.W > 0 then
    parts[#parts + 1] = string.format('f %.17g %d %d %.17g', f.V, f.W, f.tV, f.Fmax)
  end
  if m.drift and m.drift[1] > now - DRIFT_SHOWN then
    parts[#parts + 1] = string.format('d %d ', m.drift[1]) .. m.drift[2]
  end
  local names = {} -- in order: the same weights make the same text, whatever pairs' order
  for name, w in pairs(m.weights) do
    if w[1] > now then
      names[#names + 1] = name
    end
  end
  table.sort(names)
  for _, name in ipairs(names) do
    local w = m.weights[name]
    parts[#parts + 1] = string.format('w %d %d %d ', w[1], w[2], #name) .. name
  end
  return table.concat(parts, '\n')
end

-- with returns the limits l at the override's rates (nil: none): limit i (i <= #rates)
-- runs at its rate and burst (0: the rate; the bucket's capped at 2^50 / period),
-- its period kept; and whether a rate or a burst is lower than l's.
local function with(l, rates)
  if not rates then
    return l, false
  end
  local lim, lower = {}, false
  for i = 1, #l do
    local g, o = l[i], rates[i]
    if o then
      local burst = g[3] and math.min(o[2] > 0 and o[2] or o[1], math.floor(MAX_TICKS / g[2]))
      lower = lower or o[1] < g[1] or (burst and burst < g[3])
      g = {o[1], g[2], burst}
    end
    lim[i] = g
  end
  return lim, lower
end

-- in_force returns the limits in force on the callers' limits l under the override over
-- (nil: none): l at its rates until it ends; whether it lowers a rate or a burst; when it
-- ends (0: none).
local function in_force(l, over)
  if over and over[1] > now then
    local lim, lower = with(l, over[3])
    return lim, lower, over[1]
  end
  return l, false, 0
end

-- slice returns a part's share of a list over the head's limits (its limits, an
-- override's rates).
local function slice(l, p)
  return l and {unpack(l, p.from, p.to)}
end

-- Each request's fields, read once into named fields (q.op, q.n, ...), or its failure.
-- Options follow the op's fields as a letter and a value; the tenant's name comes last
-- (t), and may hold any bytes. A cost (u, acquire and cancel: "u<unit>:<n>", settle:
-- "u<unit>:<estimate>:<actual>") goes to q.cost[unit] (and q.actual[unit]); q.ctext is
-- the costs' text as sent, which a task's record keeps.
local function parse_request(text)
  local q = {}
  local t = string.find(text, ' t', 1, true)
  local body = text
  if t then
    q.tenant, body = string.sub(text, t + 2), string.sub(text, 1, t - 1)
    if #q.tenant < 1 or #q.tenant > MAX_TENANT then
      return nil, 'tenant name of ' .. #q.tenant .. ' bytes'
    end
  end
  local w = {}
  for f in string.gmatch(body, '%S+') do
    w[#w + 1] = f
  end
  local op, nf = w[1], 1
  q.op = op
  if op == OP_ACQUIRE or op == OP_CANCEL or op == OP_SETTLE then
    q.n, q.x, nf = int(w[2], 0, MAX_RATE), int(w[3], 0, MAX_WAIT), 3
    if not q.n or not q.x then
      return nil, 'n or its second field'
    end
  elseif op == OP_PAUSE then
    q.x, nf = int(w[2], 1, MAX_PERIOD), 2
    if not q.x then
      return nil, 'pause length'
    end
  elseif op == OP_OVERRIDE then
    q.x, q.rates = int(w[2], 0, MAX_PERIOD), {}
    if not q.x or #w < 4 or #w % 2 ~= 0 or (#w - 2) / 2 > #given then
      return nil, 'override'
    end
    for i = 3, #w, 2 do
      local r, b = int(w[i], 1, MAX_RATE), int(w[i + 1], 0, MAX_RATE)
      if not r or not b then
        return nil, 'override rates'
      end
      q.rates[#q.rates + 1] = {r, b}
    end
    return q
  elseif op == OP_WEIGHT then
    q.x, q.units, nf = int(w[2], 0, MAX_PERIOD), int(w[3], 1, MAX_WEIGHT * 1000000), 3
    if not q.x or not q.units then
      return nil, 'weight'
    end
  elseif op ~= OP_INSPECT and op ~= OP_RESUME and op ~= OP_CLEAR then
    return nil, 'op'
  end
  for i = nf + 1, #w do
    local o, v = string.sub(w[i], 1, 1), string.sub(w[i], 2)
    if o == 'b' or o == 'c' or o == 'q' or o == 'e' then
      q[o] = int(v, 2, #KEYS)
      if not q[o] then
        return nil, 'key index ' .. w[i]
      end
    elseif o == 'u' and (op == OP_ACQUIRE or op == OP_CANCEL or op == OP_SETTLE) then
      local unit, c, a = string.match(v, '^([^:]+):(%d+):?(%d*)$')
      c = int(c, 0, MAX_RATE)
      if op == OP_SETTLE then
        a = int(a, 0, MAX_RATE)
      elseif a ~= '' then
        c = nil
      end
      if not c or not a or not known[unit] or (q.cost and q.cost[unit]) then
        return nil, 'cost ' .. w[i] .. (unit and not known[unit] and ': no limit counts its unit' or '')
      end
      q.cost, q.actual = q.cost or {}, q.actual or {}
      q.cost[unit], q.actual[unit] = c, a
      q.ctext = (q.ctext or '') .. ' ' .. w[i]
    elseif o == 'l' then
      q.late = int(v, 0, MAX_WAIT)
    elseif o == 'w' then
      q.units = int(v, 1, MAX_WEIGHT * 1000000)
    elseif o == 'k' then
      q.ticket = int(v, 0, MAX_WAIT)
      q.ticket = q.ticket and q.ticket / 1000000
    elseif o == 'h' and v == '' then
      q.hold = true
    else
      return nil, 'option ' .. w[i]
    end
    if (o == 'l' and not q.late) or (o == 'w' and not q.units) or (o == 'k' and not q.ticket) then
      return nil, 'option ' .. w[i]
    end
  end
  if (q.tenant and not q.q) or (q.q and not q.tenant and op ~= OP_INSPECT and op ~= OP_PAUSE) or (q.c and not q.tenant) or (q.late and not q.b)
    or ((q.units or q.ticket or q.hold) and op ~= OP_WEIGHT and not q.tenant) or (q.c and not cparts[1])
    or (cparts[1] and q.tenant and not q.c and op ~= OP_WEIGHT) or (op == OP_WEIGHT and not q.tenant)
    or ((op == OP_SETTLE) ~= (q.e ~= nil)) or (op == OP_SETTLE and (q.b or not q.cost)) then
    return nil, 'options'
  end
  local function kind(i, prefix) -- KEYS[i] is a key of that kind, with a name after it
    return #KEYS[i] > #base + #prefix and string.sub(KEYS[i], 1, #base + #prefix) == base .. prefix
  end
  if (q.b or q.q or q.c or q.e) and (not base or (q.b and not kind(q.b, 'bk:')) or (q.e and not kind(q.e, 'st:'))
    or (q.q and KEYS[q.q] ~= base .. 'q') or (q.c and KEYS[q.c] ~= base .. 't:' .. q.tenant)) then
    return nil, 'a key of another kind'
  end
  if q.c then -- the caps of another unit than calls: their keys follow the tenant's state
    local u = 0
    for _, p in ipairs(cparts) do
      if p.unit ~= '' then
        u = u + 1
        if KEYS[q.c + u] ~= base .. 'u:' .. p.unit .. ':' .. q.tenant then
          return nil, 'a key of another kind'
        end
      end
    end
  end
  return q
end

-- A task's record, {…}:bk:<id>: a booking "<token> <n> <stamp>[<costs>]" (n permits, and
-- the costs as its acquire sent them, booked at token, held by the caller that got
-- stamp), or a ticket "t <ticket> <n>[<costs>]" (its tenant's place, in millionths of the
-- fair share's units, held while the task is handed back). booking_read returns {token,
-- n, stamp, costs} or {ticket = S, n = n, ctext = costs}, false when the key is absent,
-- or nil and the failure.
local function booking_read(key)
  local v, err = read_key('string', 'GET', key)
  if err then
    return nil, err
  elseif not v then
    return false
  end
  local function costs_ok(c) -- " u<unit>:<n>", any number of them
    return c and (string.gsub(c, ' u[%l%d_.%-]+:%d+', '')) == ''
  end
  local a, b, c, costs = string.match(v, '^(%d+) (%d+) (%d+)(.*)$')
  if a and costs_ok(costs) and #a <= 16 and #b <= 16 and #c <= 16 then
    return {tonumber(a), tonumber(b), tonumber(c), costs}
  end
  a, b, costs = string.match(v, '^t (%d+) (%d+)(.*)$')
  if a and costs_ok(costs) and #a <= 16 and #b <= 16 then
    return {ticket = tonumber(a) / 1000000, n = tonumber(b), ctext = costs}
  end
  return nil, fail(E_STATE, key .. ': not a booking')
end

-- booking_write writes rec, to live until ttl_us from now, or deletes the key (false).
local function booking_write(key, rec, ttl)
  if not rec then
    redis.call('DEL', key)
  elseif rec.ticket then
    redis.call('SET', key, string.format('t %d %d', math.floor(rec.ticket * 1000000 + 0.5), rec.n) .. rec.ctext,
      'PX', ms(ttl))
  else
    redis.call('SET', key, string.format('%d %d %d', rec[1], rec[2], rec[3]) .. rec[4], 'PX', ms(ttl))
  end
end

local ops, ext = {}, {}
do
  local seen = {}
  for r = 1, k do
    local text = ARGV[r + 2]
    local q, why = seen[text], nil
    if q == nil then
      q, why = parse_request(text)
      seen[text] = q or false
      if why then
        seen[text] = nil
      end
    end
    if q then
      ops[r] = q
    else
      ext[r] = fail(E_ARG, 'JTARG ' .. (why or 'request'))
    end
  end
end

-- The group's state, read once; its meta.
local gst, gfail = load(KEYS[1], ARGV[1])
local meta, drift
if not gst then
  gfail = foreign(KEYS[1], gfail or nil, TAGS)
else
  if not gst.meta then
    meta = {head = ARGV[1], pause = 0, weights = {}}
  else
    meta = parse_meta(gst.meta)
    local stored = meta and string.match(meta.head, '^(%S+)')
    if not meta or not string.find(' sw sc tb fw ', ' ' .. (stored or '?') .. ' ', 1, true) then
      gst, gfail = nil, fail(E_STATE, KEYS[1] .. ': not a jobthrottle meta')
    elseif gst.bare then -- a meta alone is any algorithm's: its head is the callers'
      meta.head = ARGV[1]
    elseif stored ~= tag then
      gst, gfail = nil, fail(E_ALG, stored .. ' ' .. KEYS[1])
    else
      drift = meta.head ~= ARGV[1]
      gst.found = drift and meta.head -- another process's head, as found: the d line, the reply's end
    end
  end
end
if not gst then -- every request needs the group's state
  for r = 1, k do
    ext[r] = ext[r] or gfail
  end
  return reply({}, k, ext)
end

-- part_state reads the state of a part with a key of its own (another unit's of the group,
-- a tenant's caps): absent, or a state whose meta is a head of this algorithm's; it is
-- counted with plim, the limits in force (pgiven the callers'), from the limits its head
-- has for the unit at the override's rates (the part's, nil: none) to cwend, and gets the
-- callers' head (p.head) when it is written if it had another.
local function part_state(key, p, plim, pgiven, rates, cwend)
  local st, why = load(key, p.head)
  if not st then
    return nil, foreign(key, why or nil, TAGS)
  end
  local cw = plim
  if st.meta == p.head then
    cw = with(pgiven, rates)
  elseif st.meta then -- another head, or a meta alone: it must be ours
    local l, _, t, ps = read_head(string.match(st.meta, '^[^\n]*'))
    if not l or t ~= tag then
      return nil, fail(E_STATE, key .. ': not a state of this limiter')
    end
    st.rehead = true
    for _, sp in ipairs(ps) do
      if sp.unit == p.unit then
        cw = with(slice(l, sp), rates)
      end
    end
  end
  setup(st, plim, param, cw, cwend, pgiven, now)
  return st
end

-- The group's parts: the limits of each unit and their state, the calls' in KEYS[1]
-- beside the meta (which, with no limit of calls, holds the meta alone), another unit's
-- in the next of KEYS, "{…}:u:<unit>", whose meta is its part's head. Each part's lim and
-- given are its share of the limits in force and of the callers', cap the largest n they
-- allow; lim (all the head's limits in force), lower and oend are in_force's.
local lim, lower, oend = in_force(given, meta.over)
local G = {}
do
  local rates, cwend, u = meta.over and meta.over[3], meta.over and meta.over[1] or 0, 1
  for j, p in ipairs(gparts) do
    local part = {unit = p.unit, from = p.from, to = p.to, head = p.head, lim = slice(lim, p), given = slice(given, p)}
    cap_of(part)
    local prates = slice(rates, p)
    if p.unit == '' then -- counted with the stored head's limits of calls
      local cw = with(part.given, prates)
      if drift then
        local l, _, _, ps = read_head(meta.head)
        for _, sp in ipairs(ps or {}) do
          if sp.unit == '' then
            cw = with(slice(l, sp), prates)
          end
        end
      end
      setup(gst, part.lim, param, cw, cwend, part.given, now)
      part.st = gst
    else
      u = u + 1
      part.key = KEYS[u]
      if part.key ~= base .. 'u:' .. p.unit then
        return redis.error_reply('JTARG the keys of the head\'s units')
      end
      local why
      part.st, why = part_state(part.key, part, part.lim, part.given, prates, cwend)
      if not part.st then
        for r = 1, k do
          ext[r] = ext[r] or why
        end
        return reply({}, k, ext)
      end
    end
    G[j] = part
  end
end
gst.nolim = G[1].st ~= gst -- it holds the meta alone
-- foreign returns the error of a part found foreign by a read after load, if any.
local function foreign_part(parts)
  for _, p in ipairs(parts) do
    if p.st.err then
      return fail(E_STATE, p.st.err)
    end
  end
end
if foreign_part(G) then -- setup found the numbers foreign: no request can be decided on them
  for r = 1, k do
    ext[r] = ext[r] or foreign_part(G)
  end
  return reply({}, k, ext)
end
-- changed: the meta's content changed (a control op, the fair share's clock or queue)
local changed = false

-- need returns the n request q takes from part p: n for calls, its cost in p's unit else
-- (costs: another set of costs by unit, a settle's actual).
local function need(p, q, costs)
  if p.unit == '' then
    return q.n
  end
  costs = costs or q.cost
  return costs and costs[p.unit] or 0
end

-- slot is µs per permit of the group's first limit in force; cost_time the time q's costs
-- take the group's limits, µs: the most of its parts' (n × its first limit's slot); horizon
-- how far ahead a tenant's request may book.
local function slot()
  return lim[1][2] / lim[1][1]
end
local function cost_time(q, costs)
  local c = 0
  for _, p in ipairs(G) do
    local t = need(p, q, costs) * p.lim[1][2] / p.lim[1][1]
    if t > c then
      c = t
    end
  end
  return c
end
local function horizon(q)
  return math.max(HORIZON, 2 * slot(), cost_time(q))
end

-- The fair share's clock (meta.fair: V, W in weight units (millionths), tV, Fmax), moved
-- to now once, by the first request that needs it: V moves 10^6/W per µs while the queue
-- holds tenants, each leaving the queue (and its weight W) when V reaches its finish tag.
-- An inspect (readonly) moves a copy and writes nothing.
local fair_key, fair_moved, finish, queued = nil, false, {}, {}
local function fair(qkey, readonly)
  if fair_moved then
    return meta.fair
  end
  local had = meta.fair
  local f = had and {V = had.V, W = had.W, tV = had.tV, Fmax = had.Fmax} or {V = 0, W = 0, tV = now, Fmax = 0}
  local t, skip = f.tV, 0
  while f.W > 0 and t < now do
    local m = redis.call('ZRANGE', qkey, string.format('%d', skip), string.format('%d', skip), 'WITHSCORES')
    if #m == 0 then
      f.W = 0
      break
    end
    local F, u = score(m[2]), tonumber((string.match(m[1], '^(%d+) ')))
    local reach = t + (F - f.V) * f.W / 1000000
    if reach > now then
      f.V, t = f.V + (now - t) * 1000000 / f.W, now
      break
    end
    if F > f.V then
      f.V = F
    end
    if reach > t then
      t = reach
    end
    f.W = f.W - (u or 0)
    if readonly then
      skip = skip + 1
    else
      redis.call('ZREM', qkey, m[1])
    end
  end
  if f.W <= 0 then -- the queue is empty: tags start again from 0
    f.V, f.W, f.Fmax = 0, 0, 0
    if had and had.W > 0 and not readonly then
      redis.call('DEL', qkey)
    end
  end
  f.tV = math.max(t, f.tV, f.W == 0 and now or 0)
  if readonly then
    return f
  end
  -- (separate statements: gopher-lua, miniredis's Lua, miscompiles a multiple
  -- assignment that sets an upvalue beside a table field)
  fair_key = qkey
  fair_moved = true
  meta.fair = f
  changed = changed or not had or had.V ~= f.V or had.W ~= f.W or had.tV ~= f.tV
  return f
end

-- units returns a tenant's weight in millionths: an operator's while it lasts, else the
-- caller's.
local function units(q)
  local w = meta.weights[q.tenant]
  if w and w[1] > now then
    return w[2]
  end
  return q.units or 1000000
end

-- queue_foreign returns the failure of the fair share's key KEYS[i] when it holds another
-- type than a sorted set (read once), else nil: a request that names it checks it first.
local queue_why = {}
local function queue_foreign(i)
  if queue_why[i] == nil then
    queue_why[i] = select(2, read_key('sorted set', 'ZCARD', KEYS[i])) or false
  end
  return queue_why[i] or nil
end

-- finish_of returns the finish tag of a tenant in the queue (false: not queued).
local function finish_of(qkey, member)
  local F = finish[member]
  if F == nil then
    F = score(redis.call('ZSCORE', qkey, member) or nil) or false
    finish[member] = F
  end
  return F
end

-- The tenants' states, read once each: the parts of their caps, as the group's (cparts'
-- with st and key), the calls' at KEYS[i] and another unit's in the keys after it
-- ("{…}:u:<unit>:<name>", which parse_request checked).
local tstates = {}
local function tenant_state(i)
  local ts = tstates[i]
  if ts == nil then
    ts = {}
    for j, p in ipairs(cparts) do
      local part = {unit = p.unit, head = p.head, lim = p.lim, cap = p.cap, key = KEYS[i + j - (cparts[1].unit == '' and 1 or 0)]}
      local why
      part.st, why = part_state(part.key, part, p.lim, p.lim, nil, 0)
      if not part.st then
        ts = why
        break
      end
      ts[j] = part
    end
    tstates[i] = ts
  end
  if ts.code then
    return nil, ts
  end
  local why = foreign_part(ts)
  if why then
    return nil, why
  end
  return ts
end

-- life is how long the fair share's clock f lives, µs: until V reaches Fmax. kept_us is
-- how long the state lives from now, its data mattering data µs: until neither its data
-- nor a line of its meta matters. The writes set it; an inspect after them reports it.
local function life(f)
  return math.ceil((f.Fmax - f.V) * f.W / 1000000) + math.max(f.tV - now, 0) + 1000000
end
local function kept_us(data)
  local kept = math.max(data, meta.pause - now, oend - now)
  for _, w in pairs(meta.weights) do
    kept = math.max(kept, w[1] - now)
  end
  local f = meta.fair
  if f and f.W > 0 then -- the clock lives while tenants are queued
    kept = math.max(kept, life(f))
  end
  return kept
end

-- report's answer on the group while it has not changed since (take, give, rates change it)
local remaining, reset
local function group_report()
  if not remaining then
    remaining, reset = report(G[1].st, G[1].lim, now, oend)
  end
  return remaining, reset
end

-- dirty says the call changed the group's state: its meta or a part's data.
local function dirty()
  for _, p in ipairs(G) do
    if p.st.dirty then
      return true
    end
  end
  return changed
end

-- data_keep returns how long the group's data matters, µs: the longest of its parts'
-- (each part's in p.keep).
local function data_keep()
  local data = 0
  for _, p in ipairs(G) do
    local _, _, pk = report(p.st, p.lim, now, oend)
    p.keep = pk
    if pk > data then
      data = pk
    end
  end
  return data
end

local out, wakes, books, booked, paused_queue = {}, {}, {}, {}, nil

local function answer(r, a, b, c, d, e, f, g)
  local o = WIDTH * r - WIDTH
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6], out[o + 7] = a, b, c, d, e, f, g
end

-- book reads a task's record once per call.
local function book(i)
  local rec = books[i]
  if rec == nil then
    local why
    rec, why = booking_read(KEYS[i])
    if rec == nil then
      return nil, why
    end
    books[i] = rec
  end
  return rec
end

-- queue puts a tenant's request of cost (µs of the group's service, cost_time), start
-- tag S, in the queue: its finish tag moves on, and its weight joins W when it was not
-- queued.
local function queue(fr, cost)
  local f, F = meta.fair, fr.S + cost * 1000000 / fr.u
  finish[fr.member], queued[fr.member], f.W = F, F, fr.W
  changed = true
  if F > f.Fmax then
    f.Fmax = F
  end
end

-- turn returns µs from now until start tag S may book (S <= V + h / W), V moving as the
-- clock does: with the queue as it is, the tenants queued ahead leaving it (and their
-- weight W) as V reaches their finish tags, the first TURN_LOOKS of them looked at (then
-- W as it is). A caller told a time a departure makes too late would leave its slot
-- unused; one told too early (a tenant arrives since) asks again.
local TURN_LOOKS = 16
local function turn(qkey, S, W, h)
  local f, t, V = meta.fair, 0, meta.fair.V
  for i = 0, TURN_LOOKS do
    local target = S - h * 1000000 / W
    if target <= V then
      return math.ceil(t)
    end
    local m = i < TURN_LOOKS and redis.call('ZRANGE', qkey, string.format('%d', i), string.format('%d', i), 'WITHSCORES')
    local F = m and tonumber(m[2] or '')
    local u = m and tonumber(string.match(m[1] or '', '^(%d+) ') or '')
    if not F or not u or F >= target or W - u <= 0 then
      return math.ceil(t + (target - V) * W / 1000000)
    end
    if F > V then
      t, V = t + (F - V) * W / 1000000, F
    end
    W = W - u
  end
  return math.ceil(t)
end

-- ticket_text is a ticket as the reply and a task's record carry it: millionths.
local function ticket_text(S)
  return math.floor(S * 1000000 + 0.5)
end

-- exceeds returns the failure of a request above what the limits in force or the caps
-- can ever grant, if it is.
local function exceeds(q)
  for _, parts in ipairs({G, q.c and cparts or {}}) do
    for _, p in ipairs(parts) do
      if need(p, q) > p.cap then
        return fail(E_EXCEEDS, 'JTEXCEEDS n above what the limits in force or the caps can grant')
      end
    end
  end
end

-- takes returns what request q takes, as {st, lim, n} for each part of the group and then
-- of its caps C (nil: none) that it takes anything from, and how many are the group's.
local function takes(q, C)
  local P = {}
  for _, parts in ipairs({G, C or {}}) do
    for _, p in ipairs(parts) do
      local n = need(p, q)
      if n > 0 then
        P[#P + 1] = {p.st, p.lim, n}
      end
    end
    if parts == G then
      P.group = #P
    end
  end
  return P
end

-- fit_all returns the earliest time >= t at which every part of P has room for its n:
-- each fit moves t only later, until a round of them leaves it where it is.
local function fit_all(P, t)
  local stable, i = 0, 0
  for _ = 1, 8 * #P do
    i = i % #P + 1
    local e = P[i]
    local t1 = fit(e[1], e[2], e[3], t, now)
    if t1 ~= t then
      t, stable = t1, 1
    else
      stable = stable + 1
    end
    if stable >= #P then
      break
    end
  end
  return t
end

-- latest returns the latest of P[from..to]'s own room for their n, from t.
local function latest(P, from, to, t)
  local m = t
  for i = from, to do
    local e = P[i]
    local v = fit(e[1], e[2], e[3], t, now)
    if v > m then
      m = v
    end
  end
  return m
end

-- acquire decides request r, q an acquire; it returns its failure, if any.
local function acquire(r, q)
  local n, x, pause = q.n, q.x, meta.pause
  local why = exceeds(q)
  if why then
    return why
  end
  if q.q and queue_foreign(q.q) then
    return queue_foreign(q.q)
  end
  local flags = (drift and F_DRIFT or 0) + (pause > now and F_PAUSED or 0)
  local ctext = q.ctext or ''
  local rec, last, replace = false, 0, false
  if q.b then
    rec, why = book(q.b)
    if rec == nil then
      return why
    end
    if rec and not rec.ticket then -- a booking: found, if it is still the caller's to use
      last = rec[3]
      if rec[2] == n and rec[4] == ctext and rec[1] >= now - (q.late or 0) and pause <= rec[1] then
        replace = lower and meta.over[2] > rec[3]
        if not replace then
          local stamp = math.max(now, last + 1)
          books[q.b], booked[#booked + 1] = {rec[1], n, stamp, ctext}, q.b
          group_report()
          answer(r, 2, pause > now and 0 or remaining, math.max(0, rec[1] - now), reset, rec[1], stamp, flags)
          return
        end
      end
    end
  end
  local C
  if q.c then
    C, why = tenant_state(q.c)
    if not C then
      return why
    end
  end
  local P = takes(q, C)
  if replace then -- an override set since lowers the limits: the booking goes back
    for _, e in ipairs(P) do
      give(e[1], e[2], e[3], rec[1], now)
    end
    remaining = nil
  end
  local t0, bound, h, fr = math.max(now, pause), x, nil, nil
  if q.tenant and #P > 0 then
    local f, u = fair(KEYS[q.q]), units(q)
    local member = string.format('%d ', u) .. q.tenant
    local F = finish_of(KEYS[q.q], member)
    local W = f.W + ((F and F > f.V) and 0 or u) -- with this tenant queued
    local ticket = q.ticket or (rec and rec.ticket and rec.n == n and rec.ctext == ctext and rec.ticket) or nil
    h = horizon(q)
    fr = {member = member, u = u, W = W, S = ticket or math.max(f.V, F or f.V), held = ticket}
    local ahead = h * 1000000 / W -- how far ahead of V a start tag may book
    if fr.S > f.V + ahead then -- its turn has not come: ask again when it does
      local due = math.max(1, turn(KEYS[q.q], fr.S, W, h))
      if q.hold and not fr.held then
        queue(fr, cost_time(q))
        fr.held = fr.S
      end
      if q.hold and q.b then
        books[q.b], booked[#booked + 1] = {ticket = fr.held, n = n, due = due, ctext = ctext}, q.b
      end
      group_report()
      answer(r, 0, pause > now and 0 or remaining, due, reset, 0, q.hold and ticket_text(fr.held) or 0,
        flags + F_TURN + (q.hold and F_TICKET or 0))
      return
    end
    bound = math.min(x, h)
  end
  -- the earliest time the group and the caps all have room
  local t = now
  if #P > 0 then
    t = fit_all(P, t0)
    for _, e in ipairs(P) do
      bound = math.min(bound, e[1].horizon or MAX_WAIT)
    end
  end
  if t - now > bound then -- denied: by the limit whose own room comes later
    local who = (#P > P.group and latest(P, P.group + 1, #P, t0) > latest(P, 1, P.group, t0)) and F_CAP or F_GROUP
    local wait, hold = t - now, nil
    if fr and t - now <= x then -- beyond the horizon only: ask again when it reaches t
      wait = t - now - h
      if q.hold then
        if not fr.held then
          queue(fr, cost_time(q))
          fr.held = fr.S
        end
        hold = fr.held
        if q.b then
          books[q.b], booked[#booked + 1] = {ticket = hold, n = n, due = wait, ctext = ctext}, q.b
        end
      end
    elseif replace then
      books[q.b], booked[#booked + 1] = false, q.b
    end
    group_report()
    answer(r, 0, pause > now and 0 or remaining, math.max(1, wait), reset, 0, hold and ticket_text(hold) or 0,
      flags + who + (hold and F_TICKET or 0))
    return
  end
  for _, e in ipairs(P) do
    take(e[1], e[2], e[3], t, now)
  end
  if #P > 0 then
    remaining = nil
    if fr and not fr.held then
      queue(fr, cost_time(q))
    end
  end
  local stamp = 0
  if replace then
    last = math.max(last, meta.over[2])
  end
  if q.b then
    if #P > 0 and t > now then
      stamp = math.max(now, last + 1)
      books[q.b], booked[#booked + 1] = {t, n, stamp, ctext}, q.b
    elseif rec then
      books[q.b], booked[#booked + 1] = false, q.b
    end
  end
  group_report()
  answer(r, 1, pause > now and 0 or remaining, t - now, reset, #P > 0 and t or 0, stamp, flags)
end

-- cancel decides request r, q a cancel: n permits (and its costs) booked at q.x (with b,
-- q.x is the booking's stamp), given back on the group and the tenant's caps.
local function cancel(r, q)
  local n, token = q.n, q.x
  if q.b then
    local rec, why = book(q.b)
    if rec == nil then
      return why
    end
    token = 0
    if rec and not rec.ticket and rec[2] == n and rec[4] == (q.ctext or '') and q.x > 0 and rec[3] == q.x then
      token, books[q.b], booked[#booked + 1] = rec[1], false, q.b
    end
  end
  local C
  if q.c then
    local why
    C, why = tenant_state(q.c)
    if not C then
      return why
    end
  end
  local freed = 0
  if token > 0 then
    local P = takes(q, C)
    for i, e in ipairs(P) do
      if give(e[1], e[2], e[3], token, now) == 1 and i <= P.group then
        freed = 1
      end
    end
  end
  if freed == 1 then
    remaining = nil
  end
  group_report()
  answer(r, freed, 0, 0, reset, q.b and token or 0, 0, 0)
end

-- reach is how long after a grant a limit l still counts it, µs: its period (the bucket:
-- until it is full again).
local function reach(l)
  return l[3] and math.ceil(l[3] * l[2] / l[1]) or l[2]
end

-- settle makes request r, q a settle of a grant at token q.x whose costs q.cost were an
-- estimate: each part of a unit it names is charged the actual's difference at the
-- grant's place (adjust), once per record key (e): a record found says it was (2); a
-- grant no limit counts any more is left alone (3). A tenant's finish tag moves by the
-- difference in the cost's time.
local function settle(r, q)
  local key, token = KEYS[q.e], q.x
  if q.q and queue_foreign(q.q) then
    return queue_foreign(q.q)
  end
  local v, why = read_key('string', 'GET', key)
  if why then
    return why
  end
  local C
  if q.c then
    C, why = tenant_state(q.c)
    if not C then
      return why
    end
  end
  local span = 0 -- how long the grant counts
  for _, parts in ipairs({G, C or {}}) do
    for _, p in ipairs(parts) do
      for _, l in ipairs(p.lim) do
        span = math.max(span, reach(l))
      end
    end
  end
  local status = 1
  if v then
    status = 2
  elseif token + span <= now then
    status = 3
  else
    for _, parts in ipairs({G, C or {}}) do
      for _, p in ipairs(parts) do
        local d = q.actual[p.unit] and q.actual[p.unit] - q.cost[p.unit]
        if d and d ~= 0 then
          adjust(p.st, p.lim, d, token, now)
        end
      end
    end
    if q.tenant then
      local dc = cost_time(q, q.actual) - cost_time(q)
      local f, u = fair(KEYS[q.q]), units(q)
      local member = string.format('%d ', u) .. q.tenant
      local F = finish_of(KEYS[q.q], member)
      if F and F > f.V then -- queued: its finish tag moves by the difference
        F = math.max(f.V, F + dc * 1000000 / u)
      elseif dc > 0 then -- the debt queues it
        F, f.W = f.V + dc * 1000000 / u, f.W + u
      end
      if F and F ~= finish[member] then
        finish[member], queued[member], changed = F, F, true
        if F > f.Fmax then
          f.Fmax = F
        end
      end
    end
    redis.call('SET', key, '1', 'PX', ms(token + span - now))
    remaining = nil
  end
  group_report()
  answer(r, status, remaining, 0, reset, token, 0, 0)
end

-- inspect answers request r, q an inspect, writing nothing: the group's figures, and its
-- tenant's when it names one. Its detail (the extra region): booked, ahead_us,
-- paused_us, pttl_ms, override_us, then rate, capacity, available per limit; then, with
-- the fair share's key: for a tenant, its place (µs until the clock reaches its finish
-- tag, -1 when it has nothing queued) and each cap's capacity and available; for the
-- group, its weight in the queue (W, millionths) and k, then per tenant of the k (at
-- most 10) with the most queued its place, its weight units, its name's length and bytes.
local function inspect(r, q)
  if q.q and queue_foreign(q.q) then
    return queue_foreign(q.q)
  end
  local pause = meta.pause
  local t = fit(G[1].st, G[1].lim, 1, math.max(now, pause), now) -- one of the first part
  group_report()
  local b, ahead = detail(G[1].st, G[1].lim, now)
  local pttl = -2
  if not dirty() then
    pttl = redis.call('PTTL', KEYS[1])
  elseif kept_us(data_keep()) > 0 then -- what the call's writes will set
    pttl = math.ceil(kept_us(data_keep()) / 1000)
  end
  local d = {b, ahead, math.max(0, pause - now), pttl, math.max(0, oend - now)}
  for _, p in ipairs(G) do
    local _, _, avail = detail(p.st, p.lim, now)
    for i = 1, #p.lim do
      d[#d + 1], d[#d + 2], d[#d + 3] = p.lim[i][1], p.lim[i][CAP], avail[i]
    end
  end
  local f = q.q and fair(KEYS[q.q], true)
  if q.tenant then
    local F = finish_of(KEYS[q.q], string.format('%d ', units(q)) .. q.tenant)
    d[#d + 1] = (F and F > f.V) and math.ceil((F - f.V) * f.W / 1000000) or -1
    if q.c then
      local C, why = tenant_state(q.c)
      if not C then
        return why
      end
      local ct = fit(C[1].st, C[1].lim, 1, t, now)
      if ct > t then
        t = ct
      end
      for _, p in ipairs(C) do
        local _, _, cavail = detail(p.st, p.lim, now)
        for i = 1, #p.lim do
          d[#d + 1], d[#d + 2] = p.lim[i][CAP], cavail[i]
        end
      end
    end
  elseif f then
    local top = redis.call('ZREVRANGE', KEYS[q.q], '0', '9', 'WITHSCORES')
    d[#d + 1], d[#d + 2] = f.W, #top / 2
    for i = 1, #top, 2 do
      local u, name = string.match(top[i], '^(%d+) (.*)$')
      name = name or ''
      d[#d + 1], d[#d + 2], d[#d + 3] = math.max(0, math.ceil((score(top[i + 1]) - f.V) * f.W / 1000000)),
        tonumber(u) or 0, #name
      for j = 1, #name do
        d[#d + 1] = string.byte(name, j)
      end
    end
  end
  ext[r] = d
  answer(r, 1, pause > now and 0 or remaining, t - now, reset, 0, 0,
    (drift and F_DRIFT or 0) + (pause > now and F_PAUSED or 0))
end

-- control makes request r, a pause, resume, override, clear or a tenant's weight.
local function control(r, q)
  local op, ended = q.op, 0
  if op == OP_PAUSE then
    if now + q.x > meta.pause then
      meta.pause = now + q.x
    end
    wakes[#wakes + 1] = string.format('p %d', meta.pause) -- the end in force
    if meta.fair and meta.fair.W > 0 then -- no service while paused: the fair clock waits
      meta.fair.tV = math.max(meta.fair.tV, meta.pause)
      if q.q and not queue_foreign(q.q) then -- and the queue lives as long as it
        paused_queue = KEYS[q.q]
      end
    end
  elseif op == OP_RESUME then
    if meta.pause > now then
      ended = meta.pause
      wakes[#wakes + 1] = string.format('r %d', ended)
    end
    meta.pause = 0
    if meta.fair and meta.fair.tV > now then
      meta.fair.tV = now
    end
  elseif op == OP_WEIGHT then
    meta.weights[q.tenant] = q.x > 0 and {now + q.x, q.units} or nil
  else
    local over
    if op == OP_OVERRIDE then
      over = {now + (q.x > 0 and q.x or MAX_PERIOD), now, q.rates}
    end
    meta.over = over
    lim, lower, oend = in_force(given, over)
    for _, p in ipairs(G) do
      local old = p.lim
      p.lim = slice(lim, p)
      cap_of(p)
      rates(p.st, old, p.lim, now, now)
    end
    remaining = nil
  end
  changed = true
  answer(r, 1, 0, math.max(0, meta.pause - now), math.max(0, oend - now), ended, 0, 0)
end

for r = 1, k do
  local q = ops[r]
  if q and not ext[r] then
    local why
    if q.op == OP_ACQUIRE then
      why = acquire(r, q)
    elseif q.op == OP_CANCEL then
      why = cancel(r, q)
    elseif q.op == OP_INSPECT then
      why = inspect(r, q)
    elseif q.op == OP_SETTLE then
      why = settle(r, q)
    else
      why = control(r, q)
    end
    if why then
      ext[r] = why
    end
  end
  local bad = foreign_part(G)
  if bad then -- a read after load found the state foreign: it fails every request
    for i = 1, k do
      ext[i] = bad
    end
    return reply({}, k, ext)
  end
  -- a state the call writes gets the caller's head: no drift for the requests after
  -- that, as for lone calls after one that wrote
  drift = drift and not dirty()
end

-- Writes, after every read and check: what lives is kept until it no longer matters.
local kept = kept_us(data_keep())
local f = meta.fair
if f and f.W > 0 and fair_moved then
  for member, F in pairs(queued) do
    redis.call('ZADD', fair_key, string.format('%.17g', F), member)
  end
  redis.call('PEXPIRE', fair_key, ms(life(f)))
elseif f and f.W > 0 and paused_queue then
  redis.call('PEXPIRE', paused_queue, ms(life(f)))
end
if dirty() then
  if gst.found then -- the head replaced: another process's, with other limits
    meta.drift = {now, gst.found}
  end
  meta.head = ARGV[1]
  local text = format_meta(meta)
  save(gst, KEYS[1], kept, text ~= gst.meta and text or nil, gst.nolim or G[1].keep <= 0)
end
-- (the parts with a key of their own: their heads are their metas)
local sets = {G}
for _, ts in pairs(tstates) do
  if not ts.code then
    sets[#sets + 1] = ts
  end
end
for _, parts in ipairs(sets) do
  for _, p in ipairs(parts) do
    if p.st ~= gst and p.st.dirty and not p.st.err then
      local _, _, pk = report(p.st, p.lim, now, parts == G and oend or 0)
      save(p.st, p.key, pk, (p.st.absent or p.st.rehead) and p.head or nil)
    end
  end
end
for _, i in ipairs(booked) do
  local rec = books[i]
  if rec ~= nil then
    local ttl = 1000000
    if rec and rec.ticket then -- a task handed back keeps its place while it may still come
      ttl = rec.due + 60000000
    elseif rec then
      ttl = math.max(rec[1] - now, 0) + 1000000
    end
    booking_write(KEYS[i], rec, ttl)
    books[i] = nil
  end
end
for _, text in ipairs(wakes) do
  redis.call('PUBLISH', (string.match(KEYS[1], '^(.*:)') or '') .. 'wake', text)
end
reply(out, k, ext)
if gst.found then -- the reply ends with the head found, its bytes then their count
  local theirs = gst.found
  for i = 1, #theirs do
    out[#out + 1] = string.byte(theirs, i)
  end
  out[#out + 1] = #theirs
end
return out
