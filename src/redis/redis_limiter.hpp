// redis/redis_limiter.hpp — one limiter of the Redis backend.
//
// Redis decides (the Lua scripts in src/redis/scripts/ grant, queue, reap and
// dispatch atomically); this adapter registers local requests, delivers each
// request's single outcome through its core::Ticket, heartbeats, and repairs
// what the network can lose.
//
// Invariants:
//  * A request is registered in requests_ *before* its acquire is sent (the
//    wake message can overtake the acquire reply) and leaves it when it ends.
//  * Only the party whose Ticket::resume() returned deliver tells the caller;
//    a grant that reaches an ended ticket (return_permit) is released.
//  * A permit of this instance that Redis reports (wake message, heartbeat's
//    held list) and that no local request or holder owns is an orphan: it is
//    released (releases are idempotent and ids are never reused, so a
//    duplicate release is harmless).
//  * Every state change happens under mu_; Redis commands are sent after mu_
//    is released (a command may complete inline on the connection's strand).
//  * Completion handlers are posted (Completion::complete never runs inline).
#pragma once

#include "core/acquire_rules.hpp"
#include "core/ticket.hpp"
#include "redis/connection.hpp"
#include "redis/scripts.hpp"

#include <fairgate/detail/limiter_impl.hpp>
#include <fairgate/redis_backend.hpp>

#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace fairgate::redis {

/// What all limiters of one backend (= one instance) share.
struct BackendContext {
  boost::asio::any_io_executor executor;
  RedisBackendOptions options;  // validated, instance_id filled in
  std::shared_ptr<Connection> commands;
  std::shared_ptr<Connection> subscriber;
  /// Redis client errors (timeouts, disconnects, error replies) seen by any limiter.
  std::atomic<std::uint64_t> redis_errors{0};
  ~BackendContext();
};

class RedisLimiter final : public detail::LimiterImpl {
 public:
  static constexpr std::size_t kMaxTenantLength = core::kMaxTenantLength;
  /// Key expiry is refreshed on every this many heartbeats (and the first).
  static constexpr std::uint64_t kExpiryEvery = 10;

  RedisLimiter(std::shared_ptr<BackendContext> context, std::string name, Settings defaults);
  ~RedisLimiter() override;

  const std::string& name() const noexcept override { return name_; }
  boost::asio::any_io_executor get_executor() const override { return context_->executor; }
  void start_acquire(AcquireOptions options, std::unique_ptr<detail::Completion> completion,
                     boost::asio::cancellation_slot slot) override;
  void release(const std::string& id) noexcept override;
  Snapshot snapshot() const override;
  Settings settings() const override;
  boost::system::result<Settings, SettingsError> configure(const SettingsUpdate& update) override;

  /// Subscribes the wake channel, sends the first heartbeat (which creates the
  /// config with the defaults if absent) and starts the heartbeat loop.
  void start();
  /// SUBSCRIBEs this limiter's wake channel (again after a reconnect).
  void subscribe();
  /// A wake message: permit `permit_id` ("inst|n") was granted to us.
  void on_wake(const std::string& permit_id);
  /// Ends waiters with RejectReason::shutdown (and cancels them in Redis),
  /// rejects new acquires. Heartbeats go on while local permits are held.
  void shutdown();

  /// The wake channel of this instance for this limiter.
  const std::string& wake_channel() const noexcept { return wake_channel_; }

  // --- For tests and metrics.
  std::uint64_t heartbeats() const noexcept { return heartbeats_.load(std::memory_order_relaxed); }
  std::uint64_t restores() const noexcept { return restores_.load(std::memory_order_relaxed); }
  std::uint64_t lost_wakes_recovered() const noexcept { return lost_wakes_.load(std::memory_order_relaxed); }
  std::uint64_t orphans_released() const noexcept { return orphans_.load(std::memory_order_relaxed); }
  /// The wake channel was subscribed and a heartbeat answered: grants reach
  /// this instance at once from now on.
  bool ready() const noexcept { return subscribed_.load() && heartbeats() > 0; }
  /// Commands this instance sent to Redis (both connections), for the
  /// benchmark's client round trips per grant.
  std::uint64_t commands_sent() const noexcept;
  /// Stops this limiter's heartbeats for good (simulates a frozen instance).
  void stop_heartbeats_for_test();

 private:
  using Clock = std::chrono::steady_clock;
  struct Request {
    std::uint64_t n = 0;
    core::Ticket ticket;
    std::unique_ptr<detail::Completion> completion;  // used once, by the ticket's winner
    std::function<void(const QueueStatus&)> on_queued;
    std::string tenant;
    std::uint32_t weight = 1;
    Clock::time_point arrived{};
    std::chrono::milliseconds max_wait{0};
    std::string member;    // queue member once Redis queued it (under mu_)
    std::int64_t seq = 0;  // arrival sequence in Redis (under mu_)
    std::size_t told_position = 0;
    bool retried = false;                            // acquire retried once after 'dead'/'lost'
    std::optional<boost::asio::steady_timer> timer;  // local deadline (under mu_)
  };
  using RequestPtr = std::shared_ptr<Request>;
  struct Holder {
    std::string tenant;
    Clock::time_point granted{};
  };

  std::vector<std::string> script_args(std::initializer_list<std::string> args) const;
  void call(const Script& script, std::vector<std::string> args, Connection::Callback callback);

  void send_acquire(const RequestPtr& request);
  void on_acquire_reply(const RequestPtr& request, boost::system::error_code ec, const Reply& reply);
  /// A grant for request n reached us (acquire reply, wake, heartbeat).
  void on_granted(std::uint64_t n, const std::string& permit_id, bool from_heartbeat);
  void on_deadline(const RequestPtr& request);
  void on_cancel(const RequestPtr& request);
  /// Removes `request` from requests_ and stops its timer (mu_ held).
  void forget_locked(const RequestPtr& request);
  /// `tenant`: the permit's tenant when known (saves Redis a lookup).
  void send_release(const std::string& id, const char* why, const std::string* tenant = nullptr);
  void send_cancel(const std::string& member);

  void schedule_heartbeat(std::chrono::milliseconds after);
  /// Sends one heartbeat; `then` (optional) runs after its reply was handled.
  void heartbeat(std::function<void()> then = {});
  void on_heartbeat_reply(const Reply& reply, std::uint64_t config_generation);
  void send_restore();

  void deliver_granted(Request& request, Clock::time_point t);
  void deliver_ended(Request& request, RejectReason reason, Clock::time_point t, std::string message = {});
  void post_position(const RequestPtr& request, QueueStatus status);

  std::string permit_id(std::uint64_t n) const;
  /// n of a permit id of this instance, nullopt for another instance's id.
  std::optional<std::uint64_t> parse_own(std::string_view permit_id) const;

  const std::shared_ptr<BackendContext> context_;
  const std::string name_;
  const std::string instance_;
  const Settings defaults_;
  std::vector<std::string> keys_;
  std::string wake_prefix_;
  std::string wake_channel_;

  mutable std::mutex mu_;
  Settings settings_;
  std::size_t in_use_ = 0;  // cluster-wide, from the last heartbeat
  std::size_t queued_ = 0;  // cluster-wide, from the last heartbeat
  std::int64_t head_seq_ = 0;
  std::uint64_t next_n_ = 1;
  std::map<std::uint64_t, RequestPtr> requests_;  // pending, by n (= arrival order here)
  std::map<std::uint64_t, Holder> holders_;       // permits this instance holds, by n
  LimiterStats stats_;
  bool shut_down_ = false;
  bool heartbeats_stopped_ = false;
  bool heartbeat_in_flight_ = false;
  std::uint64_t config_generation_ = 0;
  std::uint64_t heartbeats_sent_ = 0;
  std::optional<boost::asio::steady_timer> heartbeat_timer_;

  std::atomic<std::uint64_t> heartbeats_{0};
  std::atomic<std::uint64_t> restores_{0};
  std::atomic<std::uint64_t> lost_wakes_{0};
  std::atomic<std::uint64_t> orphans_{0};
  std::atomic<bool> subscribed_{false};
};

/// The limiter `name` of a backend made by make_redis_backend (nullptr for
/// another kind of backend or an unknown name). For tests and metrics.
std::shared_ptr<RedisLimiter> redis_limiter_of(const Backend& backend, std::string_view name);

}  // namespace fairgate::redis
