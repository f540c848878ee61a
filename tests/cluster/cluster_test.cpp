// Redis Cluster (label "cluster"): real `fairgate bench-worker` processes on a
// real 3-master cluster started by the test (tests/support/redis_cluster.hpp),
// limiters whose hash tags land on different masters. Judged from the
// clients' own timestamps (overshoot), Redis' own order (MONITOR on the
// master that owns the limiter: FIFO), one record per request, nothing left.
#include "bench/fleet.hpp"
#include "redis/client.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_monitor.hpp"
#include "support/wait.hpp"

#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
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
  const std::string r = cluster().command_for(key(limiter, "cfg"), {"ZCARD", key(limiter, what)});
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

}  // namespace
