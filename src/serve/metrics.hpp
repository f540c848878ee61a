// serve/metrics.hpp — what the server counts beyond the library's own
// per-limiter counters (LimiterStats), and the Prometheus text rendering.
//
// Thread-safety: every member may be used from any thread (atomics; the
// per-limiter map is filled before the server starts and read-only after).
#pragma once

#include <fairgate/backend.hpp>
#include <fairgate/rate_limiter.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fairgate::serve {

/// The reasons a request ends without a permit other than a timeout (counted
/// apart, fairgate_timeouts_total): the `reason` label of the rejection series.
inline constexpr RejectReason kRejectionReasons[] = {
    RejectReason::queue_full,       RejectReason::disabled, RejectReason::unavailable,
    RejectReason::invalid_argument, RejectReason::shutdown, RejectReason::would_time_out};

/// A duration histogram (waits, hold times, latencies), cumulative buckets
/// as Prometheus wants them. Thread-safe (atomics).
class Histogram {
 public:
  /// Upper bounds in seconds (the last bucket, +Inf, is implicit).
  static constexpr std::array<double, 14> kBounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                     1,     2.5,  5,     10,   30,  60,   300};
  void observe(std::chrono::milliseconds d) noexcept;
  /// Appends the `NAME_bucket`, `NAME_sum` and `NAME_count` series with
  /// `labels` (`limiter="chat"`) to `out`.
  void render(std::string_view name, std::string_view labels, std::string& out) const;
  /// Appends the `fairgate_wait_seconds` series of `limiter` to `out`.
  void render(const std::string& limiter, std::string& out) const {
    render("fairgate_wait_seconds", "limiter=\"" + limiter + "\"", out);
  }

 private:
  std::array<std::atomic<std::uint64_t>, kBounds.size() + 1> buckets_{};  // not cumulative
  std::atomic<std::uint64_t> count_{0};
  std::atomic<std::uint64_t> sum_ms_{0};
};

/// Wait time until grant.
using WaitHistogram = Histogram;

struct Metrics {
  explicit Metrics(const std::vector<std::string>& limiter_names);

  /// nullptr for a limiter that was not known at start-up.
  WaitHistogram* wait_histogram(const std::string& limiter) const;
  /// How long permits were held (grant to release); nullptr as above.
  Histogram* hold_histogram(const std::string& limiter) const;

  /// Counts one HTTP response by its status code.
  void count_response(unsigned code) noexcept {
    if (code < responses_by_code.size()) responses_by_code[code].fetch_add(1, std::memory_order_relaxed);
  }

  std::atomic<std::uint64_t> http_requests{0};
  std::atomic<std::uint64_t> http_bad_requests{0};  ///< 4xx answers to malformed or refused requests
  std::atomic<std::uint64_t> connections_refused{0};
  std::atomic<std::uint64_t> connections_open{0};
  std::atomic<std::uint64_t> connections_timed_out{0};
  std::atomic<std::uint64_t> sse_streams{0};          ///< open acquire streams
  std::atomic<std::uint64_t> client_cap_refusals{0};  ///< per-client waiter cap hit
  std::atomic<std::uint64_t> leases_expired{0};
  std::array<std::atomic<std::uint64_t>, 600> responses_by_code{};  ///< HTTP responses sent, by status

 private:
  std::map<std::string, std::unique_ptr<WaitHistogram>> histograms_;
  std::map<std::string, std::unique_ptr<Histogram>> hold_histograms_;
};

/// The whole /metrics page: per-limiter state and counters from the backend,
/// then the server's own counters. `leases` = JSON permits held right now.
std::string render_metrics(const Backend& backend, const Metrics& metrics, std::size_t leases);

/// Appends the per-rule rate-limit series (fairgate_ratelimit_*) of `rates`.
void render_rate_metrics(const RateLimiter& rates, std::string& out);

}  // namespace fairgate::serve
