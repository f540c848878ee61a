#include "bench/driver.hpp"

#include "bench/admin.hpp"
#include "bench/fleet.hpp"
#include "bench/process.hpp"
#include "bench/record.hpp"
#include "redis/scripts.hpp"
#include "redis/url.hpp"

#include <fmt/format.h>
#include <boost/json.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>

namespace fairgate::bench {
namespace {

namespace json = boost::json;
using namespace std::chrono_literals;
using std::chrono::milliseconds;

struct Plan {
  std::string workload;
  std::size_t instances = 0;
  std::uint32_t cap = 3;
  bool closed_loop = false;
  std::size_t requests_per_instance = 0;  // open loop
  std::size_t clients_per_instance = 0;   // closed loop
  milliseconds spread{0}, hold_min{0}, hold_max{0}, duration{0};
  milliseconds max_wait{30000};
  std::size_t holders = 0;  // W4: instance 0 holds the cap
  std::size_t waiters = 0;
  bool tenants = false;          // W5: worker 0 is tenant "heavy", the others "light<w>"
  bool tenant_fairness = false;  // W5, fairgate: the limiter's tenant_fairness
};

// W5: what each tenant sends.
constexpr std::size_t kHeavyRequests = 200;
constexpr std::size_t kLightRequests = 10;
constexpr std::size_t kLightTenants = 5;

std::string tenant_of_worker(std::size_t w) { return w == 0 ? "heavy" : fmt::format("light{}", w); }

Plan plan_for(const BenchOptions& o) {
  Plan p;
  p.workload = o.workload;
  const auto split = [](std::size_t total, std::size_t parts) { return (total + parts - 1) / parts; };
  if (o.workload == "W1") {  // 10 users, 3 seats, 2 instances, 300 ms each
    p.instances = o.instances ? o.instances : 2;
    p.requests_per_instance = split(10, p.instances);
    p.hold_min = p.hold_max = 300ms;
  } else if (o.workload == "W2") {  // burst: 4 x 50 over 1 s, 20-80 ms each
    p.instances = o.instances ? o.instances : 4;
    p.requests_per_instance = 50;
    p.spread = 1000ms;
    p.hold_min = 20ms;
    p.hold_max = 80ms;
  } else if (o.workload == "W3") {  // throughput: N = 8, zero-length work
    p.instances = o.instances ? o.instances : 4;
    p.cap = 8;
    p.closed_loop = true;
    p.waiters = o.waiters ? o.waiters : 8;
    p.clients_per_instance = split(p.cap + p.waiters, p.instances);
    p.duration = o.duration.count() ? o.duration : milliseconds(10000);
  } else if (o.workload == "W4") {  // idle: N = 3 held, 1,000 waiters
    p.instances = o.instances ? o.instances : 4;
    p.waiters = o.waiters ? o.waiters : 1000;
    p.requests_per_instance = split(p.waiters, p.instances);
    p.holders = p.cap;
    p.duration = o.duration.count() ? o.duration : milliseconds(10000);
    p.max_wait = p.duration + 120s;
  } else if (o.workload == "W5") {    // many tenants: one floods, five send a little
    p.instances = 1 + kLightTenants;  // one instance (process) per tenant
    p.tenants = true;
    p.hold_min = 20ms;
    p.hold_max = 80ms;
    p.max_wait = 60s;
  } else {
    throw std::invalid_argument("--workload: " + o.workload + ": not one of W1, W2, W3, W4, W5");
  }
  if (p.closed_loop) {
    p.waiters = p.clients_per_instance * p.instances -
                std::min<std::size_t>(p.cap, p.clients_per_instance * p.instances);
  } else if (p.tenants) {
    p.waiters = kHeavyRequests + kLightRequests * kLightTenants;
  } else if (p.workload != "W4") {
    p.waiters = p.requests_per_instance * p.instances;
  }
  return p;
}

/// One JSON object with its keys in insertion order and numbers written
/// plainly (1.25, not 1.25E0).
class JsonLine {
 public:
  template <typename T>
  void set(const std::string& key, T value) {
    std::string text;
    if constexpr (std::is_same_v<T, std::nullptr_t>) {
      text = "null";
    } else if constexpr (std::is_convertible_v<T, std::string_view>) {
      text = json::serialize(json::string(std::string_view(value)));
    } else if constexpr (std::is_floating_point_v<T>) {
      text = std::isfinite(value) ? fmt::format("{}", value) : "null";
    } else {
      text = fmt::format("{}", value);
    }
    set_raw(key, std::move(text));
  }
  /// A JSON array of `number(v)` for each v of `values`, written as set() writes a number.
  template <typename Range, typename Number>
  void set_numbers(const std::string& key, const Range& values, Number number) {
    std::string text = "[";
    for (const auto& v : values) {
      if (text.size() > 1) text += ',';  // piece by piece: g++ 12 -O3 misreads "," + string (-Wrestrict)
      text += fmt::format("{}", number(v));
    }
    set_raw(key, text + "]");
  }
  /// `json` as is (an array, say).
  void set_raw(const std::string& key, std::string json_text) {
    for (auto& [k, v] : fields_) {
      if (k == key) {
        v = std::move(json_text);
        return;
      }
    }
    fields_.emplace_back(key, std::move(json_text));
  }
  std::string str() const {
    std::string out = "{";
    for (const auto& [k, v] : fields_) {
      if (out.size() > 1) out += ',';
      out += json::serialize(json::string(k)) + ':' + v;
    }
    return out + "}";
  }

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

double per(double a, double b) { return b > 0 ? a / b : 0; }
double round3(double v) { return std::round(v * 1000) / 1000; }

// W5's figures per tenant: waits of the heavy and the light tenants, the most
// permits one tenant held at once, FIFO inversions within each tenant.
void tenant_figures(const std::vector<RequestRecord>& records, const std::vector<WorkerOptions>& workers,
                    const Plan& p, JsonLine& out) {
  std::map<std::string, std::string> tenant_of;  // instance id -> tenant
  for (const auto& w : workers) tenant_of[w.instance_id] = w.tenant;
  std::map<std::string, std::vector<RequestRecord>> by_tenant;
  for (const auto& r : records) by_tenant[tenant_of[r.instance]].push_back(r);
  std::vector<std::int64_t> heavy, light;
  std::size_t max_per_tenant = 0;
  std::uint64_t inversions = 0;
  double light_p99_max = 0;
  for (const auto& [tenant, recs] : by_tenant) {
    const Figures f = analyze(recs, p.cap);
    max_per_tenant = std::max(max_per_tenant, f.max_holders);
    inversions += f.inversions;
    std::vector<std::int64_t> waits;
    for (const auto& r : recs)
      if (r.granted()) waits.push_back(r.grant_ns - r.arrive_ns);
    if (tenant == "heavy") {
      heavy = waits;
    } else {
      light.insert(light.end(), waits.begin(), waits.end());
      light_p99_max = std::max(light_p99_max, distribution_ms(waits).p99);
    }
  }
  const Distribution h = distribution_ms(heavy);
  const Distribution l = distribution_ms(light);
  out.set("fairness", p.tenant_fairness ? "on" : "off");
  out.set("tenants", 1 + kLightTenants);
  out.set("heavy_wait_p50_ms", round3(h.p50));
  out.set("heavy_wait_p99_ms", round3(h.p99));
  out.set("light_wait_p50_ms", round3(l.p50));
  out.set("light_wait_p99_ms", round3(l.p99));
  out.set("light_wait_p99_worst_tenant_ms", round3(light_p99_max));
  // One full rotation: every tenant served once at the mean hold time. A light
  // request that finds its tenant's queue empty waits about this long under
  // fairness (its fair share of the N permits is N / tenants).
  const double mean_hold = static_cast<double>((p.hold_min + p.hold_max).count()) / 2.0;
  out.set("fair_share_turn_ms", round3(mean_hold * static_cast<double>(1 + kLightTenants) / p.cap));
  out.set("max_holders_per_tenant", max_per_tenant);
  out.set("inversions_within_tenant", inversions);
}

std::string run_plan(const BenchOptions& o, const Plan& p,
                     const std::function<void(const std::string&)>& log) {
  const auto say = [&](const std::string& s) {
    if (log) log(s);
  };
  static std::atomic<int> runs{0};
  const std::string limiter = fmt::format("{}-{}-{}", p.workload, ::getpid(), runs++);
  const std::string key = o.key_prefix + ":{" + limiter + "}:";
  Admin admin(o.redis_url, key + "cfg");

  say(fmt::format("{} {}: starting {} instances (cap {})", o.system, p.workload, p.instances, p.cap));
  std::vector<WorkerOptions> workers;
  for (std::size_t w = 0; w < p.instances; ++w) {
    WorkerOptions wo;
    wo.system = o.system;
    wo.peers_dir = o.peers_dir;
    wo.redis_url = o.redis_url;
    wo.key_prefix = o.key_prefix;
    wo.limiter = limiter;
    wo.instance_id = fmt::format("b{}-{}-w{}", ::getpid(), limiter.substr(0, 2), w);
    wo.max_concurrent = p.cap;
    wo.heartbeat_interval = o.heartbeat_interval;
    wo.liveness_ttl = o.liveness_ttl;
    // The backend wants one command's timeout below the TTL (--ttl 1s, say).
    wo.command_timeout = std::min(wo.command_timeout, o.liveness_ttl / 2);
    // A limiter made for this run alone: no instance from before can hold
    // permits in it, so no recovery fence (it would hold back the first grants).
    wo.recovery_fence = std::chrono::milliseconds(0);
    wo.closed_loop = p.closed_loop;
    wo.requests = p.requests_per_instance;
    wo.spread = p.spread;
    wo.clients = p.clients_per_instance;
    wo.duration = p.duration;
    wo.hold_min = p.hold_min;
    wo.hold_max = p.hold_max;
    wo.max_wait = p.max_wait;
    wo.holders = w == 0 ? p.holders : 0;
    wo.seed = o.seed * 1000 + w;
    if (p.tenants) {
      wo.tenant = tenant_of_worker(w);
      wo.tenant_fairness = p.tenant_fairness;
      // The heavy tenant floods at once; the light ones arrive over a second.
      wo.requests = w == 0 ? kHeavyRequests : kLightRequests;
      wo.spread = w == 0 ? 0ms : 1000ms;
    }
    workers.push_back(wo);
  }
  Fleet fleet(o.worker_executable, workers, log);
  fleet.wait_for("ready", fleet.size(), 30s);

  std::vector<RequestRecord> records;
  JsonLine out;
  out.set("system", o.system);
  out.set("workload", p.workload);
  out.set("instances", p.instances);
  out.set("max_concurrent", p.cap);
  out.set("waiters", p.waiters);
  for (const char* k : {"requests",
                        "grants",
                        "timeouts",
                        "cancels",
                        "rejections",
                        "overshoot",
                        "max_holders",
                        "inversions",
                        "inversions_client_time",
                        "handoff_p50_ms",
                        "handoff_p99_ms",
                        "handoff_max_ms",
                        "handoffs",
                        "handoff_cdf_ms",
                        "wait_p50_ms",
                        "wait_p99_ms",
                        "client_round_trips_per_grant",
                        "redis_cmds_per_grant",
                        "idle_redis_cmds_per_s",
                        "idle_client_cmds_per_s",
                        "idle_redis_cmds_per_s_per_instance",
                        "grants_per_s",
                        "duration_s",
                        "leftover_holders",
                        "leftover_waiters"}) {
    out.set(k, nullptr);  // fixes the order; every field is filled in below or stays null
  }
  std::int64_t drain_start_ns = 0;

  std::uint64_t redis0 = 0, client0 = 0;
  if (p.holders > 0) {
    fleet.send(0, "hold");
    const auto held = fleet.wait_for("holding", 1, 30s);
    const auto t_hold = held[0].t();
    say(fmt::format("{}: {} permits held; queueing {} waiters", p.workload, p.holders, p.waiters));
    fleet.send_all("go");
    fleet.wait_for("queued_all", fleet.size(), 120s, &records);
    std::this_thread::sleep_for(1s);  // settle: every queued reply handled
    const std::uint64_t client_a = fleet.commands();
    const std::uint64_t redis_a = admin.commands_run();
    const auto t_a = std::chrono::steady_clock::now();
    say(fmt::format("{}: idle window of {} ms", p.workload, p.duration.count()));
    std::this_thread::sleep_for(p.duration);
    const std::uint64_t redis_b = admin.commands_run();
    const std::uint64_t client_b = fleet.commands();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_a).count();
    out.set("idle_redis_cmds_per_s", round3(per(static_cast<double>(redis_b - redis_a), seconds)));
    out.set("idle_client_cmds_per_s", round3(per(static_cast<double>(client_b - client_a), seconds)));
    out.set("idle_redis_cmds_per_s_per_instance",
            round3(per(static_cast<double>(redis_b - redis_a), seconds * static_cast<double>(p.instances))));
    // The drain: the holders let go and every waiter is served (zero-length work).
    redis0 = admin.commands_run();
    client0 = fleet.commands();
    fleet.send(0, "release");
    const auto released = fleet.wait_for("released", 1, 30s);
    RequestRecord holders;
    holders.instance = "holders";
    holders.grant_ns = t_hold;
    holders.release_ns = released[0].t();
    drain_start_ns = holders.release_ns;
    holders.outcome = "granted";
    for (std::size_t i = 0; i < p.holders; ++i) {
      holders.index = i;
      holders.arrive_ns = t_hold;
      records.push_back(holders);
    }
  } else {
    redis0 = admin.commands_run();
    client0 = fleet.commands();
    fleet.send_all("go");
  }
  const milliseconds budget = p.duration + p.max_wait + 60s;
  const auto done = fleet.wait_for("done", fleet.size(), budget, &records);
  std::uint64_t client1 = 0;
  for (const auto& e : done) client1 += e.commands();
  const std::uint64_t redis1 = admin.commands_run();
  fleet.exit_all();
  // Whatever is still in Redis now was leaked.
  out.set("leftover_holders", std::stoull(admin.command(redis::count_permits(key + "holders"))));
  out.set("leftover_waiters", std::stoull(admin.command({"ZCARD", key + "queue"})));
  admin.command({"DEL", key + "cfg", key + "holders", key + "queue", key + "seq", key + "instances",
                 key + "byinst", key + "ptenant", key + "tready", key + "tparked", key + "tholders",
                 key + "tcredit", key + "trot"});
  for (const auto& w : workers) {
    if (!w.tenant.empty()) admin.command({"DEL", key + "tq:" + w.tenant});
  }

  if (!o.records_path.empty()) {
    std::ofstream file(o.records_path, std::ios::app);
    for (const auto& r : records) file << to_json(r) << '\n';
  }
  const Figures f = analyze(records, p.cap);
  // W4's holders are recorded (for the overshoot count) but are not grants of the measured phase.
  const std::size_t grants = f.grants - p.holders;
  const std::int64_t start_ns = drain_start_ns ? drain_start_ns : f.first_arrive_ns;
  const double span = static_cast<double>(f.last_end_ns - start_ns) / 1e9;
  const auto per_grant = [&](std::uint64_t count) {
    return round3(per(static_cast<double>(count), static_cast<double>(grants)));
  };
  out.set("requests", f.requests - p.holders);
  out.set("grants", grants);
  out.set("timeouts", f.timeouts);
  out.set("cancels", f.cancels);
  out.set("rejections", f.rejections);
  out.set("overshoot", f.overshoot);
  out.set("max_holders", f.max_holders);
  if (f.sequenced > 0) out.set("inversions", f.inversions);  // else null: the system reports no sequence
  out.set("inversions_client_time", f.inversions_client_time);
  out.set("handoff_p50_ms", round3(f.handoff.p50));
  out.set("handoff_p99_ms", round3(f.handoff.p99));
  out.set("handoff_max_ms", round3(f.handoff.max));
  out.set("handoffs", f.handoff.count);
  out.set_numbers("handoff_cdf_ms", f.handoff.cdf, round3);
  out.set("wait_p50_ms", round3(f.wait.p50));
  out.set("wait_p99_ms", round3(f.wait.p99));
  out.set("client_round_trips_per_grant", per_grant(client1 - client0));
  out.set("redis_cmds_per_grant", per_grant(redis1 - redis0));
  out.set("grants_per_s", round3(per(static_cast<double>(grants), span)));
  out.set("duration_s", round3(span));
  if (p.tenants) tenant_figures(records, workers, p, out);
  return out.str();
}

// The crash workload: instance A takes every permit and is killed (SIGKILL)
// while holding them; instance B's waiters must get them back. A and B are two
// fleets started one after the other, so A's holds are taken before B exists
// (BullMQ's hold jobs would otherwise run in whichever process's worker takes
// them first, and killing A would not free them).
std::string run_crash(const BenchOptions& o, const std::function<void(const std::string&)>& log) {
  const auto say = [&](const std::string& s) {
    if (log) log(s);
  };
  constexpr std::uint32_t kCap = 3;
  static std::atomic<int> runs{0};
  const std::string limiter = fmt::format("crash-{}-{}", ::getpid(), runs++);
  const std::string key = o.key_prefix + ":{" + limiter + "}:";
  Admin admin(o.redis_url, key + "cfg");
  const auto worker = [&](std::size_t w) {
    WorkerOptions wo;
    wo.system = o.system;
    wo.peers_dir = o.peers_dir;
    wo.redis_url = o.redis_url;
    wo.key_prefix = o.key_prefix;
    wo.limiter = limiter;
    wo.instance_id = fmt::format("b{}-cr-w{}", ::getpid(), w);
    wo.max_concurrent = kCap;
    wo.heartbeat_interval = o.heartbeat_interval;
    wo.liveness_ttl = o.liveness_ttl;
    // The backend wants one command's timeout below the TTL (--ttl 1s, say).
    wo.command_timeout = std::min(wo.command_timeout, o.liveness_ttl / 2);
    wo.recovery_fence = std::chrono::milliseconds(0);  // a limiter of this run alone
    wo.seed = o.seed * 1000 + w;
    // Longer than the bound: a waiter never gives up before the driver does.
    wo.max_wait = o.crash_bound + 60s;
    return wo;
  };
  WorkerOptions holder = worker(0);
  holder.holders = kCap;
  WorkerOptions waiter = worker(1);
  waiter.requests = kCap;  // at once, zero-length work

  say(fmt::format("{} crash: instance A takes all {} permits", o.system, kCap));
  Fleet a(o.worker_executable, {holder}, log);
  a.wait_for("ready", 1, 30s);
  a.send(0, "hold");
  a.wait_for("holding", 1, 60s);
  Fleet b(o.worker_executable, {waiter}, log);
  b.wait_for("ready", 1, 30s);
  std::vector<RequestRecord> records;
  b.send(0, "go");
  b.wait_for("queued_all", 1, 30s, &records);
  // Settle (B's queued replies handled, A heartbeating as usual), then a
  // seeded random part of a heartbeat interval: runs with different --seed
  // kill A at different points of its heartbeat cycle, which is what the
  // recovery time depends on (TTL − time since A's last heartbeat + B's phase).
  std::mt19937_64 rng(o.seed);
  const milliseconds phase(
      std::uniform_int_distribution<std::int64_t>(0, o.heartbeat_interval.count() - 1)(rng));
  std::this_thread::sleep_for(500ms + phase);

  say(fmt::format("{} crash: kill -9 of instance A (pid {}); waiting up to {} ms for B's {} waiters",
                  o.system, a.child(0).pid(), o.crash_bound.count(), kCap));
  const std::int64_t killed_at = now_ns();
  a.child(0).kill(SIGKILL);
  if (!a.child(0).wait(5s)) throw std::runtime_error("crash: the killed instance did not exit");
  bool all_granted = false;
  try {
    b.wait_for("done", 1, o.crash_bound, &records);
    all_granted = true;
  } catch (const std::runtime_error& e) {
    // The bound passed (the records granted so far are in `records`);
    // anything else (B died, B reported an error) is a failure of the run.
    if (std::string_view(e.what()).find("timed out") != 0) throw;
  }
  b.exit_all();
  admin.command(
      {"DEL", key + "cfg", key + "holders", key + "queue", key + "seq", key + "instances", key + "byinst"});

  if (!o.records_path.empty()) {
    std::ofstream file(o.records_path, std::ios::app);
    for (const auto& r : records) file << to_json(r) << '\n';
  }
  std::vector<std::int64_t> recovery;  // kill -> grant, B's waiters granted within the bound
  std::size_t before_kill = 0;
  for (const auto& r : records) {
    if (!r.granted()) continue;
    if (r.grant_ns < killed_at) {
      ++before_kill;  // would be an overshoot: A still held every permit
      continue;
    }
    if (r.grant_ns - killed_at <= std::chrono::nanoseconds(o.crash_bound).count())
      recovery.push_back(r.grant_ns - killed_at);
  }
  std::sort(recovery.begin(), recovery.end());
  JsonLine out;
  out.set("system", o.system);
  out.set("workload", "crash");
  out.set("instances", 2);
  out.set("max_concurrent", kCap);
  out.set("waiters", kCap);
  out.set("heartbeat_ms", o.heartbeat_interval.count());
  out.set("ttl_ms", o.liveness_ttl.count());
  out.set("bound_ms", o.crash_bound.count());
  out.set("kill_after_queued_ms", (500ms + phase).count());
  out.set("granted", recovery.size());
  out.set("granted_before_kill", before_kill);
  // A waiter not granted within the bound counts as never: the p50 is null
  // when the middle waiter was not granted, the max unless all three were.
  const auto ms = [](std::int64_t ns) { return round3(static_cast<double>(ns) / 1e6); };
  if (recovery.size() >= (kCap + 1) / 2)
    out.set("recovery_p50_ms", ms(recovery[(kCap + 1) / 2 - 1]));
  else
    out.set("recovery_p50_ms", nullptr);
  if (recovery.size() == kCap && all_granted)
    out.set("recovery_max_ms", ms(recovery.back()));
  else
    out.set("recovery_max_ms", nullptr);
  out.set_numbers("recovery_ms", recovery, ms);
  return out.str();
}

}  // namespace

std::string run_workload(const BenchOptions& o, const std::function<void(const std::string&)>& log) {
  if (o.workload == "crash") return run_crash(o, log);
  Plan p = plan_for(o);
  if (!p.tenants || o.system != "fairgate") return run_plan(o, p, log);
  // W5 on fairgate: the same run with tenant fairness on, then off.
  p.tenant_fairness = true;
  std::string lines = run_plan(o, p, log);
  p.tenant_fairness = false;
  lines.append("\n").append(run_plan(o, p, log));
  return lines;
}

}  // namespace fairgate::bench
