-- inspectlog.lua: the read-only view of a permit log (log.lua) that inspect_sw.lua and
-- inspect_sc.lua return; lua.go puts it after prelude.lua and log.lua.

-- jt_inspect_log reads the log in key and the pause in pause_key for limits
-- (limits[i] = {rate, period_us}) by the server clock and writes nothing. prec is
-- jt_log's: 0 for the exact log, the sub-bucket width (µs) for the counter; over is
-- when an override of the limits ends (0: none). It returns the reply inspect_sw.lua's
-- header describes.
local function jt_inspect_log(key, pause_key, prec, limits, over)
  local m, rmin, pmax = #limits, lg_span(limits)
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
  local remaining = lg_remaining(limits, rmin, prec, paused, now)
  local reset, booked, ahead = 0, 0, 0
  if lg_E ~= 0 then
    reset = math.max(0, lg_Tlast + pmax - now)
    -- booked: permits whose (sub-bucket) time starts after now
    booked = lg_P - lg_S(lg_last_at_or_before(now + prec))
    if booked > 0 then
      ahead = lg_Tlast - prec - now
    end
  end
  return jt_inspect_reply(key, now, remaining, t, reset, booked, ahead, paused, over, limits, 1, avail)
end
