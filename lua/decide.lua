-- decide.lua: the body of the two limiter scripts whose state is one short string,
-- gcra.lua (token bucket) and fixedwindow.lua (fixed window). Their headers are its
-- contract; lua.go puts this after the algorithm's file, which defines what differs
-- between them (the al_* functions below), and wraps it as jt_one (see batch.lua).
-- The steps are the same for both: check the arguments; answer a task's booking
-- (jt_claim; first giving back one an override overtook); read the state; cancel, or find the earliest time n permits fit, at or
-- after the latest grant and any pause; deny when that is further than max_wait; else
-- book and write. The algorithm's file defines
--   AL_WIDTH                  the integers per limit in ARGV (see jt_args)
--   al_maxwait(limits, x)     the longest wait an acquire may book ahead: x, or less
--   al_load(key, limits, now) v, L, s: the stored text (nil: absent), when the latest
--                             grant takes or took effect, and the algorithm's own state
--   al_cancel(key, limits, v, L, s, x, n, now)  gives back what the grant of token x
--                             held, writing the state if anything was; returns 1 if
--                             so, else 0 (called only with state and x in the future)
--   al_earliest(limits, v, L, s, t, n, now)  the earliest time at or after t when n
--                             permits fit (n >= 1)
--   al_take(key, limits, v, L, s, t, wait, n, now)  books n permits at t (wait after
--                             now) and writes the state, which then holds L = t and s
--                             as updated in place
--   al_report(limits, v, L, s, now, paused)  remaining and reset_us for the reply
local op, n, x, limits = jt_limiter(5, AL_WIDTH)
if not op then
  return redis.error_reply(n)
end
if op == 0 then
  x = al_maxwait(limits, x)
end

local key = KEYS[1]
local now = jt_now()
local claimed
claimed, x = jt_claim(n, now, KEYS[2], x)
if claimed then
  return claimed
end
if jt_bk_give and jt_bk_give > now then -- an override overtook the booking: give it back
  local g = jt_ov_given
  local gv, gL, gs = al_load(key, g, now)
  if gv then al_cancel(key, g, gv, gL, gs, jt_bk_give, n, now) end
end
local v, L, s = al_load(key, limits, now)
local paused = jt_pause(KEYS[2])

if op == 1 then
  local freed = 0
  if v and x > now then
    freed = al_cancel(key, limits, v, L, s, x, n, now)
  end
  local _, reset = al_report(limits, v, L, s, now, paused)
  return jt_booked({freed, 0, 0, reset, 0}, n)
end

local t = math.max(now, paused, L)
if n > 0 then
  t = al_earliest(limits, v, L, s, t, n, now)
end
local wait = t - now
if n == 0 then wait = 0 end
if wait > x then
  local remaining, reset = al_report(limits, v, L, s, now, paused)
  return jt_booked({0, remaining, wait, reset, 0}, n)
end
if n == 0 then
  local remaining, reset = al_report(limits, v, L, s, now, paused)
  return jt_booked({1, remaining, 0, reset, 0}, n)
end
al_take(key, limits, v, L, s, t, wait, n, now)
local remaining, reset = al_report(limits, true, t, s, now, paused)
return jt_booked({1, remaining, wait, reset, t}, n)
