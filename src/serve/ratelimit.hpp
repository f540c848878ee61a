// serve/ratelimit.hpp — rate limits in `fairgate serve` (docs/ratelimit.md,
// "In fairgate serve"): the JSON shapes and headers of /v1/ratelimit, and
// what a gateway route derives from a request for its rules (the key, the
// client IP behind trusted proxies, the token cost). Pure, no I/O.
#pragma once

#include "serve/config.hpp"

#include <fairgate/rate_limiter.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/beast/http/fields.hpp>
#include <boost/json/object.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fairgate::serve {

/// The RateLimiter calls for coroutines. g++ 12 can free a temporary of a
/// co_await full-expression twice (a by-value argument of the initiating
/// call): these plain functions make that call, taking the arguments from
/// named locals of the coroutine, and return the awaitable.
boost::asio::awaitable<RateResult> rate_check(RateLimiter& rates, std::vector<RateRequest>& requests);
boost::asio::awaitable<RefundResult> rate_refund(RateLimiter& rates, RateDecision& decision,
                                                 std::int64_t amount);
boost::asio::awaitable<RuleUpdateResult> rate_publish(RateLimiter& rates, const std::string& name,
                                                      const RateRule& rule);
boost::asio::awaitable<RuleUpdateResult> rate_sync(RateLimiter& rates);

/// One entry of GET /v1/ratelimit: the rule, and with `stats` this instance's counters.
boost::json::object rate_rule_json(std::string_view name, const RateRule& rule, const RateRuleStats* stats);

/// The answer to POST /v1/ratelimit/{rule} for the decision `d` of `result`.
boost::json::object rate_decision_json(const RateResult& result, const RateDecision& d);

/// Seconds for a header: ceil(ms / 1000), at least `floor`.
std::int64_t header_seconds(std::int64_t ms, std::int64_t floor = 0);

/// RateLimit-Policy and RateLimit (IETF httpapi ratelimit-headers draft),
/// X-RateLimit-Limit/Remaining/Reset, and on a refusal Retry-After (seconds,
/// at least 1; none when the cost can never be allowed).
void set_rate_headers(boost::beast::http::fields& h, const RateDecision& d, const RateRule& rule);

/// The client's address for rate-limit keys: the peer, or — when the peer is
/// a trusted proxy — the right-most X-Forwarded-For address that is not one.
std::string client_ip(std::string_view peer, std::string_view forwarded_for,
                      const std::vector<TrustedProxy>& trusted);

/// What a gateway request gives a rule's key parts.
struct KeyInputs {
  const boost::beast::http::fields* headers = nullptr;
  std::string_view tenant;  ///< the route's tenant header value ("" = none)
  std::string_view ip;      ///< client_ip()
  std::string_view route;   ///< the route's path
};

/// The key of `rule` for a request, or nullopt with `problem` set (a header
/// the rule is keyed by is missing, or the key is not a valid key).
std::optional<std::string> derive_rate_key(const RateRuleConfig& rule, const KeyInputs& in,
                                           std::string& problem);

/// cost = "tokens": max_tokens (or max_completion_tokens; else the rule's
/// default_max_tokens) plus the prompt's estimate (its characters ÷
/// chars_per_token, rounded up, plus 1 per message), from a chat or
/// completions JSON body. A body that is not JSON costs the default plus its size's estimate.
/// `prompt` (if given) receives the prompt's part of the estimate.
std::int64_t estimate_token_cost(std::string_view body, const RateRuleConfig& rule,
                                 std::int64_t* prompt = nullptr);

}  // namespace fairgate::serve
