-- release.lua — a holder returns its permit; the next waiter gets it at once.
-- KEYS: see lib.lua.  ARGV[2] permit id "inst|n"
-- Returns {released (1|0), grants made}. Releasing twice is harmless (0).
local now = now_ms()
if redis.call('ZREM', K_HOLDERS, ARGV[2]) == 0 then return {0, 0} end
return {1, (dispatch(load_cfg(), now))}
