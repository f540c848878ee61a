// fairgate/limiter.hpp — the fair concurrency limiter, backend-independent.
//
// A Limiter is a cheap, copyable handle to one named limiter of a Backend
// (see backend.hpp). Requests acquire a Permit with async_acquire(); waiters
// are served in arrival order (F2); every request ends exactly once (F4) as
// granted, timed out, cancelled or rejected.
//
// Thread-safety: every member function may be called from any thread.
#pragma once

#include <fairgate/detail/completion.hpp>
#include <fairgate/error.hpp>
#include <fairgate/permit.hpp>
#include <fairgate/settings.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/system/result.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fairgate {

/// Where a waiter stands (F7).
struct QueueStatus {
  /// 1 = next to be served. Under tenant fairness an estimate: the grants up
  /// to this one if every waiting tenant takes one grant per turn (see
  /// docs/design.md, "Tenant fairness").
  std::size_t position = 0;
  std::size_t queued = 0;  ///< waiters in the queue, this one included
  /// Estimated time until grant, from the recent service rate; nullopt when
  /// there is not enough history yet.
  std::optional<std::chrono::milliseconds> estimated_wait;
  /// This request's place in the limiter's arrival order (cluster-wide on
  /// Redis): a later arrival has a larger number, and waiters are served in
  /// increasing order. Lets a client check FIFO for itself.
  std::uint64_t sequence = 0;
  /// The request's id as snapshots list it: WaiterInfo::ticket while it
  /// waits, then HolderInfo::permit and Permit::id() once granted.
  std::string ticket;
};

/// Options of one acquire.
struct AcquireOptions {
  /// Deadline, relative to the call. nullopt = the limiter's max_wait.
  std::optional<std::chrono::milliseconds> max_wait;
  /// Tenant key, reported in snapshots and used by tenant fairness and the
  /// per-tenant cap (F12). Requests with an empty tenant form the tenant "".
  std::string tenant;
  /// Share weight under tenant fairness (F12), 1 .. kMaxTenantWeight (else the
  /// acquire is rejected with invalid_argument). When a tenant's turn in the
  /// round robin starts, it may take as many consecutive grants as the weight
  /// of its oldest waiter (the request served next), so a tenant whose
  /// requests all carry weight w gets w grants per round. Ignored without
  /// tenant_fairness.
  std::uint32_t weight = 1;
  /// Called when the request is first queued and whenever its position
  /// changes (coalesced), on the limiter's executor, while the request waits.
  /// The check "still waiting" and the call are not atomic: in rare races one
  /// update arrives just after the grant was decided, so treat the completion
  /// as the truth. Must not block. May be empty.
  std::function<void(const QueueStatus&)> on_queued;
};

/// How a request ended.
enum class Outcome : std::uint8_t { granted, timed_out, cancelled, rejected };

std::string_view to_string(Outcome outcome) noexcept;

/// The single result of an acquire: a Permit, or the reason there is none.
class AcquireResult {
 public:
  AcquireResult() = default;
  static AcquireResult granted(Permit permit);
  static AcquireResult ended(RejectReason reason, std::string message, std::chrono::milliseconds waited);

  bool granted() const noexcept { return outcome_ == Outcome::granted; }
  explicit operator bool() const noexcept { return granted(); }
  Outcome outcome() const noexcept { return outcome_; }
  /// Only meaningful when !granted().
  RejectReason reason() const noexcept { return reason_; }
  /// The reason as an error_code; empty when granted.
  boost::system::error_code error() const noexcept;
  /// Human-readable explanation when !granted(), e.g. "waited 20000 ms, no permit free".
  const std::string& message() const noexcept { return message_; }
  std::chrono::milliseconds waited() const noexcept { return waited_; }

  /// The permit (held() only when granted).
  Permit& permit() noexcept { return permit_; }
  /// Moves the permit out.
  Permit take_permit() noexcept { return std::move(permit_); }

 private:
  Outcome outcome_ = Outcome::rejected;
  RejectReason reason_ = RejectReason::unavailable;
  std::string message_;
  std::chrono::milliseconds waited_{0};
  Permit permit_;
};

/// A request that is waiting, as seen by snapshot() and async_status().
struct WaiterInfo {
  std::string ticket;
  std::string tenant;
  std::size_t position = 0;
  std::chrono::milliseconds waited{0};
  /// The instance that queued it (Redis backend: the instance id, the part of
  /// the ticket before '|'); "" on the memory backend.
  std::string instance;
};

/// A request that holds a permit, as seen by snapshot() and async_status().
struct HolderInfo {
  std::string permit;
  std::string tenant;
  std::chrono::milliseconds held{0};
  /// The instance that holds it (Redis backend); "" on the memory backend.
  std::string instance;
};

/// Counters since the limiter was created (this instance).
struct LimiterStats {
  std::uint64_t acquires = 0;    ///< acquire calls
  std::uint64_t grants = 0;      ///< requests that ended GRANTED
  std::uint64_t timeouts = 0;    ///< ended TIMED_OUT
  std::uint64_t cancels = 0;     ///< ended CANCELLED
  std::uint64_t rejections = 0;  ///< ended REJECTED (any reason)
  std::uint64_t releases = 0;    ///< permits returned
  /// Ended requests by RejectReason (index = static_cast<int>(reason)).
  std::array<std::uint64_t, 9> by_reason{};
};

/// How one limiter of the Redis backend stands with Redis on this instance
/// (Snapshot::engine). Zero/false on the memory backend.
struct EngineStatus {
  /// Redis is unreachable: the limiter runs on its on_redis_down policy (D1).
  bool degraded = false;
  /// While degraded with policy `local`: permits this instance may hold.
  std::size_t local_cap = 0;
  /// The limiter's state in Redis was re-created (or lost writes) and is
  /// fenced for this long: no grant until every instance re-registered.
  std::chrono::milliseconds fence_left{0};
  /// Where the settings in force came from: "redis" (the cluster-wide values,
  /// which win once the limiter exists there), "local" (this instance's
  /// start-up values: not confirmed by Redis yet), or "" (memory backend).
  std::string settings_source;
  std::uint64_t degraded_entries = 0;          ///< times it entered degraded mode
  std::chrono::milliseconds degraded_time{0};  ///< time spent degraded in all
  std::uint64_t restores = 0;                  ///< restores Redis acknowledged
  std::uint64_t state_recreations = 0;         ///< times this instance found the state gone and created it
  /// Times this instance saw the state on another Redis than before (a new
  /// replication id: a failover or a restart, which may have lost the last
  /// grants), fenced by the script that found it.
  std::uint64_t redis_switches = 0;
  /// Times this instance saw that a script had found the limiter's holders
  /// key deleted (evicted under a maxmemory-policy other than noeviction, or
  /// a DEL) and fenced the state (docs/design.md, recovery rule 15).
  std::uint64_t holders_key_lost = 0;
  /// Times this instance saw that a script had found a tenant key of the
  /// limiter deleted (tenant fairness, max_per_tenant) and rebuilt them all
  /// from the queue and the permits (docs/design.md, recovery rule 15).
  std::uint64_t tenant_keys_rebuilt = 0;
  /// Heartbeats that found this instance's liveness in Redis set by another
  /// process, again and again: two processes run with one instance id, which
  /// breaks the cap (docs/faults.md). Logged as an error.
  std::uint64_t instance_id_shared = 0;
  std::chrono::milliseconds fenced_time{0};  ///< time seen fenced in all
  /// Permits this instance put back although the cap was already reached (its
  /// work kept running while Redis had reaped it: a pause or a partition
  /// longer than the liveness TTL).
  std::uint64_t overshoot_restored = 0;
};

/// Upper bounds (seconds) of ShadowStatus::would_wait_buckets; the last bucket
/// counts the waits above the last bound.
inline constexpr std::array<double, 12> kShadowWaitBounds{0.005, 0.01, 0.025, 0.05, 0.1,  0.25,
                                                          0.5,   1.0,  2.5,   5.0,  10.0, 30.0};

/// What shadow mode (LimiterMode::shadow, F14) let through and what enforcing
/// would have done with the same requests, on this instance since the limiter
/// was created (docs/shadow.md). Each request let through is shadowed by one
/// acquire on the limiter itself (cluster-wide on Redis); that shadow's
/// outcome is the would-be outcome. All zero while nothing ran in shadow mode.
struct ShadowStatus {
  std::uint64_t passed = 0;       ///< requests let through at once in shadow mode
  std::size_t in_flight = 0;      ///< of those, not released yet
  std::uint64_t would_grant = 0;  ///< shadows granted (enforcing would have served them)
  std::uint64_t would_queue = 0;  ///< of those, granted only after waiting
  /// Shadows that ended without a permit, by RejectReason (index =
  /// static_cast<int>(reason)): timeout = would have timed out, queue_full,
  /// would_time_out, ... = would have been rejected.
  std::array<std::uint64_t, 9> would_end_by_reason{};
  std::uint64_t would_wait_ms_sum = 0;          ///< total wait of the granted shadows
  std::chrono::milliseconds would_wait_max{0};  ///< longest wait of a granted shadow
  /// Waits of the granted shadows: bucket i counts waits <= kShadowWaitBounds[i]
  /// (and above the previous bound); the last bucket the rest.
  std::array<std::uint64_t, kShadowWaitBounds.size() + 1> would_wait_buckets{};
  /// Shadows still waiting (enforcing would have them queued now).
  std::size_t waiting = 0;

  /// Shadows that ended without a permit, any reason.
  std::uint64_t would_end() const noexcept {
    std::uint64_t n = 0;
    for (auto v : would_end_by_reason) n += v;
    return n;
  }
};

/// A consistent picture of one limiter at one instant.
struct Snapshot {
  std::string name;
  Settings settings;
  std::size_t in_use = 0;
  std::size_t queued = 0;
  std::vector<HolderInfo> holders;  ///< oldest grant first
  std::vector<WaiterInfo> waiters;  ///< queue order (position 1 first)
  LimiterStats stats;
  /// Estimated wait for a new arrival at the back of the queue.
  std::optional<std::chrono::milliseconds> estimated_wait;
  EngineStatus engine;
  /// Shadow mode's figures (F14); in shadow mode in_use, queued, holders,
  /// waiters and stats above describe the would-be limiter (the shadows).
  ShadowStatus shadow;
};

/// Holders and waiters listed per Limiter::async_status call, by default and at most.
inline constexpr std::size_t kDefaultStatusLimit = 100;
inline constexpr std::size_t kMaxStatusLimit = 1000;

/// Which page of the holders and of the waiters Limiter::async_status lists
/// (the same offset and limit apply to each list).
struct StatusQuery {
  std::size_t offset = 0;                   ///< entries of each list to skip
  std::size_t limit = kDefaultStatusLimit;  ///< at most this many of each list (capped at kMaxStatusLimit)
};

/// How Limiter::async_status ended: the status of the whole limiter (on Redis,
/// every instance's holders and waiters, read from Redis in one call).
struct StatusResult {
  /// Empty: `snapshot` holds the status. Errc::unavailable: Redis did not answer
  /// (unreachable, the limiter is degraded, or its state is gone: `message`
  /// says which); Errc::shut_down.
  boost::system::error_code error;
  std::string message;
  /// in_use and queued: the totals (cluster-wide on Redis, as of this call);
  /// holders (oldest grant first) and waiters (queue order): the page asked
  /// for, each entry with its instance. The other fields as snapshot() gives them.
  Snapshot snapshot;
  std::size_t offset = 0;  ///< the page's offset
  std::size_t limit = 0;   ///< the page's limit (after capping)
  /// Redis: the instances whose liveness runs (registered), sorted; memory: empty.
  std::vector<std::string> instances;
  explicit operator bool() const noexcept { return !error; }
};

/// How Limiter::async_configure ended.
struct ConfigureResult {
  /// Empty: applied (cluster-wide on Redis). Errc::invalid_settings: nothing
  /// changed (`message` names the field). Errc::unavailable: the backend could
  /// not confirm the change (Redis unreachable or lost the state meanwhile);
  /// the settings in force did not change here. Errc::shut_down.
  boost::system::error_code error;
  std::string message;  ///< one line: "field: problem", or why it was not applied
  Settings settings;    ///< the settings in force after the call
  explicit operator bool() const noexcept { return !error; }
};

namespace detail {
/// The initiation of Limiter::async_acquire.
struct AcquireInitiation {
  std::shared_ptr<LimiterImpl> impl;
  AcquireOptions options;

  template <typename Handler>
  void operator()(Handler handler) {
    auto slot = boost::asio::get_associated_cancellation_slot(handler);
    auto completion = make_completion(std::move(handler), executor_of(*impl));
    start_acquire(*impl, std::move(options), std::move(completion), slot);
  }
};
}  // namespace detail

/// Handle to one named limiter.
class Limiter {
 public:
  using executor_type = boost::asio::any_io_executor;

  Limiter() = default;
  explicit Limiter(std::shared_ptr<detail::LimiterImpl> impl) noexcept : impl_(std::move(impl)) {}

  /// False for a default-constructed handle.
  bool valid() const noexcept { return impl_ != nullptr; }
  const std::string& name() const;
  /// The executor timers and on_queued callbacks run on.
  executor_type get_executor() const;

  /// Asks for a permit. Completes exactly once with an AcquireResult:
  /// granted (with a Permit), timed out at the deadline (F3), cancelled, or
  /// rejected with a reason (queue full, disabled, shutdown, ...).
  ///
  /// Token: any Asio completion token with signature void(AcquireResult) —
  /// a callback, asio::use_awaitable, asio::use_future, ...
  /// The handler runs on its associated executor (never inside this call).
  ///
  /// g++ 12 caveat: inside a coroutine, name the options first
  /// (`AcquireOptions o{...}; co_await lim.async_acquire(o, use_awaitable);`).
  /// g++ 12 copies a braced temporary written inside a co_await expression
  /// bitwise, which breaks its std::string (found by AddressSanitizer).
  /// Cancellation: emitting on the handler's associated cancellation slot
  /// (terminal, partial or total) ends a waiting request as cancelled; once
  /// granted, cancellation does nothing (the Permit is the caller's).
  template <typename Token>
  auto async_acquire(AcquireOptions options, Token&& token) {
    return boost::asio::async_initiate<Token, void(AcquireResult)>(
        detail::AcquireInitiation{checked_impl(), std::move(options)}, token);
  }
  template <typename Token>
  auto async_acquire(Token&& token) {
    return async_acquire(AcquireOptions{}, std::forward<Token>(token));
  }

  /// In use, queue with positions, holders, counters.
  Snapshot snapshot() const;
  /// The status of the whole limiter, paged (GET /v1/limiters/{name}): the
  /// totals and one page of the holders and of the waiters. On Redis, those of
  /// every instance, with their instance, tenant and age, read in one script
  /// call (snapshot() lists only this instance's, with counts of the last
  /// heartbeat). Token signature void(StatusResult); the handler runs on its
  /// associated executor, never inside this call.
  template <typename Token>
  auto async_status(StatusQuery query, Token&& token) {
    return boost::asio::async_initiate<Token, void(StatusResult)>(
        [impl = checked_impl()](auto handler, StatusQuery q) {
          detail::start_status(
              *impl, q,
              detail::make_completion<StatusResult>(std::move(handler), detail::executor_of(*impl)));
        },
        token, query);
  }

  /// Current settings.
  Settings settings() const;
  /// Hot config (F9): applies `update`; raising max_concurrent admits waiters
  /// at once, lowering it never revokes held permits. Returns the new settings
  /// or the validation error (nothing changed then). On Redis the change is
  /// sent and this returns at once; use async_configure to learn that Redis
  /// applied it.
  boost::system::result<Settings, SettingsError> configure(const SettingsUpdate& update);

  /// Hot config that completes once the change is in force everywhere it
  /// applies (on Redis: once Redis confirmed it, cluster-wide), with a
  /// ConfigureResult. Token signature void(ConfigureResult); the handler runs
  /// on its associated executor, never inside this call.
  template <typename Token>
  auto async_configure(const SettingsUpdate& update, Token&& token) {
    return boost::asio::async_initiate<Token, void(ConfigureResult)>(
        [impl = checked_impl()](auto handler, const SettingsUpdate& u) {
          detail::start_configure(
              *impl, u,
              detail::make_completion<ConfigureResult>(std::move(handler), detail::executor_of(*impl)));
        },
        token, update);
  }

 private:
  const std::shared_ptr<detail::LimiterImpl>& checked_impl() const;
  std::shared_ptr<detail::LimiterImpl> impl_;
};

template <typename Handler, typename R>
void detail::CompletionBox<Handler, R>::complete(R result) {
  auto executor = work_.get_executor();
  boost::asio::post(executor, [handler = std::move(handler_), result = std::move(result),
                               work = std::move(work_)]() mutable {
    // The operation is over: no cancellation may reach it any more. This runs
    // on the handler's executor, the one cancellation is emitted from.
    boost::asio::get_associated_cancellation_slot(handler).clear();
    std::move(handler)(std::move(result));
  });
}

}  // namespace fairgate
