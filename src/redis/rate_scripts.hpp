// redis/rate_scripts.hpp — the rate-limit Lua scripts
// (src/redis/scripts/ratelimit/*.lua, embedded at build time with their own
// lib.lua: the five algorithms, a port of src/core/rate_math.cpp).
#pragma once

#include "redis/scripts.hpp"

namespace fairgate::redis::scripts {
/// One decision over N rules, atomically (rl_decide.lua).
extern const Script kRlDecide;
/// A refund (rl_refund.lua).
extern const Script kRlRefund;
}  // namespace fairgate::redis::scripts
