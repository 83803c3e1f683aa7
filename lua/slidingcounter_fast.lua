-- slidingcounter_fast.lua: the sliding counter's fast path is log_fast.lua's, on the
-- log of sub-buckets (lua.go puts fast.lua, this and log_fast.lua first in its
-- script).
local lf_counter = true -- the limit's fields are bucket_us, rate, period_us
