-- slidingwindow_fast.lua: the sliding window's fast path is log_fast.lua's, on the
-- exact log (lua.go puts fast.lua, this and log_fast.lua first in its script).
local lf_counter = false -- the limit's fields are rate, period_us
