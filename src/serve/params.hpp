// serve/params.hpp — the strict reading of request targets, query strings and
// JSON bodies (S7). Pure functions, no I/O: every rule is unit-testable.
#pragma once

#include <fairgate/settings.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fairgate::serve {

/// A problem with a request: HTTP status 400 and this one-line message.
struct BadRequest {
  std::string message;
};

/// A request target split into decoded path segments and query parameters.
struct Target {
  std::vector<std::string> segments;  ///< "/v1/limiters/chat" → {"v1","limiters","chat"}
  std::vector<std::pair<std::string, std::string>> query;
};

/// Splits and percent-decodes `target` (origin form only: "/path?query").
/// Rejects control characters, bad escapes, empty or dot segments.
std::optional<Target> parse_target(std::string_view target, BadRequest& error);

/// Parameters of POST /v1/limiters/{name}/acquire.
struct AcquireParams {
  std::optional<std::chrono::milliseconds> max_wait;
  std::string tenant;
  std::uint32_t weight = 1;  ///< the tenant's share weight under tenant fairness (F12), 1..1000
  std::optional<std::chrono::milliseconds> lease;  ///< JSON permits only
};

/// Tenants: 1..128 characters of [A-Za-z0-9._:@-].
inline constexpr std::size_t kMaxTenant = 128;

/// Reads the acquire parameters from the query string and (when `body` is not
/// empty) a JSON object body; the body wins where both give a value. Unknown
/// parameters, wrong types and out-of-range numbers are errors.
std::optional<AcquireParams> parse_acquire_params(const Target& target, std::string_view body,
                                                  std::chrono::milliseconds max_lease, BadRequest& error);

/// Reads the body of PUT /v1/limiters/{name}: a JSON object with any of
/// max_concurrent, max_wait_ms, max_queue (null = unbounded), enabled.
std::optional<SettingsUpdate> parse_settings_update(std::string_view body, BadRequest& error);

/// Constant-time comparison of an "Authorization" header with "Bearer <token>".
bool bearer_matches(std::string_view header, std::string_view token) noexcept;

}  // namespace fairgate::serve
