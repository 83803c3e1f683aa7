-- inspect.lua: the reply of every limiter's inspect script (inspect_sw.lua's header
-- describes it); lua.go puts it after the helpers in front of inspect_sw.lua,
-- inspect_sc.lua (with inspectlog.lua), inspect_tb.lua and inspect_fw.lua.

-- jt_inspect_reply returns {remaining, next_us, reset_us, booked, ahead_us,
-- paused_us, pttl_ms, override_us} for key at now (t: when an acquire of one permit
-- would take effect; paused and over: when the pause and the override end), then for
-- each limit its rate, its cap (limits[i][cap]: 1 its rate, 3 its burst) and avail[i].
local function jt_inspect_reply(key, now, remaining, t, reset, booked, ahead, paused, over, limits, cap, avail)
  local reply = {math.max(0, remaining), t - now, reset, booked, ahead,
    math.max(0, paused - now), redis.call('PTTL', key), math.max(0, over - now)}
  for i = 1, #limits do
    reply[6 + 3 * i] = limits[i][1]
    reply[7 + 3 * i] = limits[i][cap]
    reply[8 + 3 * i] = avail[i]
  end
  return reply
end
