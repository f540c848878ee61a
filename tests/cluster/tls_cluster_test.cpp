// Redis Cluster and Sentinel over TLS (label "cluster"): TLS-only nodes
// (--port 0 --tls-port, --tls-cluster yes, --tls-replication yes) and a test
// CA made at test time (tests/support/test_pki.hpp); real
// `fairgate bench-worker` processes on rediss+cluster:// and
// rediss+sentinel:// URLs.
#include "bench/fleet.hpp"
#include "bench/process.hpp"
#include "redis/database_check.hpp"
#include "redis/url.hpp"
#include "support/acl.hpp"
#include "support/holders_key.hpp"
#include "support/redis_cluster.hpp"
#include "support/run_shell.hpp"
#include "support/sentinel_start.hpp"
#include "support/test_pki.hpp"
#include "support/wait.hpp"

#include <gtest/gtest.h>
#include <boost/json.hpp>

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

namespace {

using namespace std::chrono_literals;
using fairgate::bench::Fleet;
using fairgate::bench::RequestRecord;
using fairgate::bench::WorkerOptions;
using fairgate::test::RedisCluster;
using fairgate::test::RedisSentinels;
using fairgate::test::RedisServer;
using fairgate::test::TestPki;
using fairgate::test::wait_until;

constexpr std::uint32_t kCap = 3;

TestPki& pki() {
  static TestPki p;
  return p;
}

RedisServer::Tls tls() {
  RedisServer::Tls t;
  t.cert_file = pki().file("server.crt");
  t.key_file = pki().file("server.key");
  t.ca_file = pki().file("ca.crt");
  t.auth_clients = "no";  // mutual TLS: tests/integration/redis_tls_test.cpp
  return t;
}

WorkerOptions worker(const std::string& url, const std::string& prefix, const std::string& limiter, int i) {
  WorkerOptions o;
  o.redis_url = url;
  o.key_prefix = prefix;
  o.limiter = limiter;
  o.instance_id = limiter + "-p" + std::to_string(i);
  o.max_concurrent = kCap;
  o.heartbeat_interval = 250ms;
  o.liveness_ttl = 1000ms;
  o.command_timeout = 900ms;
  o.seed = 4242 + static_cast<std::uint64_t>(i);
  return o;
}

void check_records(const std::vector<RequestRecord>& records, std::size_t expected, bool all_granted) {
  std::map<std::string, std::set<std::uint64_t>> seen;
  for (const auto& r : records) {
    EXPECT_TRUE(seen[r.instance].insert(r.index).second) << r.instance << " #" << r.index << " ended twice";
    if (all_granted) {
      EXPECT_EQ(r.outcome, "granted") << r.instance << " #" << r.index << ": " << r.reason;
    } else {
      EXPECT_TRUE(r.outcome == "granted" || r.outcome == "timed_out" || r.outcome == "cancelled")
          << r.instance << " #" << r.index << ": " << r.outcome << " " << r.reason;
    }
  }
  ASSERT_EQ(records.size(), expected) << "every request ended once";
  const auto f = fairgate::bench::analyze(records, kCap);
  EXPECT_EQ(f.overshoot, 0u) << "at most " << kCap << " holders at once, saw " << f.max_holders;
  EXPECT_EQ(f.max_holders, kCap) << "the cap was reached (the queue was exercised)";
}

// 3 TLS-only masters; the client learns the nodes from CLUSTER SLOTS asked
// over TLS (which names the TLS ports), and runs one limiter on each master:
// 4 processes x 30 requests each, overshoot 0, every request ends once,
// nothing left on any master.
TEST(TlsCluster, LimitersOnThreeMastersOverTls) {
  RedisCluster::Options co;
  co.tls = tls();
  RedisCluster cluster(co);
  ASSERT_EQ(cluster.url().rfind("rediss+cluster://", 0), 0u) << cluster.url();
  // Asked over TLS, CLUSTER SLOTS names the TLS ports (the plain ports are 0).
  const std::string slots = cluster.node(0).command({"CLUSTER", "SLOTS"});
  for (std::size_t m = 0; m < 3; ++m)
    EXPECT_NE(slots.find("\n" + std::to_string(cluster.node(m).port()) + "\n"), std::string::npos) << slots;

  std::vector<std::string> names;
  for (std::size_t m = 0; m < 3; ++m) names.push_back(cluster.name_on(m, "tlsc" + std::to_string(m)));
  std::vector<WorkerOptions> workers;
  for (const auto& name : names) {
    for (int i = 0; i < 4; ++i) {
      auto o = worker(cluster.url(), "tc", name, i);
      o.requests = 30;
      o.spread = 1000ms;
      o.hold_min = 5ms;
      o.hold_max = 25ms;
      o.max_wait = 20s;
      workers.push_back(o);
    }
  }
  Fleet fleet(FAIRGATE_BIN, workers,
              [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
  fleet.wait_for("ready", fleet.size(), 30s);
  std::vector<RequestRecord> records;
  fleet.send_all("go");
  fleet.wait_for("done", fleet.size(), 90s, &records);
  fleet.exit_all();
  for (std::size_t m = 0; m < names.size(); ++m) {
    SCOPED_TRACE(names[m]);
    std::vector<RequestRecord> mine;
    for (const auto& r : records)
      if (r.instance.rfind(names[m] + "-p", 0) == 0) mine.push_back(r);
    check_records(mine, 4 * 30, true);
    const std::string holders = "tc:{" + names[m] + "}:holders";
    EXPECT_TRUE(wait_until(
        [&] { return cluster.command_for(holders, fairgate::test::count_command(holders)) == "0"; }, 5s));
    // The limiter's state is on the master its tag hashes to, reached over TLS.
    EXPECT_EQ(cluster.owner_of_slot(cluster.slot_of(holders)), static_cast<int>(m));
    EXPECT_EQ(cluster.node(m).command({"EXISTS", "tc:{" + names[m] + "}:cfg"}), "1");
  }
}

// `fairgate bench --redis rediss+cluster://...`: the load generator takes
// Cluster and TLS URLs too (its bookkeeping client routes by the limiter's
// slot): W1's figures, nothing left, and Redis-side commands per grant
// counted on the limiter's own master (the same range as on one server).
TEST(TlsCluster, BenchRunsOnATlsCluster) {
  RedisCluster::Options co;
  co.tls = tls();
  RedisCluster cluster(co);
  fairgate::bench::Child bench(
      {FAIRGATE_BIN, "bench", "--redis", cluster.url(), "--workload", "W1", "--prefix", "tb", "--quiet"});
  const auto line = bench.next_line(90s);
  ASSERT_TRUE(line) << "no output";
  const auto status = bench.wait(30s);
  ASSERT_TRUE(status);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  const auto v = boost::json::parse(*line).as_object();
  EXPECT_EQ(v.at("workload").as_string(), "W1");
  EXPECT_EQ(v.at("grants").to_number<int>(), 10) << *line;
  EXPECT_EQ(v.at("overshoot").to_number<int>(), 0);
  EXPECT_EQ(v.at("max_holders").to_number<int>(), 3);
  EXPECT_EQ(v.at("leftover_holders").to_number<int>(), 0);
  EXPECT_EQ(v.at("leftover_waiters").to_number<int>(), 0);
  const double per_grant = v.at("redis_cmds_per_grant").to_number<double>();
  EXPECT_GT(per_grant, 5.0) << "counted on the master that ran the limiter";
  EXPECT_LT(per_grant, 40.0);
  std::printf("%s\n", line->c_str());
}

// 1 master, 1 replica, 3 sentinels, all TLS-only: the client asks the
// sentinels over TLS, reaches the master over TLS, and after kill -9 of the
// master follows the promoted replica; every request ends granted, once,
// overshoot 0.
TEST(TlsSentinel, MasterFoundAndFailoverFollowedOverTls) {
  RedisSentinels sentinels("tlsmaster", 1000ms, tls());
  ASSERT_EQ(sentinels.url().rfind("rediss+sentinel://", 0), 0u) << sentinels.url();
  std::vector<WorkerOptions> workers;
  for (int i = 0; i < 3; ++i) {
    auto o = worker(sentinels.url(), "ts", "tlss", i);
    o.requests = 60;
    o.spread = 5000ms;
    o.hold_min = 10ms;
    o.hold_max = 40ms;
    o.max_wait = 30s;
    workers.push_back(o);
  }
  Fleet fleet(FAIRGATE_BIN, workers,
              [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
  fleet.wait_for("ready", fleet.size(), 30s);
  EXPECT_EQ(sentinels.master_index(), 0);
  std::vector<RequestRecord> records;
  fleet.send_all("go");
  std::this_thread::sleep_for(2000ms);  // past the new limiter's recovery fence
  const std::int64_t killed_at = fairgate::bench::now_ns();
  sentinels.data(0).kill_hard();
  ASSERT_TRUE(wait_until([&] { return sentinels.master_index() == 1; }, 30s)) << "the replica was promoted";
  const double failover_ms = static_cast<double>(fairgate::bench::now_ns() - killed_at) / 1e6;
  fleet.wait_for("done", fleet.size(), 90s, &records);
  fleet.exit_all();
  check_records(records, 180, true);
  std::size_t after = 0;
  for (const auto& r : records)
    if (r.outcome == "granted" && r.grant_ns > killed_at) ++after;
  EXPECT_GT(after, 0u) << "grants went on on the promoted replica, over TLS";
  EXPECT_TRUE(wait_until(
      [&] { return sentinels.data(1).command(fairgate::test::count_command("ts:{tlss}:holders")) == "0"; },
      5s));
  std::printf("TLS Sentinel: failover seen after %.0f ms, %zu grants after the kill\n", failover_ms, after);
}

// The start check over TLS (docs/redis-acl.md: ACL users are per node): on a
// TLS Cluster it asks a seed's CLUSTER SLOTS over TLS and so reaches the
// master that is not among the URL's two seeds; behind TLS sentinels it asks
// them over TLS for the master. A user with another key pattern there is an
// error at `fairgate serve` start naming that node; the documented user starts.
// (Before, both were left out over TLS: serve started, and every call was refused.)
TEST(TlsCluster, TheStartCheckReachesEveryMasterOverTls) {
  RedisCluster::Options co;
  co.tls = tls();
  RedisCluster cluster(co);
  const std::string user = "fg-tls-start";
  for (std::size_t m = 0; m < 2; ++m)
    ASSERT_EQ(cluster.node(m).command(fairgate::test::documented_acl(user, "pw")), "OK");
  ASSERT_EQ(cluster.node(2).command(fairgate::test::documented_acl(user, "pw", "other")), "OK");
  std::string url = cluster.url();
  url.insert(url.find("://") + 3, user + ":pw@");
  const auto target = std::get<fairgate::redis::Target>(fairgate::redis::parse_target(url));
  ASSERT_EQ(target.nodes.size(), 2u) << "two seeds: the third master is found, not given";
  ASSERT_TRUE(target.nodes.front().tls.enabled);
  const auto masters = fairgate::redis::cluster_masters(target.nodes.front(), 2s);
  std::set<std::uint16_t> ports;
  for (const auto& m : masters) ports.insert(m.port);
  EXPECT_EQ(ports, (std::set<std::uint16_t>{cluster.node(0).port(), cluster.node(1).port(),
                                            cluster.node(2).port()}));

  const std::string name = cluster.name_on(2, "start");
  fairgate::redis::Endpoint third = target.nodes.front();
  third.port = cluster.node(2).port();
  const std::string line = fairgate::redis::denied_line(
      third, "NOPERM this user has no permissions to access one of the keys used as arguments");
  const auto probe = fairgate::redis::start_probe("fairgate", {name}, {});
  EXPECT_EQ(fairgate::redis::cluster_start_problem(target.nodes, 2s, probe), line);
  fairgate::test::expect_serve_refuses_at_start(url, line, name + "=2");

  ASSERT_EQ(cluster.node(2).command(fairgate::test::documented_acl(user, "pw")), "OK");
  EXPECT_EQ(fairgate::redis::cluster_start_problem(target.nodes, 2s, probe), std::nullopt);
}

TEST(TlsSentinel, TheStartCheckAsksTheSentinelsAndTheMasterOverTls) {
  RedisSentinels sentinels("tlsstart", 1000ms, tls());
  fairgate::test::expect_sentinel_start_check(sentinels, "fg-tls-start");
}

}  // namespace
