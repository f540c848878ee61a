// fault_cycles — the engine-faults figures (bench/faults.sh runs it): the
// faults of faults_test.cpp, each repeated many times on one long run of real
// instances (`fairgate bench-worker`) against a real redis-server, judged the
// same way (harness.hpp). Prints one JSON line per fault kind:
//   {"fault", "cycles", "survived" (cycles after which Redis had the whole state
//    back in time / the dead instance was reaped in time), "instances", "killed",
//    "requests", "grants", "max_holders", "cap", "max_overshoot", "lost",
//    "timeouts", "unavailable", "back_to_whole_ms" {p50, max} (fault over →
//    Redis holds every permit and waiter of the instances again; kill9: kill →
//    the dead instance's permits and waiters are gone), "fence_ms" (how long
//    grants were held back after a re-creation, as Redis said), "problems"}
//   usage: fault_cycles [--kind K[,K...]] [--cycles N] [--kill-cycles N]
//   kinds: kill9 restart aof flushall script_flush sigstop oom misconf noreplicas busy debug_sleep
//          client_kill partition
//          (oom: maxmemory 1 under noeviction for TTL + 0.5 s: every write refused with -OOM;
//          misconf, noreplicas: every write refused, releases too; busy: another client's script
//          loops past busy-reply-threshold until SCRIPT KILL; docs/faults.md "Redis refuses writes")
//          bad_replies bad_fields (30 % of two instances' script replies spoiled for 1 s)
//          snapshot (SAVE, 300 ms of grants, kill -9, up again from the snapshot: those grants
//          are lost while their holders, 300-1500 ms here, still run; docs/design.md rule 14)
//          delete_key (holders, queue, seq, byinst, instances, cfg in turn, each DEL'd on its own
//          while holders of 300-1500 ms run, as an evicting maxmemory-policy would; rule 15)
//          delete_tenant_key (the same for tholders, tready, tparked, tq:t1, trot: three
//          instances of a tenant each, tenant fairness, max_per_tenant 2 with cap 3)
#include "faults/harness.hpp"

#include <boost/json.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>
#include <utility>

namespace {

using namespace std::chrono_literals;
using fairgate::faults::Cluster;
using fairgate::faults::Refusing;
using fairgate::faults::Report;
using fairgate::faults::Route;
using fairgate::faults::RunOptions;
using std::chrono::milliseconds;
namespace json = boost::json;

struct Figures {
  std::string fault;
  std::size_t cycles = 0, survived = 0;
  std::vector<double> back_ms;
  double fence_ms = 0;
  Report report;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5))];
}

std::string to_line(const Figures& f, std::uint32_t cap) {
  json::object o;
  o["fault"] = f.fault;
  o["cycles"] = f.cycles;
  o["survived"] = f.survived;
  o["instances"] = f.report.instances;
  o["killed"] = f.report.killed;
  o["requests"] = f.report.requests;
  o["grants"] = f.report.grants;
  o["max_holders"] = f.report.max_holders;
  o["cap"] = cap;
  o["max_overshoot"] = f.report.overshoot;
  o["lost"] = f.report.lost;
  o["timeouts"] = f.report.timeouts;
  o["unavailable"] = f.report.unavailable;
  json::object back;
  back["p50"] = static_cast<std::int64_t>(percentile(f.back_ms, 0.5));
  back["max"] = static_cast<std::int64_t>(percentile(f.back_ms, 1.0));
  o["back_to_whole_ms"] = back;
  o["fence_ms"] = static_cast<std::int64_t>(f.fence_ms);
  json::array problems;
  for (const auto& p : f.report.problems) problems.push_back(json::string(p));
  o["problems"] = problems;
  return json::serialize(o);
}

void sleep(milliseconds d) { std::this_thread::sleep_for(d); }

/// The state's epoch and fence as Redis has them ("" when there is no state).
std::pair<std::string, std::string> epoch_and_fence(Cluster& c) {
  return {c.redis().command({"HGET", c.key("cfg"), "epoch"}),
          c.redis().command({"HGET", c.key("cfg"), "fence_until"})};
}

/// The fence of a state created since `before_epoch` (ms), 0 if none was.
double fence_of_new_state(Cluster& c, const std::string& before_epoch) {
  const auto [epoch, fence] = epoch_and_fence(c);
  if (epoch == before_epoch || epoch.empty() || epoch[0] == '(') return 0;
  try {
    return std::max(0.0, std::stod(fence) - std::stod(epoch) / 1000.0);
  } catch (...) {
    return 0;
  }
}

RunOptions base(const std::string& limiter, milliseconds duration) {
  RunOptions o;
  o.limiter = limiter;
  o.duration = duration;
  return o;
}

/// One long run with `cycles` injections of a Redis fault; `inject` returns
/// when the fault is over (Redis back). The first instance reaches Redis by
/// `route` (netns, or proxy: then the second too), the others directly.
/// With `expect_unavailable`, requests rejected "unavailable" are no problem
/// (an acquire answered with nonsense is rejected so, at once). `holds`: the
/// clients' hold times (default 20-80 ms). `tune` changes the run's options
/// (tenants).
Figures redis_fault(const std::string& kind, std::size_t cycles, milliseconds period,
                    const std::function<void(Cluster&, std::size_t)>& inject,
                    fairgate::test::RedisServer::Options redis = {}, Route route = Route::direct,
                    bool expect_unavailable = false,
                    std::optional<std::pair<milliseconds, milliseconds>> holds = std::nullopt,
                    const std::function<void(RunOptions&)>& tune = {}) {
  const bool netns = route == Route::netns;
  Figures f;
  f.fault = kind;
  f.cycles = cycles;
  const auto per_cycle = period + 6s;
  RunOptions options = base("cycles-" + kind, per_cycle * static_cast<long>(cycles) + 5s);
  if (holds) std::tie(options.hold_min, options.hold_max) = *holds;
  if (tune) tune(options);
  Cluster c(options, std::move(redis), netns);
  c.start(route);
  c.start(route == Route::proxy ? Route::proxy : Route::direct);
  c.start();
  c.go();
  const auto t0 = fairgate::faults::Clock::now();
  for (std::size_t i = 0; i < cycles; ++i) {
    sleep(period);
    const std::string before = epoch_and_fence(c).first;
    inject(c, i);
    if (auto whole = c.wait_whole(20s)) {
      ++f.survived;
      f.back_ms.push_back(static_cast<double>(whole->count()));
    }
    f.fence_ms = std::max(f.fence_ms, fence_of_new_state(c, before));
    std::size_t recs = 0, grants = 0;
    for (auto* w : c.all()) {
      w->drain();
      recs += w->records().size();
      grants += w->grants().size();
    }
    std::fprintf(stderr, "fault_cycles: %s %zu/%zu (%zu requests ended, %zu grants so far)\n", kind.c_str(),
                 i + 1, cycles, recs, grants);
  }
  (void)t0;
  for (auto* w : c.live()) w->send("stop");
  f.report = c.finish(60s, expect_unavailable);
  return f;
}

Figures kill9(std::size_t cycles) {
  Figures f;
  f.fault = "kill9";
  f.cycles = cycles;
  Cluster c(base("cycles-kill9", milliseconds(1500) * static_cast<long>(cycles) + 5s));
  c.start();
  c.start();
  c.start();
  c.go();
  for (std::size_t i = 0; i < cycles; ++i) {
    sleep(400ms);
    auto victim = c.live().front();
    const std::string id = victim->id();
    victim->kill9();
    const auto killed_at = fairgate::faults::Clock::now();
    c.start().send("go");
    // Reaped: nothing of the dead instance left in Redis.
    const auto deadline = killed_at + c.options().ttl + c.options().heartbeat * 4 + 2s;
    for (;;) {
      const std::string lo = "[" + id + "|", hi = "(" + id + "}";
      const bool gone = c.redis().command({"ZLEXCOUNT", c.key("holders"), lo, hi}) == "0" &&
                        c.redis().command({"ZLEXCOUNT", c.key("byinst"), lo, hi}) == "0" &&
                        c.redis().command({"ZSCORE", c.key("instances"), id}) == "(nil)";
      const auto now = fairgate::faults::Clock::now();
      if (gone) {
        ++f.survived;
        f.back_ms.push_back(std::chrono::duration<double, std::milli>(now - killed_at).count());
        break;
      }
      if (now > deadline) break;
      sleep(10ms);
    }
    if ((i + 1) % 10 == 0) std::fprintf(stderr, "fault_cycles: kill9 %zu/%zu\n", i + 1, cycles);
  }
  for (auto* w : c.live()) w->send("stop");
  f.report = c.finish(60s);
  return f;
}

std::optional<fairgate::faults::Refusal> refusal_named(const std::string& kind) {
  using fairgate::faults::Refusal;
  if (kind == "oom") return Refusal::oom;
  if (kind == "misconf") return Refusal::misconf;
  if (kind == "noreplicas") return Refusal::noreplicas;
  if (kind == "busy") return Refusal::busy;
  return std::nullopt;
}

constexpr const char* kKinds =
    "kill9,restart,aof,flushall,script_flush,sigstop,oom,misconf,noreplicas,busy,debug_sleep,"
    "client_kill,partition,bad_replies,bad_fields,snapshot,delete_key,delete_tenant_key";

}  // namespace

int main(int argc, char** argv) {
  std::string kinds = kKinds;
  std::size_t cycles = 20, kill_cycles = 100;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fault_cycles: %s: missing value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--kind") {
      kinds = value();
    } else if (a == "--cycles") {
      cycles = std::stoul(value());
    } else if (a == "--kill-cycles") {
      kill_cycles = std::stoul(value());
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: fault_cycles [--kind K[,K...]] [--cycles N (20)] [--kill-cycles N (100)]\n"
          "kinds (all by default): %s\n"
          "One JSON line per kind on stdout (see the top of tests/faults/fault_cycles.cpp); progress on "
          "stderr.\n",
          kKinds);
      return 0;
    } else {
      std::fprintf(stderr, "fault_cycles: %s: unknown option\n", a.c_str());
      return 2;
    }
  }
  int status = 0;
  std::stringstream list(kinds);
  for (std::string kind; std::getline(list, kind, ',');) {
    Figures f;
    const RunOptions defaults;
    if (kind == "kill9") {
      f = kill9(kill_cycles);
    } else if (kind == "restart") {
      // Longer than the recovery fence (1.25 s): a state lost again and again
      // within its fence stays fenced (safe, but then nothing is served).
      f = redis_fault(kind, cycles, 2500ms, [](Cluster& c, std::size_t) { c.redis().restart(); });
    } else if (kind == "aof") {
      fairgate::test::RedisServer::Options aof;
      aof.appendonly = true;
      f = redis_fault(
          kind, cycles, 1000ms,
          [](Cluster& c, std::size_t) {
            c.redis().kill_hard();
            sleep(c.options().ttl + 500ms);
            c.redis().start_again();
          },
          aof);
    } else if (kind == "flushall") {
      f = redis_fault(kind, cycles, 2500ms, [](Cluster& c, std::size_t) { c.redis().command({"FLUSHALL"}); });
    } else if (kind == "script_flush") {
      f = redis_fault(kind, cycles, 500ms, [](Cluster& c, std::size_t) {
        c.redis().command({"SCRIPT", "FLUSH"});
      });
    } else if (kind == "sigstop") {
      f = redis_fault(kind, cycles, 1000ms, [](Cluster& c, std::size_t) {
        c.redis().stop_process();
        sleep(c.options().ttl + 500ms);
        c.redis().continue_process();
      });
    } else if (const auto refusal = refusal_named(kind)) {
      // Redis refusing calls for TTL + 0.5 s (harness.hpp, Refusing).
      f = redis_fault(
          kind, cycles, 1000ms,
          [r = *refusal](Cluster& c, std::size_t) {
            Refusing refusing(c, r);
            sleep(c.options().ttl + 500ms);
            refusing.end();
          },
          fairgate::faults::refusal_redis_options());
    } else if (kind == "debug_sleep") {
      f = redis_fault(kind, cycles, 800ms, [](Cluster& c, std::size_t) {
        c.redis().command({"DEBUG", "SLEEP", "0.6"}, 10s);
      });
    } else if (kind == "client_kill") {
      f = redis_fault(kind, cycles, 500ms, [](Cluster& c, std::size_t) {
        c.redis().command({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"});
        c.redis().command({"CLIENT", "KILL", "TYPE", "pubsub"});
      });
    } else if (kind == "partition") {
      if (auto why = fairgate::test::NetNamespace::unavailable_reason()) {
        std::fprintf(stderr, "fault_cycles: partition: %s\n", why->c_str());
        status = 1;
        continue;
      }
      f = redis_fault(
          kind, cycles, 1000ms,
          [](Cluster& c, std::size_t) {
            c.netns().partition();
            sleep(c.options().ttl * 2);
            c.netns().heal();
          },
          {}, Route::netns);
    } else if (kind == "bad_replies" || kind == "bad_fields") {
      // 30 % of two instances' script replies spoiled for 1 s: whole (wrong
      // type or shape, errors) or one field inside (docs/faults.md, "Bad replies").
      const auto how =
          kind == "bad_replies" ? fairgate::test::Mangling::whole : fairgate::test::Mangling::inner;
      f = redis_fault(
          kind, cycles, 800ms,
          [how](Cluster& c, std::size_t i) {
            c.proxy().mangle_replies(0.3, 1000 + i, "EVALSHA", how);
            sleep(1000ms);
            c.proxy().mangle_replies(0);
          },
          {}, Route::proxy, /*expect_unavailable=*/true);
    } else if (kind == "delete_key") {
      // One key of the state deleted on its own, as an evicting maxmemory-policy does: the
      // six in turn, while permits (300-1500 ms) run and requests wait (docs/design.md rule 15).
      f = redis_fault(
          kind, cycles, 1000ms,
          [](Cluster& c, std::size_t i) {
            static constexpr const char* kKeys[] = {"holders", "queue", "seq", "byinst", "instances", "cfg"};
            c.redis().command({"DEL", c.key(kKeys[i % std::size(kKeys)])});
          },
          {}, Route::direct, false, std::pair{milliseconds(300), milliseconds(1500)});
    } else if (kind == "delete_tenant_key") {
      // The same for the tenant keys: three instances, a tenant each, tenant fairness and
      // max_per_tenant 2 with cap 3, so tenants wait, take turns and park (rule 15).
      f = redis_fault(
          kind, cycles, 1000ms,
          [](Cluster& c, std::size_t i) {
            // Not tcredit: written only for weights above 1, which this workload never has.
            static constexpr const char* kKeys[] = {"tholders", "tready", "tparked", "tq:t1", "trot"};
            c.redis().command({"DEL", c.key(kKeys[i % std::size(kKeys)])});
          },
          {}, Route::direct, false, std::pair{milliseconds(300), milliseconds(1500)},
          [](RunOptions& o) {
            o.tenant_per_instance = true;
            o.tenant_fairness = true;
            o.max_per_tenant = 2;
          });
    } else if (kind == "snapshot") {
      f = redis_fault(
          kind, cycles, 2500ms,
          [](Cluster& c, std::size_t) {
            c.redis().command({"SAVE"});
            sleep(300ms);
            c.redis().restart();
          },
          {}, Route::direct, false, std::pair{milliseconds(300), milliseconds(1500)});
    } else {
      std::fprintf(stderr, "fault_cycles: %s: unknown kind\n", kind.c_str());
      return 2;
    }
    std::puts(to_line(f, defaults.cap).c_str());
    std::fflush(stdout);
    if (!f.report.ok() || f.survived != f.cycles) status = 1;
  }
  return status;
}
