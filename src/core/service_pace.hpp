// core/service_pace.hpp — the wait estimate (F7): how fast a full limiter
// frees seats, and what that says about a waiter at a given position.
//
// The queue moves one place per released seat (refilled from its head) and per
// waiter that leaves it without a seat (timed out, cancelled) — but only while
// the limiter is full: a release into a limiter with free seats, or idle time
// with nobody waiting, says nothing about how long a waiter waits. So the pace
// is measured only between two such advances of a full limiter, the first
// being a release that left every seat taken: the interval between them is one
// "gap". Counting departures matters when waiters ahead give up: with a 1 s
// max_wait under overload most of those ahead time out, and an estimate from
// releases alone was up to twice the real wait (docs/eta.md). Its running mean (the first kWarmSamples
// averaged, then an exponential mean with weight kWeight) is the pace.
//
// Estimate for the waiter at position p, e ms after the last saturated
// release (e = 0 when the limiter has not been full since):
//     (p - 1) x gap + max(gap - e, gap / 2)
// — p releases away, the next one partly elapsed (never counted below half a
// gap: a release that is late says nothing about how soon it comes).
// Absent (nullopt) with fewer than kMinSamples gaps, or when the last gap was
// measured more than kStale ago: no history is better than an old one.
//
// The Redis backend keeps the same four numbers in the limiter's cfg hash,
// updated by release.lua in Redis time (src/redis/scripts/lib.lua: pace_*),
// so every instance estimates from the cluster-wide pace; the Lua code uses
// the same formula and constants (docs/eta.md).
//
// Pure: no clock reads.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace fairgate::core {

struct PaceFigures {
  double gap_ms = 0;          ///< mean interval between saturated releases
  std::uint32_t samples = 0;  ///< gaps measured (capped at kMaxSamples)
  /// ms since the last release that left the limiter full, while it stayed
  /// full since; nullopt when it has not been full since its last release.
  std::optional<double> since_full_ms;
  double age_ms = 0;  ///< ms since the last gap was measured
};

inline constexpr std::uint32_t kPaceMinSamples = 3;
inline constexpr std::uint32_t kPaceWarmSamples = 8;
inline constexpr std::uint32_t kPaceMaxSamples = 1'000'000;
inline constexpr double kPaceWeight = 0.125;
inline constexpr std::chrono::milliseconds kPaceStale{std::chrono::minutes(10)};

/// The estimate for `position` (1 = next) from the figures, or nullopt.
std::optional<std::chrono::milliseconds> estimate_wait(const PaceFigures& f, std::size_t position) noexcept;

/// The wait of a newcomer at the back of a FIFO queue, for early rejection
/// (reject_early, docs/eta.md): seats free at the *seat* pace `seats` (the
/// mean interval between two releases of a full limiter, departures not
/// counted), and each waiter ahead takes the next seat unless its deadline
/// comes first — then it times out and takes none. `next_deadline()` gives
/// the deadlines of the waiters ahead in queue order, in ms from now, and
/// nullopt after the last. Stops as soon as the wait passes `limit_ms` (the
/// result is then above it). nullopt without a (recent) seat pace.
template <typename NextDeadline>
std::optional<double> wait_behind(const PaceFigures& seats, NextDeadline&& next_deadline, double limit_ms) {
  if (seats.samples < kPaceMinSamples || !(seats.gap_ms > 0.0)) return std::nullopt;
  if (seats.age_ms > static_cast<double>(kPaceStale.count())) return std::nullopt;
  const double e = std::max(0.0, seats.since_full_ms.value_or(0.0));
  double seat = std::max(seats.gap_ms - e, seats.gap_ms / 2.0);  // when the next seat frees
  while (seat <= limit_ms) {
    const std::optional<double> deadline = next_deadline();
    if (!deadline) break;
    if (*deadline < seat) continue;  // gone before its turn: the seat goes further back
    seat += seats.gap_ms;
  }
  return seat;
}

/// The running mean after one more gap of `gap_ms` (samples before the gap).
double next_gap_mean(double mean, std::uint32_t samples, double gap_ms) noexcept;

/// The pace of one limiter of the memory backend (time is a parameter).
class ServicePace {
 public:
  using Time = std::chrono::steady_clock::time_point;
  /// A seat was released at `now`; `full_after` = every seat is taken again
  /// (it was refilled from the queue at once).
  void on_release(Time now, bool full_after) noexcept;
  /// A waiter left the queue without a seat (timeout, cancel) at `now`: one
  /// more advance of the queue when the limiter is full. A seat pace (see
  /// wait_behind) never calls it.
  void on_departure(Time now) noexcept;
  /// Something other than a release changed the seats (the cap was changed):
  /// the interval running now is not a saturated gap.
  void interrupt() noexcept { last_full_.reset(); }
  PaceFigures figures(Time now) const noexcept;
  std::optional<std::chrono::milliseconds> estimate(std::size_t position, Time now) const noexcept {
    return estimate_wait(figures(now), position);
  }

 private:
  double gap_ms_ = 0;
  std::uint32_t samples_ = 0;
  std::optional<Time> last_full_;  // the last release that left every seat taken
  Time sampled_at_{};
};

}  // namespace fairgate::core
