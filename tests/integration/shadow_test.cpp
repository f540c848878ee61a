// Shadow mode (F14, docs/shadow.md) on the memory backend and on a real
// redis-server: a shadow limiter lets everything through at once, and the
// would-be figures it reports match what an enforcing limiter reports for the
// same schedule of arrivals and holds.
#include "support/instance.hpp"
#include "support/redis_server.hpp"
#include "support/wait.hpp"

#include <fairgate/backend.hpp>
#include <fairgate/redis_backend.hpp>

#include <gtest/gtest.h>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <cstdio>
#include <future>
#include <memory>
#include <random>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
using fairgate::AcquireOptions;
using fairgate::AcquireResult;
using fairgate::LimiterMode;
using fairgate::RejectReason;
using fairgate::Settings;
using fairgate::test::RedisServer;
using fairgate::test::wait_until;
using namespace std::chrono_literals;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::string test_name() { return ::testing::UnitTest::GetInstance()->current_test_info()->name(); }

/// One instance (tests/support/instance.hpp): the memory backend when
/// `redis_url` is empty.
class Instance : public fairgate::test::Instance {
 public:
  explicit Instance(const std::string& redis_url = "") : fairgate::test::Instance(options(redis_url)) {}

 private:
  static std::optional<fairgate::RedisBackendOptions> options(const std::string& redis_url) {
    if (redis_url.empty()) return std::nullopt;
    fairgate::RedisBackendOptions o;
    o.url = redis_url;
    o.heartbeat_interval = 250ms;
    o.liveness_ttl = 2000ms;
    o.command_timeout = 1000ms;  // sanitizer builds are slow: no spurious timeouts
    o.key_expiry = 0ms;
    return o;
  }
};

/// The limiter uses the settings stored in Redis and, as of its last heartbeat, is not fenced.
bool on_redis_past_fence(fairgate::Limiter& l) {
  const auto e = l.snapshot().engine;
  return e.settings_source == "redis" && e.fence_left.count() == 0;
}

/// One request of a schedule: arrives `at` after the start, holds its permit `hold`.
struct Request {
  milliseconds at;
  milliseconds hold;
};

/// W2-like (docs/bench.md): `n` requests arriving at random over `window`, holds of 20-80 ms.
std::vector<Request> schedule(unsigned seed, int n, milliseconds window) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> at(0, static_cast<int>(window.count()));
  std::uniform_int_distribution<int> hold(20, 80);
  std::vector<Request> out;
  for (int i = 0; i < n; ++i) out.push_back({milliseconds(at(rng)), milliseconds(hold(rng))});
  return out;
}

/// What the clients saw: one end per request, and the most permits held at once.
struct Run {
  std::vector<AcquireResult> results;
  int max_concurrent = 0;
  int ends = 0;
};

/// Plays `requests` against `limiters` (request i on limiters[i % size]) from
/// one driver thread: each acquires at its time and, once granted, holds for
/// its hold time, then releases.
Run play(const std::vector<fairgate::Limiter>& limiters, const std::vector<Request>& requests) {
  asio::io_context driver;
  Run run;
  run.results.resize(requests.size());
  int holding = 0;
  const auto start = Clock::now() + 50ms;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    auto timer = std::make_shared<asio::steady_timer>(driver, start + requests[i].at);
    timer->async_wait([&, i, timer](const boost::system::error_code&) {
      fairgate::Limiter limiter = limiters[i % limiters.size()];
      AcquireOptions options;
      limiter.async_acquire(
          options, asio::bind_executor(driver, [&, i](AcquireResult r) {
            ++run.ends;
            if (r.granted()) {
              run.max_concurrent = std::max(run.max_concurrent, ++holding);
              auto hold = std::make_shared<asio::steady_timer>(driver, requests[i].hold);
              hold->async_wait([&, hold, permit = r.take_permit()](const boost::system::error_code&) mutable {
                --holding;
                permit.release();
              });
            }
            run.results[i] = std::move(r);
          }));
    });
  }
  driver.run();
  return run;
}

struct Figures {
  std::uint64_t granted = 0;
  std::uint64_t queued = 0;  ///< granted after a wait
  std::uint64_t timed_out = 0;
  std::uint64_t rejected = 0;
  double mean_wait_ms = 0;  ///< over the granted
};

Figures enforced_figures(const Run& run) {
  Figures f;
  double sum = 0;
  for (const auto& r : run.results) {
    if (r.granted()) {
      ++f.granted;
      if (r.waited().count() > 0) ++f.queued;
      sum += static_cast<double>(r.waited().count());
    } else if (r.reason() == RejectReason::timeout) {
      ++f.timed_out;
    } else {
      ++f.rejected;
    }
  }
  f.mean_wait_ms = f.granted ? sum / static_cast<double>(f.granted) : 0;
  return f;
}

Figures shadow_figures(const std::vector<fairgate::Limiter>& limiters) {
  Figures f;
  double sum = 0;
  for (const auto& l : limiters) {
    const auto sh = l.snapshot().shadow;
    f.granted += sh.would_grant;
    f.queued += sh.would_queue;
    f.timed_out += sh.would_end_by_reason[static_cast<std::size_t>(RejectReason::timeout)];
    f.rejected += sh.would_end() - sh.would_end_by_reason[static_cast<std::size_t>(RejectReason::timeout)];
    sum += static_cast<double>(sh.would_wait_ms_sum);
  }
  f.mean_wait_ms = f.granted ? sum / static_cast<double>(f.granted) : 0;
  return f;
}

/// Every shadow ended and gave its seat back.
bool shadows_done(const std::vector<fairgate::Limiter>& limiters, std::size_t requests) {
  std::uint64_t ended = 0;
  for (const auto& l : limiters) {
    const auto s = l.snapshot();
    if (s.in_use != 0 || s.queued != 0 || s.shadow.in_flight != 0 || s.shadow.waiting != 0) return false;
    ended += s.shadow.would_grant + s.shadow.would_end();
  }
  return ended == requests;
}

/// The tolerance docs/shadow.md states: counts within max(3, 10 % of the
/// requests), mean wait within max(60 ms, 25 %).
void expect_match(const Figures& enforced, const Figures& shadow, std::size_t n) {
  std::printf(
      "[shadow] enforcing: %llu granted (%llu after a wait), %llu timed out, %llu rejected, mean wait %.0f "
      "ms\n"
      "[shadow] shadow   : %llu granted (%llu after a wait), %llu timed out, %llu rejected, mean wait %.0f "
      "ms\n",
      static_cast<unsigned long long>(enforced.granted), static_cast<unsigned long long>(enforced.queued),
      static_cast<unsigned long long>(enforced.timed_out), static_cast<unsigned long long>(enforced.rejected),
      enforced.mean_wait_ms, static_cast<unsigned long long>(shadow.granted),
      static_cast<unsigned long long>(shadow.queued), static_cast<unsigned long long>(shadow.timed_out),
      static_cast<unsigned long long>(shadow.rejected), shadow.mean_wait_ms);
  const double count_tol = std::max(3.0, 0.10 * static_cast<double>(n));
  const auto near = [&](std::uint64_t a, std::uint64_t b) {
    return std::abs(static_cast<double>(a) - static_cast<double>(b)) <= count_tol;
  };
  EXPECT_TRUE(near(enforced.granted, shadow.granted)) << enforced.granted << " vs " << shadow.granted;
  EXPECT_TRUE(near(enforced.queued, shadow.queued)) << enforced.queued << " vs " << shadow.queued;
  EXPECT_TRUE(near(enforced.timed_out, shadow.timed_out)) << enforced.timed_out << " vs " << shadow.timed_out;
  EXPECT_TRUE(near(enforced.rejected, shadow.rejected)) << enforced.rejected << " vs " << shadow.rejected;
  EXPECT_NEAR(enforced.mean_wait_ms, shadow.mean_wait_ms, std::max(60.0, 0.25 * enforced.mean_wait_ms));
  // The schedule overloads a cap of 3: both must have queued and timed out some.
  EXPECT_GT(enforced.queued, n / 4);
  EXPECT_GT(enforced.timed_out, 0u);
}

/// Plays one W2-like schedule enforced, then shadowed, on `instances` (one
/// limiter per instance, each run under its own limiter name) and compares.
void compare_on(std::vector<std::unique_ptr<Instance>>& instances) {
  constexpr int kRequests = 120;
  const auto requests = schedule(7, kRequests, 1000ms);
  Settings s;
  s.max_concurrent = 3;
  s.max_wait = 600ms;

  std::vector<fairgate::Limiter> enforcing, shadowing;
  for (auto& i : instances) enforcing.push_back(i->open(test_name() + "-enforce", s));
  s.mode = LimiterMode::shadow;
  for (auto& i : instances) shadowing.push_back(i->open(test_name() + "-shadow", s));
  for (auto& l : shadowing) ASSERT_EQ(l.settings().mode, LimiterMode::shadow);
  // On Redis: until each limiter heard from Redis and a new state's recovery fence is over.
  ASSERT_TRUE(wait_until(
      [&] {
        for (const auto* set : {&enforcing, &shadowing}) {
          for (const auto& l : *set) {
            const auto e = l.snapshot().engine;
            if (e.settings_source == "local" || e.fence_left.count() > 0) return false;
          }
        }
        return true;
      },
      10s));

  const Run enforced = play(enforcing, requests);
  ASSERT_EQ(enforced.ends, kRequests);
  EXPECT_LE(enforced.max_concurrent, 3);

  const Run shadowed = play(shadowing, requests);
  ASSERT_EQ(shadowed.ends, kRequests);
  // Nothing waits: every request is granted at once, above the cap.
  for (const auto& r : shadowed.results) {
    ASSERT_TRUE(r.granted()) << r.message();
    EXPECT_EQ(r.waited(), 0ms);
  }
  EXPECT_GT(shadowed.max_concurrent, 3);

  ASSERT_TRUE(wait_until([&] { return shadows_done(shadowing, kRequests); }, 20s))
      << "the shadows did not all end and release";
  std::uint64_t passed = 0;
  for (const auto& l : shadowing) passed += l.snapshot().shadow.passed;
  EXPECT_EQ(passed, static_cast<std::uint64_t>(kRequests));
  expect_match(enforced_figures(enforced), shadow_figures(shadowing), kRequests);
}

TEST(Shadow, MemoryReportsWhatEnforcingWould) {
  std::vector<std::unique_ptr<Instance>> instances;
  instances.push_back(std::make_unique<Instance>());
  compare_on(instances);
}

TEST(Shadow, RedisTwoInstancesReportWhatEnforcingWould) {
  std::vector<std::unique_ptr<Instance>> instances;
  instances.push_back(std::make_unique<Instance>(RedisServer::shared().url()));
  instances.push_back(std::make_unique<Instance>(RedisServer::shared().url()));
  compare_on(instances);
}

/// Acquires once on `limiter` and waits for the result.
AcquireResult acquire(fairgate::Limiter& limiter, AcquireOptions options = {}) {
  std::promise<AcquireResult> p;
  auto f = p.get_future();
  limiter.async_acquire(std::move(options), [&p](AcquireResult r) { p.set_value(std::move(r)); });
  return f.get();
}

TEST(Shadow, RunTimeSwitchIsClusterWideOnRedis) {
  Instance a(RedisServer::shared().url()), b(RedisServer::shared().url());
  Settings s;
  s.max_concurrent = 1;
  s.max_wait = 0ms;
  auto la = a.open(test_name(), s), lb = b.open(test_name(), s);
  ASSERT_TRUE(wait_until([&] { return on_redis_past_fence(la) && on_redis_past_fence(lb); }, 10s));
  // fence_left is the instance's view as of its last heartbeat: Redis may
  // still fence for a few ms (max_wait 0 was refused once), so this one waits.
  AcquireOptions patient;
  patient.max_wait = 10s;
  auto first = acquire(la, patient);
  ASSERT_TRUE(first.granted()) << fairgate::to_string(first.reason());
  // Enforcing: the cap of 1 is taken, max_wait 0 → refused at once.
  ASSERT_TRUE(wait_until([&] { return lb.snapshot().in_use == 1; }, 5s));
  EXPECT_EQ(acquire(lb).reason(), RejectReason::timeout);

  // A switches the mode; B follows (the setting lives in Redis).
  fairgate::SettingsUpdate u;
  u.mode = LimiterMode::shadow;
  std::promise<fairgate::ConfigureResult> done;
  la.async_configure(u, [&](fairgate::ConfigureResult r) { done.set_value(std::move(r)); });
  ASSERT_TRUE(done.get_future().get());
  ASSERT_TRUE(wait_until([&] { return lb.settings().mode == LimiterMode::shadow; }, 5s));
  auto let_through = acquire(lb);
  ASSERT_TRUE(let_through.granted());
  EXPECT_EQ(let_through.permit().id().rfind("shadow-", 0), 0u) << let_through.permit().id();
  // Its shadow would have timed out (the cap is taken, max_wait 0).
  ASSERT_TRUE(wait_until(
      [&] {
        return lb.snapshot().shadow.would_end_by_reason[static_cast<std::size_t>(RejectReason::timeout)] == 1;
      },
      5s));
  let_through.permit().release();
  first.permit().release();
  EXPECT_TRUE(
      wait_until([&] { return la.snapshot().in_use == 0 && lb.snapshot().shadow.in_flight == 0; }, 5s));
}

/// A permit of `l`, granted (asked with a 30 s max wait): a fatal failure when it is not.
void hold(fairgate::Limiter& l, std::shared_ptr<fairgate::test::Probe>& out) {
  AcquireOptions patient;
  patient.max_wait = 30s;
  out = fairgate::test::acquire(l, patient);
  ASSERT_TRUE(wait_until([&] { return out->done(); }, 30s));
  ASSERT_EQ(out->outcome(), fairgate::Outcome::granted) << out->message();
}

// Switching to shadow mode lets the requests already waiting through at once,
// in their order, and their acquires go on as their shadows (they keep their
// places). They waited on and timed out while every newcomer passed at once (a
// helper: 3 waiters of max wait 6 s got 429 at 6.0 s after the switch), on
// every instance of a Redis limiter.
void switch_lets_waiters_through(fairgate::Limiter& holder_side, fairgate::Limiter& waiter_side) {
  using fairgate::test::Probe;
  std::shared_ptr<Probe> holder;
  ASSERT_NO_FATAL_FAILURE(hold(holder_side, holder));
  std::vector<std::shared_ptr<Probe>> waiters;
  for (int i = 0; i < 3; ++i) waiters.push_back(fairgate::test::acquire_queued(waiter_side, 30s));
  for (const auto& w : waiters) ASSERT_FALSE(w->done());

  fairgate::SettingsUpdate u;
  u.mode = LimiterMode::shadow;
  std::promise<fairgate::ConfigureResult> done;
  holder_side.async_configure(u, [&](fairgate::ConfigureResult r) { done.set_value(std::move(r)); });
  ASSERT_TRUE(done.get_future().get());
  EXPECT_TRUE(wait_until(
      [&] { return std::all_of(waiters.begin(), waiters.end(), [](const auto& w) { return w->done(); }); },
      5s))
      << "the requests waiting at the switch were let through";
  for (const auto& w : waiters) {
    ASSERT_EQ(w->outcome(), fairgate::Outcome::granted) << w->message();
    EXPECT_LT(w->at() - waiters.front()->at(), 2s);
  }
  EXPECT_EQ(waiter_side.snapshot().shadow.passed, 3u);
  EXPECT_EQ(waiter_side.snapshot().shadow.waiting, 3u) << "their acquires wait on, as their shadows";
  std::this_thread::sleep_for(50ms);  // the first shadow waits that long at least
  holder->release();
  ASSERT_TRUE(wait_until([&] { return waiter_side.snapshot().shadow.would_grant >= 1; }, 10s))
      << "the first shadow takes the seat the holder left";
  EXPECT_GE(waiter_side.snapshot().shadow.would_queue, 1u);
  for (const auto& w : waiters) w->release();
  EXPECT_TRUE(wait_until([&] { return waiter_side.snapshot().shadow.would_grant == 3; }, 10s))
      << "each shadow holds as long as its request did, then hands on";
  EXPECT_TRUE(wait_until(
      [&] { return waiter_side.snapshot().shadow.in_flight == 0 && waiter_side.snapshot().in_use == 0; },
      10s));
}

TEST(Shadow, SwitchingToShadowLetsTheWaitersThroughOnMemory) {
  Instance i;
  Settings s;
  s.max_concurrent = 1;
  auto l = i.open(test_name(), s);
  switch_lets_waiters_through(l, l);
}

TEST(Shadow, SwitchingToShadowLetsTheWaitersThroughOnEveryRedisInstance) {
  Instance a(RedisServer::shared().url()), b(RedisServer::shared().url());
  Settings s;
  s.max_concurrent = 1;
  auto la = a.open(test_name(), s), lb = b.open(test_name(), s);
  ASSERT_TRUE(wait_until([&] { return on_redis_past_fence(la) && on_redis_past_fence(lb); }, 10s));
  switch_lets_waiters_through(la, lb);
}

// The waiters are let through by a job the switch posts: if the limiter is
// back on enforce when it runs (a quick shadow-then-enforce, or a Redis that
// refused the change and the next heartbeat restored enforce), they wait on
// for a seat, or they would run past the cap under enforce (a helper's review).
TEST(Shadow, WaitersAreNotLetThroughWhenTheLimiterIsBackOnEnforceFirst) {
  Instance i;
  Settings s;
  s.max_concurrent = 1;
  auto l = i.open(test_name(), s);
  std::shared_ptr<fairgate::test::Probe> holder;
  ASSERT_NO_FATAL_FAILURE(hold(l, holder));
  auto waiter = fairgate::test::acquire_queued(l, 30s);
  ASSERT_FALSE(waiter->done());

  std::promise<void> go;
  std::shared_future<void> gate = go.get_future().share();
  boost::asio::post(i.io, [gate] { gate.wait(); });  // the io thread waits: the job runs after both
  fairgate::SettingsUpdate shadow, enforce;
  shadow.mode = LimiterMode::shadow;
  enforce.mode = LimiterMode::enforce;
  ASSERT_TRUE(l.configure(shadow));
  ASSERT_TRUE(l.configure(enforce));
  go.set_value();
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(waiter->done()) << "let through under enforce, its seat held: " << waiter->message();
  EXPECT_EQ(l.snapshot().shadow.passed, 0u);
  holder->release();
  ASSERT_TRUE(wait_until([&] { return waiter->done(); }, 10s));
  EXPECT_EQ(waiter->outcome(), fairgate::Outcome::granted);
  waiter->release();
}

// would_queue counts the shadows told a place in the queue, not those that
// waited more than 0 ms: on Redis a grant at once takes a round trip, and a
// burst of 12 on cap 3 was reported as 12 would-be waits (enforcing: 9).
TEST(Shadow, OnRedisTheShadowsGrantedAtOnceAreNotCountedAsQueued) {
  Instance a(RedisServer::shared().url());
  Settings s;
  s.max_concurrent = 3;
  auto l = a.open(test_name(), s);
  // Past the new state's recovery fence (it grants nothing: every shadow would queue), for sure:
  // an enforced request granted.
  std::shared_ptr<fairgate::test::Probe> first;
  ASSERT_NO_FATAL_FAILURE(hold(l, first));
  first->release();
  ASSERT_TRUE(wait_until([&] { return l.snapshot().in_use == 0; }, 10s));
  fairgate::SettingsUpdate shadow;
  shadow.mode = LimiterMode::shadow;
  ASSERT_TRUE(l.configure(shadow));
  std::vector<std::shared_ptr<fairgate::test::Probe>> burst;
  for (int i = 0; i < 12; ++i) burst.push_back(fairgate::test::acquire(l));
  ASSERT_TRUE(wait_until(
      [&] { return std::all_of(burst.begin(), burst.end(), [](const auto& p) { return p->done(); }); }, 10s));
  ASSERT_TRUE(wait_until(
      [&] { return l.snapshot().shadow.waiting == 9 && l.snapshot().shadow.would_grant == 3; }, 10s));
  for (const auto& p : burst) p->release();
  ASSERT_TRUE(wait_until([&] { return l.snapshot().shadow.would_grant == 12; }, 20s));
  EXPECT_EQ(l.snapshot().shadow.would_queue, 9u) << "3 granted at once, 9 after a wait";
}

TEST(Shadow, WhatIsRefusedWhateverTheLoadStillIs) {
  Instance i;
  Settings s;
  s.max_concurrent = 1;
  s.mode = LimiterMode::shadow;
  auto l = i.open(test_name(), s);
  AcquireOptions bad;
  bad.weight = 0;  // invalid
  EXPECT_EQ(acquire(l, bad).reason(), RejectReason::invalid_argument);
  // Disabled in reject mode: refused, shadow or not.
  fairgate::SettingsUpdate u;
  u.enabled = false;
  u.when_disabled = fairgate::DisabledMode::reject;
  ASSERT_TRUE(l.configure(u));
  EXPECT_EQ(acquire(l).reason(), RejectReason::disabled);
  EXPECT_EQ(l.snapshot().shadow.passed, 0u);
}

TEST(Shadow, ShadowSeatHeldAsLongAsTheRealRequestFromItsOwnGrant) {
  // Cap 1: A holds 300 ms, B arrives at once and holds 100 ms. Enforcing, B
  // would wait ~300 ms then hold 100 ms; its shadow must hold its seat until
  // then, although the real B ended after 100 ms.
  Instance i;
  Settings s;
  s.max_concurrent = 1;
  s.mode = LimiterMode::shadow;
  auto l = i.open(test_name(), s);
  auto a = acquire(l);
  auto b = acquire(l);
  ASSERT_TRUE(a.granted() && b.granted());
  std::this_thread::sleep_for(100ms);
  b.permit().release();
  EXPECT_EQ(l.snapshot().shadow.waiting, 1u);  // B's shadow still queued behind A's
  std::this_thread::sleep_for(200ms);
  const auto t0 = Clock::now();
  a.permit().release();
  // B's shadow is granted now and holds ~100 ms more.
  ASSERT_TRUE(wait_until([&] { return l.snapshot().shadow.would_grant == 2; }, 5s));
  EXPECT_EQ(l.snapshot().in_use, 1u);
  ASSERT_TRUE(wait_until([&] { return l.snapshot().in_use == 0; }, 5s));
  EXPECT_GE(Clock::now() - t0, 90ms);
  const auto sh = l.snapshot().shadow;
  EXPECT_EQ(sh.would_queue, 1u);
  EXPECT_GE(sh.would_wait_max, 250ms);
}

}  // namespace
