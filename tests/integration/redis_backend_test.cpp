// The Redis backend end to end against a real redis-server: several Backend
// objects in one process are several instances (own id, own connections, own
// io thread) sharing one limiter. Each test uses its own limiter name.
#include "redis/connection.hpp"
#include "redis/database_check.hpp"
#include "redis/log_level.hpp"
#include "redis/redis_limiter.hpp"
#include "support/acl.hpp"
#include "support/holders_key.hpp"
#include "support/instance.hpp"
#include "support/log_lines.hpp"
#include "support/redis_monitor.hpp"
#include "support/redis_server.hpp"
#include "support/tcp_proxy.hpp"
#include "support/wait.hpp"

#include <fairgate/rate_limiter.hpp>
#include <fairgate/redis_backend.hpp>

#include <gtest/gtest.h>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_future.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

namespace {

namespace asio = boost::asio;
using fairgate::AcquireOptions;
using fairgate::AcquireResult;
using fairgate::Limiter;
using fairgate::Outcome;
using fairgate::Permit;
using fairgate::RedisBackendOptions;
using fairgate::RejectReason;
using fairgate::Settings;
using fairgate::test::acquire;
using fairgate::test::acquire_queued;
using fairgate::test::Probe;
using fairgate::test::ready_past_fence;
using fairgate::test::RedisServer;
using fairgate::test::wait_until;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

RedisServer& server() { return RedisServer::shared(); }

std::string test_name() { return ::testing::UnitTest::GetInstance()->current_test_info()->name(); }

std::string key(const std::string& limiter, const std::string& what) {
  return "fairgate:{" + limiter + "}:" + what;
}

std::int64_t zcard(const std::string& limiter, const std::string& what) {
  return std::stoll(server().command(fairgate::test::count_command(key(limiter, what))));
}

/// One instance (tests/support/instance.hpp), on the shared server unless
/// `options` name another.
class Instance : public fairgate::test::Instance {
 public:
  explicit Instance(RedisBackendOptions options, int threads = 1)
      : fairgate::test::Instance(on_shared_server(std::move(options)), threads) {}

 private:
  static RedisBackendOptions on_shared_server(RedisBackendOptions o) {
    if (o.url == RedisBackendOptions{}.url) o.url = server().url();
    return o;
  }
};

RedisBackendOptions fast_options() {
  RedisBackendOptions o;
  o.heartbeat_interval = 250ms;
  o.liveness_ttl = 1000ms;
  o.command_timeout = 500ms;  // sanitizer builds are slow; no spurious timeouts
  o.key_expiry = 0ms;
  return o;
}

Settings cap(std::uint32_t n, std::chrono::milliseconds max_wait = 20s) {
  Settings s;
  s.max_concurrent = n;
  s.max_wait = max_wait;
  return s;
}

// ---------------------------------------------------------------------------

TEST(RedisBackendTest, OptionsAreValidated) {
  RedisBackendOptions o;
  EXPECT_FALSE(fairgate::validate(o));
  o.liveness_ttl = o.heartbeat_interval;
  EXPECT_EQ(fairgate::validate(o)->field, "liveness_ttl");
  o = {};
  o.instance_id = "a|b";
  EXPECT_EQ(fairgate::validate(o)->field, "instance_id");
  o = {};
  o.url = "http://x";
  EXPECT_EQ(fairgate::validate(o)->field, "url");
  o = {};
  o.key_prefix = "a{b";
  EXPECT_EQ(fairgate::validate(o)->field, "key_prefix");
  asio::io_context io;
  EXPECT_THROW(fairgate::make_redis_backend(io.get_executor(), o), std::invalid_argument);
}

TEST(RedisBackendTest, GrantsQueuesTimesOutAndRejects) {
  const std::string name = test_name();
  Instance a(fast_options());
  Settings s = cap(1);
  s.max_queue = 1;
  Limiter lim = a.open(name, s);
  EXPECT_FALSE(a.backend->open("bad name", s));
  EXPECT_EQ(a.backend->kind(), "redis");

  auto first = acquire(lim);
  ASSERT_TRUE(wait_until([&] { return first->done(); }));
  ASSERT_EQ(first->outcome(), Outcome::granted);
  EXPECT_EQ(zcard(name, "holders"), 1);

  auto waiter = acquire_queued(lim, 150ms);
  auto full = acquire(lim);
  ASSERT_TRUE(wait_until([&] { return full->done(); }));
  EXPECT_EQ(full->reason(), RejectReason::queue_full);

  ASSERT_TRUE(wait_until([&] { return waiter->done(); }));
  EXPECT_EQ(waiter->outcome(), Outcome::timed_out);
  EXPECT_NE(waiter->message().find("no permit"), std::string::npos);
  ASSERT_TRUE(wait_until([&] { return zcard(name, "queue") == 0; }, 2s)) << "the timed-out waiter left Redis";

  auto never_wait = acquire(lim, AcquireOptions{.max_wait = 0ms});
  ASSERT_TRUE(wait_until([&] { return never_wait->done(); }));
  EXPECT_EQ(never_wait->outcome(), Outcome::timed_out);

  auto snap = lim.snapshot();
  EXPECT_EQ(snap.holders.size(), 1u);
  EXPECT_EQ(snap.stats.grants, 1u);
  EXPECT_EQ(snap.stats.timeouts, 2u);

  first->release();
  ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 0; }, 2s));
  EXPECT_TRUE(wait_until([&] { return lim.snapshot().in_use == 0; }, 2s)) << "the heartbeat refreshes counts";
}

TEST(RedisBackendTest, CancelWhileWaitingRemovesTheWaiter) {
  const std::string name = test_name();
  Instance a(fast_options());
  Limiter lim = a.open(name, cap(1));
  auto holder = acquire(lim);
  ASSERT_TRUE(wait_until([&] { return holder->done(); }));
  asio::cancellation_signal signal;
  auto probe = std::make_shared<Probe>();
  auto queued = std::make_shared<std::atomic<bool>>(false);
  AcquireOptions o;
  o.on_queued = [queued](const fairgate::QueueStatus&) { queued->store(true); };
  lim.async_acquire(
      o, asio::bind_cancellation_slot(signal.slot(), [probe](AcquireResult r) { probe->set(std::move(r)); }));
  ASSERT_TRUE(wait_until([&] { return queued->load(); }));
  EXPECT_EQ(zcard(name, "queue"), 1);
  std::promise<void> emitted;
  asio::post(a.io, [&] {
    signal.emit(asio::cancellation_type::terminal);
    emitted.set_value();
  });
  emitted.get_future().wait();
  ASSERT_TRUE(wait_until([&] { return probe->done(); }));
  EXPECT_EQ(probe->outcome(), Outcome::cancelled);
  ASSERT_TRUE(wait_until([&] { return zcard(name, "queue") == 0; }, 2s));
  holder->release();
  ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 0; }, 2s))
      << "nobody was granted the freed permit";
}

// F1 + F2 + F4 across three instances. FIFO is checked in Redis order: a
// MONITOR connection records, in the order Redis executed them, each waiter's
// enqueue (ZADD queue <seq> <member>) and each hand-off to a waiter (PUBLISH
// on its instance's wake channel). dispatch() must hand permits out in
// increasing sequence (skipping waiters that left); client-side timestamps of
// grants made a fraction of a millisecond apart on different instances cannot
// show this reliably, Redis' own order can.
TEST(RedisBackendTest, FifoAndNoOvershootAcrossThreeInstances) {
  const std::string name = test_name();
  constexpr int kInstances = 3;
  constexpr int kPerInstance = 50;
  constexpr std::uint32_t kCap = 3;
  // Declared before the instances: their io threads use these until joined.
  std::atomic<int> holding{0}, max_holding{0}, granted{0}, timed_out{0}, cancelled{0}, other{0}, ended{0};
  std::atomic<int> double_end{0};
  fairgate::test::RedisMonitor monitor(server().port());
  std::vector<std::unique_ptr<Instance>> instances;
  std::vector<Limiter> limiters;
  for (int i = 0; i < kInstances; ++i) {
    auto o = fast_options();
    o.instance_id = "fifo" + std::to_string(i);
    instances.push_back(std::make_unique<Instance>(o, i == 0 ? 2 : 1));  // instance 0: two io threads
    limiters.push_back(instances.back()->open(name, cap(kCap, 10s)));
  }
  std::mt19937 rng(20261129);
  struct Req {
    std::atomic<int> ends{0};
    asio::cancellation_signal signal;
    std::optional<asio::steady_timer> timer;
  };
  std::vector<std::shared_ptr<Req>> reqs;
  const auto t0 = Clock::now();
  for (int round = 0; round < kPerInstance; ++round) {
    for (int i = 0; i < kInstances; ++i) {
      auto req = std::make_shared<Req>();
      reqs.push_back(req);
      const int kind = static_cast<int>(rng() % 10);  // 0: cancels, 1: short timeout, else patient
      const auto hold = std::chrono::milliseconds(1 + rng() % 12);
      const auto cancel_after = std::chrono::milliseconds(5 + rng() % 40);
      AcquireOptions o;
      if (kind == 1) o.max_wait = std::chrono::milliseconds(20 + rng() % 60);
      auto& inst = *instances[static_cast<std::size_t>(i)];
      // Issue, cancel and complete on one strand of the instance's io: a
      // cancellation signal must not race the completion that clears its slot.
      auto strand = asio::make_strand(inst.io);
      asio::post(strand, [&, req, o, hold, kind, cancel_after, strand,
                          lim = limiters[static_cast<std::size_t>(i)]]() mutable {
        auto handler = [&, req, hold, ioex = inst.io.get_executor()](AcquireResult r) {
          if (req->ends.fetch_add(1) != 0) double_end++;
          ended++;
          if (!r.granted()) {
            (r.outcome() == Outcome::timed_out   ? timed_out
             : r.outcome() == Outcome::cancelled ? cancelled
                                                 : other)++;
            return;
          }
          granted++;
          const int now_holding = ++holding;
          int seen = max_holding.load();
          while (now_holding > seen && !max_holding.compare_exchange_weak(seen, now_holding)) {
          }
          auto timer = std::make_shared<asio::steady_timer>(ioex, hold);
          timer->async_wait([&, timer, permit = r.take_permit()](boost::system::error_code) mutable {
            --holding;  // before the release: the count never lags behind Redis
            permit.release();
          });
        };
        if (kind == 0) {
          req->timer.emplace(strand, cancel_after);
          req->timer->async_wait(
              [req](boost::system::error_code) { req->signal.emit(asio::cancellation_type::terminal); });
          lim.async_acquire(o, asio::bind_cancellation_slot(req->signal.slot(),
                                                            asio::bind_executor(strand, std::move(handler))));
        } else {
          lim.async_acquire(o, std::move(handler));
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 1500));
  }
  const int total = kInstances * kPerInstance;
  ASSERT_TRUE(wait_until([&] { return ended.load() == total; }, 60s)) << ended.load() << " of " << total;
  const auto elapsed = Clock::now() - t0;
  EXPECT_EQ(double_end.load(), 0) << "every request ends exactly once";
  EXPECT_LE(max_holding.load(), static_cast<int>(kCap)) << "never more holders than the cap";
  EXPECT_EQ(other.load(), 0) << "no rejection expected";
  EXPECT_GT(granted.load(), total / 2);
  ASSERT_TRUE(wait_until([&] { return holding.load() == 0; }, 10s));
  ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 0 && zcard(name, "queue") == 0; }, 5s))
      << "holders " << zcard(name, "holders") << ", queue " << zcard(name, "queue");

  // FIFO in Redis order.
  std::this_thread::sleep_for(100ms);
  const auto fifo = fairgate::test::fifo_in_redis_order(monitor.lines(), "fairgate", name);
  const int handoffs = fifo.handoffs;
  EXPECT_EQ(fifo.unknown, 0) << "a hand-off to a waiter that never queued";
  EXPECT_EQ(fifo.inversions, 0) << "hand-offs in arrival (sequence) order";
  EXPECT_GT(handoffs, 20) << "the queue was exercised";
  std::printf(
      "fifo: %d requests, %d granted (%d after waiting), %d timed out, %d cancelled, max holders %d/%u, "
      "%.0f ms\n",
      total, granted.load(), handoffs, timed_out.load(), cancelled.load(), max_holding.load(), kCap,
      std::chrono::duration<double, std::milli>(elapsed).count());
}

// F5: an instance that stops dead while holding permits. Its permits reach
// the other instance's waiters within liveness_ttl + heartbeat_interval, with
// no new arrival (the survivor's heartbeat reaps and dispatches).
TEST(RedisBackendTest, CrashedHolderIsReapedWithinTtlPlusInterval) {
  const std::string name = test_name();
  auto o = fast_options();
  Instance crashing(o);
  Instance survivor(o);
  Limiter lc = crashing.open(name, cap(2));
  Limiter ls = survivor.open(name, cap(2));
  auto h1 = acquire(lc);
  auto h2 = acquire(lc);
  ASSERT_TRUE(wait_until([&] { return h1->done() && h2->done(); }));
  ASSERT_EQ(h1->outcome(), Outcome::granted);
  ASSERT_EQ(h2->outcome(), Outcome::granted);
  auto w1 = acquire_queued(ls);
  auto w2 = acquire_queued(ls);

  crashing.freeze();
  const auto t0 = Clock::now();
  const auto bound = o.liveness_ttl + o.heartbeat_interval + 500ms;
  ASSERT_TRUE(wait_until([&] { return w1->done() && w2->done(); }, bound + 2s));
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::max(w1->at(), w2->at()) - t0);
  EXPECT_EQ(w1->outcome(), Outcome::granted);
  EXPECT_EQ(w2->outcome(), Outcome::granted);
  EXPECT_LE(took, bound);
  std::printf("crash recovery: %lld ms (ttl %lld ms + interval %lld ms)\n",
              static_cast<long long>(took.count()), static_cast<long long>(o.liveness_ttl.count()),
              static_cast<long long>(o.heartbeat_interval.count()));

  // The frozen instance comes back: told it was lost, it restores its running
  // work (above the cap: never revoked), then everyone releases.
  crashing.thaw();
  ASSERT_TRUE(wait_until([&] { return crashing.impl(name)->restores() >= 1; }, 5s));
  ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 4; }, 5s));
  h1->release();
  h2->release();
  w1->release();
  w2->release();
  ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 0 && zcard(name, "queue") == 0; }, 5s));
}

// A Redis that lost only its last writes — here a restart from an RDB
// snapshot taken before a grant (Redis' default persistence; a failover to a
// replica that had not received the grant is the same): the state is there,
// both instances registered, but the grant is not. The instance that holds
// it is frozen, so its heartbeat cannot report it first. The other one's
// acquire must not get that seat: Redis has a new replication id, so the
// script fences the state before granting (docs/design.md, recovery rule 14);
// the holder comes back, restores its permit, and the waiter is granted only
// after its release. Judged from the clients' own times.
// Rule 14 fences a switch of Redis (a restart, a failover) until every
// instance has restored what it runs. The first heartbeat after the
// connection was made anew asks which Redis this is, so the fence runs from
// then: a limiter idle through a restart is not fenced at its first grant,
// however long after (a helper saw 4 s at a first use 15 s after a restart,
// and a shadow limiter report every request as a would-be timeout).
TEST(RedisBackendTest, ALimiterIdleThroughARestartIsNotFencedAtItsFirstUseLongAfter) {
  const std::string name = test_name();
  RedisServer redis;  // its own: restarted from a snapshot
  auto o = fast_options();
  o.url = redis.url();
  o.recovery_fence = 1500ms;
  Instance a(o);
  Limiter lim = a.open(name, cap(1));
  ASSERT_TRUE(wait_until([&] { return ready_past_fence(a, name, lim); }, 10s));
  ASSERT_EQ(redis.command({"SAVE"}), "OK");
  redis.restart();  // the same data, another replication id
  ASSERT_TRUE(wait_until([&] { return lim.snapshot().engine.redis_switches == 1; }, 5s))
      << "the switch is seen by a heartbeat, without any grant";
  ASSERT_TRUE(wait_until([&] { return !lim.snapshot().engine.fence_left.count(); }, 10s));
  std::this_thread::sleep_for(o.heartbeat_interval * 2);  // past the fence in Redis too
  const auto asked = Clock::now();
  auto first = acquire(lim);
  ASSERT_TRUE(wait_until([&] { return first->done(); }));
  EXPECT_EQ(first->outcome(), Outcome::granted);
  EXPECT_LT(first->at() - asked, *o.recovery_fence / 2) << "fenced at the first use, long after the restart";
  first->release();
}

TEST(RedisBackendTest, ARestartThatLostAGrantFencesTheStateBeforeGrantingAgain) {
  const std::string name = test_name();
  RedisServer redis;  // its own: restarted from a snapshot
  auto o = fast_options();
  o.url = redis.url();
  o.liveness_ttl = 4000ms;  // the frozen holder is not reaped meanwhile
  o.recovery_fence = 3000ms;
  Instance holder_instance(o);
  Instance other(o);
  Limiter lh = holder_instance.open(name, cap(1));
  Limiter lo = other.open(name, cap(1));
  ASSERT_TRUE(wait_until(
      [&] { return ready_past_fence(holder_instance, name, lh) && ready_past_fence(other, name, lo); }, 10s))
      << "past the new state's fence";
  ASSERT_EQ(redis.command({"SAVE"}), "OK");  // both registered, nothing held
  auto held = acquire(lh);
  ASSERT_TRUE(wait_until([&] { return held->done(); }));
  ASSERT_EQ(held->outcome(), Outcome::granted);
  const std::string id_before = redis.command({"INFO", "replication"});
  const std::string fence_before = redis.command({"HGET", key(name, "cfg"), "fence_until"});

  holder_instance.freeze();
  redis.restart();  // kill -9, then up again from the snapshot: the grant is gone
  ASSERT_EQ(redis.command(fairgate::test::count_command(key(name, "holders"))), "0") << "the grant was lost";
  ASSERT_EQ(redis.command(fairgate::test::count_command(key(name, "instances"))), "2")
      << "the registrations were not";
  ASSERT_NE(redis.command({"INFO", "replication"}), id_before);

  auto waiter = acquire_queued(lo);  // fails here if granted: two holders with a cap of 1
  ASSERT_FALSE(waiter->done()) << waiter->message();
  EXPECT_EQ(redis.command(fairgate::test::count_command(key(name, "holders"))), "0");
  EXPECT_GT(std::stoll(redis.command({"HGET", key(name, "cfg"), "fence_until"})), std::stoll(fence_before))
      << "fenced by the acquire that found another Redis";
  EXPECT_TRUE(wait_until([&] { return lo.snapshot().engine.redis_switches == 1; }, 3s))
      << "seen and counted (fairgate_redis_switches_total) at the next heartbeat";

  holder_instance.thaw();
  ASSERT_TRUE(wait_until([&] { return holder_instance.impl(name)->restores() >= 1; }, 5s));
  ASSERT_TRUE(wait_until(
      [&] { return redis.command(fairgate::test::count_command(key(name, "holders"))) == "1"; }, 5s))
      << "the running permit is counted again";
  // Past the fence, the seat is still taken: the waiter waits for the release.
  ASSERT_TRUE(wait_until([&] { return !lo.snapshot().engine.fence_left.count(); }, 10s));
  std::this_thread::sleep_for(o.heartbeat_interval * 2);
  EXPECT_FALSE(waiter->done()) << "granted while the restored holder still runs";
  const auto released_at = Clock::now();
  held->release();
  ASSERT_TRUE(wait_until([&] { return waiter->done(); }, 5s));
  EXPECT_EQ(waiter->outcome(), Outcome::granted) << waiter->message();
  EXPECT_GE(waiter->at(), released_at) << "never two holders at once";
  waiter->release();
  ASSERT_TRUE(wait_until(
      [&] { return redis.command(fairgate::test::count_command(key(name, "holders"))) == "0"; }, 5s));
}

// A restart from an older snapshot also takes the arrival counter back, below the order scores
// of waiters that their instance still has and restores. Those waiters keep their place: an
// arrival after the restart queues behind them (it got a lower score and went ahead of them:
// 7.6 s waiters overtaken, timeouts, in a helper's run of `fairgate serve`). Grant order judged
// from the clients.
TEST(RedisBackendTest, RestoredWaitersStayAheadAfterAnOlderSnapshot) {
  const std::string name = test_name();
  RedisServer redis;  // its own: restarted from a snapshot
  auto o = fast_options();
  o.url = redis.url();
  o.recovery_fence = 1000ms;
  Instance holder_instance(o);
  Instance other(o);
  Limiter lh = holder_instance.open(name, cap(1));
  Limiter lo = other.open(name, cap(1));
  ASSERT_TRUE(wait_until(
      [&] { return ready_past_fence(holder_instance, name, lh) && ready_past_fence(other, name, lo); }, 10s));
  ASSERT_EQ(redis.command({"SAVE"}), "OK");  // the counter as it stands, nobody waiting
  auto held = acquire(lh);
  ASSERT_TRUE(wait_until([&] { return held->done(); }));
  ASSERT_EQ(held->outcome(), Outcome::granted);
  auto w1 = acquire_queued(lo, 60s);
  auto w2 = acquire_queued(lo, 60s);

  redis.restart();  // from the snapshot: the permit, both waiters and two arrivals are gone
  ASSERT_EQ(redis.command(fairgate::test::count_command(key(name, "queue"))), "0");
  ASSERT_TRUE(wait_until(
      [&] {
        return redis.command(fairgate::test::count_command(key(name, "holders"))) == "1" &&
               redis.command(fairgate::test::count_command(key(name, "queue"))) == "2";
      },
      10s))
      << "both instances restored what they run and wait for";
  auto w3 = acquire_queued(lo, 60s);  // after the restart
  ASSERT_EQ(redis.command(fairgate::test::count_command(key(name, "queue"))), "3");

  held->release();
  ASSERT_TRUE(wait_until([&] { return w1->done() || w2->done() || w3->done(); }, 10s));
  EXPECT_TRUE(w1->done()) << "the oldest waiter first";
  EXPECT_FALSE(w3->done()) << "the arrival after the restart went ahead of the restored waiters";
  w1->release();
  ASSERT_TRUE(wait_until([&] { return w2->done() || w3->done(); }, 10s));
  EXPECT_TRUE(w2->done());
  EXPECT_FALSE(w3->done());
  w2->release();
  ASSERT_TRUE(wait_until([&] { return w3->done(); }, 10s));
  EXPECT_EQ(w3->outcome(), Outcome::granted) << w3->message();
  w3->release();
}

/// fast_options() on a server of the test's own, logging to `log`.
RedisBackendOptions options_on(const RedisServer& own, const fairgate::test::LogLines& log) {
  auto o = fast_options();
  o.url = own.url();
  o.log = log.sink();
  return o;
}

// A Redis back from an older snapshot serves an older copy of the state, which names the Redis
// it was saved on, not this one. That copy is not a switch of its own: the script that finds this
// Redis (a grant, or the first heartbeat after the reconnect) fences the state, and the log tells
// that once, against the Redis known before, with the fence in force (it said "fenced for 0.0 s"
// with the snapshot's id, then the real switch).
TEST(RedisBackendTest, AnOlderCopyOfTheStateIsToldAsOneSwitchWithItsFence) {
  const std::string name = test_name();
  RedisServer redis;
  fairgate::test::LogLines logged;
  auto o = options_on(redis, logged);
  o.recovery_fence = 1000ms;
  Instance a(o);
  Limiter l = a.open(name, cap(1));
  ASSERT_TRUE(wait_until([&] { return ready_past_fence(a, name, l); }, 10s));
  ASSERT_EQ(redis.command({"SAVE"}), "OK");  // the state names this Redis (X)
  const auto replid = [&] {
    const std::string info = redis.command({"INFO", "replication"});
    const auto at = info.find("master_replid:");
    return info.substr(at + 14, 8);
  };
  const auto grant_once = [&] {
    auto p = acquire(l);
    EXPECT_TRUE(wait_until([&] { return p->done(); }, 10s));
    EXPECT_EQ(p->outcome(), Outcome::granted) << p->message();
    p->release();
  };
  const auto switch_lines = [&] { return logged.with("on another Redis than before"); };
  redis.restart();  // Y: the first grant fences the state and names Y
  const std::string y = replid();
  grant_once();
  ASSERT_TRUE(wait_until([&] { return l.snapshot().engine.redis_switches == 1; }, 5s));
  ASSERT_EQ(switch_lines().size(), 1u);
  redis.restart();  // Z, from the same snapshot: the state names X again, unfenced
  const std::string z = replid();
  // The first heartbeat after the reconnect asks which Redis this is (no grant needed): one
  // switch, against the Redis known before (Y, not the X the older copy names), with its fence.
  ASSERT_TRUE(wait_until([&] { return switch_lines().size() == 2; }, 5s));
  const std::string line = switch_lines().back();
  EXPECT_NE(line.find("replication id " + z + " was " + y), std::string::npos) << line;
  EXPECT_EQ(line.find("fenced for 0.0 s"), std::string::npos) << line;
  grant_once();
  const auto beats = a.impl(name)->heartbeats();
  ASSERT_TRUE(wait_until([&] { return a.impl(name)->heartbeats() >= beats + 3; }, 10s));
  EXPECT_EQ(switch_lines().size(), 2u) << "told once: " << switch_lines().back();
  EXPECT_EQ(l.snapshot().engine.redis_switches, 2u);
}

/// fast_options() as `user` (password "pw") on the shared server, logging to `log`.
RedisBackendOptions options_as(const std::string& user, const fairgate::test::LogLines& log) {
  auto o = fast_options();
  o.url = "redis://" + user + ":pw@" + server().host() + ":" + std::to_string(server().port());
  o.log = log.sink();
  return o;
}

// Where an ACL denies INFO the scripts cannot tell which Redis they run on,
// so rule 14 is off (grants go on: RedisScriptsTest.WithoutInfoAllowed...).
// The operator is told, once, at a warning level, and what to allow.
TEST(RedisBackendTest, AnAclThatDeniesInfoIsReportedOnce) {
  const std::string name = test_name();
  const std::string user = "fg-noinfo-" + std::to_string(::getpid());
  ASSERT_EQ(server().command({"ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-info"}), "OK");
  fairgate::test::LogLines logged;
  const auto o = options_as(user, logged);
  const auto told = [&] {  // the lines that say so
    std::vector<std::string> out;
    for (const auto& l : logged.with("does not let this user run INFO"))
      if (l.find("+info") != std::string::npos) out.push_back(l);
    return out;
  };
  {
    Instance a(o);
    Limiter l = a.open(name, cap(1));
    ASSERT_TRUE(wait_until([&] { return ready_past_fence(a, name, l); }, 10s));
    EXPECT_EQ(server().command({"HGET", key(name, "cfg"), "source"}), "") << "no id known";
    auto held = acquire(l);
    ASSERT_TRUE(wait_until([&] { return held->done(); }));
    EXPECT_EQ(held->outcome(), Outcome::granted) << held->message();
    std::this_thread::sleep_for(o.heartbeat_interval * 4);  // several heartbeats
    const auto said = told();
    ASSERT_EQ(said.size(), 1u) << "told once, not at every heartbeat";
    EXPECT_EQ(fairgate::redis::level_of(said[0]), fairgate::LogLevel::warn) << said[0];
    held->release();
  }
  server().command({"ACL", "DELUSER", user});
}

// A user the ACL does not let call fairgate's scripts (here EVALSHA taken
// away while it runs, as an operator might): every call is refused. That is
// Redis failing for this limiter, not a verdict: it follows on_redis_down
// (local, local_share 1: served from its own seat) where before it answered
// each arrival "unavailable" and never went degraded (so /healthz said all
// was well), logging every call and every heartbeat. The operator is told
// once what Redis refuses, as which user, and where the fix is. Given back,
// the limiter is Redis' again and Redis has the permit.
TEST(RedisBackendTest, AUserRefusedItsCallsIsNamedOnceAndFollowsOnRedisDown) {
  const std::string name = test_name();
  const std::string user = "fg-denied-" + std::to_string(::getpid());
  ASSERT_EQ(server().command(fairgate::test::documented_acl(user, "pw")), "OK");
  fairgate::test::LogLines logged;
  const auto o = options_as(user, logged);
  const auto holders = [&] { return zcard(name, "holders"); };
  {
    Instance a(o);
    Settings s = cap(2, 30s);
    s.local_share = 1;
    Limiter l = a.open(name, s);
    ASSERT_TRUE(wait_until([&] { return ready_past_fence(a, name, l); }, 10s));
    ASSERT_EQ(server().command({"ACL", "SETUSER", user, "-evalsha"}), "OK");
    EXPECT_TRUE(wait_until([&] { return a.impl(name)->degraded(); }, 10s)) << logged.all();
    auto held = acquire(l);
    ASSERT_TRUE(wait_until([&] { return held->done(); }, 10s));
    EXPECT_EQ(held->outcome(), Outcome::granted) << "served from its own seat: " << held->message();
    std::this_thread::sleep_for(o.heartbeat_interval * 4);  // several probes, all refused
    const auto said = logged.with("refused a call of fairgate's");
    ASSERT_EQ(said.size(), 1u) << "told once, not per call: " << logged.all();
    auto ep = std::get<fairgate::redis::Endpoint>(fairgate::redis::parse_url(o.url));
    EXPECT_EQ(said[0], fairgate::redis::denied_line(
                           ep, "NOPERM this user has no permissions to run the 'evalsha' command"));
    EXPECT_EQ(fairgate::redis::level_of(said[0]), fairgate::LogLevel::warn);
    EXPECT_TRUE(logged.with("heartbeat failed").empty()) << logged.all();
    EXPECT_EQ(logged.with("degraded: Redis refused this user's calls (docs/redis-acl.md) for ").size(), 1u)
        << "not \"unreachable\": " << logged.all();
    EXPECT_GT(a.backend->health().error_replies, 0u) << "counted as Redis refusing";

    ASSERT_EQ(server().command({"ACL", "SETUSER", user, "+evalsha"}), "OK");
    EXPECT_TRUE(wait_until([&] { return !a.impl(name)->degraded(); }, 10s)) << logged.all();
    EXPECT_TRUE(wait_until([&] { return holders() == 1; }, 10s)) << "Redis counts the local permit";
    held->release();
    EXPECT_TRUE(wait_until([&] { return holders() == 0; }, 10s));
  }
  server().command({"ACL", "DELUSER", user});
}

// A server without sharded Pub/Sub (older than Redis 7.0, where SSUBSCRIBE
// is unknown; renamed away here): a limiter cannot hear its wake messages,
// so a waiter hears of a free seat only at its next heartbeat. Said once, at
// a warning level, with what fairgate needs; before, the refused subscription
// went unsaid.
TEST(RedisBackendTest, AServerWithoutShardedPubSubIsNamed) {
  RedisServer own({"--rename-command", "SSUBSCRIBE", ""});
  const std::string name = test_name();
  fairgate::test::LogLines logged;
  const auto o = options_on(own, logged);
  Instance a(o);
  Limiter l = a.open(name, cap(1));
  const auto said_so = [&] { return logged.with("does not know a command fairgate needs"); };
  ASSERT_TRUE(wait_until([&] { return !said_so().empty(); }, 10s)) << logged.all();
  std::this_thread::sleep_for(o.heartbeat_interval * 4);
  const auto said = said_so();
  ASSERT_EQ(said.size(), 1u) << logged.all();
  EXPECT_NE(said[0].find("ERR unknown command 'SSUBSCRIBE'"), std::string::npos) << said[0];
  EXPECT_EQ(fairgate::redis::level_of(said[0]), fairgate::LogLevel::warn);
}

/// One instance on a redis-server of the test's own (a fault there stops no
/// other test), with its limiter `name` (cap 1, max wait 30 s), logging into
/// `logged`. ready(): past the new state's fence.
struct OnOwnServer {
  explicit OnOwnServer(std::string limiter) : name(std::move(limiter)), l(a.open(name, cap(1, 30s))) {}
  bool ready() {
    return wait_until([&] { return ready_past_fence(a, name, l); }, 10s);
  }
  RedisServer own;
  fairgate::test::LogLines logged;
  RedisBackendOptions o = options_on(own, logged);
  Instance a{o};
  std::string name;
  Limiter l;
};

// A Redis out of memory (maxmemory reached, policy noeviction) answers -OOM
// to every command that would add data: an arrival cannot queue, a heartbeat
// cannot extend its liveness. That is Redis failing, not a verdict: the
// arrival waits (asked again, then served by on_redis_down = local from the
// instance's own seat), never "unavailable" at once as before; a release
// still runs. Once memory is back, Redis has the permit again. The operator
// is told once what is wrong and what to do.
TEST(RedisBackendTest, AnOutOfMemoryRedisIsWaitedOutAndNamed) {
  OnOwnServer s(test_name());  // maxmemory on the shared server would stop the other tests
  ASSERT_TRUE(s.ready());
  auto held = acquire(s.l);
  ASSERT_TRUE(wait_until([&] { return held->done(); }));
  ASSERT_EQ(held->outcome(), Outcome::granted) << held->message();

  ASSERT_EQ(s.own.command({"CONFIG", "SET", "maxmemory", "1"}), "OK");  // noeviction: the default
  auto waiter = acquire(s.l);
  // Failing from the first command timeout on, degraded degrade_after later.
  EXPECT_TRUE(wait_until([&] { return s.a.impl(s.name)->degraded(); }, 10s)) << s.logged.all();
  EXPECT_FALSE(waiter->done()) << "rejected while Redis was out of memory: " << waiter->message();
  held->release();  // degraded, local: its seat goes to the waiter (Redis still counts it)
  ASSERT_TRUE(wait_until([&] { return waiter->done(); }, 10s));
  EXPECT_EQ(waiter->outcome(), Outcome::granted) << waiter->message();

  ASSERT_EQ(s.own.command({"CONFIG", "SET", "maxmemory", "0"}), "OK");
  EXPECT_TRUE(wait_until([&] { return !s.a.impl(s.name)->degraded(); }, 10s));
  const auto holders = [&] { return s.own.command(fairgate::test::count_command(key(s.name, "holders"))); };
  EXPECT_TRUE(wait_until([&] { return holders() == "1"; }, 10s)) << "Redis counts the waiter's permit";
  const auto said = s.logged.with("is out of memory");
  ASSERT_EQ(said.size(), 1u) << s.logged.all();
  EXPECT_EQ(said[0],
            fairgate::redis::refusal_line(
                std::get<fairgate::redis::Endpoint>(fairgate::redis::parse_url(s.own.url())), "OOM "));
  EXPECT_EQ(fairgate::redis::level_of(said[0]), fairgate::LogLevel::warn);
  waiter->release();
  EXPECT_TRUE(wait_until([&] { return holders() == "0"; }, 10s));
}

// A master demoted to a replica under a standalone URL (an operator's
// REPLICAOF, a failover without Sentinel in fairgate's URL) answers every
// write READONLY. Named once, with the fix, where before the limiter went
// degraded as "Redis unreachable" with no word of why; an arrival waits (the
// calls are sent again). Made a master again, the limiter is Redis' again and
// the waiter is served.
TEST(RedisBackendTest, ADemotedMasterIsNamedOnceAndWaitedOut) {
  OnOwnServer s(test_name());
  RedisServer other;  // what `s.own` replicates meanwhile
  ASSERT_TRUE(s.ready());

  ASSERT_EQ(s.own.command({"REPLICAOF", other.host(), std::to_string(other.port())}), "OK");
  auto waiter = acquire(s.l);
  const auto said = [&] { return s.logged.with("is a read-only replica"); };
  ASSERT_TRUE(wait_until([&] { return !said().empty() && s.a.impl(s.name)->degraded(); }, 10s))
      << s.logged.all();
  std::this_thread::sleep_for(s.o.heartbeat_interval * 4);  // heartbeats and the arrival, all refused
  ASSERT_EQ(said().size(), 1u) << s.logged.all();
  EXPECT_EQ(said()[0], fairgate::redis::refusal_line(
                           std::get<fairgate::redis::Endpoint>(fairgate::redis::parse_url(s.own.url())),
                           "READONLY You can't write against a read only replica."));
  EXPECT_EQ(fairgate::redis::level_of(said()[0]), fairgate::LogLevel::warn);

  ASSERT_EQ(s.own.command({"REPLICAOF", "NO", "ONE"}), "OK");
  ASSERT_TRUE(wait_until([&] { return waiter->done(); }, 20s)) << s.logged.all();
  EXPECT_EQ(waiter->outcome(), Outcome::granted) << waiter->message();
  EXPECT_TRUE(wait_until([&] { return !s.a.impl(s.name)->degraded(); }, 10s)) << s.logged.all();
  EXPECT_TRUE(wait_until(
      [&] { return s.own.command(fairgate::test::count_command(key(s.name, "holders"))) == "1"; }, 10s))
      << "Redis counts the waiter's permit";
  waiter->release();
}

// A holders key deleted on its own (an evicting maxmemory-policy, a DEL) took
// a running permit with it: the next script fences the state, the instance
// says what happened once, and restores the permit; the waiter is not granted
// on top of it, and gets the seat when it is released.
TEST(RedisBackendTest, ADeletedHoldersKeyIsNamedFencedAndRestored) {
  const std::string name = test_name();
  fairgate::test::LogLines logged;
  Instance a(options_on(server(), logged));
  Limiter l = a.open(name, cap(1, 30s));
  ASSERT_TRUE(wait_until([&] { return ready_past_fence(a, name, l); }, 10s));
  auto held = acquire(l);
  ASSERT_TRUE(wait_until([&] { return held->done(); }));
  ASSERT_EQ(held->outcome(), Outcome::granted) << held->message();
  auto waiter = acquire(l);
  ASSERT_TRUE(wait_until([&] { return zcard(name, "queue") == 1; }, 5s));

  ASSERT_EQ(server().command({"DEL", key(name, "holders")}), "1");
  const auto said = [&] { return logged.with("Redis lost the limiter's holders key"); };
  ASSERT_TRUE(wait_until([&] { return !said().empty(); }, 10s)) << logged.all();
  ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 1; }, 10s)) << "the permit restored";
  std::this_thread::sleep_for(1s);  // heartbeats go on, the fence ends
  EXPECT_FALSE(waiter->done()) << "never granted on top of the running permit";
  EXPECT_EQ(said().size(), 1u) << logged.all();
  EXPECT_NE(said()[0].find("docs/faults.md"), std::string::npos) << said()[0];
  EXPECT_NE(said()[0].find(": fenced for "), std::string::npos) << said()[0];
  EXPECT_EQ(l.snapshot().engine.holders_key_lost, 1u) << "counted (fairgate_holders_key_lost_total)";
  held->release();
  ASSERT_TRUE(wait_until([&] { return waiter->done(); }, 10s));
  EXPECT_EQ(waiter->outcome(), Outcome::granted) << waiter->message();
  waiter->release();
  EXPECT_TRUE(wait_until([&] { return zcard(name, "holders") == 0 && zcard(name, "queue") == 0; }, 5s));
}

// A tenant key deleted on its own (here tready, the rotation) stranded the
// waiting tenants: a released seat went to nobody. The heartbeat finds it and
// rebuilds the tenant keys; the instance says so once and counts it; the
// waiters are served in their order.
TEST(RedisBackendTest, ADeletedTenantKeyIsNamedRebuiltAndItsWaitersServed) {
  const std::string name = test_name();
  fairgate::test::LogLines logged;
  Instance a(options_on(server(), logged));
  Settings s = cap(1, 30s);
  s.tenant_fairness = true;
  Limiter l = a.open(name, s);
  ASSERT_TRUE(wait_until([&] { return ready_past_fence(a, name, l); }, 10s));
  const auto of = [](const char* tenant) {
    AcquireOptions o;
    o.tenant = tenant;
    return o;
  };
  auto held = acquire(l, of("t1"));
  ASSERT_TRUE(wait_until([&] { return held->done(); }));
  ASSERT_EQ(held->outcome(), Outcome::granted) << held->message();
  auto first = acquire(l, of("t1"));
  ASSERT_TRUE(wait_until([&] { return zcard(name, "queue") == 1; }, 5s));
  auto second = acquire(l, of("t2"));
  ASSERT_TRUE(wait_until([&] { return zcard(name, "queue") == 2; }, 5s));

  ASSERT_EQ(server().command({"DEL", key(name, "tready")}), "1");
  held->release();
  ASSERT_TRUE(wait_until([&] { return first->done(); }, 10s)) << logged.all();
  EXPECT_EQ(first->outcome(), Outcome::granted) << first->message();
  EXPECT_FALSE(second->done()) << "one seat: t1's waiter (the oldest) first";
  const auto said = [&] { return logged.with("Redis lost a tenant key of the limiter"); };
  ASSERT_TRUE(wait_until([&] { return !said().empty(); }, 10s)) << logged.all();
  EXPECT_NE(said()[0].find("docs/faults.md"), std::string::npos) << said()[0];
  first->release();
  ASSERT_TRUE(wait_until([&] { return second->done(); }, 10s));
  EXPECT_EQ(second->outcome(), Outcome::granted) << second->message();
  second->release();
  std::this_thread::sleep_for(600ms);  // more heartbeats: a whole state is not rebuilt again
  EXPECT_EQ(said().size(), 1u) << logged.all();
  EXPECT_EQ(l.snapshot().engine.tenant_keys_rebuilt, 1u) << "counted (fairgate_tenant_keys_rebuilt_total)";
}

// With recovery_fence = 0 a deleted holders key fences nothing, nor does a
// created state (the trade docs/design.md, rule 4, describes): the lines say
// so rather than "fenced for 0.0 s".
TEST(RedisBackendTest, ADeletedHoldersKeyWithoutAFenceSaysItIsNotFenced) {
  const std::string name = test_name();
  fairgate::test::LogLines logged;
  auto o = options_on(server(), logged);
  o.recovery_fence = 0ms;
  Instance a(o);
  Limiter l = a.open(name, cap(1, 30s));
  auto held = acquire(l);
  ASSERT_TRUE(wait_until([&] { return held->done(); }, 10s));
  ASSERT_EQ(held->outcome(), Outcome::granted) << held->message();
  ASSERT_EQ(server().command({"DEL", key(name, "holders")}), "1");
  const auto said = [&] { return logged.with("Redis lost the limiter's holders key"); };
  ASSERT_TRUE(wait_until([&] { return !said().empty(); }, 10s)) << logged.all();
  EXPECT_NE(said()[0].find("not fenced (recovery_fence = 0)"), std::string::npos) << said()[0];
  EXPECT_EQ(said()[0].find("fenced for"), std::string::npos) << said()[0];
  // So does the line of the state's creation.
  const auto created = logged.with("no state in Redis");
  ASSERT_EQ(created.size(), 1u) << logged.all();
  EXPECT_NE(created[0].find("not fenced (recovery_fence = 0"), std::string::npos) << created[0];
  EXPECT_EQ(created[0].find("fenced for"), std::string::npos) << created[0];
  ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 1; }, 10s)) << "the permit restored";
  held->release();
  EXPECT_TRUE(wait_until([&] { return zcard(name, "holders") == 0; }, 5s));
}

// docs/redis-acl.md gives the least a Redis user needs. Its ACL SETUSER line,
// read from the doc, makes a real user; two instances with it do everything
// an instance does (create the state and beat, grant, queue, hand off by
// wake, time out and cancel, the status call, a cluster-wide cap change, the
// restore after a FLUSHALL, rate-limit rules set and checked), and Redis
// refuses none of it.
TEST(RedisBackendTest, TheDocumentedAclIsEnough) {
  const std::string user = "fg-acl-" + std::to_string(::getpid());
  const auto acl = fairgate::test::documented_acl(user, "pw");
  ASSERT_FALSE(acl.empty()) << "docs/redis-acl.md has its ACL SETUSER line";
  ASSERT_EQ(server().command(acl), "OK");

  const std::string name = test_name();
  fairgate::test::LogLines logged;
  const auto o = options_as(user, logged);
  {
    Instance a(o), b(o);
    Limiter la = a.open(name, cap(1));
    Limiter lb = b.open(name, cap(1));
    ASSERT_TRUE(
        wait_until([&] { return ready_past_fence(a, name, la) && ready_past_fence(b, name, lb); }, 10s));
    EXPECT_NE(server().command({"HGET", key(name, "cfg"), "source"}), "") << "INFO allowed: rule 14 on";
    auto held = acquire(la);
    ASSERT_TRUE(wait_until([&] { return held->done(); }));
    ASSERT_EQ(held->outcome(), Outcome::granted) << held->message();
    auto waiter = acquire_queued(lb);
    AcquireOptions brief;
    brief.max_wait = 100ms;
    auto late = acquire(lb, brief);
    ASSERT_TRUE(wait_until([&] { return late->done(); }));
    EXPECT_EQ(late->reason(), RejectReason::timeout) << late->message();
    std::promise<fairgate::StatusResult> status;
    la.async_status(fairgate::StatusQuery{},
                    [&](fairgate::StatusResult r) { status.set_value(std::move(r)); });
    const auto st = status.get_future().get();
    ASSERT_FALSE(st.error) << st.message;
    EXPECT_EQ(st.snapshot.holders.size(), 1u);
    EXPECT_EQ(st.snapshot.waiters.size(), 1u);
    fairgate::SettingsUpdate wider;
    wider.max_concurrent = 2;
    std::promise<fairgate::ConfigureResult> configured;
    la.async_configure(wider, [&](fairgate::ConfigureResult r) { configured.set_value(std::move(r)); });
    const auto c = configured.get_future().get();
    ASSERT_FALSE(c.error) << c.message;
    ASSERT_TRUE(wait_until([&] { return waiter->done(); }, 5s))
        << "the second seat went to the waiter (a wake)";
    EXPECT_EQ(waiter->outcome(), Outcome::granted) << waiter->message();
    ASSERT_EQ(server().command({"FLUSHALL"}), "OK");  // as the default user
    ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 2; }, 10s)) << "restored";
    held->release();
    waiter->release();
    ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 0; }, 5s));

    fairgate::RateLimiterRedisOptions ro;
    ro.url = o.url;
    auto rates = fairgate::RateLimiter::redis(a.io.get_executor(), ro, /*local_layer=*/false);
    fairgate::RateRule rule;
    rule.algorithm = fairgate::RateAlgorithm::fixed_window;
    rule.rate = 1;
    rule.period_ms = 60'000;
    ASSERT_TRUE(rates.set_rule(name, rule));
    const auto first = rates.async_check(fairgate::RateRequest{name, "k", 1}, asio::use_future).get();
    const auto second = rates.async_check(fairgate::RateRequest{name, "k", 1}, asio::use_future).get();
    EXPECT_TRUE(!first.error && first.allowed) << first.message;
    EXPECT_EQ(first.source, fairgate::RateSource::store) << "decided by Redis";
    EXPECT_TRUE(!second.error && !second.allowed) << "the rule is enforced: " << second.message;
    EXPECT_EQ(second.source, fairgate::RateSource::store);
    rule.rate = 2;  // changed for the whole cluster: stored in Redis (HSET), pulled back (HGETALL)
    const auto published = rates.async_publish_rule(name, rule, asio::use_future).get();
    EXPECT_FALSE(published.error) << published.message;
    const auto synced = rates.async_sync_rules(asio::use_future).get();
    EXPECT_FALSE(synced.error) << synced.message;
    EXPECT_EQ(server().command({"EXISTS", "fairgate:rl-rules"}), "1") << "the rule shared at run time";
    rates.shutdown();

    for (auto* instance : {&a, &b}) {
      const auto health = instance->backend->health();
      EXPECT_EQ(health.error_replies, 0u) << "Redis refused nothing";
    }
  }
  for (const auto& l : logged.with("NOPERM")) ADD_FAILURE() << l;
  for (const auto& l : logged.with("refused a call")) ADD_FAILURE() << l;
  for (const auto& l : logged.with("run INFO")) ADD_FAILURE() << l;
  server().command({"ACL", "DELUSER", user});
  server().command({"DEL", "fairgate:rl-rules"});
}

// F6: a lost wake message (Pub/Sub connection killed) is recovered by the
// waiter's own heartbeat, which lists its granted permits.
TEST(RedisBackendTest, LostWakeIsRecoveredByTheHeartbeat) {
  const std::string name = test_name();
  auto o = fast_options();
  Instance a(o);
  Instance b(o);
  Limiter la = a.open(name, cap(1));
  Limiter lb = b.open(name, cap(1));
  std::vector<long long> latencies;
  for (int round = 0; round < 3; ++round) {
    auto holder = acquire(la);
    ASSERT_TRUE(wait_until([&] { return holder->done(); }));
    ASSERT_EQ(holder->outcome(), Outcome::granted);
    auto waiter = acquire_queued(lb);
    server().command({"CLIENT", "KILL", "TYPE", "pubsub"});
    const auto t0 = Clock::now();
    holder->release();  // the grant's wake message is published while b reconnects
    ASSERT_TRUE(wait_until([&] { return waiter->done(); }, o.heartbeat_interval + 2s));
    ASSERT_EQ(waiter->outcome(), Outcome::granted);
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(waiter->at() - t0);
    EXPECT_LE(took, o.heartbeat_interval + 500ms) << "round " << round;
    latencies.push_back(took.count());
    waiter->release();
    ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 0; }, 2s));
  }
  std::printf(
      "grant after pubsub kill: %lld / %lld / %lld ms (interval %lld ms); recovered by heartbeat: %llu\n",
      latencies[0], latencies[1], latencies[2], static_cast<long long>(o.heartbeat_interval.count()),
      static_cast<unsigned long long>(b.impl(name)->lost_wakes_recovered()));
  // After the reconnects the wake path works again (fast, no heartbeat).
  auto holder = acquire(la);
  ASSERT_TRUE(wait_until([&] { return holder->done(); }));
  auto waiter = acquire_queued(lb);
  const auto t0 = Clock::now();
  holder->release();
  ASSERT_TRUE(wait_until([&] { return waiter->done(); }, 2s));
  EXPECT_LE(waiter->at() - t0, 200ms) << "woken by Pub/Sub again after re-SUBSCRIBE";
  std::printf("cross-instance hand-off (release -> waiter's handler): %.2f ms\n",
              std::chrono::duration<double, std::milli>(waiter->at() - t0).count());
  waiter->release();
  ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 0; }, 2s));
}

// F9: raising the cap on one instance admits the waiters of another at once.
TEST(RedisBackendTest, HotConfigFromOneInstanceReachesAnother) {
  const std::string name = test_name();
  auto o = fast_options();
  Instance a(o);
  Instance b(o);
  Limiter la = a.open(name, cap(1));
  Limiter lb = b.open(name, cap(1));
  auto holder = acquire(la);
  ASSERT_TRUE(wait_until([&] { return holder->done(); }));
  std::vector<std::shared_ptr<Probe>> waiters;
  for (int i = 0; i < 3; ++i) waiters.push_back(acquire_queued(lb));
  fairgate::SettingsUpdate update;
  update.max_concurrent = 4;
  const auto t0 = Clock::now();
  ASSERT_EQ(la.configure(update).value().max_concurrent, 4u);
  ASSERT_TRUE(wait_until(
      [&] {
        for (auto& w : waiters)
          if (!w->done()) return false;
        return true;
      },
      2s));
  Clock::time_point last{};
  for (auto& w : waiters) {
    EXPECT_EQ(w->outcome(), Outcome::granted);
    last = std::max(last, w->at());
  }
  EXPECT_LE(last - t0, 200ms) << "admitted by the configure script's dispatch, not a heartbeat";
  EXPECT_TRUE(wait_until([&] { return lb.settings().max_concurrent == 4; }, 2s)) << "b sees the new cap";
  fairgate::SettingsUpdate bad;
  bad.max_concurrent = 0;
  EXPECT_FALSE(lb.configure(bad));
  holder->release();
  for (auto& w : waiters) w->release();
  ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 0; }, 2s));
}

/// The QueueStatus updates one acquire received (on an io thread).
struct Statuses {
  std::mutex mu;
  std::vector<fairgate::QueueStatus> seen;
  std::optional<fairgate::QueueStatus> first() {
    std::lock_guard lock(mu);
    if (seen.empty()) return std::nullopt;
    return seen.front();
  }
};

std::shared_ptr<Probe> acquire_watched(Limiter& limiter, Statuses& st, std::chrono::milliseconds max_wait) {
  AcquireOptions o;
  o.max_wait = max_wait;
  o.on_queued = [&st](const fairgate::QueueStatus& q) {
    std::lock_guard lock(st.mu);
    st.seen.push_back(q);
  };
  return acquire(limiter, std::move(o));
}

// Positions move as the queue moves, for waiters of an instance that neither
// released nor was granted anything: its heartbeat brings the queue head, and
// each waiter's position is its distance from it (order scores are contiguous
// within a state). The waiters arrive a few ms apart, so that order scores
// taken from the clock (tried) would leave the middle ones far behind (at the
// back, the queue length) and fail this.
TEST(RedisBackendTest, PositionsMoveAsTheQueueMovesOnAnotherInstance) {
  const std::string name = test_name();
  auto o = fast_options();
  Instance a(o);
  Instance b(o);
  Limiter la = a.open(name, cap(1));
  Limiter lb = b.open(name, cap(1));
  auto holder = acquire(la);
  ASSERT_TRUE(wait_until([&] { return holder->done(); }));
  auto first = acquire_queued(la);  // position 1, on a
  std::vector<Statuses> st(4);
  std::vector<std::shared_ptr<Probe>> queued;
  for (auto& s : st) {
    std::this_thread::sleep_for(5ms);
    queued.push_back(acquire_watched(lb, s, 20s));
    ASSERT_TRUE(wait_until([&] { return s.first().has_value(); }, 5s));
  }
  for (std::size_t i = 0; i < st.size(); ++i) EXPECT_EQ(st[i].first()->position, i + 2);
  const auto positions = [&] {
    std::string out;
    for (std::size_t i = 1; i < st.size(); ++i) {
      std::lock_guard lock(st[i].mu);
      out += std::to_string(st[i].seen.back().position) + " ";
    }
    return out;
  };
  // Two seats handed on, on a: b's other waiters move up two places at b's next heartbeats.
  holder->release();
  ASSERT_TRUE(wait_until([&] { return first->done(); }));
  first->release();
  ASSERT_TRUE(wait_until([&] { return queued[0]->done(); }));
  ASSERT_TRUE(wait_until([&] { return positions() == "1 2 3 "; }, 5s)) << "positions " << positions();
  for (auto& q : queued) {
    ASSERT_TRUE(wait_until([&] { return q->done(); }));
    q->release();
  }
}

// A waiter that leaves from the middle of the queue moves those behind it up
// one place, though the head did not move: the order scores then have a gap,
// and Redis counts the ranks (heartbeat.lua). Before, the places stayed where
// the order scores put them (one too far back, for good).
TEST(RedisBackendTest, AWaiterLeavingFromTheMiddleMovesThoseBehindItUp) {
  const std::string name = test_name();
  auto o = fast_options();
  Instance a(o);
  Instance b(o);
  Limiter la = a.open(name, cap(1));
  Limiter lb = b.open(name, cap(1));
  auto holder = acquire(la);
  ASSERT_TRUE(wait_until([&] { return holder->done(); }));
  std::vector<Statuses> st(4);
  std::vector<std::shared_ptr<Probe>> queued;
  for (std::size_t i = 0; i < st.size(); ++i) {
    std::this_thread::sleep_for(5ms);
    // The second (on b) gives up after 1.5 s: it leaves from the middle.
    queued.push_back(acquire_watched(i % 2 == 0 ? la : lb, st[i], i == 1 ? 1500ms : 30000ms));
    ASSERT_TRUE(wait_until([&] { return st[i].first().has_value(); }, 5s));
  }
  for (std::size_t i = 0; i < st.size(); ++i) EXPECT_EQ(st[i].first()->position, i + 1);
  const auto last = [&](std::size_t i) {
    std::lock_guard lock(st[i].mu);
    return st[i].seen.back().position;
  };
  // The second waiter leaves: the third (a) and the fourth (b) move up.
  ASSERT_TRUE(wait_until([&] { return queued[1]->done(); }, 10s));
  EXPECT_EQ(queued[1]->outcome(), fairgate::Outcome::timed_out);
  ASSERT_TRUE(wait_until([&] { return last(2) == 2 && last(3) == 3; }, 10s))
      << "positions " << last(2) << " " << last(3) << " (2 3 expected)";
  EXPECT_EQ(last(0), 1u);
  // Then the head moves: every place one up again, from the ranks.
  holder->release();
  ASSERT_TRUE(wait_until([&] { return queued[0]->done(); }));
  ASSERT_TRUE(wait_until([&] { return last(2) == 1 && last(3) == 2; }, 10s))
      << "positions " << last(2) << " " << last(3) << " (1 2 expected)";
  queued[0]->release();
  for (std::size_t i : {2u, 3u}) {
    ASSERT_TRUE(wait_until([&] { return queued[i]->done(); }));
    queued[i]->release();
  }
}

// Instances with different heartbeat intervals and TTLs: the fence of a state
// re-created after a loss must last until the slowest has re-registered and
// restored what it runs. Before, it lasted the fence of whichever instance
// re-created it: after FLUSHALL the fast instance granted its waiter while the
// slow one still ran its permit (found by a fault run: 6 held with cap 3).
// Two processes with one instance id look like one instance to Redis, and the cap does not
// hold (docs/faults.md). Each heartbeat finds the liveness set by the other one: that is
// counted and logged as an error. Instances with ids of their own, beating as often, never are.
TEST(RedisBackendTest, TwoProcessesWithOneInstanceIdAreToldLoudly) {
  const std::string name = test_name();
  auto o = fast_options();
  o.heartbeat_interval = 100ms;
  o.liveness_ttl = 600ms;
  std::vector<std::string> lines;
  std::mutex mu;
  o.log = [&](std::string_view line) {
    std::lock_guard lock(mu);
    lines.emplace_back(line);
  };
  auto twin = o;
  twin.instance_id = "twin";
  Instance a(twin), b(twin);
  auto own = o;
  own.log = {};
  own.instance_id = "own-c";
  Instance c(own);
  own.instance_id = "own-d";
  Instance d(own);
  Limiter la = a.open(name, cap(1)), lb = b.open(name, cap(1));
  Limiter lc = c.open(name + "-own", cap(1)), ld = d.open(name + "-own", cap(1));
  const auto shared = [&] {
    return la.snapshot().engine.instance_id_shared + lb.snapshot().engine.instance_id_shared;
  };
  ASSERT_TRUE(wait_until([&] { return shared() >= 3; }, 15s)) << "never noticed the other process";
  std::this_thread::sleep_for(1s);  // 10 more heartbeats of c and d
  {
    std::lock_guard lock(mu);
    const auto it = std::find_if(lines.begin(), lines.end(), [](const std::string& l) {
      return l.find("another process heartbeats as instance 'twin'") != l.npos;
    });
    ASSERT_NE(it, lines.end());
    EXPECT_EQ(fairgate::redis::level_of(*it), fairgate::LogLevel::error) << *it;
  }
  EXPECT_EQ(lc.snapshot().engine.instance_id_shared, 0u);
  EXPECT_EQ(ld.snapshot().engine.instance_id_shared, 0u);
}

TEST(RedisBackendTest, AStateReCreatedAfterALossWaitsForTheSlowestInstance) {
  const std::string name = test_name();
  auto fast = fast_options();
  fast.heartbeat_interval = 100ms;
  fast.liveness_ttl = 600ms;  // fence 0.7 s
  fast.command_timeout = 300ms;
  auto slow = fast_options();
  slow.heartbeat_interval = 1500ms;
  slow.liveness_ttl = 3000ms;  // fence 4.5 s
  std::vector<std::string> lines;
  std::mutex mu;
  fast.log = [&](std::string_view line) {
    std::lock_guard lock(mu);
    lines.emplace_back(line);
  };
  Instance a(fast);
  Instance b(slow);
  Limiter la = a.open(name, cap(1));
  Limiter lb = b.open(name, cap(1));
  auto holder = acquire(lb);
  ASSERT_TRUE(wait_until([&] { return holder->done(); }));
  ASSERT_EQ(holder->outcome(), fairgate::Outcome::granted);
  // a learns b's longer fence from cfg (and says so).
  ASSERT_TRUE(wait_until(
      [&] {
        std::lock_guard lock(mu);
        return std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
          return l.find("longer recovery fence (4500 ms") != l.npos;
        });
      },
      10s));
  auto waiter = acquire_queued(la, 30s);
  // Just after one of b's heartbeats, so that its next comes 1.5 s after the loss.
  std::atomic<int> beats = 0;
  b.impl(name)->set_send_hook_for_test([&](std::string_view what) {
    if (what == "heartbeat") ++beats;
  });
  const int before = beats.load();
  ASSERT_TRUE(wait_until([&] { return beats.load() > before; }, 10s));
  std::this_thread::sleep_for(150ms);
  ASSERT_EQ(server().command({"FLUSHALL"}), "OK");
  // a re-creates the state at once; b beats only every 1.5 s. Nothing may be granted to a
  // while b's permit runs: the fence holds until b restored it (then the cap is full).
  std::this_thread::sleep_for(3s);
  EXPECT_FALSE(waiter->done()) << "granted while the slow instance still held its permit";
  holder->release();
  ASSERT_TRUE(wait_until([&] { return waiter->done(); }, 15s));
  EXPECT_EQ(waiter->outcome(), fairgate::Outcome::granted);
  waiter->release();
}

// A restore sent while an acquire is on its way (prepared on the caller's
// thread, not yet handed to the connection) can reach Redis first: sent from
// the io thread, or run inline on the connection's strand ahead of the queued
// acquire. If the restore gave that request a place, the acquire — a first
// call, which does not look for one — added a second: one request twice in
// the queue, the next arrival told a position one too far back (seen in CI),
// the waiter never told its own (the restore's answer had taken the place of
// the acquire's), a restore at every heartbeat after. The hook makes the
// overtaking happen every time.
TEST(RedisBackendTest, ARestoreThatOvertakesAnAcquireGivesItNoSecondPlace) {
  const std::string name = test_name();
  Instance a(fast_options());
  Limiter la = a.open(name, cap(1));
  auto holder = acquire(la);
  ASSERT_TRUE(wait_until([&] { return holder->done(); }));
  auto impl = a.impl(name);
  impl->stop_heartbeats_for_test();    // nothing but this restore compares or repairs
  std::this_thread::sleep_for(300ms);  // a heartbeat in flight lands first
  const auto restores = impl->restores();
  std::atomic<bool> fired = false;
  impl->set_send_hook_for_test([&](std::string_view what) {
    if (what == "acquire" && !fired.exchange(true)) impl->restore_now_for_test();
  });
  Statuses st;
  auto waiter = acquire_watched(la, st, 20s);
  ASSERT_TRUE(wait_until([&] { return impl->restores() > restores; }, 5s)) << "the restore went through";
  ASSERT_TRUE(wait_until([&] { return st.first().has_value(); }, 5s)) << "told its position";
  impl->set_send_hook_for_test(nullptr);
  EXPECT_EQ(st.first()->position, 1u) << "nobody is ahead of it";
  EXPECT_EQ(zcard(name, "queue"), 1) << "one place for the one waiter";
  EXPECT_EQ(zcard(name, "byinst"), 1);
  holder->release();
  ASSERT_TRUE(wait_until([&] { return waiter->done(); }));
  EXPECT_EQ(waiter->outcome(), fairgate::Outcome::granted);
  EXPECT_EQ(zcard(name, "queue"), 0) << "nothing left behind it";
  waiter->release();
}

// Loss detection compares a heartbeat's count of this instance's waiters with
// what the heartbeat was sent about. An acquire or a cancel decided after the
// heartbeat was prepared can reach Redis before it (another thread; a call
// run inline on the connection's strand): one waiter more, or one fewer, that
// nothing lost. Each used to set off a restore, which holds every arrival back
// for a round trip (and, before rule 3's fix, could give a waiter two places).
// The hook makes each overtake a heartbeat, once.
TEST(RedisBackendTest, AnAcquireOrACancelThatOvertakesAHeartbeatIsNoLoss) {
  const std::string name = test_name();
  Instance a(fast_options());
  Limiter la = a.open(name, cap(1));
  auto holder = acquire(la);
  ASSERT_TRUE(wait_until([&] { return holder->done(); }));
  asio::cancellation_signal signal;
  auto cancelled = std::make_shared<Probe>();
  auto queued = std::make_shared<std::atomic<bool>>(false);
  AcquireOptions o;
  o.on_queued = [queued](const fairgate::QueueStatus&) { queued->store(true); };
  la.async_acquire(o, asio::bind_cancellation_slot(
                          signal.slot(), [cancelled](AcquireResult r) { cancelled->set(std::move(r)); }));
  ASSERT_TRUE(wait_until([&] { return queued->load(); }));
  auto impl = a.impl(name);
  const auto restores = impl->restores();
  std::shared_ptr<Probe> later;
  std::atomic<int> step = 0;
  std::atomic<std::uint64_t> beats_after = 0;
  impl->set_send_hook_for_test([&](std::string_view what) {
    if (what != "heartbeat") return;
    const int s = step.fetch_add(1);
    if (s == 0) later = acquire(la);                             // runs before this heartbeat
    if (s == 2) signal.emit(asio::cancellation_type::terminal);  // likewise
    if (s == 4) beats_after = impl->heartbeats();                // both replies are in
  });
  ASSERT_TRUE(wait_until([&] { return beats_after.load() > 0; }, 10s));
  ASSERT_TRUE(wait_until([&] { return impl->heartbeats() > beats_after.load() + 1; }, 5s));
  impl->set_send_hook_for_test(nullptr);
  EXPECT_EQ(impl->restores(), restores) << "nothing was lost: no restore";
  EXPECT_EQ(cancelled->outcome(), Outcome::cancelled);
  EXPECT_FALSE(later->done()) << "it waits";
  EXPECT_EQ(zcard(name, "queue"), 1) << "the later arrival only";
  holder->release();
  ASSERT_TRUE(wait_until([&] { return later->done(); }));
  EXPECT_EQ(later->outcome(), Outcome::granted);
  later->release();
}

// F7 on Redis: the pace is measured in Redis (release.lua), so an instance
// that never released anything estimates from the others' releases; no
// history means no estimate; reject_early is a cluster-wide setting. Time
// only gives lower bounds: the test waits 100 ms between releases.
TEST(RedisBackendTest, ClusterWidePaceEstimateAndRejectEarlyEverywhere) {
  const std::string name = test_name();
  auto o = fast_options();
  Instance a(o);
  Instance b(o);
  Limiter la = a.open(name, cap(1));
  Limiter lb = b.open(name, cap(1));
  auto holder = acquire(la);
  ASSERT_TRUE(wait_until([&] { return holder->done(); }));
  std::vector<std::shared_ptr<Probe>> waiters;
  for (int i = 0; i < 5; ++i) waiters.push_back(acquire_queued(la));
  Statuses early_st;
  auto early = acquire_watched(lb, early_st, 20s);
  ASSERT_TRUE(wait_until([&] { return early_st.first().has_value(); }, 5s));
  EXPECT_EQ(early_st.first()->position, 6u);
  EXPECT_EQ(early_st.first()->estimated_wait, std::nullopt) << "no history: no estimate";
  const auto snap_b = lb.snapshot();
  ASSERT_EQ(snap_b.waiters.size(), 1u);
  EXPECT_EQ(early_st.first()->ticket, snap_b.waiters[0].ticket) << "the id GET lists";

  // a releases four times, 100+ ms apart, each seat handed on: three gaps.
  holder->release();
  for (int k = 0; k < 3; ++k) {
    ASSERT_TRUE(wait_until([&] { return waiters[static_cast<std::size_t>(k)]->done(); }));
    std::this_thread::sleep_for(100ms);
    waiters[static_cast<std::size_t>(k)]->release();
  }
  ASSERT_TRUE(wait_until([&] { return waiters[3]->done(); }));
  std::this_thread::sleep_for(100ms);
  waiters[3]->release();
  ASSERT_TRUE(wait_until([&] { return waiters[4]->done(); }));
  const std::string gaps = server().command({"HGET", key(name, "cfg"), "pace_n"});
  ASSERT_FALSE(gaps.empty()) << "release.lua measures the pace in the cfg hash";
  EXPECT_GE(std::stoll(gaps), 3);

  // b never released anything: its newcomer (position 2, behind b's first) is
  // estimated from the pace in Redis.
  Statuses next_st;
  auto next = acquire_watched(lb, next_st, 20s);
  ASSERT_TRUE(wait_until([&] { return next_st.first().has_value(); }, 5s));
  EXPECT_EQ(next_st.first()->position, 2u);
  ASSERT_TRUE(next_st.first()->estimated_wait.has_value());
  EXPECT_GE(*next_st.first()->estimated_wait, 100ms) << "one gap and at least half of the next";

  // reject_early, set on a, applies on b: position 3, >= 200 ms away, may wait 50 ms.
  fairgate::SettingsUpdate on;
  on.reject_early = true;
  ASSERT_TRUE(la.configure(on).value().reject_early);
  ASSERT_TRUE(wait_until([&] { return lb.settings().reject_early; }, 3s)) << "a Redis setting";
  auto refused = acquire(lb, AcquireOptions{.max_wait = 50ms});
  ASSERT_TRUE(wait_until([&] { return refused->done(); }));
  EXPECT_EQ(refused->reason(), RejectReason::would_time_out) << refused->message();
  EXPECT_EQ(zcard(name, "queue"), 2) << "it never queued";

  waiters[4]->release();
  ASSERT_TRUE(wait_until([&] { return early->done(); }));
  EXPECT_EQ(early->outcome(), Outcome::granted);
  early->release();
  ASSERT_TRUE(wait_until([&] { return next->done(); }));
  next->release();
  ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 0; }, 2s));
}

TEST(RedisBackendTest, ShutdownEndsWaitersAndCleansRedis) {
  const std::string name = test_name();
  Instance a(fast_options());
  Limiter lim = a.open(name, cap(1));
  auto holder = acquire(lim);
  ASSERT_TRUE(wait_until([&] { return holder->done(); }));
  auto w1 = acquire_queued(lim);
  auto w2 = acquire_queued(lim);
  a.backend->shutdown();
  ASSERT_TRUE(wait_until([&] { return w1->done() && w2->done(); }));
  EXPECT_EQ(w1->reason(), RejectReason::shutdown);
  EXPECT_EQ(w2->reason(), RejectReason::shutdown);
  ASSERT_TRUE(wait_until([&] { return zcard(name, "queue") == 0; }, 2s));
  auto late = acquire(lim);
  ASSERT_TRUE(wait_until([&] { return late->done(); }));
  EXPECT_EQ(late->reason(), RejectReason::shutdown);
  // The held permit stays valid (and counted) until released.
  std::this_thread::sleep_for(fast_options().liveness_ttl + 300ms);
  EXPECT_EQ(zcard(name, "holders"), 1) << "heartbeats go on while a permit is held";
  holder->release();
  ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 0; }, 2s));
}

// Recovery rule 16 (docs/design.md): an instance whose commands reach Redis but
// whose replies come after its command timeout (a slow or one-way link) must not
// keep itself alive there. Its acquire was granted in Redis and the reply never
// came in time, so that seat was held by nobody; its heartbeats, which also reach
// Redis, kept extending its liveness, and the seat stayed stranded for as long
// as the link was slow (a helper saw a 3-instance cluster grant nothing for 23 s).
// Now its heartbeats stop extending it once it heard nothing for about a TTL: it
// is reaped, and the seat goes to the other instance's waiter, link still slow.
TEST(RedisBackendTest, AnInstanceThatCannotHearRedisIsReapedAndItsSeatGoesOn) {
  const std::string name = test_name();
  fairgate::test::TcpProxy proxy("127.0.0.1", server().port());
  RedisBackendOptions slow_o = fast_options();  // heartbeat 250 ms, TTL 1 s, command timeout 500 ms
  slow_o.instance_id = "slow-link";
  slow_o.url = "redis://127.0.0.1:" + std::to_string(proxy.port());
  Instance a(slow_o);
  RedisBackendOptions fine_o = fast_options();
  fine_o.instance_id = "fine-link";
  Instance b(fine_o);
  Limiter la = a.open(name, cap(1, 60s));
  Limiter lb = b.open(name, cap(1, 60s));
  ASSERT_TRUE(
      wait_until([&] { return ready_past_fence(a, name, la) && ready_past_fence(b, name, lb); }, 10s));

  proxy.set_delay(400ms);  // a round trip of 800 ms or more: every reply after the 500 ms timeout
  auto stranded = acquire(la);
  ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 1; }, 5s)) << "granted in Redis";
  auto next = acquire_queued(lb, 60s);
  EXPECT_TRUE(wait_until([&] { return next->done(); }, 20s))
      << "the seat Redis granted to an instance that cannot hear it stayed held by nobody";
  EXPECT_EQ(next->outcome(), Outcome::granted);
  EXPECT_FALSE(stranded->done() && stranded->outcome() == Outcome::granted)
      << "the slow instance took its seat while the other holds it (cap 1)";

  proxy.set_delay(0ms);
  next->release();
  EXPECT_TRUE(wait_until([&] { return stranded->done(); }, 20s)) << "the slow instance's waiter, link healed";
  EXPECT_EQ(stranded->outcome(), Outcome::granted) << stranded->message();
  stranded->release();
  EXPECT_TRUE(wait_until([&] { return zcard(name, "holders") == 0 && zcard(name, "queue") == 0; }, 10s));
}

// Rule 16's probes extend nothing, so the liveness a probe's reply finds may
// have run out (nobody reaped it yet): a permit it lists must not be handed out
// on its word, or another instance's heartbeat reaps this one a moment later
// and gives the same seat again (a helper's review: cap exceeded until a
// restore). Only the full heartbeat sent on that reply, which extends the
// liveness and lists the permit again, hands it out. The hook sees each
// heartbeat about to go: none may find the waiter granted while its liveness
// in Redis has run out.
TEST(RedisBackendTest, APermitListedByAProbesReplyWaitsForTheHeartbeatThatExtends) {
  const std::string name = test_name();
  fairgate::test::TcpProxy proxy("127.0.0.1", server().port());
  RedisBackendOptions o = fast_options();  // heartbeat 250 ms, TTL 1 s, command timeout 500 ms
  o.instance_id = "probing";
  o.url = "redis://127.0.0.1:" + std::to_string(proxy.port());
  Instance a(o, 2);
  Settings s = cap(1, 60s);
  s.on_redis_down = fairgate::RedisDownPolicy::closed;  // its waiter waits for Redis
  Limiter la = a.open(name, s);
  ASSERT_TRUE(wait_until([&] { return ready_past_fence(a, name, la); }, 10s));
  auto held = acquire(la);
  ASSERT_TRUE(wait_until([&] { return held->done(); }));
  ASSERT_EQ(held->outcome(), Outcome::granted);
  auto waiter = acquire_queued(la, 60s);
  ASSERT_TRUE(wait_until([&] { return zcard(name, "queue") == 1; }));

  const auto redis_now_ms = [&] {
    std::istringstream time(server().command({"TIME"}));
    long long sec = 0, usec = 0;
    time >> sec >> usec;
    return sec * 1000 + usec / 1000;
  };
  const auto liveness_left_ms = [&] {
    const std::string score = server().command({"ZSCORE", key(name, "instances"), "probing"});
    return score.empty() || score[0] == '(' ? -1e18 : std::stod(score) - static_cast<double>(redis_now_ms());
  };
  // Another instance, alive for a minute, that does not heartbeat: Redis was not away (that
  // would extend every liveness), and nobody reaps the probing one while the test looks.
  ASSERT_EQ(
      server().command({"ZADD", key(name, "instances"), std::to_string(redis_now_ms() + 60'000), "quiet"}),
      "1");
  proxy.set_delay(400ms);  // every reply after the 500 ms timeout: it hears nothing, then probes
  held->release();         // reaches Redis, which grants the waiter; the reply comes too late
  ASSERT_TRUE(wait_until([&] { return zcard(name, "queue") == 0 && zcard(name, "holders") == 1; }, 5s));
  ASSERT_TRUE(wait_until([&] { return liveness_left_ms() < 0; }, 10s)) << "its probes extended it";
  EXPECT_FALSE(waiter->done()) << "granted without hearing Redis";

  // Each heartbeat is held a moment before it goes (the full one after a probe's reply too), so
  // that a permit handed out on that reply reaches the waiter (the other io thread) meanwhile.
  std::atomic<int> granted_while_dead = 0;
  a.impl(name)->set_send_hook_for_test([&](std::string_view what) {
    if (what != "heartbeat") return;
    std::this_thread::sleep_for(200ms);
    if (waiter->done() && liveness_left_ms() < 0) ++granted_while_dead;
  });
  proxy.set_delay(0ms);  // it hears the next probe's reply, which lists the waiter's permit
  ASSERT_TRUE(wait_until([&] { return waiter->done(); }, 10s));
  EXPECT_EQ(waiter->outcome(), Outcome::granted) << waiter->message();
  std::this_thread::sleep_for(600ms);  // the next heartbeat
  a.impl(name)->set_send_hook_for_test(nullptr);
  EXPECT_EQ(granted_while_dead.load(), 0) << "the waiter was granted on a probe's reply";
  waiter->release();
  EXPECT_TRUE(wait_until([&] { return zcard(name, "holders") == 0; }, 10s));
  server().command({"ZREM", key(name, "instances"), "quiet"});
}

// Probing starts after no reply for the longer of (TTL − command timeout) and
// (heartbeat interval + command timeout), from when the last reply came back:
// with a command timeout close to the TTL (allowed: it is below it) a healthy
// link used to probe every other heartbeat, and a link slower than the TTL less
// the timeout but within the timeout was reaped and restored again and again
// (a helper's review, 2026-12-07).
TEST(RedisBackendTest, ACommandTimeoutCloseToTheTtlProbesNotOnAHealthyLink) {
  const std::string name = test_name();
  fairgate::test::LogLines logged;
  RedisBackendOptions o = fast_options();  // heartbeat 250 ms, TTL 1 s
  o.command_timeout = 800ms;               // TTL − timeout = 200 ms, below the heartbeat interval
  o.log = logged.sink();
  Instance a(o);
  Limiter la = a.open(name, cap(1));
  ASSERT_TRUE(wait_until([&] { return ready_past_fence(a, name, la); }, 10s));
  const auto beats = a.impl(name)->heartbeats();
  std::this_thread::sleep_for(2s);
  EXPECT_GE(a.impl(name)->heartbeats(), beats + 4) << "it heartbeats";
  EXPECT_TRUE(logged.with("no reply from Redis heard").empty()) << logged.all();
  auto held = acquire(la);
  ASSERT_TRUE(wait_until([&] { return held->done(); }));
  EXPECT_EQ(held->outcome(), Outcome::granted);
  held->release();
}

// Degraded modes (docs/design.md): on the seats Redis counts for each instance,
// a tenant reuses only its own, so max_per_tenant holds across instances that
// each decide alone while Redis is out of reach. A helper saw tenant A hold 4
// permits with a cap of 2: each instance gave 2 A's the seats B and C left.
TEST(RedisBackendTest, WhileRedisIsAwayATenantReusesOnlyItsOwnSeats) {
  const std::string name = test_name();
  fairgate::test::TcpProxy proxy("127.0.0.1", server().port());
  RedisBackendOptions o = fast_options();
  o.url = "redis://127.0.0.1:" + std::to_string(proxy.port());
  o.liveness_ttl = 10s;  // the seats stay theirs for the whole test
  o.recovery_fence = 500ms;
  Instance a(o), b(o);
  Settings s = cap(4, 60s);
  s.max_per_tenant = 2;
  Limiter la = a.open(name, s);
  Limiter lb = b.open(name, s);
  ASSERT_TRUE(
      wait_until([&] { return ready_past_fence(a, name, la) && ready_past_fence(b, name, lb); }, 10s));
  const auto as = [](const std::string& tenant) {
    AcquireOptions x;
    x.tenant = tenant;
    x.max_wait = 60s;
    return x;
  };
  std::vector<std::shared_ptr<Probe>> held{acquire(la, as("B")), acquire(la, as("B")), acquire(lb, as("C")),
                                           acquire(lb, as("C"))};
  ASSERT_TRUE(wait_until(
      [&] { return std::all_of(held.begin(), held.end(), [](const auto& p) { return p->done(); }); }));
  for (const auto& p : held) ASSERT_EQ(p->outcome(), Outcome::granted);
  std::vector<std::shared_ptr<Probe>> tenant_a{acquire(la, as("A")), acquire(la, as("A")),
                                               acquire(lb, as("A")), acquire(lb, as("A"))};
  ASSERT_TRUE(wait_until([&] { return zcard(name, "queue") == 4; })) << "the limiter is full: A waits";

  proxy.stall();
  ASSERT_TRUE(
      wait_until([&] { return la.snapshot().engine.degraded && lb.snapshot().engine.degraded; }, 10s));
  for (const auto& p : held) p->release();
  auto b_again = acquire(la, as("B"));
  ASSERT_TRUE(wait_until([&] { return b_again->done(); }));
  EXPECT_EQ(b_again->outcome(), Outcome::granted) << "B reuses a seat it held here";
  std::this_thread::sleep_for(1s);
  const auto a_granted = std::count_if(tenant_a.begin(), tenant_a.end(), [](const auto& p) {
    return p->done() && p->outcome() == Outcome::granted;
  });
  EXPECT_EQ(a_granted, 0) << "A held no seat on either instance (cap 2 per tenant: 4 were granted)";

  proxy.resume();
  ASSERT_TRUE(
      wait_until([&] { return !la.snapshot().engine.degraded && !lb.snapshot().engine.degraded; }, 10s));
  b_again->release();
  for (int round = 0; round < 2; ++round) {
    // Back on Redis: A gets its 2 (its cap), then 2 more once those leave.
    ASSERT_TRUE(wait_until(
        [&] {
          return std::count_if(tenant_a.begin(), tenant_a.end(), [](const auto& p) {
                   return p->done() && p->outcome() == Outcome::granted;
                 }) >= 2 * (round + 1);
        },
        10s));
    for (const auto& p : tenant_a) {
      if (p->done() && p->outcome() == Outcome::granted) p->release();
    }
  }
  EXPECT_TRUE(wait_until([&] { return zcard(name, "holders") == 0 && zcard(name, "queue") == 0; }, 10s));
}

// A clean shutdown leaves Redis once the last permit is released (leave.lua),
// instead of staying listed until its liveness runs out (60 s here): the other
// instances' status and local shares stop counting it at once.
TEST(RedisBackendTest, AnInstanceShutDownLeavesRedisOnceItsLastPermitIsReleased) {
  const std::string name = test_name();
  RedisBackendOptions o = fast_options();
  o.liveness_ttl = 60s;
  o.recovery_fence = 500ms;  // the new state's fence: not the 60 s TTL's
  o.instance_id = "leaving";
  Instance a(o);
  o.instance_id = "staying";
  Instance b(o);
  Limiter la = a.open(name, cap(1));
  Limiter lb = b.open(name, cap(1));
  ASSERT_TRUE(
      wait_until([&] { return ready_past_fence(a, name, la) && ready_past_fence(b, name, lb); }, 10s));
  const auto listed = [&](const std::string& inst) {
    return server().command({"ZSCORE", key(name, "instances"), inst}) != "(nil)";
  };
  ASSERT_TRUE(wait_until([&] { return listed("leaving") && listed("staying"); }));
  auto held = acquire(la);
  ASSERT_TRUE(wait_until([&] { return held->done(); }));
  ASSERT_EQ(held->outcome(), Outcome::granted);
  auto next = acquire_queued(lb);
  a.backend->shutdown();
  std::this_thread::sleep_for(4 * o.heartbeat_interval);
  EXPECT_TRUE(listed("leaving")) << "still listed while it holds a permit";
  held->release();
  ASSERT_TRUE(wait_until([&] { return next->done(); }));
  EXPECT_EQ(next->outcome(), Outcome::granted);
  EXPECT_TRUE(wait_until([&] { return !listed("leaving"); }, 5s)) << "gone within moments, not 60 s";
  std::this_thread::sleep_for(4 * o.heartbeat_interval);
  EXPECT_FALSE(listed("leaving")) << "and no heartbeat registers it again";
  EXPECT_TRUE(listed("staying"));
  next->release();
  ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 0; }, 2s));
}

// The keys' expiry is refreshed every quarter of it, at least every 10th beat
// (its first beat too): the state lives as long as an instance beats — the
// same epoch after twice the expiry — and goes within the expiry once the last
// instance is gone.
TEST(RedisBackendTest, KeysOutliveTheirExpiryWhileAnInstanceBeatsAndGoAfterIt) {
  using fairgate::redis::RedisLimiter;
  RedisBackendOptions o;
  o.heartbeat_interval = 1000ms;
  EXPECT_EQ(RedisLimiter::expiry_every(o), 900u) << "defaults: every 15 min for keys that expire after 1 h";
  o.key_expiry = 0ms;
  EXPECT_EQ(RedisLimiter::expiry_every(o), 900u) << "never expire: the housekeeping as often";
  o.key_expiry = 20000ms;
  EXPECT_EQ(RedisLimiter::expiry_every(o), 10u) << "never less often than every 10th beat";

  const std::string name = test_name();
  o = fast_options();  // a beat every 250 ms
  o.key_expiry = 12000ms;
  ASSERT_EQ(RedisLimiter::expiry_every(o), 12u);
  auto a = std::make_unique<Instance>(o);
  Limiter lim = a->open(name, cap(1));
  ASSERT_TRUE(wait_until([&] { return server().command({"EXISTS", key(name, "cfg")}) == "1"; }, 5s));
  const std::string epoch = server().command({"HGET", key(name, "cfg"), "epoch"});
  const auto ttl = std::stoll(server().command({"PTTL", key(name, "cfg")}));
  EXPECT_GT(ttl, 0);
  EXPECT_LE(ttl, 12000);
  std::this_thread::sleep_for(6s);  // half the expiry: refreshed at least once
  EXPECT_GT(std::stoll(server().command({"PTTL", key(name, "cfg")})), ttl - 4000)
      << "refreshed within 12 beats (3 s)";
  lim = Limiter();
  a.reset();  // the last instance leaves
  ASSERT_EQ(server().command({"HGET", key(name, "cfg"), "epoch"}), epoch) << "the state was never lost";
  EXPECT_TRUE(wait_until(
      [&] {
        return server().command({"EXISTS", key(name, "cfg")}) == "0";
      },
      14s))
      << "gone within the expiry once nobody beats";
}

// D1 with a Redis that was never reachable. `closed`: rejected `unavailable`
// within about one command timeout (never after max_wait). `local` (default),
// with no seat held: the request is not rejected for Redis' sake, it waits (in
// order) and ends at its max wait.
TEST(RedisBackendTest, UnreachableRedisClosedRejectsAtOnceLocalWaits) {
  auto o = fast_options();
  o.url = "redis://127.0.0.1:1";  // nothing listens there
  o.command_timeout = 100ms;
  Instance a(o);
  Settings closed = cap(1);
  closed.on_redis_down = fairgate::RedisDownPolicy::closed;
  Limiter strict = a.open(test_name() + "-closed", closed);
  Limiter lenient = a.open(test_name() + "-local", cap(1));
  const auto t0 = Clock::now();
  auto probe = acquire(strict);
  AcquireOptions wait_1s;
  wait_1s.max_wait = 1500ms;
  auto waiter = acquire(lenient, wait_1s);
  ASSERT_TRUE(wait_until([&] { return probe->done(); }, 5s));
  EXPECT_EQ(probe->outcome(), Outcome::rejected);
  EXPECT_EQ(probe->reason(), RejectReason::unavailable);
  EXPECT_NE(probe->message().find("unavailable"), std::string::npos) << probe->message();
  EXPECT_LE(Clock::now() - t0, 1s) << "closed answers within about one command timeout";
  ASSERT_TRUE(wait_until([&] { return waiter->done(); }, 5s));
  EXPECT_EQ(waiter->outcome(), Outcome::timed_out) << waiter->message();
  EXPECT_GE(waiter->at() - t0, 1400ms) << "local: it waited for its whole max wait";
  const auto health = a.backend->health();
  EXPECT_TRUE(health.remote);
  EXPECT_FALSE(health.connected) << "nothing listens on port 1";
  EXPECT_GT(health.errors, 0u) << "the failed acquire and heartbeats count as Redis errors";
  EXPECT_GT(health.disconnects, 0u);
  EXPECT_EQ(health.degraded_limiters, 2u) << "both limiters degraded after degrade_after (1 s)";
  EXPECT_TRUE(strict.snapshot().engine.degraded);
}

// Backend::health() of a reachable Redis, and of the memory backend.
TEST(RedisBackendTest, HealthOfAReachableRedis) {
  Instance a(fast_options());
  Limiter lim = a.open(test_name(), cap(1));
  ASSERT_TRUE(wait_until([&] { return a.backend->health().connected; }, 5s));
  auto probe = acquire(lim);
  ASSERT_TRUE(wait_until([&] { return probe->done(); }));
  EXPECT_EQ(probe->outcome(), Outcome::granted);
  const auto health = a.backend->health();
  EXPECT_TRUE(health.remote);
  EXPECT_EQ(health.errors, 0u);
  asio::io_context io;
  const auto memory = fairgate::make_memory_backend(io.get_executor())->health();
  EXPECT_FALSE(memory.remote);
  EXPECT_TRUE(memory.connected);
}

// A Redis with `timeout 1` closes every command connection idle for a second
// (a common setting against leaked clients; Pub/Sub connections are spared).
// With heartbeats 2.5 s apart the instances' connections are closed between
// them, so the release and the arrivals below each find theirs gone. That is
// no fault: each call goes out on a new connection, the waiter is woken by the
// release itself (not by a heartbeat that finds the grant, nor by the orphan
// check), nothing degrades, nobody is rejected.
TEST(RedisBackendTest, ARedisThatClosesIdleConnectionsIsNoFault) {
  RedisServer own({"--timeout", "1"});
  const std::string name = test_name();
  fairgate::test::LogLines logged;
  auto o = options_on(own, logged);
  o.heartbeat_interval = 2500ms;
  o.liveness_ttl = 10s;
  o.recovery_fence = 500ms;  // a new limiter: both register at once
  Instance a(o), b(o);
  Limiter la = a.open(name, cap(1, 30s));
  Limiter lb = b.open(name, cap(1, 30s));
  ASSERT_TRUE(
      wait_until([&] { return ready_past_fence(a, name, la) && ready_past_fence(b, name, lb); }, 20s));
  // The ids Redis gave the instances' command connections (not their subscribers).
  const auto command_connections = [&] {
    std::set<std::string> ids;
    std::istringstream list(own.command({"CLIENT", "LIST"}));
    for (std::string line; std::getline(list, line);)
      if (line.find(" name=fairgate:") != std::string::npos) ids.insert(line.substr(0, line.find(' ')));
    return ids;
  };
  std::set<std::string> seen = command_connections();
  std::size_t closed = 0;  // connections Redis closed (their ids gone for new ones)
  const auto idle = [&] {
    std::this_thread::sleep_for(2200ms);  // past `timeout 1` and Redis' check of it
    const auto now = command_connections();
    for (const auto& id : seen) closed += now.count(id) == 0 ? 1 : 0;
    seen = now;
  };
  for (int round = 0; round < 2; ++round) {
    idle();
    auto held = acquire(la);
    ASSERT_TRUE(wait_until([&] { return held->done(); }, 10s)) << logged.all();
    ASSERT_EQ(held->outcome(), Outcome::granted) << held->message();
    auto waiter = acquire(lb);
    ASSERT_TRUE(wait_until([&] { return !waiter->done() && lb.snapshot().waiters.size() == 1; }, 10s));
    idle();
    held->release();
    ASSERT_TRUE(wait_until([&] { return waiter->done(); }, 10s)) << logged.all();
    EXPECT_EQ(waiter->outcome(), Outcome::granted) << waiter->message();
    waiter->release();
  }
  EXPECT_GE(closed, 4u) << "Redis closed too few idle connections: the test tried nothing";
  EXPECT_EQ(a.impl(name)->orphans_released() + b.impl(name)->orphans_released(), 0u);
  EXPECT_EQ(b.impl(name)->lost_wakes_recovered(), 0u) << "the waiter was found by a heartbeat, not woken";
  EXPECT_EQ(la.snapshot().engine.degraded_entries + lb.snapshot().engine.degraded_entries, 0u)
      << logged.all();
  EXPECT_TRUE(wait_until(
      [&] { return own.command(fairgate::test::count_command(key(name, "holders"))) == "0"; }, 10s));
}

// --- recovery ---------------------------------------------------------------

/// Redis loses this limiter's keys (as FLUSHALL would, without touching
/// other tests' keys when FAIRGATE_TEST_REDIS shares one server).
void lose_state(const std::string& limiter) {
  server().command({"EVAL",
                    "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end return 1",
                    "0", "fairgate:{" + limiter + "}:*"});
}

fairgate::ConfigureResult configure_and_wait(Limiter& lim, const fairgate::SettingsUpdate& update) {
  std::promise<fairgate::ConfigureResult> done;
  lim.async_configure(update, [&](fairgate::ConfigureResult r) { done.set_value(std::move(r)); });
  auto f = done.get_future();
  EXPECT_EQ(f.wait_for(10s), std::future_status::ready);
  return f.get();
}

// async_configure completes once Redis applied the change (cluster-wide), and
// says 'unavailable' (nothing changed) when Redis cannot confirm it.
TEST(RedisBackendTest, AsyncConfigureConfirmsOrSaysUnavailable) {
  const std::string name = test_name();
  Instance a(fast_options());
  Limiter lim = a.open(name, cap(3));
  ASSERT_TRUE(wait_until([&] { return a.impl(name)->ready(); }, 5s));
  fairgate::SettingsUpdate two;
  two.max_concurrent = 2;
  const auto ok = configure_and_wait(lim, two);
  EXPECT_FALSE(ok.error) << ok.message;
  EXPECT_EQ(ok.settings.max_concurrent, 2u);
  EXPECT_EQ(server().command({"HGET", key(name, "cfg"), "max_concurrent"}), "2")
      << "in Redis when it completes";
  fairgate::SettingsUpdate bad;
  bad.max_concurrent = 0;
  const auto invalid = configure_and_wait(lim, bad);
  EXPECT_EQ(invalid.error, make_error_code(fairgate::Errc::invalid_settings));
  EXPECT_NE(invalid.message.find("max_concurrent"), std::string::npos) << invalid.message;

  auto o = fast_options();
  o.url = "redis://127.0.0.1:1";
  o.command_timeout = 100ms;
  Instance down(o);
  Limiter unreachable = down.open(name + "-down", cap(3));
  const auto refused = configure_and_wait(unreachable, two);
  EXPECT_EQ(refused.error, make_error_code(fairgate::Errc::unavailable)) << refused.message;
  EXPECT_NE(refused.message.find("Redis did not confirm"), std::string::npos) << refused.message;
  EXPECT_EQ(unreachable.settings().max_concurrent, 3u) << "not applied here either";
}

// A request that arrives while a restore is due waits unsent, and the
// restore queues it. It heard its position only from the next heartbeat —
// under tenant fairness, where heartbeats leave positions to the acquire's
// reply, never: an SSE client got no `queued` event (docs/api.md: "first when
// the request has to wait"). The restore's answer tells it now.
TEST(RedisBackendTest, AWaiterQueuedByARestoreIsToldItsPosition) {
  const std::string name = test_name();
  Instance a(fast_options());
  Settings s = cap(1, 30s);
  s.tenant_fairness = true;
  Limiter l = a.open(name, s);
  ASSERT_TRUE(wait_until([&] { return ready_past_fence(a, name, l); }, 10s));
  AcquireOptions first;
  first.tenant = "t1";
  auto holder = acquire(l, first);
  ASSERT_TRUE(wait_until([&] { return holder->done(); }));
  ASSERT_EQ(holder->outcome(), Outcome::granted);
  auto impl = a.impl(name);
  impl->stop_heartbeats_for_test();
  std::this_thread::sleep_for(300ms);  // a heartbeat in flight lands first
  lose_state(name);
  Statuses st;
  AcquireOptions o;
  o.tenant = "t2";
  o.max_wait = 30s;
  o.on_queued = [&st](const fairgate::QueueStatus& q) {
    std::lock_guard lock(st.mu);
    st.seen.push_back(q);
  };
  auto waiter = acquire(l, std::move(o));  // 'lost': it waits for the restore, unsent
  std::this_thread::sleep_for(300ms);
  const auto restores = impl->restores();
  impl->resume_heartbeats_for_test();  // re-creates the state; the restore queues it
  ASSERT_TRUE(wait_until([&] { return impl->restores() > restores; }, 5s));
  ASSERT_TRUE(wait_until([&] { return st.first().has_value(); }, 5s)) << "told where it waits";
  EXPECT_EQ(st.first()->position, 1u);
  EXPECT_FALSE(waiter->done()) << "a|1 holds the one seat";
  holder->release();
  ASSERT_TRUE(wait_until([&] { return waiter->done(); }));
  EXPECT_EQ(waiter->outcome(), Outcome::granted);
  waiter->release();
}

// Redis loses the state after a cluster-wide change: the state comes back with
// the settings in force (max_concurrent 1), not with the start-up ones (3).
TEST(RedisBackendTest, AStateLostAfterAChangeComesBackWithTheCurrentSettings) {
  const std::string name = test_name();
  Instance a(fast_options());
  Limiter lim = a.open(name, cap(3));
  ASSERT_TRUE(wait_until([&] { return a.impl(name)->ready(); }, 5s));
  fairgate::SettingsUpdate one;
  one.max_concurrent = 1;
  ASSERT_FALSE(configure_and_wait(lim, one).error);
  lose_state(name);
  ASSERT_TRUE(wait_until(
      [&] {
        return server().command({"HGET", key(name, "cfg"), "epoch"}) != "(nil)";
      },
      5s));
  EXPECT_EQ(server().command({"HGET", key(name, "cfg"), "max_concurrent"}), "1");
  EXPECT_EQ(lim.settings().max_concurrent, 1u);
  // A change right after a loss: never a partial config, the rest comes back too.
  lose_state(name);
  fairgate::SettingsUpdate wait5;
  wait5.max_wait = 5000ms;
  const auto r = configure_and_wait(lim, wait5);
  EXPECT_FALSE(r.error) << r.message;
  EXPECT_EQ(server().command({"HGET", key(name, "cfg"), "max_wait_ms"}), "5000");
  EXPECT_EQ(server().command({"HGET", key(name, "cfg"), "max_concurrent"}), "1");
  EXPECT_EQ(server().command({"HGET", key(name, "cfg"), "enabled"}), "1");
}

// Disabled in reject mode: the waiters of every instance end with 'disabled'
// at once (as on the memory backend), not at their deadlines.
TEST(RedisBackendTest, DisablingInRejectModeEndsTheWaitersOfEveryInstance) {
  const std::string name = test_name();
  Instance a(fast_options());
  Instance b(fast_options());
  Limiter la = a.open(name, cap(1));
  Limiter lb = b.open(name, cap(1));
  auto holder = acquire(la);
  ASSERT_TRUE(wait_until([&] { return holder->done(); }));
  auto wa = acquire_queued(la, 60s);
  auto wb = acquire_queued(lb, 60s);
  fairgate::SettingsUpdate off;
  off.enabled = false;
  off.when_disabled = fairgate::DisabledMode::reject;
  const auto t0 = Clock::now();
  ASSERT_FALSE(configure_and_wait(la, off).error);
  ASSERT_TRUE(wait_until([&] { return wa->done() && wb->done(); }, 5s));
  EXPECT_EQ(wa->reason(), RejectReason::disabled);
  EXPECT_EQ(wb->reason(), RejectReason::disabled) << "the other instance too";
  EXPECT_LT(wb->at() - t0, 1s) << "told at once ('!cfg'), not at its next heartbeat or its deadline";
  EXPECT_EQ(zcard(name, "queue"), 0);
  holder->release();
}

// An acquire whose reply comes after the request gave up: the request is
// cancelled in Redis by its id, so no phantom waiter stays in the queue.
TEST(RedisBackendTest, AnAcquireAnsweredAfterItsTimeoutLeavesNoPhantom) {
  const std::string name = test_name();
  auto o = fast_options();
  o.command_timeout = 150ms;
  Instance a(o);
  Limiter lim = a.open(name, cap(1));
  auto holder = acquire(lim);
  ASSERT_TRUE(wait_until([&] { return holder->done(); }));
  std::thread sleeper([] { server().command({"DEBUG", "SLEEP", "0.4"}, 5s); });
  std::this_thread::sleep_for(50ms);
  AcquireOptions short_wait;
  short_wait.max_wait = 200ms;
  auto gone = acquire(lim, short_wait);  // reaches Redis while it sleeps
  ASSERT_TRUE(wait_until([&] { return gone->done(); }, 5s));
  EXPECT_EQ(gone->outcome(), Outcome::timed_out);
  sleeper.join();
  ASSERT_TRUE(wait_until([&] { return zcard(name, "queue") == 0 && zcard(name, "byinst") == 0; }, 3s))
      << "the waiter it left in Redis was cancelled by id";
  holder->release();
  auto next = acquire(lim);
  ASSERT_TRUE(wait_until([&] { return next->done(); }));
  EXPECT_EQ(next->outcome(), Outcome::granted) << "the permit was not handed to the phantom";
}

// A Redis stall shorter than a waiter's max wait is never a rejection: the
// acquire that timed out is asked again (idempotently) when Redis answers.
TEST(RedisBackendTest, AStallShorterThanTheMaxWaitIsNotARejection) {
  const std::string name = test_name();
  auto o = fast_options();
  o.command_timeout = 100ms;
  Instance a(o);
  Limiter lim = a.open(name, cap(50));
  ASSERT_TRUE(wait_until([&] { return ready_past_fence(a, name, lim); }, 5s));
  std::thread sleeper([] { server().command({"DEBUG", "SLEEP", "0.5"}, 5s); });
  std::this_thread::sleep_for(50ms);
  std::vector<std::shared_ptr<Probe>> probes;
  for (int i = 0; i < 20; ++i) probes.push_back(acquire(lim));
  sleeper.join();
  ASSERT_TRUE(wait_until(
      [&] {
        for (auto& p : probes)
          if (!p->done()) return false;
        return true;
      },
      5s));
  for (auto& p : probes) EXPECT_EQ(p->outcome(), Outcome::granted) << p->message();
  EXPECT_EQ(zcard(name, "holders"), 20) << "each once: a retry never grants twice";
  for (auto& p : probes) p->release();
  ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 0; }, 3s));
}

fairgate::StatusResult status_of(Limiter& lim, std::size_t offset = 0, std::size_t limit = 100) {
  std::promise<fairgate::StatusResult> done;
  lim.async_status(fairgate::StatusQuery{offset, limit},
                   [&](fairgate::StatusResult r) { done.set_value(std::move(r)); });
  auto f = done.get_future();
  EXPECT_EQ(f.wait_for(10s), std::future_status::ready);
  return f.get();
}

// Redis loses the state: the restore puts the status view's ages back from
// what the instance knows (held for, waited for), so they go on across the
// loss instead of starting again from the restore.
TEST(RedisBackendTest, StatusAgesGoOnAcrossALostState) {
  const std::string name = test_name();
  Instance a(fast_options());
  Limiter lim = a.open(name, cap(1));
  ASSERT_TRUE(wait_until([&] { return a.impl(name)->ready(); }, 5s));
  auto holder = acquire(lim);
  ASSERT_TRUE(wait_until([&] { return holder->done(); }, 5s));
  ASSERT_EQ(holder->outcome(), Outcome::granted);
  auto waiter = acquire(lim);
  ASSERT_TRUE(wait_until([&] { return zcard(name, "queue") == 1; }, 5s));
  std::this_thread::sleep_for(1000ms);
  lose_state(name);
  ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 1 && zcard(name, "queue") == 1; }, 5s))
      << "restored";
  const auto st = status_of(lim);
  ASSERT_FALSE(st.error) << st.message;
  ASSERT_EQ(st.snapshot.holders.size(), 1u);
  EXPECT_GE(st.snapshot.holders[0].held, 1000ms) << "held since before the loss";
  EXPECT_LT(st.snapshot.holders[0].held, 20s);
  ASSERT_EQ(st.snapshot.waiters.size(), 1u);
  EXPECT_GE(st.snapshot.waiters[0].waited, 1000ms) << "waiting since before the loss";
  EXPECT_LT(st.snapshot.waiters[0].waited, 20s);
  EXPECT_FALSE(waiter->done());
  holder->release();
  ASSERT_TRUE(wait_until([&] { return waiter->done(); }, 5s));
  EXPECT_EQ(waiter->outcome(), Outcome::granted);
  waiter->release();
  ASSERT_TRUE(wait_until([&] { return zcard(name, "holders") == 0; }, 3s));
}

// Issue 15 (cluster-wide status): either instance lists the holders and the
// queue of both, with instance, tenant and age, the ids each request was
// given, and counts as of the call (not of the last heartbeat); paged with
// the totals.
TEST(RedisBackendTest, StatusListsTheHoldersAndQueueOfEveryInstance) {
  const std::string name = test_name();
  auto oa = fast_options();
  oa.instance_id = "status-a";
  auto ob = fast_options();
  ob.instance_id = "status-b";
  // The counts must not come from a heartbeat: none runs during the test.
  oa.heartbeat_interval = ob.heartbeat_interval = 5s;
  oa.liveness_ttl = ob.liveness_ttl = 20s;
  oa.recovery_fence = ob.recovery_fence = 0ms;  // a new limiter: nothing to wait for
  Instance a(oa), b(ob);
  Limiter la = a.open(name, cap(2)), lb = b.open(name, cap(2));
  ASSERT_TRUE(wait_until([&] { return a.impl(name)->ready() && b.impl(name)->ready(); }, 5s));
  AcquireOptions ha;
  ha.tenant = "hold-a";
  auto pa = acquire(la, ha);
  ASSERT_TRUE(wait_until([&] { return pa->done(); }, 5s));
  AcquireOptions hb;
  hb.tenant = "hold-b";
  auto pb = acquire(lb, hb);
  ASSERT_TRUE(wait_until([&] { return pb->done(); }, 5s));
  ASSERT_EQ(pa->outcome(), Outcome::granted);
  ASSERT_EQ(pb->outcome(), Outcome::granted);
  // Waiters: b's first, then a's; the tickets their on_queued gives them.
  std::mutex mu;
  std::vector<std::string> tickets(2);
  std::vector<std::shared_ptr<Probe>> waiters;
  for (int i = 0; i < 2; ++i) {
    AcquireOptions o;
    o.tenant = i == 0 ? "wait-b" : "wait-a";
    o.max_wait = 20s;
    o.on_queued = [&mu, &tickets, i](const fairgate::QueueStatus& st) {
      std::lock_guard lock(mu);
      tickets[static_cast<std::size_t>(i)] = st.ticket;
    };
    waiters.push_back(acquire(i == 0 ? lb : la, std::move(o)));
    ASSERT_TRUE(wait_until(
        [&] {
          std::lock_guard lock(mu);
          return !tickets[static_cast<std::size_t>(i)].empty();
        },
        5s));
  }
  std::this_thread::sleep_for(100ms);
  for (Limiter* lim : {&la, &lb}) {
    const auto st = status_of(*lim);
    ASSERT_FALSE(st.error) << st.message;
    EXPECT_EQ(st.snapshot.in_use, 2u);
    EXPECT_EQ(st.snapshot.queued, 2u);
    EXPECT_EQ(st.instances, (std::vector<std::string>{"status-a", "status-b"}));
    ASSERT_EQ(st.snapshot.holders.size(), 2u);
    EXPECT_EQ(st.snapshot.holders[0].instance, "status-a") << "oldest grant first";
    EXPECT_EQ(st.snapshot.holders[0].tenant, "hold-a");
    EXPECT_EQ(st.snapshot.holders[1].instance, "status-b");
    EXPECT_EQ(st.snapshot.holders[1].tenant, "hold-b");
    for (const auto& h : st.snapshot.holders) {
      EXPECT_GE(h.held, 90ms) << h.permit;
      EXPECT_LT(h.held, 10s) << h.permit;
      EXPECT_EQ(h.permit.rfind(h.instance + "|", 0), 0u) << h.permit;
    }
    ASSERT_EQ(st.snapshot.waiters.size(), 2u);
    EXPECT_EQ(st.snapshot.waiters[0].ticket, tickets[0]) << "the id the waiter was given";
    EXPECT_EQ(st.snapshot.waiters[0].instance, "status-b");
    EXPECT_EQ(st.snapshot.waiters[0].tenant, "wait-b");
    EXPECT_EQ(st.snapshot.waiters[0].position, 1u);
    EXPECT_EQ(st.snapshot.waiters[1].ticket, tickets[1]);
    EXPECT_EQ(st.snapshot.waiters[1].instance, "status-a");
    EXPECT_EQ(st.snapshot.waiters[1].tenant, "wait-a");
    EXPECT_EQ(st.snapshot.waiters[1].position, 2u);
    for (const auto& w : st.snapshot.waiters) {
      EXPECT_GE(w.waited, 90ms) << w.ticket;
      EXPECT_LT(w.waited, 10s) << w.ticket;
    }
    // A page: the second waiter only, the totals unchanged.
    const auto page = status_of(*lim, 1, 1);
    ASSERT_FALSE(page.error) << page.message;
    EXPECT_EQ(page.snapshot.queued, 2u);
    ASSERT_EQ(page.snapshot.waiters.size(), 1u);
    EXPECT_EQ(page.snapshot.waiters[0].ticket, tickets[1]);
    EXPECT_EQ(page.snapshot.waiters[0].position, 2u);
    ASSERT_EQ(page.snapshot.holders.size(), 1u);
    EXPECT_EQ(page.snapshot.holders[0].instance, "status-b");
  }
  // a's holder leaves: b's waiter gets the permit, listed by a at once with
  // the id it was given (no heartbeat in between: they run every 5 s).
  pa->release();
  ASSERT_TRUE(wait_until([&] { return waiters[0]->done(); }, 5s));
  const auto st = status_of(la);
  ASSERT_FALSE(st.error) << st.message;
  EXPECT_EQ(st.snapshot.in_use, 2u);
  EXPECT_EQ(st.snapshot.queued, 1u);
  ASSERT_EQ(st.snapshot.holders.size(), 2u);
  EXPECT_EQ(st.snapshot.holders[1].permit, tickets[0]) << "the waiter's ticket is its permit id";
  EXPECT_LT(st.snapshot.holders[1].held, st.snapshot.holders[0].held) << "held since its grant";
  for (auto& w : waiters) w->release();
  pb->release();
}

// Without a state (lost, heartbeats stopped so nobody re-creates it) and
// without Redis, the status says so: Errc::unavailable with the reason.
TEST(RedisBackendTest, StatusSaysUnavailableWhenTheStateIsGoneOrRedisUnreachable) {
  const std::string name = test_name();
  Instance a(fast_options());
  Limiter lim = a.open(name, cap(1));
  ASSERT_TRUE(wait_until([&] { return a.impl(name)->ready(); }, 5s));
  a.impl(name)->stop_heartbeats_for_test();
  std::this_thread::sleep_for(300ms);  // a heartbeat in flight lands first
  lose_state(name);
  const auto lost = status_of(lim);
  EXPECT_EQ(lost.error, make_error_code(fairgate::Errc::unavailable));
  EXPECT_NE(lost.message.find("state in Redis is gone"), std::string::npos) << lost.message;

  auto o = fast_options();
  o.url = "redis://127.0.0.1:1";
  o.command_timeout = 100ms;
  Instance down(o);
  Limiter unreachable = down.open(name + "-down", cap(1));
  const auto refused = status_of(unreachable);
  EXPECT_EQ(refused.error, make_error_code(fairgate::Errc::unavailable));
  EXPECT_FALSE(refused.message.empty());
}

}  // namespace
