// cluster_scaling — the scaling figures of docs/redis-cluster.md (bench/cluster.sh):
// busy limiters on ONE standalone redis-server vs the same limiters spread over a
// 3-master Redis Cluster, in the same run, both started here on loopback ports.
// Each limiter gets one `fairgate bench-worker` process running a closed loop
// (`--clients` loops acquire, hold 0..1 ms, release) for `--duration`. Prints one
// JSON line per (target, limiters): grants/s, Redis-side commands per grant
// (INFO commandstats summed over every node, commands inside scripts included),
// client round trips per grant, max holders and overshoot per limiter.
//   usage: cluster_scaling [--limiters "3 12"] [--duration-ms 5000] [--clients 4] [--cap 3]
#include "bench/fleet.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using fairgate::bench::Fleet;
using fairgate::bench::RequestRecord;
using fairgate::bench::WorkerOptions;
using fairgate::test::RedisCluster;
using fairgate::test::RedisServer;
namespace json = boost::json;

/// Sum of cmdstat_*:calls= of INFO commandstats, minus the CONFIG RESETSTAT of this program
/// (this INFO is counted only after it ran; the INFO replication a script runs
/// before a grant counts, like every command inside a script).
long long redis_calls(const RedisServer& s) {
  const std::string text = s.command({"INFO", "commandstats"});
  long long total = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("cmdstat_", 0) != 0) continue;
    if (line.rfind("cmdstat_config", 0) == 0) continue;
    const auto at = line.find("calls=");
    if (at != std::string::npos) total += std::atoll(line.c_str() + at + 6);
  }
  return total;
}

struct Target {
  std::string kind, url;
  std::vector<RedisServer*> nodes;
};

json::object run(const Target& t, const std::vector<std::string>& names, std::chrono::milliseconds duration,
                 std::size_t clients, std::uint32_t cap, const std::string& bin) {
  const int limiters = static_cast<int>(names.size());
  std::vector<WorkerOptions> workers;
  for (int l = 0; l < limiters; ++l) {
    WorkerOptions o;
    o.redis_url = t.url;
    o.key_prefix = "scale";
    o.limiter = names[static_cast<std::size_t>(l)];
    o.instance_id = o.limiter + "-w";
    o.max_concurrent = cap;
    o.closed_loop = true;
    o.clients = clients;
    o.duration = duration;
    o.hold_min = 0ms;
    o.hold_max = 1ms;
    o.max_wait = 30s;
    // New limiters, nobody held anything before: no recovery fence to wait out.
    o.recovery_fence = 0ms;
    o.seed = static_cast<std::uint64_t>(l + 1);
    workers.push_back(o);
  }
  Fleet fleet(bin, workers, [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
  fleet.wait_for("ready", fleet.size(), 60s);
  const std::uint64_t cmds0 = fleet.commands();
  for (auto* n : t.nodes) n->command({"CONFIG", "RESETSTAT"});
  std::vector<RequestRecord> records;
  fleet.send_all("go");
  fleet.wait_for("done", fleet.size(), duration + 60s, &records);
  long long calls = 0;
  for (auto* n : t.nodes) calls += redis_calls(*n);
  const std::uint64_t cmds = fleet.commands() - cmds0;
  fleet.exit_all();
  std::map<std::string, std::vector<RequestRecord>> by_limiter;
  std::size_t grants = 0;
  for (const auto& r : records) {
    by_limiter[r.instance].push_back(r);
    if (r.outcome == "granted") ++grants;
  }
  std::size_t overshoot = 0, max_holders = 0;
  for (auto& [inst, rs] : by_limiter) {
    const auto f = fairgate::bench::analyze(rs, cap);
    overshoot = std::max(overshoot, f.overshoot);
    max_holders = std::max(max_holders, f.max_holders);
  }
  const double seconds = static_cast<double>(duration.count()) / 1000.0;
  json::object o;
  o["target"] = t.kind;
  o["masters"] = t.nodes.size();
  o["limiters"] = limiters;
  o["clients_per_limiter"] = clients;
  o["cap"] = cap;
  o["duration_s"] = seconds;
  o["grants"] = grants;
  o["grants_per_s"] = static_cast<double>(grants) / seconds;
  o["redis_cmds_per_grant"] = grants ? static_cast<double>(calls) / static_cast<double>(grants) : 0.0;
  o["client_round_trips_per_grant"] = grants ? static_cast<double>(cmds) / static_cast<double>(grants) : 0.0;
  o["max_holders_per_limiter"] = max_holders;
  o["overshoot"] = overshoot;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> counts{3, 12};
  auto duration = 5000ms;
  std::size_t clients = 4;
  std::uint32_t cap = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--limiters") {
      counts.clear();
      std::istringstream in(value);
      for (int n; in >> n;) counts.push_back(n);
    } else if (flag == "--duration-ms") {
      duration = std::chrono::milliseconds(std::stol(value));
    } else if (flag == "--clients") {
      clients = std::stoul(value);
    } else if (flag == "--cap") {
      cap = static_cast<std::uint32_t>(std::stoul(value));
    } else {
      std::fprintf(stderr, "cluster_scaling: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  const char* env = std::getenv("FAIRGATE_BIN");
  const std::string bin = env ? env : FAIRGATE_BIN;
  RedisServer standalone;
  RedisCluster cluster;
  const Target one{"standalone", standalone.url(), {&standalone}};
  const Target three{"cluster", cluster.url(), {&cluster.node(0), &cluster.node(1), &cluster.node(2)}};
  int run_no = 0;
  for (const int n : counts) {
    // The same limiter names on both; on the cluster their hash tags land on
    // the masters in turn (limiter k on master k mod 3).
    std::vector<std::string> names;
    for (int k = 0; k < n; ++k)
      names.push_back(cluster.name_on(static_cast<std::size_t>(k % 3),
                                      "r" + std::to_string(run_no) + "l" + std::to_string(k)));
    for (const Target* t : {&one, &three}) {
      const auto line = run(*t, names, duration, clients, cap, bin);
      std::printf("%s\n", json::serialize(line).c_str());
      std::fflush(stdout);
    }
    ++run_no;
  }
  return 0;
}
