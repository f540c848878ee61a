// The limiter's Lua scripts, called directly against a real redis-server:
// the Redis half of the guarantees (no overshoot, FIFO, grant on release,
// wake only the waiting instance, reaping of dead instances, hot config) and
// the cost of a grant in Redis-side commands.
#include "redis/connection.hpp"
#include "redis/scripts.hpp"
#include "support/holders_key.hpp"
#include "support/redis_server.hpp"

#include <gtest/gtest.h>
#include <boost/asio/io_context.hpp>

#include <unistd.h>
#include <algorithm>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <regex>
#include <thread>
#include <tuple>

namespace {

namespace asio = boost::asio;
namespace scripts = fairgate::redis::scripts;
using fairgate::redis::Connection;
using fairgate::redis::ConnectionOptions;
using fairgate::redis::Reply;
using fairgate::redis::Script;
using fairgate::test::RedisServer;
using namespace std::chrono_literals;

class RedisScriptsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    thread_ = std::thread([this] { io_.run(); });
    ConnectionOptions o;
    o.endpoint.port = server().port();
    o.command_timeout = 2s;
    conn_ = Connection::create(io_.get_executor(), o);
    conn_->start();
    // A fresh limiter name per test: its own hash tag, its own keys.
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    name_ = std::string("{") + info->name() + "}";
    keys_ = fairgate::redis::limiter_keys("t:" + name_ + ":");
    wake_ = "t:" + name_ + ":wake:";
  }
  void TearDown() override {
    if (sub_) sub_->close();
    conn_->close();
    work_.reset();
    thread_.join();
  }
  static RedisServer& server() { return RedisServer::shared(); }

  Reply call(const Script& s, std::vector<std::string> args) {
    args.insert(args.begin(), wake_);
    std::promise<std::pair<boost::system::error_code, Reply>> done;
    fairgate::redis::call_script(*conn_, s, keys_, args, [&](boost::system::error_code ec, Reply r) {
      done.set_value({ec, std::move(r)});
    });
    auto [ec, reply] = done.get_future().get();
    EXPECT_FALSE(ec) << s.name() << ": " << ec.message();
    EXPECT_FALSE(reply.is_error()) << s.name() << ": " << reply.str;
    // Every reply in these tests has a shape the limiter accepts as sound
    // (redis/scripts.hpp): a script that changes its reply changes its shape.
    const auto shapes = fairgate::redis::shapes::of(s);
    EXPECT_TRUE(std::any_of(shapes.begin(), shapes.end(),
                            [&](std::string_view shape) { return fairgate::redis::has_shape(reply, shape); }))
        << s.name() << " answered " << reply.excerpt(4096);
    return reply;
  }
  /// A heartbeat of `inst` that holds `holders` permits (0: nothing to restore, so it
  /// registers at once); no recovery fence unless `fence_ms`.
  Reply heartbeat(const std::string& inst, int max = 2, int ttl_ms = 3000, std::string max_queue = "",
                  int holders = 0, int fence_ms = 0, std::vector<std::string> extra = {}) {
    std::vector<std::string> args{inst,
                                  std::to_string(ttl_ms),
                                  expiry_,
                                  std::to_string(fence_ms),
                                  std::to_string(holders),
                                  "0",
                                  "",  // no queue version heard (tenant fairness)
                                  "0",
                                  "0",  // no positions asked
                                  "max_concurrent",
                                  std::to_string(max),
                                  "max_queue",
                                  max_queue,
                                  "enabled",
                                  "1",
                                  "when_disabled",
                                  "pass",
                                  "max_wait_ms",
                                  "20000"};
    args.insert(args.end(), extra.begin(), extra.end());
    return call(scripts::kHeartbeat, args);
  }
  /// ARGV[4] of heartbeat(): the keys' expiry in ms (0: leave it; -1: none, housekeeping only).
  std::string expiry_ = "0";
  Reply acquire(const std::string& inst, int n, int max_wait_ms = 10000) {
    return call(scripts::kAcquire, {inst, std::to_string(n), std::to_string(max_wait_ms)});
  }
  std::string cancel(const std::string& id) { return call(scripts::kCancel, {id}).elements.at(0).str; }
  /// restore.lua for `inst` (liveness TTL 60 s, `fence_ms`): `permits` granted by Redis, held
  /// 100 ms; `waiters` as (n, order score; 0: never queued in Redis), 60 s left, weight 1, no tenant;
  /// `next_n` is ARGV[5] ('': keep every unlisted waiter and permit).
  Reply restore_of(const std::string& inst, int fence_ms, const std::vector<int>& permits,
                   const std::vector<std::pair<int, std::int64_t>>& waiters, const std::string& next_n = "") {
    std::vector<std::string> args{inst, "60000", std::to_string(fence_ms), next_n,
                                  std::to_string(permits.size())};
    for (const int n : permits) args.insert(args.end(), {std::to_string(n), "", "r", "100"});
    for (const auto& [n, order] : waiters)
      args.insert(args.end(), {std::to_string(n), order ? std::to_string(order) : "", "60000", "0", "1", ""});
    return call(scripts::kRestore, args);
  }
  std::int64_t zcard(int key) {
    return std::stoll(server().command(fairgate::test::count_command(keys_[key])));
  }
  /// Does request `id` ("inst|n") hold a permit? Its holder member is "id|granted_ms|tenant".
  bool holds(const std::string& id) {
    return server().command({"ZLEXCOUNT", keys_[1], "[" + id + "|", "(" + id + "}"}) == "1";
  }
  /// The permit id "inst|n" of a holder member "inst|n|granted_ms|tenant".
  static std::string permit_of(const std::string& member) {
    return member.substr(0, member.find('|', member.find('|') + 1));
  }
  /// The permit id of the one holder (its member without the grant time and tenant).
  std::string the_holder() {
    const std::string member = server().command(fairgate::test::permits_command(keys_[1]));
    EXPECT_TRUE(std::regex_match(member, std::regex(R"([^|]+\|\d+\|\d+\|.*)")))
        << "one holder, \"inst|n|granted_ms|tenant\": " << member;
    return permit_of(member);
  }

  // Subscribes to the wake channels of `instances`; messages land in wakes_.
  void subscribe(const std::vector<std::string>& instances) {
    ConnectionOptions o;
    o.endpoint.port = server().port();
    o.subscriber = true;
    sub_ = Connection::create(io_.get_executor(), o);
    std::promise<void> ready;
    auto remaining = std::make_shared<std::atomic<int>>(static_cast<int>(instances.size()));
    sub_->set_push_handler([this](Reply r) {
      std::lock_guard lock(mu_);
      wakes_.emplace_back(r.elements.at(1).str.substr(wake_.size()), r.elements.at(2).str);
    });
    sub_->set_connect_handler([&, remaining] {
      for (const auto& inst : instances) {
        sub_->exec({"SSUBSCRIBE", wake_ + inst}, [&, remaining](boost::system::error_code, Reply) {
          if (--*remaining == 0) ready.set_value();
        });
      }
    });
    sub_->start();
    ready.get_future().wait();
  }
  std::vector<std::pair<std::string, std::string>> wakes(std::size_t at_least) {
    for (int i = 0; i < 200; ++i) {
      {
        std::lock_guard lock(mu_);
        if (wakes_.size() >= at_least) return wakes_;
      }
      std::this_thread::sleep_for(5ms);
    }
    std::lock_guard lock(mu_);
    return wakes_;
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  std::thread thread_;
  std::shared_ptr<Connection> conn_, sub_;
  std::string name_, wake_;
  std::vector<std::string> keys_;
  std::mutex mu_;
  std::vector<std::pair<std::string, std::string>> wakes_;  // (instance, permit id)
};

TEST_F(RedisScriptsTest, GrantsUpToTheCapThenQueuesInOrder) {
  heartbeat("a", /*max=*/2);
  EXPECT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  EXPECT_EQ(acquire("a", 2).elements.at(0).str, "granted");
  for (int n = 3; n <= 6; ++n) {
    auto r = acquire("a", n);
    ASSERT_EQ(r.elements.at(0).str, "queued");
    EXPECT_EQ(r.elements.at(2).integer, n - 2) << "position at the back of the queue";
  }
  EXPECT_EQ(zcard(1), 2) << "never more holders than max_concurrent";
  EXPECT_EQ(zcard(2), 4);
}

TEST_F(RedisScriptsTest, ReleaseGrantsTheHeadAndWakesOnlyItsInstance) {
  heartbeat("a", 1);
  heartbeat("b", 1);
  heartbeat("c", 1);
  subscribe({"a", "b", "c"});
  ASSERT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  ASSERT_EQ(acquire("b", 1).elements.at(0).str, "queued");
  ASSERT_EQ(acquire("c", 1).elements.at(0).str, "queued");
  ASSERT_EQ(acquire("b", 2).elements.at(0).str, "queued");
  std::vector<std::string> order;
  std::string holder = "a|1";
  for (int i = 0; i < 3; ++i) {
    auto r = call(scripts::kRelease, {holder});
    EXPECT_EQ(r.elements.at(0).integer, 1);
    EXPECT_EQ(r.elements.at(1).integer, 1) << "a release hands the permit straight to the next waiter";
    auto w = wakes(static_cast<std::size_t>(i + 1));
    ASSERT_EQ(w.size(), static_cast<std::size_t>(i + 1)) << "exactly one wake message per grant";
    EXPECT_EQ(w.back().first + "|", w.back().second.substr(0, w.back().first.size() + 1))
        << "published on the channel of the instance that waits";
    holder = w.back().second;
    order.push_back(holder);
    EXPECT_EQ(zcard(1), 1);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"b|1", "c|1", "b|2"})) << "FIFO across instances";
  EXPECT_EQ(call(scripts::kRelease, {holder}).elements.at(0).integer, 1);
  EXPECT_EQ(call(scripts::kRelease, {holder}).elements.at(0).integer, 0) << "a second release does nothing";
  EXPECT_EQ(zcard(1), 0);
}

TEST_F(RedisScriptsTest, CancelRemovesAWaiterOrReturnsAGrantMadeMeanwhile) {
  heartbeat("a", 1);
  ASSERT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  ASSERT_EQ(acquire("a", 2).elements.at(0).str, "queued");
  ASSERT_EQ(acquire("a", 3).elements.at(0).str, "queued");
  ASSERT_EQ(acquire("a", 10).elements.at(0).str, "queued");
  // By request id: the caller need not have seen the acquire's reply.
  EXPECT_EQ(cancel("a|2"), "removed");
  EXPECT_EQ(zcard(2), 2);
  EXPECT_EQ(zcard(5), 2) << "the per-instance index follows the queue";
  EXPECT_EQ(cancel("a|1|"), "unknown") << "ids are matched whole";
  call(scripts::kRelease, {"a|1"});  // a|3 is granted now
  EXPECT_TRUE(holds("a|3"));
  // ...but its caller had already given up: cancel returns the permit.
  EXPECT_EQ(cancel("a|3"), "released");
  EXPECT_TRUE(holds("a|10")) << "and it went to the next waiter";
  EXPECT_EQ(zcard(1), 1) << "no permit leaks when a grant races a cancel";
  EXPECT_EQ(cancel("a|3"), "unknown");
  EXPECT_EQ(cancel("a|99"), "unknown") << "an acquire that never reached Redis";
}

TEST_F(RedisScriptsTest, ExpiredHeadIsSkipped) {
  heartbeat("a", 1);
  ASSERT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  ASSERT_EQ(acquire("a", 2, /*max_wait_ms=*/50).elements.at(0).str, "queued");
  ASSERT_EQ(acquire("a", 3).elements.at(0).str, "queued");
  std::this_thread::sleep_for(80ms);
  call(scripts::kRelease, {"a|1"});
  EXPECT_FALSE(holds("a|2")) << "a waiter past its deadline is never granted";
  EXPECT_TRUE(holds("a|3"));
  EXPECT_EQ(zcard(2), 0);
}

TEST_F(RedisScriptsTest, HeartbeatReapsADeadInstanceAndDispatches) {
  heartbeat("dead", 2, /*ttl_ms=*/100);
  heartbeat("live", 2, /*ttl_ms=*/5000);
  ASSERT_EQ(acquire("dead", 1).elements.at(0).str, "granted");
  ASSERT_EQ(acquire("dead", 2).elements.at(0).str, "granted");
  ASSERT_EQ(acquire("dead", 3).elements.at(0).str, "queued");
  ASSERT_EQ(acquire("live", 1).elements.at(0).str, "queued");
  ASSERT_EQ(acquire("live", 2).elements.at(0).str, "queued");
  std::this_thread::sleep_for(150ms);  // "dead" stops heartbeating
  auto hb = heartbeat("live", 2, 5000);
  EXPECT_EQ(hb.elements.at(6).integer, 2) << "the dead instance's two permits returned";
  EXPECT_EQ(hb.elements.at(7).integer, 2) << "and went to the live waiters at once, no arrival needed";
  std::vector<std::string> held;
  for (auto& e : hb.elements.at(1).elements) held.push_back(e.str);
  EXPECT_EQ(held, (std::vector<std::string>{"live|1", "live|2"}));
  EXPECT_EQ(zcard(2), 0) << "the dead instance's waiter left the queue";
  EXPECT_EQ(zcard(5), 0) << "and the per-instance index";
  EXPECT_EQ(acquire("dead", 4).elements.at(0).str, "lost") << "a reaped instance must re-register first";
  EXPECT_EQ(heartbeat("dead", 2, 3000, "", /*holders=*/2).elements.at(0).integer, 1)
      << "one that still holds permits is told to restore them";
  EXPECT_EQ(heartbeat("dead", 2, 3000, "", /*holders=*/2).elements.at(0).integer, 1)
      << "level-triggered: it is told again until it has restored";
  EXPECT_EQ(acquire("dead", 5).elements.at(0).str, "lost") << "and nothing is granted to it meanwhile";
  EXPECT_EQ(heartbeat("dead", 2).elements.at(0).integer, 0)
      << "one with nothing to restore registers at once";
}

// An instance that shut down cleanly leaves at once (leave.lua), with what Redis
// still counts for it — here a permit whose release was lost and a waiter whose
// cancel was — instead of being reaped a liveness TTL later: the permit goes to
// the next waiter of another instance at once.
TEST_F(RedisScriptsTest, ALeavingInstanceTakesWhatRedisStillCountsForItAndIsGoneAtOnce) {
  heartbeat("going", 1, /*ttl_ms=*/60000);
  heartbeat("staying", 1, /*ttl_ms=*/60000);
  ASSERT_EQ(acquire("going", 1).elements.at(0).str, "granted");
  ASSERT_EQ(acquire("staying", 1).elements.at(0).str, "queued");
  ASSERT_EQ(acquire("going", 2).elements.at(0).str, "queued");
  const auto left = call(scripts::kLeave, {"going"});
  EXPECT_EQ(left.elements.at(0).integer, 1) << "out of the instances";
  EXPECT_EQ(left.elements.at(1).integer, 1) << "its permit handed on in the same call";
  EXPECT_TRUE(holds("staying|1"));
  EXPECT_FALSE(holds("going|1"));
  EXPECT_EQ(zcard(2), 0) << "its waiter left the queue";
  EXPECT_EQ(zcard(5), 0) << "and the per-instance index";
  EXPECT_EQ(server().command({"ZSCORE", keys_[4], "going"}), "(nil)");
  EXPECT_NE(server().command({"ZSCORE", keys_[4], "staying"}), "(nil)") << "nobody else leaves";
  EXPECT_EQ(acquire("going", 3).elements.at(0).str, "lost") << "gone: it must register again first";
  call(scripts::kRelease, {"staying|1", ""});
  EXPECT_EQ(zcard(1), 0);
  server().command({"DEL", keys_[0]});
  EXPECT_EQ(call(scripts::kLeave, {"staying"}).elements.at(0).integer, 0)
      << "a state that is gone is not touched (every script answers so)";
}

TEST_F(RedisScriptsTest, HotConfigRaisesAtOnceAndLowersWithoutRevoking) {
  heartbeat("a", 1);
  ASSERT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  for (int n = 2; n <= 5; ++n) ASSERT_EQ(acquire("a", n).elements.at(0).str, "queued");
  call(scripts::kConfigure, {"max_concurrent", "3"});
  EXPECT_EQ(zcard(1), 3) << "raising the cap admits waiters immediately";
  call(scripts::kConfigure, {"max_concurrent", "1"});
  EXPECT_EQ(zcard(1), 3) << "lowering never revokes";
  call(scripts::kRelease, {"a|1"});
  EXPECT_EQ(zcard(1), 2) << "no grant while above the new cap";
  call(scripts::kRelease, {"a|2"});
  call(scripts::kRelease, {"a|3"});
  EXPECT_EQ(zcard(1), 1);
  EXPECT_TRUE(holds("a|4")) << "the head is served once below the cap";
}

TEST_F(RedisScriptsTest, BoundedQueueAndDisabledModes) {
  heartbeat("a", 1, 3000, /*max_queue=*/"2");
  ASSERT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  ASSERT_EQ(acquire("a", 2).elements.at(0).str, "queued");
  ASSERT_EQ(acquire("a", 3).elements.at(0).str, "queued");
  auto full = acquire("a", 4);
  EXPECT_EQ(full.elements.at(0).str, "rejected");
  EXPECT_EQ(full.elements.at(1).str, "queue_full");
  EXPECT_EQ(acquire("a", 5, /*max_wait_ms=*/0).elements.at(1).str, "timeout") << "max_wait 0 never queues";
  call(scripts::kConfigure, {"enabled", "0", "when_disabled", "pass"});
  EXPECT_EQ(zcard(1), 3) << "pass-through grants the waiters too";
  call(scripts::kConfigure, {"enabled", "1", "when_disabled", "reject"});
  ASSERT_EQ(acquire("a", 6).elements.at(0).str, "queued");
  ASSERT_EQ(acquire("a", 7).elements.at(0).str, "queued");
  call(scripts::kConfigure, {"enabled", "0"});
  EXPECT_EQ(zcard(2), 0)
      << "disabled in reject mode: the waiters leave (their instances end them, 'disabled')";
  EXPECT_EQ(zcard(5), 0);
  EXPECT_EQ(acquire("a", 8).elements.at(1).str, "disabled");
  call(scripts::kConfigure, {"when_disabled", "pass"});
  EXPECT_EQ(acquire("a", 9).elements.at(0).str, "granted");
}

TEST_F(RedisScriptsTest, RestorePutsBackALostInstancesState) {
  heartbeat("a", 1);
  server().command({"DEL", keys_[0], keys_[1], keys_[2], keys_[4], keys_[5]});  // Redis lost everything
  EXPECT_EQ(acquire("a", 9).elements.at(0).str, "lost");
  EXPECT_EQ(call(scripts::kConfigure, {"max_wait_ms", "5000"}).elements.at(0).str, "lost")
      << "a configure never writes a partial config into a lost state";
  EXPECT_EQ(server().command({"EXISTS", keys_[0]}), "0");
  auto hb = heartbeat("a", 1, 3000, "", /*holders=*/2);
  EXPECT_EQ(hb.elements.at(0).integer, 1) << "lost";
  EXPECT_EQ(hb.elements.at(8).integer, 1) << "the state was created again";
  EXPECT_EQ(server().command({"HGET", keys_[0], "max_concurrent"}), "1") << "with the instance's settings";
  // Permits a|1 (held 4 s), a|2 (granted by Redis), waiters a|3 (with its old order score, waited
  // 7 s) and a|4 (never queued).
  const std::vector<std::string> listed{
      "a", "3000", "0",     "",     "2", "1", "",  "r", "4000",  "2", "",  "r", "0",  //
      "3", "7",    "99999", "7000", "1", "",  "4", "",  "99999", "0", "1", ""};
  auto r = call(scripts::kRestore, listed);
  ASSERT_EQ(r.elements.at(0).str, "ok");
  EXPECT_EQ(r.elements.at(1).integer, 2);
  EXPECT_EQ(r.elements.at(2).integer, 2);
  EXPECT_EQ(zcard(1), 2) << "running work is counted again (above the cap: never revoked)";
  EXPECT_EQ(zcard(2), 2);
  const std::string head = server().command({"ZRANGE", keys_[2], "0", "0", "WITHSCORES"});
  EXPECT_EQ(head.substr(0, 4), "a|3|");
  EXPECT_EQ(head.substr(head.find('\n') + 1), "7") << "a restored waiter keeps its order score";
  // The status ages go on from what the instance says, not from the restore.
  const auto status = call(scripts::kSnapshot, {"0", "100"});
  const std::int64_t now = status.elements.at(1).integer;
  const auto& h = status.elements.at(4).elements;
  ASSERT_EQ(h.size(), 6u);
  EXPECT_EQ(h[0].str, "a|1") << "held longest";
  EXPECT_GE(now - h[2].integer, 4000);
  EXPECT_LT(now - h[2].integer, 9000);
  EXPECT_LT(now - h[5].integer, 3000) << "a|2, held 0 ms";
  const auto& w = status.elements.at(5).elements;
  ASSERT_EQ(w.size(), 8u);
  EXPECT_EQ(w[0].str, "a|3");
  EXPECT_GE(now - w[2].integer, 7000) << "it has waited 7 s";
  EXPECT_LT(now - w[2].integer, 12000);
  EXPECT_LT(now - w[6].integer, 3000) << "a|4, waited 0 ms";
  EXPECT_EQ(acquire("a", 5).elements.at(0).str, "queued") << "registered again";
  auto again = call(scripts::kRestore, listed);
  EXPECT_EQ(again.elements.at(1).integer, 0) << "idempotent";
  EXPECT_EQ(again.elements.at(2).integer, 0);
  EXPECT_EQ(zcard(2), 3);
}

// --- the shapes of the replies (redis/scripts.hpp) ---------------------------

/// Calls `check` after each element inside `node` (at any depth, not nil) is
/// in turn replaced by each value of another type — the values the
/// fault tests' proxy puts there (TcpProxy, Mangling::inner) — then restores it.
void each_wrong_field(Reply& node, int depth, const std::function<void()>& check) {
  using T = Reply::Type;
  const auto text = [](T type, std::string s) {
    Reply r;
    r.type = type;
    r.str = std::move(s);
    return r;
  };
  const auto number = [](std::int64_t v) {
    Reply r;
    r.type = T::integer;
    r.integer = v;
    return r;
  };
  const auto list = [](std::vector<Reply> e) {
    Reply r;
    r.type = T::array;
    r.elements = std::move(e);
    return r;
  };
  if (depth > 0 && node.type != T::nil) {
    std::vector<Reply> instead;
    if (node.type == T::integer) instead = {text(T::string, "mangled"), Reply{}, list({})};
    if (node.type == T::string || node.type == T::status) instead = {Reply{}, list({}), list({number(1)})};
    if (node.type == T::array) instead = {number(7), text(T::string, "mangled")};
    const Reply kept = node;
    for (auto& bad : instead) {
      node = bad;
      check();
    }
    node = kept;
  }
  for (auto& e : node.elements) each_wrong_field(e, depth + 1, check);
}

// A reply with one field of the wrong type has no shape its script may
// answer with, so the limiter reads it as a bad reply: never a word as 0, nil
// as an empty list, a list as "". Tried on real replies of every kind, with
// every list they carry filled.
TEST_F(RedisScriptsTest, AReplyWithAnyFieldOfTheWrongTypeHasNoSoundShape) {
  std::vector<std::pair<const Script*, Reply>> replies;
  const auto keep = [&](const Script& s, Reply r) { replies.emplace_back(&s, std::move(r)); };
  keep(scripts::kHeartbeat, heartbeat("a", 1, 3000, "1"));
  keep(scripts::kAcquire, acquire("a", 1));
  keep(scripts::kAcquire, acquire("a", 2));
  keep(scripts::kAcquire, acquire("a", 3));  // the queue (max 1) is full
  keep(scripts::kHeartbeat, heartbeat("a", 1, 3000, "1"));
  keep(scripts::kSnapshot, call(scripts::kSnapshot, {"0", "100"}));
  keep(scripts::kConfigure, call(scripts::kConfigure, {"max_wait_ms", "5000"}));
  keep(scripts::kRelease, call(scripts::kRelease, {"a|1", ""}));
  keep(scripts::kCancel, call(scripts::kCancel, {"a|2"}));
  // A restore that lists a holder Redis lost and a waiter it still has.
  heartbeat("b", 1, 3000, "9");
  acquire("b", 1);
  acquire("b", 2);
  server().command({"ZREMRANGEBYLEX", keys_[1], "[b|1|", "(b|1}"});
  keep(scripts::kRestore, call(scripts::kRestore, {"b", "3000", "0", "", "1", "1", "", "r", "100", "2", "",
                                                   "99999", "0", "1", ""}));
  for (auto& [script, reply] : replies) {
    const auto shapes = fairgate::redis::shapes::of(*script);
    const auto sound = [&] {
      return std::any_of(shapes.begin(), shapes.end(),
                         [&](std::string_view shape) { return fairgate::redis::has_shape(reply, shape); });
    };
    ASSERT_TRUE(sound()) << script->name() << ": " << reply.excerpt(4096);
    int tried = 0;
    each_wrong_field(reply, 0, [&] {
      ++tried;
      EXPECT_FALSE(sound()) << script->name() << " read as sound: " << reply.excerpt(4096);
    });
    EXPECT_GT(tried, 0) << script->name();
  }
  // The lists were filled: held (heartbeat), holders and waiters (snapshot),
  // granted or orders (restore).
  EXPECT_FALSE(replies[4].second.elements.at(1).elements.empty()) << replies[4].second.excerpt(4096);
  EXPECT_FALSE(replies[5].second.elements.at(4).elements.empty());
  EXPECT_FALSE(replies[5].second.elements.at(5).elements.empty());
  const auto& restored = replies.back().second;
  ASSERT_EQ(restored.elements.at(0).str, "ok") << restored.excerpt(4096);
  EXPECT_FALSE(restored.elements.at(3).elements.empty() && restored.elements.at(4).elements.empty())
      << restored.excerpt(4096);
}

// --- recovery (docs/design.md, "Recovery") --------------------------------

std::int64_t redis_now_ms(RedisServer& server) {
  const std::string t = server.command({"TIME"});
  const auto nl = t.find('\n');
  return std::stoll(t.substr(0, nl)) * 1000 + std::stoll(t.substr(nl + 1)) / 1000;
}

// A state created again is fenced: no grant on top of the count, even with
// room, until the fence ends; meanwhile a permit released makes room for one.
TEST_F(RedisScriptsTest, FencedStateGrantsOnlyInPlaceOfReleasedPermits) {
  auto hb = heartbeat("a", /*max=*/3, 3000, "", /*holders=*/0, /*fence_ms=*/60000);
  EXPECT_EQ(hb.elements.at(8).integer, 1) << "created";
  EXPECT_GT(hb.elements.at(10).integer, 59000) << "fence_left_ms";
  EXPECT_EQ(acquire("a", 1).elements.at(0).str, "queued") << "room, but the count is not trusted yet";
  EXPECT_EQ(acquire("a", 2).elements.at(0).str, "queued");
  EXPECT_EQ(zcard(1), 0);
  // Instance b restores a permit it held before the loss (counted, never revoked).
  call(scripts::kRestore, {"b", "3000", "60000", "", "1", "7", "", "r", "0"});
  EXPECT_EQ(zcard(1), 1);
  EXPECT_EQ(zcard(2), 2) << "restoring gives no room either";
  call(scripts::kRelease, {"b|7", ""});
  EXPECT_TRUE(holds("a|1")) << "a released permit goes to the head";
  EXPECT_EQ(zcard(2), 1) << "exactly one: the fence never grants on top";
  // Fence over: grants on top again (the instances heartbeat when it ends).
  server().command({"HSET", keys_[0], "fence_until", std::to_string(redis_now_ms(server()) - 1)});
  heartbeat("a", 3);
  EXPECT_TRUE(holds("a|2"));
  EXPECT_EQ(heartbeat("a", 3).elements.at(10).integer, 0);
}

// Nobody could reach Redis for longer than the TTL: Redis was away, not the
// instances. Their liveness is extended, nobody is reaped.
TEST_F(RedisScriptsTest, OutageLongerThanTheTtlExtendsLivenessInsteadOfReaping) {
  heartbeat("a", 2, /*ttl_ms=*/200);
  heartbeat("b", 2, /*ttl_ms=*/200);
  ASSERT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  ASSERT_EQ(acquire("b", 1).elements.at(0).str, "granted");
  ASSERT_EQ(acquire("b", 2).elements.at(0).str, "queued");
  std::this_thread::sleep_for(300ms);  // every liveness ran out: no instance reached Redis
  auto hb = heartbeat("a", 2, 200);
  EXPECT_EQ(hb.elements.at(9).integer, 1) << "away";
  EXPECT_EQ(hb.elements.at(6).integer, 0) << "nothing reaped";
  EXPECT_EQ(zcard(1), 2) << "b's permit is still counted";
  EXPECT_EQ(zcard(2), 1) << "and its waiter still waits";
  EXPECT_EQ(heartbeat("b", 2, 200, "", 1).elements.at(0).integer, 0) << "b was not lost";
}

// An instance whose own liveness ran out (paused) is never reaped by its own
// heartbeat: as long as nobody else reaped it, its state is intact.
TEST_F(RedisScriptsTest, AnInstanceNeverReapsItself) {
  heartbeat("a", 2, /*ttl_ms=*/200);
  heartbeat("live", 2, /*ttl_ms=*/60000);
  ASSERT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  std::this_thread::sleep_for(300ms);
  auto hb = heartbeat("a", 2, 200, "", /*holders=*/1);
  EXPECT_EQ(hb.elements.at(0).integer, 0) << "not lost";
  EXPECT_EQ(hb.elements.at(9).integer, 0) << "not an outage: 'live' reached Redis";
  EXPECT_EQ(zcard(1), 1);
}

// Reaping a dead instance costs what it owned, bounded per call; its waiters
// are never granted meanwhile.
TEST_F(RedisScriptsTest, ReapingIsProportionalToWhatTheDeadOwnedAndBoundedPerCall) {
  heartbeat("dead", 1, /*ttl_ms=*/200);
  heartbeat("live", 1, /*ttl_ms=*/60000);
  ASSERT_EQ(acquire("live", 1).elements.at(0).str, "granted");
  ASSERT_EQ(acquire("live", 2).elements.at(0).str, "queued");
  // 2,500 waiters of the dead instance queue behind live|2.
  std::vector<std::string> args{"dead", "200", "0", "", "0"};
  for (int n = 1; n <= 2500; ++n) args.insert(args.end(), {std::to_string(n), "", "600000", "0", "1", ""});
  call(scripts::kRestore, args);
  ASSERT_EQ(zcard(2), 2501);
  std::this_thread::sleep_for(300ms);
  heartbeat("live", 1, 60000);
  EXPECT_EQ(zcard(2), 1501) << "1,000 per call";
  EXPECT_EQ(server().command({"ZSCORE", keys_[4], "dead"}), "-1") << "marked as being reaped";
  call(scripts::kRelease, {"live|1", ""});
  EXPECT_TRUE(holds("live|2"));
  call(scripts::kRelease, {"live|2", ""});
  EXPECT_EQ(zcard(1), 0) << "a waiter of an instance being reaped is never granted";
  heartbeat("live", 1, 60000);
  heartbeat("live", 1, 60000);
  EXPECT_EQ(zcard(2), 0);
  EXPECT_EQ(zcard(5), 0);
  EXPECT_EQ(server().command({"ZSCORE", keys_[4], "dead"}), "(nil)") << "gone once all it had is gone";
}

// After a loss, restored waiters go back to their old places, ahead of
// whoever arrived since, in their old order across instances.
TEST_F(RedisScriptsTest, RestoredWaitersKeepTheirOrderAheadOfLaterArrivals) {
  heartbeat("a", 1);
  heartbeat("b", 1);
  ASSERT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  const auto a2 = acquire("a", 2).elements.at(1).integer;
  const auto b1 = acquire("b", 1).elements.at(1).integer;
  const auto a3 = acquire("a", 3).elements.at(1).integer;
  server().command({"FLUSHALL"});
  heartbeat("late", 1);  // creates the state (no fence here); a newcomer arrives first
  ASSERT_EQ(acquire("late", 1).elements.at(0).str, "granted");
  const auto newcomer = acquire("late", 2);
  ASSERT_EQ(newcomer.elements.at(0).str, "queued");
  EXPECT_GT(newcomer.elements.at(1).integer, a3) << "order scores of a new state are above every old one";
  call(scripts::kRestore, {"b", "3000", "0", "", "0", "1", std::to_string(b1), "60000", "0", "1", ""});
  call(scripts::kRestore, {"a",
                           "3000",
                           "0",
                           "",
                           "1",
                           "1",
                           "",
                           "r",
                           "0",
                           "2",
                           std::to_string(a2),
                           "60000",
                           "0",
                           "1",
                           "",
                           "3",
                           std::to_string(a3),
                           "60000",
                           "0",
                           "1",
                           ""});
  EXPECT_EQ(zcard(1), 2) << "late|1 and the restored a|1 (above the cap of 1: never revoked)";
  call(scripts::kRelease, {"late|1", ""});
  EXPECT_EQ(zcard(1), 1) << "no grant while at the cap";
  std::vector<std::string> order;
  std::string holder = "a|1";
  for (int i = 0; i < 4; ++i) {
    call(scripts::kRelease, {holder, ""});
    holder = the_holder();
    order.push_back(holder);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"a|2", "b|1", "a|3", "late|2"}));
}

TEST_F(RedisScriptsTest, AcquireRetryReportsWhatTheFirstCallDid) {
  heartbeat("a", 1);
  ASSERT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  const auto first = acquire("a", 2);
  ASSERT_EQ(first.elements.at(0).str, "queued");
  const auto retry = call(scripts::kAcquire, {"a", "2", "10000", "", "1", "1"});
  EXPECT_EQ(retry.elements.at(0).str, "queued");
  EXPECT_EQ(retry.elements.at(1).integer, first.elements.at(1).integer) << "the same place, not a second one";
  EXPECT_EQ(zcard(2), 1);
  call(scripts::kRelease, {"a|1", ""});
  EXPECT_EQ(call(scripts::kAcquire, {"a", "2", "10000", "", "1", "1"}).elements.at(0).str, "granted");
  EXPECT_EQ(zcard(1), 1);
  EXPECT_EQ(call(scripts::kAcquire, {"a", "3", "10000", "", "1", "1"}).elements.at(0).str, "queued")
      << "a retry of a call that never arrived is a first call";
}

TEST_F(RedisScriptsTest, MissingConfigFieldsAreFilledOneByOne) {
  heartbeat("a", 3);
  call(scripts::kConfigure, {"max_concurrent", "1"});
  server().command({"HDEL", keys_[0], "max_wait_ms"});  // lost write, old version, hand edit...
  heartbeat("a", /*max=*/3);
  EXPECT_EQ(server().command({"HGET", keys_[0], "max_wait_ms"}), "20000") << "filled from the instance";
  EXPECT_EQ(server().command({"HGET", keys_[0], "max_concurrent"}), "1") << "present fields are kept";
}

// Redis lost permits it had granted to a registered instance (a failover that
// lost the last writes): the restore fences the state, so that the others can
// restore theirs before anything more is granted.
TEST_F(RedisScriptsTest, RestoreOfLostGrantedPermitsFencesTheState) {
  heartbeat("a", 3);
  const auto r = call(scripts::kRestore, {"a", "3000", "5000", "", "1", "9", "", "r", "0"});
  EXPECT_EQ(r.elements.at(9).integer, 1) << "fenced";
  EXPECT_GT(r.elements.at(7).integer, 4000);
  const auto local = call(scripts::kRestore, {"a", "3000", "5000", "", "1", "10", "", "l", "0"});
  EXPECT_EQ(local.elements.at(1).integer, 1);
  EXPECT_EQ(local.elements.at(9).integer, 0) << "a permit granted locally (degraded) is no loss";
}

// A first acquire does not look for a place of its own request (that costs
// commands on every arrival): when it runs after a restore that queued the
// same request, the request waits twice. The instance gives no place to a
// request whose acquire is on its way (RedisBackendTest.ARestoreThatOvertakes…);
// should two places arise all the same, the next restore keeps the older one.
TEST_F(RedisScriptsTest, ARestoreKeepsOnePlacePerRequestTheOlder) {
  heartbeat("a", 1);
  ASSERT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  const Reply restored = restore_of("a", 0, {1}, {{2, 0}});
  ASSERT_EQ(restored.elements.at(4).elements.size(), 2u) << restored.excerpt(4096);
  const auto older = restored.elements.at(4).elements.at(1).integer;
  heartbeat("b", 1);
  ASSERT_EQ(acquire("b", 1).elements.at(0).str, "queued");
  ASSERT_EQ(acquire("a", 2).elements.at(0).str, "queued");
  ASSERT_EQ(zcard(2), 3) << "a|2 twice (the precondition), b|1 between";
  const Reply again = restore_of("a", 0, {1}, {{2, older}}, "3");
  EXPECT_EQ(zcard(2), 2) << "a|2 once";
  EXPECT_EQ(server().command({"ZLEXCOUNT", keys_[5], "[a|2|", "(a|2}"}), "1") << "in the index once";
  ASSERT_EQ(again.elements.at(4).elements.size(), 2u) << again.excerpt(4096);
  EXPECT_EQ(again.elements.at(4).elements.at(1).integer, older) << "the older place stays";
  call(scripts::kRelease, {"a|1", ""});
  EXPECT_EQ(the_holder(), "a|2") << "ahead of b|1, which came after its first place";
  call(scripts::kRelease, {"a|2", ""});
  EXPECT_EQ(the_holder(), "b|1");
  EXPECT_EQ(zcard(2), 0) << "a|2 is not served twice";
}

// After an outage on on_redis_down = local, each instance's restore adds the
// permits it granted locally in the seats of permits it released meanwhile,
// whose releases never reached Redis (orphans). The restore releases those
// orphans itself, in the same step: were they released after it (as before),
// another instance restoring in between would count a seat twice and see
// more permits than run. Seen as a flaky overshoot_restored in
// Faults.RestartWithAofAfterAnOutageLongerThanTheTtl.
TEST_F(RedisScriptsTest, ARestoreReleasesItsOrphansInTheSameStep) {
  heartbeat("a", 3);
  heartbeat("b", 3);
  ASSERT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  ASSERT_EQ(acquire("b", 1).elements.at(0).str, "granted");
  ASSERT_EQ(acquire("a", 2).elements.at(0).str, "granted");
  // Redis away: a|1 and b|1 ended (their releases never sent), a|10 and b|10
  // were granted locally in their seats; a|2 runs on. Every instance's
  // restore lists what it runs, n below 11 (its next request) is its own.
  const auto restore = [&](const std::string& inst, const std::vector<std::pair<int, const char*>>& permits) {
    std::vector<std::string> args{inst, "60000", "0", "11", std::to_string(permits.size())};
    for (const auto& [n, kind] : permits) args.insert(args.end(), {std::to_string(n), "", kind, "100"});
    return call(scripts::kRestore, args);
  };
  const Reply b = restore("b", {{10, "l"}});
  ASSERT_EQ(b.elements.at(10).elements.size(), 1u) << b.excerpt(4096);
  EXPECT_EQ(b.elements.at(10).elements.at(0).str, "b|1") << "its orphan, released by the restore";
  EXPECT_EQ(b.elements.at(6).integer, 3) << "a|1 (a's orphan, a has not restored), a|2, b|10";
  const Reply a = restore("a", {{2, "r"}, {10, "l"}});
  ASSERT_EQ(a.elements.at(10).elements.size(), 1u) << a.excerpt(4096);
  EXPECT_EQ(a.elements.at(10).elements.at(0).str, "a|1");
  EXPECT_EQ(a.elements.at(6).integer, 3) << "a|2, a|10, b|10: what runs, no seat counted twice";
  EXPECT_EQ(zcard(1), 3);
  EXPECT_FALSE(holds("a|1"));
  EXPECT_FALSE(holds("b|1"));
  // Without its next n ('') a restore cannot tell an orphan from a grant it has
  // not heard of yet: a|10, not listed here, is kept.
  const Reply again = call(scripts::kRestore, {"a", "60000", "0", "", "1", "2", "", "r", "100"});
  EXPECT_TRUE(again.elements.at(10).elements.empty()) << "'' keeps every unlisted permit";
  EXPECT_TRUE(holds("a|10"));
}

// While the state is fenced a released permit is room for one hand-off
// (fence_credit). A permit granted locally in the seat of one released
// meanwhile took that room: the restore that releases the orphan and adds the
// local permit gives no credit for that seat.
TEST_F(RedisScriptsTest, AnOrphanWhoseSeatWasReusedLocallyGivesNoHandOff) {
  heartbeat("a", 2);
  heartbeat("b", 2);
  ASSERT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  ASSERT_EQ(acquire("a", 2).elements.at(0).str, "granted");
  ASSERT_EQ(acquire("b", 1).elements.at(0).str, "queued");
  server().command({"HSET", keys_[0], "fence_until", "99999999999999", "fence_credit", "0"});
  // a|1 and a|2 ended while Redis was away; a|3 was granted locally in a|1's seat.
  const Reply r = call(scripts::kRestore, {"a", "60000", "0", "4", "1", "3", "", "l", "100"});
  EXPECT_EQ(r.elements.at(10).elements.size(), 2u) << r.excerpt(4096);
  EXPECT_TRUE(holds("b|1")) << "a|2's seat is free: handed off while fenced";
  EXPECT_EQ(server().command({"HGET", keys_[0], "fence_credit"}), "0")
      << "a|1's seat went to a|3: no second hand-off";
  EXPECT_EQ(zcard(1), 2) << "a|3 and b|1";
}

/// The shared server's replication id (master_replid), as the scripts read it.
std::string replication_id() {
  const std::string info = RedisServer::shared().command({"INFO", "replication"});
  const auto at = info.find("master_replid:") + 14;
  return info.substr(at, info.find_first_of("\r\n", at) - at);
}

// Recovery rule 14 (docs/design.md): a grant about to be made on a Redis whose
// replication id is not the one the state's grants were made on (cfg source:
// a failover or a restart may have lost the last ones) fences the state
// first. The waiter it would have granted stays the head, in the queue, in
// byinst and in its tenant's queue; arrivals queue; once the fence is over
// it is the first served. The switch is simulated by changing cfg source.
TEST_F(RedisScriptsTest, AGrantOnAnotherRedisFencesTheStateFirst) {
  const std::string replid = replication_id();
  ASSERT_EQ(replid.size(), 40u);
  const std::string tq = "t:" + name_ + ":tq:t1";
  for (const bool fair : {false, true}) {
    SCOPED_TRACE(fair ? "tenant fairness" : "one FIFO");
    const std::string tenant = fair ? "t1" : "";
    std::vector<std::string> extra;
    if (fair) extra = {"tenant_fairness", "1"};
    heartbeat("a", 1, 60000, "", 0, /*fence_ms=*/60000, extra);
    EXPECT_EQ(server().command({"HGET", keys_[0], "source"}), replid) << "set where the state is created";
    EXPECT_EQ(server().command({"HGET", keys_[0], "fence_ms"}), "60000");
    server().command({"HSET", keys_[0], "fence_until", "0"});  // the creation's fence is over
    const auto arrive = [&](int n) {
      return call(scripts::kAcquire, {"a", std::to_string(n), "60000", tenant, "1"}).elements.at(0).str;
    };
    ASSERT_EQ(arrive(1), "granted");
    ASSERT_EQ(arrive(2), "queued");
    ASSERT_EQ(arrive(3), "queued");

    server().command({"HSET", keys_[0], "source", "another-redis"});
    const Reply released = call(scripts::kRelease, {"a|1", tenant});
    EXPECT_EQ(released.elements.at(0).integer, 1);
    EXPECT_EQ(released.elements.at(1).integer, 0) << "no grant on another Redis before the fence";
    EXPECT_FALSE(holds("a|2"));
    EXPECT_EQ(server().command({"HGET", keys_[0], "source"}), replid) << "the new id is the state's now";
    EXPECT_GT(std::stoll(server().command({"HGET", keys_[0], "fence_until"})), 0) << "fenced";
    EXPECT_EQ(zcard(2), 2) << "the head went back to the queue";
    EXPECT_EQ(zcard(5), 2) << "and to byinst";
    EXPECT_EQ(server().command({"ZRANGE", keys_[2], "0", "0"}).rfind("a|2|", 0), 0u) << "as the head";
    if (fair) {
      EXPECT_EQ(server().command(fairgate::test::count_command(tq)), "2") << "and to its tenant's queue";
    }
    EXPECT_EQ(arrive(4), "queued") << "fenced: an arrival queues";

    server().command({"HSET", keys_[0], "fence_until", "0"});  // every instance has restored
    heartbeat("a", 1, 60000, "", 0, 60000, extra);
    EXPECT_TRUE(holds("a|2")) << "the head is the first served";
    EXPECT_EQ(zcard(1), 1);
    EXPECT_EQ(zcard(2), 2);
    server().command({"EVAL", "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end",
                      "0", "t:" + name_ + ":*"});
  }
}

// A restore that finds a granted permit missing fences the state (rule 4) on
// the Redis it runs on: that fence covers a switch to this Redis too, so the
// first grant after it is not fenced a second time (rule 14).
TEST_F(RedisScriptsTest, ARestoreThatFencesRecordsTheRedisItFencedOn) {
  const std::string replid = replication_id();
  heartbeat("a", 2, 60000, "", 0, /*fence_ms=*/60000);
  server().command({"HSET", keys_[0], "fence_until", "0"});
  ASSERT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  // Redis switched and lost that grant.
  server().command({"DEL", keys_[1]});
  server().command({"HSET", keys_[0], "source", "another-redis"});
  const Reply restored = call(scripts::kRestore, {"a", "60000", "60000", "", "1", "1", "", "r", "100"});
  EXPECT_EQ(restored.elements.at(9).integer, 1) << "fenced: a granted permit was missing";
  EXPECT_TRUE(holds("a|1"));
  EXPECT_EQ(server().command({"HGET", keys_[0], "source"}), replid);
  server().command({"HSET", keys_[0], "fence_until", "0"});  // that fence is over
  EXPECT_EQ(acquire("a", 2).elements.at(0).str, "granted") << "no second fence";
  EXPECT_EQ(server().command({"HGET", keys_[0], "fence_until"}), "0");
}

// A holders key deleted on its own (evicted under an evicting maxmemory-policy,
// or a DEL) takes running permits with it. Its mark is gone too, so the next
// script that counts fences the state (docs/faults.md, "Eviction") instead of
// granting on top of them; the holders restore, then hand-offs go on.
TEST_F(RedisScriptsTest, AHoldersKeyDeletedFencesTheStateBeforeTheNextGrant) {
  heartbeat("a", 2, 60000, "", 0, /*fence_ms=*/60000);
  server().command({"HSET", keys_[0], "fence_until", "0"});
  ASSERT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  ASSERT_EQ(acquire("b", 1).elements.at(0).str, "lost") << "b is not registered";
  ASSERT_EQ(acquire("a", 2).elements.at(0).str, "granted");
  ASSERT_EQ(server().command({"DEL", keys_[1]}), "1");  // a|1 and a|2 still run
  EXPECT_EQ(acquire("a", 3).elements.at(0).str, "queued") << "no grant on top of the running permits";
  EXPECT_EQ(server().command({"HGET", keys_[0], "holders_lost"}), "1");
  EXPECT_NE(server().command({"ZSCORE", keys_[1], std::string(fairgate::redis::kHoldersMark)}), "")
      << "the key is marked again";
  EXPECT_GT(std::stoll(server().command({"HGET", keys_[0], "fence_until"})), 0) << "fenced";
  EXPECT_EQ(acquire("a", 4).elements.at(0).str, "queued");
  // The holder's heartbeat finds its permits missing and restores them.
  const Reply restored = restore_of("a", 60000, {1, 2}, {{3, 0}, {4, 0}});
  EXPECT_EQ(restored.elements.at(1).integer, 2) << "both permits back";
  EXPECT_EQ(zcard(1), 2);
  EXPECT_EQ(call(scripts::kRelease, {"a|1"}).elements.at(1).integer, 1) << "a hand-off, fenced or not";
  EXPECT_TRUE(holds("a|3")) << "the head";
  EXPECT_EQ(zcard(1), 2) << "never above the cap";
  EXPECT_EQ(server().command({"HGET", keys_[0], "holders_lost"}), "1") << "counted once";
}

// A state written before the mark existed is marked by the first script that
// counts, without a fence: only a marked key that lost its mark was deleted.
TEST_F(RedisScriptsTest, AHoldersKeyOfAnEarlierVersionIsMarkedWithoutAFence) {
  heartbeat("a", 2, 60000);
  ASSERT_EQ(server().command({"HGET", keys_[0], "holders_mark"}), "1") << "a created state is marked";
  server().command({"HDEL", keys_[0], "holders_mark"});
  server().command({"DEL", keys_[1]});  // as an earlier version left it: no permit, no mark
  EXPECT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  EXPECT_EQ(acquire("a", 2).elements.at(0).str, "granted");
  EXPECT_EQ(acquire("a", 3).elements.at(0).str, "queued");
  EXPECT_EQ(server().command({"HGET", keys_[0], "holders_mark"}), "1");
  EXPECT_NE(server().command({"ZSCORE", keys_[1], std::string(fairgate::redis::kHoldersMark)}), "");
  EXPECT_EQ(server().command({"HGET", keys_[0], "fence_until"}), "0") << "not fenced";
  EXPECT_EQ(server().command({"HEXISTS", keys_[0], "holders_lost"}), "0");
  EXPECT_EQ(zcard(1), 2);
}

// A queue key deleted on its own leaves its waiters in the per-instance index:
// the heartbeat counts only those still queued, so their instance restores
// them, and they go back at their place, ahead of later arrivals.
TEST_F(RedisScriptsTest, AQueueKeyDeletedIsFoundByTheHeartbeatAndPutBackInOrder) {
  heartbeat("a", 1, 60000);
  ASSERT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  const auto o2 = acquire("a", 2).elements.at(1).integer;
  const auto o3 = acquire("a", 3).elements.at(1).integer;
  ASSERT_EQ(server().command({"DEL", keys_[2]}), "1");
  const auto o4 = acquire("a", 4).elements.at(1).integer;  // arrives meanwhile
  const Reply beat = heartbeat("a", 1, 60000, "", 1);
  EXPECT_EQ(beat.elements.at(11).integer, 1) << "of its 3 waiters only a|4 is queued";
  restore_of("a", 0, {1}, {{2, o2}, {3, o3}, {4, o4}});
  EXPECT_EQ(zcard(2), 3);
  EXPECT_EQ(zcard(5), 3) << "each indexed once (I5)";
  EXPECT_EQ(heartbeat("a", 1, 60000, "", 1).elements.at(11).integer, 3) << "whole again";
  std::string holder = "a|1";
  for (const char* next : {"a|2", "a|3", "a|4"}) {
    call(scripts::kRelease, {holder});
    EXPECT_TRUE(holds(next)) << next << " after " << holder;
    holder = next;
  }
}

// The arrival counter deleted on its own would restart at 1, ahead of every
// waiter: it goes on above the queue instead (FIFO, I2).
TEST_F(RedisScriptsTest, ADeletedArrivalCounterKeepsNewArrivalsBehindTheQueue) {
  heartbeat("a", 1, 60000);
  ASSERT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  const auto o2 = acquire("a", 2).elements.at(1).integer;
  ASSERT_EQ(server().command({"DEL", keys_[3]}), "1");
  const Reply third = acquire("a", 3);
  ASSERT_EQ(third.elements.at(0).str, "queued");
  EXPECT_GT(third.elements.at(1).integer, o2);
  EXPECT_EQ(third.elements.at(2).integer, 2) << "second in line";
  EXPECT_GT(acquire("a", 4).elements.at(1).integer, third.elements.at(1).integer)
      << "and counting on from there";
  call(scripts::kRelease, {"a|1"});
  EXPECT_TRUE(holds("a|2")) << "the oldest waiter first";
}

// Rule 15 for the tenant keys (docs/design.md): each deleted on its own, as an
// evicting maxmemory-policy or a DEL does. A helper for these tests: an
// arrival of `inst` as request n of `tenant`, its verdict.
class TenantKeysTest : public RedisScriptsTest {
 protected:
  std::string arrive(int n, const std::string& tenant) {
    return call(scripts::kAcquire, {"a", std::to_string(n), "60000", tenant, "1"}).elements.at(0).str;
  }
  void release(int n) { call(scripts::kRelease, {"a|" + std::to_string(n)}); }
  std::string tq(const std::string& t) { return "t:" + name_ + ":tq:" + t; }
  std::string tenants_lost() { return server().command({"HGET", keys_[0], "tenants_lost"}); }
  std::vector<std::string> fair = {"tenant_fairness", "1"};
  /// Tenant fairness, cap 1: a|1 of t1 holds; a|2 of t1, a|3 of t2 and
  /// `more` (n from 4, of those tenants) wait.
  void one_holds_others_wait(const std::vector<std::string>& more = {}) {
    heartbeat("a", 1, 60000, "", 0, 0, fair);
    ASSERT_EQ(arrive(1, "t1"), "granted");
    ASSERT_EQ(arrive(2, "t1"), "queued");
    ASSERT_EQ(arrive(3, "t2"), "queued");
    for (std::size_t i = 0; i < more.size(); ++i)
      ASSERT_EQ(arrive(4 + static_cast<int>(i), more[i]), "queued");
  }
};

// tholders deleted: a tenant at max_per_tenant counted 0, and an arrival of
// it was granted at once past its cap. Its mark gone, the count is made
// again from the holders before it is read.
TEST_F(TenantKeysTest, DeletedTenantCountsAreCountedAgainBeforeTheCapIsRead) {
  heartbeat("a", 3, 60000, "", 0, 0, {"max_per_tenant", "1"});
  ASSERT_EQ(arrive(1, "t1"), "granted");
  ASSERT_EQ(arrive(2, "t1"), "queued") << "t1 is at its cap";
  EXPECT_EQ(server().command({"HGET", keys_[9], std::string(fairgate::redis::kTenantsMark)}), "1")
      << "the count read, the hash marked";
  EXPECT_EQ(tenants_lost(), "(nil)") << "marking a hash of an earlier version is no loss";
  ASSERT_EQ(server().command({"DEL", keys_[9]}), "1");
  EXPECT_EQ(arrive(3, "t1"), "queued") << "still at its cap: t1 holds a|1";
  EXPECT_EQ(zcard(1), 1);
  EXPECT_EQ(server().command({"HGET", keys_[9], "t1"}), "1");
  EXPECT_EQ(tenants_lost(), "1");
  EXPECT_EQ(arrive(4, "t2"), "granted") << "another tenant below its cap";
  release(1);
  EXPECT_TRUE(holds("a|2")) << "t1's oldest waiter next";
  EXPECT_FALSE(holds("a|3"));
}

// tready deleted: the waiting tenants were in no rotation and a released
// seat went to nobody. The heartbeat sees room and a queue that no parked
// tenant accounts for, rebuilds the tenant keys and serves in order.
TEST_F(TenantKeysTest, ADeletedRotationIsFoundByTheHeartbeatAndRebuilt) {
  one_holds_others_wait();
  ASSERT_EQ(server().command({"DEL", keys_[7]}), "1");
  release(1);
  EXPECT_FALSE(holds("a|2")) << "no tenant ready: nothing granted on the release";
  heartbeat("a", 1, 60000, "", 0, 0, fair);
  EXPECT_TRUE(holds("a|2")) << "the oldest waiter, once the rotation is rebuilt";
  EXPECT_EQ(tenants_lost(), "1");
  release(2);
  EXPECT_TRUE(holds("a|3")) << "and the next";
  heartbeat("a", 1, 60000, "", 0, 0, fair);
  EXPECT_EQ(tenants_lost(), "1") << "a whole state is not rebuilt again";
}

// A tenant's queue deleted: the dispatch found it empty while the tenant was
// ready, dropped the tenant and its waiters were never served. Now that
// dispatch rebuilds the tenant keys and goes on, in the same script.
TEST_F(TenantKeysTest, ADeletedTenantQueueIsRebuiltByTheDispatchThatFindsIt) {
  one_holds_others_wait({"t1"});
  ASSERT_EQ(server().command({"DEL", tq("t1")}), "1");
  release(1);
  EXPECT_TRUE(holds("a|2")) << "t1's oldest waiter, by the same release";
  EXPECT_EQ(tenants_lost(), "1");
  release(2);
  EXPECT_TRUE(holds("a|3")) << "then t2's turn";
  release(3);
  EXPECT_TRUE(holds("a|4"));
}

// The queue key deleted, then a waiter cancelled: its member was in byinst
// and its tenant's queue but not in the queue, so the removal stopped at the
// queue and left it in its tenant's queue — and the next release served that
// waiter, gone for good, ahead of the waiter of another tenant (its instance
// then released the permit as an orphan). A member in byinst alone is
// waiting too; a tenant queue's head found waiting nowhere is skipped.
TEST_F(TenantKeysTest, AWaiterThatLeftWhileTheQueueKeyWasGoneIsNotServed) {
  one_holds_others_wait();
  ASSERT_EQ(server().command({"DEL", keys_[2]}), "1");
  EXPECT_EQ(cancel("a|2"), "removed");
  EXPECT_EQ(server().command({"ZCARD", tq("t1")}), "0") << "out of its tenant's queue too";
  release(1);
  EXPECT_FALSE(holds("a|2")) << "it left";
  EXPECT_TRUE(holds("a|3")) << "the one still waiting";
  // A stale member (as the scripts of before left it) is skipped by the dispatch.
  ASSERT_EQ(arrive(4, "t2"), "queued");
  server().command({"ZADD", tq("t1"), "0", "a|9|99999999999999:0|1|t1"});
  server().command({"ZADD", keys_[7], "0", "t1"});
  release(3);
  EXPECT_FALSE(holds("a|9")) << "waiting nowhere: not served";
  EXPECT_TRUE(holds("a|4"));
}

// tparked deleted: a parked tenant that frees a permit rejoins the rotation
// only if it was parked, so its waiters were stranded (and starved while
// other tenants kept the limiter full). The release of a tenant at its cap
// with waiters, not ready and not parked, finds it.
TEST_F(TenantKeysTest, ADeletedParkedSetIsFoundByTheReleaseOfAParkedTenant) {
  heartbeat("a", 2, 60000, "", 0, 0, {"max_per_tenant", "1"});
  ASSERT_EQ(arrive(1, "t1"), "granted");
  ASSERT_EQ(arrive(2, "t1"), "queued");
  ASSERT_EQ(arrive(3, "t2"), "granted");
  ASSERT_EQ(server().command({"DEL", keys_[8]}), "1");
  release(1);
  EXPECT_TRUE(holds("a|2")) << "t1's waiter, by the same release";
  EXPECT_EQ(tenants_lost(), "1");
}

// tready deleted while the limiter is full: the release found no tenant ready
// and the seat stayed free, and an arrival with room and no tenant ready was
// granted at once (I3' says every waiter's tenant is parked then), ahead of
// the stranded waiters. The arrival checks that and rebuilds first.
TEST_F(TenantKeysTest, ADeletedRotationIsFoundByTheNextArrivalWithRoom) {
  one_holds_others_wait();
  ASSERT_EQ(server().command({"DEL", keys_[7]}), "1");
  release(1);
  EXPECT_EQ(arrive(4, "t3"), "queued") << "not ahead of the stranded waiters";
  EXPECT_TRUE(holds("a|2")) << "the oldest waiter got the seat";
  EXPECT_EQ(tenants_lost(), "1");
}

// What one rebuild costs (docs/faults.md, "Eviction"): 9,999 waiters of 100
// tenants, tready deleted, a release frees the seat; the heartbeat rebuilds
// every tenant key in one script and serves the oldest waiter.
TEST_F(TenantKeysTest, ARebuildWithTenThousandWaitersServesTheOldestFirst) {
  heartbeat("a", 1, 60000, "", 0, 0, fair);
  ASSERT_EQ(arrive(1, "t0"), "granted");
  for (int n = 2; n <= 10000; ++n) ASSERT_EQ(arrive(n, "t" + std::to_string(n % 100)), "queued");
  ASSERT_EQ(server().command({"DEL", keys_[7]}), "1");
  release(1);
  EXPECT_FALSE(holds("a|2"));
  const auto t0 = std::chrono::steady_clock::now();
  heartbeat("a", 1, 60000, "", 0, 0, fair);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(holds("a|2")) << "the oldest waiter";
  EXPECT_EQ(tenants_lost(), "1");
  EXPECT_EQ(zcard(7), 100) << "every tenant back in the rotation";
  std::printf("a rebuild of the tenant keys with 9,999 waiters of 100 tenants: the heartbeat took %.1f ms\n",
              ms);
  RecordProperty("tenant_rebuild_ms_9999_waiters", std::to_string(ms));
}

// tcredit deleted mid-turn: the tenant whose turn it was starts a whole turn
// again (its head's weight); nothing is stranded and the others' turns follow.
// (Written only for weights above 1: the fault test's workload never has it.)
TEST_F(TenantKeysTest, ADeletedTurnCreditStartsTheTurnAgain) {
  heartbeat("a", 1, 60000, "", 0, 0, fair);
  ASSERT_EQ(arrive(1, "t0"), "granted");
  for (int n = 2; n <= 7; ++n)
    ASSERT_EQ(call(scripts::kAcquire, {"a", std::to_string(n), "60000", "heavy", "3"}).elements.at(0).str,
              "queued");
  ASSERT_EQ(arrive(8, "light"), "queued");
  release(1);
  ASSERT_TRUE(holds("a|2")) << "heavy's turn: 3 grants";
  ASSERT_EQ(server().command({"HGET", keys_[10], "heavy"}), "2") << "two left in it";
  ASSERT_EQ(server().command({"DEL", keys_[10]}), "1");
  std::vector<int> order;
  for (int held = 2; order.size() < 6;) {
    release(held);
    held = 0;
    for (int n = 3; n <= 8; ++n)
      if (holds("a|" + std::to_string(n))) held = n;
    ASSERT_NE(held, 0) << "someone is served after each release";
    order.push_back(held);
  }
  EXPECT_EQ(order, (std::vector<int>{3, 4, 5, 8, 6, 7})) << "heavy's turn began again (3 more), then light's";
  EXPECT_EQ(tenants_lost(), "(nil)") << "nothing to rebuild";
}

// trot deleted: INCR restarted at 1, so a tenant that arrived after it went
// ahead of every tenant already waiting, and each of its later turns too. Now
// the counter goes on above the rotation.
TEST_F(TenantKeysTest, ADeletedRotationCounterKeepsNewTenantsBehind) {
  heartbeat("a", 1, 60000, "", 0, 0, fair);
  ASSERT_EQ(arrive(1, "t0"), "granted");
  server().command({"SET", keys_[11], "100"});  // turns taken before
  for (int n = 2; n <= 4; ++n) ASSERT_EQ(arrive(n, "t" + std::to_string(n - 1)), "queued");
  ASSERT_EQ(server().command({"DEL", keys_[11]}), "1");
  ASSERT_EQ(arrive(5, "t4"), "queued");
  EXPECT_GT(std::stoll(server().command({"ZSCORE", keys_[7], "t4"})), 103) << "behind t1..t3";
  release(1);
  EXPECT_TRUE(holds("a|2")) << "t1 first, not t4";
}

// Where an ACL denies INFO, the check of rule 14 is off, and nothing else
// changes: the scripts grant as before instead of failing every grant.
TEST_F(RedisScriptsTest, WithoutInfoAllowedAGrantGoesOnUnchecked) {
  const std::string user = "fg-noinfo-" + std::to_string(::getpid());
  ASSERT_EQ(server().command({"ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-info"}), "OK");
  const auto run = [&](std::vector<std::string> args) {
    std::promise<Reply> done;
    conn_->exec(std::move(args), [&](boost::system::error_code, Reply r) { done.set_value(std::move(r)); });
    return done.get_future().get();
  };
  ASSERT_EQ(run({"AUTH", user, "pw"}).str, "OK");
  EXPECT_TRUE(run({"INFO", "replication"}).is_error()) << "INFO is denied to this user";
  heartbeat("a", 1, 60000, "", 0, /*fence_ms=*/60000);
  EXPECT_EQ(server().command({"HGET", keys_[0], "source"}), "") << "no id known";
  server().command({"HSET", keys_[0], "fence_until", "0"});
  EXPECT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  EXPECT_EQ(acquire("a", 2).elements.at(0).str, "queued");
  EXPECT_EQ(call(scripts::kRelease, {"a|1"}).elements.at(1).integer, 1) << "the head granted";
  EXPECT_TRUE(holds("a|2"));
  EXPECT_EQ(server().command({"HGET", keys_[0], "fence_until"}), "0") << "never fenced";
  ASSERT_EQ(run({"AUTH", "default", "any"}).str, "OK");  // back to the default user (nopass)
  server().command({"ACL", "DELUSER", user});
}

/// Commands Redis has run (INFO commandstats): all of them, and the INFO ones
/// (the scripts' INFO replication before a grant, and these calls themselves).
struct CommandCount {
  std::int64_t all = 0, info = 0;
};
CommandCount command_count() {
  const std::string stats = RedisServer::shared().command({"INFO", "commandstats"});
  CommandCount c;
  for (std::size_t at = stats.find("calls="); at != std::string::npos; at = stats.find("calls=", at + 1)) {
    c.all += std::stoll(stats.substr(at + 6));
  }
  if (const auto at = stats.find("cmdstat_info:calls="); at != std::string::npos)
    c.info = std::stoll(stats.substr(at + 19));
  return c;
}

// An instance with waiters checks that the queue still holds them (I5: as many queued as
// indexed) only when the queue changed since its last heartbeat found it whole: an idle queue
// costs the heartbeat nothing more (the W4 figure, docs/bench.md), a deleted one is still found.
TEST_F(RedisScriptsTest, TheQueueIsCheckedAgainstItsIndexOnlyWhenItChanged) {
  heartbeat("a", 1, 60000);
  heartbeat("b", 1, 60000);
  ASSERT_EQ(acquire("a", 1).elements.at(0).str, "granted");
  const auto o2 = acquire("a", 2).elements.at(1).integer;
  const auto o3 = acquire("a", 3).elements.at(1).integer;
  const auto beat = [&](const std::string& queue_seen) {
    const auto before = command_count().all;
    Reply r = heartbeat("a", 1, 60000, "", 1, 0, {"queue_seen", queue_seen});
    return std::make_pair(command_count().all - before - 1, std::move(r));
  };
  const auto [unknown, first] = beat("");
  EXPECT_EQ(first.elements.at(11).integer, 2);
  const std::string seen =
      "h" + std::to_string(first.elements.at(2).integer) + ":" + std::to_string(first.elements.at(3).integer);
  EXPECT_EQ(seen, "h" + std::to_string(o2) + ":2");
  const auto [same, unchanged] = beat(seen);
  EXPECT_EQ(unchanged.elements.at(11).integer, 2);
  EXPECT_EQ(same, unknown - 1) << "the queue as last seen: not counted against its index";
  EXPECT_EQ(beat("h" + std::to_string(o2) + ":3").first, unknown) << "another length: counted";

  // Deleted, then refilled to the same length by later arrivals: the head moved.
  ASSERT_EQ(server().command({"DEL", keys_[2]}), "1");
  ASSERT_EQ(acquire("b", 1).elements.at(0).str, "queued");
  ASSERT_EQ(acquire("b", 2).elements.at(0).str, "queued");
  const auto [cost, found] = beat(seen);
  EXPECT_EQ(found.elements.at(3).integer, 2);
  EXPECT_EQ(found.elements.at(11).integer, 0) << "neither a|2 nor a|3 is queued any more";
  restore_of("a", 0, {1}, {{2, o2}, {3, o3}});
  EXPECT_EQ(beat("").second.elements.at(11).integer, 2) << "whole again";
}

// The cost of a grant inside Redis must not grow with the number of waiters
// (docs/design.md F6): counted from INFO commandstats, not timed.
TEST_F(RedisScriptsTest, CommandsPerGrantStayFlatFrom10To1000Waiters) {
  // tenants > 0: every request carries one of that many tenants (fairness off).
  auto cost = [&](int waiters, const std::string& inst, int tenants = 0) {
    heartbeat(inst, 1, 60000);
    const auto tenant_of = [&](int n) {
      return tenants > 0 ? "t" + std::to_string(n % tenants) : std::string();
    };
    int n = 0;
    const auto arrive = [&] {
      ++n;
      call(scripts::kAcquire, {inst, std::to_string(n), "10000", tenant_of(n), "1"});
    };
    arrive();
    for (int i = 0; i < waiters; ++i) arrive();
    // Each cycle: release the holder (the head is granted), a new waiter arrives.
    constexpr int kCycles = 200;
    int holder = 1;
    const auto before = command_count();
    for (int i = 0; i < kCycles; ++i) {
      // As the C++ client releases: with the permit's tenant, so Redis need
      // not look it up.
      call(scripts::kRelease, {inst + "|" + std::to_string(holder), tenant_of(holder)});
      ++holder;
      arrive();
    }
    const auto after = command_count();
    EXPECT_EQ(zcard(1), 1) << "one permit";
    // INFO commandstats itself is counted once per command_count() call.
    EXPECT_EQ(after.info - before.info - 1, kCycles) << "one INFO replication per grant, no more";
    return static_cast<double>(after.all - before.all - 1) / kCycles;
  };
  const double small = cost(10, "small");
  server().command({"DEL", keys_[1], keys_[2]});
  const double large = cost(1000, "large");
  server().command({"DEL", keys_[1], keys_[2]});
  const double tenants = cost(1000, "tenants", 7);
  RecordProperty("redis_cmds_per_grant_10_waiters", std::to_string(small));
  RecordProperty("redis_cmds_per_grant_1000_waiters", std::to_string(large));
  std::printf(
      "Redis-side commands per grant: %.2f with 10 waiters, %.2f with 1000 waiters, %.2f with 1000 "
      "waiters of 7 tenants (fairness off)\n",
      small, large, tenants);
  // A tenant costs no command of its own (it rides in the queue and holder
  // members; while it was a ptenant field, its HSET and HDEL: 21).
  EXPECT_NEAR(tenants, small, 0.5) << "a tenant without fairness costs nothing more";
  // 19: 20 before the wait estimate, plus the one HSET per release into a
  // full limiter that measures the pace (docs/eta.md); - 1 since dispatch takes
  // the queue head with one ZPOPMIN (was ZRANGE + ZREM); the times of the
  // cluster-wide status (docs/redis-schema.md, "Status") ride in the queue and
  // holder members: no command of their own (they cost 3 while they were
  // ptenant fields: 22); + 1 since a script about to grant first asks which
  // Redis it runs on (INFO replication: docs/design.md, recovery rule 14).
  EXPECT_LE(small, 20.5);
  EXPECT_NEAR(large, small, small * 0.10) << "flat within 10 %";
}

// The same under tenant fairness (F12): per-tenant queues, the rotation and the
// tenant counts cost more per grant, but still nothing that grows with the
// number of waiters or of tenants: 10 waiters of 2 tenants against 1,000
// waiters of 200 tenants.
TEST_F(RedisScriptsTest, CommandsPerGrantUnderTenantFairnessStayFlatInWaitersAndTenants) {
  auto cost = [&](int waiters, int tenants, const std::string& inst) {
    heartbeat(inst, 1, 60000, "", 0, 0, {"tenant_fairness", "1"});
    std::map<int, std::string> tenant_of;
    int n = 0;
    auto arrive = [&] {
      ++n;
      tenant_of[n] = "t" + std::to_string(n % tenants);
      call(scripts::kAcquire, {inst, std::to_string(n), "100000", tenant_of[n], "1"});
    };
    arrive();
    for (int i = 0; i < waiters; ++i) arrive();
    constexpr int kCycles = 200;
    auto first_permit = fairgate::test::permits_command(keys_[1]);
    first_permit.insert(first_permit.end(), {"LIMIT", "0", "1"});
    const auto before = command_count();
    for (int i = 0; i < kCycles; ++i) {
      // Who holds the one permit (one client command per cycle, subtracted below).
      const std::string holder = permit_of(server().command(first_permit));
      const int h = std::stoi(holder.substr(inst.size() + 1));
      call(scripts::kRelease, {holder, tenant_of.at(h)});
      arrive();
    }
    const auto after = command_count();
    EXPECT_EQ(after.info - before.info - 1, kCycles) << "one INFO replication per grant, no more";
    return static_cast<double>(after.all - before.all - 1 - kCycles) / kCycles;
  };
  const double small = cost(10, 2, "small");
  // Start the second measurement from an empty limiter (this test's keys only).
  server().command({"EVAL", "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end",
                    "0", "t:" + name_ + ":*"});
  const double large = cost(1000, 200, "large");
  std::printf(
      "Redis-side commands per grant under tenant fairness: %.2f (10 waiters, 2 tenants), %.2f (1000 "
      "waiters, 200 tenants)\n",
      small, large);
  // 37: 39 before the status ages, plus the HSET of the pace (docs/eta.md),
  // minus one since dispatch takes the tenant queue's head with one ZPOPMIN;
  // the status times ride in the members (the arrival's HSET cost one: 40);
  // so does the holder's tenant (its HSET at the grant and HDEL at the
  // release in ptenant cost two: 39); + 1: the INFO replication before a
  // grant (docs/design.md, recovery rule 14).
  EXPECT_LE(small, 38.5);
  EXPECT_NEAR(large, small, small * 0.10) << "flat within 10 %";
  EXPECT_EQ(server().command(fairgate::test::count_command(keys_[1])), "1")
      << "never more than the one permit";
}

// Positions under tenant fairness: the status and the heartbeat count the place each waiter
// is served at (the round robin over what each tenant has: B's one waiter takes no place in
// rounds 2 and 3); the arrival's own position, which reads no other tenant's queue, is an
// upper bound of it. Then the grants come in exactly that order.
TEST_F(RedisScriptsTest, UnderFairnessTheStatusAndTheHeartbeatCountTheOrderOfService) {
  const std::vector<std::string> fair{"tenant_fairness", "1"};
  heartbeat("a", 1, 60000, "", 0, 0, fair);
  ASSERT_EQ(call(scripts::kAcquire, {"a", "1", "100000", "h", "1"}).elements.at(0).str, "granted");
  const std::vector<std::pair<int, std::string>> arrivals{{10, "A"}, {11, "A"}, {12, "A"}, {20, "B"},
                                                          {30, "C"}, {31, "C"}, {32, "C"}};
  std::map<std::string, std::pair<std::string, std::int64_t>> queued;  // id -> tenant, order score
  auto listed = [&] {
    std::map<std::string, std::int64_t> positions;
    const auto status = call(scripts::kSnapshot, {"0", "100"});
    const auto& w = status.elements.at(5).elements;
    for (std::size_t i = 0; i + 3 < w.size(); i += 4) positions[w[i].str] = w[i + 3].integer;
    return positions;
  };
  for (const auto& [n, tenant] : arrivals) {
    const auto r = call(scripts::kAcquire, {"a", std::to_string(n), "100000", tenant, "1"});
    ASSERT_EQ(r.elements.at(0).str, "queued");
    const std::string id = "a|" + std::to_string(n);
    queued[id] = {tenant, r.elements.at(1).integer};
    const auto counted = listed().at(id);
    EXPECT_GE(r.elements.at(2).integer, counted) << id << ": the arrival's position is an upper bound";
    // C's second waiter: (k-1) x T + r = 6 counts a second waiter of B's that is not there.
    if (id == "a|31") {
      EXPECT_EQ(r.elements.at(2).integer, 6);
      EXPECT_EQ(counted, 5);
    }
  }
  const std::map<std::string, std::int64_t> expected{{"a|10", 1}, {"a|20", 2}, {"a|30", 3}, {"a|11", 4},
                                                     {"a|31", 5}, {"a|12", 6}, {"a|32", 7}};
  EXPECT_EQ(listed(), expected) << "the status";

  // The heartbeat, asked about every waiter (ARGV[8..]: no version heard, every one not counted, as
  // RedisLimiter does).
  std::vector<std::string> args{"a",
                                "60000",
                                "0",
                                "0",
                                "1",
                                std::to_string(queued.size()),
                                "",
                                std::to_string(queued.size()),
                                std::to_string(queued.size())};
  std::vector<std::string> ids;
  for (const auto& [id, tq] : queued) {
    ids.push_back(id);
    args.push_back(tq.first);
    args.push_back(std::to_string(tq.second));
  }
  const auto hb = call(scripts::kHeartbeat, args);
  ASSERT_EQ(hb.elements.size(), 19u);  // ... version, liveness
  const auto& told = hb.elements.at(16).elements;
  ASSERT_EQ(told.size(), ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(told[i].integer, expected.at(ids[i])) << ids[i];
  // The queue's version: the arrival counter and the queue's length.
  const std::string version = hb.elements.at(17).str;
  EXPECT_EQ(version, server().command({"GET", keys_[3]}) + ":7");
  // Asked again at that version, Redis counts only the first s (those not counted at it yet).
  const auto again = [&](const std::string& heard, int not_counted) {
    auto a = args;
    a[6] = heard;
    a[7] = std::to_string(not_counted);
    return call(scripts::kHeartbeat, a).elements.at(16).elements;
  };
  EXPECT_TRUE(again(version, 0).empty()) << "the queue did not move: nothing counted again";
  const auto two = again(version, 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].integer, expected.at(ids[0]));
  EXPECT_EQ(two[1].integer, expected.at(ids[1]));
  EXPECT_EQ(again("", 0).size(), ids.size()) << "another version: every one counted";

  std::vector<std::pair<std::int64_t, std::string>> by_position;
  for (const auto& [id, position] : expected) by_position.emplace_back(position, id);
  std::sort(by_position.begin(), by_position.end());
  auto first_permit = fairgate::test::permits_command(keys_[1]);
  first_permit.insert(first_permit.end(), {"LIMIT", "0", "1"});
  std::string holder = "a|1", tenant = "h";
  for (const auto& [position, id] : by_position) {
    call(scripts::kRelease, {holder, tenant});
    holder = permit_of(server().command(first_permit));
    EXPECT_EQ(holder, id) << "granted at position " << position;
    tenant = queued.count(holder) ? queued.at(holder).first : "";
  }
}

// Beyond COUNTED_TENANTS (lib.lua: 128) tenants waiting, the status and the heartbeat do not
// read every tenant's queue: a place is bounded from above (bounded_places), never below the
// order of service. It is exact for each tenant's first waiter (its tenant's turn) and for a
// heavy tenant whose waiters come after every other tenant's (H's 4th on: the medium tenants
// have 3 each). 161 tenants: H with 30 waiters, 10 with 3, 150 with 1.
TEST_F(RedisScriptsTest, BeyondTheCountedTenantsThePlacesAreUpperBoundsOfTheOrderOfService) {
  heartbeat("a", 1, 600000, "", 0, 0, {"tenant_fairness", "1"});
  ASSERT_EQ(call(scripts::kAcquire, {"a", "1", "1000000", "h", "1"}).elements.at(0).str, "granted");
  std::map<std::string, std::pair<std::string, int>> waiter;  // id -> tenant, k (its rank in its tenant)
  std::map<std::string, int> length;
  std::vector<std::pair<std::string, std::int64_t>> asked;  // (tenant, order score), for the heartbeat
  std::vector<std::string> ids;
  int n = 100;
  const auto arrive = [&](const std::string& tenant) {
    const std::string id = "a|" + std::to_string(++n);
    const auto r = call(scripts::kAcquire, {"a", std::to_string(n), "1000000", tenant, "1"});
    ASSERT_EQ(r.elements.at(0).str, "queued");
    waiter[id] = {tenant, ++length[tenant]};
    asked.emplace_back(tenant, r.elements.at(1).integer);
    ids.push_back(id);
  };
  for (int i = 0; i < 30; ++i) arrive("H");
  for (int m = 0; m < 10; ++m)
    for (int i = 0; i < 3; ++i) arrive("M" + std::to_string(m));
  for (int l = 0; l < 150; ++l) arrive("L" + std::to_string(l));
  std::map<std::string, std::int64_t> listed;
  const auto status = call(scripts::kSnapshot, {"0", "300"});
  const auto& w = status.elements.at(5).elements;
  for (std::size_t i = 0; i + 3 < w.size(); i += 4) listed[w[i].str] = w[i + 3].integer;
  ASSERT_EQ(listed.size(), waiter.size());
  // The heartbeat bounds the same places (the first 100 arrivals asked, no version heard).
  std::vector<std::string> args{"a", "600000", "0", "0", "1", std::to_string(ids.size()), "", "100", "100"};
  for (std::size_t i = 0; i < 100; ++i)
    args.insert(args.end(), {asked[i].first, std::to_string(asked[i].second)});
  const auto told = call(scripts::kHeartbeat, args).elements.at(16).elements;
  ASSERT_EQ(told.size(), 100u);
  for (std::size_t i = 0; i < 100; ++i) EXPECT_EQ(told[i].integer, listed.at(ids[i])) << ids[i];

  // The order of service: release the one seat, see who holds it, for every waiter.
  auto first_permit = fairgate::test::permits_command(keys_[1]);
  first_permit.insert(first_permit.end(), {"LIMIT", "0", "1"});
  std::string holder = "a|1", tenant = "h";
  int exact = 0;
  for (std::size_t served = 1; served <= waiter.size(); ++served) {
    call(scripts::kRelease, {holder, tenant});
    holder = permit_of(server().command(first_permit));
    ASSERT_TRUE(waiter.count(holder)) << holder;
    const auto& [t, k] = waiter.at(holder);
    const auto place = listed.at(holder);
    EXPECT_GE(place, static_cast<std::int64_t>(served)) << holder << " of " << t << ": an upper bound";
    if (k == 1 || (t == "H" && k >= 4)) {
      EXPECT_EQ(place, static_cast<std::int64_t>(served)) << holder << " of " << t << ", k = " << k;
    }
    exact += place == static_cast<std::int64_t>(served);
    tenant = t;
  }
  std::printf("beyond the counted tenants: %d of %zu places exact\n", exact, waiter.size());
}

// reject_early under fairness decides on the round robin's count, as the memory backend
// does: the arrival's upper bound min((k-1)*T + r, queued) only tells when to count. B's
// third waiter is 10th (B has 2 waiting, A 20, four tenants 1 each): its 1,000 ms wait is long
// enough at 100 ms a place, though the bound says 18th. A 21st waiter of A's is rejected.
TEST_F(RedisScriptsTest, RejectEarlyUnderFairnessCountsThePlaceNotTheBound) {
  heartbeat("a", 1, 60000, "", 0, 0, {"tenant_fairness", "1", "reject_early", "1"});
  // A pace of 100 ms a place, measured just now (8 gaps): an estimate of 100 ms x position.
  server().command({"EVAL",
                    "local t = redis.call('TIME') redis.call('HSET', KEYS[1], 'pace_gap', '100', 'pace_n', "
                    "'8', 'pace_last', '0', 'pace_at', t[1] * 1000 + math.floor(t[2] / 1000))",
                    "1", keys_[0]});
  ASSERT_EQ(call(scripts::kAcquire, {"a", "1", "100000", "h", "1"}).elements.at(0).str, "granted");
  int n = 1;
  auto arrive = [&](const std::string& tenant, const std::string& max_wait_ms) {
    return call(scripts::kAcquire, {"a", std::to_string(++n), max_wait_ms, tenant, "1"});
  };
  for (int i = 0; i < 20; ++i) ASSERT_EQ(arrive("A", "100000").elements.at(0).str, "queued");
  for (const std::string t : {"T1", "T2", "T3", "T4", "B", "B"})
    ASSERT_EQ(arrive(t, "100000").elements.at(0).str, "queued");
  const auto b3 = arrive("B", "1000");
  ASSERT_EQ(b3.elements.at(0).str, "queued") << "10th: 1,000 ms (the bound, 18th, said 1,800)";
  EXPECT_EQ(b3.elements.at(2).integer, 18) << "the acquire still answers the bound";
  const auto a21 = arrive("A", "1000");
  ASSERT_EQ(a21.elements.size(), 2u);
  EXPECT_EQ(a21.elements.at(1).str, "would_time_out") << "29th: 2,900 ms";
  // Beyond COUNTED_TENANTS (lib.lua) tenants waiting the place is bounded, not counted; the
  // arrival is still judged (rotation() alone answered nil there: a script error).
  for (int i = 0; i < 130; ++i)
    ASSERT_EQ(arrive("L" + std::to_string(i), "100000").elements.at(0).str, "queued");
  const auto a22 = arrive("A", "1000");
  ASSERT_EQ(a22.elements.size(), 2u);
  EXPECT_EQ(a22.elements.at(1).str, "would_time_out") << "behind 150 others";
}

// The status script (GET /v1/limiters/{name}): the holders and waiters of
// every instance with their tenants and times, one page at a time; a grant
// replaces a waiter's arrival by its grant time; every tenant written is
// forgotten with its request (grant, release, cancel, expiry): nothing is left
// at the end; 'lost' without a state.
TEST_F(RedisScriptsTest, StatusListsEveryInstanceWithTenantsTimesAndPages) {
  heartbeat("a", 2);
  heartbeat("b", 2);
  ASSERT_EQ(call(scripts::kAcquire, {"a", "1", "10000", "ta", "1"}).elements.at(0).str, "granted");
  ASSERT_EQ(acquire("b", 1).elements.at(0).str, "granted");
  const std::vector<std::tuple<std::string, int, std::string>> waiters{
      {"a", 2, "qa"}, {"b", 2, ""}, {"a", 3, "qa"}, {"b", 3, "qb"}, {"a", 4, ""}};
  for (const auto& [inst, n, tenant] : waiters) {
    ASSERT_EQ(call(scripts::kAcquire, {inst, std::to_string(n), "10000", tenant, "1"}).elements.at(0).str,
              "queued");
  }
  std::this_thread::sleep_for(60ms);
  auto r = call(scripts::kSnapshot, {"0", "100"});
  ASSERT_EQ(r.elements.at(0).str, "ok");
  const std::int64_t now = r.elements.at(1).integer;
  EXPECT_EQ(r.elements.at(2).integer, 2) << "in use";
  EXPECT_EQ(r.elements.at(3).integer, 5) << "queued";
  const auto& h = r.elements.at(4).elements;
  ASSERT_EQ(h.size(), 6u);
  EXPECT_EQ(h[0].str, "a|1");  // oldest grant first
  EXPECT_EQ(h[1].str, "ta");
  EXPECT_GE(now - h[2].integer, 50) << "granted at least 60 ms ago";
  EXPECT_LT(now - h[2].integer, 5000);
  EXPECT_EQ(h[3].str, "b|1");
  EXPECT_EQ(h[4].str, "");
  EXPECT_GE(now - h[5].integer, 50);
  const auto& w = r.elements.at(5).elements;
  ASSERT_EQ(w.size(), 20u);
  for (std::size_t i = 0; i < waiters.size(); ++i) {
    const auto& [inst, n, tenant] = waiters[i];
    const std::string id = inst + "|" + std::to_string(n);
    EXPECT_EQ(w[4 * i].str, id) << " in queue order";
    EXPECT_EQ(w[4 * i + 1].str, tenant) << id;
    EXPECT_GE(now - w[4 * i + 2].integer, 50) << id << " arrived at least 60 ms ago";
    EXPECT_LT(now - w[4 * i + 2].integer, 5000) << id;
    EXPECT_EQ(w[4 * i + 3].integer, static_cast<long long>(i + 1)) << id << " position";
  }
  std::vector<std::string> instances;
  for (const auto& e : r.elements.at(6).elements) instances.push_back(e.str);
  std::sort(instances.begin(), instances.end());
  EXPECT_EQ(instances, (std::vector<std::string>{"a", "b"}));

  // A page: waiters 3 and 4, no holder (offset past them), the totals unchanged.
  r = call(scripts::kSnapshot, {"2", "2"});
  EXPECT_EQ(r.elements.at(2).integer, 2);
  EXPECT_EQ(r.elements.at(3).integer, 5);
  EXPECT_TRUE(r.elements.at(4).elements.empty());
  ASSERT_EQ(r.elements.at(5).elements.size(), 8u);
  EXPECT_EQ(r.elements.at(5).elements[0].str, "a|3");
  EXPECT_EQ(r.elements.at(5).elements[3].integer, 3);
  EXPECT_EQ(r.elements.at(5).elements[4].str, "b|3");
  EXPECT_EQ(r.elements.at(5).elements[7].integer, 4);
  r = call(scripts::kSnapshot, {"0", "0"});
  EXPECT_EQ(r.elements.at(3).integer, 5) << "limit 0: the counts only";
  EXPECT_TRUE(r.elements.at(5).elements.empty());

  // A release grants the head (a|2): its time is now its grant, not its arrival.
  call(scripts::kRelease, {"a|1", "ta"});
  r = call(scripts::kSnapshot, {"0", "100"});
  const std::int64_t later = r.elements.at(1).integer;
  ASSERT_EQ(r.elements.at(4).elements.size(), 6u);
  EXPECT_EQ(r.elements.at(4).elements[3].str, "a|2");
  EXPECT_EQ(r.elements.at(4).elements[4].str, "qa");
  EXPECT_LT(later - r.elements.at(4).elements[5].integer, 50) << "granted just now";

  // Everything leaves: cancels, an expired head dropped by dispatch, releases.
  ASSERT_EQ(call(scripts::kAcquire, {"b", "4", "1", "", "1"}).elements.at(0).str, "queued");
  for (const char* id : {"b|2", "a|3", "b|3", "a|4"}) EXPECT_EQ(cancel(id), "removed") << id;
  std::this_thread::sleep_for(10ms);
  call(scripts::kRelease, {"b|1", ""});  // b|4 expired: dropped, not granted
  call(scripts::kRelease, {"a|2", "qa"});
  EXPECT_EQ(zcard(1), 0);
  EXPECT_EQ(zcard(2), 0);
  EXPECT_EQ(server().command({"HLEN", keys_[6]}), "0") << "every tenant and time forgotten";

  server().command({"DEL", keys_[0]});
  EXPECT_EQ(call(scripts::kSnapshot, {"0", "100"}).elements.at(0).str, "lost");
}

// Members written before the status times moved into them (a waiter
// "inst|n|deadline_ms", a holder "inst|n") are still served, released and
// listed: a Redis that keeps its data across an upgrade strands nobody.
TEST_F(RedisScriptsTest, MembersOfTheEarlierFormatAreStillServedReleasedAndListed) {
  heartbeat("a", 1, 60000);
  const std::int64_t deadline = redis_now_ms(server()) + 60000;
  server().command({"ZADD", keys_[1], "0", "a|1"});  // a holder of the earlier format
  const std::string waiter = "a|2|" + std::to_string(deadline);
  const std::string tenant_waiter = "a|3|" + std::to_string(deadline) + "|1|old";
  for (const auto& [order, member] : {std::pair{"1", waiter}, std::pair{"2", tenant_waiter}}) {
    server().command({"ZADD", keys_[2], order, member});
    server().command({"ZADD", keys_[5], "0", member});
  }
  auto r = call(scripts::kSnapshot, {"0", "100"});
  ASSERT_EQ(r.elements.at(4).elements.size(), 3u);
  EXPECT_EQ(r.elements.at(4).elements[0].str, "a|1");
  EXPECT_EQ(r.elements.at(4).elements[2].integer, -1) << "its grant time is unknown";
  const auto& w = r.elements.at(5).elements;
  ASSERT_EQ(w.size(), 8u);
  EXPECT_EQ(w[0].str, "a|2");
  EXPECT_EQ(w[2].integer, -1) << "its arrival is unknown";
  EXPECT_EQ(w[4].str, "a|3");
  EXPECT_EQ(w[5].str, "old");
  EXPECT_EQ(call(scripts::kAcquire, {"a", "1", "10000", "", "1", "1"}).elements.at(0).str, "granted")
      << "a retry sees the earlier holder";
  EXPECT_EQ(call(scripts::kRelease, {"a|1", ""}).elements.at(0).integer, 1)
      << "the earlier holder is released";
  EXPECT_TRUE(holds("a|2")) << "and its permit goes to the head, read in the earlier format";
  EXPECT_EQ(zcard(1), 1);
  EXPECT_EQ(cancel("a|3"), "removed");
  EXPECT_EQ(zcard(2), 0);
  EXPECT_EQ(zcard(5), 0);
}

// Holders of the earlier formats ("inst|n", "inst|n|granted_ms") keep their
// tenant in ptenant: the status lists it, switching fairness on counts it, a
// release without the tenant finds it; the heartbeat's housekeeping drops the
// entries of permits no longer held in an earlier form, and the key with the
// last of them.
TEST_F(RedisScriptsTest, TenantsOfEarlierHolderMembersAreReadFromPtenantAndSweptWhenTheyGo) {
  heartbeat("a", 3, 60000);
  const std::string ptenant = keys_[6];
  const std::int64_t now = redis_now_ms(server());
  server().command({"ZADD", keys_[1], "0", "a|1"});
  server().command({"ZADD", keys_[1], "0", "a|2|" + std::to_string(now - 1000)});
  server().command({"HSET", ptenant, "a|1", "old1", "a|2", "old2", "a|9", "gone"});
  ASSERT_EQ(call(scripts::kAcquire, {"a", "3", "10000", "new", "1"}).elements.at(0).str, "granted");
  server().command({"HSET", ptenant, "a|3", "stale"});  // an entry left for an id held again today

  auto tenants = [&] {
    std::map<std::string, std::string> out;
    const auto r = call(scripts::kSnapshot, {"0", "100"});
    const auto& h = r.elements.at(4).elements;
    for (std::size_t i = 0; i + 2 < h.size(); i += 3) out[h[i].str] = h[i + 1].str;
    return out;
  };
  EXPECT_EQ(tenants(),
            (std::map<std::string, std::string>{{"a|1", "old1"}, {"a|2", "old2"}, {"a|3", "new"}}));

  call(scripts::kConfigure, {"tenant_fairness", "1"});
  for (const char* t : {"old1", "old2", "new"}) {
    EXPECT_EQ(server().command({"HGET", keys_[9], t}), "1") << t << " counted from the holders";
  }
  EXPECT_EQ(call(scripts::kRelease, {"a|2"}).elements.at(0).integer, 1);
  EXPECT_EQ(server().command({"HGET", keys_[9], "old2"}), "(nil)") << "its tenant found in ptenant";
  EXPECT_EQ(server().command({"HGET", keys_[9], "new"}), "1");

  expiry_ = "600000";
  heartbeat("a", 3, 60000);
  EXPECT_EQ(server().command({"HKEYS", ptenant}), "a|1") << "only the permit still held in an earlier form";
  EXPECT_EQ(call(scripts::kRelease, {"a|1", "old1"}).elements.at(0).integer, 1);
  expiry_ = "-1";
  heartbeat("a", 3, 60000);
  EXPECT_EQ(server().command({"EXISTS", ptenant}), "0");
  EXPECT_EQ(tenants(), (std::map<std::string, std::string>{{"a|3", "new"}}));
  EXPECT_EQ(call(scripts::kRelease, {"a|3"}).elements.at(0).integer, 1);
  EXPECT_EQ(server().command(fairgate::test::tenant_count_command(keys_[9])), "0")
      << "every tenant count back to none";
}

// What one status call costs with 10, 1,000 and 10,000 waiters (a page of
// 100): Redis-side commands (flat) and the time of the call.
TEST_F(RedisScriptsTest, StatusCallCostIsFlatInWaiters) {
  heartbeat("a", 4, 60000);
  heartbeat("b", 4, 60000);
  int n = 0;
  std::vector<std::int64_t> commands;
  for (const int target : {10, 1000, 10000}) {
    while (n < target + 4) {
      ++n;
      call(scripts::kAcquire,
           {n % 2 ? "a" : "b", std::to_string(n), "600000", "t" + std::to_string(n % 7), "1"});
    }
    ASSERT_EQ(zcard(2), target);
    const auto before = command_count().all;
    auto r = call(scripts::kSnapshot, {"0", "100"});
    const auto after = command_count().all;
    ASSERT_EQ(r.elements.at(3).integer, target);
    EXPECT_EQ(r.elements.at(5).elements.size(), 4u * std::min(target, 100));
    commands.push_back(after - before - 1);
    constexpr int kRuns = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kRuns; ++i) call(scripts::kSnapshot, {std::to_string(target / 2), "100"});
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / kRuns;
    std::printf("status call with %d waiters (4 holders, page of 100): %lld Redis-side commands, %.2f ms\n",
                target, static_cast<long long>(commands.back()), ms);
    RecordProperty("status_ms_" + std::to_string(target) + "_waiters", std::to_string(ms));
  }
  EXPECT_EQ(commands[1], commands[2]) << "flat from 1,000 to 10,000 waiters";
}

// The heartbeat of an instance whose waiters wait under tenant fairness asks Redis their
// places (up to 100 a beat). Its cost must stay flat in tenants (F6): with more than
// COUNTED_TENANTS (lib.lua) waiting, the places are bounded, not counted (before, 1,000
// tenants cost 1,113 commands and ~7 ms a beat); and while the queue does not move, the
// places counted at its version are not counted again: one GET (before, ~100 ZCOUNTs and
// every tenant's ZCARD, every beat of every instance).
TEST_F(RedisScriptsTest, TheHeartbeatUnderFairnessIsFlatInTenantsAndCheapWhileTheQueueStays) {
  heartbeat("a", 1, 600000, "", 0, 0, {"tenant_fairness", "1"});
  ASSERT_EQ(call(scripts::kAcquire, {"a", "1", "1000000", "h", "1"}).elements.at(0).str, "granted");
  constexpr int kWaiters = 2000, kAsked = 100;
  std::map<int, std::int64_t> changed;
  int n = 100;
  for (const int tenants : {10, 100, 1000, 2000}) {
    // Only the waiters go (the state, its one holder and its instance stay).
    server().command(
        {"EVAL",
         "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do if not (string.find(k, ':cfg$') or "
         "string.find(k, ':holders$') or string.find(k, ':instances$') or string.find(k, ':seq$')) "
         "then redis.call('DEL', k) end end",
         "0", "t:" + name_ + ":*"});
    std::vector<std::pair<std::string, std::int64_t>> queued;
    for (int i = 0; i < kWaiters; ++i) {
      const std::string t = "t" + std::to_string(i % tenants);
      const auto r = call(scripts::kAcquire, {"a", std::to_string(++n), "1000000", t, "1"});
      ASSERT_EQ(r.elements.at(0).str, "queued");
      queued.emplace_back(t, r.elements.at(1).integer);
    }
    // As RedisLimiter asks: ARGV[8] the version heard, ARGV[9] how many not counted at it.
    const auto beat = [&](const std::string& heard, int not_counted, int asked) {
      std::vector<std::string> args{"a",
                                    "600000",
                                    "0",
                                    "0",
                                    "1",
                                    std::to_string(kWaiters),
                                    heard,
                                    std::to_string(not_counted),
                                    std::to_string(asked)};
      for (int i = 0; i < asked; ++i) {
        const auto& [t, order] = queued[static_cast<std::size_t>(i)];  // the oldest, as RedisLimiter asks
        args.push_back(t);
        args.push_back(std::to_string(order));
      }
      const auto before = command_count().all;
      auto r = call(scripts::kHeartbeat, args);
      return std::make_pair(command_count().all - before - 1, std::move(r));
    };
    const auto base = beat("", 0, 0).first;
    auto [counted, reply] = beat("", kAsked, kAsked);
    ASSERT_EQ(reply.elements.at(16).elements.size(), static_cast<std::size_t>(kAsked));
    const std::string version = reply.elements.at(17).str;
    const auto [stayed, stayed_reply] = beat(version, 0, kAsked);
    EXPECT_TRUE(stayed_reply.elements.at(16).elements.empty());
    EXPECT_EQ(stayed, base + 1) << tenants << " tenants: the queue did not move, one GET";
    // Each place at most one ZCOUNT, and a ZRANK and a ZCARD per tenant beyond COUNTED_TENANTS.
    EXPECT_LE(counted - base, 3 * kAsked + 6) << tenants << " tenants";
    changed[tenants] = counted - base;
    constexpr int kRuns = 10;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kRuns; ++i) beat("", kAsked, kAsked);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / kRuns;
    std::printf(
        "heartbeat under fairness, %d waiters of %d tenants, %d places asked: %lld Redis-side commands more "
        "than a heartbeat asking none when the queue moved (%.2f ms a call), %lld when it did not\n",
        kWaiters, tenants, kAsked, static_cast<long long>(counted - base), ms,
        static_cast<long long>(stayed - base));
  }
  EXPECT_EQ(changed[1000], changed[2000]) << "flat beyond COUNTED_TENANTS";
}

}  // namespace
