-- floor32.lua: the commands a call of tenants' acquires makes (ir.sh's batch case of
-- cases.sh: KEYS {b}:l, {b}:q, then each tenant's state), with nothing computed or checked:
-- TIME, the group's GET and SET, each tenant's GET, ZSCORE and SET, one ZADD of all their
-- finish tags (fractional, as the fair share's are), the queue's PEXPIRE. The floor of the
-- present layout for a tenants' batch (bench/RESULTS.md, "A batch's turns"):
--   ir.sh floor32.lua 30 34 '{b}:l' '{b}:q' {b}:t:t0 ... {b}:t:t31 HEAD CAPS REQUESTS...
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
redis.call('GET', KEYS[1])
local z = {}
for i = 3, #KEYS do
  redis.call('GET', KEYS[i])
  redis.call('ZSCORE', KEYS[2], '1000000 t' .. i)
  redis.call('SET', KEYS[i], string.format('%d %d %d\ntb 100000000 1000000 100000000', now, 99000000, 0), 'PX', '1000')
  z[#z + 1], z[#z + 2] = string.format('%.17g', now / 7 + i / 3), '1000000 t' .. i
end
redis.call('ZADD', KEYS[2], unpack(z))
redis.call('PEXPIRE', KEYS[2], '2000')
redis.call('SET', KEYS[1], string.format('%d %d %d\ntb 1000000000 1000000 1000000000\nf %.17g %d %d %.17g', now, 99, 0,
  now / 7, 32000000, now, now / 7 + 11), 'PX', '1000')
return 1
