#include "bench/fleet.hpp"

#include <fmt/format.h>
#include <boost/json.hpp>

#include <algorithm>
#include <stdexcept>
#include <thread>

namespace fairgate::bench {

namespace json = boost::json;
using namespace std::chrono_literals;

std::vector<std::string> worker_argv(const std::string& executable, const WorkerOptions& o) {
  std::vector<std::string> argv;
  if (o.system == "fairgate") {
    argv = {executable, "bench-worker"};
  } else {  // a peer: the same protocol and flags, in Node
    argv = {"/usr/bin/env", "node", o.peers_dir + "/worker.js", "--system", o.system};
  }
  const auto flag = [&](const char* name, std::string value) {
    argv.emplace_back(name);
    argv.push_back(std::move(value));
  };
  const auto ms = [](std::chrono::milliseconds d) { return std::to_string(d.count()); };
  flag("--redis", o.redis_url);
  flag("--prefix", o.key_prefix);
  flag("--limiter", o.limiter);
  flag("--instance", o.instance_id);
  flag("--max-concurrent", std::to_string(o.max_concurrent));
  flag("--heartbeat-ms", ms(o.heartbeat_interval));
  flag("--ttl-ms", ms(o.liveness_ttl));
  flag("--command-timeout-ms", ms(o.command_timeout));
  flag("--hold-min-ms", ms(o.hold_min));
  flag("--hold-max-ms", ms(o.hold_max));
  flag("--max-wait-ms", ms(o.max_wait));
  flag("--seed", std::to_string(o.seed));
  if (o.closed_loop) {
    flag("--clients", std::to_string(o.clients));
    flag("--duration-ms", ms(o.duration));
  } else {
    flag("--requests", std::to_string(o.requests));
    flag("--spread-ms", ms(o.spread));
  }
  if (o.cancel_fraction > 0) flag("--cancel-fraction", fmt::format("{}", o.cancel_fraction));
  if (o.timeout_fraction > 0) flag("--timeout-fraction", fmt::format("{}", o.timeout_fraction));
  if (o.holders > 0) flag("--holders", std::to_string(o.holders));
  // Tenants (W5) only for fairgate: the peers have no tenant fairness, and
  // their worker.js does not know these flags.
  if (o.system == "fairgate") {
    if (!o.tenant.empty()) flag("--tenant", o.tenant);
    if (o.tenant_fairness) flag("--tenant-fairness", "1");
    if (o.max_per_tenant) flag("--max-per-tenant", std::to_string(*o.max_per_tenant));
    // Recovery and degraded modes: only when not the defaults.
    const WorkerOptions defaults;
    if (o.on_redis_down != defaults.on_redis_down) flag("--on-redis-down", o.on_redis_down);
    if (o.local_share) flag("--local-share", std::to_string(*o.local_share));
    if (o.recovery_fence) flag("--recovery-fence-ms", ms(*o.recovery_fence));
    if (o.degrade_after != defaults.degrade_after) flag("--degrade-after-ms", ms(o.degrade_after));
    if (o.recover_after != defaults.recover_after) flag("--recover-after-ms", ms(o.recover_after));
    if (o.reject_pause != defaults.reject_pause) flag("--reject-pause-ms", ms(o.reject_pause));
    if (o.announce) argv.push_back("--announce");
  }
  return argv;
}

std::int64_t WorkerEvent::t() const {
  const auto* v = body.if_contains("t");
  return v && v->is_int64() ? v->as_int64() : 0;
}

std::uint64_t WorkerEvent::count(const char* name) const {
  const auto* v = body.if_contains(name);
  if (!v) return 0;
  if (v->is_uint64()) return v->as_uint64();
  return v->is_int64() ? static_cast<std::uint64_t>(v->as_int64()) : 0;
}

Fleet::Fleet(const std::string& executable, const std::vector<WorkerOptions>& workers, Log log,
             bool quiet_stderr)
    : log_(std::move(log)) {
  for (const auto& w : workers)
    children_.push_back(std::make_unique<Child>(worker_argv(executable, w), quiet_stderr, output_));
}

void Fleet::send_all(const std::string& line) {
  for (auto& c : children_) c->send(line);
}

std::vector<WorkerEvent> Fleet::wait_for(const std::string& ev, std::size_t count,
                                         std::chrono::milliseconds timeout,
                                         std::vector<RequestRecord>* records,
                                         const std::vector<std::size_t>& may_exit) {
  std::vector<WorkerEvent> got;
  if (records) {  // records met by earlier calls that had nowhere to put them
    for (auto& r : stash_) records->push_back(std::move(r));
    stash_.clear();
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (got.size() < count) {
    const std::uint64_t epoch = output_->epoch();  // before reading: no output can slip by unnoticed
    bool any = false;
    for (std::size_t w = 0; w < children_.size() && got.size() < count; ++w) {
      while (auto line = children_[w]->next_line(0ms)) {
        any = true;
        if (auto r = request_from_json(*line)) {
          (records ? *records : stash_).push_back(std::move(*r));
          continue;
        }
        boost::system::error_code ec;
        auto v = json::parse(*line, ec);
        if (ec || !v.is_object() || !v.as_object().contains("ev") || !v.as_object().at("ev").is_string()) {
          if (log_) log_(fmt::format("worker {}: {}", w, *line));
          continue;
        }
        WorkerEvent e{w, std::string(v.as_object().at("ev").as_string()), std::move(v.as_object())};
        if (e.ev == "error") throw std::runtime_error(fmt::format("worker {}: {}", w, *line));
        if (e.ev == ev) {
          got.push_back(std::move(e));
          if (got.size() == count) break;
        }
      }
    }
    if (got.size() == count) break;
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error(
          fmt::format("timed out after {} ms waiting for '{}' from the workers ({} of {})", timeout.count(),
                      ev, got.size(), count));
    }
    if (!any) {
      for (std::size_t w = 0; w < children_.size(); ++w) {
        if (std::find(may_exit.begin(), may_exit.end(), w) != may_exit.end()) continue;
        // Lines it wrote before exiting are read first.
        if (children_[w]->wait(0ms) && children_[w]->drained())
          throw std::runtime_error(fmt::format("bench worker {} exited early", w));
      }
      // Sleep until a worker writes (or 50 ms pass, to notice one that died):
      // no polling loop competing with the workers for the CPU.
      if (!any) output_->wait(epoch, 50ms);
    }
  }
  return got;
}

std::uint64_t Fleet::commands() {
  send_all("mark");
  std::uint64_t total = 0;
  for (const auto& e : wait_for("mark", size(), 10s)) total += e.commands();
  return total;
}

void Fleet::exit_all() {
  send_all("exit");
  for (auto& c : children_) c->close_stdin();
  for (auto& c : children_) {
    if (!c->wait(10s)) {
      c->kill(9);
      c->wait(5s);
    }
  }
}

}  // namespace fairgate::bench
