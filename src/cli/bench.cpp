// fairgate bench — the load generator of docs/bench.md against a real Redis, with
// every instance a separate process; and the hidden bench-worker it starts.
#include "bench/driver.hpp"
#include "bench/process.hpp"
#include "bench/worker.hpp"
#include "cli/command.hpp"
#include "cli/duration.hpp"
#include "cli/parse.hpp"
#include "redis/url.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace fairgate::cli {
namespace {

using std::chrono::milliseconds;

struct BenchFlags {
  std::string system = "fairgate";
  std::string peers = "bench/peers";
  std::string redis;
  std::string workload = "all";
  std::string instances;
  std::string waiters;
  std::string duration = "10s";
  std::string prefix = "fairgate-bench";
  std::string heartbeat = "1s";
  std::string ttl = "3s";
  std::string crash_bound = "15s";
  std::string seed = "1";
  std::string records;
  bool quiet = false;
};

constexpr std::string_view kBenchDescription =
    "Runs the workloads of docs/bench.md against a Redis server, each instance a separate process\n"
    "(`fairgate bench-worker`), and prints one JSON line per workload on stdout:\n"
    "  W1  10 users, 3 seats: N = 3, 2 instances, 10 requests at once, 300 ms each\n"
    "  W2  burst: N = 3, 4 instances x 50 requests arriving over 1 s, 20-80 ms each\n"
    "  W3  throughput: N = 8, 4 instances, zero-length work, --duration long;\n"
    "      --waiters K keeps about K requests queued (the scaling runs)\n"
    "  W4  idle: N = 3 held for --duration while --waiters (1000) wait over 4 instances,\n"
    "      then all are served\n"
    "  W5  many tenants: N = 3, 6 instances, tenant 'heavy' floods 200 requests at once,\n"
    "      light1..light5 send 10 each over 1 s, 20-80 ms each; fairgate runs it twice,\n"
    "      with tenant fairness on and off (two lines), peers once (no fairness)\n"
    "Figures: overshoot (holders above the cap, from the clients' own timestamps), FIFO\n"
    "inversions (pairs arriving and granted > 2 ms apart in opposite order), hand-off latency\n"
    "(release -> next waiter granted, any instance), client round trips and Redis-side\n"
    "commands (INFO commandstats, inside scripts included) per grant, idle commands/s (W4),\n"
    "grants/s. The limiter's keys are removed afterwards. Use a Redis nobody else loads:\n"
    "commandstats count every client. Progress goes to stderr.";

bench::BenchOptions make_bench_options(const BenchFlags& f) {
  bench::BenchOptions o;
  if (f.redis.empty()) throw UsageError("--redis: required, e.g. --redis redis://127.0.0.1:6379");
  const auto url = redis::parse_target(f.redis);
  if (const auto* problem = std::get_if<std::string>(&url)) throw UsageError("--redis: " + *problem);
  const auto& target = std::get<redis::Target>(url);
  if (f.system != "fairgate" &&
      (target.kind != redis::Target::Kind::standalone || target.nodes.front().tls.enabled))
    throw UsageError("--redis: Cluster, Sentinel and TLS URLs work with --system fairgate only");
  o.redis_url = f.redis;
  if (std::find(bench::kSystems.begin(), bench::kSystems.end(), f.system) == bench::kSystems.end()) {
    throw UsageError("--system: " + cli::quoted(f.system) +
                     " is not one of fairgate, seed, bottleneck, semaphore, bullmq");
  }
  o.system = f.system;
  o.peers_dir = f.peers;
  if (o.system != "fairgate" && !std::filesystem::exists(o.peers_dir + "/worker.js"))
    throw UsageError("--peers: no worker.js in " + cli::quoted(o.peers_dir) +
                     " (run from the repository root)");
  if (!f.instances.empty()) o.instances = checked("--instances", parse_count(f.instances, 1, 64));
  if (!f.waiters.empty()) o.waiters = checked("--waiters", parse_count(f.waiters, 1, 100000));
  o.duration = checked("--duration", parse_duration(f.duration));
  if (o.duration < milliseconds(100) || o.duration > milliseconds(3600000))
    throw UsageError("--duration: " + format_duration(o.duration) + " not in 100ms..1h");
  o.heartbeat_interval = checked("--heartbeat", parse_duration(f.heartbeat));
  o.liveness_ttl = checked("--ttl", parse_duration(f.ttl));
  o.crash_bound = checked("--crash-bound", parse_duration(f.crash_bound));
  if (o.crash_bound < milliseconds(100) || o.crash_bound > milliseconds(600000))
    throw UsageError("--crash-bound: " + format_duration(o.crash_bound) + " not in 100ms..10m");
  if (o.heartbeat_interval < milliseconds(10)) throw UsageError("--heartbeat: must be at least 10ms");
  if (o.liveness_ttl <= o.heartbeat_interval) throw UsageError("--ttl: must be longer than --heartbeat");
  if (f.prefix.empty() || f.prefix.find_first_of("{} ") != std::string::npos)
    throw UsageError("--prefix: must be non-empty, without braces or spaces");
  o.key_prefix = f.prefix;
  o.seed = checked("--seed", parse_count(f.seed, 0, UINT32_MAX));
  o.records_path = f.records;
  o.worker_executable = bench::self_executable();
  return o;
}

int run_bench(const BenchFlags& flags) {
  bench::BenchOptions options = make_bench_options(flags);
  std::vector<std::string> workloads;
  if (flags.workload == "all") {
    workloads = bench::kWorkloads;
  } else {
    for (const auto& w : bench::kWorkloads)
      if (w == flags.workload) workloads.push_back(w);
    if (workloads.empty())
      throw UsageError("--workload: " + cli::quoted(flags.workload) +
                       " is not one of W1, W2, W3, W4, W5, crash, all");
  }
  const auto log = [&](const std::string& line) {
    if (flags.quiet) return;
    std::fputs(("fairgate bench: " + line + "\n").c_str(), stderr);
  };
  for (const auto& w : workloads) {
    options.workload = w;
    const std::string line = bench::run_workload(options, log);
    std::fputs((line + "\n").c_str(), stdout);
    std::fflush(stdout);
  }
  return kExitOk;
}

}  // namespace

Command add_bench_command(CLI::App& root) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* app =
      root.add_subcommand("bench", "Load generator: the workloads of docs/bench.md against a Redis");
  app->footer(std::string(kBenchDescription));
  app->add_option("--redis", flags->redis,
                  "Redis to measure (required): redis://[user:password@]host:port[/db], "
                  "redis+cluster://host:port[,...] "
                  "(the limiter's master), redis+sentinel://host:port[,...]/master, rediss... for TLS")
      ->type_name("URL");
  app->add_option(
         "--system", flags->system,
         "fairgate, or a peer run through the same workloads: seed (the design fairgate replaces: a "
         "Redis sorted-set queue polled in front of a Redisson-style semaphore), bottleneck, semaphore, "
         "bullmq (Node; bench/run.sh installs their packages)")
      ->type_name("NAME")
      ->default_str("fairgate");
  app->add_option("--peers", flags->peers, "Directory of the peer workers (worker.js)")
      ->type_name("DIR")
      ->default_str(flags->peers);
  app->add_option("--workload", flags->workload, "W1, W2, W3, W4, W5, crash or all")
      ->type_name("W")
      ->default_str("all");
  app->add_option("--instances", flags->instances, "Instances (processes); default: the workload's")
      ->type_name("N");
  app->add_option("--waiters", flags->waiters,
                  "W3: requests kept queued (default 8); W4: waiters (default 1000)")
      ->type_name("K");
  app->add_option("--duration", flags->duration, "W3 run time and W4 idle window")
      ->type_name("DURATION")
      ->default_str(flags->duration);
  app->add_option("--heartbeat", flags->heartbeat, "Heartbeat interval of the instances")
      ->type_name("DURATION")
      ->default_str(flags->heartbeat);
  app->add_option("--ttl", flags->ttl, "Liveness TTL of the instances")
      ->type_name("DURATION")
      ->default_str(flags->ttl);
  app->add_option("--crash-bound", flags->crash_bound,
                  "crash: how long to wait after the kill for the waiters' grants")
      ->type_name("DURATION")
      ->default_str(flags->crash_bound);
  app->add_option("--prefix", flags->prefix, "Key prefix of the benchmark's limiters")
      ->type_name("TEXT")
      ->default_str(flags->prefix);
  app->add_option("--seed", flags->seed, "Seed for arrivals and hold times")
      ->type_name("N")
      ->default_str("1");
  app->add_option("--records", flags->records, "Append every request's record (JSON lines) to FILE")
      ->type_name("FILE");
  app->add_flag("-q,--quiet", flags->quiet, "No progress on stderr");
  return Command{app, [flags]() { return run_bench(*flags); }};
}

Command add_bench_worker_command(CLI::App& root) {
  struct Flags {
    bench::WorkerOptions o;
    long heartbeat_ms = 1000, ttl_ms = 3000, command_timeout_ms = 1000, hold_min_ms = 0, hold_max_ms = 0,
         max_wait_ms = 30000;
    long spread_ms = 0, duration_ms = 0;
    long recovery_fence_ms = -1, degrade_after_ms = 1000, recover_after_ms = 1000, reject_pause_ms = 50;
    long local_share = -1;
    long max_per_tenant = -1;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand("bench-worker", "One instance of `fairgate bench` (internal)");
  app->group("");  // hidden from --help
  app->add_option("--redis", f->o.redis_url)->required();
  app->add_option("--prefix", f->o.key_prefix);
  app->add_option("--limiter", f->o.limiter)->required();
  app->add_option("--instance", f->o.instance_id)->required();
  app->add_option("--max-concurrent", f->o.max_concurrent);
  app->add_option("--heartbeat-ms", f->heartbeat_ms);
  app->add_option("--ttl-ms", f->ttl_ms);
  app->add_option("--command-timeout-ms", f->command_timeout_ms);
  app->add_option("--requests", f->o.requests);
  app->add_option("--spread-ms", f->spread_ms);
  app->add_option("--clients", f->o.clients);
  app->add_option("--duration-ms", f->duration_ms);
  app->add_option("--hold-min-ms", f->hold_min_ms);
  app->add_option("--hold-max-ms", f->hold_max_ms);
  app->add_option("--max-wait-ms", f->max_wait_ms);
  app->add_option("--cancel-fraction", f->o.cancel_fraction);
  app->add_option("--timeout-fraction", f->o.timeout_fraction);
  app->add_option("--holders", f->o.holders);
  app->add_option("--seed", f->o.seed);
  app->add_option("--tenant", f->o.tenant);
  app->add_option("--tenant-fairness", f->o.tenant_fairness);
  app->add_option("--max-per-tenant", f->max_per_tenant);
  app->add_option("--on-redis-down", f->o.on_redis_down)->check(CLI::IsMember({"local", "open", "closed"}));
  app->add_option("--local-share", f->local_share);
  app->add_option("--recovery-fence-ms", f->recovery_fence_ms);
  app->add_option("--degrade-after-ms", f->degrade_after_ms);
  app->add_option("--recover-after-ms", f->recover_after_ms);
  app->add_option("--reject-pause-ms", f->reject_pause_ms);
  app->add_flag("--announce", f->o.announce);
  return Command{app, [f]() {
                   bench::WorkerOptions o = f->o;
                   o.heartbeat_interval = milliseconds(f->heartbeat_ms);
                   o.liveness_ttl = milliseconds(f->ttl_ms);
                   o.command_timeout = milliseconds(f->command_timeout_ms);
                   o.hold_min = milliseconds(f->hold_min_ms);
                   o.hold_max = milliseconds(f->hold_max_ms);
                   o.max_wait = milliseconds(f->max_wait_ms);
                   o.spread = milliseconds(f->spread_ms);
                   o.duration = milliseconds(f->duration_ms);
                   o.closed_loop = o.clients > 0;
                   if (f->recovery_fence_ms >= 0) o.recovery_fence = milliseconds(f->recovery_fence_ms);
                   if (f->local_share >= 0) o.local_share = static_cast<std::uint32_t>(f->local_share);
                   if (f->max_per_tenant >= 0)
                     o.max_per_tenant = static_cast<std::uint32_t>(f->max_per_tenant);
                   o.degrade_after = milliseconds(f->degrade_after_ms);
                   o.recover_after = milliseconds(f->recover_after_ms);
                   o.reject_pause = milliseconds(f->reject_pause_ms);
                   return bench::run_worker(o);
                 }};
}

}  // namespace fairgate::cli
