// cli/duration.hpp — durations on the command line (docs/api.md: "Durations on the
// command line take a unit: 250ms, 20s, 5m").
#pragma once

#include "cli/parse.hpp"

#include <chrono>
#include <string>
#include <string_view>

namespace fairgate::cli {

/// The largest duration parse_duration accepts (callers check their own,
/// usually much smaller, bounds).
inline constexpr std::chrono::milliseconds kMaxDuration = std::chrono::hours(24 * 365);

/// Reads a duration with a unit: "250ms", "20s", "5m", "1h", a decimal
/// ("1.5s", "0.25m") or a sum of parts ("1m30s", "1h15m"). Units: ms, s, m, h.
/// A bare "0" is accepted; any other number needs a unit. Precision is 1 ms:
/// "1.5ms" is an error, as are signs, spaces and unknown units.
/// Errors name the problem, e.g. `unknown unit "parsecs" in "5parsecs" (use ms, s, m or h: 250ms, 20s, 5m)`.
Parsed<std::chrono::milliseconds> parse_duration(std::string_view text);

/// The shortest text parse_duration reads back as `d`: "0ms", "250ms", "4s",
/// "1.5s", "2m", "1m30s", "1h", "1h0m0.5s". Negative durations get a leading '-'.
std::string format_duration(std::chrono::milliseconds d);

}  // namespace fairgate::cli
