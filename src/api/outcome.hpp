// api/outcome.hpp — how every backend ends a request without a permit: the
// counters it bumps and the result it delivers, the same way everywhere.
#pragma once

#include <fairgate/limiter.hpp>

#include <chrono>
#include <string>

namespace fairgate::detail {

/// Counts the ending in `stats` (timeouts, cancels or rejections, and by
/// reason) and returns the result to deliver. An empty `message` gets the
/// standard text for `reason` (core::ended_message; a timeout names
/// `max_wait`, the one the request was given).
AcquireResult end_request(LimiterStats& stats, RejectReason reason, std::chrono::milliseconds waited,
                          std::chrono::milliseconds max_wait, std::string message, const Settings& settings);

}  // namespace fairgate::detail
