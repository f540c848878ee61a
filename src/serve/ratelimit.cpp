// serve/ratelimit.cpp — see ratelimit.hpp.
#include "serve/ratelimit.hpp"

#include <boost/asio/ip/address.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>

#include <fmt/format.h>

#include <algorithm>

namespace fairgate::serve {

namespace json = boost::json;
namespace http = boost::beast::http;

boost::asio::awaitable<RateResult> rate_check(RateLimiter& rates, std::vector<RateRequest>& requests) {
  return rates.async_check(std::move(requests), boost::asio::use_awaitable);
}

boost::asio::awaitable<RefundResult> rate_refund(RateLimiter& rates, RateDecision& decision,
                                                 std::int64_t amount) {
  return rates.async_refund(std::move(decision), amount, boost::asio::use_awaitable);
}

boost::asio::awaitable<RuleUpdateResult> rate_publish(RateLimiter& rates, const std::string& name,
                                                      const RateRule& rule) {
  return rates.async_publish_rule(name, rule, boost::asio::use_awaitable);
}

boost::asio::awaitable<RuleUpdateResult> rate_sync(RateLimiter& rates) {
  return rates.async_sync_rules(boost::asio::use_awaitable);
}

json::object rate_rule_json(std::string_view name, const RateRule& rule, const RateRuleStats* stats) {
  json::object o;
  o["name"] = name;
  o["algorithm"] = to_string(rule.algorithm);
  o["rate"] = rule.rate;
  o["period_ms"] = rule.period_ms;
  o["burst"] = rule.burst;
  o["limit"] = rule.capacity();
  o["on_redis_down"] = to_string(rule.on_redis_down);
  o["local_divisor"] = rule.local_divisor;
  o["mode"] = to_string(rule.mode);
  if (stats != nullptr) {
    json::object s;
    s["allowed"] = stats->allowed;
    s["refused"] = stats->refused;
    s["local_refusals"] = stats->local_refusals;
    s["store_errors"] = stats->store_errors;
    s["degraded"] = stats->degraded;
    s["refunded"] = stats->refunded;
    s["store_calls"] = stats->store_calls;
    o["stats"] = std::move(s);
  }
  return o;
}

json::object rate_decision_json(const RateResult& result, const RateDecision& d) {
  json::object o;
  o["allowed"] = result.allowed;
  o["rule"] = d.rule;
  o["key"] = d.key;
  o["cost"] = d.cost;
  o["limit"] = d.limit;
  o["remaining"] = std::max<std::int64_t>(0, d.remaining);
  o["reset_ms"] = d.reset.count();
  o["retry_after_ms"] = result.allowed ? 0 : d.retry_after.count();
  o["source"] = to_string(result.source);
  if (d.shadow) {
    // Shadow mode (docs/shadow.md): let through; what the rule would have done.
    o["shadow"] = true;
    o["would_allow"] = d.allowed;
  }
  if (result.allowed) {
    // A shadow rule that would have refused took nothing: nothing to refund.
    if (d.taken) o["decision"] = fmt::format("{}.{}.{}", d.at_ms, d.at_us, d.cost);
  } else {
    o["reason"] = result.reason               ? "unavailable"
                  : d.retry_after.count() < 0 ? "cost_exceeds_capacity"
                                              : "rate_limited";
    o["message"] = result.message;
  }
  return o;
}

std::int64_t header_seconds(std::int64_t ms, std::int64_t floor) {
  return std::max(floor, ms <= 0 ? 0 : (ms + 999) / 1000);
}

void set_rate_headers(http::fields& h, const RateDecision& d, const RateRule& rule) {
  const std::int64_t remaining = std::max<std::int64_t>(0, d.remaining);
  const std::int64_t reset = header_seconds(d.reset.count());
  h.set("RateLimit-Policy",
        fmt::format("\"{}\";q={};w={}", d.rule, d.limit, header_seconds(rule.period_ms, 1)));
  h.set("X-RateLimit-Limit", std::to_string(d.limit));
  // A cost above the capacity is refused without asking the store: what remains is not known.
  if (!d.allowed && d.retry_after.count() < 0) return;
  h.set("RateLimit", fmt::format("\"{}\";r={};t={}", d.rule, remaining, reset));
  h.set("X-RateLimit-Remaining", std::to_string(remaining));
  h.set("X-RateLimit-Reset", std::to_string(reset));
  if (!d.allowed && !d.shadow && d.retry_after.count() > 0)
    h.set(http::field::retry_after, std::to_string(header_seconds(d.retry_after.count(), 1)));
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

std::string client_ip(std::string_view peer, std::string_view forwarded_for,
                      const std::vector<TrustedProxy>& trusted) {
  boost::system::error_code ec;
  auto addr = boost::asio::ip::make_address(std::string(peer), ec);
  if (ec || trusted.empty() || forwarded_for.empty() || !is_trusted_proxy(addr, trusted))
    return std::string(peer);
  // Right to left: the first address not one of our proxies is the client.
  std::string last(peer);
  std::string_view rest = forwarded_for;
  while (!rest.empty()) {
    const auto comma = rest.rfind(',');
    const std::string_view item = trim(comma == std::string_view::npos ? rest : rest.substr(comma + 1));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(0, comma);
    const auto hop = boost::asio::ip::make_address(std::string(item), ec);
    if (ec) return last;  // garbage: stop at the last address we could trust
    last = hop.to_string();
    if (!is_trusted_proxy(hop, trusted)) return last;
  }
  return last;
}

std::optional<std::string> derive_rate_key(const RateRuleConfig& rule, const KeyInputs& in,
                                           std::string& problem) {
  std::string key;
  for (const auto& part : rule.key) {
    if (!key.empty()) key += '|';
    switch (part.part) {
      case RateKeyPart::header: {
        const auto v = in.headers != nullptr ? (*in.headers)[part.header] : boost::beast::string_view{};
        if (v.empty()) {
          problem = fmt::format("rate limit \"{}\" is keyed by the {} header, which this request lacks",
                                rule.name, part.header);
          return std::nullopt;
        }
        if (in.headers->count(part.header) > 1) {
          // A second line could choose the bucket while the upstream reads the other one.
          problem = fmt::format(
              "rate limit \"{}\" is keyed by the {} header, which this request gives more "
              "than once",
              rule.name, part.header);
          return std::nullopt;
        }
        key.append(v.data(), v.size());
        break;
      }
      case RateKeyPart::tenant:
        if (in.tenant.empty()) {
          problem =
              fmt::format("rate limit \"{}\" is keyed by the tenant, and this request names none", rule.name);
          return std::nullopt;
        }
        key += in.tenant;
        break;
      case RateKeyPart::ip: key += in.ip; break;
      case RateKeyPart::route: key += in.route; break;
      case RateKeyPart::global: key += "global"; break;
    }
  }
  if (auto e = validate_rate_key(key)) {
    problem = fmt::format("rate limit \"{}\": {}", rule.name, e->message());
    return std::nullopt;
  }
  return key;
}

namespace {

std::int64_t chars_of(const json::value& v) {
  if (v.is_string()) return static_cast<std::int64_t>(v.as_string().size());
  std::int64_t n = 0;
  if (v.is_array())
    for (const auto& x : v.as_array()) n += chars_of(x);
  if (v.is_object())
    for (const auto& [k, x] : v.as_object()) n += chars_of(x);
  return n;
}

}  // namespace

std::int64_t estimate_token_cost(std::string_view body, const RateRuleConfig& rule,
                                 std::int64_t* prompt_out) {
  const std::int64_t per = std::max<std::int64_t>(1, rule.chars_per_token);
  boost::system::error_code ec;
  json::parse_options opts;
  opts.max_depth = 64;
  const json::value v = json::parse(body, ec, {}, opts);
  if (ec || !v.is_object()) {
    return std::min(kMaxCost,
                    rule.default_max_tokens + (static_cast<std::int64_t>(body.size()) + per - 1) / per);
  }
  const auto& o = v.as_object();
  std::int64_t answer = rule.default_max_tokens;
  for (const char* name :
       {"max_completion_tokens", "max_tokens", "max_output_tokens"}) {  // (the last: Responses)
    if (const auto* m = o.if_contains(name)) {
      if (m->is_int64() && m->as_int64() > 0) answer = std::min(m->as_int64(), kMaxCost);
      break;
    }
  }
  std::int64_t prompt = 0;
  if (const auto* m = o.if_contains("messages"); m && m->is_array()) {
    for (const auto& msg : m->as_array()) {
      prompt += 1;
      if (msg.is_object())
        if (const auto* c = msg.as_object().if_contains("content")) prompt += (chars_of(*c) + per - 1) / per;
    }
  } else if (const auto* p = o.if_contains("prompt")) {
    prompt += (chars_of(*p) + per - 1) / per;
  } else if (const auto* p2 = o.if_contains("input")) {
    prompt += (chars_of(*p2) + per - 1) / per;
  }
  if (prompt_out) *prompt_out = prompt;
  return std::min(kMaxCost, answer + prompt);
}

}  // namespace fairgate::serve
