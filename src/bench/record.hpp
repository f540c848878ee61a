// bench/record.hpp — what a load generator records about one request, and
// the figures computed from many such records.
//
// Every system the benchmark drives (fairgate's own workers, and later the
// peers) writes the same record per request, with timestamps from the
// machine's monotonic clock (CLOCK_MONOTONIC, shared by every process on one
// machine). One analyzer turns the records of a run into the figures of
// docs/bench.md, the same way for every system.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fairgate::bench {

/// Nanoseconds on the monotonic clock (std::chrono::steady_clock on Linux).
std::int64_t now_ns() noexcept;

struct RequestRecord {
  std::string instance;  ///< which process/instance sent it
  std::uint64_t index = 0;
  std::int64_t arrive_ns = 0;   ///< acquire called
  std::int64_t grant_ns = 0;    ///< grant received (0 if none)
  std::int64_t release_ns = 0;  ///< release called (0 if none)
  std::int64_t end_ns = 0;      ///< ended without a permit (0 if granted, or unknown)
  bool queued = false;          ///< it had to wait in the queue
  /// Its place in the limiter's arrival order as the limiter saw it (0 when
  /// unknown or never queued): fairgate's QueueStatus::sequence.
  std::uint64_t sequence = 0;
  /// granted | timed_out | cancelled | rejected
  std::string outcome;
  std::string reason;  ///< for rejected: timeout, queue_full, ...

  bool granted() const noexcept { return grant_ns != 0; }
};

/// One JSON object (no newline): {"ev":"req",...}.
std::string to_json(const RequestRecord& record);
/// Parses what to_json wrote; nullopt if `json` is not such an object.
std::optional<RequestRecord> request_from_json(std::string_view json);

/// A distribution in milliseconds.
struct Distribution {
  std::size_t count = 0;
  double p50 = 0, p99 = 0, max = 0;
  /// The values at kCdfPoints (for plots); empty when count == 0.
  std::vector<double> cdf;
};
/// Percentiles reported in Distribution::cdf.
inline constexpr double kCdfPoints[] = {0.01, 0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99, 0.999, 1.0};
Distribution distribution_ms(std::vector<std::int64_t> values_ns);

struct Figures {
  std::size_t requests = 0;
  std::size_t grants = 0, timeouts = 0, cancels = 0, rejections = 0;
  /// Most permits held at once, from the records' [grant, release] intervals.
  /// Those intervals lie inside the real ones (a grant is recorded after Redis
  /// made it, a release before Redis sees it), so max_holders can only
  /// under-count: a value above the cap is a real overshoot.
  std::size_t max_holders = 0;
  std::size_t overshoot = 0;  ///< max(0, max_holders - cap)
  /// FIFO inversions in the limiter's own arrival order: pairs (a, b) of
  /// granted requests with sequence_a < sequence_b where b was granted more
  /// than `margin` before a (records without a sequence are left out).
  std::uint64_t inversions = 0;
  /// Granted records that carry a sequence: 0 means `inversions` could not
  /// be measured (the system reports no arrival order of its own).
  std::size_t sequenced = 0;
  /// The same in client time only: a arrived more than `margin` before b and
  /// b was granted more than `margin` before a. Noisier: a burst queues
  /// requests in the client before they reach the limiter.
  std::uint64_t inversions_client_time = 0;
  /// For each queued request that was granted: grant time minus the latest
  /// release recorded before it (if that release came after its arrival).
  Distribution handoff;
  Distribution wait;  ///< grant - arrive, every granted request
  std::int64_t first_arrive_ns = 0, last_end_ns = 0;
};

/// `cap` is the limiter's max_concurrent; `margin_ns` the FIFO margin (2 ms in docs/bench.md).
Figures analyze(const std::vector<RequestRecord>& records, std::size_t cap,
                std::int64_t margin_ns = 2'000'000);

}  // namespace fairgate::bench
