// core/limiter_state.hpp — the fair limiter of one process, as pure logic.
//
// Holds the holders (requests with a permit) and the FIFO queue of waiters,
// and decides every admission, grant and drop. The memory backend wraps it
// with a mutex and timers; the Redis scripts implement the same rules.
//
// Invariants (checked by tests/unit/core_limiter_state_test.cpp):
//  I1 No overshoot: while enabled, a grant happens only when
//     holders < max_concurrent. (Lowering max_concurrent never revokes: the
//     holders above the new cap simply finish.)
//  I2 FIFO: waiters are granted in arrival (sequence) order; a new arrival is
//     never granted while the queue is not empty.
//  I3 Work-conserving: after every call, either the queue is empty or there
//     is no room (every call that can free room ends in dispatch()).
//  I4 A waiter whose deadline has passed is never granted: dispatch() and
//     expire() drop it with reason timeout.
//  I5 Each id is at most once a waiter and at most once a holder, never both.
//
// Pure: no I/O, no clock reads (time is a parameter), no locking (the caller
// serialises access).
#pragma once

#include <fairgate/error.hpp>
#include <fairgate/settings.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

namespace fairgate::core {

using Time = std::chrono::steady_clock::time_point;
using RequestId = std::uint64_t;

/// Receives the decisions dispatch() takes, in order.
class DispatchSink {
 public:
  /// The queue head `id` may take a permit now. Return false when the request
  /// has already ended (cancelled, timed out): it is then dropped, no permit made.
  virtual bool try_grant(RequestId id) = 0;
  /// `id` left the queue without a permit, for `reason`.
  virtual void drop(RequestId id, RejectReason reason) = 0;

 protected:
  ~DispatchSink() = default;
};

/// The answer to a new request.
struct Admission {
  enum class Kind : std::uint8_t { granted, queued, rejected };
  Kind kind = Kind::rejected;
  RejectReason reason = RejectReason::unavailable;          ///< when rejected
  std::size_t position = 0;                                 ///< when queued (1 = head)
  std::optional<std::chrono::milliseconds> estimated_wait;  ///< when queued
};

/// Recent release times — the rate at which seats free up, which is the rate
/// the queue moves — behind position estimates (F7).
class GrantRate {
 public:
  void record(Time t) noexcept;
  /// Estimated wait of the waiter at `position`, or nullopt without history.
  std::optional<std::chrono::milliseconds> estimate(std::size_t position, Time now) const noexcept;

 private:
  static constexpr std::size_t kWindow = 32;
  std::array<Time, kWindow> times_{};
  std::size_t count_ = 0;  // total recorded (ring index = count_ % kWindow)
};

class LimiterState {
 public:
  struct Waiter {
    std::uint64_t seq = 0;  ///< arrival order
    Time enqueued{};
    Time deadline{};
    std::string tenant;
  };
  struct Holder {
    std::uint64_t grant_seq = 0;  ///< grant order
    Time granted{};
    std::string tenant;
  };

  explicit LimiterState(Settings settings) : settings_(std::move(settings)) {}

  const Settings& settings() const noexcept { return settings_; }

  /// A new request `id` (unused so far) arriving at `now` that may wait until
  /// `deadline`: granted at once, queued, or rejected (queue_full, disabled,
  /// timeout when it cannot wait or would surely wait too long).
  Admission admit(RequestId id, Time now, Time deadline, std::string tenant);

  /// Returns holder `id`'s permit and dispatches. False (and no effect) when
  /// `id` holds no permit — so a double release is harmless.
  bool release(RequestId id, Time now, DispatchSink& sink);

  /// Removes waiter `id` from the queue (cancel). False when it is not waiting.
  bool withdraw(RequestId id);

  /// Drops every waiter whose deadline is <= now, with reason timeout.
  void expire(Time now, DispatchSink& sink);

  /// Replaces the settings (already validated) and dispatches (F9, F11).
  void configure(Settings settings, Time now, DispatchSink& sink);

  /// Drops every waiter with `reason` (shutdown).
  void drop_all(RejectReason reason, DispatchSink& sink);

  /// The earliest waiter deadline, if anyone waits.
  std::optional<Time> next_deadline() const;

  std::size_t in_use() const noexcept { return holders_.size(); }
  std::size_t queued() const noexcept { return queue_.size(); }
  bool waiting(RequestId id) const { return waiters_.contains(id); }
  bool holding(RequestId id) const { return holders_.contains(id); }
  const Waiter* waiter(RequestId id) const;
  const Holder* holder(RequestId id) const;

  /// 1-based position of waiter `id`; O(queue length).
  std::optional<std::size_t> position(RequestId id) const;

  /// Calls f(id, position, waiter) for each waiter, head first.
  template <typename F>
  void for_each_waiter(F&& f) const {
    std::size_t position = 0;
    for (const auto& [seq, id] : queue_) f(id, ++position, waiters_.at(id));
  }
  /// Calls f(id, holder) for each holder, in no particular order.
  template <typename F>
  void for_each_holder(F&& f) const {
    for (const auto& [id, h] : holders_) f(id, h);
  }

  std::optional<std::chrono::milliseconds> estimated_wait(std::size_t position, Time now) const {
    return rate_.estimate(position, now);
  }

 private:
  bool has_room() const noexcept;
  void grant(RequestId id, Time now, std::string tenant);
  void remove_waiter(std::unordered_map<RequestId, Waiter>::iterator it);
  void dispatch(Time now, DispatchSink& sink);

  Settings settings_;
  std::uint64_t next_seq_ = 0;
  std::uint64_t next_grant_seq_ = 0;
  std::map<std::uint64_t, RequestId> queue_;        // seq → id: the FIFO
  std::set<std::pair<Time, RequestId>> deadlines_;  // earliest first
  std::unordered_map<RequestId, Waiter> waiters_;
  std::unordered_map<RequestId, Holder> holders_;
  GrantRate rate_;
};

}  // namespace fairgate::core
