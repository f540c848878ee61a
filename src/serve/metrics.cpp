// serve/metrics.cpp — Prometheus text exposition format 0.0.4.
#include "serve/metrics.hpp"

#include <fmt/format.h>

namespace fairgate::serve {
namespace {

void header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

/// One series per limiter, `name{limiter="..."} value`, under its header.
template <typename ValueOf>
void per_limiter(std::string& out, const std::vector<Snapshot>& snaps, std::string_view name,
                 std::string_view type, std::string_view help, ValueOf value_of) {
  header(out, name, type, help);
  for (const auto& s : snaps) out += fmt::format("{}{{limiter=\"{}\"}} {}\n", name, s.name, value_of(s));
}

/// One series without labels, under its header.
template <typename Value>
void single_series(std::string& out, std::string_view name, std::string_view type, std::string_view help,
                   Value value) {
  header(out, name, type, help);
  out += fmt::format("{} {}\n", name, value);
}

/// Each limiter's state, its Redis recovery (degraded, fenced, restores) and its counters.
void render_limiter_state(std::string& out, const std::vector<Snapshot>& snaps) {
  const auto gauge = [&](std::string_view name, std::string_view help, auto value_of) {
    per_limiter(out, snaps, name, "gauge", help, value_of);
  };
  const auto counter = [&](std::string_view name, std::string_view help, auto value_of) {
    per_limiter(out, snaps, name, "counter", help, value_of);
  };
  gauge("fairgate_in_use", "Permits held (cluster-wide as last seen by this instance).",
        [](const Snapshot& s) { return s.in_use; });
  gauge("fairgate_queued", "Waiters in the queue (cluster-wide as last seen by this instance).",
        [](const Snapshot& s) { return s.queued; });
  gauge("fairgate_max_concurrent", "The limiter's cap.",
        [](const Snapshot& s) { return s.settings.max_concurrent; });
  gauge("fairgate_enabled", "1 when the limiter enforces its cap.",
        [](const Snapshot& s) { return s.settings.enabled ? 1 : 0; });
  gauge("fairgate_degraded", "1 while the limiter runs on its on_redis_down policy (Redis unreachable).",
        [](const Snapshot& s) { return s.engine.degraded ? 1 : 0; });
  counter("fairgate_degraded_seconds_total", "Time the limiter spent degraded (on_redis_down policy).",
          [](const Snapshot& s) { return fmt::format("{:.3f}", s.engine.degraded_time.count() / 1000.0); });
  counter("fairgate_degraded_entries_total", "Times the limiter entered degraded mode.",
          [](const Snapshot& s) { return s.engine.degraded_entries; });
  gauge("fairgate_fenced", "1 while the limiter's state in Redis is fenced after a re-creation (no grants).",
        [](const Snapshot& s) { return s.engine.fence_left.count() > 0 ? 1 : 0; });
  counter("fairgate_fenced_seconds_total", "Time this instance saw the limiter fenced.",
          [](const Snapshot& s) { return fmt::format("{:.3f}", s.engine.fenced_time.count() / 1000.0); });
  counter("fairgate_state_restores_total",
          "Restores of this instance's permits and waiters Redis acknowledged.",
          [](const Snapshot& s) { return s.engine.restores; });
  counter("fairgate_state_recreations_total",
          "Times this instance found the limiter's state gone from Redis and created it again.",
          [](const Snapshot& s) { return s.engine.state_recreations; });
  counter("fairgate_redis_switches_total",
          "Times this instance saw the limiter's state on another Redis (new replication id: a failover or "
          "a restart): fenced, since the last grants may be lost.",
          [](const Snapshot& s) { return s.engine.redis_switches; });
  counter("fairgate_holders_key_lost_total",
          "Times this instance saw the limiter's holders key found deleted in Redis (evicted, or a DEL): "
          "fenced until every instance restored its permits.",
          [](const Snapshot& s) { return s.engine.holders_key_lost; });
  counter("fairgate_tenant_keys_rebuilt_total",
          "Times this instance saw a tenant key of the limiter found deleted in Redis (evicted, or a DEL): "
          "the tenant keys rebuilt from the queue and the permits.",
          [](const Snapshot& s) { return s.engine.tenant_keys_rebuilt; });
  counter("fairgate_instance_id_shared_total",
          "Heartbeats that found this instance's liveness in Redis set by another process with the same "
          "instance id (the cap does not hold: give each process its own id).",
          [](const Snapshot& s) { return s.engine.instance_id_shared; });
  counter("fairgate_overshoot_restored_total",
          "Permits this instance restored above the cap (its work outlived its liveness in Redis).",
          [](const Snapshot& s) { return s.engine.overshoot_restored; });
  counter("fairgate_acquires_total", "Acquire requests started on this instance.",
          [](const Snapshot& s) { return s.stats.acquires; });
  counter("fairgate_grants_total", "Requests granted on this instance.",
          [](const Snapshot& s) { return s.stats.grants; });
  counter("fairgate_timeouts_total", "Requests that reached their max wait.",
          [](const Snapshot& s) { return s.stats.timeouts; });
  counter("fairgate_cancels_total", "Requests cancelled while waiting (client gone).",
          [](const Snapshot& s) { return s.stats.cancels; });
  counter("fairgate_releases_total", "Permits returned.", [](const Snapshot& s) { return s.stats.releases; });
}

/// Rejections by reason, then the wait and hold histograms.
void render_limiter_waits(std::string& out, const std::vector<Snapshot>& snaps, const Metrics& metrics) {
  header(out, "fairgate_rejections_total", "counter", "Requests rejected, by reason.");
  for (const auto& s : snaps) {
    for (const auto reason : kRejectionReasons) {
      out += fmt::format("fairgate_rejections_total{{limiter=\"{}\",reason=\"{}\"}} {}\n", s.name,
                         to_string(reason), s.stats.by_reason[static_cast<std::size_t>(reason)]);
    }
  }
  header(out, "fairgate_wait_seconds", "histogram", "Time from arrival to grant.");
  for (const auto& s : snaps) {
    if (const auto* h = metrics.wait_histogram(s.name)) h->render(s.name, out);
  }
  header(out, "fairgate_hold_seconds", "histogram",
         "Time permits granted through this server were held (grant to release).");
  for (const auto& s : snaps) {
    if (const auto* h = metrics.hold_histogram(s.name))
      h->render("fairgate_hold_seconds", fmt::format("limiter=\"{}\"", s.name), out);
  }
}

/// Shadow mode (docs/shadow.md): what was let through and what enforcing would have done.
void render_shadow(std::string& out, const std::vector<Snapshot>& snaps) {
  const auto gauge = [&](std::string_view name, std::string_view help, auto value_of) {
    per_limiter(out, snaps, name, "gauge", help, value_of);
  };
  const auto counter = [&](std::string_view name, std::string_view help, auto value_of) {
    per_limiter(out, snaps, name, "counter", help, value_of);
  };
  gauge("fairgate_shadow", "1 while the limiter runs in shadow mode (lets everything through).",
        [](const Snapshot& s) { return s.settings.mode == LimiterMode::shadow ? 1 : 0; });
  counter("fairgate_shadow_passed_total", "Requests shadow mode let through at once (this instance).",
          [](const Snapshot& s) { return s.shadow.passed; });
  gauge("fairgate_shadow_in_flight", "Requests shadow mode let through that are still running.",
        [](const Snapshot& s) { return s.shadow.in_flight; });
  counter("fairgate_shadow_would_grants_total", "Shadowed requests enforcing would have served.",
          [](const Snapshot& s) { return s.shadow.would_grant; });
  counter("fairgate_shadow_would_queue_total", "Shadowed requests enforcing would have served after a wait.",
          [](const Snapshot& s) { return s.shadow.would_queue; });
  gauge("fairgate_shadow_would_wait", "Shadowed requests enforcing would have waiting now.",
        [](const Snapshot& s) { return s.shadow.waiting; });
  header(out, "fairgate_shadow_would_end_total", "counter",
         "Shadowed requests enforcing would have ended without a permit, by reason (timeout = timed out).");
  for (const auto& s : snaps) {
    for (std::size_t i = 1; i < s.shadow.would_end_by_reason.size(); ++i) {
      out += fmt::format("fairgate_shadow_would_end_total{{limiter=\"{}\",reason=\"{}\"}} {}\n", s.name,
                         to_string(static_cast<RejectReason>(i)), s.shadow.would_end_by_reason[i]);
    }
  }
}

/// The waits enforcing would have imposed, as a histogram per limiter.
void render_shadow_waits(std::string& out, const std::vector<Snapshot>& snaps) {
  header(out, "fairgate_shadow_would_wait_seconds", "histogram",
         "Waits enforcing would have imposed on the requests it would have served.");
  for (const auto& s : snaps) {
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < kShadowWaitBounds.size(); ++i) {
      cumulative += s.shadow.would_wait_buckets[i];
      out += fmt::format("fairgate_shadow_would_wait_seconds_bucket{{limiter=\"{}\",le=\"{}\"}} {}\n", s.name,
                         kShadowWaitBounds[i], cumulative);
    }
    cumulative += s.shadow.would_wait_buckets[kShadowWaitBounds.size()];
    out += fmt::format("fairgate_shadow_would_wait_seconds_bucket{{limiter=\"{}\",le=\"+Inf\"}} {}\n", s.name,
                       cumulative);
    out += fmt::format("fairgate_shadow_would_wait_seconds_sum{{limiter=\"{}\"}} {:.3f}\n", s.name,
                       static_cast<double>(s.shadow.would_wait_ms_sum) / 1000.0);
    out += fmt::format("fairgate_shadow_would_wait_seconds_count{{limiter=\"{}\"}} {}\n", s.name,
                       s.shadow.would_grant);
  }
}

/// This instance: its Redis connections, HTTP server, event streams and leases.
void render_server(std::string& out, const Backend& backend, const Metrics& metrics, std::size_t leases) {
  const auto single = [&](std::string_view name, std::string_view type, std::string_view help, auto value) {
    single_series(out, name, type, help, value);
  };
  const auto load = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  const BackendHealth health = backend.health();
  if (health.remote) {
    single("fairgate_redis_up", "gauge", "1 when this instance's connections to Redis are up.",
           health.connected ? 1 : 0);
    single("fairgate_redis_errors_total", "counter",
           "Redis client errors of this instance (command timeouts, disconnects, error replies).",
           health.errors);
    header(out, "fairgate_redis_command_failures_total", "counter",
           "Failed Redis commands of this instance, by kind.");
    out += fmt::format("fairgate_redis_command_failures_total{{kind=\"timeout\"}} {}\n", health.timeouts);
    out +=
        fmt::format("fairgate_redis_command_failures_total{{kind=\"disconnect\"}} {}\n", health.disconnects);
    out += fmt::format("fairgate_redis_command_failures_total{{kind=\"error_reply\"}} {}\n",
                       health.error_replies);
  }
  single("fairgate_http_requests_total", "counter", "HTTP requests read.", load(metrics.http_requests));
  single("fairgate_http_bad_requests_total", "counter", "Malformed or refused HTTP requests (4xx).",
         load(metrics.http_bad_requests));
  header(out, "fairgate_http_responses_total", "counter", "HTTP responses sent, by status code.");
  for (std::size_t code = 100; code < metrics.responses_by_code.size(); ++code) {
    const auto n = load(metrics.responses_by_code[code]);
    if (n > 0) out += fmt::format("fairgate_http_responses_total{{code=\"{}\"}} {}\n", code, n);
  }
  single("fairgate_http_connections", "gauge", "Open client connections.", load(metrics.connections_open));
  single("fairgate_http_connections_refused_total", "counter", "Connections refused at the connection cap.",
         load(metrics.connections_refused));
  single("fairgate_http_timeouts_total", "counter", "Connections closed for a header or idle timeout.",
         load(metrics.connections_timed_out));
  single("fairgate_sse_streams", "gauge", "Open acquire event streams.", load(metrics.sse_streams));
  single("fairgate_client_cap_refusals_total", "counter", "Acquires refused by the per-client waiter cap.",
         load(metrics.client_cap_refusals));
  single("fairgate_leases", "gauge", "JSON permits held (long poll).", leases);
  single("fairgate_leases_expired_total", "counter", "JSON permits released because their lease ran out.",
         load(metrics.leases_expired));
}

}  // namespace

void Histogram::observe(std::chrono::milliseconds waited) noexcept {
  const double s = static_cast<double>(waited.count()) / 1000.0;
  std::size_t i = 0;
  while (i < kBounds.size() && s > kBounds[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ms_.fetch_add(static_cast<std::uint64_t>(std::max<std::int64_t>(0, waited.count())),
                    std::memory_order_relaxed);
}

void Histogram::render(std::string_view name, std::string_view labels, std::string& out) const {
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < kBounds.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, kBounds[i], cumulative);
  }
  cumulative += buckets_[kBounds.size()].load(std::memory_order_relaxed);
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, cumulative);
  out += fmt::format("{}_sum{{{}}} {:.3f}\n", name, labels,
                     static_cast<double>(sum_ms_.load(std::memory_order_relaxed)) / 1000.0);
  out += fmt::format("{}_count{{{}}} {}\n", name, labels, count_.load(std::memory_order_relaxed));
}

Metrics::Metrics(const std::vector<std::string>& limiter_names) {
  for (const auto& n : limiter_names) {
    histograms_.emplace(n, std::make_unique<WaitHistogram>());
    hold_histograms_.emplace(n, std::make_unique<Histogram>());
  }
}

WaitHistogram* Metrics::wait_histogram(const std::string& limiter) const {
  const auto it = histograms_.find(limiter);
  return it == histograms_.end() ? nullptr : it->second.get();
}

Histogram* Metrics::hold_histogram(const std::string& limiter) const {
  const auto it = hold_histograms_.find(limiter);
  return it == hold_histograms_.end() ? nullptr : it->second.get();
}

std::string render_metrics(const Backend& backend, const Metrics& metrics, std::size_t leases) {
  // Limiter names are [A-Za-z0-9._-] (validated), so they need no escaping.
  std::vector<Snapshot> snaps;
  for (const auto& l : backend.limiters()) snaps.push_back(l.snapshot());
  std::string out;
  out.reserve(4096 + snaps.size() * 2048);
  render_limiter_state(out, snaps);
  render_limiter_waits(out, snaps, metrics);
  render_shadow(out, snaps);
  render_shadow_waits(out, snaps);
  render_server(out, backend, metrics, leases);
  return out;
}

void render_rate_metrics(const RateLimiter& rates, std::string& out) {
  if (!rates.valid()) return;
  const auto rules = rates.rules();
  if (rules.empty()) return;
  // Rule names are [A-Za-z0-9._-] (validated), so they need no escaping.
  const auto counter = [&](std::string_view name, std::string_view help, auto value_of) {
    header(out, name, "counter", help);
    for (const auto& r : rules) out += fmt::format("{}{{rule=\"{}\"}} {}\n", name, r.name, value_of(r.stats));
  };
  counter("fairgate_ratelimit_allowed_total", "Rate-limit decisions that allowed (this instance).",
          [](const RateRuleStats& s) { return s.allowed; });
  counter("fairgate_ratelimit_refused_total", "Rate-limit decisions this rule refused (this instance).",
          [](const RateRuleStats& s) { return s.refused; });
  counter("fairgate_ratelimit_local_refusals_total",
          "Refusals made by the in-process first layer, without a Redis round trip.",
          [](const RateRuleStats& s) { return s.local_refusals; });
  counter("fairgate_ratelimit_store_errors_total",
          "Redis calls of this rule that failed (timeout, disconnect, error).",
          [](const RateRuleStats& s) { return s.store_errors; });
  counter("fairgate_ratelimit_degraded_total", "Decisions made under on_redis_down (Redis unreachable).",
          [](const RateRuleStats& s) { return s.degraded; });
  counter("fairgate_ratelimit_refunded_units_total", "Units given back by refunds.",
          [](const RateRuleStats& s) { return s.refunded; });
  counter("fairgate_ratelimit_store_calls_total", "Round trips to the store (Redis) for this rule.",
          [](const RateRuleStats& s) { return s.store_calls; });
  header(out, "fairgate_ratelimit_shadow", "gauge",
         "1 while the rule runs in shadow mode (its refused_total counts what it would have refused).");
  for (const auto& r : rules)
    out += fmt::format("fairgate_ratelimit_shadow{{rule=\"{}\"}} {}\n", r.name,
                       r.rule.mode == LimiterMode::shadow ? 1 : 0);
  header(out, "fairgate_ratelimit_limit", "gauge", "The rule's capacity (rate, or burst for the buckets).");
  for (const auto& r : rules)
    out += fmt::format("fairgate_ratelimit_limit{{rule=\"{}\"}} {}\n", r.name, r.rule.capacity());
  header(out, "fairgate_ratelimit_degraded", "gauge", "1 while the rate limiter's last Redis call failed.");
  out += fmt::format("fairgate_ratelimit_degraded {}\n", rates.degraded() ? 1 : 0);
}

}  // namespace fairgate::serve
