// tests/faults/harness.hpp — real fairgate instances (`fairgate bench-worker`
// processes) on a real redis-server, with faults injected for real, judged
// from the clients' own timestamps. Used by the fault-injection suite
// (faults_test.cpp, label "faults") and by the figures program
// (fault_cycles.cpp, bench/faults.sh).
//
// What a run checks (Report::problems), for every fault:
//  * overshoot 0: at no instant more granted→released intervals overlap than
//    the cap. The intervals are the clients' own (grant seen after Redis made
//    it, release noted before Redis hears of it), so they lie inside the true
//    ones: an overlap seen here is a real overshoot. A worker killed with -9
//    holds what it announced until the moment of the kill.
//  * every request of a live instance ends exactly once (one record each, none
//    missing: a request stranded in a queue never ends and is reported);
//  * no request of a live instance times out or is rejected "unavailable"
//    (the workloads' max wait is far longer than any fault: a waiter that
//    waits past it while permits are free, or a hiccup turned into a
//    rejection, shows here) — unless the run expects it (policy closed);
//  * Redis holds 0 permits and 0 waiters once every instance has left;
//  * no instance took the fault for another process with its instance id
//    (EngineStatus::instance_id_shared 0).
#pragma once

#include "bench/fleet.hpp"
#include "bench/process.hpp"
#include "bench/record.hpp"
#include "bench/worker.hpp"
#include "support/netns.hpp"
#include "support/redis_server.hpp"
#include "support/tcp_proxy.hpp"

#include <boost/json/object.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace fairgate::faults {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

/// The workload and the instances' settings of one run.
struct RunOptions {
  std::string limiter = "faults";
  std::uint32_t cap = 3;
  milliseconds heartbeat{250};
  milliseconds ttl{1000};
  milliseconds command_timeout{300};
  std::optional<milliseconds> fence;  ///< unset: the backend's default (ttl + heartbeat)
  milliseconds degrade_after{1000};
  milliseconds recover_after{500};
  std::string policy = "local";
  std::optional<std::uint32_t> local_share;
  /// Tenants: each instance's requests are of its own tenant ("t1", "t2", …).
  bool tenant_per_instance = false;
  bool tenant_fairness = false;
  std::optional<std::uint32_t> max_per_tenant;
  std::size_t clients = 3;  ///< closed-loop clients per instance
  milliseconds hold_min{20}, hold_max{80};
  milliseconds max_wait{30000};
  milliseconds duration{5000};  ///< each client loops this long after "go"
};

/// How an instance reaches Redis.
enum class Route {
  direct,  ///< 127.0.0.1:port
  proxy,   ///< through the cluster's TcpProxy (delay, stall, cut)
  netns,   ///< from the cluster's network namespace (partition with nftables)
};

/// One bench-worker process.
class Worker {
 public:
  Worker(const std::string& executable, bench::WorkerOptions options, std::vector<std::string> prefix);
  const std::string& id() const { return options_.instance_id; }
  bool killed() const { return kill_ns_.has_value(); }
  void send(const std::string& line) { child_->send(line); }
  /// kill -9; what it held counts as held until now.
  void kill9();
  /// Reads lines until an event `ev` arrives (records and grants met on the
  /// way are kept). nullopt after `timeout` or when the process ended.
  std::optional<boost::json::object> wait_event(const std::string& ev, milliseconds timeout);
  /// "status" → the limiter's engine status on this instance.
  std::optional<boost::json::object> status(milliseconds timeout = std::chrono::seconds(5));
  /// Reads whatever has arrived, without waiting.
  void drain();
  /// "exit", then waits for the process to end (SIGKILL after `timeout`).
  bool exit(milliseconds timeout);

  const std::vector<bench::RequestRecord>& records() const { return records_; }
  const std::map<std::uint64_t, std::int64_t>& grants() const { return grants_; }
  const std::map<std::uint64_t, std::int64_t>& releases() const { return releases_; }
  std::optional<std::int64_t> kill_ns() const { return kill_ns_; }
  /// Requests started, from the "done" event (nullopt before it).
  std::optional<std::uint64_t> requests() const { return requests_; }

 private:
  void take(const std::string& line);

  bench::WorkerOptions options_;
  std::unique_ptr<bench::Child> child_;
  std::vector<bench::RequestRecord> records_;
  std::map<std::uint64_t, std::int64_t> grants_;    // announced: index → grant ns
  std::map<std::uint64_t, std::int64_t> releases_;  // announced: index → release ns
  std::vector<boost::json::object> events_;         // not yet asked for
  std::optional<std::int64_t> kill_ns_;
  std::optional<std::uint64_t> requests_;
};

/// What a run did, from the records, and what broke.
struct Report {
  std::size_t instances = 0, killed = 0;
  std::size_t requests = 0, grants = 0, timeouts = 0, cancels = 0, rejections = 0, unavailable = 0;
  std::size_t max_holders = 0, overshoot = 0;
  std::size_t lost = 0;  ///< requests of live instances that never ended (or ended twice)
  long redis_holders = -1, redis_waiters = -1;
  std::vector<std::string> problems;
  bool ok() const { return problems.empty(); }
  std::string summary() const;
};

/// A redis-server and the instances of one run.
class Cluster {
 public:
  /// `with_netns`: a network namespace is made first and Redis also listens on
  /// its host-side address, for instances started with Route::netns.
  Cluster(RunOptions options, test::RedisServer::Options redis = {}, bool with_netns = false);
  ~Cluster();

  test::RedisServer& redis() { return *redis_; }
  const RunOptions& options() const { return options_; }
  /// The proxy of Route::proxy (created on first use).
  test::TcpProxy& proxy();
  /// The network namespace of Route::netns (created on first use; throws if
  /// the machine cannot make one).
  test::NetNamespace& netns();

  /// Starts an instance and waits until it is ready (registered, subscribed).
  Worker& start(Route route = Route::direct, std::optional<RunOptions> override = {});
  /// "go" to every instance that is not killed.
  void go();
  std::vector<Worker*> live();
  std::vector<Worker*> all();
  std::string key(const std::string& what) const;
  long zcard(const std::string& what);
  /// The permit ids ("inst|n") of the members of the zset `what` (holders, queue).
  std::set<std::string> permit_ids(const std::string& what);

  /// Waits until every live instance reports not degraded and Redis holds
  /// exactly the permits and waiters they have (tenant-aware: and every
  /// waiting tenant is ready or parked); the time it took, or nullopt.
  std::optional<milliseconds> wait_whole(milliseconds timeout);
  /// A tenant with a waiter in the queue that is neither ready nor parked
  /// (stranded: no dispatch would serve it), or "" when there is none.
  std::string unplaced_tenant();

  /// Waits for every live instance's "done", lets the heartbeats reap killed
  /// ones, sends "exit", then checks Redis is empty and analyzes every record.
  /// `expect_unavailable`: rejections "unavailable" are the policy's answer
  /// (closed) and not a problem. `overshoot_allowed`: policy open.
  Report finish(milliseconds timeout, bool expect_unavailable = false, bool overshoot_allowed = false);

 private:
  RunOptions options_;
  std::unique_ptr<test::RedisServer> redis_;
  std::unique_ptr<test::TcpProxy> proxy_;
  std::unique_ptr<test::NetNamespace> netns_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::size_t started_ = 0;
};

/// What makes a Redis refuse calls for a while (docs/faults.md, "Redis
/// refuses writes"): out of memory (maxmemory 1 under noeviction), a failed
/// RDB snapshot (a save point and the save directory moved to /proc), too few
/// replicas (min-replicas-to-write 1), another client's script looping past
/// a 100 ms busy-reply-threshold.
enum class Refusal { oom, misconf, noreplicas, busy };

/// The redis-server options a Cluster needs for every Refusal (misconf moves
/// the save directory: a protected config).
test::RedisServer::Options refusal_redis_options();

/// While it lives, `c`'s Redis refuses calls with `kind`'s answer. The
/// constructor returns once a probe write is refused so, and throws
/// std::runtime_error if it is not within 10 s; end() takes it back and
/// throws unless a write then works (the destructor does it too, quietly).
class Refusing {
 public:
  Refusing(Cluster& c, Refusal kind);
  ~Refusing();
  Refusing(const Refusing&) = delete;
  Refusing& operator=(const Refusing&) = delete;
  void end();

 private:
  void lift();
  Cluster& c_;
  Refusal kind_;
  std::string dir_;         // misconf: the save directory to go back to
  std::string script_end_;  // busy: what the looping EVAL answered in the end
  std::thread runaway_;     // busy: the client running it
  bool ended_ = false;
};

/// The `fairgate` binary (the worker executable): $FAIRGATE_BIN, else the one built with the harness.
std::string fairgate_binary();

/// Holders at once from [grant, release] intervals (release first on ties).
std::size_t max_concurrent(std::vector<std::pair<std::int64_t, std::int64_t>> intervals);

}  // namespace fairgate::faults
