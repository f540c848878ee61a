// The rate-limit math (src/core/rate_math.hpp) against the reference models of
// tests/support/rate_reference.hpp, on random schedules of arrivals, costs and
// refunds; the bounds each algorithm promises; retry_after honesty; rule and
// cost validation.
#include "core/rate_math.hpp"
#include "support/rate_checks.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace {

using fairgate::RateAlgorithm;
using fairgate::RateRule;
using fairgate::test::check_bounds;
using fairgate::test::check_decision;
using fairgate::test::RateReference;
namespace rate = fairgate::core::rate;

constexpr RateAlgorithm kAll[] = {RateAlgorithm::fixed_window, RateAlgorithm::sliding_log,
                                  RateAlgorithm::sliding_window, RateAlgorithm::token_bucket,
                                  RateAlgorithm::gcra};

RateRule rule(RateAlgorithm a, std::int64_t rate_, std::int64_t period, std::int64_t burst = 0) {
  RateRule r;
  r.algorithm = a;
  r.rate = rate_;
  r.period_ms = period;
  r.burst = burst;
  return r;
}

bool bucket(RateAlgorithm a) { return a == RateAlgorithm::token_bucket || a == RateAlgorithm::gcra; }

struct Allowed {
  std::int64_t at, cost;
  bool refunded = false;
};

// One random schedule; returns the decisions (to compare algorithms).
std::vector<bool> run_schedule(const RateRule& r, std::uint32_t seed, int events, bool refunds) {
  std::mt19937 rng(seed);
  RateReference ref(r);
  rate::State state = rate::initial_state(r.algorithm);
  std::vector<Allowed> allowed;
  std::vector<bool> out;
  std::int64_t now = 1'000'000 + std::uniform_int_distribution<std::int64_t>(0, r.period_ms)(rng);
  for (int i = 0; i < events && !::testing::Test::HasFatalFailure(); ++i) {
    const int gap_kind = std::uniform_int_distribution<int>(0, 9)(rng);
    now += gap_kind < 3   ? 0
           : gap_kind < 9 ? std::uniform_int_distribution<std::int64_t>(1, r.period_ms / 4 + 1)(rng)
                          : std::uniform_int_distribution<std::int64_t>(1, 3 * r.period_ms)(rng);
    if (refunds && !allowed.empty() && std::uniform_int_distribution<int>(0, 5)(rng) == 0) {
      auto& a = allowed[std::uniform_int_distribution<std::size_t>(0, allowed.size() - 1)(rng)];
      if (!a.refunded) {
        a.refunded = true;
        const std::int64_t amount = std::uniform_int_distribution<std::int64_t>(1, a.cost)(rng);
        const std::int64_t want = ref.refund(now, a.at, amount);
        EXPECT_EQ(rate::refund(r, state, now, a.at, amount), want) << "refund at t=" << now << " of " << a.at;
        continue;
      }
    }
    const int cost_kind = std::uniform_int_distribution<int>(0, 19)(rng);
    const std::int64_t cost = cost_kind < 12 ? 1
                              : cost_kind < 19
                                  ? std::uniform_int_distribution<std::int64_t>(1, r.capacity())(rng)
                                  : r.capacity() + 1;
    const bool want = ref.allowed(now, cost);
    const rate::Decision d = rate::decide(r, state, now, cost);
    if (want) {
      ref.admit(now, cost);
      allowed.push_back({now, cost});
    }
    check_decision(ref, now, cost, d, want);
    EXPECT_EQ(rate::ttl_ms(r, state, now), d.reset_ms);
    out.push_back(d.allowed);
  }
  check_bounds(ref);
  return out;
}

class RateMathRandom : public ::testing::TestWithParam<RateAlgorithm> {};

TEST_P(RateMathRandom, MatchesReferenceOnRandomSchedules) {
  const RateAlgorithm a = GetParam();
  const std::int64_t periods[] = {10, 97, 1000};
  std::uint32_t seed = 1;
  for (std::int64_t p : periods) {
    for (std::int64_t rt : {1, 3, 10, 25}) {
      for (std::int64_t burst :
           bucket(a) ? std::vector<std::int64_t>{0, 1, 40} : std::vector<std::int64_t>{0}) {
        SCOPED_TRACE(testing::Message() << "rate=" << rt << " period=" << p << " burst=" << burst);
        run_schedule(rule(a, rt, p, burst), seed++, 250, false);
        run_schedule(rule(a, rt, p, burst), seed++, 250, true);
        if (HasFatalFailure()) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, RateMathRandom, ::testing::ValuesIn(kAll), [](const auto& param_info) {
  return std::string(fairgate::to_string(param_info.param));
});

TEST(RateMath, TokenBucketAndGcraDecideAlike) {
  for (std::uint32_t seed = 100; seed < 110; ++seed) {
    const auto tb = run_schedule(rule(RateAlgorithm::token_bucket, 7, 1000, 12), seed, 300, true);
    const auto g = run_schedule(rule(RateAlgorithm::gcra, 7, 1000, 12), seed, 300, true);
    EXPECT_EQ(tb, g) << "seed " << seed;
  }
}

// retry_after is honest: a call at it is allowed, one 100 ms before it is not.
TEST(RateMath, RetryAfterIsHonest) {
  for (RateAlgorithm a : {RateAlgorithm::token_bucket, RateAlgorithm::gcra}) {
    SCOPED_TRACE(fairgate::to_string(a));
    const RateRule r = rule(a, 10, 1000, 10);  // 1 unit per 100 ms, bucket of 10
    rate::State s = rate::initial_state(a);
    const std::int64_t t0 = 5'000'000;
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(rate::decide(r, s, t0, 1).allowed);
    const rate::Decision refused = rate::decide(r, s, t0 + 30, 5);
    ASSERT_FALSE(refused.allowed);
    EXPECT_EQ(refused.retry_after_ms, 470);  // 5 units = 500 ms of refill, 30 ms of it done
    EXPECT_EQ(refused.remaining, 0);
    EXPECT_FALSE(rate::peek(r, s, t0 + 30 + refused.retry_after_ms - 100, 5).allowed);
    EXPECT_FALSE(rate::peek(r, s, t0 + 30 + refused.retry_after_ms - 1, 5).allowed);
    const rate::Decision later = rate::decide(r, s, t0 + 30 + refused.retry_after_ms, 5);
    EXPECT_TRUE(later.allowed);
    EXPECT_EQ(later.remaining, 0);
  }
}

// The worked examples of docs/ratelimit.md.
TEST(RateMath, WorkedExamples) {
  {  // fixed_window, 3 per 1000 ms
    const RateRule r = rule(RateAlgorithm::fixed_window, 3, 1000);
    rate::State s = rate::initial_state(r.algorithm);
    EXPECT_EQ(rate::decide(r, s, 10'100, 2), (rate::Decision{true, 1, 900, 0}));
    EXPECT_EQ(rate::decide(r, s, 10'900, 2), (rate::Decision{false, 1, 100, 100}));
    EXPECT_EQ(rate::decide(r, s, 11'000, 3), (rate::Decision{true, 0, 1000, 0}));
  }
  {  // sliding_log, 3 per 1000 ms
    const RateRule r = rule(RateAlgorithm::sliding_log, 3, 1000);
    rate::State s = rate::initial_state(r.algorithm);
    EXPECT_TRUE(rate::decide(r, s, 10'100, 2).allowed);
    EXPECT_TRUE(rate::decide(r, s, 10'900, 1).allowed);
    EXPECT_EQ(rate::decide(r, s, 11'000, 2),
              (rate::Decision{false, 0, 900, 100}));  // 10'100 leaves at 11'100
    EXPECT_EQ(rate::decide(r, s, 11'100, 2), (rate::Decision{true, 0, 1000, 0}));
  }
  {  // sliding_window, 10 per 1000 ms: 8 in [10'000, 11'000), then at 11'250
    const RateRule r = rule(RateAlgorithm::sliding_window, 10, 1000);
    rate::State s = rate::initial_state(r.algorithm);
    EXPECT_TRUE(rate::decide(r, s, 10'500, 8).allowed);
    // estimate = 8 × 750/1000 + 0 = 6: 4 more fit, 5 do not
    EXPECT_EQ(rate::peek(r, s, 11'250, 4), (rate::Decision{true, 0, 1750, 0}));
    // 5 fit once 8 × (1000 − e)/1000 <= 5, e >= 375: at 11'375
    EXPECT_EQ(rate::decide(r, s, 11'250, 5), (rate::Decision{false, 4, 750, 125}));
  }
  {  // gcra / token_bucket, 2 per 1000 ms, burst 4
    for (RateAlgorithm a : {RateAlgorithm::token_bucket, RateAlgorithm::gcra}) {
      const RateRule r = rule(a, 2, 1000, 4);
      rate::State s = rate::initial_state(a);
      EXPECT_EQ(rate::decide(r, s, 10'000, 4), (rate::Decision{true, 0, 2000, 0}));
      EXPECT_EQ(rate::decide(r, s, 10'200, 1), (rate::Decision{false, 0, 1800, 300}));
      EXPECT_EQ(rate::decide(r, s, 10'500, 1), (rate::Decision{true, 0, 2000, 0}));  // 1 refilled, taken
    }
  }
}

TEST(RateMath, ARefusalConsumesNothing) {
  for (RateAlgorithm a : kAll) {
    const RateRule r = rule(a, 5, 1000);
    rate::State s = rate::initial_state(a);
    ASSERT_TRUE(rate::decide(r, s, 50'000, 3).allowed);
    const rate::State before = s;
    EXPECT_FALSE(rate::decide(r, s, 50'010, 3).allowed);
    EXPECT_FALSE(rate::decide(r, s, 50'010, 6).allowed);
    EXPECT_EQ(rate::decide(r, s, 50'010, 6).retry_after_ms, -1) << "cost above capacity: never";
    EXPECT_EQ(s, before) << fairgate::to_string(a);
  }
}

// Redis' clock may go back (a failover to a replica whose clock is behind):
// every algorithm refuses what it must, and says nothing remains rather than
// a negative count (X-RateLimit-Remaining), however far it went back — gcra's
// debt once went negative here, and overflowed at a high rate (found by
// tests/fuzz/fuzz_rate_math).
TEST(RateMath, AClockThatWentBackLeavesNothingNegativeAndDoesNotOverflow) {
  for (RateAlgorithm a : kAll) {
    for (const std::int64_t rate : {std::int64_t{5}, fairgate::kMaxRate}) {
      const RateRule r = rule(a, rate, 1000);
      rate::State s = rate::initial_state(a);
      ASSERT_TRUE(rate::decide(r, s, 90'000'000'000, rate).allowed) << fairgate::to_string(a);
      for (const std::int64_t back : {std::int64_t{10}, std::int64_t{60'000}, std::int64_t{80'000'000'000}}) {
        const auto d = rate::decide(r, s, 90'000'000'000 - back, 1);
        EXPECT_GE(d.remaining, 0) << fairgate::to_string(a) << " back " << back;
        EXPECT_GE(d.reset_ms, 0) << fairgate::to_string(a) << " back " << back;
        if (!d.allowed) {
          EXPECT_GE(d.retry_after_ms, 1) << fairgate::to_string(a) << " back " << back;
        }
      }
    }
  }
}

TEST(RateMath, RefundsNeverExceedWhatWasTakenNorOutliveTheWindow) {
  for (RateAlgorithm a : kAll) {
    SCOPED_TRACE(fairgate::to_string(a));
    // Buckets: a slow refill (1 unit per 10 s), so what comes back is the refund.
    const RateRule r = rule(a, 10, bucket(a) ? 100'000 : 1000);
    rate::State s = rate::initial_state(a);
    ASSERT_TRUE(rate::decide(r, s, 20'100, 4).allowed);
    EXPECT_EQ(rate::refund(r, s, 20'200, 20'100, 3), 3);
    EXPECT_EQ(rate::peek(r, s, 20'200, 1).remaining, 8);  // 10 − (4 − 3) − 1
    // Asking for more than is left gives back only what is there.
    EXPECT_EQ(rate::refund(r, s, 20'300, 20'100, 5), 1);
    EXPECT_EQ(rate::peek(r, s, 20'300, 1).remaining, 9);
    // None once the decision's window (a period for the buckets) has passed.
    ASSERT_TRUE(rate::decide(r, s, 20'400, 6).allowed);
    const std::int64_t late = a == RateAlgorithm::sliding_window ? 22'000 : 20'400 + r.period_ms;
    EXPECT_EQ(rate::refund(r, s, late, 20'400, 6), 0);
  }
}

TEST(RateRuleValidation, ClearErrors) {
  auto problem = [](RateRule r) {
    auto e = fairgate::validate(r);
    return e ? e->message() : std::string("ok");
  };
  EXPECT_EQ(problem(rule(RateAlgorithm::gcra, 10, 1000)), "ok");
  EXPECT_EQ(problem(rule(RateAlgorithm::gcra, 0, 1000)), "rate: 0 is not in 1..1000000000");
  EXPECT_EQ(problem(rule(RateAlgorithm::gcra, -3, 1000)), "rate: -3 is not in 1..1000000000");
  EXPECT_EQ(problem(rule(RateAlgorithm::gcra, 10, 0)), "period_ms: 0 is not in 1..31622400000");
  EXPECT_EQ(problem(rule(RateAlgorithm::gcra, 10, 1000, -1)), "burst: -1 is not in 0..1000000000 (0 = rate)");
  EXPECT_NE(problem(rule(RateAlgorithm::fixed_window, 10, 1000, 20)).find("burst: fixed_window has no burst"),
            std::string::npos);
  EXPECT_NE(problem(rule(RateAlgorithm::token_bucket, 1'000'000'000, 86'400'000)).find("exceeds 2^50"),
            std::string::npos);
  RateRule bad = rule(RateAlgorithm::gcra, 10, 1000);
  bad.algorithm = static_cast<RateAlgorithm>(9);
  EXPECT_NE(problem(bad).find("algorithm: must be one of"), std::string::npos);
  EXPECT_EQ(fairgate::parse_rate_algorithm("sliding_window"), RateAlgorithm::sliding_window);
  EXPECT_FALSE(fairgate::parse_rate_algorithm("leaky"));
}

TEST(RateRuleValidation, CostsAndKeys) {
  using fairgate::validate_cost;
  EXPECT_FALSE(validate_cost(1.0));
  EXPECT_FALSE(validate_cost(std::int64_t{5}));
  EXPECT_EQ(validate_cost(0.0)->message(), "cost: 0 is not a whole number in 1..1000000000000");
  EXPECT_EQ(validate_cost(-2.0)->message(), "cost: -2 is not a whole number in 1..1000000000000");
  EXPECT_EQ(validate_cost(1.5)->message(),
            "cost: 1.5 is not a whole number");  // as docs/ratelimit.md shows it
  EXPECT_EQ(validate_cost(std::nan(""))->message(), "cost: NaN is not a whole number");
  EXPECT_EQ(validate_cost(std::numeric_limits<double>::infinity())->message(),
            "cost: infinity is not a whole number");
  EXPECT_EQ(validate_cost(1e300)->message(),
            "cost: 1.0000000000000001e+300 is not a whole number in 1..1000000000000");
  EXPECT_EQ(validate_cost(std::int64_t{0})->message(), "cost: 0 is not a whole number in 1..1000000000000");
  EXPECT_EQ(fairgate::validate_rate_key("")->message(), "key: must not be empty");
  EXPECT_EQ(fairgate::validate_rate_key(std::string(513, 'k'))->message(),
            "key: must be at most 512 bytes, got 513");
  EXPECT_FALSE(fairgate::validate_rate_key(std::string(512, 'k')));
  EXPECT_EQ(fairgate::validate_rate_key("a\nb")->message(), "key: must not contain control characters");
  EXPECT_TRUE(
      fairgate::validate_rate_key("a\xc2\x85"
                                  "b"))
      << "U+0085 (NEL), a C1 control";
  EXPECT_TRUE(fairgate::validate_rate_key("\xc2\x9f"));
  EXPECT_FALSE(fairgate::validate_rate_key("caf\xc3\xa9 \xc2\xa0x"))
      << "é and a no-break space are not controls";
  EXPECT_EQ(fairgate::validate_rule_name("per user")->message(),
            "rule: may contain only letters, digits, '.', '_' and '-'");
}

}  // namespace
