// bench/eta_bench.cpp — how good is the wait estimate (F7), and what does
// reject_early do? A program that prints figures (docs/eta.md), not a test.
//
//   fairgate_eta_bench [--redis URL] [--runs N] [--seed S]
//
// Loads, as in docs/bench.md (cap 3, holds of 20–80 ms):
//   W2-like: 4 instances x 50 requests arriving at random over 1 s.
//   W5-like: tenant "heavy" sends 200 at once, light1..light5 10 each at random
//            over 1 s, one instance per tenant, tenant_fairness on.
// On the memory backend the instances share one backend (one process); on
// Redis each instance is its own backend (own connections, own io thread) on
// the given server, as separate processes would be.
//
// ETA accuracy: for every waiter that was granted, the error of the first
// estimate it received (|estimate - time from that event to the grant|), and
// of the estimate it held at mid-wait (the last event at or before arrival +
// wait/2). Medians (and p90) of the absolute errors; waiters that got no
// estimate are counted apart.
//
// Early rejection: the W2-like and W5-like schedules with max_wait = 1 s, run
// twice with the same schedule, reject_early off then on. Counts: requests
// that timed out (off) and what they waited; in the run with reject_early, the
// waits of those that did not get a permit; and requests served without
// reject_early that it rejected (same schedule, request by request). That
// cross-run count mixes in the runs' own jitter, so two more figures:
//  - the noise floor: the same schedule run twice without reject_early, the
//    requests served in one run and timed out in the other;
//  - the in-run count, exact for a FIFO: a request rejected early at t with
//    max wait w would have been served iff some request that arrived after it
//    (so queued behind it) was granted before t + w — everyone ahead of it had
//    left by then, and that grant would have been its own. Its absence changes
//    nothing ahead of it.
#include <fairgate/fairgate.hpp>
#include <fairgate/redis_backend.hpp>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct Spec {
  int instance = 0;
  double arrive_ms = 0;
  int hold_ms = 0;
  std::string tenant;
};

struct Event {
  Clock::time_point at;
  std::optional<milliseconds> estimate;
};

struct Record {
  Clock::time_point arrived{}, ended{};
  std::vector<Event> events;  // QueueStatus updates
  fairgate::Outcome outcome = fairgate::Outcome::rejected;
  fairgate::RejectReason reason = fairgate::RejectReason::unavailable;
  bool done = false;
};

std::vector<Spec> schedule(const std::string& workload, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> over_1s(0.0, 1000.0);
  std::uniform_int_distribution<int> hold(20, 80);
  std::vector<Spec> out;
  if (workload == "W2") {
    for (int i = 0; i < 4; ++i)
      for (int k = 0; k < 50; ++k) out.push_back({i, over_1s(rng), hold(rng), ""});
  } else {
    for (int k = 0; k < 200; ++k) out.push_back({0, 0.0, hold(rng), "heavy"});
    for (int t = 1; t <= 5; ++t)
      for (int k = 0; k < 10; ++k) out.push_back({t, over_1s(rng), hold(rng), "light" + std::to_string(t)});
  }
  return out;
}

/// One instance: a backend (or a share of the memory one) on its own io thread.
struct Node {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::shared_ptr<fairgate::Backend> backend;
  std::thread thread;
};

struct Run {
  std::vector<Record> records;
  double seconds = 0;
};

Run run_once(const std::string& redis_url, const std::string& name, const std::vector<Spec>& specs,
             const fairgate::Settings& settings) {
  int instances = 0;
  for (const auto& s : specs) instances = std::max(instances, s.instance + 1);
  std::vector<std::unique_ptr<Node>> nodes;
  for (int i = 0; i < (redis_url.empty() ? 1 : instances); ++i) {
    auto n = std::make_unique<Node>();
    if (redis_url.empty()) {
      n->backend = fairgate::make_memory_backend(n->io.get_executor());
    } else {
      fairgate::RedisBackendOptions o;
      o.url = redis_url;
      o.instance_id = fmt::format("eta-{}-{}", ::getpid(), i);
      o.recovery_fence = milliseconds(0);
      n->backend = fairgate::make_redis_backend(n->io.get_executor(), o);
    }
    n->thread = std::thread([io = &n->io] { io->run(); });
    nodes.push_back(std::move(n));
  }
  std::vector<fairgate::Limiter> limiters;
  for (auto& n : nodes) limiters.push_back(n->backend->open(name, settings).value());
  // Redis: wait until every instance has its settings from Redis (first heartbeat).
  for (auto& l : limiters) {
    const auto until = Clock::now() + std::chrono::seconds(5);
    while (l.snapshot().engine.settings_source == "local" && Clock::now() < until)
      std::this_thread::sleep_for(milliseconds(10));
  }

  Run run;
  run.records.resize(specs.size());
  std::atomic<std::size_t> finished{0};
  std::vector<std::unique_ptr<asio::steady_timer>> timers;
  const auto start = Clock::now() + milliseconds(50);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const Spec& sp = specs[i];
    Node& node = *nodes[redis_url.empty() ? 0 : static_cast<std::size_t>(sp.instance)];
    fairgate::Limiter lim = limiters[redis_url.empty() ? 0 : static_cast<std::size_t>(sp.instance)];
    Record* rec = &run.records[i];
    auto timer = std::make_unique<asio::steady_timer>(
        node.io, start + std::chrono::microseconds(static_cast<std::int64_t>(sp.arrive_ms * 1000)));
    timer->async_wait([&node, lim, rec, sp, &finished](boost::system::error_code) mutable {
      rec->arrived = Clock::now();
      fairgate::AcquireOptions o;
      o.tenant = sp.tenant;
      o.on_queued = [rec](const fairgate::QueueStatus& q) {
        rec->events.push_back({Clock::now(), q.estimated_wait});
      };
      lim.async_acquire(o, [&node, rec, hold = sp.hold_ms, &finished](fairgate::AcquireResult r) {
        rec->ended = Clock::now();
        rec->outcome = r.outcome();
        rec->reason = r.reason();
        rec->done = true;
        if (!r.granted()) {
          finished.fetch_add(1);
          return;
        }
        auto permit = std::make_shared<fairgate::Permit>(r.take_permit());
        auto t = std::make_shared<asio::steady_timer>(node.io, milliseconds(hold));
        t->async_wait([permit, t, &finished](boost::system::error_code) {
          permit->release();
          finished.fetch_add(1);
        });
      });
    });
    timers.push_back(std::move(timer));
  }
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (finished.load() < specs.size() && Clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(20));
  run.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (finished.load() < specs.size())
    std::fprintf(stderr, "%s: only %zu of %zu requests finished\n", name.c_str(), finished.load(),
                 specs.size());
  // Leave time for the last release to reach the backend, then stop.
  std::this_thread::sleep_for(milliseconds(100));
  for (auto& n : nodes) {
    asio::post(n->io, [&n] { n->backend->shutdown(); });
  }
  for (auto& n : nodes) {
    n->work.reset();
    std::this_thread::sleep_for(milliseconds(50));
    n->io.stop();
    n->thread.join();
  }
  timers.clear();
  limiters.clear();
  return run;
}

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

void report_accuracy(const std::string& backend, const std::string& workload, const std::vector<Run>& runs) {
  // *_err: |estimate - actual|; *_bias: estimate - actual (above 0: it said longer than it was).
  std::vector<double> first_err, mid_err, waits, first_rel, first_bias, mid_bias;
  std::size_t waiters = 0, no_first = 0, no_mid = 0;
  for (const auto& run : runs) {
    for (const auto& r : run.records) {
      if (r.events.empty() || r.outcome != fairgate::Outcome::granted) continue;
      ++waiters;
      const double wait = ms(r.ended - r.arrived);
      waits.push_back(wait);
      const Event& first = r.events.front();
      if (first.estimate) {
        const double actual = ms(r.ended - first.at);
        first_bias.push_back(static_cast<double>(first.estimate->count()) - actual);
        first_err.push_back(std::abs(first_bias.back()));
        if (actual > 0) first_rel.push_back(first_err.back() / actual);
      } else {
        ++no_first;
      }
      const auto mid = r.arrived + (r.ended - r.arrived) / 2;
      const Event* held = nullptr;
      for (const auto& e : r.events)
        if (e.at <= mid) held = &e;
      if (held && held->estimate) {
        mid_bias.push_back(static_cast<double>(held->estimate->count()) - ms(r.ended - held->at));
        mid_err.push_back(std::abs(mid_bias.back()));
      } else {
        ++no_mid;
      }
    }
  }
  std::printf(
      "{\"kind\":\"eta\",\"backend\":\"%s\",\"workload\":\"%s\",\"runs\":%zu,\"waiters\":%zu,"
      "\"wait_p50_ms\":%.0f,\"wait_p90_ms\":%.0f,\"first_estimate\":%zu,\"no_first_estimate\":%zu,"
      "\"first_abs_err_p50_ms\":%.0f,\"first_abs_err_p90_ms\":%.0f,\"first_rel_err_p50\":%.2f,"
      "\"first_bias_p50_ms\":%.0f,\"mid_estimate\":%zu,\"no_mid_estimate\":%zu,\"mid_abs_err_p50_ms\":%.0f,"
      "\"mid_abs_err_p90_ms\":%.0f,\"mid_bias_p50_ms\":%.0f}"
      "\n",
      backend.c_str(), workload.c_str(), runs.size(), waiters, quantile(waits, 0.5), quantile(waits, 0.9),
      first_err.size(), no_first, quantile(first_err, 0.5), quantile(first_err, 0.9),
      quantile(first_rel, 0.5), quantile(first_bias, 0.5), mid_err.size(), no_mid, quantile(mid_err, 0.5),
      quantile(mid_err, 0.9), quantile(mid_bias, 0.5));
  std::fflush(stdout);
}

/// Requests rejected early in `run` that a FIFO would have served (see the top).
std::size_t served_if_queued(const Run& run, Clock::duration max_wait) {
  std::size_t n = 0;
  for (const auto& b : run.records) {
    if (b.outcome != fairgate::Outcome::rejected || b.reason != fairgate::RejectReason::would_time_out)
      continue;
    const bool overtaken = std::any_of(run.records.begin(), run.records.end(), [&](const Record& c) {
      return c.outcome == fairgate::Outcome::granted && c.arrived > b.arrived &&
             c.ended < b.arrived + max_wait;
    });
    n += overtaken ? 1 : 0;
  }
  return n;
}

void report_early(const std::string& backend, const std::string& workload, const std::vector<Run>& off,
                  const std::vector<Run>& on, const std::vector<Run>& off2) {
  std::size_t n = 0, off_timeouts = 0, on_rejected_early = 0, on_timeouts = 0, served_off_rejected_on = 0,
              timeout_off_rejected_on = 0, served_off = 0, served_on = 0;
  std::vector<double> off_unserved_wait, on_unserved_wait;
  for (std::size_t k = 0; k < off.size(); ++k) {
    for (std::size_t i = 0; i < off[k].records.size(); ++i) {
      const Record& a = off[k].records[i];
      const Record& b = on[k].records[i];
      ++n;
      const bool a_served = a.outcome == fairgate::Outcome::granted;
      const bool b_early = b.reason == fairgate::RejectReason::would_time_out && !b.events.size() &&
                           b.outcome == fairgate::Outcome::rejected;
      served_off += a_served ? 1 : 0;
      served_on += b.outcome == fairgate::Outcome::granted ? 1 : 0;
      if (!a_served) {
        ++off_timeouts;
        off_unserved_wait.push_back(ms(a.ended - a.arrived));
      }
      if (b.outcome != fairgate::Outcome::granted) on_unserved_wait.push_back(ms(b.ended - b.arrived));
      if (b_early) ++on_rejected_early;
      if (b.outcome == fairgate::Outcome::timed_out) ++on_timeouts;
      if (b_early && a_served) ++served_off_rejected_on;
      if (b_early && !a_served) ++timeout_off_rejected_on;
    }
  }
  std::size_t flips = 0, in_run = 0;
  for (std::size_t k = 0; k < off.size(); ++k) {
    for (std::size_t i = 0; i < off[k].records.size(); ++i)
      flips += (off[k].records[i].outcome == fairgate::Outcome::granted) !=
                       (off2[k].records[i].outcome == fairgate::Outcome::granted)
                   ? 1
                   : 0;
    in_run += served_if_queued(on[k], std::chrono::seconds(1));
  }
  // Offline, on the runs without reject_early: which requests would a margin
  // of f x max_wait (at least 100 ms) have turned away, judged by the first
  // estimate each was given, and how did they end without it?
  for (const double f : {0.25, 0.5, 1.0}) {
    std::size_t cut_timeouts = 0, cut_served = 0;
    for (const auto& run : off) {
      for (const auto& r : run.records) {
        if (r.events.empty() || !r.events.front().estimate) continue;
        const double est = static_cast<double>(r.events.front().estimate->count());
        if (est <= 1000.0 + std::max(100.0, 1000.0 * f)) continue;
        if (r.outcome == fairgate::Outcome::granted) {
          ++cut_served;
        } else {
          ++cut_timeouts;
        }
      }
    }
    std::printf(
        "{\"kind\":\"reject_early_margin\",\"backend\":\"%s\",\"workload\":\"%s\",\"margin\":\"max(100 ms, "
        "%.2f x max_wait)\",\"would_reject_timeouts\":%zu,\"would_reject_served\":%zu,\"timeouts\":%zu}\n",
        backend.c_str(), workload.c_str(), f, cut_timeouts, cut_served, off_timeouts);
  }
  auto sum = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s;
  };
  std::printf(
      "{\"kind\":\"reject_early\",\"backend\":\"%s\",\"workload\":\"%s\",\"runs\":%zu,\"requests\":%zu,"
      "\"max_wait_ms\":1000,\"off_served\":%zu,\"off_timeouts\":%zu,\"off_unserved_wait_p50_ms\":%.0f,"
      "\"off_unserved_wait_total_s\":%.1f,\"on_served\":%zu,\"on_rejected_early\":%zu,\"on_timeouts\":%zu,"
      "\"on_unserved_wait_p50_ms\":%.0f,\"on_unserved_wait_total_s\":%.1f,"
      "\"rejected_early_that_timed_out_without\":%zu,\"rejected_early_that_were_served_without\":%zu,"
      "\"rejected_early_a_fifo_would_have_served_in_run\":%zu,\"fate_flips_between_two_runs_without\":%zu}\n",
      backend.c_str(), workload.c_str(), off.size(), n, served_off, off_timeouts,
      quantile(off_unserved_wait, 0.5), sum(off_unserved_wait) / 1000.0, served_on, on_rejected_early,
      on_timeouts, quantile(on_unserved_wait, 0.5), sum(on_unserved_wait) / 1000.0, timeout_off_rejected_on,
      served_off_rejected_on, in_run, flips);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string redis;
  int runs = 3;
  std::uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--redis" && i + 1 < argc) {
      redis = argv[++i];
    } else if (a == "--runs" && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr,
                   "usage: fairgate_eta_bench [--redis URL] [--runs N] [--seed S]\n"
                   "  ETA accuracy and reject_early under W2- and W5-like load (docs/eta.md);\n"
                   "  memory backend always, Redis too with --redis. One JSON line per figure set.\n");
      return a == "--help" ? 0 : 2;
    }
  }
  std::vector<std::string> backends{""};
  if (!redis.empty()) backends.push_back(redis);
  int serial = 0;
  for (const auto& url : backends) {
    const std::string backend = url.empty() ? "memory" : "redis";
    for (const std::string workload : {"W2", "W5"}) {
      fairgate::Settings s;
      s.max_concurrent = 3;
      s.max_wait = std::chrono::seconds(60);
      s.tenant_fairness = workload == "W5";
      std::vector<Run> acc;
      for (int r = 0; r < runs; ++r)
        acc.push_back(run_once(url, fmt::format("eta-{}-{}", ::getpid(), serial++),
                               schedule(workload, seed + static_cast<std::uint64_t>(r)), s));
      report_accuracy(backend, workload, acc);
      s.max_wait = std::chrono::seconds(1);
      std::vector<Run> off, on, off2;
      for (int r = 0; r < runs; ++r) {
        const auto sched = schedule(workload, seed + 100 + static_cast<std::uint64_t>(r));
        s.reject_early = false;
        off.push_back(run_once(url, fmt::format("eta-{}-{}", ::getpid(), serial++), sched, s));
        s.reject_early = true;
        on.push_back(run_once(url, fmt::format("eta-{}-{}", ::getpid(), serial++), sched, s));
        s.reject_early = false;
        off2.push_back(run_once(url, fmt::format("eta-{}-{}", ::getpid(), serial++), sched, s));
      }
      report_early(backend, workload, off, on, off2);
    }
  }
  return 0;
}
