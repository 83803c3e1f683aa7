-- controlwrite.lua: writing the control key (see prelude.lua, jt_control); lua.go puts
-- it after prelude.lua in front of pause.lua and control.lua, the scripts that write
-- that key (a limiter script only reads it, and a script makes every function it
-- defines anew on each run).

-- jt_control_write writes the control key: the pause's end and the override read or
-- set in this call (jt_ctl_over, with its set time when it has one), with PX until the later of the two ends, or deletes
-- the key when neither lies ahead.
local function jt_control_write(key, pause, now)
  local over = jt_ctl_over
  if over and over[1] <= now then over = nil end
  local till = math.max(pause, over and over[1] or 0)
  if till <= now then
    redis.call('DEL', key)
    return
  end
  local text = string.format('%d', math.max(pause, 0))
  if over then
    local parts = {text, string.format('%d', over[1]), string.format('%d', #over[2])}
    for i, o in ipairs(over[2]) do
      parts[#parts + 1] = string.format('%d %d', o[1], o[2])
    end
    if over[3] then parts[#parts + 1] = string.format('%d', over[3]) end
    text = table.concat(parts, ' ')
  end
  redis.call('SET', key, text, 'PX', jt_ms(till - now))
end
