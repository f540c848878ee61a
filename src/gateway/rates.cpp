// gateway/rates.cpp — a route's rate limits (gateway/rates.hpp).
#include "gateway/rates.hpp"

#include "gateway/openai.hpp"
#include "http/message.hpp"
#include "serve/ratelimit.hpp"

#include <fmt/format.h>

namespace fairgate::serve {

using net::awaitable;

bool rate_requests(const Shared& sh, const Session& s, const Request& req, const RouteConfig& rc,
                   std::string_view tenant, RouteRates& rates, std::vector<RateRequest>& out,
                   std::string& problem) {
  const std::string ip = client_ip(s.client, fairgate::http::field_list(req, "X-Forwarded-For"),
                                   sh.config.server.trusted_proxies);
  const KeyInputs in{static_cast<const http::fields*>(&req), tenant, ip, rc.path};
  for (const auto& name : rc.ratelimit) {
    const auto it = sh.rate_configs.find(name);
    if (it == sh.rate_configs.end()) continue;  // checked at start (config.cpp)
    auto key = derive_rate_key(it->second, in, problem);
    if (!key) return false;
    std::int64_t prompt = 0;
    const std::int64_t cost = it->second.cost_mode == RateCostMode::tokens
                                  ? estimate_token_cost(req.body(), it->second, &prompt)
                                  : it->second.cost;
    out.push_back(RateRequest{name, std::move(*key), cost});
    rates.configs.push_back(&it->second);
    rates.prompt.push_back(prompt);
  }
  return true;
}

void refund_token_budgets(Shared& sh, const RouteRates& rates, const UsageTap& tap, RouteStats& stats) {
  if (!rates.result.allowed) return;
  for (std::size_t i = 0; i < rates.configs.size() && i < rates.result.decisions.size(); ++i) {
    if (rates.configs[i]->cost_mode != RateCostMode::tokens) continue;
    const RateDecision& d = rates.result.decisions[i];
    if (!d.taken) continue;  // a shadow rule that would have refused took nothing
    std::int64_t used = 0;
    if (!tap.reached || tap.status / 100 != 2) {
      used = 0;  // nothing was generated
    } else if (tap.usage_total) {
      used = *tap.usage_total;
    } else if (tap.sse) {
      used = rates.prompt[i] + tap.streamed;
    } else {
      used = d.cost;  // an answer without usage: keep the reservation
    }
    const std::int64_t back = d.cost - used;  // (usage is never negative: UsageTap ignores a negative one)
    if (back < 0) {
      // More used than reserved (no max_tokens, a prompt the estimate undercounts): the rest is
      // charged now, as a check of its own, at most the rule's capacity (which can fit). A
      // budget without room for all of it gives what it has left (a second check for that), so
      // the next reservations find it spent.
      const std::int64_t more = std::min(-back, rates.configs[i]->rule.capacity());
      stats.tokens_over_reservation.fetch_add(static_cast<std::uint64_t>(-back), std::memory_order_relaxed);
      sh.rates.async_check(RateRequest{d.rule, d.key, more},
                           [rl = sh.rates, rule = d.rule, key = d.key](RateResult r) mutable {
                             if (r.error || r.allowed || r.decisions.empty()) return;
                             const std::int64_t left = r.decisions.front().remaining;
                             if (left > 0) rl.async_check(RateRequest{rule, key, left}, [](RateResult) {});
                           });
      continue;
    }
    if (back == 0) continue;  // used it all
    sh.rates.async_refund(d, back, [](RefundResult) {});
  }
}

std::optional<std::size_t> shown_decision(const RateResult& rr) {
  std::optional<std::size_t> shown;
  for (std::size_t i = 0; i < rr.decisions.size(); ++i) {
    const auto& d = rr.decisions[i];
    if (d.shadow) continue;  // it only watches (docs/shadow.md): a client must not slow down for it
    if (!d.allowed) return i;
    if (!shown || d.remaining < rr.decisions[*shown].remaining) shown = i;
  }
  return shown;
}

Response rate_refusal(Shared& sh, const Request& req, const RouteRates& rates, std::size_t shown) {
  const RateResult& rr = rates.result;
  const RateDecision& d = rr.decisions[shown];
  const bool unavailable = rr.reason.has_value();
  const bool tokens = rates.configs[shown]->cost_mode == RateCostMode::tokens;
  std::string message =
      unavailable ? rr.message
      : d.retry_after.count() < 0
          ? fmt::format("Request too large for rate limit \"{}\": {}", d.rule, rr.message)
          : fmt::format("Rate limit reached for \"{}\" (limit {} {} per {} ms): please try again in {} ms",
                        d.rule, d.limit, tokens ? "tokens" : "requests",
                        sh.rates.rule(d.rule).value_or(RateRule{}).period_ms, d.retry_after.count());
  Response res = openai_error_response(
      unavailable ? http::status::service_unavailable : http::status::too_many_requests, req, message,
      unavailable ? "server_error"
      : tokens    ? "tokens"
                  : "requests",
      unavailable ? "unavailable" : "rate_limit_exceeded");
  for (const auto& f : rates.headers) res.set(f.name_string(), f.value());
  if (unavailable) res.set(http::field::retry_after, "1");
  return res;
}

awaitable<std::optional<bool>> check_rates(Session& s, const Request& req, Gateway::Route& route,
                                           std::string_view tenant, RouteRates& rates) {
  Shared& sh = *s.shared;
  std::vector<RateRequest> checks;
  std::string problem;
  if (!rate_requests(sh, s, req, route.config, tenant, rates, checks, problem)) {
    sh.metrics.http_bad_requests.fetch_add(1, std::memory_order_relaxed);
    Response res = openai_error_response(http::status::bad_request, req, problem, "invalid_request_error",
                                         "rate_limit_key_missing");
    co_return co_await send(s, std::move(res)) && req.keep_alive();
  }
  rates.result = co_await rate_check(sh.rates, checks);
  const RateResult& rr = rates.result;
  if (rr.error) {
    const bool bad = rr.error == make_error_code(RejectReason::invalid_argument);
    Response res = openai_error_response(bad ? http::status::bad_request : http::status::service_unavailable,
                                         req, rr.message, bad ? "invalid_request_error" : "server_error",
                                         bad ? "invalid_argument" : "unavailable");
    co_return co_await send(s, std::move(res)) && req.keep_alive();
  }
  const auto shown = shown_decision(rr);
  if (shown) {
    const RateDecision& d = rr.decisions[*shown];
    set_rate_headers(rates.headers, d, sh.rates.rule(d.rule).value_or(RateRule{}));
  }
  if (rr.allowed) co_return std::nullopt;
  route.stats.rate_limited.fetch_add(1, std::memory_order_relaxed);
  s.record.outcome = "rate_limited";
  Response res = rate_refusal(sh, req, rates, shown.value_or(0));
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

}  // namespace fairgate::serve
