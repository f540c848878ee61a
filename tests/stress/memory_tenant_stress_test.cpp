// Stress of tenant fairness (F12) on the memory backend: many threads, random
// tenants and weights, cancels, short deadlines, and changes of the caps and
// of fairness under load. Checks: never more holders than max_concurrent,
// never more per tenant than max_per_tenant (while a cap is fixed, strictly;
// while caps change, against the largest cap in force), exactly one completion
// per request, and nothing left behind.
//
// The client-side holder counts go up when the grant is delivered and down
// before the permit is released, so they can only under-count: a count above
// a cap is a real overshoot.
#include <fairgate/fairgate.hpp>

#include "support/wait.hpp"

#include <gtest/gtest.h>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using fairgate::AcquireOptions;
using fairgate::AcquireResult;
using fairgate::Permit;
using fairgate::Settings;
using fairgate::SettingsUpdate;

constexpr int kTenants = 6;

std::size_t scaled(std::size_t base) {
  const char* s = std::getenv("FAIRGATE_STRESS_SCALE");
  const double f = s && *s ? std::atof(s) : 1.0;
  return static_cast<std::size_t>(static_cast<double>(base) * (f > 0 ? f : 1.0));
}

struct Counters {
  std::mutex mu;
  int total = 0;
  int max_total = 0;
  std::array<int, kTenants> held{};
  std::array<int, kTenants> max_held{};
  int over_cap = 0;                                     // grants seen above the cap in force (strict phases)
  int over_tenant_cap = 0;                              // ... above max_per_tenant
  std::uint32_t strict_cap = 0, strict_per_tenant = 0;  // 0: caps are changing
  std::uint32_t loose_cap = 0, loose_per_tenant = 0;    // the largest caps ever in force
};

struct Request {
  explicit Request(asio::thread_pool& pool) : strand(asio::make_strand(pool)), timer(strand) {}
  asio::strand<asio::thread_pool::executor_type> strand;
  asio::steady_timer timer;
  asio::cancellation_signal signal;
  bool done = false;  // on strand
  std::atomic<int> completions{0};
};

class TenantStress : public ::testing::TestWithParam<bool> {};

TEST_P(TenantStress, CapsHoldAndEveryRequestEndsOnce) {
  const bool changing = GetParam();
  asio::thread_pool pool(4);
  auto backend = fairgate::make_memory_backend(pool.get_executor());
  Settings s;
  s.max_concurrent = 4;
  s.max_wait = 20s;
  s.tenant_fairness = true;
  s.max_per_tenant = 2;
  fairgate::Limiter limiter = backend->open("tenants", s).value();
  Counters c;
  c.strict_cap = changing ? 0 : 4;
  c.strict_per_tenant = changing ? 0 : 2;
  c.loose_cap = changing ? 6 : 4;
  c.loose_per_tenant = changing ? 6 : 2;  // changing: sometimes no per-tenant cap, max_concurrent <= 6

  const std::size_t per_thread = scaled(400);
  constexpr int kThreads = 6;
  std::vector<std::vector<std::shared_ptr<Request>>> all(kThreads);
  std::atomic<bool> stop_config{false};
  std::thread config([&] {
    std::mt19937 rng(99);
    while (changing && !stop_config.load()) {
      SettingsUpdate u;
      u.max_concurrent = 3 + rng() % 4;  // 3..6
      if (rng() % 4 == 0)
        u.max_per_tenant = std::optional<std::uint32_t>{};  // no per-tenant cap: bounded by max_concurrent
      else
        u.max_per_tenant = std::optional<std::uint32_t>(1 + rng() % 3);  // 1..3
      u.tenant_fairness = rng() % 3 != 0;
      ASSERT_TRUE(limiter.configure(u));
      std::this_thread::sleep_for(3ms);
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1000 + t);
      for (std::size_t i = 0; i < per_thread; ++i) {
        auto r = std::make_shared<Request>(pool);
        all[t].push_back(r);
        const int tenant = static_cast<int>(rng() % 10 < 5 ? 0 : rng() % kTenants);  // tenant 0 floods
        const auto hold = std::chrono::microseconds(rng() % 2000);
        const auto kind = rng() % 10;  // 0: short deadline, 1: cancelled, else plain
        AcquireOptions o;
        o.tenant = tenant == 0 ? std::string() : "t" + std::to_string(tenant);
        o.weight = 1 + rng() % 3;
        if (kind == 0) o.max_wait = std::chrono::milliseconds(rng() % 5);
        const auto cancel_after = std::chrono::microseconds(rng() % 3000);
        asio::post(r->strand, [&, r, o, kind, cancel_after, hold, tenant]() mutable {
          limiter.async_acquire(
              std::move(o), asio::bind_cancellation_slot(
                                r->signal.slot(),
                                asio::bind_executor(r->strand, [&, r, hold, tenant](AcquireResult result) {
                                  r->done = true;
                                  r->timer.cancel();
                                  r->completions.fetch_add(1);
                                  if (!result.granted()) return;
                                  {
                                    std::lock_guard lock(c.mu);
                                    const int total = ++c.total;
                                    const int mine = ++c.held[tenant];
                                    c.max_total = std::max(c.max_total, total);
                                    c.max_held[tenant] = std::max(c.max_held[tenant], mine);
                                    if (c.strict_cap && total > static_cast<int>(c.strict_cap)) ++c.over_cap;
                                    if (c.strict_per_tenant && mine > static_cast<int>(c.strict_per_tenant))
                                      ++c.over_tenant_cap;
                                  }
                                  auto permit = std::make_shared<Permit>(result.take_permit());
                                  r->timer.expires_after(hold);
                                  r->timer.async_wait([&, permit, tenant](boost::system::error_code) {
                                    {
                                      std::lock_guard lock(c.mu);
                                      --c.total;
                                      --c.held[tenant];
                                    }
                                    permit->release();
                                  });
                                })));
          if (kind == 1) {
            r->timer.expires_after(cancel_after);
            r->timer.async_wait([r](boost::system::error_code ec) {
              if (!ec && !r->done) r->signal.emit(asio::cancellation_type::terminal);
            });
          }
        });
        if (i % 16 == 0) std::this_thread::sleep_for(1ms);
      }
    });
  }
  for (auto& th : threads) th.join();
  stop_config = true;
  config.join();
  const auto ended = [&] {
    for (const auto& v : all)
      for (const auto& r : v)
        if (r->completions.load() == 0) return false;
    return true;
  };
  ASSERT_TRUE(fairgate::test::wait_until(ended, 60s)) << "every request ends";
  ASSERT_TRUE(fairgate::test::wait_until([&] { return limiter.snapshot().in_use == 0; }, 10s));
  std::size_t requests = 0;
  for (const auto& v : all)
    for (const auto& r : v) {
      ++requests;
      EXPECT_EQ(r->completions.load(), 1) << "exactly one completion";
    }
  const auto snap = limiter.snapshot();
  EXPECT_EQ(snap.queued, 0u);
  EXPECT_EQ(snap.stats.grants + snap.stats.timeouts + snap.stats.cancels + snap.stats.rejections, requests);
  std::lock_guard lock(c.mu);
  EXPECT_EQ(c.over_cap, 0) << "holders above max_concurrent";
  EXPECT_EQ(c.over_tenant_cap, 0) << "a tenant above max_per_tenant";
  EXPECT_LE(c.max_total, static_cast<int>(c.loose_cap));
  for (int t = 0; t < kTenants; ++t) EXPECT_LE(c.max_held[t], static_cast<int>(c.loose_per_tenant)) << t;
  EXPECT_GT(snap.stats.grants, requests / 2);
  EXPECT_GT(snap.stats.timeouts, 0u);
  EXPECT_GT(snap.stats.cancels, 0u);
  if (!changing) {
    EXPECT_EQ(c.max_held[0], 2) << "the flooding tenant reached its cap";
  }
  std::printf("tenant stress (%s): %zu requests, %llu grants, %llu timeouts, %llu cancels, max %d holders\n",
              changing ? "changing caps" : "fixed caps", requests,
              static_cast<unsigned long long>(snap.stats.grants),
              static_cast<unsigned long long>(snap.stats.timeouts),
              static_cast<unsigned long long>(snap.stats.cancels), c.max_total);
}

INSTANTIATE_TEST_SUITE_P(Caps, TenantStress, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "Changing" : "Fixed"; });

}  // namespace
