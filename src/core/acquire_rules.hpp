// core/acquire_rules.hpp — rules every backend applies the same way to one
// acquire: which deadline it gets, and how an ending without a permit reads.
#pragma once

#include <fairgate/error.hpp>
#include <fairgate/settings.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fairgate::core {

/// The max wait an acquire gets (`requested`, else the limiter's), or nullopt
/// when its options are invalid (negative or above kMaxWaitLimit, a tenant
/// that breaks the tenant rule (valid_tenant), weight outside 1 .. kMaxTenantWeight).
std::optional<std::chrono::milliseconds> effective_max_wait(
    const std::optional<std::chrono::milliseconds>& requested, const Settings& settings,
    std::string_view tenant, std::uint32_t weight = 1);

/// What is wrong with an acquire's options, one line naming the field
/// ("weight: 0 is not in 1..1000"), or empty when effective_max_wait accepts them.
std::string acquire_options_problem(const std::optional<std::chrono::milliseconds>& requested,
                                    const Settings& settings, std::string_view tenant,
                                    std::uint32_t weight = 1);

/// The one-line message of a request that ended without a permit after
/// `waited`; a timeout names `max_wait`, the one it was given (the time
/// measured runs a little over).
std::string ended_message(RejectReason reason, std::chrono::milliseconds waited,
                          std::chrono::milliseconds max_wait, const Settings& settings);

}  // namespace fairgate::core
