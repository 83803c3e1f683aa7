-- inspectlog.lua: the read-only view of a permit log (log.lua) that inspect_sw.lua and
-- inspect_sc.lua return; lua.go puts it after prelude.lua and log.lua.

-- jt_inspect_log reads the log in key and the pause in pause_key for limits
-- (limits[i] = {rate, period_us}) by the server clock and writes nothing. prec is
-- jt_log's: 0 for the exact log, the sub-bucket width (µs) for the counter; over is
-- when an override of the limits ends (0: none). It returns the reply inspect_sw.lua's
-- header describes.
local function jt_inspect_log(key, pause_key, prec, limits, over)
  local m, pmax, rmin = #limits, 0, JT_MAX_RATE
  for i = 1, m do
    rmin = math.min(rmin, limits[i][1])
    pmax = math.max(pmax, limits[i][2])
  end
  local now = jt_now()
  lg_load(key)
  local paused = jt_pause(pause_key)

  -- next: when an acquire of one permit would take effect (jt_log's rule, n = 1)
  local t = math.max(now, paused)
  if lg_E ~= 0 then
    t = math.max(t, lg_Tlast - prec)
  end
  for i = 1, m do
    local q = lg_P + 1 - limits[i][1]
    if q > lg_base then
      t = math.max(t, lg_T(lg_first_count_at_least(q)) + limits[i][2])
    end
  end

  -- avail: per limit, rate less the permits holding a place in the window that ends
  -- now, bookings included (negative when bookings reach further than one window)
  local avail = {}
  for i = 1, m do
    avail[i] = limits[i][1] - lg_in_window(now - limits[i][2])
  end
  local remaining = 0
  if paused > now then
    remaining = 0
  elseif lg_E == 0 then
    remaining = rmin
  elseif lg_Tlast - prec <= now then
    remaining = rmin
    for i = 1, m do
      remaining = math.min(remaining, avail[i])
    end
    remaining = math.max(0, remaining)
  end
  local reset, booked, ahead = 0, 0, 0
  if lg_E ~= 0 then
    reset = math.max(0, lg_Tlast + pmax - now)
    -- booked: permits whose (sub-bucket) time starts after now
    booked = lg_P - lg_S(lg_last_at_or_before(now + prec))
    if booked > 0 then
      ahead = lg_Tlast - prec - now
    end
  end
  local reply = {remaining, t - now, reset, booked, ahead, math.max(0, paused - now),
    redis.call('PTTL', key), math.max(0, over - now)}
  for i = 1, m do
    reply[6 + 3 * i] = limits[i][1]
    reply[7 + 3 * i] = limits[i][1]
    reply[8 + 3 * i] = avail[i]
  end
  return reply
end
