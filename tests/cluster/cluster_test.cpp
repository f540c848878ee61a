// Redis Cluster (label "cluster"): real `fairgate bench-worker` processes on a
// real 3-master cluster started by the test (tests/support/redis_cluster.hpp),
// limiters whose hash tags land on different masters. Judged from the
// clients' own timestamps (overshoot), Redis' own order (MONITOR on the
// master that owns the limiter: FIFO), one record per request, nothing left.
#include "bench/fleet.hpp"
#include "redis/client.hpp"
#include "redis/database_check.hpp"
#include "redis/url.hpp"
#include "support/acl.hpp"
#include "support/holders_key.hpp"
#include "support/instance.hpp"
#include "support/log_lines.hpp"
#include "support/lost_grant.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_monitor.hpp"
#include "support/run_shell.hpp"
#include "support/wait.hpp"

#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

namespace {

using namespace std::chrono_literals;
using fairgate::bench::Fleet;
using fairgate::bench::RequestRecord;
using fairgate::bench::WorkerOptions;
using fairgate::test::RedisCluster;
using fairgate::test::wait_until;

constexpr const char* kPrefix = "cl";
constexpr std::uint32_t kCap = 3;
constexpr auto kHeartbeat = 250ms;
constexpr auto kTtl = 1000ms;

RedisCluster& cluster() {
  static RedisCluster c;  // one per test binary: 3 masters, no replicas
  return c;
}

std::string key(const std::string& limiter, const std::string& what) {
  return std::string(kPrefix) + ":{" + limiter + "}:" + what;
}

long zcard(const std::string& limiter, const std::string& what) {
  const std::string r =
      cluster().command_for(key(limiter, "cfg"), fairgate::test::count_command(key(limiter, what)));
  try {
    return std::stol(r);
  } catch (...) {
    return -1;
  }
}

WorkerOptions worker(const std::string& url, const std::string& limiter, int i) {
  WorkerOptions o;
  o.redis_url = url;
  o.key_prefix = kPrefix;
  o.limiter = limiter;
  o.instance_id = limiter + "-p" + std::to_string(i);
  o.max_concurrent = kCap;
  o.heartbeat_interval = kHeartbeat;
  o.liveness_ttl = kTtl;
  o.command_timeout = 900ms;  // sanitizer builds are slow; no spurious timeouts
  o.seed = 20261202 + static_cast<std::uint64_t>(i);
  return o;
}

Fleet start(const std::vector<WorkerOptions>& workers) {
  Fleet fleet(FAIRGATE_BIN, workers,
              [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
  fleet.wait_for("ready", fleet.size(), 30s);
  return fleet;
}

TEST(ClusterSlots, Crc16AndHashTagsMatchRedis) {
  // The client's slot of a key is the one Redis computes (CLUSTER KEYSLOT).
  for (const std::string k : {"a", "foo", "{user1000}.following", "cl:{L-7}:cfg", "{}x", "x{}{y}", "{a}{b}",
                              "fairgate:{bench}:wake:host-1-abc", "\xff\x01"}) {
    EXPECT_EQ(fairgate::redis::key_slot(k), cluster().slot_of(k)) << k;
  }
  EXPECT_EQ(fairgate::redis::key_slot("123456789"), 0x31C3u & 16383u) << "CRC16/XMODEM check value";
}

// The multi-process fair test on Cluster: 3 limiters, one on each master;
// 4 processes x 50 requests on each (N = 3), staggered arrivals, random holds,
// some cancels and short timeouts. Per limiter: overshoot 0 (clients'
// timestamps), FIFO 0 inversions (MONITOR of the master that owns it), one
// end per request, nothing left in Redis.
TEST(ClusterMultiProcess, LimitersOnThreeMastersStayFairAndCapped) {
  constexpr int kProcesses = 4;
  constexpr std::size_t kRequests = 50;
  std::vector<std::string> names;
  std::vector<std::unique_ptr<fairgate::test::RedisMonitor>> monitors;
  std::set<int> owners;
  for (std::size_t m = 0; m < 3; ++m) {
    names.push_back(cluster().name_on(m, "fair" + std::to_string(m)));
    const int owner = cluster().owner_of_slot(cluster().slot_of(key(names.back(), "cfg")));
    ASSERT_EQ(owner, static_cast<int>(m));
    owners.insert(owner);
    monitors.push_back(std::make_unique<fairgate::test::RedisMonitor>(cluster().node(m).port()));
  }
  ASSERT_EQ(owners.size(), 3u) << "the limiters live on three different masters";

  std::vector<WorkerOptions> workers;
  for (const auto& name : names) {
    for (int i = 0; i < kProcesses; ++i) {
      auto o = worker(cluster().url(), name, i);
      o.requests = kRequests;
      o.spread = 1000ms;
      o.hold_min = 5ms;
      o.hold_max = 25ms;
      o.max_wait = 20s;
      o.cancel_fraction = 0.1;
      o.timeout_fraction = 0.1;
      workers.push_back(o);
    }
  }
  Fleet fleet = start(workers);
  std::vector<RequestRecord> records;
  fleet.send_all("go");
  fleet.wait_for("done", fleet.size(), 90s, &records);

  for (const auto& name : names) {
    SCOPED_TRACE(name);
    std::vector<RequestRecord> mine;
    for (const auto& r : records)
      if (r.instance.rfind(name + "-p", 0) == 0) mine.push_back(r);
    std::map<std::string, std::set<std::uint64_t>> seen;
    for (const auto& r : mine) {
      EXPECT_TRUE(seen[r.instance].insert(r.index).second) << r.instance << " #" << r.index << " ended twice";
      EXPECT_TRUE(r.outcome == "granted" || r.outcome == "timed_out" || r.outcome == "cancelled")
          << r.instance << " #" << r.index << ": " << r.outcome << " " << r.reason;
    }
    ASSERT_EQ(mine.size(), kProcesses * kRequests);
    for (const auto& [inst, indexes] : seen) EXPECT_EQ(indexes.size(), kRequests) << inst;
    const auto f = fairgate::bench::analyze(mine, kCap);
    EXPECT_EQ(f.overshoot, 0u) << "at most " << kCap << " holders at once, saw " << f.max_holders;
    EXPECT_EQ(f.max_holders, kCap) << "the cap was reached (the test exercised the queue)";
    EXPECT_GT(f.grants, mine.size() / 2);
    EXPECT_TRUE(wait_until([&] { return zcard(name, "holders") == 0 && zcard(name, "queue") == 0; }, 5s))
        << "holders " << zcard(name, "holders") << ", queue " << zcard(name, "queue");
  }
  fleet.exit_all();
  for (std::size_t m = 0; m < names.size(); ++m) {
    const auto lines = monitors[m]->lines();
    const auto fifo = fairgate::test::fifo_in_redis_order(lines, kPrefix, names[m]);
    EXPECT_EQ(fifo.inversions, 0) << names[m] << ": hand-offs in arrival (sequence) order";
    EXPECT_EQ(fifo.unknown, 0) << names[m];
    EXPECT_GT(fifo.handoffs, 30) << names[m] << ": the queue was exercised on its own master";
    // Nothing of another limiter ran on this master (routing by hash tag).
    for (std::size_t o = 0; o < names.size(); ++o) {
      if (o == m) continue;
      const std::string other = std::string(kPrefix) + ":{" + names[o] + "}";
      EXPECT_EQ(std::count_if(lines.begin(), lines.end(),
                              [&](const std::string& l) {
                                return l.find(other) != std::string::npos &&
                                       l.find("\"KEYSLOT\"") == std::string::npos;  // the test's own
                              }),
                0)
          << names[o] << " ran on the master of " << names[m] << ", e.g. "
          << *std::find_if(lines.begin(), lines.end(), [&](const std::string& l) {
               return l.find(other) != std::string::npos &&
                      l.find("\"KEYSLOT\"") == std::string::npos;  // the test's own
             });
    }
    std::printf("%s on master %zu: FIFO hand-offs %d, inversions %d\n", names[m].c_str(), m, fifo.handoffs,
                fifo.inversions);
  }
}

// kill -9 of an instance holding every permit of a limiter on Cluster: the
// other instance's waiters get them within liveness TTL + interval + 0.5 s.
TEST(ClusterMultiProcess, KilledHolderPermitsReturnWithinTtlPlusInterval) {
  const std::string name = cluster().name_on(1, "kill");
  auto holder = worker(cluster().url(), name, 0);
  holder.holders = kCap;
  auto waiter = worker(cluster().url(), name, 1);
  waiter.requests = kCap;
  waiter.max_wait = 30s;
  Fleet fleet = start({holder, waiter});
  fleet.send(0, "hold");
  fleet.wait_for("holding", 1, 10s);
  std::vector<RequestRecord> records;
  fleet.send(1, "go");
  fleet.wait_for("queued_all", 1, 10s, &records);
  ASSERT_EQ(zcard(name, "queue"), static_cast<long>(kCap)) << "the waiters wait";

  const std::int64_t killed_at = fairgate::bench::now_ns();
  fleet.child(0).kill(SIGKILL);
  ASSERT_TRUE(fleet.child(0).wait(5s)) << "the holder process is gone";
  fleet.wait_for("done", 1, 20s, &records, {0});

  ASSERT_EQ(records.size(), kCap);
  const auto bound = kTtl + kHeartbeat + 500ms;
  std::int64_t last = 0;
  for (const auto& r : records) {
    ASSERT_EQ(r.outcome, "granted") << r.reason;
    EXPECT_GT(r.grant_ns, killed_at) << "granted only after the kill";
    last = std::max(last, r.grant_ns - killed_at);
  }
  EXPECT_LE(last, std::chrono::nanoseconds(bound).count()) << "permits back within TTL + interval + 0.5 s";
  EXPECT_TRUE(wait_until([&] { return zcard(name, "holders") == 0; }, 5s));
  fleet.exit_all();
  std::printf("Cluster, kill -9 of the holder: all %u permits back after %.0f ms (bound %lld ms)\n", kCap,
              static_cast<double>(last) / 1e6, static_cast<long long>(bound.count()));
}

// --- faults on the cluster itself: failover and live resharding -------------

/// Runs `processes` workers of limiter `name` (open loop: `requests` each over
/// `spread`, holds 10..40 ms, max wait 30 s); `fault` runs once they started.
/// Checks one record per request, every one granted, overshoot 0 from the
/// clients' timestamps. Returns the records.
std::vector<RequestRecord> run_with_fault(const std::string& url, const std::string& name, int processes,
                                          std::size_t requests, std::chrono::milliseconds spread,
                                          const std::function<void()>& fault) {
  std::vector<WorkerOptions> workers;
  for (int i = 0; i < processes; ++i) {
    auto o = worker(url, name, i);
    o.requests = requests;
    o.spread = spread;
    o.hold_min = 10ms;
    o.hold_max = 40ms;
    o.max_wait = 30s;
    workers.push_back(o);
  }
  Fleet fleet = start(workers);
  std::vector<RequestRecord> records;
  fleet.send_all("go");
  fault();
  fleet.wait_for("done", fleet.size(), 90s, &records);
  fleet.exit_all();
  std::map<std::string, std::set<std::uint64_t>> seen;
  for (const auto& r : records) {
    EXPECT_TRUE(seen[r.instance].insert(r.index).second) << r.instance << " #" << r.index << " ended twice";
    EXPECT_EQ(r.outcome, "granted") << r.instance << " #" << r.index << ": " << r.reason;
  }
  EXPECT_EQ(records.size(), static_cast<std::size_t>(processes) * requests) << "every request ended once";
  const auto f = fairgate::bench::analyze(records, kCap);
  EXPECT_EQ(f.overshoot, 0u) << "at most " << kCap << " holders at once, saw " << f.max_holders;
  return records;
}

/// The longest gap between consecutive grants after `t` (ns): how long clients saw no progress.
double longest_gap_ms(std::vector<RequestRecord> records, std::int64_t t) {
  std::vector<std::int64_t> grants{t};
  for (const auto& r : records)
    if (r.grant_ns > t) grants.push_back(r.grant_ns);
  std::sort(grants.begin(), grants.end());
  std::int64_t gap = 0;
  for (std::size_t i = 1; i < grants.size(); ++i) gap = std::max(gap, grants[i] - grants[i - 1]);
  return static_cast<double>(gap) / 1e6;
}

// A live slot migration of a busy limiter's tag (SETSLOT IMPORTING/MIGRATING,
// MIGRATE, SETSLOT NODE) mid-run: overshoot 0, every request granted once,
// nothing stranded; the wake subscriptions follow the slot to the new master.
TEST(ClusterResharding, BusyLimiterSlotMovesToAnotherMaster) {
  const std::string name = cluster().name_on(0, "move");
  const unsigned slot = cluster().slot_of(key(name, "cfg"));
  std::int64_t moved_at = 0;
  double took_ms = 0;
  const auto records = run_with_fault(cluster().url(), name, 3, 60, 3000ms, [&] {
    std::this_thread::sleep_for(1500ms);  // past the new limiter's recovery fence: grants before the move
    moved_at = fairgate::bench::now_ns();
    // The window between MIGRATING/IMPORTING and the keys' move: scripts meet TRYAGAIN/ASK.
    cluster().migrate_slot(slot, 0, 1, [] { std::this_thread::sleep_for(150ms); });
    took_ms = static_cast<double>(fairgate::bench::now_ns() - moved_at) / 1e6;
  });
  EXPECT_EQ(cluster().owner_of_slot(slot), 1) << "the slot moved";
  EXPECT_EQ(cluster().node(0).command({"EXISTS", key(name, "cfg")}).rfind("(error) MOVED", 0), 0u)
      << "the old master redirects";
  EXPECT_TRUE(wait_until([&] { return zcard(name, "holders") == 0 && zcard(name, "queue") == 0; }, 5s))
      << "nothing stranded on the new master";
  std::size_t after = 0;
  for (const auto& r : records)
    after += r.grant_ns > moved_at + static_cast<std::int64_t>(took_ms * 1e6) ? 1 : 0;
  EXPECT_GT(after, 20u) << "grants went on after the move (on the new master)";
  EXPECT_LT(after, 170u) << "and ran before it";
  std::printf(
      "slot %u of %s moved from master 0 to 1 under load in %.0f ms; longest pause between grants %.0f ms; "
      "%zu grants after the move\n",
      slot, name.c_str(), took_ms, longest_gap_ms(records, moved_at), after);
}

/// The backend's options on this cluster as `user` (password "pw"), this
/// test's prefix and timings.
fairgate::RedisBackendOptions options_as(const std::string& user) {
  fairgate::RedisBackendOptions o;
  o.url = cluster().url();
  o.url.insert(o.url.find("://") + 3, user + ":pw@");
  o.key_prefix = kPrefix;
  o.heartbeat_interval = kHeartbeat;
  o.liveness_ttl = kTtl;
  o.command_timeout = 900ms;
  o.key_expiry = 0ms;
  return o;
}

// At run time on a Cluster: EVALSHA taken away from the user on one master
// only. The limiter whose keys live there follows on_redis_down (degraded,
// "refused this user's calls"), one line names that master, and a limiter
// on another master goes on through Redis. Given back, it is Redis' again.
TEST(ClusterAcl, ACallRefusedOnOneMasterDegradesOnlyTheLimitersThere) {
  using fairgate::test::Instance;
  using fairgate::test::ready_past_fence;
  const std::string user = "fg-deny-" + std::to_string(::getpid());
  const auto acl = fairgate::test::documented_acl(user, "pw", kPrefix);
  for (std::size_t m = 0; m < 3; ++m) ASSERT_EQ(cluster().node(m).command(acl), "OK");
  fairgate::test::LogLines logged;
  auto o = options_as(user);
  o.log = logged.sink();
  {
    Instance a(o);
    fairgate::Settings one;
    one.max_concurrent = 1;
    one.local_share = 1;
    const std::string refused = cluster().name_on(2, "deny"), fine = cluster().name_on(0, "deny");
    fairgate::Limiter lr = a.open(refused, one);
    fairgate::Limiter lf = a.open(fine, one);
    ASSERT_TRUE(
        wait_until([&] { return ready_past_fence(a, refused, lr) && ready_past_fence(a, fine, lf); }, 10s));
    ASSERT_EQ(cluster().node(2).command({"ACL", "SETUSER", user, "-evalsha"}), "OK");
    const auto degraded_line = [&] { return logged.with("degraded: Redis refused this user's calls"); };
    // (The line is logged just after the flag is set.)
    EXPECT_TRUE(wait_until([&] { return a.impl(refused)->degraded() && !degraded_line().empty(); }, 10s))
        << logged.all();
    EXPECT_FALSE(a.impl(fine)->degraded()) << "the other master's limiter is untouched";
    const auto said = logged.with("refused a call of fairgate's");
    ASSERT_FALSE(said.empty()) << logged.all();
    EXPECT_NE(said.front().find(":" + std::to_string(cluster().node(2).port()) + " refused"),
              std::string::npos)
        << "names the master that refuses: " << said.front();
    EXPECT_EQ(degraded_line().size(), 1u) << logged.all();
    ASSERT_EQ(cluster().node(2).command({"ACL", "SETUSER", user, "+evalsha"}), "OK");
    EXPECT_TRUE(wait_until([&] { return !a.impl(refused)->degraded(); }, 10s)) << logged.all();
  }
  for (std::size_t m = 0; m < 3; ++m) cluster().node(m).command({"ACL", "DELUSER", user});
}

// A user whose keys and channels are another prefix: on a Cluster its calls
// are refused for the keys and its wake subscription, sent again, for the
// channels: two lines that came alternately, each about five times a second
// (the log kept only the last line it told, so each made the other new
// again). Each is told once. (On one server the subscription is not sent
// again, so nothing alternates there.)
TEST(ClusterAcl, RefusalsThatAlternateAreEachToldOnce) {
  using fairgate::test::Instance;
  const std::string user = "fg-other-" + std::to_string(::getpid());
  for (std::size_t m = 0; m < 3; ++m)
    ASSERT_EQ(cluster().node(m).command(fairgate::test::documented_acl(user, "pw", "other")), "OK");
  fairgate::test::LogLines logged;
  auto o = options_as(user);
  o.log = logged.sink();
  {
    Instance a(o);
    fairgate::Limiter l = a.open(cluster().name_on(1, "other"), fairgate::Settings{});
    const auto refused = [&](const char* what) {
      return logged.with(std::string("refused a call of fairgate's as user '") + user +
                         "' (NOPERM this user has no permissions to access one of the " + what);
    };
    ASSERT_TRUE(wait_until([&] { return !refused("keys").empty() && !refused("channels").empty(); }, 10s))
        << logged.all();
    std::this_thread::sleep_for(2s);  // calls and subscriptions, all refused
    EXPECT_EQ(refused("keys").size(), 1u) << logged.all();
    EXPECT_EQ(refused("channels").size(), 1u) << logged.all();
    EXPECT_EQ(logged.with("refused a call").size(), 2u) << logged.all();
  }
  for (std::size_t m = 0; m < 3; ++m) cluster().node(m).command({"ACL", "DELUSER", user});
}

// ACL users are not replicated: each node has its own. A user made right on
// the two masters the URL names as seeds but with another key pattern on the
// third is an error at `fairgate serve` start naming the third, found through
// CLUSTER SLOTS; made right there too, serve starts.
TEST(ClusterAcl, AUserWrongOnOneMasterIsAnErrorAtStart) {
  const std::string user = "fg-part-" + std::to_string(::getpid());
  for (std::size_t m = 0; m < 2; ++m)
    ASSERT_EQ(cluster().node(m).command(fairgate::test::documented_acl(user, "pw")), "OK");
  ASSERT_EQ(cluster().node(2).command(fairgate::test::documented_acl(user, "pw", "other")), "OK");
  std::string url = cluster().url();
  url.insert(url.find("://") + 3, user + ":pw@");
  const std::string name = cluster().name_on(0, "start");
  const auto target = std::get<fairgate::redis::Target>(fairgate::redis::parse_target(url));
  ASSERT_EQ(target.nodes.size(), 2u) << "two seeds: the third master is found, not given";
  const auto probe = fairgate::redis::start_probe("fairgate", {name}, {});
  fairgate::redis::Endpoint third = target.nodes.front();
  third.port = cluster().node(2).port();
  const std::string line = fairgate::redis::denied_line(
      third, "NOPERM this user has no permissions to access one of the keys used as arguments");
  EXPECT_EQ(fairgate::redis::cluster_start_problem(target.nodes, 2s, probe), line);

  fairgate::test::expect_serve_refuses_at_start(url, line, name + "=2");

  ASSERT_EQ(cluster().node(2).command(fairgate::test::documented_acl(user, "pw")), "OK");
  EXPECT_EQ(fairgate::redis::cluster_start_problem(target.nodes, 2s, probe), std::nullopt);
  fairgate::test::expect_serve_starts(url, name + "=2");
  for (std::size_t m = 0; m < 3; ++m) cluster().node(m).command({"ACL", "DELUSER", user});
}

// docs/redis-acl.md on a Cluster: the documented user on every master
// (CLUSTER SLOTS is in it), two instances in this process on a limiter of
// each master, grants, a queue and its hand-off: Redis refuses nothing.
TEST(ClusterAcl, TheDocumentedAclIsEnough) {
  using fairgate::test::acquire;
  using fairgate::test::acquire_queued;
  using fairgate::test::Instance;
  using fairgate::test::ready_past_fence;
  const std::string user = "fg-acl-" + std::to_string(::getpid());
  const auto acl = fairgate::test::documented_acl(user, "pw", kPrefix);  // the doc's user, this test's prefix
  ASSERT_FALSE(acl.empty()) << "docs/redis-acl.md has its ACL SETUSER line";
  for (std::size_t i = 0; i < cluster().size(); ++i) ASSERT_EQ(cluster().node(i).command(acl), "OK");
  const auto o = options_as(user);
  {
    Instance a(o), b(o);
    fairgate::Settings one;
    one.max_concurrent = 1;
    one.max_wait = 30s;
    for (std::size_t m = 0; m < 3; ++m) {
      const std::string name = cluster().name_on(m, "acl");
      fairgate::Limiter la = a.open(name, one);
      fairgate::Limiter lb = b.open(name, one);
      ASSERT_TRUE(
          wait_until([&] { return ready_past_fence(a, name, la) && ready_past_fence(b, name, lb); }, 10s))
          << name;
      auto held = acquire(la);
      ASSERT_TRUE(wait_until([&] { return held->done(); }, 5s));
      ASSERT_EQ(held->outcome(), fairgate::Outcome::granted) << held->message();
      auto waiter = acquire_queued(lb);
      held->release();
      ASSERT_TRUE(wait_until([&] { return waiter->done(); }, 5s)) << name;
      EXPECT_EQ(waiter->outcome(), fairgate::Outcome::granted) << waiter->message();
      waiter->release();
      EXPECT_TRUE(wait_until([&] { return zcard(name, "holders") == 0; }, 5s)) << name;
    }
    for (auto* instance : {&a, &b})
      EXPECT_EQ(instance->backend->health().error_replies, 0u) << "refused nothing";
  }
  for (std::size_t i = 0; i < cluster().size(); ++i) cluster().node(i).command({"ACL", "DELUSER", user});
}

// The wake subscription follows a moved slot: after the move, every live
// instance's shard channel is subscribed on the new master.
TEST(ClusterResharding, WakeSubscriptionFollowsTheSlot) {
  const std::string name = cluster().name_on(2, "sub");
  const unsigned slot = cluster().slot_of(key(name, "cfg"));
  auto o = worker(cluster().url(), name, 0);
  o.holders = 1;
  Fleet fleet = start({o});
  const std::string channel = key(name, "wake:" + o.instance_id);
  EXPECT_EQ(cluster().node(2).command({"PUBSUB", "SHARDNUMSUB", channel}), channel + "\n1");
  cluster().migrate_slot(slot, 2, 0);
  EXPECT_TRUE(wait_until(
      [&] {
        return cluster().node(0).command({"PUBSUB", "SHARDNUMSUB", channel}) == channel + "\n1";
      },
      3s))  // below the 5 s periodic map refresh: the sunsubscribe push does it
      << "subscribed on the new owner: " << cluster().node(0).command({"PUBSUB", "SHARDNUMSUB", channel});
  fleet.exit_all();
}

// Master failover on Cluster, twice under load: CLUSTER FAILOVER on the
// replica (a planned switch), then kill -9 of the new master (its replica, the
// old master, takes over after cluster-node-timeout). Overshoot 0 after the
// rebuild, every request granted once, nothing left; the times printed.
TEST(ClusterFailover, ManualFailoverThenKillOfTheMaster) {
  RedisCluster six(RedisCluster::Options{3, 1, 1000ms});
  const std::string name = six.name_on(0, "fo");
  const unsigned slot = six.slot_of(key(name, "cfg"));
  const std::size_t replica = 3;  // the replica of master 0
  double manual_ms = 0, kill_ms = 0;
  std::int64_t manual_at = 0, kill_at = 0;
  const auto records = run_with_fault(six.url(), name, 3, 120, 6000ms, [&] {
    std::this_thread::sleep_for(1500ms);  // past the recovery fence
    manual_at = fairgate::bench::now_ns();
    ASSERT_EQ(six.node(replica).command({"CLUSTER", "FAILOVER"}), "OK");
    ASSERT_TRUE(wait_until([&] { return six.owner_of_slot(slot) == static_cast<int>(replica); }, 15s));
    manual_ms = static_cast<double>(fairgate::bench::now_ns() - manual_at) / 1e6;
    ASSERT_TRUE(six.wait_stable(20s));
    std::this_thread::sleep_for(1000ms);
    kill_at = fairgate::bench::now_ns();
    six.node(replica).kill_hard();
    ASSERT_TRUE(wait_until([&] { return six.owner_of_slot(slot) == 0; }, 20s)) << "the old master took over";
    kill_ms = static_cast<double>(fairgate::bench::now_ns() - kill_at) / 1e6;
  });
  EXPECT_TRUE(wait_until(
      [&] {
        return six.node(0).command(fairgate::test::count_command(key(name, "holders"))) == "0" &&
               six.node(0).command(fairgate::test::count_command(key(name, "queue"))) == "0";
      },
      10s))
      << "nothing left on the master after the failovers";
  std::printf(
      "Cluster CLUSTER FAILOVER: new master in %.0f ms, longest pause between grants after it %.0f ms\n",
      manual_ms, longest_gap_ms(records, manual_at));
  std::printf(
      "Cluster kill -9 of the master: replica promoted in %.0f ms, longest pause between grants %.0f ms\n",
      kill_ms, longest_gap_ms(records, kill_at));
}

// Recovery rule 14 (docs/design.md) on a real Cluster failover that loses a
// grant (tests/support/lost_grant.hpp): the replica cut off while the grant is
// made, the master killed, the replica promoted with CLUSTER FAILOVER
// TAKEOVER. Without the rule the other instance is granted the lost seat at once.
TEST(ClusterFailover, APromotedReplicaThatMissedAGrantDoesNotGiveItsSeatAgain) {
  RedisCluster six(RedisCluster::Options{3, 1, 1000ms});
  const std::string name = six.name_on(0, "lost");
  const unsigned slot = six.slot_of(key(name, "cfg"));
  const std::size_t replica = 3;  // the replica of master 0
  fairgate::test::LostGrant{six.url(), kPrefix, name, six.node(0), six.node(replica)}.run([&] {
    ASSERT_EQ(six.node(replica).command({"CLUSTER", "FAILOVER", "TAKEOVER"}), "OK");
    ASSERT_TRUE(wait_until([&] { return six.owner_of_slot(slot) == static_cast<int>(replica); }, 15s));
  });
}

}  // namespace
