// redis/redis_limiter.hpp — one limiter of the Redis backend.
//
// Redis decides (the Lua scripts in src/redis/scripts/ grant, queue, reap and
// dispatch atomically); this adapter registers local requests, delivers each
// request's single outcome through its core::Ticket, heartbeats, repairs what
// Redis and the network can lose, and runs the on_redis_down policy while Redis
// is unreachable (docs/design.md, "Recovery" and "Degraded modes").
//
// Invariants:
//  * A request is registered in requests_ *before* its acquire is sent (the
//    wake message can overtake the acquire reply) and leaves it when it ends.
//  * Only the party whose Ticket::resume() returned deliver tells the caller;
//    a grant that reaches an ended ticket (return_permit) is released.
//  * A request whose acquire may have reached Redis (`reached`) is cancelled
//    in Redis by its id when it ends without a permit; commands go down one
//    connection in order, so the cancel runs after every acquire sent before.
//  * A permit of this instance that Redis reports (wake message, heartbeat's
//    or restore's held list) and that no local request or holder owns is an
//    orphan: it is released (releases are idempotent, ids are never reused).
//  * Loss is level-triggered: every heartbeat reply is compared with what this
//    instance holds and waits for; any difference (or 'lost') → restore, which
//    is retried until Redis acknowledges it. No acquire is sent while a
//    restore is needed or in flight (it would run against a state that misses
//    this instance's permits); they wait and are sent after it. A restore
//    gives no place to a request whose acquire is on its way (that acquire
//    may reach Redis after it and would give the request a second one).
//  * While degraded, nothing is sent but heartbeats (probes): permits granted
//    locally and waiters queued locally go back to Redis in one restore.
//  * Every state change happens under mu_; Redis commands are sent after mu_
//    is released (a command may complete inline on the connection's strand).
//  * Completion handlers are posted (Completion::complete never runs inline).
#pragma once

#include "core/acquire_rules.hpp"
#include "core/limiter_state.hpp"
#include "core/ticket.hpp"
#include "redis/client.hpp"
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
#include <set>
#include <string>
#include <vector>

namespace fairgate::redis {

/// Redis command failures of one backend, by kind (metrics).
struct FailureCounts {
  std::atomic<std::uint64_t> timeouts{0};
  std::atomic<std::uint64_t> disconnects{0};  ///< lost connection, or none to send on
  std::atomic<std::uint64_t> error_replies{0};
  std::uint64_t total() const noexcept { return timeouts + disconnects + error_replies; }
};

/// What all limiters of one backend (= one instance) share.
struct BackendContext {
  boost::asio::any_io_executor executor;
  RedisBackendOptions options;  // validated, instance_id filled in
  std::shared_ptr<Client> client;
  FailureCounts failures;
  /// Counts a failed command (transport error `ec`, or an error reply).
  void count_failure(boost::system::error_code ec);
  void log(const std::string& line) const;
  ~BackendContext();
};

class RedisLimiter final : public detail::LimiterImpl {
 public:
  /// Key expiry is refreshed at least every this many heartbeats (and at the first).
  static constexpr std::uint64_t kExpiryEvery = 10;
  /// A heartbeat asks Redis the positions of at most this many of this instance's waiters
  /// (one ZCOUNT each: heartbeat.lua), those not counted since the queue last moved first
  /// (ask_fair_positions_locked): under tenant fairness, and without it only while waiters
  /// left from the middle of the queue.
  static constexpr std::size_t kFairPositionsPerBeat = 100;
  /// Heartbeats between two refreshes of the keys' expiry (and the housekeeping that
  /// rides with it, heartbeat.lua): a quarter of key_expiry (of 1 h when keys never
  /// expire), never fewer than kExpiryEvery. 900 with the defaults (1 s, 1 h).
  static std::uint64_t expiry_every(const RedisBackendOptions& o) noexcept;

  RedisLimiter(std::shared_ptr<BackendContext> context, std::string name, Settings defaults);
  ~RedisLimiter() override;

  const std::string& name() const noexcept override { return name_; }
  boost::asio::any_io_executor get_executor() const override { return context_->executor; }
  void start_acquire(AcquireOptions options, std::unique_ptr<detail::Completion> completion,
                     boost::asio::cancellation_slot slot) override;
  void release(const std::string& id) noexcept override;
  Snapshot snapshot() const override;
  Settings settings() const override;
  bool shut_down() const noexcept override;
  boost::system::result<Settings, SettingsError> configure(const SettingsUpdate& update) override;
  void start_configure(const SettingsUpdate& update,
                       std::unique_ptr<detail::ConfigureCompletion> completion) override;
  /// Every instance's holders and waiters, from Redis (snapshot.lua): one script call.
  void start_status(const StatusQuery& query, std::unique_ptr<detail::StatusCompletion> completion) override;

  /// Subscribes the wake channel, sends the first heartbeat (which creates the
  /// state with this instance's settings if absent) and starts the heartbeats.
  void start();
  /// SUBSCRIBEs this limiter's wake channel (again after a reconnect).
  void subscribe();
  /// A wake message: permit `permit_id` ("inst|n") was granted to us, or
  /// "!cfg": the settings changed (heartbeat now).
  void on_wake(const std::string& message);
  /// Ends waiters with RejectReason::shutdown (and cancels them in Redis),
  /// rejects new acquires. Heartbeats go on while local permits are held; once
  /// none is, the instance leaves Redis (leave.lua) rather than waiting to be reaped.
  void shutdown();

  /// The wake channel of this instance for this limiter.
  const std::string& wake_channel() const noexcept { return wake_channel_; }

  // --- For tests and metrics.
  std::uint64_t heartbeats() const noexcept { return heartbeats_.load(std::memory_order_relaxed); }
  std::uint64_t restores() const noexcept { return restores_.load(std::memory_order_relaxed); }
  std::uint64_t lost_wakes_recovered() const noexcept { return lost_wakes_.load(std::memory_order_relaxed); }
  std::uint64_t orphans_released() const noexcept { return orphans_.load(std::memory_order_relaxed); }
  /// The wake channel was subscribed and a heartbeat registered this instance:
  /// grants reach it at once from now on.
  bool ready() const noexcept { return subscribed_.load() && registered_.load(); }
  bool degraded() const noexcept;
  /// Commands this instance sent to Redis (both connections), for the
  /// benchmark's client round trips per grant.
  std::uint64_t commands_sent() const noexcept;
  /// Stops this limiter's heartbeats for good (simulates a frozen instance).
  void stop_heartbeats_for_test();
  /// Starts them again (one at once, then every interval).
  void resume_heartbeats_for_test();
  /// Tests only: `hook("acquire")` runs in every acquire, `hook("heartbeat")` in every
  /// heartbeat, between the call's being prepared (under mu_) and its being handed to the
  /// connection — the window in which a call sent from another thread reaches Redis first.
  void set_send_hook_for_test(std::function<void(std::string_view what)> hook);
  /// Tests only: sends a restore now, as after a heartbeat that saw a difference (even
  /// with heartbeats stopped).
  void restore_now_for_test();

 private:
  using Clock = std::chrono::steady_clock;
  class LocalSink;
  /// Where a waiting request stands.
  enum class Phase : std::uint8_t {
    unsent,   ///< no acquire in flight: sent when Redis can take it (after a restore, a hiccup)
    sending,  ///< acquire in flight
    queued,   ///< Redis said it waits (order known)
    local,    ///< waiting in the local fallback (degraded, policy local)
  };
  struct Request {
    std::uint64_t n = 0;
    core::Ticket ticket;
    std::unique_ptr<detail::Completion> completion;  // used once, by the ticket's winner
    std::function<void(const QueueStatus&)> on_queued;
    std::string tenant;
    std::uint32_t weight = 1;
    Clock::time_point arrived{};
    Clock::time_point deadline{};
    // Under mu_:
    Phase phase = Phase::unsent;
    bool reached = false;    // an acquire (or a restore listing it) was sent: it may be in Redis
    std::int64_t order = 0;  // its order score in Redis (phase queued)
    std::size_t told_position = 0;
    // Under tenant fairness: the queue version (heartbeat.lua) its place was last counted at
    // ('' never) and at which heartbeat.
    std::string counted_at;
    std::uint64_t counted_beat = 0;
    std::optional<boost::asio::steady_timer> timer;  // local deadline
  };
  using RequestPtr = std::shared_ptr<Request>;
  struct Holder {
    std::string tenant;
    Clock::time_point granted{};
    bool local = false;  // granted locally while degraded: Redis does not know it yet
  };
  /// up: Redis answers. failing: calls fail, for less than degrade_after (requests wait).
  /// degraded: the on_redis_down policy runs. recovering: degraded, and the restore that
  /// hands everything back is in flight (no local grant meanwhile).
  enum class Link : std::uint8_t { up, failing, degraded, recovering };

  void call(const Script& script, std::vector<std::string> args, Connection::Callback callback,
            std::function<bool()> still_wanted = {});

  // Requests.
  void route_locked(const RequestPtr& request, std::vector<RequestPtr>& to_send);
  /// Marks `request` as on its way and adds it to `to_send` (sent after mu_ is released).
  void to_send_locked(const RequestPtr& request, std::vector<RequestPtr>& to_send);
  void send_acquire(const RequestPtr& request);
  void send_all(const std::vector<RequestPtr>& requests);
  void on_acquire_reply(const RequestPtr& request, boost::system::error_code ec, const Reply& reply);
  /// A grant for request n reached us (acquire reply, wake, heartbeat, restore).
  void on_granted(std::uint64_t n, const std::string& permit_id, bool recovered);
  void on_deadline(const RequestPtr& request);
  void on_cancel(const RequestPtr& request);
  /// Ends a waiting request (its ticket already resumed with deliver): forgets it
  /// and says whether Redis must be told (cancel by id).
  bool end_locked(const RequestPtr& request, RejectReason reason, std::string message = {});
  void forget_locked(const RequestPtr& request);
  /// `tenant`: the permit's tenant when known (saves Redis a lookup).
  void send_release(const std::string& id, const char* why, const std::string* tenant = nullptr);
  void on_release_failed(std::uint64_t n, boost::system::error_code ec);
  void send_cancel(std::uint64_t n);
  void release_orphans(const std::vector<std::string>& ids);

  // Heartbeat, loss detection, restore.
  void schedule_heartbeat(std::chrono::milliseconds after);
  /// Sends a heartbeat unless one is in flight (`force`: even then).
  void heartbeat(bool force = false);
  void send_configure(std::vector<std::string> fields,
                      std::shared_ptr<std::unique_ptr<detail::ConfigureCompletion>> completion, int attempt);
  /// What a heartbeat was sent about: this instance's side of the comparison.
  struct BeatSent {
    std::set<std::uint64_t> holders;   // permits Redis granted
    std::set<std::uint64_t> queued;    // waiters Redis queued
    std::size_t inflight = 0;          // acquires on their way
    std::uint64_t acquires = 0;        // acquires_decided_ then
    std::uint64_t cancels = 0;         // cancels_decided_ then
    std::vector<std::uint64_t> asked;  // waiters whose positions under fairness it asks for
    std::uint64_t beat = 0;            // its number
    bool probe = false;                // extended nothing (heartbeat.lua, 'probe')
    std::uint64_t source_asked = 0;    // connections_made_ when it asked which Redis (0: did not)
  };
  void on_heartbeat_reply(const Reply& reply, const BeatSent& sent, std::uint64_t generation);
  /// Until when this instance's liveness in Redis surely runs, from the send time of the last
  /// heartbeat it heard answered (liveness TTL less a command timeout): past it, wakes are not
  /// trusted, the degraded seats are not reused, and heartbeats go as probes (rule 16).
  Clock::time_point alive_at_least_until(Clock::time_point heard) const {
    return heard + context_->options.liveness_ttl - context_->options.command_timeout;
  }
  /// How long without a reply before heartbeats become probes (docs/design.md, rule 16): the
  /// time this instance assumes its liveness ran out, but never less than a heartbeat interval
  /// and a command timeout, the longest a healthy link goes without one.
  Clock::duration probe_after() const {
    const auto& o = context_->options;
    return std::max<Clock::duration>(o.liveness_ttl - o.command_timeout,
                                     o.heartbeat_interval + o.command_timeout);
  }
  /// Shut down and holding nothing, with Redis reachable: leaves Redis once (leave.lua), taking
  /// what it still counts for this instance with it, and stops the heartbeats.
  void leave_if_done();
  void send_restore(bool even_if_stopped = false);
  void on_restore_reply(const Reply& reply);
  /// The settings in a cfg field/value list, over `base` (local fields kept).
  static Settings settings_from_fields(const std::vector<Reply>& flat, Settings base);
  /// Applies settings read from Redis (mu_ held); logs what differs from the start-up values once.
  void adopt_settings_locked(const Settings& from_redis);
  void end_all_disabled_locked();
  /// Pending requests, oldest first (restore and the local fallback keep this order).
  std::vector<RequestPtr> waiting_oldest_first_locked() const;
  std::size_t position_locked(std::int64_t order) const;
  /// A reply said the state is fenced for `left` more (0: not fenced).
  void note_fence_locked(Clock::time_point now, std::chrono::milliseconds left);
  void post_position(const RequestPtr& request, QueueStatus status);
  /// Wait estimate for `position` from the cluster-wide pace of the last heartbeat (F7).
  std::optional<std::chrono::milliseconds> estimate_locked(std::size_t position, Clock::time_point now) const;
  /// Adds to a heartbeat's arguments the waiters whose positions it asks Redis for (their
  /// numbers in `asked`), ARGV[8..] of heartbeat.lua: under tenant fairness, of those that
  /// listen, first those not counted at queue_version_ (the kFairPositionsPerBeat / 2 oldest,
  /// then the others least recently counted first), up to kFairPositionsPerBeat; then the
  /// oldest that were, whom Redis counts again only if the queue moved since.
  void ask_fair_positions_locked(std::vector<std::uint64_t>& asked, std::vector<std::string>& args) const;
  /// Our waiters' positions after heartbeat `sent`: from their order scores, or under tenant
  /// fairness those Redis computed (`answered`, one per waiter in `sent.asked` up to its
  /// length) at queue version `version`; none for those the reply lists as `held`.
  void update_positions_locked(const BeatSent& sent, const Reply* answered, const std::string& version,
                               const std::set<std::uint64_t>& held,
                               std::vector<std::pair<RequestPtr, QueueStatus>>& out);
  /// Adds `request`'s position (from its order score unless given) to `out` when it changed
  /// (and it listens).
  void tell_position_locked(const RequestPtr& request, Clock::time_point now,
                            std::vector<std::pair<RequestPtr, QueueStatus>>& out,
                            std::optional<std::size_t> position = std::nullopt);

  // Link health and the degraded modes.
  void note_success();
  void note_failure(boost::system::error_code ec);
  void enter_degraded_locked(Clock::time_point now, std::vector<std::string>& log);
  void leave_degraded_locked(Clock::time_point now, std::vector<std::string>& log);
  void local_admit_locked(const RequestPtr& request, Clock::time_point now);
  void on_seats_expired();

  void deliver_granted(Request& request, Clock::time_point t);
  void deliver_ended(Request& request, RejectReason reason, Clock::time_point t, std::string message = {});

  std::string permit_id(std::uint64_t n) const;
  /// n of a permit id of this instance, nullopt for another instance's id.
  std::optional<std::uint64_t> parse_own(std::string_view permit_id) const;
  void log(const std::string& line) const;

  const std::shared_ptr<BackendContext> context_;
  const std::string name_;
  const std::string instance_;
  const Settings defaults_;
  std::vector<std::string> keys_;
  std::string wake_prefix_;
  std::string wake_channel_;

  mutable std::mutex mu_;
  Settings settings_;
  std::string settings_source_ = "local";
  bool settings_logged_ = false;
  std::size_t in_use_ = 0;  // cluster-wide, from the last heartbeat
  std::size_t queued_ = 0;  // cluster-wide, from the last heartbeat
  std::int64_t head_order_ = 0, epoch_ = 0;
  std::size_t older_ = 0;      // waiters below the epoch (restored from an older state)
  std::string queue_version_;  // under tenant fairness, as the last heartbeat heard it
  /// The queue ("h<head_order>:<queued>") as the last heartbeat found it whole, or '' (not known,
  /// or a loss to restore): heartbeat.lua counts it against its index only when it changed.
  std::string queue_seen_;
  /// Who else sets this instance's liveness deadline (docs/faults.md, "Two processes with the
  /// same instance id"): this limiter's tag (1..255), which its heartbeats put in the deadline's
  /// fraction, and whether each of the last 10 heartbeats found another tag (bit 0 the latest).
  /// Tags of one process differ (a counter from a random start); of two, 1 in 255 are equal.
  int liveness_tag_ = 0;  // set once, in the constructor
  std::uint16_t liveness_moved_ = 0;
  std::string source_;              // cfg source as last seen: the Redis the state's grants were made on
  bool told_unchecked_ = false;     // logged that Redis denies INFO (source empty: rule 14 off)
  std::int64_t holders_lost_ = -1;  // cfg holders_lost as last seen (-1: not yet seen)
  /// cfg fence_ms as last seen: the longest fence of the instances (heartbeat.lua). A state this
  /// instance re-creates, or fences for lost permits, is fenced at least that long.
  std::int64_t fence_seen_ms_ = 0;
  bool fence_disagreement_logged_ = false;
  std::int64_t tenants_lost_ = -1;      // cfg tenants_lost as last seen (-1: not yet seen)
  std::vector<std::string> instances_;  // registered instances at the last heartbeat
  // The cluster-wide pace (release.lua measures it in Redis time), as of the
  // last heartbeat reply, received at pace_seen_ (core/service_pace.hpp).
  core::PaceFigures pace_;
  Clock::time_point pace_seen_{};
  std::uint64_t next_n_ = 1;
  std::map<std::uint64_t, RequestPtr> requests_;  // pending, by n (= arrival order here)
  std::map<std::uint64_t, Holder> holders_;       // permits this instance holds, by n
  LimiterStats stats_;
  bool shut_down_ = false;
  bool heartbeats_stopped_ = false;
  bool leaving_ = false;                             // leave.lua sent (leave_if_done)
  std::function<void(std::string_view)> send_hook_;  // set_send_hook_for_test
  // Acquires and cancels decided so far: those decided after a heartbeat was prepared
  // may reach Redis before it, and its count of this instance's waiters shows them.
  std::uint64_t acquires_decided_ = 0;
  std::uint64_t cancels_decided_ = 0;
  bool heartbeat_in_flight_ = false;
  std::uint64_t config_generation_ = 0;
  std::uint64_t heartbeats_sent_ = 0;
  std::optional<boost::asio::steady_timer> heartbeat_timer_;
  std::optional<boost::asio::steady_timer> seats_timer_;

  // Recovery.
  bool restore_needed_ = false;
  bool restore_in_flight_ = false;
  bool clean_extras_ = false;  // a cancel may not have reached Redis: the restore removes leftovers
  Clock::time_point fence_until_{};
  // The send time of the last heartbeat (or restore) that found us registered and extended our
  // liveness: what this instance trusts of it (alive_at_least_until). A probe extends nothing.
  Clock::time_point last_good_beat_sent_{};
  Clock::time_point last_heard_{};       // when the last heartbeat or restore reply came back
  Clock::time_point first_beat_sent_{};  // before any reply was heard: probing counts from it
  bool probing_ = false;                 // the last heartbeat was a probe (logged when it starts)
  // Wake connections (re)made (subscribe()) and the count the last heartbeat that asked which
  // Redis this is was sent at: a newer one asks again (heartbeat.lua, 'check_source').
  std::uint64_t connections_made_ = 0;
  std::uint64_t source_asked_at_ = 0;
  EngineStatus engine_;
  Clock::time_point fence_seen_since_{};  // accounting of engine_.fenced_time

  // Link health and the degraded modes.
  Link link_ = Link::up;
  Clock::time_point failing_since_{}, degraded_since_{}, up_since_{};
  bool last_failure_denied_ = false;         // the last failed call was refused by the ACL (Error::denied)
  std::optional<core::LimiterState> local_;  // degraded, policy local
  // Permits released here whose release never reached Redis (not_sent): Redis
  // still counts them for this instance, so they are seats while degraded.
  // Released as orphans once Redis answers again.
  std::set<std::uint64_t> unsent_releases_;
  bool seats_expired_ = false;

  std::atomic<std::uint64_t> heartbeats_{0};
  std::atomic<std::uint64_t> restores_{0};
  std::atomic<std::uint64_t> lost_wakes_{0};
  std::atomic<std::uint64_t> orphans_{0};
  std::atomic<bool> subscribed_{false};
  std::atomic<bool> registered_{false};
  std::atomic<bool> degraded_{false};
};

/// The limiter `name` of a backend made by make_redis_backend (nullptr for
/// another kind of backend or an unknown name). For tests and metrics.
std::shared_ptr<RedisLimiter> redis_limiter_of(const Backend& backend, std::string_view name);

}  // namespace fairgate::redis
