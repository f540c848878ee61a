// tests/fuzz/fuzz_rate_math.cpp — the rate-limit algorithms
// (src/core/rate_math.cpp) on any valid rule, with rates and periods up to
// their limits, costs up to kMaxCost and clocks that jump (also backwards:
// Redis time after a failover). UBSan catches an overflow; the checks hold
// the promises of rate_math.hpp: peek answers what decide does, a refusal
// takes nothing, an allowed decision leaves 0..capacity, a refund gives back
// no more than asked.
//
// Input: the rule (algorithm, rate, period, burst), then steps of
// (operation, time step, cost).
#include "fuzz/check.hpp"

#include "core/rate_math.hpp"

#include <fairgate/rate_rule.hpp>

#include <cstdint>
#include <vector>

using namespace fairgate;
namespace rate = fairgate::core::rate;

namespace {

/// A value in 0..max, biased to the edges (0, 1, small, max - 1, max).
std::int64_t pick(fuzz::Input& in, std::int64_t max) {
  const unsigned kind = in.byte() % 6;
  switch (kind) {
    case 0: return 0;
    case 1: return std::min<std::int64_t>(1, max);
    case 2: return std::min<std::int64_t>(in.byte(), max);
    case 3: return std::max<std::int64_t>(0, max - 1);
    case 4: return max;
    default: {
      std::uint64_t v = 0;
      for (int i = 0; i < 8; ++i) v = v << 8 | in.byte();
      return static_cast<std::int64_t>(v % (static_cast<std::uint64_t>(max) + 1));
    }
  }
}

struct Taken {
  std::int64_t at_ms;
  std::int64_t cost;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  RateRule rule;
  rule.algorithm = static_cast<RateAlgorithm>(in.byte() % 5);
  rule.rate = pick(in, kMaxRate);
  rule.period_ms = pick(in, kMaxPeriodMs);
  rule.burst = rule.algorithm == RateAlgorithm::token_bucket || rule.algorithm == RateAlgorithm::gcra
                   ? pick(in, kMaxRate)
                   : 0;
  rule.local_divisor = 1 + pick(in, 999);
  if (validate(rule)) return 0;  // the callers never pass an invalid rule
  const std::int64_t capacity = rule.capacity();
  FUZZ_CHECK(capacity >= 1, "capacity >= 1");

  rate::State state = rate::initial_state(rule.algorithm);
  std::int64_t now = pick(in, kMaxPeriodMs * 4);
  std::vector<Taken> taken;
  for (int step = 0; step < 64 && !in.empty(); ++step) {
    const unsigned op = in.byte() % 4;
    const std::int64_t delta = pick(in, rule.period_ms * 2);
    now = in.byte() % 16 == 0 ? std::max<std::int64_t>(0, now - delta) : now + delta;
    switch (op) {
      case 0:
      case 1: {
        const std::int64_t cost = 1 + pick(in, kMaxCost - 1);
        const rate::State before = state;
        const rate::Decision peeked = rate::peek(rule, state, now, cost);
        FUZZ_CHECK(state == before, "peek changes nothing");
        const rate::Decision d = rate::decide(rule, state, now, cost);
        FUZZ_CHECK(d == peeked, "peek answers what decide does");
        FUZZ_CHECK(d.reset_ms >= 0, "reset_ms >= 0");
        if (d.allowed) {
          FUZZ_CHECK(cost <= capacity, "no more than the capacity at once");
          FUZZ_CHECK(d.retry_after_ms == 0, "allowed: retry_after 0");
          FUZZ_CHECK(d.remaining >= 0 && d.remaining <= capacity, "remaining in 0..capacity");
          taken.push_back({now, cost});
        } else {
          // Nothing taken: the state may be tidied (sliding_log drops entries
          // that left the period), but answers as before, now and later.
          for (const std::int64_t later : {now, now + rule.period_ms / 2, now + rule.period_ms}) {
            FUZZ_CHECK(rate::peek(rule, state, later, 1) == rate::peek(rule, before, later, 1),
                       "a refusal takes nothing");
            FUZZ_CHECK(rate::peek(rule, state, later, cost) == rate::peek(rule, before, later, cost),
                       "a refusal takes nothing");
          }
          FUZZ_CHECK(d.remaining >= 0 && d.remaining <= capacity, "remaining in 0..capacity");
          if (cost > capacity) {
            FUZZ_CHECK(d.retry_after_ms == -1, "over the capacity: never");
          } else {
            FUZZ_CHECK(d.retry_after_ms >= 1, "refused: retry later");
          }
        }
        break;
      }
      case 2: {
        if (taken.empty()) break;
        auto& t = taken[static_cast<std::size_t>(in.byte()) % taken.size()];
        const std::int64_t amount = pick(in, t.cost);
        const std::int64_t back = rate::refund(rule, state, now, t.at_ms, amount);
        FUZZ_CHECK(back >= 0 && back <= amount, "a refund gives back 0..amount");
        t.cost -= back;
        break;
      }
      default: {
        FUZZ_CHECK(rate::ttl_ms(rule, state, now) >= 0, "ttl >= 0");
        const RateRule share = rate::local_share(rule);
        FUZZ_CHECK(!validate(share), "the local share is a valid rule");
        FUZZ_CHECK(share.capacity() >= 1 && share.capacity() <= capacity, "the share is no larger");
        break;
      }
    }
  }
  return 0;
}
