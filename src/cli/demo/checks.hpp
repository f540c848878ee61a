// cli/demo/checks.hpp — the invariants `fairgate demo` checks at the end,
// from what each user saw on its own stream and from the mock model's
// counters (docs/product.md: F1 cap, F2 FIFO, F3 max wait, F4 one end per
// request). Pure: no I/O, no clock; unit-tested in tests/unit/demo_checks_test.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fairgate::cli::demo {

using Clock = std::chrono::steady_clock;

/// Real time a granted request may take beyond max_wait until its first
/// token reaches the client: the gateway's upstream call and three hops on loopback.
inline constexpr auto kSeatSlack = std::chrono::milliseconds(100);
/// FIFO is checked on the clients' view: two users granted a moment apart may
/// see their first tokens in either order; closer than this counts as a tie.
inline constexpr auto kOrderSlack = std::chrono::milliseconds(20);

enum class Phase : std::uint8_t { not_arrived, waiting, streaming, done, busy, other };

/// Served ([DONE]), told busy, or ended otherwise.
bool ended(Phase p);

/// "1st", "2nd", "3rd", "4th", "11th", "21st", ...
std::string ordinal(std::size_t n);

/// What one user saw, from its own stream (client-side times).
struct Seen {
  std::string name;
  std::size_t arrival_rank = 0;  ///< 1 = first to ask
  std::uint32_t tokens = 0;      ///< answer length asked for (max_tokens)
  Phase phase = Phase::not_arrived;
  Clock::time_point arrived_at{};
  Clock::time_point seated_at{};  ///< first chunk of the answer
  Clock::time_point ended_at{};   ///< [DONE], or the rejection
  int ends = 0;                   ///< [DONE]s and errors received: must be 1
  std::uint32_t streamed = 0;     ///< content tokens received
  std::string message;            ///< why it ended, when not [DONE]
  /// The limiter's own wait until grant, from the gateway's "admitted" event
  /// (sent to streams that queued); the first token comes later, after the model.
  std::optional<std::chrono::milliseconds> admitted_after;
  Clock::time_point admitted_at{};  ///< when that "admitted" event arrived

  /// When the client learned it had a seat: the "admitted" event when it
  /// queued (sent at the grant), else the first chunk. The first chunk also
  /// carries the model's own delay, which differs from answer to answer.
  Clock::time_point seat_seen_at() const;
  /// Time from sending the request to the seat (served) or to the rejection (real time).
  Clock::duration waited() const;
};

/// What the run knows besides the users' streams.
struct Facts {
  std::chrono::milliseconds real_max_wait{0};  ///< the limiter's max wait, real time
  std::uint32_t seats = 0;
  std::size_t arrivals = 0;  ///< users that asked
  // The mock model's counters (mockllm::Stats): it counts what is exact.
  std::uint32_t model_peak_in_flight = 0;
  std::uint64_t model_rejected_429 = 0;
  std::uint64_t model_completed = 0;
  // The limiter's state at the end, as GET /v1/limiters/chat said (absent: unreadable).
  std::optional<std::int64_t> final_in_use;
  std::optional<std::int64_t> final_queued;
};

struct Verdict {
  std::size_t granted = 0, busy = 0, other = 0;
  std::optional<std::string> fifo_problem;  ///< the first FIFO inversion, in words
  bool under_cap = false;                   ///< never more than `seats` at the model, none refused
  bool limiter_empty = false;
  std::vector<std::string> violations;  ///< empty: every invariant held
};

/// Checks every invariant. `users`: every user of the run (arrived or not);
/// `by_arrival`: those that asked, in the order they asked.
Verdict check(const std::vector<const Seen*>& users, const std::vector<const Seen*>& by_arrival,
              const Facts& facts);

}  // namespace fairgate::cli::demo
