// serve/params.hpp — the strict reading of request targets, query strings and
// JSON bodies (S7). Pure functions, no I/O: every rule is unit-testable.
#pragma once

#include <fairgate/limiter.hpp>
#include <fairgate/rate_rule.hpp>
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

/// Reads the acquire parameters from the query string and (when `body` is not
/// empty) a JSON object body; the body wins where both give a value. Unknown
/// parameters, wrong types and out-of-range numbers are errors.
std::optional<AcquireParams> parse_acquire_params(const Target& target, std::string_view body,
                                                  std::chrono::milliseconds max_lease, BadRequest& error);

/// Parameters of POST /v1/permits/{permit}/renew.
struct RenewParams {
  std::optional<std::chrono::milliseconds> lease;  ///< absent: the permit's current lease length
};

/// Reads lease_ms (100..max_lease, checked as acquire checks it) from the
/// query string and (when `body` is not empty) a JSON object body; the body
/// wins where both give it. Any other parameter is an error.
std::optional<RenewParams> parse_renew_params(const Target& target, std::string_view body,
                                              std::chrono::milliseconds max_lease, BadRequest& error);

/// Reads the page of GET /v1/limiters/{name}: `offset` (default 0) and `limit`
/// (default kDefaultStatusLimit, 0..kMaxStatusLimit) from the query string.
/// Unknown parameters and bad numbers are errors.
std::optional<StatusQuery> parse_status_query(const Target& target, BadRequest& error);

/// Reads the body of PUT /v1/limiters/{name}: a JSON object with any of the
/// settings the settings table marks `http` (core/settings_table.hpp), by
/// their key; an optional count may be null (unset).
std::optional<SettingsUpdate> parse_settings_update(std::string_view body, BadRequest& error);

/// The body of POST /v1/ratelimit/{rule}: {"key": "...", "cost": 1}.
struct RateCheckParams {
  std::string key;
  std::int64_t cost = 1;  ///< absent = 1
};
std::optional<RateCheckParams> parse_rate_check(std::string_view body, BadRequest& error);

/// The body of POST /v1/ratelimit/{rule}/refund: {"key", "decision", "amount"},
/// `decision` as the allowed answer gave it.
struct RateRefundParams {
  std::string key;
  std::int64_t amount = 0;
  std::int64_t at_ms = 0;
  std::int64_t at_us = 0;
  std::int64_t cost = 0;
};
std::optional<RateRefundParams> parse_rate_refund(std::string_view body, BadRequest& error);

/// The id of an allowed decision, for its refunds: "AT_MS.AT_US.COST".
std::string decision_id(std::int64_t at_ms, std::int64_t at_us, std::int64_t cost);

/// The body of PUT /v1/ratelimit/{rule}: any of algorithm, rate, period_ms,
/// burst, on_redis_down, local_divisor, applied over `current` (not validated
/// as a whole: the caller runs fairgate::validate).
std::optional<RateRule> parse_rate_rule_update(std::string_view body, RateRule current, BadRequest& error);

/// Constant-time comparison of an "Authorization" header with "Bearer <token>".
bool bearer_matches(std::string_view header, std::string_view token) noexcept;

/// Whether an Accept header asks for text/event-stream: a media range of that type (any
/// case, RFC 9110 12.5.1) whose q is not 0. "*/*" and "text/*" do not: JSON is the default.
bool accepts_event_stream(std::string_view accept) noexcept;

}  // namespace fairgate::serve
