// bench/worker.hpp — one benchmark instance, run as its own process
// (`fairgate bench-worker`, hidden; started by `fairgate bench` and by the
// multi-process tests).
//
// It opens one limiter on the Redis backend, prints {"ev":"ready",...} once
// its wake channel is subscribed and a heartbeat was answered, then obeys
// command lines on stdin:
//   go       start the workload (open loop: `requests` arrivals spread over
//            `spread`; closed loop: `clients` acquire/hold/release loops for
//            `duration`); one {"ev":"req",...} line per request (record.hpp),
//            {"ev":"queued_all"} once every request was queued or ended,
//            then {"ev":"done","t":ns,"commands":n,"lost_wakes_recovered":n}
//   hold     acquire `holders` permits and keep them: {"ev":"holding",...}
//   release  release them: {"ev":"released",...}
//   mark     {"ev":"mark","t":ns,"commands":n} (commands sent to Redis so far)
//   stop     closed loop: start no more requests ("done" once the running ones end)
//   status   {"ev":"status",...}: the limiter's engine status on this instance
//            (degraded, restores, fence_left_ms, in_use, queued, ...)
//   exit     (or EOF) leave the queue, release everything, exit 0
// With `announce`, every grant and every release is also printed (and
// flushed) when it happens, {"ev":"grant"|"release","i":index,"t":ns} — the
// release before Redis hears of it —, so a parent that kills this process
// with -9 knows exactly which permits it held (the fault-injection tests).
// Timestamps are CLOCK_MONOTONIC nanoseconds (record.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace fairgate::bench {

struct WorkerOptions {
  /// "fairgate" (this program's bench-worker) or a peer of bench/peers/worker.js.
  std::string system = "fairgate";
  /// Where bench/peers/worker.js is (peers only).
  std::string peers_dir = "bench/peers";
  std::string redis_url;
  std::string key_prefix = "fairgate-bench";
  std::string limiter = "bench";
  std::string instance_id;  ///< also the "inst" of every record
  std::uint32_t max_concurrent = 3;
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds liveness_ttl{3000};
  std::chrono::milliseconds command_timeout{1000};

  bool closed_loop = false;
  std::size_t requests = 0;               ///< open loop: how many requests
  std::chrono::milliseconds spread{0};    ///< open loop: arrivals uniform in [0, spread)
  std::size_t clients = 0;                ///< closed loop: concurrent loops
  std::chrono::milliseconds duration{0};  ///< closed loop: how long
  std::chrono::milliseconds hold_min{0}, hold_max{0};
  std::chrono::milliseconds max_wait{30000};
  double cancel_fraction = 0;   ///< open loop: cancelled at a random moment while waiting
  double timeout_fraction = 0;  ///< open loop: given a short max_wait (10..100 ms)
  std::size_t holders = 0;      ///< permits the `hold` command takes
  std::uint64_t seed = 1;
  /// fairgate only: the tenant of every request of this worker (F12, W5)...
  std::string tenant;
  /// ...and whether the limiter runs with tenant fairness (its first heartbeat
  /// creates the limiter's config, so every worker of a run passes the same).
  bool tenant_fairness = false;
  /// ...and its max_per_tenant (unset: none).
  std::optional<std::uint32_t> max_per_tenant;
  /// Recovery and degraded modes (RedisBackendOptions, Settings::on_redis_down).
  std::string on_redis_down = "local";
  std::optional<std::uint32_t> local_share;
  std::optional<std::chrono::milliseconds> recovery_fence;  ///< unset: the backend's default
  std::chrono::milliseconds degrade_after{1000};
  std::chrono::milliseconds recover_after{1000};
  /// Print {"ev":"grant",...} at every grant.
  bool announce = false;
  /// Closed loop: pause after a request that ended without a permit (so a
  /// limiter that rejects at once does not make a client spin).
  std::chrono::milliseconds reject_pause{50};
};

/// Runs the worker on this thread until `exit` or EOF on stdin. Returns the exit code.
int run_worker(const WorkerOptions& options);

}  // namespace fairgate::bench
