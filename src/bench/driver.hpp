// bench/driver.hpp — `fairgate bench`: runs the workloads of docs/bench.md with
// each instance a separate process, and computes the figures.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace fairgate::bench {

/// The workloads of docs/bench.md that `fairgate bench` runs.
/// `crash`: kill -9 of an instance holding every permit, the time until
/// another instance's waiters are granted.
inline const std::vector<std::string> kWorkloads = {"W1", "W2", "W3", "W4", "W5", "crash"};

/// The systems `fairgate bench --system` can drive: fairgate and the peers of bench/peers/.
inline const std::vector<std::string> kSystems = {"fairgate", "seed", "bottleneck", "semaphore", "bullmq"};

struct BenchOptions {
  std::string system = "fairgate";
  std::string peers_dir = "bench/peers";
  std::string redis_url;
  std::string workload = "W1";
  std::size_t instances = 0;              ///< 0: the workload's own (W1: 2, else 4)
  std::size_t waiters = 0;                ///< W3: clients beyond the cap (0: 8); W4: waiters (0: 1000)
  std::chrono::milliseconds duration{0};  ///< W3 run / W4 idle window (0: 10 s)
  std::string key_prefix = "fairgate-bench";
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds liveness_ttl{3000};
  /// crash: how long the driver waits, after the kill, for the waiters' grants.
  std::chrono::milliseconds crash_bound{15000};
  std::uint64_t seed = 1;
  std::string worker_executable;  ///< the `fairgate` binary (bench-worker)
  /// Where every request record of the run goes, one JSON line each (empty: nowhere).
  std::string records_path;
};

/// Runs one workload and returns its JSON line (no newline; W5 on fairgate:
/// two lines, tenant fairness on then off, separated by a newline). `crash`
/// prints recovery_p50_ms / recovery_max_ms (null: a waiter was not granted
/// within crash_bound), granted, heartbeat_ms, ttl_ms, bound_ms. Progress goes
/// to `log` (may be empty). Throws std::runtime_error on failure (Redis
/// unreachable, a worker died or stalled).
std::string run_workload(const BenchOptions& options, const std::function<void(const std::string&)>& log);

}  // namespace fairgate::bench
