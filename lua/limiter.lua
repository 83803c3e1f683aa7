-- limiter.lua: the driver every limiter script ends with; the generator puts it after
-- common.lua and the algorithm's file. The protocol it speaks (keys, arguments, requests,
-- the reply, codes) is internal/protocol's package doc; docs/design.md shows how it
-- decides, and each op's function below says what it decides.
--
-- KEYS[1]  the limiter's state; KEYS[2..] each unit's, then the requests' own keys
-- ARGV[1]  the group's head; ARGV[2] the tenants' caps' head or ""; ARGV[3] the first
--          request (the fast paths read it before anything else), ARGV[4..] the others
-- Returns  WIDTH integers per request, then the extras (common.lua, reply)
-- Writes   after every read and check, once per call: a request that fails writes
--   nothing, nor does an inspect; a call of no other request that succeeds nothing at all
--   (not even the state's upkeep), and a state found foreign is written by none.
--
-- The algorithm's file defines, each taking its state as an argument:
--   LIMIT_FIELDS, CAP           a limit's numbers in a head; which of them bounds n
--   TAGS, PARAM_TAG             the head tags it serves; the one with a parameter
--   LIMIT_TEXT, ONE_LIMIT       patterns of a limit in a head and of the usual head
--   load(key, head) -> st       st.meta (nil: absent; head itself when equal to it); or nil
--                               and its read's error (common.lua's foreign reads it)
--   setup(st, lim, param, cw, cwend, given, now)   count the state with lim, the limits
--                               in force; cw: those it was counted with, to cwend
--   fit(st, lim, n, t, now) -> t'    the earliest time >= t at which n fit every limit
--   take(st, lim, n, t, now)         book n at t
--   give(st, lim, n, token, now) -> freed 0|1   give back n >= 1 booked at token (cancel)
--   adjust(st, lim, d, token, now)   charge d ~= 0 more (less, d < 0) at the grant's place (settle)
--   report(st, lim, now, oend) -> remaining, reset_us, keep_us (how long the state matters)
--   detail(st, lim, now) -> booked, ahead_us, avail (per limit)   (inspect)
--   rates(st, new, at)               the limits in force become new at `at`
--   save(st, key, keep, meta, bare)  write the state to live keep µs more (<= 0: delete it),
--                                    meta the new meta (nil: unchanged); bare: the meta alone
-- st.dirty says the state changed, st.absent that the key was absent (or held a meta
-- alone, st.bare), st.err (a text) that a read after load found it foreign (the log reads
-- lazily). lim[i] = {rate, period_us, burst (bucket only)}: the limits in force. Nothing
-- raises an error: a request's failure is a value.

local ARGV, KEYS = ARGV, KEYS -- (locals cost less to read than globals)
local nargv = #ARGV

-- limit returns a limit's numbers from the texts of its fields (digits without a leading
-- zero), or nil when one is out of range.
local function limit(r, p, b)
  if #r < 11 and #p < 15 and (not b or #b < 11) then
    r, p, b = r + 0, p + 0, b and b + 0
    if r <= MAX_RATE and p <= MAX_PERIOD and (not b or b <= MAX_RATE and b * p <= MAX_TICKS) then
      return {r, p, b}
    end
  end
end

-- cap_of returns the largest n the limits lim allow.
local function cap_of(lim)
  local cap = MAX_RATE
  for i = 1, #lim do
    cap = cap < lim[i][CAP] and cap or lim[i][CAP]
  end
  return cap
end

-- parse_head reads a head "<tag> [<param>] <limit>... [/<unit> <limit>...]..." of this
-- algorithm's: its limits (each LIMIT_FIELDS numbers in range), its parameter (0 without
-- one), its tag and, when it names a unit, its parts, the limits of each unit in the
-- head's order: {unit, from, to, head} (unit '': the calls', first when there are any;
-- head: the part's own head, its state's meta when it has a key of its own); and the text
-- read; nil for any other text. A head as Go writes it (single spaces, no leading zeros) is
-- read at the cost of a match per limit; another is written so first (normal).
local function parse_head(text, normal)
  local tag, r, p, b = string.match(text, ONE_LIMIT)
  local l = tag and limit(r, p, b)
  if l then
    return {l}, 0, tag, nil, text
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
    local j
    r, p, b, j = string.match(text, LIMIT_TEXT, i)
    if LIMIT_FIELDS == 2 then
      j, b = b, nil
    end
    l = r and limit(r, p, b)
    if l then
      lim[#lim + 1], i = l, j
    else -- a unit's limits follow: the part before them ends
      local unit
      unit, j = string.match(text, '^ /([%l%d_.%-]+)()', i)
      prefix = unit and #unit <= MAX_UNIT and not (parts and parts[#parts].from > #lim) and prefix
      parts = parts or {}
      if #lim > 0 and not parts[1] then
        parts[1] = {unit = '', from = 1, to = #lim, head = string.sub(text, 1, i - 1)}
      elseif parts[1] then
        parts[#parts].to, parts[#parts].head = #lim, prefix and prefix .. string.sub(text, from, i - 1)
      end
      for _, q in ipairs(parts) do
        prefix = q.unit ~= unit and prefix
      end
      parts[#parts + 1], from, i = {unit = unit, from = #lim + 1}, i, j
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

-- The plain fast path (docs/design.md): a call whose every request is a plain acquire
-- "a <n> <wait_us>" (n >= 1), on an absent key or a state whose meta is the callers' head
-- alone (a meta alone is not absent), decided request by request as the loop below decides
-- an acquire, by the same algorithm functions. Anything else goes on below, nothing written
-- (a call whose first request is not one reads nothing here).
do
  local n, w = string.match(ARGV[3] or '', '^a ([1-9]%d*) (%d+)$')
  if n and nargv <= 2 + MAX_REQUESTS and ARGV[2] == '' then
    local head = ARGV[1]
    local lim, param, _, parts = parse_head(head)
    local st = lim and not parts and load(KEYS[1], head) -- (parts: units other than calls)
    if st and ((st.absent and not st.bare) or st.meta == head) then
      setup(st, lim, param, lim, 0, lim, now)
      local cap = cap_of(lim)
      -- (out made at one reply's size)
      local k, out, text = nargv - 2, {false, false, false, false, false, false, false}, nil
      local remaining, reset, keep
      for r = 1, st.err and 0 or k do
        if ARGV[r + 2] ~= text then -- a batch's requests repeat: read each text once
          if text then
            n, w = string.match(ARGV[r + 2], '^a ([1-9]%d*) (%d+)$')
          end
          text = ARGV[r + 2]
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
end

-- score reads a number of the fair share's (a sorted set's score, V and Fmax): gopher-lua's
-- tonumber reads no mantissa without a point before an exponent ("8e+10", as miniredis
-- gives a large score), so one is put in.
local function score(s)
  return tonumber(s) or tonumber((string.gsub(s or '', '^(%-?%d+)e', '%1.0e')))
end

-- walk returns the fair share's clock had = {V, W, tV, Fmax} (docs/design.md; nil: none)
-- moved to now over the queue at qkey, a copy, and the members it passed (gone.all: all, the
-- queue is empty): they leave the queue, which drop writes (hadW: the W read). It reads
-- the members from the head in runs that double, to 64: most calls pass one or none.
local function walk(qkey, had)
  local f = had and {V = had.V, W = had.W, tV = had.tV, Fmax = had.Fmax} or {V = 0, W = 0, tV = now, Fmax = 0}
  local t, gone, m, i = f.tV, {}, {}, 1
  while f.W > 0 and t < now do
    if i > #m then
      local to = #gone + math.min(64, math.max(1, #gone)) - 1
      m, i = redis.call('ZRANGE', qkey, string.format('%d', #gone), string.format('%d', to), 'WITHSCORES'), 1
      if #m == 0 then
        f.W = 0
        break
      end
    end
    local F, u = score(m[i + 1]), tonumber((string.match(m[i], '^(%d+) ')))
    local reach = t + (F - f.V) * f.W / 1000000
    if reach > now then
      f.V, t = f.V + (now - t) * 1000000 / f.W, now
      break
    end
    f.V, t, f.W = math.max(f.V, F), math.max(t, reach), f.W - (u or 0)
    gone[#gone + 1], i = m[i], i + 2
  end
  if f.W <= 0 then -- the queue is empty: tags start again from 0
    f.V, f.W, f.Fmax, gone.all = 0, 0, 0, true
  end
  f.tV = math.max(t, f.tV, f.W == 0 and now or 0)
  return f, gone
end

-- fs is the fair share's bookkeeping in a call: its queue's key, the clock f (moved to now
-- once, walk), the finish tags read (finish: false for none, or passed by the clock) and to
-- write (queued) by member "<weight units> <name>", the members to take out (removed, nil
-- for none: a tenant's place moved to another weight, rekey), how many members the clock
-- passed that the queue still holds, fresh (the clock passed them all: the writes make the
-- queue anew), and changed (the clock or the queue changed: the meta is written).
-- turn's reads of the queue (stored, storedF, more, reach) and this call's finish tags in
-- order (mine) come with the first turn. move moves the clock had (nil: none) of the queue
-- at qkey to now as fs's clock, and returns the members it passed (drop).
local function fair_share()
  return {key = nil, f = nil, finish = {}, queued = {}, removed = nil, passed = 0, fresh = false, changed = false}
end
local function move(fs, had, qkey)
  local f, gone = walk(qkey, had)
  fs.key, fs.f, fs.passed, fs.fresh = qkey, f, #gone, gone.all
  for j = 1, #gone do -- (no longer queued: a member's read gives no score for them)
    fs.finish[gone[j]] = false
  end
  fs.changed = fs.changed or not had or had.V ~= f.V or had.W ~= f.W or had.tV ~= f.tV
  return gone
end
local function drop(qkey, gone, hadW)
  if gone.all then
    if hadW > 0 then
      redis.call('DEL', qkey)
    end
  else
    for j = 1, #gone, 64 do
      redis.call('ZREM', qkey, unpack(gone, j, math.min(j + 63, #gone)))
    end
  end
end

-- reach is how long, µs from now, the fair share's clock f takes to reach F at its present
-- weight: from the end of a pause that holds it (tV) on, at W's pace. The clock lives until
-- it reaches Fmax, and a second.
local function reach(f, F)
  return math.ceil((F - f.V) * f.W / 1000000) + (f.tV > now and f.tV - now or 0)
end

-- clock reads the fair share's clock from the meta's line "f <V> <W> <tV> <Fmax>" at i in
-- text: {V, W, tV, Fmax}, or nil for a line not of that form; clock_line writes it.
local function clock(text, i)
  local V, W, tV, Fmax = string.match(text, '^f (%S+) (%d+) (%d+) (%S+)$', i)
  V, Fmax = score(V), score(Fmax) -- (x == x: not NaN)
  if V and Fmax and V == V and Fmax == Fmax and math.abs(V) < math.huge and math.abs(Fmax) < math.huge then
    return {V = V, W = tonumber(W), tV = tonumber(tV), Fmax = Fmax}
  end
end
local function clock_line(f)
  return string.format('\nf %.17g %d %d %.17g', f.V, f.W, f.tV, f.Fmax)
end

-- keep_queue takes the members removed out of the queue at qkey and writes the finish tags
-- a call set (queued, by member; no member is both), the queue kept as long as its clock f
-- lives (while tenants are queued). A queue it makes (fresh:
-- the clock passed every member, or there was none) is made a skiplist: its ZADD adds
-- first a member no tenant's can be (no weight before a space) and longer than Redis's
-- zset-max-listpack-value (64 bytes by default), which it then removes, and a sorted set
-- never turns back into a listpack. A listpack reads the scores it passes as text at every
-- insert and read (bench/RESULTS.md, "The queue a skiplist").
local SKIPLIST = 'jobthrottle: the fair share queue is kept a skiplist by this member longer than a listpack takes'
local function keep_queue(qkey, f, queued, fresh, removed)
  if removed then
    redis.call('ZREM', qkey, unpack(removed))
  end
  if f.W > 0 then
    local zadd, first = {}, 1 -- (one ZADD for all)
    if fresh then
      zadd[1], zadd[2], first = 'inf', SKIPLIST, 3
    end
    for m, F in pairs(queued) do
      zadd[#zadd + 1], zadd[#zadd + 2] = string.format('%.17g', F), m
    end
    if zadd[first] then
      redis.call('ZADD', qkey, unpack(zadd))
      if fresh then
        redis.call('ZREM', qkey, SKIPLIST)
      end
    end
    redis.call('PEXPIRE', qkey, ms(reach(f, f.Fmax) + 1000000))
  end
end

-- fit_all returns the earliest time >= t at which every part of P (st, lim, n of each, in
-- a row) has room for its n: each fit moves t only later, until a round of them leaves it
-- where it is. latest returns the latest of P's parts from i to j's own room for their n,
-- from t.
local function fit_all(P, t)
  local m, stable, i = #P / 3, 0, 0
  for _ = 1, 8 * m do
    i = i % m + 1
    local t1 = fit(P[3 * i - 2], P[3 * i - 1], P[3 * i], t, now)
    t, stable = t1, t1 ~= t and 1 or stable + 1
    if stable >= m then
      break
    end
  end
  return t
end
local function latest(P, i, j, t)
  local m = t
  for e = i, j do
    m = math.max(m, fit(P[3 * e - 2], P[3 * e - 1], P[3 * e], t, now))
  end
  return m
end

-- A ticket is a tenant's place S, a start tag of any size, as the integer a reply and a
-- task's record carry it (below 2^53, as every integer argument): its 14 significant
-- digits m and its decimal exponent e, S = m / 10^e (millionths while S < 9e7), written
-- m × 100 + e + 50; place_of reads one back. (Tags grow with the time the queue has not
-- emptied, faster the lighter the tenants: in millionths alone they outgrow 2^53.)
local function ticket_of(S)
  local e = 6
  while (e >= 0 and S * 10 ^ e or S / 10 ^ -e) >= 9e13 do
    e = e - 1
  end
  return math.floor((e >= 0 and S * 10 ^ e or S / 10 ^ -e) + 0.5) * 100 + e + 50
end
local function place_of(k)
  local e, m = k % 100 - 50, (k - k % 100) / 100
  return e >= 0 and m / 10 ^ e or m * 10 ^ -e
end

-- Members in queue order (by finish tag, then name, as the sorted set orders them), in
-- lists of {member, F}: before says whether (F1, m1) comes before (F2, m2); spot returns the
-- index in list where (F, m) goes, or stands.
local function before(F1, m1, F2, m2)
  return F1 < F2 or F1 == F2 and m1 < m2
end
local function spot(list, F, m)
  local lo, hi = 1, #list + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if before(list[mid][2], list[mid][1], F, m) then
      lo = mid + 1
    else
      hi = mid
    end
  end
  return lo
end

-- queue sets member m's finish tag F (its weight joins W when it was not queued); unqueue
-- gives back the place S of a caller that leaves (m of weight u with finish tag F, its
-- request's cost taking ct µs): F goes back by that cost (no further than the clock's V)
-- while the place still counts in a queue not emptied since. Once a turn has read the
-- queue (fs.mine), queue keeps turn's lists in order: m leaves the stored members or this
-- call's (leave) and takes its place among this call's. rekey moves a tenant's place from
-- member old (finish tag F0; its weight, its name's first word, leaves W) to member m of
-- weight u (finish tag F, false: none), at the later tag, which it returns.
local function leave(fs, m)
  local old = fs.queued[m]
  local list, was = old and fs.mine or fs.stored, old or fs.storedF[m]
  local i = was and spot(list, was, m)
  if i and list[i] and list[i][1] == m then
    table.remove(list, i)
  end
end
local function queue(fs, m, F, W)
  local f, mine = fs.f, fs.mine
  if mine then
    leave(fs, m)
    table.insert(mine, spot(mine, F, m), {m, F})
  end
  fs.finish[m], fs.queued[m], f.W, f.Fmax, fs.changed = F, F, W, math.max(f.Fmax, F), true
end
local function unqueue(fs, m, u, F, S, ct)
  local f = fs.f
  if F and S and f.W > 0 and S <= f.Fmax + 1 and F > f.V then
    queue(fs, m, math.max(f.V, F - ct * 1000000 / u), f.W)
  end
end
local function rekey(fs, old, F0, m, F, u)
  if fs.mine then
    leave(fs, old)
  end
  fs.removed = fs.removed or {}
  fs.finish[old], fs.queued[old], fs.removed[#fs.removed + 1] = false, nil, old
  local G = F and math.max(F, F0) or F0
  queue(fs, m, G, fs.f.W - tonumber(string.match(old, '^(%d+) ')) + (F and 0 or u))
  return G
end

-- turn returns µs from now until start tag S may book (S <= V + h / W), V moving as the
-- clock does (from tV on: a pause holds it until its end): with the queue as this call
-- leaves it (its stored members, the finish tags this call's requests set in place of
-- theirs: the writes come after every request), the tenants queued ahead leaving it (and
-- their weight W) as V reaches their finish tags, the first TURN_LOOKS of them looked at
-- (then W as it is). A caller told a time a departure makes too late would leave its slot
-- unused; one told too early (a tenant arrives since) asks again. The queue is read once a
-- call, as far as its turns look (fs.stored: the members the clock did not pass and this
-- call did not queue again, at least TURN_LOOKS while the queue has them; read again
-- further when this call's own take their places), and this call's finish tags are kept in
-- order (fs.mine): a call's turns cost a read and a merge of the two lists each, not a sort
-- of the queue each.
local TURN_LOOKS = 16
local function turn(fs, S, W, h)
  if not fs.mine then
    local mine = {}
    for m, F in pairs(fs.queued) do
      mine[#mine + 1] = {m, F}
    end
    if mine[2] then
      table.sort(mine, function(a, b)
        return before(a[2], a[1], b[2], b[1])
      end)
    end
    fs.mine, fs.reach = mine, TURN_LOOKS + #mine
  end
  while not fs.stored or #fs.stored < TURN_LOOKS and fs.more do
    if fs.stored then
      fs.reach = 2 * fs.reach
    end
    -- (from the first member the clock did not pass: they leave the queue at the writes)
    local m = redis.call('ZRANGE', fs.key, string.format('%d', fs.passed),
      string.format('%d', fs.passed + fs.reach - 1), 'WITHSCORES')
    local stored, storedF = {}, {}
    for i = 1, #m, 2 do
      local F = score(m[i + 1])
      if F and fs.queued[m[i]] == nil and fs.finish[m[i]] ~= false then
        stored[#stored + 1], storedF[m[i]] = {m[i], F}, F
      end
    end
    fs.stored, fs.storedF, fs.more = stored, storedF, #m == 2 * fs.reach
  end
  local stored, mine, i, j = fs.stored, fs.mine, 1, 1
  -- (reach(fs.f, V), written out: on the backlog's path, bench/callgrind/cases.sh)
  local t, V = fs.f.tV > now and fs.f.tV - now or 0, fs.f.V
  for k = 1, TURN_LOOKS + 1 do
    local target = S - h * 1000000 / W
    if target <= V then
      return math.ceil(t)
    end
    local e, a, b = nil, stored[i], mine[j] -- the next ahead: the stored or this call's
    if k <= TURN_LOOKS and a and (not b or before(a[2], a[1], b[2], b[1])) then
      e, i = a, i + 1
    elseif k <= TURN_LOOKS then
      e, j = b, j + 1
    end
    local F = e and e[2]
    local u = e and tonumber(string.match(e[1], '^(%d+) ') or '')
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

-- decide decides an acquire whose parts P (st, lim, n of each, in a row; the group's the
-- first g) book their n at the earliest time they all have room from t0, if that comes
-- within x µs and, for a tenant's request or one of estimated costs, within its horizon h
-- (nil: none). A tenant's request (d: its member m of weight u with finish tag F, the
-- ticket it sent back, its cost's time ct; nil: none) also waits for its fair turn
-- (docs/design.md, "Tenants and the fair share"); denied, it takes a place when it holds
-- (d.hold) and may wait that long, or is a task's (d.task, whose record keeps it), and else
-- gives back the place it held. It returns the booking's time, or nil, the wait until
-- asking again can succeed, which limit denied (a flag) and the place held, if any.
local function decide(P, g, t0, x, h, fs, d)
  local bound, t, wait, who, S, W, held, beyond = h and math.min(x, h) or x, now, nil, nil, nil, nil, nil, false
  if d then
    local f = fs.f
    W, held = f.W + ((d.F and d.F > f.V) and 0 or d.u), d.ticket -- (W: with this tenant queued)
    if held and (f.W == 0 or held > f.Fmax + 1) then -- a place in a queue emptied since
      held = nil -- (its tags start again from 0): the turn has come
    end
    S = held or math.max(f.V, d.F or f.V)
    if S > f.V + h * 1000000 / W then -- its turn has not come: ask again when it does
      wait, who = math.max(1, turn(fs, S, W, h)), F_TURN
    end
  end
  if not who and #P > 0 then -- the earliest time the group and the caps all have room
    t = fit_all(P, t0)
    for i = 1, #P, 3 do
      bound = math.min(bound, P[i].horizon or MAX_WAIT)
    end
  end
  if not who and t - now > bound then -- denied: by the limit whose own room comes later
    who = (#P > 3 * g and latest(P, g + 1, #P / 3, t0) > latest(P, 1, g, t0)) and F_CAP or F_GROUP
    wait = t - now
    if h and t - now <= x then -- beyond the horizon only: ask again when it reaches t
      wait = t - now - h
      if not d and wait > h then -- (settles may free room sooner: at most a horizon)
        wait = h
      end
    else
      beyond = true -- (no place to take)
    end
  end
  if who then
    -- a caller told to ask again later than it may wait leaves: it takes no place, and
    -- gives back the one it held (a task's is kept in its record: the task comes back)
    local hold = d and d.hold and not beyond and (wait <= x or d.task)
    if d and not hold and not d.task then
      unqueue(fs, d.m, d.u, d.F, held, d.ct)
    end
    if hold and not held then
      queue(fs, d.m, S + d.ct * 1000000 / d.u, W)
      held = S
    end
    return nil, wait, who, hold and held
  end
  for i = 1, #P, 3 do
    take(P[i], P[i + 1], P[i + 2], t, now)
  end
  if d and not held then
    queue(fs, d.m, S + d.ct * 1000000 / d.u, W)
  end
  return t
end

-- The tenants' fast path: a call whose every request is a tenant's acquire as Go writes it,
-- "a <n> <wait_us> q<i> [c<i>] [w<units>] [k<ticket>] [h] t<name>" (n >= 1), on an absent
-- key or a state whose meta is the callers' head, alone or with the fair share's clock (a
-- meta alone is not absent), and tenants' states absent or whose metas are the caps' head;
-- decided request by request as the loop below decides an acquire, by the same functions.
-- Anything else goes on to the loop, nothing written: another op or option, a head of
-- units, another line in the meta, a key of another kind or type, n above what the limits
-- can grant. (What it saves: luaexec's tenant acquire cases and bench/callgrind/cases.sh,
-- in bench/RESULTS.md.)
if nargv >= 3 and nargv <= 2 + MAX_REQUESTS and string.find(ARGV[3], '^a %d+ %d+ q') then
  local head = ARGV[1]
  local lim, param, tag, parts = parse_head(head)
  local st = lim and not parts and load(KEYS[1], head)
  local had -- the fair share's clock, when the meta holds one
  if st and st.meta ~= head and st.meta and not st.bare and string.sub(st.meta, 1, #head + 1) == head .. '\n' then
    had = clock(st.meta, #head + 2)
  end
  local clim, _, ctag, cparts, chead = false, nil, tag, nil, nil -- the caps' limits (false: none) and head
  if ARGV[2] ~= '' then
    clim, _, ctag, cparts, chead = parse_head(ARGV[2])
  end
  if st and ((st.absent and not st.bare) or st.meta == head or had) and clim ~= nil and ctag == tag and not cparts then
    setup(st, lim, param, lim, 0, lim, now)
    local cap, ccap = cap_of(lim), clim and cap_of(clim)
    -- (out made at one reply's size)
    local k, out, text = nargv - 2, {false, false, false, false, false, false, false}, nil
    local n, w, q, c, u, kt, hold, name -- the request's fields
    local base = string.match(KEYS[1], '^(.*:)l$') -- (each key a request names is of its kind under it)
    local remaining, reset, keep
    -- the tenants' caps' states by key index; the fair share (decide), its clock moved to
    -- now by the first request, and the members it passed
    local caps, fs, gone = {}, fair_share(), nil
    for r = 1, st.err and 0 or k do
      if ARGV[r + 2] ~= text then -- a batch's requests repeat: read each text once
        text = ARGV[r + 2]
        local at, rest = string.find(text, ' t', 1, true), nil
        name = at and string.sub(text, at + 2)
        n, w, q, rest = string.match(at and string.sub(text, 1, at - 1) or '', '^a ([1-9]%d*) (%d+) q(%d+)(.*)$')
        c = nil
        if clim and rest then
          c, rest = string.match(rest, '^ c(%d+)(.*)$')
        end
        u = rest and string.match(rest, '^ w([1-9]%d*)')
        rest = u and string.sub(rest, #u + 3) or rest
        kt = rest and string.match(rest, '^ k([1-9]%d*)')
        rest = kt and string.sub(rest, #kt + 3) or rest
        hold = rest == ' h'
        q, c = q and q + 0, c and c + 0
        if not (rest == '' or hold) or not base or KEYS[q] ~= base .. 'q' or (c and KEYS[c] ~= base .. 't:' .. name)
          or name == '' or #name > MAX_TENANT or (u and (#u > 16 or u + 0 > MAX_WEIGHT * 1000000))
          or (kt and (#kt > 16 or kt + 0 > MAX_WAIT)) then
          n = nil
        end
        u, kt = u and u + 0 or 1000000, kt and place_of(kt + 0)
        -- (coercion, as parse_head; w with a leading zero goes to the loop, which reads it)
        n, w = n and #n < 11 and n + 0, w and #w < 17 and (w == '0' or w >= '1') and w + 0
        if not n or not w or n > cap or w > MAX_WAIT or (clim and n > ccap) then
          st = nil
          break
        end
      end
      local P = {st, lim, n}
      if c then -- its caps' state, read once per key
        local ts = caps[c]
        if ts == nil then
          ts = load(KEYS[c], chead)
          if ts and ((ts.absent and not ts.bare) or ts.meta == chead) then
            setup(ts, clim, param, clim, 0, clim, now)
          else
            ts = false
          end
          caps[c] = ts
        end
        if not ts or ts.err then
          st = nil
          break
        end
        P[4], P[5], P[6] = ts, clim, n
      end
      local m, finish = string.format('%d ', u) .. name, fs.finish -- its member in the queue
      if finish[m] == nil then
        local F = redis.pcall('ZSCORE', KEYS[q], m)
        if type(F) == 'table' then -- another type, or a refusal: the loop says which
          st = nil
          break
        end
        finish[m] = score(F or nil) or false
      end
      gone = gone or move(fs, had, KEYS[q])
      local ct = n * lim[1][2] / lim[1][1] -- (its cost's time, as cost_time)
      local t, wait, who, held = decide(P, 1, now, w, math.max(HORIZON, 2 * lim[1][2] / lim[1][1], ct), fs,
        {m = m, u = u, F = finish[m], ticket = kt, ct = ct, hold = hold, task = false})
      if t then
        remaining = nil
      end
      if not remaining then
        remaining, reset, keep = report(st, lim, now)
      end
      local b = WIDTH * r - WIDTH
      out[b + 1], out[b + 2], out[b + 3], out[b + 4], out[b + 5], out[b + 6], out[b + 7] = t and 1 or 0, remaining,
        t and t - now or math.max(1, wait), reset, t or 0, held and ticket_of(held) or 0, t and 0 or who + (held and F_TICKET or 0)
    end
    for _, ts in pairs(caps) do -- (a read after load may find a state foreign)
      if st and ts.err then
        st = nil
      end
    end
    if st and not st.err then -- the writes, as the loop's
      local f = fs.f
      drop(fs.key, gone, had and had.W or 0)
      keep_queue(fs.key, f, fs.queued, fs.fresh)
      if st.dirty or fs.changed then
        local meta, kept = head, keep
        if f.W > 0 then
          meta, kept = head .. clock_line(f), math.max(keep, reach(f, f.Fmax) + 1000000)
        end
        save(st, KEYS[1], kept, meta ~= st.meta and meta or nil, keep <= 0)
      end
      for i, ts in pairs(caps) do
        if ts.dirty then
          local _, _, pk = report(ts, clim, now, 0)
          save(ts, KEYS[i], pk, ts.absent and chead or nil)
        end
      end
      return out
    end
  end
end

-- @cold: the request loop, for every call the fast paths did not decide.

-- read_head is parse_head with the parts always given, each with its limits (lim) and the
-- largest n they allow (cap): a head of calls alone is one part.
local function read_head(text)
  local lim, param, tag, parts, read = parse_head(text)
  parts = lim and (parts or {{unit = '', from = 1, to = #lim, head = read, lim = lim}})
  for i = 1, lim and #parts or 0 do
    parts[i].lim = parts[i].lim or {unpack(lim, parts[i].from, parts[i].to)}
    parts[i].cap = cap_of(parts[i].lim)
  end
  return lim, param, tag, parts
end

local given, param, tag, G = read_head(ARGV[1] or '')
if not given or nargv < 3 or nargv > 2 + MAX_REQUESTS then
  return redis.error_reply('JTARG head or request count')
end
local cparts, known = {}, {} -- the caps' parts; the units a cost may name: the group's and the caps'
if ARGV[2] ~= '' then
  local caps, _, ctag, parts = read_head(ARGV[2])
  if not caps or ctag ~= tag then
    return redis.error_reply('JTARG caps head')
  end
  cparts = parts
end
for i = 1, #G + #cparts do
  known[(G[i] or cparts[i - #G]).unit] = true
end
local k = nargv - 2
-- base is "{…}:", the tag of KEYS[1] ("{…}:l"): every key a request names, and each
-- unit's part, must be of its kind under it, so no request writes a key not its own.
local base = string.match(KEYS[1] or '', '^(.*:)l$')

-- The meta's lines (internal/protocol). parse_meta returns {head, pause (its end; 0 once
-- it has ended, as the writes drop it: a batch sees what calls one by one see), over = {end, set,
-- {{r, b}, ...}}, fair = {V, W, tV, Fmax}, drift = {at, head}, weights = {[name] = {end,
-- units}}}, or nil for a text not ours; format_meta writes it back, leaving out what no
-- longer matters (the drift line after DRIFT_SHOWN µs; the writes drop operators' weights).
local DRIFT_SHOWN = 60000000
local function parse_meta(text)
  local i = string.find(text, '\n', 1, true)
  local m = {head = i and string.sub(text, 1, i - 1) or text, pause = 0, weights = {}}
  while i and i < #text do -- (i: the newline before a line)
    local line, j = string.match(text, '^\n([^\n]*)()', i)
    local kind, ok = string.sub(line, 1, 1), false
    if kind == 'w' then -- the name may hold any bytes: its length says where it ends
      local e, u, n, at = string.match(text, '^\nw (%d+) (%d+) (%d+) ()', i)
      n = tonumber(n or '')
      ok = n and n >= 1 and n <= MAX_TENANT and at + n - 1 <= #text
      if ok then
        m.weights[string.sub(text, at, at + n - 1)], j = {tonumber(e), tonumber(u)}, at + n
      end
    elseif kind == 'p' then
      m.pause = tonumber(string.match(line, '^p (%d+)$') or '')
      ok = m.pause
      m.pause = ok and ok > now and ok or 0
    elseif kind == 'o' then -- its numbers: end and set, then rates 1..MAX_RATE, bursts 0..MAX_RATE
      local w = {}
      for f in string.gmatch(string.sub(line, 2), '%S+') do
        w[#w + 1] = int(f, 0, MAX_WAIT) or -1
      end
      m.over, ok = {w[1], w[2], {}}, #w >= 4 and #w % 2 == 0 and w[1] >= 0 and w[2] >= 0
      for r = 3, ok and #w or 0, 2 do
        ok = ok and w[r] >= 1 and w[r] <= MAX_RATE and w[r + 1] >= 0 and w[r + 1] <= MAX_RATE
        m.over[3][#m.over[3] + 1] = {w[r], w[r + 1]}
      end
    elseif kind == 'f' then
      m.fair = clock(line, 1)
      ok = m.fair
    elseif kind == 'd' then
      local at, head = string.match(line, '^d (%d+) (.+)$')
      ok, m.drift = at, {tonumber(at), head}
    end
    if not ok then
      return nil
    end
    i = j
  end
  return m
end

local function format_meta(m)
  local text, o, f, d, names = m.head, m.over, m.fair, m.drift, {}
  if m.pause > now then
    text = text .. string.format('\np %d', m.pause)
  end
  if o and o[1] > now then
    text = text .. string.format('\no %d %d', o[1], o[2])
    for _, rb in ipairs(o[3]) do
      text = text .. string.format(' %d %d', rb[1], rb[2])
    end
  end
  if f and f.W > 0 then
    text = text .. clock_line(f)
  end
  if d and d[1] > now - DRIFT_SHOWN then
    text = text .. string.format('\nd %d ', d[1]) .. d[2]
  end
  for name in pairs(m.weights) do -- in order: the same weights make the same text
    names[#names + 1] = name
  end
  table.sort(names)
  for _, name in ipairs(names) do
    local w = m.weights[name]
    text = text .. string.format('\nw %d %d %d ', w[1], w[2], #name) .. name
  end
  return text
end

-- with returns the limits l at the override's rates (nil: none): limit i (i <= #rates)
-- runs at its rate and burst (0: the rate; the bucket's capped at 2^50 / period), its
-- period kept; and whether a rate or a burst is lower than l's. in_force returns the
-- limits in force on l under the override over (nil: none), whether it lowers one, when
-- it ends (0: none). slice returns a part's share of a list over the head's limits.
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
local function in_force(l, over)
  if over and over[1] > now then
    local lim, lower = with(l, over[3])
    return lim, lower, over[1]
  end
  return l, false, 0
end
local function slice(l, p)
  return l and {unpack(l, p.from, p.to)}
end


-- parse_request reads a request's text (internal/protocol) into named fields (q.op, q.n,
-- ...), or returns nil and why. A cost goes to q.cost[unit] (a settle's actual to
-- q.actual[unit]); q.ctext is the costs' text as sent, which a task's record keeps.
local function parse_request(text)
  local t, w = string.find(text, ' t', 1, true), {nil, nil, nil, nil, nil, nil, nil, nil}
  for f in string.gmatch(t and string.sub(text, 1, t - 1) or text, '%S+') do
    w[#w + 1] = f
  end
  local op, nf = w[1], 3 -- (q made at its size for an acquire's fields, nil until read)
  local q = {op = op, tenant = t and string.sub(text, t + 2), ctext = '', n = nil, x = nil}
  if q.tenant and (#q.tenant < 1 or #q.tenant > MAX_TENANT) then
    return nil, 'tenant name of ' .. #q.tenant .. ' bytes'
  elseif op == OP_ACQUIRE or op == OP_CANCEL or op == OP_SETTLE then
    q.n, q.x = int(w[2], 0, MAX_RATE), int(w[3], 0, MAX_WAIT)
    if not q.n or not q.x then
      return nil, 'n or its second field'
    end
  elseif op == OP_PAUSE then
    q.x, nf = int(w[2], 1, MAX_PERIOD), 2
    if not q.x then
      return nil, 'pause length'
    end
  elseif op == OP_OVERRIDE then -- (no options)
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
    q.x, q.units = int(w[2], 0, MAX_PERIOD), int(w[3], 1, MAX_WEIGHT * 1000000)
    if not q.x or not q.units then
      return nil, 'weight'
    end
  elseif op == OP_INSPECT or op == OP_RESUME or op == OP_CLEAR then
    nf = 1
  else
    return nil, 'op'
  end
  local settle = op == OP_SETTLE
  for i = nf + 1, #w do
    local o, v = string.sub(w[i], 1, 1), string.sub(w[i], 2)
    if o == 'u' and (op == OP_ACQUIRE or op == OP_CANCEL or settle) then
      local unit, c, a = string.match(v, '^([^:]+):(%d+):?(%d*)$')
      c, a = int(c, 0, MAX_RATE), settle and int(a, 0, MAX_RATE) or a == '' and 0
      if not c or not a or not known[unit] or (q.cost and q.cost[unit]) then
        return nil, 'cost ' .. w[i] .. (unit and not known[unit] and ': no limit counts its unit' or '')
      end
      q.cost, q.actual = q.cost or {}, q.actual or {}
      q.cost[unit], q.actual[unit], q.ctext = c, a, q.ctext .. ' ' .. w[i]
    elseif o == 'h' and v == '' then
      q.hold = true
    elseif o == 'b' or o == 'c' or o == 'q' or o == 'e' then
      q[o] = int(v, 2, #KEYS)
      if not q[o] then
        return nil, 'key index ' .. w[i]
      end
    elseif o == 'l' or o == 'w' or o == 'k' then -- late, weight, ticket
      local f = o == 'l' and 'late' or o == 'w' and 'units' or 'ticket'
      q[f] = int(v, o == 'w' and 1 or 0, o == 'w' and MAX_WEIGHT * 1000000 or MAX_WAIT)
      if not q[f] then
        return nil, 'option ' .. w[i]
      end
    else
      return nil, 'option ' .. w[i]
    end
  end
  q.ticket = q.ticket and place_of(q.ticket)
  local tenant = q.tenant
  if (tenant and not q.q) or (q.q and not tenant and op ~= OP_INSPECT and op ~= OP_PAUSE) or (q.c and not tenant)
    or (q.late and not q.b) or ((q.units or q.ticket or q.hold) and op ~= OP_WEIGHT and not tenant)
    or (q.c and not cparts[1]) or (cparts[1] and tenant and not q.c and op ~= OP_WEIGHT) or (op == OP_WEIGHT and not tenant)
    or settle ~= (q.e ~= nil) or (settle and (q.b or not q.cost)) then
    return nil, 'options'
  end
  -- each key it names is of its kind (the caps of other units follow the tenant's state)
  local ok, b, e = not (q.b or q.q or q.c or q.e) or base, q.b and KEYS[q.b], q.e and KEYS[q.e]
  ok = ok and (not q.q or KEYS[q.q] == base .. 'q') and (not q.c or KEYS[q.c] == base .. 't:' .. tenant)
    and (not b or #b > #base + 3 and string.sub(b, 1, #base + 3) == base .. 'bk:')
    and (not e or #e > #base + 3 and string.sub(e, 1, #base + 3) == base .. 'st:')
  local u = q.c or 0
  for i = 1, q.c and #cparts or 0 do
    if cparts[i].unit ~= '' then
      u = u + 1
      ok = ok and KEYS[u] == base .. 'u:' .. cparts[i].unit .. ':' .. tenant
    end
  end
  if not ok then
    return nil, 'a key of another kind'
  end
  return q
end

local ops, ext = {}, {} -- each request's fields; its failure or detail (reply's extras)
do
  local seen = {} -- a batch's requests repeat: each text is read once
  for r = 1, k do
    local text = ARGV[r + 2]
    if seen[text] == nil then
      local q, why = parse_request(text)
      seen[text] = q or fail(E_ARG, 'JTARG ' .. why)
    end
    if seen[text].code then
      ext[r] = seen[text]
    else
      ops[r] = seen[text]
    end
  end
end

-- The group's state, read once, and its meta: a meta alone is any algorithm's (its head
-- becomes the callers'); another process's head of this algorithm's is drift, noted in
-- gst.found (the d line, the reply's end).
local gst, gfail = load(KEYS[1], ARGV[1])
if not gst then
  return reply({}, k, ext, foreign(KEYS[1], gfail or nil, TAGS))
end
local meta = {head = ARGV[1], pause = 0, weights = {}}
if gst.meta then
  meta = parse_meta(gst.meta)
  local stored = meta and string.match(meta.head, '^(%S+)')
  if not meta or not string.find(' sw sc tb fw ', ' ' .. (stored or '?') .. ' ', 1, true) then
    return reply({}, k, ext, fail(E_STATE, KEYS[1] .. ': not a jobthrottle meta'))
  elseif gst.bare then
    meta.head = ARGV[1]
  elseif stored ~= tag then
    return reply({}, k, ext, fail(E_ALG, stored .. ' ' .. KEYS[1]))
  end
end
local drift = meta.head ~= ARGV[1]
gst.found = drift and meta.head

-- setup_part counts a part's state st with p.lim, the limits in force (p.given the
-- callers'), from those the head of its meta (stored) has for the unit at
-- the override's rates (nil: none) to cwend; a state of a key of its own with another
-- head gets p.head when it is written. It returns the failure of such a state's head not
-- of this limiter's (the group's own state was checked: it counts with p.given then).
local function setup_part(p, st, stored, rates, cwend)
  local cw = with(p.given or p.lim, rates)
  if stored and stored ~= p.head then
    local l, _, t, ps = read_head(string.match(stored, '^[^\n]*'))
    if (not l or t ~= tag) and st ~= gst then
      return fail(E_STATE, p.key .. ': not a state of this limiter')
    end
    st.rehead = true
    for _, sp in ipairs(l and ps or {}) do
      if sp.unit == p.unit then
        cw = with(sp.lim, rates)
      end
    end
  end
  setup(st, p.lim, param, cw, cwend, p.given or p.lim, now)
  p.st = st
end

-- part_state reads and counts the state of a part with a key of its own (p.key: another
-- unit's of the group, a tenant's caps) into p.st: absent, or one whose meta is a head of
-- this algorithm's; or returns the failure.
local function part_state(p, rates, cwend)
  local st, why = load(p.key, p.head)
  if not st then
    return foreign(p.key, why or nil, TAGS)
  end
  st.costs = p.unit ~= '' -- (settles may come: the bucket keeps what refunds need)
  return setup_part(p, st, st.meta, rates, cwend)
end

-- The group's parts (G, read_head's), each with its state (docs/design.md, "Units and
-- settles"); each part's lim and given its share of the limits in force and the callers',
-- cap the largest n they allow. lim holds all the head's limits in force, lower and oend
-- are in_force's.
local lim, lower, oend = in_force(given, meta.over)
do
  local rates, cwend, u = meta.over and meta.over[3], meta.over and meta.over[1] or 0, 1
  for _, p in ipairs(G) do
    p.given, p.key = p.lim, KEYS[1]
    if lim ~= given then -- an override is in force
      p.lim = slice(lim, p)
      p.cap = cap_of(p.lim)
    end
    if p.unit == '' then
      p.head = ARGV[1]
      setup_part(p, gst, meta.head, slice(rates, p), cwend)
    else
      u = u + 1
      p.key = KEYS[u]
      if not base or p.key ~= base .. 'u:' .. p.unit then
        return redis.error_reply('JTARG the keys of the head\'s units')
      end
      local why = part_state(p, slice(rates, p), cwend)
      if why then
        return reply({}, k, ext, why)
      end
    end
  end
end
gst.nolim = G[1].st ~= gst -- it holds the meta alone
-- foreign_part returns the failure of a state of parts found foreign by a read after load.
local function foreign_part(parts)
  for i = 1, #parts do
    if parts[i].st.err then
      return fail(E_STATE, parts[i].st.err)
    end
  end
end
if foreign_part(G) then -- setup found the numbers foreign: no request can be decided on them
  return reply({}, k, ext, foreign_part(G))
end

-- The tenants' states, read once each: the parts of their caps, as the group's (cparts'
-- with st and key), the calls' at KEYS[i] and another unit's in the keys after it.
local tstates = {}
local function tenant_state(i)
  local ts = i and tstates[i] -- (i nil: no tenant's caps)
  if i and ts == nil then
    ts = {}
    for j = 1, #cparts do
      local p = cparts[j]
      ts[j] = {unit = p.unit, head = p.head, lim = p.lim, cap = p.cap, key = KEYS[i + j - (cparts[1].unit == '' and 1 or 0)]}
      local why = part_state(ts[j], nil, 0)
      if why then
        ts = why
        break
      end
    end
    tstates[i] = ts
  end
  local why = ts and (ts.code and ts or foreign_part(ts))
  return not why and ts, why
end

-- need returns the n request q takes from part p: n for calls, its cost in p's unit else
-- (costs: another set by unit, a settle's actual). cost_time is the time q's costs take
-- the group's limits, µs: the most of its parts' (n × its first limit's slot).
local function need(p, q, costs)
  costs = costs or q.cost
  return p.unit == '' and q.n or costs and costs[p.unit] or 0
end
local function cost_time(q, costs)
  local c = 0
  for i = 1, #G do
    c = math.max(c, need(G[i], q, costs) * G[i].lim[1][2] / G[i].lim[1][1])
  end
  return c
end

-- The fair share's clock (meta.fair: V, W in weight units (millionths), tV, Fmax; see
-- docs/design.md), moved to now once, by the first request that needs it; an inspect
-- (readonly) moves a copy and writes nothing. fs is the call's fair share (decide; fs.f
-- once the clock moved), its changed also saying that a control op changed the meta;
-- fair_key is the queue the writes keep (the clock moved, or a pause froze it). finish_of
-- returns member m's finish tag in the queue at qkey (false: none), read once a call.
-- ended_weights drops the operators' weights that ended with no place of their tenants'
-- under them in the queue at qkey (nil: no tenant is queued): moving the clock calls it,
-- and so does each request that writes while no tenant is queued (member says why they
-- stay).
local fs, fair_key = fair_share(), nil
local function finish_of(qkey, m)
  if fs.finish[m] == nil then
    fs.finish[m] = score(redis.call('ZSCORE', qkey, m) or nil) or false
  end
  return fs.finish[m]
end
local function ended_weights(qkey)
  for name, w in pairs(meta.weights) do
    if w[1] <= now and not (qkey and finish_of(qkey, string.format('%d ', w[2]) .. name)) then
      meta.weights[name], fs.changed = nil, true
    end
  end
end
local function fair(qkey, readonly)
  if fs.f then
    return fs.f
  end
  local had = meta.fair
  if readonly then
    return (walk(qkey, had))
  end
  local gone = move(fs, had, qkey)
  drop(qkey, gone, had and had.W or 0)
  ended_weights(qkey)
  -- (separate statements: common.lua says why)
  fair_key = qkey
  fs.passed = 0
  meta.fair = fs.f
  return fs.f
end

-- member returns a tenant's queue member, its weight in millionths (an operator's while it
-- lasts, else the caller's) and its finish tag in the queue at KEYS[q.q]. A tenant holds one
-- place, under its weight now: while an operator's weight is in the meta (in force, or ended
-- with a place under it, until its tenant's next request), the place the tenant holds under
-- the other of its weights (the caller's, the operator's) moves to it (rekey), so that the
-- requests it queued count with its weight now, not beside it; an inspect (readonly) reads
-- that place where it is.
local function member(q, readonly)
  local w, mine, qkey = meta.weights[q.tenant], q.units or 1000000, KEYS[q.q]
  local u = w and w[1] > now and w[2] or mine
  local name = string.format('%d ', u) .. q.tenant
  local F = finish_of(qkey, name)
  local old = w and string.format('%d ', u == mine and w[2] or mine) .. q.tenant
  local F0 = old and old ~= name and finish_of(qkey, old)
  if F0 then
    F = readonly and math.max(F or F0, F0) or rekey(fs, old, F0, name, F, u)
  end
  if w and w[1] <= now and not readonly then -- ended: no place of the tenant's is under it now
    meta.weights[q.tenant], fs.changed = nil, true
  end
  return name, u, F
end

-- queue_foreign returns the failure of the fair share's key KEYS[i] when it holds another
-- type than a sorted set (read once), else nil: a request that names it checks it first.
local queue_why = {}
local function queue_foreign(i)
  if i and queue_why[i] == nil then
    queue_why[i] = select(2, read_key('sorted set', 'ZCARD', KEYS[i])) or false
  end
  return i and queue_why[i] or nil
end


-- kept_us is how long the state lives from now, its data mattering data µs: until neither its data
-- nor a line of its meta matters. The writes set it; an inspect after them reports it.
local function kept_us(data)
  local d = gst.found and now or meta.drift and meta.drift[1] -- (the writes note a head found)
  local kept = math.max(data, meta.pause - now, oend - now, d and d + DRIFT_SHOWN - now or 0)
  for _, w in pairs(meta.weights) do
    kept = math.max(kept, w[1] - now)
  end
  local f = meta.fair
  if f and f.W > 0 then -- the clock lives while tenants are queued
    kept = math.max(kept, reach(f, f.Fmax) + 1000000)
  end
  return kept
end

-- dirty says the call changed the group's state: its meta or a part's data; data_keep how
-- long the group's data matters, µs: the longest of its parts' (each part's in p.keep).
local function dirty()
  for i = 1, #G do
    if G[i].st.dirty then
      return true
    end
  end
  return fs.changed
end
local function data_keep()
  local data = 0
  for i = 1, #G do
    local _, _, pk = report(G[i].st, G[i].lim, now, oend)
    G[i].keep, data = pk, math.max(data, pk)
  end
  return data
end

-- A task's record, {…}:bk:<id>: a booking "<token> <n> <stamp>[<costs>]" (n permits and
-- the costs its acquire sent, booked at token, held by the caller that got stamp), or a
-- ticket "t <ticket> <n>[<costs>]" (its tenant's place, ticket_of's, held while the task
-- is handed back). record reads KEYS[i]'s once per call: {token, n, stamp, costs}, or
-- {ticket = S, n = n, ctext = costs}, false when the key is absent; or nil and the
-- failure. put sets the record to write there (false: delete it).
local books, booked = {}, {}
local function record(i)
  if books[i] == nil then
    local v, why = read_key('string', 'GET', KEYS[i])
    if why then
      return nil, why
    end
    local a, b, c, costs = string.match(v or '', '^(%d+) (%d+) (%d+)(.*)$')
    local ticket = not a and v
    if ticket then
      a, b, costs = string.match(v, '^t (%d+) (%d+)(.*)$')
    end
    if v and (not a or #a > 16 or #b > 16 or (c and #c > 16) or (string.gsub(costs, ' u[%l%d_.%-]+:%d+', '')) ~= '') then
      return nil, fail(E_STATE, KEYS[i] .. ': not a booking')
    end
    books[i] = v and (ticket and {ticket = place_of(tonumber(a)), n = tonumber(b), ctext = costs}
      or {tonumber(a), tonumber(b), tonumber(c), costs}) or false
  end
  return books[i]
end
local function put(i, rec)
  books[i], booked[#booked + 1] = rec, i
end

local out, wakes, remaining, reset = {}, {}, nil, nil
-- served: a request other than an inspect succeeded; else the call writes nothing, as its
-- requests (an inspect writes nothing, not even the state's upkeep)
local served = false

-- answer sets request r's reply. report's figures on the group (its first part) are read
-- once while they hold (take, give and rates change them: remaining = nil).
local function answer(r, a, b, c, d, e, f, g)
  local o = WIDTH * r - WIDTH
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6], out[o + 7] = a, b, c, d, e, f, g
end
local function group_report()
  if not remaining then
    remaining, reset = report(G[1].st, G[1].lim, now, oend)
  end
  return meta.pause > now and 0 or remaining -- (0 while paused)
end

-- takes returns what request q takes, as st, lim, n of each part of the group and then of
-- its caps C (nil: none) that it takes anything from, in a row (P.group: the group's
-- count); exceeds the failure of a request above what the limits in force or the caps can
-- ever grant, if it is.
local function takes(q, C)
  local P = {nil, nil, nil, nil, nil, nil, group = false} -- (made at its size for a part of each)
  for i = 1, #G + (C and #C or 0) do
    local p = G[i] or C[i - #G]
    local n = need(p, q)
    if n > 0 then
      P[#P + 1], P[#P + 2], P[#P + 3] = p.st, p.lim, n
    end
    P.group = P.group or i == #G and #P / 3
  end
  return P
end
local function exceeds(q)
  for i = 1, #G + (q.c and #cparts or 0) do
    local p = G[i] or cparts[i - #G]
    if need(p, q) > p.cap then
      return fail(E_EXCEEDS, 'JTEXCEEDS n above what the limits in force or the caps can grant')
    end
  end
end

-- acquire decides request r, q an acquire; it returns its failure, if any. It books n at
-- the earliest time every part has room from t0 (now, or a pause's end) if that comes
-- within its max wait, else it is denied with the wait until n fits. A task's booking
-- found (b) is the caller's to use again when it books the same n and costs, its token at
-- most q.late µs past and no pause in force after it (status 2, a new stamp above the last); one an
-- override set since lowers a limit under is given back and booked anew. A tenant's
-- request also waits for its fair turn (docs/design.md, "Tenants and the fair share"); with
-- h it takes its place when denied.
local function acquire(r, q)
  local n, x, pause, ctext, why = q.n, q.x, meta.pause, q.ctext, exceeds(q)
  why = why or queue_foreign(q.q)
  if why then
    return why
  end
  local flags = (drift and F_DRIFT or 0) + (pause > now and F_PAUSED or 0)
  local rec, last, replace, C = false, 0, false, nil
  if q.b then
    rec, why = record(q.b)
    if rec == nil then
      return why
    end
    if rec and not rec.ticket then -- a booking: found, if it is still the caller's to use
      last = rec[3]
      if rec[2] == n and rec[4] == ctext and rec[1] >= now - (q.late or 0) and pause <= rec[1] then
        replace = lower and meta.over[2] > rec[3]
        if not replace then
          local stamp = math.max(now, last + 1)
          put(q.b, {rec[1], n, stamp, ctext})
          local rem = group_report()
          answer(r, 2, rem, math.max(0, rec[1] - now), reset, rec[1], stamp, flags)
          return
        end
      end
    end
  end
  C, why = tenant_state(q.c)
  if why then
    return why
  end
  local P = takes(q, C)
  if replace then -- an override set since lowers the limits: the booking goes back
    for i = 1, #P, 3 do
      give(P[i], P[i + 1], P[i + 2], rec[1], now)
    end
    remaining = nil
  end
  local h, d = nil, nil
  if #P > 0 and (q.tenant or (q.cost and not q.b)) then
    -- a tenant's request books no further ahead than the horizon h (two of the group's slots
    -- at least, and its cost's time), nor does a caller's call of estimated costs: held
    -- further, its estimate would keep room that the refunds of the settles before it free (a
    -- task's booking, handed back to its queue, is kept however far)
    local ct = cost_time(q)
    h = math.max(HORIZON, 2 * lim[1][2] / lim[1][1], ct)
    if q.tenant then
      fair(KEYS[q.q])
      local m, u, F = member(q)
      d = {m = m, u = u, F = F, ct = ct, hold = q.hold, task = q.b ~= nil,
        ticket = q.ticket or (rec and rec.ticket and rec.n == n and rec.ctext == ctext and rec.ticket) or nil}
    end
  end
  local t, wait, who, held = decide(P, P.group, math.max(now, pause), x, h, fs, d)
  if not t then
    if replace then -- its permits were given back: a denial keeps no booking (a hold, its ticket)
      put(q.b, false)
    end
    if held and q.b then -- (the place as the record keeps it: a ticket's digits)
      put(q.b, {ticket = place_of(ticket_of(held)), n = n, due = wait, ctext = ctext})
    end
    local rem = group_report()
    answer(r, 0, rem, math.max(1, wait), reset, 0, held and ticket_of(held) or 0,
      flags + who + (held and F_TICKET or 0))
    return
  end
  if #P > 0 then
    remaining = nil
  end
  local stamp = 0
  if replace then
    last = math.max(last, meta.over[2])
  end
  if q.b and #P > 0 and t > now then
    stamp = math.max(now, last + 1)
    put(q.b, {t, n, stamp, ctext})
  elseif q.b and rec then
    put(q.b, false)
  end
  local rem = group_report()
  answer(r, 1, rem, t - now, reset, #P > 0 and t or 0, stamp, flags)
end

-- cancel decides request r, q a cancel: n permits (and its costs) booked at q.x (with b,
-- q.x is the booking's stamp: the caller still holds it), given back on the group and the
-- tenant's caps; with k, the place the caller held in its tenant's queue (x is 0).
local function cancel(r, q)
  local token, C, why = q.x, nil, queue_foreign(q.q)
  if why then
    return why
  end
  if q.ticket then
    fair(KEYS[q.q])
    local name, u, F = member(q)
    unqueue(fs, name, u, F, q.ticket, cost_time(q))
  end
  if q.b then
    local rec
    rec, why = record(q.b)
    if rec == nil then
      return why
    end
    token = 0
    if rec and not rec.ticket and rec[2] == q.n and rec[4] == q.ctext and q.x > 0 and rec[3] == q.x then
      token = rec[1]
      put(q.b, false)
    end
  end
  C, why = tenant_state(q.c)
  if why then
    return why
  end
  local freed, P = 0, token > 0 and takes(q, C) or {}
  for i = 1, #P, 3 do
    if give(P[i], P[i + 1], P[i + 2], token, now) == 1 and i <= 3 * P.group then
      freed = 1
      remaining = nil
    end
  end
  group_report()
  answer(r, freed, 0, 0, reset, q.b and token or 0, 0, 0)
end

-- settle makes request r, q a settle of a grant at token q.x whose costs q.cost were an
-- estimate: each part of a unit it names is charged the actual's difference at the
-- grant's place (adjust), once per record key (e): a record found says it was (2); a
-- grant no limit counts any more (each limit's period after it; the bucket's: until full
-- again) is left alone (3). A tenant's finish tag moves by the difference in the cost's
-- time.
local function settle(r, q)
  local key, token, why = KEYS[q.e], q.x, queue_foreign(q.q)
  local v, C = nil, nil
  if not why then
    v, why = read_key('string', 'GET', key)
  end
  if not why then
    C, why = tenant_state(q.c)
  end
  if why then
    return why
  end
  local span, status = 0, 3 -- how long the grant counts
  for i = 1, #G + (C and #C or 0) do
    for _, l in ipairs((G[i] or C[i - #G]).lim) do
      span = math.max(span, l[3] and math.ceil(l[3] * l[2] / l[1]) or l[2])
    end
  end
  if v then
    status = 2
  elseif token + span > now then
    status = 1
    for i = 1, #G + (C and #C or 0) do
      local p = G[i] or C[i - #G]
      local d = q.actual[p.unit] and q.actual[p.unit] - q.cost[p.unit]
      if d and d ~= 0 then
        adjust(p.st, p.lim, d, token, now)
      end
    end
    if q.tenant then
      local dc, f = cost_time(q, q.actual) - cost_time(q), fair(KEYS[q.q])
      local name, u, F = member(q)
      if F and F > f.V and dc ~= 0 then -- queued: its finish tag moves by the difference
        queue(fs, name, math.max(f.V, F + dc * 1000000 / u), f.W)
      elseif (not F or F <= f.V) and dc > 0 then -- the debt queues it
        queue(fs, name, f.V + dc * 1000000 / u, f.W + u)
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
-- paused_us, pttl_ms, override_us, pause_end (0: not paused), then rate, capacity,
-- available per limit; then, with
-- the fair share's key: for a tenant, its place (µs until the clock reaches its finish
-- tag, reach: a pause's rest included; -1 when it has nothing queued), its weight units (an operator's while it lasts)
-- and each cap's capacity and available; for the
-- group, its weight in the queue (W, millionths) and k, then per tenant of the k (at
-- most 10) with the most queued its place, its weight units, its name's length and bytes.
local function inspect(r, q)
  local why, pause = queue_foreign(q.q), meta.pause
  if why then
    return why
  end
  local t = fit(G[1].st, G[1].lim, 1, math.max(now, pause), now) -- one of the first part
  local rem = group_report()
  local b, ahead = detail(G[1].st, G[1].lim, now)
  local kept = served and dirty() and kept_us(data_keep()) -- what the call's writes will set
  local pttl = not kept and redis.call('PTTL', KEYS[1]) or kept > 0 and math.ceil(kept / 1000) or -2
  local d = {b, ahead, math.max(0, pause - now), pttl, math.max(0, oend - now), pause > now and pause or 0}
  local f = q.q and fair(KEYS[q.q], true)
  local function limits(parts, rate) -- each limit's [rate,] capacity and available
    for _, p in ipairs(parts) do
      local _, _, avail = detail(p.st, p.lim, now)
      for i = 1, #p.lim do
        if rate then
          d[#d + 1] = p.lim[i][1]
        end
        d[#d + 1], d[#d + 2] = p.lim[i][CAP], avail[i]
      end
    end
  end
  limits(G, true)
  if q.tenant then
    local _, u, F = member(q, true)
    d[#d + 1], d[#d + 2] = (F and F > f.V) and reach(f, F) or -1, u
    if q.c then
      local C
      C, why = tenant_state(q.c)
      if not C then
        return why
      end
      t = math.max(t, fit(C[1].st, C[1].lim, 1, t, now))
      limits(C)
    end
  elseif f then
    local top = redis.call('ZREVRANGE', KEYS[q.q], '0', '9', 'WITHSCORES')
    d[#d + 1], d[#d + 2] = f.W, #top / 2
    for i = 1, #top, 2 do
      local u, name = string.match(top[i], '^(%d+) (.*)$')
      name = name or ''
      local F = score(top[i + 1])
      d[#d + 1], d[#d + 2], d[#d + 3] = F > f.V and reach(f, F) or 0, tonumber(u) or 0, #name
      for j = 1, #name do
        d[#d + 1] = string.byte(name, j)
      end
    end
  end
  ext[r] = d
  answer(r, 1, rem, t - now, reset, 0, 0, (drift and F_DRIFT or 0) + (pause > now and F_PAUSED or 0))
end

-- control makes request r, a pause, resume, override, clear or a tenant's weight. A pause
-- books nothing before its end (a longer one set is kept) and publishes "p <pause_end>",
-- the end in force, on {…}:wake; resume ends it and publishes "r <pause_end>". An override
-- runs limit i (i <= m) at the rate and burst given until it ends, periods kept.
local function control(r, q)
  local op, ended = q.op, 0
  if op == OP_PAUSE then
    meta.pause = math.max(meta.pause, now + q.x)
    wakes[#wakes + 1] = string.format('p %d', meta.pause) -- the end in force
    if meta.fair and meta.fair.W > 0 then -- no service while paused: the fair clock waits
      meta.fair.tV = math.max(meta.fair.tV, meta.pause)
      if q.q and not queue_foreign(q.q) then -- and the queue lives as long as it (if ours)
        local first = redis.call('ZRANGE', KEYS[q.q], '0', '0')[1]
        if not first or string.find(first, '^%d+ .') then
          fair_key = KEYS[q.q]
        end
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
  elseif op == OP_WEIGHT then -- (a cleared weight ends now, and stays while a place is under it)
    local w = meta.weights[q.tenant]
    local old = w and q.q and not queue_foreign(q.q) and string.format('%d ', w[2]) .. q.tenant
    if old and finish_of(KEYS[q.q], old) then -- (the queue holds a place of ours)
      fair(KEYS[q.q])
    end
    local held = old and fs.f and finish_of(KEYS[q.q], old)
    meta.weights[q.tenant] = q.x > 0 and {now + q.x, q.units} or held and {math.min(w[1], now), w[2]} or nil
    if held and q.x > 0 then -- the place under the weight replaced moves now
      member({tenant = q.tenant, units = w[2], q = q.q})
    end
  else
    meta.over = op == OP_OVERRIDE and {now + (q.x > 0 and q.x or MAX_PERIOD), now, q.rates} or nil
    lim, lower, oend = in_force(given, meta.over)
    for _, p in ipairs(G) do
      p.lim = slice(lim, p)
      p.cap = cap_of(p.lim)
      rates(p.st, p.lim, now)
    end
    remaining = nil
  end
  fs.changed = true
  answer(r, 1, 0, math.max(0, meta.pause - now), math.max(0, oend - now), ended, 0, 0)
end

for r = 1, k do
  local q = ops[r]
  if q and not ext[r] then
    local op = q.op
    local why = (op == OP_ACQUIRE and acquire or op == OP_CANCEL and cancel or op == OP_INSPECT and inspect
      or op == OP_SETTLE and settle or control)(r, q)
    ext[r], served = why or ext[r], served or (not why and op ~= OP_INSPECT)
    if not why and op ~= OP_INSPECT and not (meta.fair and meta.fair.W > 0) then
      ended_weights(nil) -- (after each request that writes, as lone calls drop them)
    end
  end
  if foreign_part(G) then -- a read after load found the state foreign: it fails every request
    return reply({}, k, {}, foreign_part(G))
  end
  -- a state the call writes (once a request succeeded) gets the caller's head: no drift
  -- for the requests after that, as for lone calls after one that wrote
  drift = drift and not (served and dirty())
end

-- Writes, after every read and check, when a request other than an inspect succeeded: what
-- lives is kept until it no longer matters.
if served then
  local kept, f = kept_us(data_keep()), meta.fair
  if f and fair_key then -- (queued only after the clock moved)
    keep_queue(fair_key, f, fs.queued, fs.fresh, fs.removed)
  end
  if dirty() then
    -- a head replaced (another process's, with other limits) is noted
    meta.drift, meta.head = gst.found and {now, gst.found} or meta.drift, ARGV[1]
    local text = format_meta(meta)
    save(gst, KEYS[1], kept, text ~= gst.meta and text or nil, gst.nolim or G[1].keep <= 0)
  end
  tstates[0] = G -- (and the group's parts: those with a key of their own have their heads as metas)
  for _, parts in pairs(tstates) do
    for i = 1, parts.code and 0 or #parts do
      local p = parts[i]
      if p.st ~= gst and p.st.dirty and not p.st.err then
        local _, _, pk = report(p.st, p.lim, now, parts == G and oend or 0)
        save(p.st, p.key, pk, (p.st.absent or p.st.rehead) and p.head or nil)
      end
    end
  end
  for j = 1, #booked do
    local i, rec = booked[j], books[booked[j]]
    if rec and rec.ticket then -- a task handed back keeps its place while it may still come
      redis.call('SET', KEYS[i], string.format('t %d %d', ticket_of(rec.ticket), rec.n) .. rec.ctext,
        'PX', ms(rec.due + 60000000))
    elseif rec then
      redis.call('SET', KEYS[i], string.format('%d %d %d', rec[1], rec[2], rec[3]) .. rec[4],
        'PX', ms(math.max(rec[1] - now, 0) + 1000000))
    elseif rec == false then
      redis.call('DEL', KEYS[i])
    end
    books[i] = nil
  end
  for i = 1, #wakes do
    redis.call('PUBLISH', (string.match(KEYS[1], '^(.*:)') or '') .. 'wake', wakes[i])
  end
end
reply(out, k, ext)
if gst.found then -- the reply ends with the head found, its bytes then their count
  for i = 1, #gst.found do
    out[#out + 1] = string.byte(gst.found, i)
  end
  out[#out + 1] = #gst.found
end
return out
