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
// Tenants (F12). Every waiter and holder belongs to a tenant (the empty tenant
// "" included); per-tenant queues and holder counts are always kept. While the
// settings are tenant-aware (tenant_fairness or max_per_tenant), dispatch works
// on tenants instead of the global queue:
//  * `ready_` orders the tenants that wait and are below their cap: by
//    rotation turn (tenant_fairness: a tenant joins at the back, and goes to
//    the back after its turn of `weight` grants) or by the sequence of its
//    oldest waiter (fairness off: global FIFO that skips capped tenants).
//  * A tenant that waits but is at max_per_tenant is parked (not in ready_);
//    it rejoins ready_ (at the back of the rotation) when one of its permits
//    returns or the cap is raised. So each grant costs O(log tenants), never a
//    scan over tenants.
//  Restated invariants in tenant-aware mode:
//  I2' FIFO within a tenant: a tenant's waiters are granted in arrival order.
//      Under fairness, a tenant that waits is granted within one rotation of
//      the tenants ahead of it (no starvation).
//  I3' Work-conserving except for tenant caps: after every call, either no
//      room, or every waiter belongs to a parked tenant (ready_ is empty).
//  I6  No tenant holds more than max_per_tenant permits through a grant made
//      while enabled (lowering the cap never revokes, as for max_concurrent).
//
// Pure: no I/O, no clock reads (time is a parameter), no locking (the caller
// serialises access).
#pragma once

#include <fairgate/error.hpp>
#include <fairgate/settings.hpp>

#include "core/service_pace.hpp"

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

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

/// True when reject_early turns away an arrival whose wait estimate is
/// `estimate` and that may wait `max_wait`: the estimate exceeds max_wait by
/// more than the margin, max(kRejectEarlyMargin, max_wait / 4) (docs/eta.md).
inline constexpr std::chrono::milliseconds kRejectEarlyMargin{100};
bool would_time_out(std::chrono::milliseconds estimate, std::chrono::milliseconds max_wait) noexcept;

/// Tenant fairness (F12): the place (1 = next) of the k-th waiter (1-based) of
/// the tenant at index `i` of `lengths`, the queue lengths of the tenants that
/// wait in rotation order, in a round robin of one grant per tenant per turn
/// with nobody arriving meanwhile: every tenant's first k-1 waiters (all of a
/// shorter queue) come first, then the k-th of each tenant ahead of it in the
/// rotation. O(tenants).
std::size_t round_robin_position(const std::vector<std::size_t>& lengths, std::size_t i, std::size_t k);

class LimiterState {
 public:
  struct Waiter {
    std::uint64_t seq = 0;  ///< arrival order
    Time enqueued{};
    Time deadline{};
    std::string tenant;
    std::uint32_t weight = 1;  ///< share weight (fairness), see AcquireOptions::weight
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
  /// timeout when it cannot wait, would_time_out when reject_early is on and
  /// the estimate exceeds its wait by the margin, see would_time_out()).
  Admission admit(RequestId id, Time now, Time deadline, std::string tenant, std::uint32_t weight = 1);

  /// Counts `id` (unused so far) as a holder without any check: a permit that
  /// already exists elsewhere (the Redis backend seeds its local fallback with
  /// the permits it holds). May leave the state above its cap (like lowering
  /// max_concurrent): nothing more is granted until below it.
  void adopt(RequestId id, Time granted, std::string tenant) { grant(id, granted, std::move(tenant)); }

  /// From now on each tenant may hold at most what it holds now (a tenant holding
  /// nothing: nothing), on top of max_per_tenant. The Redis backend's local fallback
  /// reuses the seats Redis counts for its instance while Redis is out of reach; each
  /// instance decides alone then, so only a tenant reusing its own seats keeps
  /// max_per_tenant across the instances (docs/design.md, "Degraded modes").
  void cap_tenants_at_their_holders();

  /// Returns holder `id`'s permit and dispatches. False (and no effect) when
  /// `id` holds no permit — so a double release is harmless.
  bool release(RequestId id, Time now, DispatchSink& sink);

  /// Removes waiter `id` from the queue (cancel). False when it is not waiting.
  /// With `now`, its departure counts in the pace (ServicePace::on_departure).
  bool withdraw(RequestId id, std::optional<Time> now = std::nullopt);

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

  /// 1-based position of waiter `id`; O(queue length). Without fairness:
  /// its rank in arrival order. With tenant_fairness: round_robin_position()
  /// over the tenants in rotation order (the ready ones, then the parked ones
  /// by their oldest waiter) — exact with weights 1, no cap binding and
  /// nobody arriving meanwhile; weights > 1 of others can make it later, its
  /// own weight earlier.
  std::optional<std::size_t> position(RequestId id) const;

  /// Calls f(id, position, waiter) for each waiter in arrival order (positions
  /// as position() gives them); O(waiters + tenants) under fairness too.
  template <typename F>
  void for_each_waiter(F&& f) const {
    std::size_t rank = 0;
    if (!settings_.tenant_fairness) {
      for (const auto& [seq, id] : queue_) f(id, ++rank, waiters_.at(id));
      return;
    }
    const auto positions = fair_positions();
    for (const auto& [seq, id] : queue_) f(id, positions.at(id), waiters_.at(id));
  }

  /// Tenants that wait (ready or parked).
  std::size_t waiting_tenants() const noexcept { return waiting_tenants_; }
  /// Permits `tenant` holds.
  std::size_t tenant_holders(const std::string& tenant) const;
  /// Waiters of `tenant`.
  std::size_t tenant_queued(const std::string& tenant) const;
  /// True when `tenant` waits but is at its cap (skipped by dispatch).
  bool tenant_parked(const std::string& tenant) const;
  /// Calls f(id, holder) for each holder, in no particular order.
  template <typename F>
  void for_each_holder(F&& f) const {
    for (const auto& [id, h] : holders_) f(id, h);
  }

  std::optional<std::chrono::milliseconds> estimated_wait(std::size_t position, Time now) const {
    return pace_.estimate(position, now);
  }
  /// The measured pace (for status pages and the measurement program).
  PaceFigures pace(Time now) const noexcept { return pace_.figures(now); }
  /// The seat pace: releases of a full limiter only (early rejection).
  PaceFigures seat_pace(Time now) const noexcept { return seat_pace_.figures(now); }

 private:
  struct Tenant {
    std::map<std::uint64_t, RequestId> queue;  // seq → id: FIFO within the tenant
    std::size_t holders = 0;
    std::uint32_t credit = 0;                  // grants left in its current turn; 0 = a turn starts anew
    std::optional<std::uint64_t> ready_score;  // its key in ready_ while ready
    bool parked = false;                       // waits, but at its cap
  };
  using TenantMap = std::unordered_map<std::string, Tenant>;
  /// cap_tenants_at_their_holders(): each tenant's cap (absent: 0), beside max_per_tenant.
  std::optional<std::unordered_map<std::string, std::size_t>> held_caps_;

  bool has_room() const noexcept;
  bool at_cap(const std::string& name, const Tenant& t) const noexcept;
  void grant(RequestId id, Time now, std::string tenant);
  void remove_waiter(std::unordered_map<RequestId, Waiter>::iterator it);
  void dispatch(Time now, DispatchSink& sink);
  void dispatch_tenants(Time now, DispatchSink& sink);
  /// Puts a tenant that waits into ready_ (back of the rotation / by its head)
  /// or parks it when at its cap. Tenant-aware mode only.
  void place(TenantMap::iterator t);
  /// Takes a tenant out of ready_ and the parked state.
  void unplace(const std::string& name, Tenant& t);
  /// Forgets a tenant with no waiter and no holder.
  void forget_if_idle(TenantMap::iterator t);
  /// Rebuilds ready_ and the parked states from the tenants' queues (after a
  /// settings change), the rotation in order of each tenant's oldest waiter.
  void rebuild_tenants();
  /// The tenants that wait, in rotation order: the ready ones, then the
  /// parked ones by their oldest waiter (they rejoin at the back).
  std::vector<std::pair<const std::string*, const Tenant*>> rotation() const;
  /// The queue lengths of rotation(), for round_robin_position(), and the index of
  /// `tenant` among them (appended at the back, with length 0, when it waits not).
  std::pair<std::vector<std::size_t>, std::size_t> rotation_lengths(const std::string& tenant) const;
  /// Every waiter's position under fairness (as position() gives it).
  std::unordered_map<RequestId, std::size_t> fair_positions() const;
  /// reject_early: would an arrival with this estimate and deadline wait past
  /// its max wait? Only if the estimate exceeds it by the margin and, in one
  /// FIFO, wait_behind (waiters ahead that time out first make way) exceeds it too.
  bool rejects_early(std::chrono::milliseconds estimate, Time deadline, Time now) const;

  Settings settings_;
  std::uint64_t next_seq_ = 0;
  std::uint64_t next_grant_seq_ = 0;
  std::map<std::uint64_t, RequestId> queue_;        // seq → id: the FIFO
  std::set<std::pair<Time, RequestId>> deadlines_;  // earliest first
  std::unordered_map<RequestId, Waiter> waiters_;
  std::unordered_map<RequestId, Holder> holders_;
  TenantMap tenants_;
  std::set<std::pair<std::uint64_t, std::string>> ready_;  // tenant-aware mode: dispatch order
  std::uint64_t next_turn_ = 0;                            // rotation ticket (fairness)
  std::size_t waiting_tenants_ = 0;
  ServicePace pace_;
  ServicePace seat_pace_;  // releases only: how fast seats free (wait_behind)
};

}  // namespace fairgate::core
