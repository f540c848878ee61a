// memory/memory_limiter.hpp — one limiter of the in-process backend.
//
// core::LimiterState decides; this adapter adds what pure logic cannot have:
// a mutex, the clock, one deadline timer per limiter (armed at the earliest
// waiter deadline, not one timer per waiter), coalesced position updates, and
// delivery of each request's single outcome through its core::Ticket.
//
// Invariants:
//  * Every state change happens under mu_, so the LimiterState invariants
//    (no overshoot, FIFO, work-conserving) hold across threads.
//  * A request's outcome is delivered only by the party whose Ticket::resume()
//    returned deliver; completion handlers are posted, never run under mu_.
//  * A waiter is in waiting_ exactly while LimiterState says it is waiting.
//  * on_queued callbacks run on the executor, one position pass at a time, and
//    while the ticket is pending (checked just before the call: a grant may
//    land between the check and the call; the completion is the truth).
#pragma once

#include "core/acquire_rules.hpp"
#include "core/limiter_state.hpp"
#include "core/ticket.hpp"

#include <fairgate/detail/limiter_impl.hpp>

#include <boost/asio/steady_timer.hpp>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace fairgate::memory {

class MemoryLimiter final : public detail::LimiterImpl, private core::DispatchSink {
 public:
  /// Follow-up position updates are sent at most this often per limiter.
  static constexpr std::chrono::milliseconds kPositionInterval{20};

  MemoryLimiter(std::string name, Settings settings, boost::asio::any_io_executor executor);
  ~MemoryLimiter() override;

  const std::string& name() const noexcept override { return name_; }
  boost::asio::any_io_executor get_executor() const override { return executor_; }
  void start_acquire(AcquireOptions options, std::unique_ptr<detail::Completion> completion,
                     boost::asio::cancellation_slot slot) override;
  void release(const std::string& id) noexcept override;
  Snapshot snapshot() const override;
  Settings settings() const override;
  bool shut_down() const noexcept override;
  boost::system::result<Settings, SettingsError> configure(const SettingsUpdate& update) override;

  /// Ends every waiter with RejectReason::shutdown, rejects later acquires and
  /// destroys the timers (releases still work).
  void shutdown();

 private:
  struct Request {
    core::RequestId id = 0;
    core::Ticket ticket;
    std::unique_ptr<detail::Completion> completion;  // used once, by the ticket's winner
    std::function<void(const QueueStatus&)> on_queued;
    core::Time arrived{};
    std::chrono::milliseconds max_wait{};  // the one it got (named by the timeout message)
    std::size_t told_position = 0;         // last position given to on_queued (positions pass only)
  };
  using RequestPtr = std::shared_ptr<Request>;

  // core::DispatchSink — called under mu_.
  bool try_grant(core::RequestId id) override;
  void drop(core::RequestId id, RejectReason reason) override;

  /// Removes `id` from waiting_ (nullptr if absent), keeping listeners_ right.
  RequestPtr take_waiting(core::RequestId id);
  void deliver_granted(Request& request, core::Time now);
  void deliver_ended(Request& request, RejectReason reason, core::Time now, std::string message = {});
  void cancel(const RequestPtr& request);
  void arm_deadline_timer_locked();
  /// Once nobody waits, a timer armed for a deadline that no longer exists is
  /// cancelled: it would keep io_context::run() from returning until then.
  void disarm_deadline_timer_if_idle_locked();
  void on_deadline_timer();
  void schedule_positions_locked(bool urgent);
  void run_positions();

  const std::string name_;
  const boost::asio::any_io_executor executor_;

  mutable std::mutex mu_;
  core::LimiterState state_;
  std::unordered_map<core::RequestId, RequestPtr> waiting_;
  std::size_t listeners_ = 0;  // waiters with an on_queued callback
  core::RequestId next_id_ = 1;
  // The time of the operation in progress: the sink callbacks use the same
  // instant the core decided with, so a grant decided before a deadline never
  // reports a wait at or past it.
  core::Time op_now_{};
  LimiterStats stats_;
  bool shut_down_ = false;

  // Timers are optional so shutdown() can destroy them while the executor's
  // io_context is alive, even when Permits keep this object alive longer.
  std::optional<boost::asio::steady_timer> deadline_timer_;
  std::optional<core::Time> deadline_armed_for_;

  std::optional<boost::asio::steady_timer> positions_timer_;
  bool positions_scheduled_ = false;  // a pass is pending or running
  bool positions_dirty_ = false;      // something changed since that pass started
  bool positions_urgent_ = false;     // someone has never been told its position
  core::Time last_positions_{};
};

}  // namespace fairgate::memory
