-- faststring.lua: the state read of the fast paths whose state is one string (the
-- token bucket's and the fixed window's); lua.go puts it after fast.lua. When
-- fast.lua takes the call, it reads the state key and the control key with one MGET,
-- and the clock.
--   jf_v     the state key's text, or false: there is none, and no other algorithm's
--            state key (KEYS[3..]) exists; nil: leave the call to the full script
--            (the control key exists: a pause or an override; or another
--            algorithm's state, or a key of another type, is there)
--   jf_now   the server time (µs), when jf_v is not nil
local jf_v, jf_now
do
  local s = jf_k and redis.call('MGET', jf_K[1], jf_K[2])
  if s and not s[2] then
    jf_v = s[1]
    if not jf_v and redis.call('EXISTS', jf_K[1], unpack(jf_K, 3)) ~= 0 then jf_v = nil end
    if jf_v ~= nil then
      local t = redis.call('TIME')
      jf_now = t[1] * 1000000 + t[2]
    end
  end
end
