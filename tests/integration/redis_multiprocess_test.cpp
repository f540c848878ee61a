// Several real processes (`fairgate bench-worker`, the same binary users run)
// share one limiter through a real redis-server: the guarantees of issue 3
// across process boundaries, and crash recovery after a real kill -9.
#include "bench/fleet.hpp"
#include "support/holders_key.hpp"
#include "support/redis_monitor.hpp"
#include "support/redis_server.hpp"
#include "support/wait.hpp"

#include <gtest/gtest.h>
#include <boost/json.hpp>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using fairgate::bench::Fleet;
using fairgate::bench::RequestRecord;
using fairgate::bench::WorkerOptions;
using fairgate::test::RedisServer;
using fairgate::test::wait_until;

constexpr const char* kPrefix = "mp";
constexpr std::uint32_t kCap = 3;
constexpr auto kHeartbeat = 250ms;
constexpr auto kTtl = 1000ms;

RedisServer& server() { return RedisServer::shared(); }

std::string test_name() { return ::testing::UnitTest::GetInstance()->current_test_info()->name(); }

std::string key(const std::string& limiter, const std::string& what) {
  return std::string(kPrefix) + ":{" + limiter + "}:" + what;
}

long zcard(const std::string& limiter, const std::string& what) {
  return std::stol(server().command(fairgate::test::count_command(key(limiter, what))));
}

WorkerOptions worker(const std::string& limiter, int i) {
  WorkerOptions o;
  o.redis_url = server().url();
  o.key_prefix = kPrefix;
  o.limiter = limiter;
  o.instance_id = limiter + "-p" + std::to_string(i);
  o.max_concurrent = kCap;
  o.heartbeat_interval = kHeartbeat;
  o.liveness_ttl = kTtl;
  o.command_timeout = 900ms;  // sanitizer builds are slow; no spurious timeouts
  o.seed = 20261129 + static_cast<std::uint64_t>(i);
  return o;
}

Fleet start(const std::vector<WorkerOptions>& workers) {
  Fleet fleet(FAIRGATE_BIN, workers,
              [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
  fleet.wait_for("ready", fleet.size(), 30s);
  return fleet;
}

// F1 + F2 + F3 + F4 with 4 processes x 60 requests (N = 3): staggered arrivals,
// random holds, some cancels and short timeouts. Overshoot from the clients'
// own timestamps; FIFO in Redis' own order (MONITOR); exactly one end per
// request; nothing left in Redis.
TEST(RedisMultiProcessTest, FourProcessesShareOneFairLimiter) {
  const std::string name = test_name();
  constexpr int kProcesses = 4;
  constexpr std::size_t kRequests = 60;
  fairgate::test::RedisMonitor monitor(server().port());
  std::vector<WorkerOptions> workers;
  for (int i = 0; i < kProcesses; ++i) {
    auto o = worker(name, i);
    o.requests = kRequests;
    o.spread = 1000ms;  // 240 arrivals/s against about 200 grants/s: a queue builds up
    o.hold_min = 5ms;
    o.hold_max = 25ms;
    o.max_wait = 20s;
    o.cancel_fraction = 0.1;
    o.timeout_fraction = 0.1;
    workers.push_back(o);
  }
  Fleet fleet = start(workers);
  std::vector<RequestRecord> records;
  fleet.send_all("go");
  fleet.wait_for("done", fleet.size(), 60s, &records);

  // Exactly one record (= one end) per request, and each a known outcome.
  std::map<std::string, std::set<std::uint64_t>> seen;
  for (const auto& r : records) {
    EXPECT_TRUE(seen[r.instance].insert(r.index).second) << r.instance << " #" << r.index << " ended twice";
    EXPECT_TRUE(r.outcome == "granted" || r.outcome == "timed_out" || r.outcome == "cancelled")
        << r.instance << " #" << r.index << ": " << r.outcome << " " << r.reason;
  }
  ASSERT_EQ(records.size(), kProcesses * kRequests);
  for (const auto& [inst, indexes] : seen) EXPECT_EQ(indexes.size(), kRequests) << inst;

  const auto f = fairgate::bench::analyze(records, kCap);
  EXPECT_EQ(f.overshoot, 0u) << "at most " << kCap << " holders at once, saw " << f.max_holders;
  EXPECT_EQ(f.max_holders, kCap) << "the cap was reached (the test exercised the queue)";
  EXPECT_GT(f.timeouts, 0u) << "some short waits timed out";
  EXPECT_GT(f.cancels, 0u) << "some waits were cancelled";
  EXPECT_GT(f.grants, records.size() / 2);

  // Afterwards nothing is held or queued in Redis.
  EXPECT_TRUE(wait_until([&] { return zcard(name, "holders") == 0 && zcard(name, "queue") == 0; }, 5s))
      << "holders " << zcard(name, "holders") << ", queue " << zcard(name, "queue");
  fleet.exit_all();

  const auto fifo = fairgate::test::fifo_in_redis_order(monitor.lines(), kPrefix, name);
  EXPECT_EQ(fifo.inversions, 0) << "hand-offs in arrival (sequence) order";
  EXPECT_EQ(fifo.unknown, 0) << "a hand-off to a waiter that never queued";
  EXPECT_GT(fifo.handoffs, 50) << "the queue was exercised";
  std::printf(
      "4 processes x %zu: %zu granted (%d from the queue), %zu timed out, %zu cancelled, max holders %zu/%u, "
      "hand-off p50 %.3f ms p99 %.3f ms, FIFO inversions in Redis order %d\n",
      kRequests, f.grants, fifo.handoffs, f.timeouts, f.cancels, f.max_holders, kCap, f.handoff.p50,
      f.handoff.p99, fifo.inversions);
}

// F5: kill -9 of a process that holds every permit. The waiters of another
// process get them within liveness TTL + heartbeat interval + 0.5 s, with no
// new arrival: the survivor's heartbeat reaps and dispatches.
TEST(RedisMultiProcessTest, KilledHolderPermitsReturnWithinTtlPlusInterval) {
  const std::string name = test_name();
  auto holder = worker(name, 0);
  holder.holders = kCap;
  auto waiter = worker(name, 1);
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
  EXPECT_EQ(server().command({"ZSCORE", key(name, "instances"), holder.instance_id}), "(nil)")
      << "the dead instance was reaped";
  EXPECT_TRUE(wait_until([&] { return zcard(name, "holders") == 0; }, 5s));
  fleet.exit_all();
  std::printf("kill -9 of the holder: all %u permits back after %.0f ms (bound %lld ms)\n", kCap,
              static_cast<double>(last) / 1e6, static_cast<long long>(bound.count()));
}

// F5 + F12: kill -9 of a process whose tenant holds every permit under tenant
// fairness: its permits and its tenant's count in Redis come back, and the
// other tenant's waiters are served.
TEST(RedisMultiProcessTest, KilledTenantHolderReturnsItsTenantCount) {
  const std::string name = test_name();
  auto holder = worker(name, 0);
  holder.holders = kCap;
  holder.tenant = "heavy";
  holder.tenant_fairness = true;
  auto waiter = worker(name, 1);
  waiter.requests = kCap;
  waiter.max_wait = 30s;
  waiter.tenant = "light";
  waiter.tenant_fairness = true;
  Fleet fleet = start({holder, waiter});
  fleet.send(0, "hold");
  fleet.wait_for("holding", 1, 10s);
  EXPECT_EQ(server().command({"HGET", key(name, "tholders"), "heavy"}), std::to_string(kCap));
  std::vector<RequestRecord> records;
  fleet.send(1, "go");
  fleet.wait_for("queued_all", 1, 10s, &records);
  EXPECT_EQ(server().command(fairgate::test::count_command(key(name, "tq:light"))), std::to_string(kCap));

  fleet.child(0).kill(SIGKILL);
  ASSERT_TRUE(fleet.child(0).wait(5s));
  fleet.wait_for("done", 1, 20s, &records, {0});
  ASSERT_EQ(records.size(), kCap);
  for (const auto& r : records) EXPECT_EQ(r.outcome, "granted") << r.reason;
  EXPECT_EQ(server().command({"HGET", key(name, "tholders"), "heavy"}), "(nil)")
      << "the dead tenant's count went back to 0";
  // The light requests held their permits for 0 ms: everything is back.
  EXPECT_TRUE(wait_until(
      [&] {
        // A holder member is "inst|n|granted_ms|tenant".
        const std::string held = server().command(fairgate::test::permits_command(key(name, "holders")));
        return held.find("|heavy") == std::string::npos && held.find("|light") == std::string::npos &&
               server().command({"EXISTS", key(name, "ptenant")}) == "0";
      },
      5s))
      << "no permit of either tenant left behind: "
      << server().command(fairgate::test::permits_command(key(name, "holders")));
  fleet.exit_all();
  EXPECT_TRUE(wait_until([&] { return zcard(name, "holders") == 0; }, 5s));
  EXPECT_TRUE(wait_until(
      [&] { return server().command(fairgate::test::tenant_count_command(key(name, "tholders"))) == "0"; },
      5s));
}

// Pub/Sub loss: CLIENT KILL TYPE pubsub mid-run drops both processes' wake
// connections; they reconnect after at least 50 ms, and grants published in
// that gap are lost. The heartbeat's held list must find them: a waiter whose
// wake was lost is served within about one heartbeat interval (250 ms here),
// far below its 1.5 s max wait; without that sync it would time out.
TEST(RedisMultiProcessTest, PubSubLossStrandsNoWaiter) {
  const std::string name = test_name();
  std::vector<WorkerOptions> workers;
  for (int i = 0; i < 2; ++i) {
    auto o = worker(name, i);
    o.requests = 40;
    o.spread = 800ms;
    o.hold_min = 10ms;
    o.hold_max = 30ms;
    o.max_wait = 1500ms;
    workers.push_back(o);
  }
  Fleet fleet = start(workers);
  std::vector<RequestRecord> records;
  fleet.send_all("go");
  long killed = 0;
  for (int i = 0; i < 4; ++i) {  // four losses during the arrivals
    std::this_thread::sleep_for(150ms);
    killed += std::stol(server().command({"CLIENT", "KILL", "TYPE", "pubsub"}));
  }
  EXPECT_GE(killed, 2) << "the wake connections were killed";
  const auto done = fleet.wait_for("done", fleet.size(), 60s, &records);
  fleet.exit_all();
  std::uint64_t recovered = 0;
  for (const auto& e : done) recovered += e.count("lost_wakes_recovered");

  ASSERT_EQ(records.size(), 80u);
  for (const auto& r : records)
    EXPECT_EQ(r.outcome, "granted") << r.instance << " #" << r.index << ": " << r.reason;
  EXPECT_GE(recovered, 1u) << "some wakes were lost (else this test proves nothing)";
  const auto f = fairgate::bench::analyze(records, kCap);
  EXPECT_EQ(f.overshoot, 0u);
  EXPECT_TRUE(wait_until([&] { return zcard(name, "holders") == 0 && zcard(name, "queue") == 0; }, 5s));
  std::printf(
      "Pub/Sub killed 4 times (%ld connections): 80 of 80 granted, %llu lost wakes recovered by the "
      "heartbeat, wait p99 %.0f ms, max %.0f ms\n",
      killed, static_cast<unsigned long long>(recovered), f.wait.p99, f.wait.max);
}

// `fairgate bench` itself: one JSON line per workload with the figures of
// docs/bench.md, from real worker processes, and nothing left in Redis.
TEST(RedisMultiProcessTest, BenchPrintsTheFiguresOfW1) {
  fairgate::bench::Child bench(
      {FAIRGATE_BIN, "bench", "--redis", server().url(), "--workload", "W1", "--prefix", kPrefix, "--quiet"});
  const auto line = bench.next_line(60s);
  ASSERT_TRUE(line) << "no output";
  const auto status = bench.wait(30s);
  ASSERT_TRUE(status);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  const auto v = boost::json::parse(*line).as_object();
  for (const char* k :
       {"workload", "grants", "overshoot", "inversions", "handoff_p50_ms", "handoff_p99_ms",
        "client_round_trips_per_grant", "redis_cmds_per_grant", "idle_redis_cmds_per_s", "grants_per_s"}) {
    EXPECT_TRUE(v.contains(k)) << k << " missing in " << *line;
  }
  EXPECT_EQ(v.at("workload").as_string(), "W1");
  EXPECT_EQ(v.at("grants").to_number<int>(), 10) << "W1: 10 users, all served";
  EXPECT_EQ(v.at("overshoot").to_number<int>(), 0);
  EXPECT_EQ(v.at("max_holders").to_number<int>(), 3) << "3 seats in use at once";
  EXPECT_EQ(v.at("leftover_holders").to_number<int>(), 0);
  EXPECT_EQ(v.at("leftover_waiters").to_number<int>(), 0);
  // 7 of the 10 waited: each was handed a released permit.
  EXPECT_EQ(v.at("handoffs").to_number<int>(), 7);
  const double per_grant = v.at("redis_cmds_per_grant").to_number<double>();
  EXPECT_GT(per_grant, 5.0);
  EXPECT_LT(per_grant, 40.0);
  std::printf("%s\n", line->c_str());
}

// `fairgate bench --workload crash`: kill -9 of the instance holding all 3
// permits; the other instance's 3 waiters are granted within TTL + heartbeat
// interval + 0.5 s of the kill, as the report's crash table will say.
TEST(RedisMultiProcessTest, BenchCrashRecoversWithinTtlPlusInterval) {
  fairgate::bench::Child bench({FAIRGATE_BIN, "bench", "--redis", server().url(), "--workload", "crash",
                                "--heartbeat", "250ms", "--ttl", "1s", "--crash-bound", "5s", "--prefix",
                                kPrefix, "--quiet"});
  const auto line = bench.next_line(30s);
  ASSERT_TRUE(line) << "no output";
  const auto status = bench.wait(30s);
  ASSERT_TRUE(status);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  const auto v = boost::json::parse(*line).as_object();
  EXPECT_EQ(v.at("workload").as_string(), "crash");
  EXPECT_EQ(v.at("heartbeat_ms").to_number<int>(), 250);
  EXPECT_EQ(v.at("ttl_ms").to_number<int>(), 1000);
  EXPECT_EQ(v.at("granted").to_number<int>(), 3) << "all of B's waiters got the dead holder's permits";
  EXPECT_EQ(v.at("granted_before_kill").to_number<int>(), 0) << "A held every permit until the kill";
  ASSERT_TRUE(v.at("recovery_max_ms").is_number()) << *line;
  EXPECT_LE(v.at("recovery_max_ms").to_number<double>(), 1000.0 + 250.0 + 500.0) << *line;
  std::printf("%s\n", line->c_str());
}

}  // namespace
