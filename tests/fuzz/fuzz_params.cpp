// tests/fuzz/fuzz_params.cpp — the admission API's request reading
// (src/serve/params.cpp): targets, query strings and JSON bodies. Any input
// gives either parameters within the documented ranges (docs/api.md) or a
// 400 whose message is one clear line.
//
// Input: byte 0 picks the parser; then a request target up to '\n'; the rest
// is the body.
#include "fuzz/check.hpp"

#include "serve/params.hpp"

#include <fairgate/settings.hpp>

#include <chrono>
#include <cstdint>

using namespace fairgate;
using fairgate::fuzz::is_clear_message;

namespace {

constexpr std::chrono::milliseconds kMaxLease{600'000};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  const unsigned op = in.byte() % 8;
  const std::string_view target_text = in.line();
  const std::string_view body = in.rest();
  serve::BadRequest error;

  const auto target = serve::parse_target(target_text, error);
  fuzz::ok_or_clear(target.has_value(), error.message);
  if (target) {
    for (const auto& seg : target->segments) {
      FUZZ_CHECK(!seg.empty() && seg != "." && seg != "..", seg);
      FUZZ_CHECK(seg.find('/') == std::string::npos, seg);
    }
    FUZZ_CHECK(target->query.size() <= 32, "at most 32 query parameters");
  }
  const serve::Target empty_target;
  const serve::Target& t = target ? *target : empty_target;
  error = {};
  switch (op) {
    case 0: {
      const auto p = serve::parse_acquire_params(t, body, kMaxLease, error);
      fuzz::ok_or_clear(p.has_value(), error.message);
      if (p) {
        FUZZ_CHECK(p->weight >= 1 && p->weight <= 1000, "weight in 1..1000");
        if (p->max_wait) FUZZ_CHECK(p->max_wait->count() >= 0 && *p->max_wait <= kMaxWaitLimit, "max_wait");
        if (p->lease) FUZZ_CHECK(p->lease->count() >= 100 && *p->lease <= kMaxLease, "lease in 100..max");
      }
      break;
    }
    case 1: {
      const auto p = serve::parse_renew_params(t, body, kMaxLease, error);
      fuzz::ok_or_clear(p.has_value(), error.message);
      if (p && p->lease) FUZZ_CHECK(p->lease->count() >= 100 && *p->lease <= kMaxLease, "lease in 100..max");
      break;
    }
    case 2: {
      const auto p = serve::parse_status_query(t, error);
      fuzz::ok_or_clear(p.has_value(), error.message);
      if (p) FUZZ_CHECK(p->limit <= kMaxStatusLimit, "limit within kMaxStatusLimit");
      break;
    }
    case 3: {
      const auto p = serve::parse_settings_update(body, error);
      fuzz::ok_or_clear(p.has_value(), error.message);
      if (p) {
        const Settings s = apply(Settings{}, *p);
        if (p->max_concurrent) FUZZ_CHECK(*p->max_concurrent >= 1, "max_concurrent >= 1");
        if (p->max_wait) FUZZ_CHECK(p->max_wait->count() >= 0 && *p->max_wait <= kMaxWaitLimit, "max_wait");
        if (auto e = validate(s)) FUZZ_CHECK(is_clear_message(e->message()), e->message());
      }
      break;
    }
    case 4: {
      const auto p = serve::parse_rate_check(body, error);
      fuzz::ok_or_clear(p.has_value(), error.message);
      if (p) FUZZ_CHECK(p->cost >= 1 && p->cost <= kMaxCost, "cost in 1..kMaxCost");
      break;
    }
    case 5: {
      const auto p = serve::parse_rate_refund(body, error);
      fuzz::ok_or_clear(p.has_value(), error.message);
      if (p) {
        FUZZ_CHECK(p->amount >= 0, "amount >= 0");
        // The decision it names, written as an allowed answer writes it, reads back the same.
        const std::string id = serve::decision_id(p->at_ms, p->at_us, p->cost);
        serve::BadRequest again_error;
        const auto again = serve::parse_rate_refund(
            R"({"key":"k","amount":)" + std::to_string(p->amount) + R"(,"decision":")" + id + "\"}",
            again_error);
        FUZZ_CHECK(again && again->at_ms == p->at_ms && again->at_us == p->at_us && again->cost == p->cost,
                   id);
      }
      break;
    }
    case 6: {
      const auto p = serve::parse_rate_rule_update(body, RateRule{}, error);
      fuzz::ok_or_clear(p.has_value(), error.message);
      if (p) {
        if (auto e = validate(*p)) FUZZ_CHECK(is_clear_message(e->message()), e->message());
      }
      break;
    }
    default:
      // Either answer is fine; it must not read past either string.
      (void)serve::bearer_matches(target_text, body);
      break;
  }
  return 0;
}
