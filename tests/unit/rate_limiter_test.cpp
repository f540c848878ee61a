// RateLimiter on the memory store: 4 threads sharing a rule, every decision
// replayed in the store's order against the reference model; multi-rule
// atomicity; refunds; bad input.
#include "support/rate_checks.hpp"

#include <fairgate/rate_limiter.hpp>

#include <gtest/gtest.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include <algorithm>
#include <mutex>
#include <random>
#include <thread>

namespace {

namespace asio = boost::asio;
using fairgate::RateAlgorithm;
using fairgate::RateLimiter;
using fairgate::RateRequest;
using fairgate::RateResult;
using fairgate::RateRule;
using namespace std::chrono_literals;

RateRule make_rule(RateAlgorithm a, std::int64_t rate, std::int64_t period, std::int64_t burst = 0) {
  RateRule r;
  r.algorithm = a;
  r.rate = rate;
  r.period_ms = period;
  r.burst = burst;
  return r;
}

class MemoryRateLimiter : public ::testing::TestWithParam<RateAlgorithm> {
 protected:
  void SetUp() override {
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    work_.reset();
    thread_.join();
  }
  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_{io_.get_executor()};
  std::thread thread_;
};

TEST_P(MemoryRateLimiter, FourThreadsMatchTheReference) {
  const RateAlgorithm a = GetParam();
  const bool bucket = a == RateAlgorithm::token_bucket || a == RateAlgorithm::gcra;
  const RateRule rule = make_rule(a, 6, 50, bucket ? 9 : 0);
  RateLimiter l = RateLimiter::memory(io_.get_executor());
  ASSERT_TRUE(l.set_rule("shared", rule));
  std::mutex m;
  std::vector<std::pair<std::int64_t, fairgate::RateDecision>> seen;
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937 rng(99 + i);
      for (int n = 0; n < 150; ++n) {
        const std::int64_t cost = std::uniform_int_distribution<int>(0, 3)(rng) == 0
                                      ? std::uniform_int_distribution<std::int64_t>(1, rule.capacity())(rng)
                                      : 1;
        RateResult r = l.async_check(RateRequest{"shared", "k", cost}, asio::use_future).get();
        if (r.error || r.decisions.size() != 1) {
          ADD_FAILURE() << r.message;
          return;
        }
        {
          std::lock_guard lock(m);
          seen.emplace_back(r.decisions[0].at_us, r.decisions[0]);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 4)(rng)));
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(seen.size(), 600u);
  std::sort(seen.begin(), seen.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  fairgate::test::RateReference ref(rule);
  int admitted = 0;
  for (const auto& [us, d] : seen) {
    const bool want = ref.allowed(d.at_ms, d.cost);
    if (want) ref.admit(d.at_ms, d.cost);
    fairgate::test::check_decision(
        ref, d.at_ms, d.cost,
        fairgate::core::rate::Decision{d.allowed, d.remaining, d.reset.count(), d.retry_after.count()}, want);
    if (HasFatalFailure()) return;
    admitted += want;
  }
  fairgate::test::check_bounds(ref);
  EXPECT_GT(admitted, 20);
  EXPECT_LT(admitted, 590);
}

INSTANTIATE_TEST_SUITE_P(All, MemoryRateLimiter,
                         ::testing::Values(RateAlgorithm::fixed_window, RateAlgorithm::sliding_log,
                                           RateAlgorithm::sliding_window, RateAlgorithm::token_bucket,
                                           RateAlgorithm::gcra),
                         [](const auto& param_info) {
                           return std::string(fairgate::to_string(param_info.param));
                         });

TEST(MemoryRateLimiterApi, MultiRuleRefundsAndBadInput) {
  asio::io_context io;
  std::thread t;
  auto work = asio::make_work_guard(io);
  t = std::thread([&] { io.run(); });
  RateLimiter l = RateLimiter::memory(io.get_executor());
  ASSERT_TRUE(l.set_rule("a", make_rule(RateAlgorithm::fixed_window, 5, 600'000)));
  ASSERT_TRUE(l.set_rule("b", make_rule(RateAlgorithm::token_bucket, 1, 600'000, 2)));
  auto check = [&](std::vector<RateRequest> r) {
    return l.async_check(std::move(r), asio::use_future).get();
  };
  EXPECT_TRUE(check({{"a", "u", 1}, {"b", "u", 1}}).allowed);
  RateResult second = check({{"a", "u", 1}, {"b", "u", 1}});
  EXPECT_TRUE(second.allowed);
  RateResult third = check({{"a", "u", 1}, {"b", "u", 1}});
  EXPECT_FALSE(third.allowed);
  EXPECT_EQ(third.decisions[0].remaining, 3) << "nothing taken from a";
  EXPECT_TRUE(third.decisions[0].allowed);
  EXPECT_FALSE(third.decisions[1].allowed);
  EXPECT_TRUE(second.decisions[0].taken && second.decisions[1].taken);
  EXPECT_FALSE(third.decisions[0].taken) << "a would-allow in a refused check took nothing";
  // ...so it cannot be refunded: that would give back a unit never taken (a's rate exceeded).
  const auto phantom = l.async_refund(third.decisions[0], 1, asio::use_future).get();
  EXPECT_EQ(phantom.error, fairgate::make_error_code(fairgate::RejectReason::invalid_argument));
  EXPECT_EQ(phantom.refunded, 0);
  EXPECT_NE(phantom.message.find("took nothing"), std::string::npos) << phantom.message;
  EXPECT_EQ(third.retry_after(), third.decisions[1].retry_after);
  EXPECT_GT(third.retry_after(), 0ms);
  // Refund b's unit of the second decision: the pair fits again.
  auto refund = l.async_refund(second.decisions[1], 1, asio::use_future).get();
  EXPECT_FALSE(refund.error) << refund.message;
  EXPECT_EQ(refund.refunded, 1);
  EXPECT_TRUE(check({{"a", "u", 1}, {"b", "u", 1}}).allowed);
  EXPECT_EQ(l.async_refund(second.decisions[1], 1, asio::use_future).get().error,
            fairgate::make_error_code(fairgate::RejectReason::invalid_argument))
      << "a second refund of the same unit";
  EXPECT_EQ(check({{"zzz", "u", 1}}).error, fairgate::make_error_code(fairgate::Errc::unknown_rule));
  EXPECT_EQ(check({{"a", "", 1}}).message, "key: must not be empty");
  EXPECT_EQ(check({{"a", "u", 0}}).message, "cost: 0 is not a whole number in 1..1000000000000");
  RateResult big = check({{"a", "u", 6}});
  EXPECT_FALSE(big.error);
  EXPECT_FALSE(big.allowed);
  EXPECT_EQ(big.decisions[0].retry_after, -1ms);
  EXPECT_EQ(big.retry_after(), -1ms) << "never, not 'now'";
  EXPECT_EQ(check({{"b", "u", 1}, {"a", "u", 6}}).retry_after(), -1ms) << "never wins over a wait";
  EXPECT_EQ(l.rules().size(), 2u);
  EXPECT_FALSE(l.set_rule("bad name", make_rule(RateAlgorithm::gcra, 1, 1000)));
  EXPECT_EQ(l.set_rule("c", make_rule(RateAlgorithm::gcra, 0, 1000)).error().message(),
            "rate: 0 is not in 1..1000000000");
  work.reset();
  t.join();
}

TEST(MemoryRateLimiterApi, ShadowRuleNeverRefusesAndCountsWhatItWouldHave) {
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  std::thread t([&] { io.run(); });
  RateLimiter l = RateLimiter::memory(io.get_executor());
  RateRule shadow = make_rule(RateAlgorithm::fixed_window, 1, 600'000);
  shadow.mode = fairgate::LimiterMode::shadow;
  ASSERT_TRUE(l.set_rule("sh", shadow));
  ASSERT_TRUE(l.set_rule("enf", make_rule(RateAlgorithm::fixed_window, 2, 600'000)));
  auto check = [&](std::vector<RateRequest> r) {
    return l.async_check(std::move(r), asio::use_future).get();
  };
  // Alone: always allowed; the decision says what the rule would do.
  const RateResult first = check({{"sh", "u", 1}});
  ASSERT_TRUE(first.allowed);
  EXPECT_TRUE(first.decisions[0].shadow);
  EXPECT_TRUE(first.decisions[0].allowed);
  const RateResult second = check({{"sh", "u", 1}});
  EXPECT_TRUE(second.allowed) << "a shadow rule never refuses";
  EXPECT_TRUE(second.decisions[0].shadow);
  EXPECT_FALSE(second.decisions[0].allowed) << "it would have";
  EXPECT_EQ(second.retry_after(), 0ms) << "no retry for what was allowed";
  // With an enforced rule: the enforced one decides, in the order asked.
  const RateResult mixed = check({{"enf", "u", 1}, {"sh", "u", 1}});
  ASSERT_TRUE(mixed.allowed);
  ASSERT_EQ(mixed.decisions.size(), 2u);
  EXPECT_EQ(mixed.decisions[0].rule, "enf");
  EXPECT_FALSE(mixed.decisions[0].shadow);
  EXPECT_EQ(mixed.decisions[1].rule, "sh");
  EXPECT_TRUE(mixed.decisions[1].shadow);
  EXPECT_FALSE(mixed.decisions[1].allowed);
  ASSERT_TRUE(check({{"sh", "u", 1}, {"enf", "u", 1}}).allowed);
  const RateResult refused = check({{"sh", "u", 1}, {"enf", "u", 1}});
  EXPECT_FALSE(refused.allowed) << "the enforced rule is spent";
  EXPECT_EQ(refused.decisions[1].rule, "enf");
  EXPECT_FALSE(refused.decisions[1].allowed);
  for (const auto& r : l.rules()) {
    if (r.name == "sh") {
      EXPECT_EQ(r.stats.refused, 4u) << "what it would have refused";
    }
  }
  // Bad input is still an error, and an error takes nothing, from the shadow rule either.
  EXPECT_EQ(check({{"sh", "", 1}}).message, "key: must not be empty");
  RateRule spare = make_rule(RateAlgorithm::fixed_window, 1, 600'000);
  spare.mode = fairgate::LimiterMode::shadow;
  ASSERT_TRUE(l.set_rule("sh2", spare));
  EXPECT_EQ(check({{"nope", "k", 1}, {"sh2", "k", 1}}).error,
            fairgate::make_error_code(fairgate::Errc::unknown_rule));
  EXPECT_EQ(check({{"enf", "", 1}, {"sh2", "k", 1}}).message, "key: must not be empty");
  const RateResult fresh = check({{"sh2", "k", 1}});
  ASSERT_TRUE(fresh.allowed);
  EXPECT_TRUE(fresh.decisions[0].allowed) << "the failed checks took sh2's one unit";
  EXPECT_TRUE(fresh.decisions[0].taken);
  work.reset();
  t.join();
}

}  // namespace
