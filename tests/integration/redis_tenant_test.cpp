// Tenant fairness (F12) on the Redis backend against a real redis-server:
// the rotation across two instances, the per-tenant cap seen from the clients
// and from Redis, global FIFO when fairness is off, and switching fairness on
// at run time. (kill -9 of a tenant's holder: redis_multiprocess_test.)
#include "support/holders_key.hpp"
#include "support/instance.hpp"
#include "support/redis_server.hpp"
#include "support/wait.hpp"

#include <fairgate/redis_backend.hpp>

#include <gtest/gtest.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
using fairgate::AcquireOptions;
using fairgate::AcquireResult;
using fairgate::Limiter;
using fairgate::Permit;
using fairgate::RedisBackendOptions;
using fairgate::Settings;
using fairgate::SettingsUpdate;
using fairgate::test::RedisServer;
using fairgate::test::wait_until;
using namespace std::chrono_literals;

RedisServer& server() { return RedisServer::shared(); }

std::string test_name() { return ::testing::UnitTest::GetInstance()->current_test_info()->name(); }

std::string key(const std::string& limiter, const std::string& what) {
  return "fairgate:{" + limiter + "}:" + what;
}

long number(const std::string& reply) { return reply == "(nil)" || reply.empty() ? 0 : std::stol(reply); }

/// One instance (tests/support/instance.hpp) on the shared server.
class Instance : public fairgate::test::Instance {
 public:
  Instance() : fairgate::test::Instance(options()) {}

 private:
  static RedisBackendOptions options() {
    RedisBackendOptions o;
    o.url = server().url();
    o.heartbeat_interval = 250ms;
    o.liveness_ttl = 1000ms;
    o.command_timeout = 900ms;
    o.key_expiry = 0ms;
    return o;
  }
};

Settings settings(std::uint32_t cap, bool fairness, std::optional<std::uint32_t> per_tenant = std::nullopt) {
  Settings s;
  s.max_concurrent = cap;
  s.max_wait = 20s;
  s.tenant_fairness = fairness;
  s.max_per_tenant = per_tenant;
  return s;
}

/// Grants in the order they arrive, each request named.
class Order {
 public:
  /// Acquires for `name` (tenant `tenant`) and waits until it is queued.
  void queue(Limiter& limiter, const std::string& name, const std::string& tenant) {
    auto queued = std::make_shared<std::atomic<bool>>(false);
    AcquireOptions o;
    o.tenant = tenant;
    o.on_queued = [this, queued, name](const fairgate::QueueStatus& s) {
      std::lock_guard lock(mu_);
      if (!permits_.count(name)) positions_[name] = s.position;
      queued->store(true);
    };
    limiter.async_acquire(o, [this, name](AcquireResult r) {
      std::lock_guard lock(mu_);
      ASSERT_TRUE(r.granted()) << name << ": " << r.message();
      granted_.push_back(name);
      permits_[name] = r.take_permit();
      positions_.erase(name);
    });
    ASSERT_TRUE(wait_until([&] { return queued->load(); }, 5s)) << name << " should wait";
  }
  struct Arrival {
    Limiter* limiter;
    const char* name;
    const char* tenant;
  };
  /// queue() for each, in turn.
  void queue_each(std::initializer_list<Arrival> arrivals) {
    for (const auto& a : arrivals) queue(*a.limiter, a.name, a.tenant);
  }
  void hold(Limiter& limiter, const std::string& name, const std::string& tenant) {
    AcquireOptions o;
    o.tenant = tenant;
    limiter.async_acquire(o, [this, name](AcquireResult r) {
      std::lock_guard lock(mu_);
      granted_.push_back(name);
      permits_[name] = r.take_permit();
    });
    ASSERT_TRUE(wait_until([&] { return count() == 1; }, 5s));
  }
  std::size_t count() {
    std::lock_guard lock(mu_);
    return granted_.size();
  }
  /// One seat: releases the latest grant, waits for the next, `n` times.
  std::vector<std::string> drain(std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t before = count();
      Permit p;
      {
        std::lock_guard lock(mu_);
        p = std::move(permits_[granted_.back()]);
      }
      p.release();
      EXPECT_TRUE(wait_until([&] { return count() == before + 1; }, 5s)) << "grant " << i;
    }
    std::lock_guard lock(mu_);
    return std::vector<std::string>(granted_.begin() + 1, granted_.end());
  }
  void release_all() {
    std::lock_guard lock(mu_);
    for (auto& [name, p] : permits_) p.release();
  }
  /// The position each request still waiting was last told.
  std::map<std::string, std::size_t> positions() {
    std::lock_guard lock(mu_);
    return positions_;
  }
  std::string describe_positions() {
    std::string out = "told:";
    for (const auto& [name, p] : positions()) out += " " + name + "=" + std::to_string(p);
    return out;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::size_t> positions_;
  std::vector<std::string> granted_;
  std::map<std::string, Permit> permits_;
};

/// Two instances of one limiter (one seat, tenant fairness on), the seat held by tenant "h".
struct TwoInstancesOneSeat {
  TwoInstancesOneSeat() { order.hold(la, "h", "h"); }
  std::string name = test_name();
  Instance a, b;
  Limiter la = a.open(name, settings(1, true));
  Limiter lb = b.open(name, settings(1, true));
  Order order;
};

TEST(RedisTenantTest, RotationAcrossTwoInstancesServesOneRequestPerTenantPerTurn) {
  TwoInstancesOneSeat s;
  const std::string& name = s.name;
  Order& order = s.order;
  order.queue_each({{&s.la, "A1", "A"},
                    {&s.lb, "A2", "A"},
                    {&s.la, "A3", "A"},
                    {&s.lb, "B1", "B"},
                    {&s.lb, "B2", "B"},
                    {&s.la, "C1", "C"}});
  EXPECT_EQ(server().command(fairgate::test::count_command(key(name, "tready"))), "3")
      << "three tenants in the rotation";
  EXPECT_EQ(order.drain(6), (std::vector<std::string>{"A1", "B1", "C1", "A2", "B2", "A3"}));
  order.release_all();
  EXPECT_TRUE(wait_until(
      [&] { return number(server().command(fairgate::test::count_command(key(name, "holders")))) == 0; },
      5s));
  EXPECT_EQ(server().command(fairgate::test::count_command(key(name, "tready"))), "0");
  EXPECT_EQ(server().command(fairgate::test::tenant_count_command(key(name, "tholders"))), "0")
      << "every tenant count back to 0";
  EXPECT_EQ(server().command({"EXISTS", key(name, "tq:A")}), "0") << "empty tenant queues are gone";
}

// F7 under fairness: the heartbeat tells each waiter its place in the rotation as grants move
// it. Its order score says nothing about the rotation, so an instance cannot work it out from
// the queue head as without fairness; before, a waiter kept the position its acquire gave (A2
// arrived second of tenant A's alone: 2, but served 4th). The places count only the waiters
// each tenant has (B has one): A3 is served 6th, not 7th as (k-1) x T + r says.
TEST(RedisTenantTest, TheHeartbeatTellsEachWaiterItsPlaceInTheRotation) {
  TwoInstancesOneSeat s;
  Order& order = s.order;
  order.queue_each({{&s.la, "A1", "A"},
                    {&s.lb, "A2", "A"},
                    {&s.la, "A3", "A"},
                    {&s.lb, "B1", "B"},
                    {&s.la, "C1", "C"},
                    {&s.lb, "C2", "C"},
                    {&s.la, "C3", "C"}});
  const std::map<std::string, std::size_t> first{{"A1", 1}, {"B1", 2}, {"C1", 3}, {"A2", 4},
                                                 {"C2", 5}, {"A3", 6}, {"C3", 7}};
  EXPECT_TRUE(wait_until([&] { return order.positions() == first; }, 5s)) << order.describe_positions();
  // A1 served, its tenant to the back: B C A.
  EXPECT_EQ(order.drain(1), (std::vector<std::string>{"A1"}));
  const std::map<std::string, std::size_t> next{{"B1", 1}, {"C1", 2}, {"A2", 3},
                                                {"C2", 4}, {"A3", 5}, {"C3", 6}};
  EXPECT_TRUE(wait_until([&] { return order.positions() == next; }, 5s)) << order.describe_positions();
  EXPECT_EQ(order.drain(6), (std::vector<std::string>{"A1", "B1", "C1", "A2", "C2", "A3", "C3"}));
  order.release_all();
}

// A heartbeat asks for at most 100 positions (the oldest 50, and 50 of the others in turn):
// with 130 waiters on one instance, the newest are told their new places too, a beat or two
// later (without the turn, the 30 newest kept the places their acquires gave).
TEST(RedisTenantTest, EveryWaiterIsToldItsPlaceBeyondThoseAskedAtEveryBeat) {
  const std::string name = test_name();
  Instance a;
  Limiter la = a.open(name, settings(1, true));
  Order order;
  order.hold(la, "h", "h");
  constexpr int kWaiters = 130;
  for (int i = 1; i <= kWaiters; ++i) order.queue(la, "A" + std::to_string(i), "A");
  EXPECT_EQ(order.drain(4), (std::vector<std::string>{"A1", "A2", "A3", "A4"}));
  std::map<std::string, std::size_t> expected;
  for (int i = 5; i <= kWaiters; ++i) expected["A" + std::to_string(i)] = static_cast<std::size_t>(i - 4);
  EXPECT_TRUE(wait_until([&] { return order.positions() == expected; }, 5s)) << order.describe_positions();
  EXPECT_EQ(order.drain(kWaiters - 4).size(), static_cast<std::size_t>(kWaiters));
  order.release_all();
}

long zcount_calls() {
  const std::string stats = server().command({"INFO", "commandstats"});
  const auto at = stats.find("cmdstat_zcount:calls=");
  return at == std::string::npos ? 0 : std::stol(stats.substr(at + 21));
}

// While the queue does not move, its waiters' places are not counted again at every beat
// (heartbeat.lua's version: before, each beat of each instance counted up to 100 places, one
// ZCOUNT each, and read every tenant's queue). When it moves, every waiter is told its new
// place, beyond the 100 a beat asks about: B1's arrival puts one more waiter ahead of each of
// A's but the first.
TEST(RedisTenantTest, AStillQueueIsNotCountedAgainAndEveryWaiterHearsWhenItMoves) {
  TwoInstancesOneSeat s;
  Order& order = s.order;
  constexpr int kWaiters = 130;
  std::map<std::string, std::size_t> expected;
  for (int i = 1; i <= kWaiters; ++i) {
    order.queue(s.la, "A" + std::to_string(i), "A");
    expected["A" + std::to_string(i)] = static_cast<std::size_t>(i);
  }
  EXPECT_TRUE(wait_until([&] { return order.positions() == expected; }, 5s)) << order.describe_positions();
  // Quiet: no place counted over a second (four beats), once every waiter was counted.
  EXPECT_TRUE(wait_until(
      [&] {
        const long before = zcount_calls();
        std::this_thread::sleep_for(1s);
        return zcount_calls() == before;
      },
      10s))
      << "the places are counted again although the queue did not move";
  order.queue(s.lb, "B1", "B");
  for (int i = 2; i <= kWaiters; ++i) expected["A" + std::to_string(i)] = static_cast<std::size_t>(i + 1);
  expected["B1"] = 2;
  EXPECT_TRUE(wait_until([&] { return order.positions() == expected; }, 5s)) << order.describe_positions();
  EXPECT_EQ(order.drain(kWaiters + 1).size(), static_cast<std::size_t>(kWaiters + 1));
  order.release_all();
}

// A waiter whose grant reaches its instance with a heartbeat (the wake message was lost) hears
// that it is granted, not first a last `queued` with the place it had: A1, no longer in its
// tenant's queue, counted behind C (2). Before, that event was posted too, and only the check at
// delivery (post_position: still pending?) dropped it when the grant ran first — on one io
// thread it does; with several the client could see "queued 1, queued 2, granted" (as it does
// here with both the filter and that check taken out).
TEST(RedisTenantTest, AWaiterGrantedByAHeartbeatHearsNoLastPosition) {
  TwoInstancesOneSeat s;
  std::mutex mu;
  std::vector<std::string> events;  // A1's
  AcquireOptions o;
  o.tenant = "A";
  o.on_queued = [&](const fairgate::QueueStatus& q) {
    std::lock_guard lock(mu);
    events.push_back("queued " + std::to_string(q.position));
  };
  Permit a1;
  s.lb.async_acquire(o, [&](AcquireResult r) {
    std::lock_guard lock(mu);
    events.push_back(r.granted() ? "granted" : "ended: " + r.message());
    a1 = r.take_permit();
  });
  const auto seen = [&] {
    std::lock_guard lock(mu);
    return events;
  };
  ASSERT_TRUE(wait_until([&] { return !seen().empty(); }, 5s));
  s.order.queue(s.lb, "C1", "C");
  ASSERT_TRUE(wait_until(
      [&] {
        return s.order.positions() == std::map<std::string, std::size_t>{{"C1", 2}};
      },
      5s))
      << s.order.describe_positions();
  server().command({"CLIENT", "KILL", "TYPE", "pubsub"});
  s.order.release_all();  // h's release grants A1; its wake is published while b reconnects
  ASSERT_TRUE(wait_until([&] { return seen().size() >= 2 && seen().back() == "granted"; }, 5s));
  EXPECT_EQ(seen(), (std::vector<std::string>{"queued 1", "granted"}));
  EXPECT_EQ(s.b.impl(s.name)->lost_wakes_recovered(), 1u) << "granted by the heartbeat";
  a1.release();
  EXPECT_TRUE(wait_until([&] { return s.order.count() == 2; }, 5s)) << "C1 served next";
  s.order.release_all();
}

TEST(RedisTenantTest, FairnessOffIsGlobalFifoAndKeepsNoTenantState) {
  const std::string name = test_name();
  Instance a, b;
  Limiter la = a.open(name, settings(1, false));
  Limiter lb = b.open(name, settings(1, false));
  Order order;
  order.hold(la, "h", "h");
  order.queue(la, "A1", "A");
  order.queue(lb, "A2", "A");
  order.queue(lb, "B1", "B");
  order.queue(la, "A3", "A");
  order.queue(lb, "C1", "C");
  EXPECT_EQ(server().command({"EXISTS", key(name, "tready")}), "0");
  EXPECT_EQ(server().command({"EXISTS", key(name, "tholders")}), "0");
  EXPECT_EQ(order.drain(5), (std::vector<std::string>{"A1", "A2", "B1", "A3", "C1"}));
  const std::string holder = server().command(fairgate::test::permits_command(key(name, "holders")));
  EXPECT_TRUE(holder.size() > 2 && holder.ends_with("|C"))
      << "C1's tenant rides in its holder member: " << holder;
  order.release_all();
  EXPECT_TRUE(wait_until(
      [&] { return number(server().command(fairgate::test::count_command(key(name, "holders")))) == 0; },
      5s));
  EXPECT_EQ(server().command({"EXISTS", key(name, "ptenant")}), "0") << "no permit tenant kept apart";
}

TEST(RedisTenantTest, SwitchingFairnessOnAtRunTimeRotatesTheWaitersAlreadyQueued) {
  const std::string name = test_name();
  Instance a, b;
  Limiter la = a.open(name, settings(1, false));
  Limiter lb = b.open(name, settings(1, false));
  Order order;
  order.hold(la, "h", "h");
  order.queue(la, "A1", "A");
  order.queue(la, "A2", "A");
  order.queue(lb, "A3", "A");
  order.queue(lb, "B1", "B");
  order.queue(la, "B2", "B");
  SettingsUpdate u;
  u.tenant_fairness = true;
  ASSERT_TRUE(la.configure(u));
  // Applied in Redis before the first release (a script sent by EVAL after
  // NOSCRIPT may run after a later, cached one).
  ASSERT_TRUE(wait_until(
      [&] {
        return server().command({"HGET", key(name, "cfg"), "tenant_fairness"}) == "1";
      },
      5s));
  EXPECT_EQ(order.drain(5), (std::vector<std::string>{"A1", "B1", "A2", "B2", "A3"}));
  EXPECT_TRUE(wait_until([&] { return lb.settings().tenant_fairness; }, 5s)) << "b learns it by heartbeat";
  order.release_all();
}

// max_per_tenant with and without fairness: 3 tenants x 12 requests over two
// instances, N = 4, at most 2 per tenant — checked in the clients (grant to
// release, which can only under-count) and in Redis while it runs.
class RedisTenantCapTest : public ::testing::TestWithParam<bool> {};

TEST_P(RedisTenantCapTest, NoTenantEverHoldsMoreThanItsCap) {
  const std::string name = test_name().substr(0, test_name().find('/')) + (GetParam() ? "On" : "Off");
  constexpr std::uint32_t kCap = 4, kPerTenant = 2;
  Instance a, b;
  std::vector<Limiter> limiters{a.open(name, settings(kCap, GetParam(), kPerTenant)),
                                b.open(name, settings(kCap, GetParam(), kPerTenant))};
  std::mutex mu;
  std::map<std::string, int> held;
  int total = 0, max_total = 0, granted = 0, ends = 0;
  std::map<std::string, int> max_held;
  std::mt19937 rng(7);
  std::vector<std::shared_ptr<asio::steady_timer>> timers;
  const std::vector<std::string> tenants{"x", "y", "z"};
  for (int i = 0; i < 36; ++i) {
    Instance& inst = i % 2 ? b : a;
    Limiter& lim = limiters[i % 2];
    const std::string tenant = tenants[(i * 7) % 3];
    auto timer = std::make_shared<asio::steady_timer>(inst.io);
    timers.push_back(timer);
    const auto hold = std::chrono::milliseconds(5 + rng() % 20);
    AcquireOptions o;
    o.tenant = tenant;
    lim.async_acquire(o, [&, tenant, timer, hold](AcquireResult r) {
      std::lock_guard lock(mu);
      ++ends;
      if (!r.granted()) return;
      ++granted;
      max_held[tenant] = std::max(max_held[tenant], ++held[tenant]);
      max_total = std::max(max_total, ++total);
      auto permit = std::make_shared<Permit>(r.take_permit());
      timer->expires_after(hold);
      timer->async_wait([&, tenant, permit](boost::system::error_code) {
        {
          std::lock_guard lock2(mu);
          --held[tenant];
          --total;
        }
        permit->release();
      });
    });
  }
  // Redis' own view while it runs.
  long redis_max_tenant = 0, redis_max_total = 0;
  const auto done = [&] {
    std::lock_guard lock(mu);
    return ends == 36;
  };
  while (!done()) {
    for (const auto& t : tenants)
      redis_max_tenant =
          std::max(redis_max_tenant, number(server().command({"HGET", key(name, "tholders"), t})));
    redis_max_total = std::max(redis_max_total,
                               number(server().command(fairgate::test::count_command(key(name, "holders")))));
    std::this_thread::sleep_for(2ms);
  }
  EXPECT_TRUE(wait_until(
      [&] { return number(server().command(fairgate::test::count_command(key(name, "holders")))) == 0; },
      5s));
  std::lock_guard lock(mu);
  EXPECT_EQ(granted, 36) << "everyone served: the cap skips, never starves";
  for (const auto& [t, m] : max_held) EXPECT_LE(m, static_cast<int>(kPerTenant)) << "tenant " << t;
  EXPECT_LE(max_total, static_cast<int>(kCap));
  EXPECT_LE(redis_max_tenant, static_cast<long>(kPerTenant)) << "tholders in Redis";
  EXPECT_LE(redis_max_total, static_cast<long>(kCap));
  int most = 0;
  for (const auto& [t, m] : max_held) most = std::max(most, m);
  EXPECT_EQ(most, static_cast<int>(kPerTenant)) << "the per-tenant cap was reached (the test exercised it)";
  EXPECT_EQ(server().command(fairgate::test::tenant_count_command(key(name, "tholders"))), "0");
  EXPECT_EQ(server().command({"SCARD", key(name, "tparked")}), "0");
}

INSTANTIATE_TEST_SUITE_P(Fairness, RedisTenantCapTest, ::testing::Bool());

}  // namespace
