// RateLimiter against a real redis-server: 4 instances sharing a rule,
// every decision replayed in Redis' execution order against the reference
// models; multi-rule atomicity; refunds; the local layer; bad input; every key
// has a TTL; degraded modes with Redis unreachable.
#include "support/acl.hpp"
#include "support/log_lines.hpp"
#include "support/rate_checks.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"
#include "support/tcp_proxy.hpp"

#include <fairgate/log.hpp>
#include <fairgate/rate_limiter.hpp>

#include <gtest/gtest.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include <algorithm>
#include <mutex>
#include <random>
#include <set>
#include <thread>

namespace {

namespace asio = boost::asio;
using fairgate::RateAlgorithm;
using fairgate::RateDecision;
using fairgate::RateLimiter;
using fairgate::RateRequest;
using fairgate::RateResult;
using fairgate::RateRule;
using fairgate::test::RateReference;
using fairgate::test::RedisServer;
using namespace std::chrono_literals;

RateRule make_rule(RateAlgorithm a, std::int64_t rate, std::int64_t period, std::int64_t burst = 0) {
  RateRule r;
  r.algorithm = a;
  r.rate = rate;
  r.period_ms = period;
  r.burst = burst;
  return r;
}

class RedisRateLimitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    thread_ = std::thread([this] { io_.run(); });
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    prefix_ = std::string("rl-") + info->test_suite_name() + "-" + info->name();
    std::replace(prefix_.begin(), prefix_.end(), '/', '-');
  }
  void TearDown() override {
    for (auto& l : limiters_) l.shutdown();
    work_.reset();
    thread_.join();
  }
  static RedisServer& server() { return RedisServer::shared(); }

  RateLimiter instance(bool local_layer, std::string prefix = {}) {
    fairgate::RateLimiterRedisOptions o;
    o.url = server().url();
    o.key_prefix = prefix.empty() ? prefix_ : prefix;
    o.command_timeout = 2s;
    limiters_.push_back(RateLimiter::redis(io_.get_executor(), o, local_layer));
    return limiters_.back();
  }

  /// A rate limiter of its own on `url` (a server or proxy of the test's own), shut down by
  /// TearDown (a test that stops its server first shuts it down itself).
  RateLimiter own_limiter(std::string url, std::chrono::milliseconds command_timeout,
                          bool local_layer = false) {
    fairgate::RateLimiterRedisOptions o;
    o.url = std::move(url);
    o.key_prefix = prefix_;
    o.command_timeout = command_timeout;
    limiters_.push_back(RateLimiter::redis(io_.get_executor(), o, local_layer));
    return limiters_.back();
  }

  static RateResult check(RateLimiter& l, std::vector<RateRequest> r) {
    return l.async_check(std::move(r), asio::use_future).get();
  }
  static RateResult check(RateLimiter& l, std::string rule, std::string key, std::int64_t cost = 1) {
    return check(l, {RateRequest{std::move(rule), std::move(key), cost}});
  }

  // Every key under the prefix, with its PTTL.
  std::vector<std::pair<std::string, long>> keys_with_ttl() {
    std::vector<std::pair<std::string, long>> out;
    std::string cursor = "0";
    do {
      // RedisServer::command gives the array as lines: the cursor, then the keys.
      const std::string reply = server().command({"SCAN", cursor, "MATCH", prefix_ + ":*", "COUNT", "1000"});
      std::vector<std::string> lines;
      std::size_t pos = 0;
      while (pos <= reply.size()) {
        const std::size_t nl = std::min(reply.find('\n', pos), reply.size());
        lines.push_back(reply.substr(pos, nl - pos));
        pos = nl + 1;
      }
      cursor = lines.at(0);
      for (std::size_t i = 1; i < lines.size(); ++i)
        if (!lines[i].empty()) out.emplace_back(lines[i], std::stol(server().command({"PTTL", lines[i]})));
    } while (cursor != "0");
    return out;
  }

  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_{io_.get_executor()};
  std::thread thread_;
  std::string prefix_;
  std::vector<RateLimiter> limiters_;
};

struct Seen {
  std::int64_t at_us, at_ms, cost;
  bool allowed;
  RateDecision d;
};

// 4 instances, 4 threads, one key: random arrivals and costs; every decision
// replayed in Redis' order (TIME in µs) against the reference model.
class RedisRateExactness : public RedisRateLimitTest, public ::testing::WithParamInterface<RateAlgorithm> {};

TEST_P(RedisRateExactness, FourInstancesMatchTheReference) {
  const RateAlgorithm a = GetParam();
  const bool bucket = a == RateAlgorithm::token_bucket || a == RateAlgorithm::gcra;
  const RateRule rule = make_rule(a, 6, 100, bucket ? 9 : 0);
  std::vector<RateLimiter> fleet;
  for (int i = 0; i < 4; ++i) {
    fleet.push_back(instance(false));
    ASSERT_TRUE(fleet.back().set_rule("shared", rule));
  }
  std::mutex m;
  std::vector<Seen> seen;
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937 rng(1234 + i);
      for (int n = 0; n < 120; ++n) {
        const std::int64_t cost = std::uniform_int_distribution<int>(0, 3)(rng) == 0
                                      ? std::uniform_int_distribution<std::int64_t>(1, rule.capacity())(rng)
                                      : 1;
        const RateResult r = check(fleet[i], "shared", "k", cost);
        if (r.error || r.decisions.size() != 1 || r.source != fairgate::RateSource::store) {
          ADD_FAILURE() << "instance " << i << ": " << r.message;
          return;
        }
        {
          std::lock_guard lock(m);
          seen.push_back({r.decisions[0].at_us, r.decisions[0].at_ms, cost, r.allowed, r.decisions[0]});
        }
        std::this_thread::sleep_for(
            std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 12)(rng)));
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(seen.size(), 480u);
  std::sort(seen.begin(), seen.end(), [](const Seen& x, const Seen& y) { return x.at_us < y.at_us; });
  RateReference ref(rule);
  std::int64_t admitted = 0, refused = 0;
  for (const Seen& s : seen) {
    const bool want = ref.allowed(s.at_ms, s.cost);
    if (want) ref.admit(s.at_ms, s.cost);
    fairgate::core::rate::Decision d{s.d.allowed, s.d.remaining, s.d.reset.count(), s.d.retry_after.count()};
    fairgate::test::check_decision(ref, s.at_ms, s.cost, d, want);
    if (HasFatalFailure()) return;
    (want ? admitted : refused) += 1;
  }
  fairgate::test::check_bounds(ref);
  EXPECT_GT(admitted, 20);  // the schedule exercised both answers
  EXPECT_GT(refused, 20);
}

TEST_F(RedisRateLimitTest, MultiRuleRefusalTakesNothingFromTheOthers) {
  RateLimiter l = instance(false);
  ASSERT_TRUE(l.set_rule("wide", make_rule(RateAlgorithm::fixed_window, 5, 60'000)));
  ASSERT_TRUE(l.set_rule("narrow", make_rule(RateAlgorithm::sliding_log, 3, 60'000)));
  ASSERT_TRUE(l.set_rule("bucket", make_rule(RateAlgorithm::gcra, 1, 60'000, 10)));
  const std::vector<RateRequest> both{{"wide", "u", 1}, {"narrow", "u", 1}, {"bucket", "u", 2}};
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(check(l, both).allowed) << i;
  const RateResult r = check(l, both);
  ASSERT_FALSE(r.error) << r.message;
  EXPECT_FALSE(r.allowed);
  ASSERT_EQ(r.decisions.size(), 3u);
  EXPECT_TRUE(r.decisions[0].allowed);
  EXPECT_EQ(r.decisions[0].remaining, 2) << "wide: 5 - 3, nothing taken";
  EXPECT_FALSE(r.decisions[1].allowed);
  EXPECT_EQ(r.decisions[1].remaining, 0);
  EXPECT_TRUE(r.decisions[2].allowed);
  EXPECT_EQ(r.decisions[2].remaining, 4) << "bucket: 10 - 6, nothing taken";
  EXPECT_GT(r.retry_after(), 50s);
  // The others still have exactly what they had.
  const RateResult w = check(l, {{"wide", "u", 2}});
  EXPECT_TRUE(w.allowed);
  EXPECT_EQ(w.decisions[0].remaining, 0);
  const RateResult b = check(l, {{"bucket", "u", 4}});
  EXPECT_TRUE(b.allowed);
  EXPECT_EQ(b.decisions[0].remaining, 0);
}

TEST_F(RedisRateLimitTest, ShadowModeIsPublishedToEveryInstanceAndNeverRefuses) {
  RateLimiter a = instance(true), b = instance(true);
  const RateRule enforced = make_rule(RateAlgorithm::fixed_window, 1, 60'000);
  ASSERT_TRUE(a.set_rule("pub", enforced));
  ASSERT_TRUE(b.set_rule("pub", enforced));
  ASSERT_TRUE(check(b, "pub", "k").allowed);
  EXPECT_FALSE(check(b, "pub", "k").allowed);
  RateRule shadow = enforced;
  shadow.mode = fairgate::LimiterMode::shadow;
  const auto published = a.async_publish_rule("pub", shadow, asio::use_future).get();
  ASSERT_FALSE(published.error) << published.message;
  const auto synced = b.async_sync_rules(asio::use_future).get();
  ASSERT_FALSE(synced.error) << synced.message;
  EXPECT_EQ(synced.changed, 1u);
  ASSERT_EQ(b.rule("pub")->mode, fairgate::LimiterMode::shadow);
  const RateResult r = check(b, "pub", "k");
  EXPECT_TRUE(r.allowed) << "shadow: let through";
  ASSERT_EQ(r.decisions.size(), 1u);
  EXPECT_TRUE(r.decisions[0].shadow);
  EXPECT_FALSE(r.decisions[0].allowed) << "what enforcing would have said";
}

// A rule changed at run time lives in Redis. When Redis loses it (FLUSHALL, a restart without
// persistence), the instances that enforce it write it back at their next sync, so an instance
// started after the loss takes it, not its config file's (it took the config's, and the fleet
// enforced two limits).
TEST_F(RedisRateLimitTest, APublishedRuleLostByRedisIsWrittenBackAndTaken) {
  RedisServer own;
  const auto make = [&] { return own_limiter(own.url(), 200ms); };
  const RateRule config = make_rule(RateAlgorithm::fixed_window, 10, 60'000);
  RateLimiter a = make();
  ASSERT_TRUE(a.set_rule("fw", config));
  RateRule changed = config;
  changed.rate = 4;
  const auto published = a.async_publish_rule("fw", changed, asio::use_future).get();
  ASSERT_FALSE(published.error) << published.message;
  ASSERT_EQ(own.command({"FLUSHALL"}), "OK");
  ASSERT_FALSE(a.async_sync_rules(asio::use_future).get().error);  // finds it gone: writes it back
  RateLimiter c = make();  // started after the loss, with the config file's rule
  ASSERT_TRUE(c.set_rule("fw", config));
  const auto synced = c.async_sync_rules(asio::use_future).get();
  ASSERT_FALSE(synced.error) << synced.message;
  EXPECT_EQ(synced.changed, 1u);
  EXPECT_EQ(c.rule("fw")->rate, 4) << "the rule in force, not the config file's";
  // A rule only from the config file is never written: the store keeps no copy of it.
  RateLimiter d = make();
  ASSERT_TRUE(d.set_rule("plain", config));
  ASSERT_FALSE(d.async_sync_rules(asio::use_future).get().error);
  EXPECT_EQ(own.command({"HLEN", prefix_ + ":rl-rules"}), "1");
  for (auto* l : {&a, &c, &d}) l->shutdown();
}

TEST_F(RedisRateLimitTest, Refunds) {
  RateLimiter l = instance(true);
  for (RateAlgorithm a : {RateAlgorithm::fixed_window, RateAlgorithm::sliding_log,
                          RateAlgorithm::sliding_window, RateAlgorithm::token_bucket, RateAlgorithm::gcra}) {
    const std::string name(fairgate::to_string(a));
    SCOPED_TRACE(name);
    ASSERT_TRUE(l.set_rule(name, make_rule(a, 10, 600'000)));
    RateResult r = check(l, name, "k", 8);
    ASSERT_TRUE(r.allowed);
    EXPECT_EQ(r.decisions[0].remaining, 2);
    EXPECT_FALSE(check(l, name, "k", 5).allowed);
    // More than the decision took: an error, nothing given back.
    auto too_much = l.async_refund(r.decisions[0], 9, asio::use_future).get();
    EXPECT_EQ(too_much.error, fairgate::make_error_code(fairgate::RejectReason::invalid_argument));
    EXPECT_NE(too_much.message.find("amount: 9 is not in 1..8"), std::string::npos) << too_much.message;
    auto ok = l.async_refund(r.decisions[0], 5, asio::use_future).get();
    EXPECT_FALSE(ok.error) << ok.message;
    EXPECT_EQ(ok.refunded, 5);
    // The refund clears the local layer's block: 5 fit again.
    RateResult again = check(l, name, "k", 5);
    EXPECT_TRUE(again.allowed) << again.message;
    EXPECT_EQ(again.decisions[0].remaining, 2);
    // A decision gives back no more than it took, over all its refunds.
    auto rest = l.async_refund(r.decisions[0], 4, asio::use_future).get();
    EXPECT_EQ(rest.error, fairgate::make_error_code(fairgate::RejectReason::invalid_argument));
    EXPECT_NE(rest.message.find("amount: 4 exceeds the 3 units of this decision not refunded yet"),
              std::string::npos)
        << rest.message;
    rest = l.async_refund(r.decisions[0], 3, asio::use_future).get();
    EXPECT_EQ(rest.refunded, 3);
    EXPECT_EQ(check(l, name, "k", 1).decisions[0].remaining, 4);  // 10 - 8 + 5 - 5 + 3 - 1
  }
}

TEST_F(RedisRateLimitTest, BadInputIsAClearErrorAndTooBigACostIsRefusedWithAReason) {
  RateLimiter l = instance(true);
  ASSERT_TRUE(l.set_rule("r", make_rule(RateAlgorithm::token_bucket, 10, 1000, 20)));
  auto r = check(l, "nope", "k");
  EXPECT_EQ(r.error, fairgate::make_error_code(fairgate::Errc::unknown_rule));
  EXPECT_EQ(r.message, "rule \"nope\": unknown");
  r = check(l, "r", "");
  EXPECT_EQ(r.error, fairgate::make_error_code(fairgate::RejectReason::invalid_argument));
  EXPECT_EQ(r.message, "key: must not be empty");
  r = check(l, "r", std::string(513, 'x'));
  EXPECT_EQ(r.message, "key: must be at most 512 bytes, got 513");
  for (std::int64_t bad : {std::int64_t{0}, std::int64_t{-1}, fairgate::kMaxCost + 1}) {
    r = check(l, "r", "k", bad);
    EXPECT_EQ(r.error, fairgate::make_error_code(fairgate::RejectReason::invalid_argument)) << bad;
    EXPECT_NE(r.message.find("cost: " + std::to_string(bad) + " is not a whole number"), std::string::npos);
  }
  r = check(l, {{"r", "k", 1}, {"r", "k", 2}});
  EXPECT_NE(r.message.find("appears twice"), std::string::npos);
  r = check(l, "r", "k", 21);
  EXPECT_FALSE(r.error);
  EXPECT_FALSE(r.allowed);
  EXPECT_EQ(r.decisions[0].retry_after, -1ms);
  EXPECT_EQ(r.message, "cost 21 exceeds the capacity 20 of rule \"r\": it can never be allowed");
  EXPECT_TRUE(check(l, "r", "k", 20).allowed);
  EXPECT_TRUE(keys_with_ttl().size() == 1u);
}

TEST_F(RedisRateLimitTest, EveryKeyHasATtlNoLongerThanItsStateNeeds) {
  RateLimiter l = instance(false);
  const std::vector<std::pair<RateRule, std::int64_t>> rules{
      {make_rule(RateAlgorithm::fixed_window, 5, 30'000), 30'000},
      {make_rule(RateAlgorithm::sliding_log, 5, 30'000), 30'000},
      {make_rule(RateAlgorithm::sliding_window, 5, 30'000), 60'000},
      {make_rule(RateAlgorithm::token_bucket, 5, 30'000, 7), 7 * 30'000 / 5},
      {make_rule(RateAlgorithm::gcra, 5, 30'000, 7), 7 * 30'000 / 5}};
  for (std::size_t i = 0; i < rules.size(); ++i) {
    const std::string name = "r" + std::to_string(i);
    ASSERT_TRUE(l.set_rule(name, rules[i].first));
    for (int k = 0; k < 20; ++k) check(l, name, "key-" + std::to_string(k % 7), 1 + k % 3);
  }
  const auto keys = keys_with_ttl();
  EXPECT_EQ(keys.size(), 5u * 7u);
  for (const auto& [key, ttl] : keys) {
    EXPECT_GT(ttl, 0) << key;
    const std::size_t rule_index = key[key.find(":rl:{r") + 6] - '0';
    EXPECT_LE(ttl, rules[rule_index].second) << key;
    EXPECT_NE(key.find(":rl:{r" + std::to_string(rule_index) + ":key-"), std::string::npos) << key;
  }
}

// The local layer only refuses what Redis would refuse, and saves the round trips.
TEST_F(RedisRateLimitTest, LocalLayerRefusesOnlyWhatRedisWouldAndSavesRoundTrips) {
  for (RateAlgorithm a : {RateAlgorithm::fixed_window, RateAlgorithm::sliding_window, RateAlgorithm::gcra}) {
    SCOPED_TRACE(fairgate::to_string(a));
    const std::string name(fairgate::to_string(a));
    // 5 per 400 ms: a refusal's retry-after (gcra: up to the 80 ms emission
    // interval) stays well above a round trip even on a loaded machine under
    // a sanitizer (at 20 per 400 ms, gcra's 20 ms was not: the blocks ran out
    // before they saved anything, and the saving check failed once).
    constexpr std::int64_t limit = 5;
    const RateRule rule = make_rule(a, limit, 400);
    std::int64_t admitted[2] = {0, 0}, calls[2] = {0, 0}, local_refusals = 0;
    for (int with_layer = 0; with_layer < 2; ++with_layer) {
      RateLimiter l = instance(with_layer == 1, prefix_ + "-" + name + std::to_string(with_layer));
      RateLimiter probe = instance(false, prefix_ + "-" + name + std::to_string(with_layer));
      ASSERT_TRUE(l.set_rule(name, rule));
      ASSERT_TRUE(probe.set_rule(name, rule));
      const auto end = std::chrono::steady_clock::now() + 500ms;
      std::int64_t refused_until = 0;           // Redis time: the last store refusal's at_ms + retry_after
      std::int64_t first_at = -1, last_at = 0;  // Redis time of the store decisions
      auto seen_at = [&](const RateResult& x) {
        if (x.source != fairgate::RateSource::store) return;
        if (first_at < 0) first_at = x.decisions[0].at_ms;
        last_at = x.decisions[0].at_ms;
      };
      while (std::chrono::steady_clock::now() < end) {
        const RateResult r = check(l, name, "flood", 1);
        ASSERT_FALSE(r.error) << r.message;
        seen_at(r);
        if (r.allowed) ++admitted[with_layer];
        if (!r.allowed && r.source == fairgate::RateSource::store)
          refused_until = r.decisions[0].at_ms + r.decisions[0].retry_after.count();
        if (r.source == fairgate::RateSource::local_layer && ++local_refusals % 8 == 1) {
          // Asked right after, Redis refuses too — unless the probe reached
          // Redis after the refusal it learnt from had run out.
          const RateResult p = check(probe, name, "flood", 1);
          seen_at(p);
          if (p.allowed) {
            EXPECT_GE(p.decisions[0].at_ms, refused_until) << "the local layer refused what Redis allows";
            ++admitted[with_layer];
          }
        }
      }
      calls[with_layer] = static_cast<std::int64_t>(l.rules()[0].stats.store_calls);
      // Either way no more than the rule allows (probes included), over the
      // span Redis saw: ≤ 5 per aligned 400 ms window it touched, and for
      // gcra ≤ the burst 5 + 5 per 400 ms.
      const std::int64_t bound = a == RateAlgorithm::gcra ? limit + (last_at - first_at) * limit / 400
                                                          : limit * (last_at / 400 - first_at / 400 + 1);
      EXPECT_LE(admitted[with_layer], bound);
    }
    EXPECT_GT(local_refusals, 0);
    EXPECT_LT(calls[1] * 2, calls[0]) << "the local layer should save most round trips of a flood";
  }
}

// The local layer's blocks of keys that are never asked about again are swept
// once they ran out. They were kept for ever: a helper's soak saw a process
// grow by ~560 bytes for every distinct key refused once, 30,000 keys a step.
TEST_F(RedisRateLimitTest, LocalLayerForgetsBlocksOfKeysNeverSeenAgain) {
  RateLimiter l = instance(true);
  ASSERT_TRUE(l.set_rule("once", make_rule(RateAlgorithm::fixed_window, 1, 300)));
  constexpr int kKeys = 1500;
  for (int batch = 0; batch < 3; ++batch) {
    for (int k = 0; k < kKeys; ++k) {
      const std::string key = "b" + std::to_string(batch) + "-" + std::to_string(k);
      check(l, "once", key);
      check(l, "once", key);  // refused (unless the window just turned): blocked until it turns
    }
    std::this_thread::sleep_for(400ms);  // every block of this batch has run out
  }
  EXPECT_GT(l.rules()[0].stats.refused, 2u * kKeys) << "most second checks were refused and blocked";
  EXPECT_LT(l.local_layer_keys(), static_cast<std::size_t>(2 * kKeys))
      << "blocks of keys never seen again are kept (3 batches of " << kKeys << ")";
}

// Redis unreachable: each rule follows its on_redis_down policy.
TEST_F(RedisRateLimitTest, RedisDownFollowsOnRedisDown) {
  RateLimiter l = own_limiter("redis://127.0.0.1:1", 100ms, true);
  RateRule local = make_rule(RateAlgorithm::fixed_window, 8, 600'000);
  local.local_divisor = 4;  // this instance's share: 2
  RateRule open = local;
  open.on_redis_down = fairgate::RedisDownPolicy::open;
  RateRule closed = local;
  closed.on_redis_down = fairgate::RedisDownPolicy::closed;
  ASSERT_TRUE(l.set_rule("local", local));
  ASSERT_TRUE(l.set_rule("open", open));
  ASSERT_TRUE(l.set_rule("closed", closed));
  const RateResult first = check(l, "local", "k");
  const RateResult second = check(l, "local", "k");
  EXPECT_TRUE(first.allowed && second.allowed);
  RateResult r = check(l, "local", "k");
  EXPECT_FALSE(r.allowed) << "over the local share of 8 / 4";
  EXPECT_EQ(r.source, fairgate::RateSource::degraded);
  EXPECT_TRUE(l.degraded());
  // A decision of the local share is refunded there (it went to the unreachable Redis, and a
  // token budget kept a reservation the upstream never used); each decision has its own units.
  for (const RateResult* d : {&first, &second}) {
    const auto back = l.async_refund(d->decisions[0], 1, asio::use_future).get();
    EXPECT_FALSE(back.error) << back.message;
    EXPECT_EQ(back.refunded, 1);
  }
  EXPECT_TRUE(check(l, "local", "k").allowed) << "the refunded units fit again";
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(check(l, "open", "k").allowed);
  // Open counts nothing anywhere: nothing to refund.
  const RateResult passed = check(l, "open", "k");
  EXPECT_FALSE(passed.decisions[0].taken);
  EXPECT_EQ(l.async_refund(passed.decisions[0], 1, asio::use_future).get().error,
            fairgate::make_error_code(fairgate::RejectReason::invalid_argument));
  r = check(l, "closed", "k");
  EXPECT_FALSE(r.allowed);
  EXPECT_EQ(r.reason, fairgate::RejectReason::unavailable);
  EXPECT_NE(r.message.find("on_redis_down = closed"), std::string::npos) << r.message;
  // Several rules: closed wins.
  r = check(l, {{"open", "k", 1}, {"closed", "k", 1}});
  EXPECT_FALSE(r.allowed);
  const auto rules = l.rules();
  EXPECT_GE(rules[0].stats.store_errors, 1u);
  EXPECT_GE(rules[0].stats.degraded, 1u);
}

// A refund Redis did not apply (here refused: maxmemory 1, OOM) gives nothing back, so the
// decision may still give those units back later; they counted as given before.
TEST_F(RedisRateLimitTest, ARefundThatFailedCanBeMadeAgain) {
  RedisServer own;
  RateLimiter l = own_limiter(own.url(), 200ms);
  ASSERT_TRUE(l.set_rule("r", make_rule(RateAlgorithm::fixed_window, 1000, 600'000)));
  const RateResult d = check(l, "r", "k", 100);
  ASSERT_TRUE(d.allowed) << d.message;
  ASSERT_EQ(own.command({"CONFIG", "SET", "maxmemory", "1"}), "OK");
  const auto failed = l.async_refund(d.decisions[0], 40, asio::use_future).get();
  EXPECT_EQ(failed.error, fairgate::make_error_code(fairgate::Errc::unavailable)) << failed.message;
  ASSERT_EQ(own.command({"CONFIG", "SET", "maxmemory", "0"}), "OK");
  EXPECT_EQ(l.async_refund(d.decisions[0], 40, asio::use_future).get().refunded, 40);
  const auto rest = l.async_refund(d.decisions[0], 60, asio::use_future).get();
  EXPECT_FALSE(rest.error) << rest.message;
  EXPECT_EQ(rest.refunded, 60) << "100 taken, 40 + 60 given back";
  l.shutdown();
}

// A refund that gets no reply in time (Redis stalled by DEBUG SLEEP) may still run: Redis
// runs it when it wakes. The answer must say what happened: given back (it ran, once), or
// "not applied" only when it never runs, or "outcome unknown". Before, it was "not applied"
// while Redis gave the units back late, and a caller that sent it again got them back twice
// (a helper saw 10 more requests pass in the window instead of 5, every algorithm).
TEST_F(RedisRateLimitTest, ARefundWithoutAReplyIsAnsweredWithWhatRedisDid) {
  RedisServer own;
  const auto timeout = 300ms;
  RateLimiter l = own_limiter(own.url(), timeout);
  for (const auto algorithm : {RateAlgorithm::fixed_window, RateAlgorithm::token_bucket}) {
    const std::string rule = "r" + std::to_string(static_cast<int>(algorithm));
    ASSERT_TRUE(l.set_rule(rule, make_rule(algorithm, 100, 600'000)));
    const RateResult d = check(l, rule, "k", 100);
    ASSERT_TRUE(d.allowed) << d.message;
    std::thread stall([&] { own.command({"DEBUG", "SLEEP", "1"}); });
    std::this_thread::sleep_for(150ms);
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = l.async_refund(d.decisions[0], 40, asio::use_future).get();
    const auto took = std::chrono::steady_clock::now() - t0;
    stall.join();
    EXPECT_GE(took, timeout) << "the refund was not stalled: the test tells nothing";
    // What Redis did: 40 came back iff a check of 40 passes now (nothing refills meanwhile).
    const bool came_back = check(l, rule, "k", 40).allowed;
    if (!r.error) {
      EXPECT_EQ(r.refunded, 40) << rule;
      EXPECT_TRUE(came_back) << rule << ": answered given back, but Redis has not";
    } else if (r.message.find("outcome unknown") == std::string::npos) {
      EXPECT_EQ(r.message.rfind("refund not applied", 0), 0u) << r.message;
      EXPECT_FALSE(came_back) << rule << ": answered \"" << r.message << "\", yet Redis gave it back";
    } else {
      ADD_FAILURE() << rule << ": the outcome stayed unknown after Redis woke: " << r.message;
    }
  }
  // Stalled past every claim (3 s; 4 command timeouts are 1.2 s): the answer says the outcome
  // is unknown, and its units stay counted as given back, so that sending it again cannot give
  // back more than the decision took.
  ASSERT_TRUE(l.set_rule("long", make_rule(RateAlgorithm::fixed_window, 100, 600'000)));
  const RateResult d = check(l, "long", "k", 100);
  ASSERT_TRUE(d.allowed) << d.message;
  std::thread stall([&] { own.command({"DEBUG", "SLEEP", "3"}); });
  std::this_thread::sleep_for(150ms);
  const auto r = l.async_refund(d.decisions[0], 40, asio::use_future).get();
  stall.join();
  EXPECT_EQ(r.error, fairgate::make_error_code(fairgate::Errc::unavailable));
  EXPECT_NE(r.message.find("refund outcome unknown"), std::string::npos) << r.message;
  const auto more = l.async_refund(d.decisions[0], 61, asio::use_future).get();
  EXPECT_EQ(more.error, fairgate::make_error_code(fairgate::RejectReason::invalid_argument)) << more.message;
  EXPECT_EQ(l.async_refund(d.decisions[0], 60, asio::use_future).get().refunded, 60);
  l.shutdown();
}

// A Redis that refuses writes for now (here NOREPLICAS: min-replicas-to-write
// 1 and no replica) is, for a rate decision, Redis down: decided at once by
// on_redis_down, not sent again until the command timeout as a concurrency
// limiter's calls are (a rate decision cannot wait: docs/ratelimit.md).
// Once writes are back, Redis decides again.
TEST_F(RedisRateLimitTest, ARefusedWriteIsDecidedAtOnceByOnRedisDown) {
  RedisServer own;
  // command timeout: a decision that waited for it would show
  const auto timeout = 5s;
  RateLimiter l = own_limiter(own.url(), timeout);
  RateRule rule = make_rule(RateAlgorithm::fixed_window, 8, 600'000);
  rule.local_divisor = 4;
  ASSERT_TRUE(l.set_rule("r", rule));
  EXPECT_EQ(check(l, "r", "k").source, fairgate::RateSource::store);
  // The outage is said once, and its end (the library's log sink; the test's own lines only).
  fairgate::test::LogLines logged;
  fairgate::set_log_sink([sink = logged.sink()](fairgate::LogLevel, std::string_view line) {
    if (line.starts_with("rate limits: ")) sink(line);
  });
  ASSERT_EQ(own.command({"CONFIG", "SET", "min-replicas-to-write", "1"}), "OK");
  const auto t0 = std::chrono::steady_clock::now();
  const RateResult r = check(l, "r", "k");
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(r.source, fairgate::RateSource::degraded);
  EXPECT_TRUE(r.allowed) << "within the local share of 8 / 4";
  EXPECT_LT(took, timeout / 2) << "decided at once, not after the command timeout";
  EXPECT_TRUE(l.degraded());
  EXPECT_EQ(check(l, "r", "k").source, fairgate::RateSource::degraded);
  ASSERT_EQ(own.command({"CONFIG", "SET", "min-replicas-to-write", "0"}), "OK");
  EXPECT_EQ(check(l, "r", "k").source, fairgate::RateSource::store);
  EXPECT_EQ(check(l, "r", "k").source, fairgate::RateSource::store);
  EXPECT_FALSE(l.degraded());
  fairgate::set_log_sink({});
  EXPECT_EQ(logged.with_all({"Redis did not decide", "NOREPLICAS", "on_redis_down"}).size(), 1u)
      << logged.all();
  EXPECT_EQ(logged.with("Redis answers again").size(), 1u) << logged.all();
  EXPECT_EQ(logged.lines().size(), 2u) << logged.all();
  l.shutdown();  // while its server is up (after, closing waits the command timeout)
}

// A user the ACL does not let call the decision script: decided by
// on_redis_down at once (closed here: refused), and the answer carries
// Redis' own words, not a bare "Redis error". Allowed again, Redis decides.
TEST_F(RedisRateLimitTest, ACallTheAclRefusesIsDecidedByOnRedisDownWithRedisWords) {
  RedisServer own;
  ASSERT_EQ(own.command(fairgate::test::documented_acl("fg-rl", "pw", prefix_)), "OK");
  RateLimiter l = own_limiter("redis://fg-rl:pw@127.0.0.1:" + std::to_string(own.port()), 200ms);
  RateRule rule = make_rule(RateAlgorithm::fixed_window, 8, 600'000);
  rule.on_redis_down = fairgate::RedisDownPolicy::closed;
  ASSERT_TRUE(l.set_rule("r", rule));
  EXPECT_EQ(check(l, "r", "k").source, fairgate::RateSource::store);
  ASSERT_EQ(own.command({"ACL", "SETUSER", "fg-rl", "-evalsha"}), "OK");
  const RateResult r = check(l, "r", "k");
  EXPECT_EQ(r.source, fairgate::RateSource::degraded);
  EXPECT_FALSE(r.allowed) << "on_redis_down = closed";
  EXPECT_NE(r.message.find("NOPERM this user has no permissions to run the 'evalsha' command"),
            std::string::npos)
      << r.message;
  EXPECT_TRUE(l.degraded());
  ASSERT_EQ(own.command({"ACL", "SETUSER", "fg-rl", "+evalsha"}), "OK");
  EXPECT_EQ(check(l, "r", "k").source, fairgate::RateSource::store);
  EXPECT_FALSE(l.degraded());
  l.shutdown();
}

// A decision whose reply has one field of the wrong type (the test proxy
// spoils every script reply, Mangling::inner) is a store error, decided by
// on_redis_down — never read as an allow or a refusal, nor its figures as 0.
TEST_F(RedisRateLimitTest, ABadReplyIsAStoreErrorNeverADecision) {
  fairgate::test::TcpProxy proxy("127.0.0.1", server().port());
  RateLimiter l = own_limiter("redis://127.0.0.1:" + std::to_string(proxy.port()), 2s);
  RateRule rule = make_rule(RateAlgorithm::token_bucket, 1000, 60'000);
  rule.on_redis_down = fairgate::RedisDownPolicy::closed;
  ASSERT_TRUE(l.set_rule("r", rule));
  ASSERT_TRUE(check(l, "r", "k").allowed);
  proxy.mangle_replies(1.0, 5, "EVALSHA", fairgate::test::Mangling::inner);
  constexpr int kChecks = 40;
  for (int i = 0; i < kChecks; ++i) {
    const RateResult r = check(l, "r", "k");
    EXPECT_FALSE(r.allowed);
    EXPECT_EQ(r.reason, fairgate::RejectReason::unavailable) << r.message;
    EXPECT_EQ(r.source, fairgate::RateSource::degraded);
    EXPECT_NE(r.message.find("unexpected reply"), std::string::npos) << r.message;
  }
  EXPECT_EQ(proxy.replies_mangled(), static_cast<std::uint64_t>(kChecks));
  EXPECT_EQ(l.rules().at(0).stats.store_errors, static_cast<std::uint64_t>(kChecks));
  proxy.mangle_replies(0);
  const RateResult sound = check(l, "r", "k");
  EXPECT_TRUE(sound.allowed);
  EXPECT_EQ(sound.source, fairgate::RateSource::store);
  l.shutdown();  // before the proxy goes
}

INSTANTIATE_TEST_SUITE_P(All, RedisRateExactness,
                         ::testing::Values(RateAlgorithm::fixed_window, RateAlgorithm::sliding_log,
                                           RateAlgorithm::sliding_window, RateAlgorithm::token_bucket,
                                           RateAlgorithm::gcra),
                         [](const auto& param_info) {
                           return std::string(fairgate::to_string(param_info.param));
                         });

// A 3-master Redis Cluster: keys of many (rule, key) pairs spread over the
// masters, each decision exact (one key, one slot); a multi-rule check whose
// keys hash to different slots is bad input, one whose keys share a slot works.
TEST_F(RedisRateLimitTest, ClusterDecidesPerKeyAndRefusesCrossSlotChecks) {
  fairgate::test::RedisCluster cluster;
  ASSERT_TRUE(cluster.wait_stable(20s));
  RateLimiter l = own_limiter(cluster.url(), 2s);
  ASSERT_TRUE(l.set_rule("fw", make_rule(RateAlgorithm::fixed_window, 3, 600'000)));
  ASSERT_TRUE(l.set_rule("tb", make_rule(RateAlgorithm::token_bucket, 1, 600'000, 3)));
  std::set<int> owners;
  for (int k = 0; k < 12; ++k) {
    const std::string key = "user-" + std::to_string(k);
    owners.insert(cluster.owner_of_slot(cluster.slot_of(prefix_ + ":rl:{fw:" + key + "}:fixed_window")));
    for (int i = 0; i < 3; ++i) {
      const RateResult r = check(l, "fw", key);
      ASSERT_FALSE(r.error) << r.message;
      ASSERT_TRUE(r.allowed) << key << " " << i << ": " << r.message;
      EXPECT_EQ(r.decisions[0].remaining, 2 - i);
    }
    const RateResult over = check(l, "fw", key);
    EXPECT_FALSE(over.allowed);
    EXPECT_EQ(over.source, fairgate::RateSource::store);
  }
  EXPECT_EQ(owners.size(), 3u) << "the keys should spread over the 3 masters";
  // Different hash tags, different slots (for these two): refused as bad input.
  std::string key = "u";
  for (int i = 0; cluster.slot_of(prefix_ + ":rl:{fw:" + key + "}:fixed_window") ==
                  cluster.slot_of(prefix_ + ":rl:{tb:" + key + "}:token_bucket");
       ++i)
    key = "u" + std::to_string(i);
  const RateResult cross = check(l, {{"fw", key, 1}, {"tb", key, 1}});
  EXPECT_EQ(cross.error, fairgate::make_error_code(fairgate::RejectReason::invalid_argument));
  EXPECT_NE(cross.message.find("must hash to one slot"), std::string::npos) << cross.message;
}

}  // namespace
