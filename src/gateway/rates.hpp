// gateway/rates.hpp — the rate limits of a route (docs/ratelimit.md,
// "Gateway rules"): checked before the queue, all must allow; a refusal is
// answered in OpenAI's shape; token budgets get back what a request did not use.
#pragma once

#include "gateway/gateway.hpp"
#include "gateway/usage.hpp"
#include "serve/config.hpp"
#include "serve/session.hpp"

#include <fairgate/rate_limiter.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fairgate::serve {

/// The rate limits of a route, checked before the queue: the requests sent
/// and the answer (whose decisions token budgets refund from).
struct RouteRates {
  std::vector<const RateRuleConfig*> configs;
  std::vector<std::int64_t> prompt;  // per rule: the prompt's part of a token cost
  RateResult result;
  http::fields headers;  // RateLimit-*, X-RateLimit-* for the answer
};

/// Builds the checks of `rc.ratelimit` for `req`; false with `problem` when a key cannot be derived.
bool rate_requests(const Shared& sh, const Session& s, const Request& req, const RouteConfig& rc,
                   std::string_view tenant, RouteRates& rates, std::vector<RateRequest>& out,
                   std::string& problem);

/// Token budgets: gives back what a request reserved and did not use, and
/// charges what it used beyond its reservation (docs/ratelimit.md, "Token
/// budgets"; counted in `stats`). Fire and forget.
void refund_token_budgets(Shared& sh, const RouteRates& rates, const UsageTap& tap, RouteStats& stats);

/// The decision the headers tell of: the refusing rule's, else the one with the least left;
/// never a shadow rule's (none when every rule is in shadow mode: no headers).
std::optional<std::size_t> shown_decision(const RateResult& result);

/// The answer to a request the route's rules refused: 429 (503 when the
/// rules could not decide), with the rate-limit headers.
Response rate_refusal(Shared& sh, const Request& req, const RouteRates& rates, std::size_t shown);

/// Checks the route's rules for `req` (the route must have some). nullopt:
/// allowed, go on (`rates` holds the decisions and the headers for the
/// answer); else the request was answered, and whether the connection may
/// carry another request.
net::awaitable<std::optional<bool>> check_rates(Session& s, const Request& req, Gateway::Route& route,
                                                std::string_view tenant, RouteRates& rates);

}  // namespace fairgate::serve
