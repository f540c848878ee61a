-- release.lua — a holder returns its permit; the next waiter gets it at once.
-- KEYS: see lib.lua.  ARGV[2] permit id "inst|n", ARGV[3] its tenant (optional:
-- absent = read it from the holder member, or ptenant for a member of an earlier format).
-- Returns {released (1|0), grants made}. Releasing twice is harmless (0).
-- Measures the pace (F7): see pace_on_release in lib.lua.
local now = now_ms()
local cfg = load_cfg()
if holder_remove(cfg, ARGV[2], ARGV[3]) == 0 then return {0, 0} end
local granted, holders = dispatch(cfg, now)
if cfg then pace_on_release(cfg, now, cfg.enabled and holders >= cfg.max) end
return {1, granted}
