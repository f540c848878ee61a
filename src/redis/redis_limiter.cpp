#include "redis/redis_limiter.hpp"

#include "api/outcome.hpp"
#include "api/shadow.hpp"
#include "core/number.hpp"
#include "core/settings_table.hpp"
#include "redis/log_level.hpp"

#include <boost/asio/post.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>

namespace fairgate::redis {

namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using core::parse_number;

milliseconds since(Clock::time_point start, Clock::time_point t) {
  return t > start ? duration_cast<milliseconds>(t - start) : milliseconds(0);
}

bool is_array(const Reply& r, std::size_t at_least) {
  return r.type == Reply::Type::array && r.elements.size() >= at_least;
}

using namespace shapes;

/// Whether `reply` is {verdict} or, when `shape` is given, verdict first and of that shape.
bool is_verdict(const Reply& reply, std::string_view verdict, std::string_view shape = kVerdict) {
  return has_shape(reply, shape) && reply.elements[0].str == verdict;
}

std::size_t count_of(const Reply& r) {
  return static_cast<std::size_t>(std::max<std::int64_t>(0, integer_of(r)));
}

std::string why(boost::system::error_code ec, const Reply& reply) {
  // Refused by the ACL: Redis' own words say which command, key or channel.
  if (ec == make_error_code(Error::denied) && reply.is_error())
    return reply.excerpt() + " (docs/redis-acl.md)";
  if (ec) return ec.message();
  if (reply.is_error()) return reply.excerpt();
  return "unexpected reply " + reply.excerpt();
}

std::string seconds(milliseconds ms) {
  return fmt::format("{:.1f} s", static_cast<double>(ms.count()) / 1000.0);
}

}  // namespace

// --- the backend's shared parts --------------------------------------------

void BackendContext::count_failure(boost::system::error_code ec) {
  if (!ec || ec == make_error_code(Error::denied)) {  // denied: an error reply (NOPERM)
    failures.error_replies.fetch_add(1, std::memory_order_relaxed);
  } else if (ec == make_error_code(Error::timeout)) {
    failures.timeouts.fetch_add(1, std::memory_order_relaxed);
  } else if (ec != make_error_code(Error::closed)) {
    failures.disconnects.fetch_add(1, std::memory_order_relaxed);
  }
}

void BackendContext::log(const std::string& line) const {
  if (options.log) {
    options.log(line);
  } else {
    fairgate::log(level_of(line), line);
  }
}

BackendContext::~BackendContext() {
  if (client) {
    client->close_subscriber();
    // Close once every command sent before has been answered (replies come in
    // order), so the last releases are not cut off by the close.
    client->close_after_pending();
  }
}

/// Decisions of the local fallback (degraded, policy local), applied to the
/// requests of the limiter. Used with mu_ held.
class RedisLimiter::LocalSink final : public core::DispatchSink {
 public:
  LocalSink(RedisLimiter& limiter, Clock::time_point now) : limiter_(limiter), now_(now) {}
  bool try_grant(core::RequestId id) override {
    auto it = limiter_.requests_.find(id);
    if (it == limiter_.requests_.end()) return false;
    RequestPtr request = it->second;
    if (request->ticket.resume(core::TicketEvent::grant) != core::TicketAction::deliver) return false;
    limiter_.forget_locked(request);
    limiter_.holders_.emplace(id, Holder{request->tenant, now_, /*local=*/true});
    limiter_.deliver_granted(*request, now_);
    return true;
  }
  void drop(core::RequestId id, RejectReason reason) override {
    auto it = limiter_.requests_.find(id);
    if (it == limiter_.requests_.end()) return;
    RequestPtr request = it->second;
    const auto event =
        reason == RejectReason::timeout ? core::TicketEvent::timeout : core::TicketEvent::reject;
    if (request->ticket.resume(event) != core::TicketAction::deliver) return;
    if (limiter_.end_locked(request, reason)) limiter_.clean_extras_ = true;
  }

 private:
  RedisLimiter& limiter_;
  Clock::time_point now_;
};

namespace {

/// A limiter's liveness tag, 1..255: those of one process differ (255 limiters in a row), those of
/// two processes are equal 1 time in 255.
int next_liveness_tag() {
  static std::atomic<unsigned> next{std::random_device{}()};
  return static_cast<int>(next.fetch_add(1, std::memory_order_relaxed) % 255) + 1;
}

}  // namespace

RedisLimiter::RedisLimiter(std::shared_ptr<BackendContext> context, std::string name, Settings defaults)
    : context_(std::move(context)),
      name_(std::move(name)),
      instance_(context_->options.instance_id),
      defaults_(defaults),
      settings_(std::move(defaults)),
      heartbeat_timer_(std::in_place, context_->executor),
      seats_timer_(std::in_place, context_->executor) {
  liveness_tag_ = next_liveness_tag();
  const std::string base = context_->options.key_prefix + ":{" + name_ + "}:";
  keys_ = limiter_keys(base);
  wake_prefix_ = base + "wake:";
  wake_channel_ = wake_prefix_ + instance_;
}

RedisLimiter::~RedisLimiter() = default;

std::string RedisLimiter::permit_id(std::uint64_t n) const { return instance_ + "|" + std::to_string(n); }

std::uint64_t RedisLimiter::commands_sent() const noexcept { return context_->client->commands_sent(); }

bool RedisLimiter::degraded() const noexcept { return degraded_.load(std::memory_order_relaxed); }

std::optional<std::uint64_t> RedisLimiter::parse_own(std::string_view id) const {
  if (id.size() <= instance_.size() + 1 || id.compare(0, instance_.size(), instance_) != 0 ||
      id[instance_.size()] != '|') {
    return std::nullopt;
  }
  return parse_number<std::uint64_t>(id.substr(instance_.size() + 1));
}

void RedisLimiter::log(const std::string& line) const { context_->log("limiter " + name_ + ": " + line); }

void RedisLimiter::call(const Script& script, std::vector<std::string> args, Connection::Callback callback,
                        std::function<bool()> still_wanted) {
  args.insert(args.begin(), wake_prefix_);
  context_->client->call_script(script, keys_, args, std::move(callback), std::move(still_wanted));
}

// --- settings as Redis stores them ------------------------------------------

Settings RedisLimiter::settings_from_fields(const std::vector<Reply>& cfg, Settings s) {
  for (std::size_t i = 0; i + 1 < cfg.size(); i += 2) core::read_wire_field(cfg[i].str, cfg[i + 1].str, s);
  return s;
}

void RedisLimiter::adopt_settings_locked(const Settings& from_redis) {
  const Settings before = settings_;
  const bool first = settings_source_ != "redis";
  settings_ = from_redis;
  settings_changed(before, settings_);
  settings_source_ = "redis";
  // What differs from `reference`: the start-up settings the first time, the
  // previous ones afterwards (a change made by another instance).
  const Settings& reference = first ? defaults_ : before;
  const auto a = core::wire_fields(settings_), b = core::wire_fields(reference);
  std::string diff;
  for (std::size_t i = 0; i + 1 < a.size(); i += 2) {
    if (a[i + 1] == b[i + 1]) continue;
    const auto shown = [](const std::string& v) { return v.empty() ? std::string("none") : v; };
    diff += fmt::format("{}{}={} ({} {})", diff.empty() ? "" : ", ", a[i], shown(a[i + 1]),
                        first ? "start-up value" : "was", shown(b[i + 1]));
  }
  if (diff.empty()) return;
  log(first ? "using the cluster-wide settings stored in Redis, which win over this instance's start-up "
              "settings: " +
                  diff
            : "settings changed in Redis: " + diff);
}

// --- acquire ---------------------------------------------------------------

void RedisLimiter::start_acquire(AcquireOptions options, std::unique_ptr<detail::Completion> completion,
                                 boost::asio::cancellation_slot slot) {
  const auto t = Clock::now();
  auto request = std::make_shared<Request>();
  request->completion = std::move(completion);
  request->on_queued = std::move(options.on_queued);
  request->tenant = std::move(options.tenant);
  request->weight = options.weight;
  request->arrived = t;
  std::vector<RequestPtr> to_send;
  {
    std::lock_guard lock(mu_);
    ++stats_.acquires;
    if (shut_down_) {
      request->ticket.resume(core::TicketEvent::reject);
      deliver_ended(*request, RejectReason::shutdown, t);
      return;
    }
    const auto checked =
        core::effective_max_wait(options.max_wait, settings_, request->tenant, request->weight);
    if (!checked) {
      request->ticket.resume(core::TicketEvent::reject);
      deliver_ended(
          *request, RejectReason::invalid_argument, t,
          core::acquire_options_problem(options.max_wait, settings_, request->tenant, request->weight));
      return;
    }
    const milliseconds max_wait = *checked;
    request->deadline = t + max_wait;
    request->n = next_n_++;
    // Registered before the acquire is sent: the wake can overtake the reply.
    requests_.emplace(request->n, request);
    if (max_wait.count() > 0) {
      request->timer.emplace(context_->executor);
      request->timer->expires_at(request->deadline);
      request->timer->async_wait(
          [weak = std::weak_ptr<Request>(request),
           self = std::weak_ptr<LimiterImpl>(weak_from_this())](boost::system::error_code ec) {
            if (ec == boost::asio::error::operation_aborted) return;
            auto r = weak.lock();
            auto s = self.lock();
            if (r && s) static_cast<RedisLimiter&>(*s).on_deadline(r);
          });
    }
    if (slot.is_connected()) {
      slot.assign([weak = std::weak_ptr<Request>(request),
                   self = std::weak_ptr<LimiterImpl>(weak_from_this())](boost::asio::cancellation_type) {
        auto r = weak.lock();
        auto s = self.lock();
        if (r && s) static_cast<RedisLimiter&>(*s).on_cancel(r);
      });
    }
    route_locked(request, to_send);
  }
  send_all(to_send);
}

void RedisLimiter::route_locked(const RequestPtr& request, std::vector<RequestPtr>& to_send) {
  const auto now = Clock::now();
  if (link_ == Link::degraded) {
    switch (settings_.on_redis_down) {
      case RedisDownPolicy::local:
        if (!local_) break;  // the policy was changed to local while degraded: wait for Redis
        local_admit_locked(request, now);
        return;
      case RedisDownPolicy::open:
        request->ticket.resume(core::TicketEvent::grant);
        forget_locked(request);
        holders_.emplace(request->n, Holder{request->tenant, now, /*local=*/true});
        deliver_granted(*request, now);
        return;
      case RedisDownPolicy::closed:
        request->ticket.resume(core::TicketEvent::reject);
        end_locked(request, RejectReason::unavailable,
                   "limiter is unavailable: Redis is unreachable (on_redis_down = closed)");
        return;
    }
    request->phase = Phase::unsent;
    return;
  }
  // After a loss (until the restore is acknowledged) and while recovering
  // from degraded mode, acquires wait: they would run against a state that
  // does not yet have this instance's permits.
  if (restore_needed_ || restore_in_flight_ || link_ == Link::recovering) {
    request->phase = Phase::unsent;
    return;
  }
  to_send_locked(request, to_send);
}

void RedisLimiter::to_send_locked(const RequestPtr& request, std::vector<RequestPtr>& to_send) {
  request->phase = Phase::sending;
  ++acquires_decided_;  // the heartbeat's comparison allows for it (on_heartbeat_reply)
  to_send.push_back(request);
}

void RedisLimiter::send_all(const std::vector<RequestPtr>& requests) {
  for (const auto& r : requests) send_acquire(r);
}

void RedisLimiter::send_acquire(const RequestPtr& request) {
  std::string retry;
  milliseconds remaining{0};
  std::function<void(std::string_view)> hook;
  {
    std::lock_guard lock(mu_);
    if (!request->ticket.pending() || request->phase != Phase::sending) return;
    // A second call for the same request asks Redis first whether the first one arrived.
    retry = request->reached ? "1" : "";
    request->reached = true;
    remaining = std::max(milliseconds(0), duration_cast<milliseconds>(request->deadline - Clock::now()));
    hook = send_hook_;
  }
  if (hook) hook("acquire");
  auto weak = std::weak_ptr<Request>(request);
  auto self = std::weak_ptr<LimiterImpl>(weak_from_this());
  call(
      scripts::kAcquire,
      {instance_, std::to_string(request->n), std::to_string(remaining.count()), request->tenant,
       std::to_string(request->weight), retry},
      [request, self](boost::system::error_code ec, Reply reply) {
        if (auto s = self.lock()) static_cast<RedisLimiter&>(*s).on_acquire_reply(request, ec, reply);
      },
      // Repeated after a NOSCRIPT only while it still waits for this very call.
      [weak, self] {
        auto r = weak.lock();
        auto s = self.lock();
        if (!r || !s) return false;
        std::lock_guard lock(static_cast<RedisLimiter&>(*s).mu_);
        return r->ticket.pending() && r->phase == Phase::sending;
      });
}

void RedisLimiter::on_acquire_reply(const RequestPtr& request, boost::system::error_code ec,
                                    const Reply& reply) {
  const std::string id = permit_id(request->n);
  if (ec || reply.is_error() || !is_array(reply, 1)) {
    context_->count_failure(ec);
    if (ec) {
      note_failure(ec);
    } else {
      note_success();
    }
    bool cancel = false;
    {
      std::lock_guard lock(mu_);
      if (request->ticket.pending() && request->phase == Phase::sending) {
        // Refused by the ACL: it stays refused, so the arrival hears it now
        // (the limiter follows on_redis_down once every call is refused).
        const bool transport =
            ec && ec != make_error_code(Error::closed) && ec != make_error_code(Error::denied);
        if (transport && !(settings_.on_redis_down == RedisDownPolicy::closed &&
                           !context_->client->connected(keys_.front()))) {
          // Outcome unknown: asked again (idempotently) once Redis answers,
          // or served by the on_redis_down policy if Redis stays away.
          request->phase = Phase::unsent;
        } else {
          request->ticket.resume(core::TicketEvent::reject);
          cancel =
              end_locked(request, RejectReason::unavailable, "limiter is unavailable: " + why(ec, reply));
        }
      }
    }
    if (cancel) send_cancel(request->n);
    if (!ec) log("acquire failed: " + why(ec, reply));
    return;
  }
  note_success();
  if (is_verdict(reply, "granted")) {
    on_granted(request->n, id, false);
    return;
  }
  if (is_verdict(reply, "queued", kQueued)) {
    std::lock_guard lock(mu_);
    if (request->ticket.pending() && request->phase == Phase::sending) {
      request->phase = Phase::queued;
      request->order = integer_of(reply.elements[1]);
      const auto position = std::max<std::size_t>(1, count_of(reply.elements[2]));
      queued_ = std::max(queued_, position);
      // The estimate Redis made from the cluster-wide pace (-1: none yet).
      std::optional<milliseconds> estimate;
      if (reply.elements.size() > 3 && integer_of(reply.elements[3]) >= 0)
        estimate = milliseconds(integer_of(reply.elements[3]));
      if (request->on_queued) {
        request->told_position = position;
        post_position(request, QueueStatus{position, queued_, estimate,
                                           static_cast<std::uint64_t>(request->order), id});
      }
    }
    return;
  }
  if (is_verdict(reply, "rejected", kRejected)) {
    const std::string& reason_text = reply.elements[1].str;
    const RejectReason reason = reason_text == "queue_full"       ? RejectReason::queue_full
                                : reason_text == "disabled"       ? RejectReason::disabled
                                : reason_text == "timeout"        ? RejectReason::timeout
                                : reason_text == "would_time_out" ? RejectReason::would_time_out
                                                                  : RejectReason::unavailable;
    std::lock_guard lock(mu_);
    if (request->phase != Phase::sending) return;
    const auto event =
        reason == RejectReason::timeout ? core::TicketEvent::timeout : core::TicketEvent::reject;
    if (request->ticket.resume(event) == core::TicketAction::deliver) end_locked(request, reason);
    return;
  }
  if (is_verdict(reply, "lost")) {
    {
      std::lock_guard lock(mu_);
      restore_needed_ = true;  // the heartbeat it triggers says lost too (and drops stale wakes)
      if (request->ticket.pending() && request->phase == Phase::sending) request->phase = Phase::unsent;
    }
    heartbeat();  // reports lost too, then restores; the request is sent after that
    return;
  }
  context_->count_failure({});
  log("unexpected acquire reply: " + reply.excerpt());
  bool cancel = false;
  {
    std::lock_guard lock(mu_);
    if (request->phase == Phase::sending &&
        request->ticket.resume(core::TicketEvent::reject) == core::TicketAction::deliver)
      cancel = end_locked(request, RejectReason::unavailable);
  }
  if (cancel) send_cancel(request->n);
}

void RedisLimiter::on_granted(std::uint64_t n, const std::string& id, bool recovered) {
  bool orphan = false;
  {
    std::lock_guard lock(mu_);
    auto it = requests_.find(n);
    if (it == requests_.end()) {
      auto h = holders_.find(n);
      if (h == holders_.end()) {
        // Not waiting here: a duplicate of a grant we already delivered, or a
        // grant for a request that ended (timed out, cancelled, failed).
        orphan = true;
      } else {
        h->second.local = false;  // granted locally, and Redis granted it too: the same permit
      }
    } else {
      RequestPtr request = it->second;
      const auto action = request->ticket.resume(core::TicketEvent::grant);
      if (request->phase == Phase::local && local_) local_->withdraw(n);
      forget_locked(request);
      if (action == core::TicketAction::deliver) {
        const auto t = Clock::now();
        holders_.emplace(n, Holder{request->tenant, t, false});
        if (recovered) lost_wakes_.fetch_add(1, std::memory_order_relaxed);
        deliver_granted(*request, t);
      } else {
        orphan = action == core::TicketAction::return_permit;
      }
    }
  }
  if (orphan) {
    orphans_.fetch_add(1, std::memory_order_relaxed);
    send_release(id, "release of a grant nobody waits for");
  }
}

void RedisLimiter::on_wake(const std::string& message) {
  if (message == "!cfg") {
    heartbeat();
    return;
  }
  const auto n = parse_own(message);
  if (!n) return;
  bool suspect = false;
  {
    // A wake has no timeout: one held back by the network (a partition, then
    // TCP retransmits) can come after Redis reaped this instance and handed
    // the permit on. A wake that comes after this instance's liveness may have
    // run out, or before a restore was acknowledged, is not trusted; the
    // heartbeat's held list (or the restore) says whether the permit is ours.
    // (Once a heartbeat says 'lost', the subscriber connection is dropped,
    // so nothing it held back from before can come after the restore.)
    std::lock_guard lock(mu_);
    if ((last_good_beat_sent_ != Clock::time_point{} &&
         Clock::now() >= alive_at_least_until(last_good_beat_sent_)) ||
        restore_needed_ || restore_in_flight_) {
      suspect = true;
    }
  }
  if (suspect) {
    heartbeat();
    return;
  }
  on_granted(*n, message, false);
}

void RedisLimiter::on_deadline(const RequestPtr& request) {
  bool cancel = false;
  {
    std::lock_guard lock(mu_);
    if (request->ticket.resume(core::TicketEvent::timeout) != core::TicketAction::deliver) return;
    cancel = end_locked(request, RejectReason::timeout);
  }
  if (cancel) send_cancel(request->n);
}

void RedisLimiter::on_cancel(const RequestPtr& request) {
  bool cancel = false;
  {
    std::lock_guard lock(mu_);
    if (request->ticket.resume(core::TicketEvent::cancel) != core::TicketAction::deliver) return;
    cancel = end_locked(request, RejectReason::cancelled);
  }
  if (cancel) send_cancel(request->n);
}

bool RedisLimiter::end_locked(const RequestPtr& request, RejectReason reason, std::string message) {
  if (request->phase == Phase::local && local_) local_->withdraw(request->n);
  forget_locked(request);
  deliver_ended(*request, reason, Clock::now(), std::move(message));
  if (!request->reached) return false;
  // While Redis is unreachable a cancel would be lost: the restore that ends
  // degraded mode removes what is left of this request instead.
  if (link_ == Link::degraded) {
    clean_extras_ = true;
    return false;
  }
  ++cancels_decided_;
  return true;
}

void RedisLimiter::forget_locked(const RequestPtr& request) {
  requests_.erase(request->n);
  if (request->timer) request->timer->cancel();
}

void RedisLimiter::send_release(const std::string& id, const char* /*what*/, const std::string* tenant) {
  std::vector<std::string> args{id};
  if (tenant) args.push_back(*tenant);
  call(scripts::kRelease, std::move(args),
       [self = std::weak_ptr<LimiterImpl>(weak_from_this()), id](boost::system::error_code ec, Reply reply) {
         if (!ec && has_shape(reply, kReleased)) return;
         // A permit whose release is lost is still ours in Redis: the next
         // heartbeat lists it, nobody owns it here, and it is released as an orphan.
         auto s = self.lock();
         if (!s) return;
         auto& me = static_cast<RedisLimiter&>(*s);
         me.context_->count_failure(ec);
         if (auto n = me.parse_own(id)) me.on_release_failed(*n, ec);
         if (ec) me.note_failure(ec);
       });
}

void RedisLimiter::on_release_failed(std::uint64_t n, boost::system::error_code ec) {
  // Only a release that was never sent certainly did not run: that seat is
  // still ours in Redis. One that timed out may still run (a stalled Redis
  // runs it when it wakes) and free the seat for someone else.
  if (ec != make_error_code(Error::not_sent)) return;
  std::lock_guard lock(mu_);
  unsent_releases_.insert(n);
}

void RedisLimiter::send_cancel(std::uint64_t n) {
  call(scripts::kCancel, {permit_id(n)},
       [self = std::weak_ptr<LimiterImpl>(weak_from_this())](boost::system::error_code ec, Reply reply) {
         if (!ec && has_shape(reply, kVerdict)) {
           const std::string& verdict = reply.elements[0].str;
           if (verdict == "removed" || verdict == "released" || verdict == "unknown") return;
         }
         auto s = self.lock();
         if (!s) return;
         auto& me = static_cast<RedisLimiter&>(*s);
         me.context_->count_failure(ec);
         // The waiter may still be in Redis: the heartbeat sees one waiter too
         // many, and the restore removes it.
         std::lock_guard lock(me.mu_);
         me.clean_extras_ = true;
       });
}

void RedisLimiter::release_orphans(const std::vector<std::string>& ids) {
  {
    std::lock_guard lock(mu_);
    for (const auto& id : ids) {
      if (auto n = parse_own(id)) unsent_releases_.erase(*n);
    }
  }
  for (const auto& id : ids) {
    orphans_.fetch_add(1, std::memory_order_relaxed);
    send_release(id, "release of an orphan permit");
  }
}

// --- release, delivery -----------------------------------------------------

void RedisLimiter::release(const std::string& id) noexcept {
  try {
    const auto n = parse_own(id);
    if (!n) return;
    std::string tenant;
    bool send = false;
    bool last = false;  // the last permit of a shut-down instance: it leaves Redis
    {
      std::lock_guard lock(mu_);
      auto it = holders_.find(*n);
      if (it == holders_.end()) return;
      tenant = std::move(it->second.tenant);
      const bool local = it->second.local;
      holders_.erase(it);
      ++stats_.releases;
      if (local_) {
        LocalSink sink(*this, Clock::now());
        local_->release(*n, Clock::now(), sink);  // the next local waiter takes the seat
      }
      // While degraded nothing is sent: a permit Redis has stays counted there
      // (the seat is reused here) until the restore, after which Redis lists
      // it as an orphan and it is released. While recovering, the release goes
      // after the restore on the same connection.
      send = link_ != Link::degraded && (!local || link_ == Link::recovering);
      last = shut_down_ && holders_.empty();
    }
    if (send) send_release(id, "release failed", &tenant);
    if (last) leave_if_done();  // after the release, on the same connection
  } catch (...) {
    // Out of memory while formatting the command: the permit is reaped with
    // this instance at worst. Nothing else can throw here.
  }
}

void RedisLimiter::deliver_granted(Request& request, Clock::time_point t) {
  ++stats_.grants;
  Permit permit(shared_from_this(), permit_id(request.n), since(request.arrived, t));
  request.completion->complete(AcquireResult::granted(std::move(permit)));
}

void RedisLimiter::deliver_ended(Request& request, RejectReason reason, Clock::time_point t,
                                 std::string message) {
  const auto max_wait =
      std::chrono::duration_cast<std::chrono::milliseconds>(request.deadline - request.arrived);
  request.completion->complete(detail::end_request(stats_, reason, since(request.arrived, t), max_wait,
                                                   std::move(message), settings_));
}

void RedisLimiter::post_position(const RequestPtr& request, QueueStatus status) {
  boost::asio::post(context_->executor, [request, status] {
    if (request->ticket.pending()) request->on_queued(status);
  });
}

std::optional<milliseconds> RedisLimiter::estimate_locked(std::size_t position, Clock::time_point now) const {
  if (pace_seen_ == Clock::time_point{}) return std::nullopt;
  // The figures age locally since the reply (no clock is compared with Redis').
  const double elapsed = std::chrono::duration<double, std::milli>(now - pace_seen_).count();
  core::PaceFigures f = pace_;
  if (f.since_full_ms) *f.since_full_ms += std::max(0.0, elapsed);
  f.age_ms += std::max(0.0, elapsed);
  return core::estimate_wait(f, position);
}

std::size_t RedisLimiter::position_locked(std::int64_t order) const {
  if (head_order_ <= 0 || order <= 0) return 1;
  // Order scores are contiguous within one state, and every score of an older
  // state (restored waiters) is below the epoch: count those, then the gap.
  std::int64_t p = 0;
  if (order < epoch_ || head_order_ >= epoch_) {
    p = order - head_order_ + 1;
  } else {
    p = static_cast<std::int64_t>(older_) + (order - epoch_);
  }
  return std::clamp<std::size_t>(static_cast<std::size_t>(std::max<std::int64_t>(1, p)), 1,
                                 std::max<std::size_t>(queued_, 1));
}

void RedisLimiter::update_positions_locked(const BeatSent& sent, const Reply* answered,
                                           const std::string& version, const std::set<std::uint64_t>& held,
                                           std::vector<std::pair<RequestPtr, QueueStatus>>& out) {
  const auto now = Clock::now();
  // A waiter this heartbeat found granted (its wake was lost) hears that, not the place it had.
  const auto waits = [&](std::uint64_t n, const Request& r) {
    return r.phase == Phase::queued && !held.count(n);
  };
  if (settings_.tenant_fairness) {
    // The order says nothing about the rotation: Redis computed the positions of the
    // waiters the heartbeat asked about (heartbeat.lua), all of them or, when the queue had
    // not moved, those not counted at its version yet; the others keep theirs.
    queue_version_ = version;
    if (answered == nullptr) return;
    const auto& p = answered->elements;
    for (std::size_t i = 0; i < sent.asked.size() && i < p.size(); ++i) {
      const auto it = requests_.find(sent.asked[i]);
      const auto position = count_of(p[i]);
      if (it == requests_.end() || !waits(it->first, *it->second) || position == 0) continue;
      it->second->counted_at = version;
      it->second->counted_beat = sent.beat;
      tell_position_locked(it->second, now, out, position);
    }
    return;
  }
  // One FIFO: the queue has not moved since the last beat (same head, same length), so
  // neither have the places told.
  const bool moved = version.empty() || version != queue_version_;
  queue_version_ = version;
  if (!moved) return;
  // Waiters left from the middle (gaps in the order scores): Redis counted the ranks of those
  // asked. The others' distance from the head is an upper bound then: told only when it is
  // smaller than what they were told (never back on a bound).
  std::map<std::uint64_t, std::size_t> ranks;
  if (answered != nullptr) {
    const auto& p = answered->elements;
    for (std::size_t i = 0; i < sent.asked.size() && i < p.size(); ++i) {
      if (const auto rank = count_of(p[i]); rank > 0) ranks[sent.asked[i]] = rank;
    }
  }
  const bool gaps = !ranks.empty();
  for (auto& [n, request] : requests_) {
    if (!waits(n, *request)) continue;
    if (const auto it = ranks.find(n); it != ranks.end()) {
      request->counted_at = version;
      request->counted_beat = sent.beat;
      tell_position_locked(request, now, out, it->second);
    } else if (!gaps || position_locked(request->order) < request->told_position) {
      tell_position_locked(request, now, out);  // no gaps: the distance from the head is the rank
    }
  }
}

void RedisLimiter::tell_position_locked(const RequestPtr& request, Clock::time_point now,
                                        std::vector<std::pair<RequestPtr, QueueStatus>>& out,
                                        std::optional<std::size_t> told) {
  if (!request->on_queued) return;
  const auto position = told.value_or(position_locked(request->order));
  if (position == request->told_position) return;
  request->told_position = position;
  out.emplace_back(request, QueueStatus{position, queued_, estimate_locked(position, now),
                                        static_cast<std::uint64_t>(request->order), permit_id(request->n)});
}

// --- heartbeat, loss detection, restore ------------------------------------

void RedisLimiter::start() {
  subscribe();
  heartbeat();
  schedule_heartbeat(context_->options.heartbeat_interval);
}

void RedisLimiter::subscribe() {
  {
    std::lock_guard lock(mu_);
    ++connections_made_;  // a restart or failover: the next heartbeat asks which Redis this is
  }
  context_->client->subscribe(wake_channel_, [self = std::weak_ptr<LimiterImpl>(weak_from_this())](
                                                 boost::system::error_code ec, Reply r) {
    // A failure here is repaired by the connect handler (re-SUBSCRIBE after
    // the reconnect) and, meanwhile, by the heartbeat's held list.
    auto s = self.lock();
    if (!s || ec || r.is_error()) return;
    static_cast<RedisLimiter&>(*s).subscribed_.store(true);
  });
}

void RedisLimiter::schedule_heartbeat(milliseconds after) {
  std::lock_guard lock(mu_);
  if (heartbeats_stopped_ || !heartbeat_timer_) return;
  heartbeat_timer_->expires_after(after);
  heartbeat_timer_->async_wait(
      [self = std::weak_ptr<LimiterImpl>(weak_from_this())](boost::system::error_code ec) {
        if (ec == boost::asio::error::operation_aborted) return;
        auto s = self.lock();
        if (!s) return;
        auto& me = static_cast<RedisLimiter&>(*s);
        const auto& o = me.context_->options;
        milliseconds next = o.heartbeat_interval;
        bool stopped = false;
        {
          std::lock_guard lock2(me.mu_);
          if (me.heartbeats_stopped_) return;
          if (me.shut_down_ && me.holders_.empty()) {
            me.heartbeats_stopped_ = true;  // nothing left to keep alive
            stopped = true;
          }
          const auto now = Clock::now();
          if (me.link_ != Link::up || me.restore_needed_) {
            // Probing: Redis is back within about one command timeout.
            next = std::min(next, std::max(o.command_timeout, milliseconds(50)));
          } else if (me.fence_until_ > now) {
            // The fence ends before the next beat: a heartbeat then dispatches the waiters.
            next = std::min(next, duration_cast<milliseconds>(me.fence_until_ - now) + milliseconds(5));
          }
        }
        if (stopped) {
          me.leave_if_done();  // if Redis was out of reach when the last permit went
          return;
        }
        me.heartbeat();
        me.schedule_heartbeat(next);
      });
}

void RedisLimiter::stop_heartbeats_for_test() {
  std::lock_guard lock(mu_);
  heartbeats_stopped_ = true;
  if (heartbeat_timer_) heartbeat_timer_->cancel();
}

void RedisLimiter::resume_heartbeats_for_test() {
  {
    std::lock_guard lock(mu_);
    heartbeats_stopped_ = false;
  }
  heartbeat();
  schedule_heartbeat(context_->options.heartbeat_interval);
}

void RedisLimiter::set_send_hook_for_test(std::function<void(std::string_view)> hook) {
  std::lock_guard lock(mu_);
  send_hook_ = std::move(hook);
}

void RedisLimiter::restore_now_for_test() {
  {
    std::lock_guard lock(mu_);
    restore_needed_ = true;
  }
  send_restore(/*even_if_stopped=*/true);
}

std::uint64_t RedisLimiter::expiry_every(const RedisBackendOptions& o) noexcept {
  const std::chrono::milliseconds span = o.key_expiry.count() > 0 ? o.key_expiry : std::chrono::hours(1);
  if (o.heartbeat_interval.count() <= 0) return kExpiryEvery;
  return std::max<std::uint64_t>(kExpiryEvery, static_cast<std::uint64_t>(span / (4 * o.heartbeat_interval)));
}

void RedisLimiter::ask_fair_positions_locked(std::vector<std::uint64_t>& asked,
                                             std::vector<std::string>& args) const {
  // Under tenant fairness Redis tells the positions (the order says nothing about the
  // rotation), a bounded number per beat. Those not counted at the queue's version as last
  // heard come first: the oldest (they move first), then the others least recently counted
  // first (beat by beat every waiter is reached). Then the oldest of those counted: Redis
  // counts them again only if the queue moved since, which it tells in its reply. Without
  // fairness the order tells the place unless waiters left from the middle of the queue:
  // Redis then counts the ranks of those asked, when the head or the length changed.
  std::vector<const Request*> waiting;
  for (const auto& [n, r] : requests_) {
    if (r->phase == Phase::queued && r->order > 0 && r->on_queued) waiting.push_back(r.get());
  }
  std::sort(waiting.begin(), waiting.end(),
            [](const Request* a, const Request* b) { return a->order < b->order; });
  constexpr std::size_t oldest = kFairPositionsPerBeat / 2;
  const auto stale = [&](const Request* r) {
    return r->counted_at.empty() || r->counted_at != queue_version_;
  };
  std::vector<const Request*> ask, others, counted;
  for (std::size_t i = 0; i < waiting.size(); ++i) {
    if (!stale(waiting[i])) {
      if (i < oldest) counted.push_back(waiting[i]);
    } else {
      (i < oldest ? ask : others).push_back(waiting[i]);
    }
  }
  std::stable_sort(others.begin(), others.end(),
                   [](const Request* a, const Request* b) { return a->counted_beat < b->counted_beat; });
  for (const Request* r : others) {
    if (ask.size() == kFairPositionsPerBeat) break;
    ask.push_back(r);
  }
  const std::size_t not_counted = ask.size();
  ask.insert(ask.end(), counted.begin(), counted.end());
  args.push_back(queue_version_);
  args.push_back(std::to_string(not_counted));
  args.push_back(std::to_string(ask.size()));
  for (const Request* r : ask) {
    asked.push_back(r->n);
    args.push_back(r->tenant);
    args.push_back(std::to_string(r->order));
  }
}

void RedisLimiter::heartbeat(bool force) {
  std::uint64_t generation = 0;
  std::uint64_t count = 0;
  BeatSent sent;
  std::function<void(std::string_view)> hook;
  std::vector<std::string> args;
  std::string probe_line;
  const auto& o = context_->options;
  const auto sent_at = Clock::now();
  {
    std::lock_guard lock(mu_);
    if ((heartbeat_in_flight_ && !force) || heartbeats_stopped_) return;
    heartbeat_in_flight_ = true;
    generation = config_generation_;
    count = heartbeats_sent_++;
    std::size_t waiting = 0;
    for (const auto& [n, h] : holders_) {
      if (!h.local) sent.holders.insert(n);
    }
    for (const auto& [n, r] : requests_) {
      if (r->phase == Phase::queued) sent.queued.insert(n);
      if (r->phase == Phase::sending) ++sent.inflight;
      if (r->phase == Phase::queued || r->phase == Phase::local) ++waiting;
    }
    sent.acquires = acquires_decided_;
    sent.cancels = cancels_decided_;
    hook = send_hook_;
    // Every expiry_every()-th beat: the keys' expiry (-1: none), with the housekeeping
    // that rides with it (heartbeat.lua).
    const auto expiry =
        (count % expiry_every(o) == 0) ? (o.key_expiry.count() > 0 ? o.key_expiry.count() : -1) : 0;
    args = {instance_,
            std::to_string(o.liveness_ttl.count()),
            std::to_string(expiry),
            std::to_string(o.fence().count()),
            std::to_string(holders_.size()),
            std::to_string(waiting)};
    sent.beat = count;
    ask_fair_positions_locked(sent.asked, args);
    // A state re-created by this heartbeat gets the settings in force now (the
    // cluster-wide ones as last seen), never merely the start-up ones.
    for (auto& f : core::wire_fields(settings_)) args.push_back(std::move(f));
    args.push_back("fence_seen");
    args.push_back(std::to_string(fence_seen_ms_));
    args.push_back("queue_seen");
    args.push_back(queue_seen_);
    args.push_back("liveness_tag");
    args.push_back(std::to_string(liveness_tag_));
    // No reply heard for as long as this instance takes its liveness to have run out (the seats
    // timer, on_wake): its heartbeats stop extending it, so that it does run out and the others
    // reap what Redis granted it meanwhile (heartbeat.lua, 'probe'; docs/design.md rule 16).
    if (first_beat_sent_ == Clock::time_point{}) first_beat_sent_ = sent_at;
    const auto heard = last_heard_ != Clock::time_point{} ? last_heard_ : first_beat_sent_;
    const bool probe = sent_at >= heard + probe_after();
    if (probe) {
      args.push_back("probe");
      args.push_back("1");
    }
    sent.probe = probe;
    if (connections_made_ > source_asked_at_) {
      args.push_back("check_source");
      args.push_back("1");
      sent.source_asked = connections_made_;
    }
    if (probe && !probing_)
      probe_line = fmt::format(
          "no reply from Redis heard for {}: heartbeats no longer extend this instance's liveness, so the "
          "other instances reap it and hand on what Redis granted it meanwhile (a slow or one-way link "
          "must not hold seats for nobody); it restores what it runs once Redis answers again",
          seconds(since(heard, sent_at)));
    probing_ = probe;
  }
  if (!probe_line.empty()) log(probe_line);
  if (hook) hook("heartbeat");
  call(scripts::kHeartbeat, std::move(args),
       [self = std::weak_ptr<LimiterImpl>(weak_from_this()), generation, sent_at, sent = std::move(sent)](
           boost::system::error_code ec, Reply reply) {
         auto s = self.lock();
         if (!s) return;
         auto& me = static_cast<RedisLimiter&>(*s);
         {
           std::lock_guard lock(me.mu_);
           me.heartbeat_in_flight_ = false;
         }
         if (ec || !has_shape(reply, kHeartbeat)) {
           me.context_->count_failure(ec);
           if (ec) {
             me.note_failure(ec);
           } else {
             me.note_success();
             me.log("heartbeat failed: " + why(ec, reply));
           }
           return;
         }
         me.note_success();
         {
           std::lock_guard lock(me.mu_);
           me.last_heard_ = Clock::now();
           // A probe's reply extended nothing: the liveness it found may have run out already.
           if (integer_of(reply.elements[0]) == 0 && !sent.probe) me.last_good_beat_sent_ = sent_at;
           me.source_asked_at_ = std::max(me.source_asked_at_, sent.source_asked);
         }
         me.on_heartbeat_reply(reply, sent, generation);
         // Heard again after probing: extend the liveness now, before anyone reaps it.
         if (sent.probe && integer_of(reply.elements[0]) == 0) me.heartbeat();
       });
}

namespace {

/// How much a counter of cfg (holders_lost, tenants_lost) grew since `last` saw it (0 at the
/// first sight, -1, and in a state this heartbeat created: its counters start again); `last`
/// becomes `now`.
std::uint64_t newly_counted(std::int64_t& last, std::int64_t now, bool created) {
  const std::int64_t before = std::exchange(last, now);
  return before >= 0 && now > before && !created ? static_cast<std::uint64_t>(now - before) : 0;
}

}  // namespace

void RedisLimiter::on_heartbeat_reply(const Reply& reply, const BeatSent& sent, std::uint64_t generation) {
  heartbeats_.fetch_add(1, std::memory_order_relaxed);
  const auto& e = reply.elements;
  const bool lost = integer_of(e[0]) != 0;
  const auto now = Clock::now();
  std::vector<std::pair<std::uint64_t, std::string>> grants;
  std::vector<std::string> orphans, logs;
  std::vector<std::pair<RequestPtr, QueueStatus>> positions;
  std::vector<RequestPtr> to_send;
  bool restore = false;
  bool drop_subscriber = false;
  {
    std::lock_guard lock(mu_);
    // Reaped (or the state is new): wakes held back from the registration
    // that ended must never arrive after the next one.
    drop_subscriber = lost && registered_.load();
    registered_.store(!lost);
    head_order_ = integer_of(e[2]);
    queued_ = count_of(e[3]);
    in_use_ = count_of(e[4]);
    epoch_ = integer_of(e[12]);
    older_ = count_of(e[13]);
    instances_.clear();
    for (const auto& id : e[14].elements) instances_.push_back(id.str);
    const milliseconds fence_left(integer_of(e[10]));
    note_fence_locked(now, fence_left);
    if (integer_of(e[8]) != 0) {
      ++engine_.state_recreations;
      logs.push_back(fmt::format(
          "no state in Redis (new limiter, or Redis lost it): created it with this instance's settings; {}",
          context_->options.fence().count() == 0
              ? std::string("not fenced (recovery_fence = 0: grants go on before the other instances "
                            "re-registered)")
              : fmt::format("fenced for {} (no grant until every instance re-registered)",
                            seconds(fence_left))));
    }
    if (integer_of(e[9]) != 0) {
      logs.push_back(
          "no instance had reached Redis for longer than the liveness TTL (Redis was away, or every "
          "instance had stopped): every instance's liveness was extended instead of reaping them; "
          "those that do not heartbeat again are reaped one TTL later");
    }
    // One pass over the engine fields of cfg: the pace (F7) and which Redis the
    // state's grants are made on (docs/design.md, recovery rule 14).
    core::PaceFigures f;
    std::int64_t last = 0, at = 0;
    const std::string* source = nullptr;
    std::int64_t holders_lost = 0, tenants_lost = 0;
    const auto& cfg = e[5].elements;
    for (std::size_t i = 0; i + 1 < cfg.size(); i += 2) {
      const std::string& field = cfg[i].str;
      const std::string& value = cfg[i + 1].str;
      if (field == "pace_gap") {
        f.gap_ms = std::strtod(value.c_str(), nullptr);
      } else if (field == "pace_n") {
        f.samples = parse_number<std::uint32_t>(value).value_or(0);
      } else if (field == "pace_last") {
        last = parse_number<std::int64_t>(value).value_or(0);
      } else if (field == "pace_at") {
        at = parse_number<std::int64_t>(value).value_or(0);
      } else if (field == "source") {
        source = &value;
      } else if (field == "holders_lost") {
        holders_lost = parse_number<std::int64_t>(value).value_or(0);
      } else if (field == "tenants_lost") {
        tenants_lost = parse_number<std::int64_t>(value).value_or(0);
      } else if (field == "fence_ms") {
        fence_seen_ms_ = parse_number<std::int64_t>(value).value_or(0);
      }
    }
    // Another instance has a longer fence (liveness TTL + heartbeat interval): recovery waits for
    // the longest, but a Redis-wide stall can still be taken for a crash of the faster instances.
    if (const auto own = context_->options.fence().count();
        fence_seen_ms_ > own && !fence_disagreement_logged_) {
      fence_disagreement_logged_ = true;
      logs.push_back(fmt::format(
          "another instance has a longer recovery fence ({} ms, this instance {} ms): its liveness TTL or "
          "heartbeat interval differs. Recovery after a loss now waits for the longest, but give every "
          "instance the same [redis] liveness_ttl_ms and heartbeat_ms (docs/faults.md)",
          fence_seen_ms_, own));
    }
    // A script found the holders key deleted (src/redis/scripts/lib.lua, holders_lost).
    const bool created = integer_of(e[8]) != 0;
    if (const auto n = newly_counted(holders_lost_, holders_lost, created)) {
      engine_.holders_key_lost += n;
      const std::string what =
          context_->options.fence().count() == 0
              ? std::string(
                    "not fenced (recovery_fence = 0): the cap may be exceeded until every instance "
                    "has restored what it runs")
              : fmt::format(
                    "fenced for {} (grants only in place of released permits until every instance has "
                    "restored what it runs)",
                    seconds(fence_left));
      logs.push_back(fmt::format(
          "Redis lost the limiter's holders key (evicted under a maxmemory-policy other than noeviction, "
          "or deleted) with the permits in it: {}; docs/faults.md, \"Eviction\"",
          what));
    }
    // A script found a tenant key deleted and rebuilt them all (lib.lua, repair_tenants).
    if (const auto n = newly_counted(tenants_lost_, tenants_lost, created)) {
      engine_.tenant_keys_rebuilt += n;
      logs.push_back(
          "Redis lost a tenant key of the limiter (evicted under a maxmemory-policy other than noeviction, "
          "or deleted): rebuilt from the queue and the permits; waiters it had stranded are served, and "
          "max_per_tenant may not have held meanwhile; docs/faults.md, \"Eviction\"");
    }
    if (source) {
      if (source->empty() && !told_unchecked_) {
        told_unchecked_ = true;
        logs.push_back(
            "Redis does not let this user run INFO (an ACL?): a failover or restart that lost the last "
            "grants is not seen before the next grant, so their seats can be granted again until their "
            "holders restore them (docs/design.md, recovery rule 14); allow +info for this user");
      }
      const bool switched = !source_.empty() && *source != source_ && integer_of(e[8]) == 0;
      // Not fenced, under a fence in force: an older copy of the state (a restart from a
      // snapshot), which names the id it was saved on, not this Redis's. The grant that finds
      // this Redis fences it, and the heartbeat after tells that, against the id known before.
      const bool stale_copy = switched && fence_left.count() == 0 && context_->options.fence().count() > 0;
      if (switched && !stale_copy) {
        ++engine_.redis_switches;
        logs.push_back(fmt::format(
            "the limiter's state is on another Redis than before (replication id {} was {}: a failover or "
            "a restart, which may have lost the last grants): fenced for {} (grants only in place of "
            "released permits until every instance has restored what it runs)",
            source->substr(0, 8), source_.substr(0, 8), seconds(fence_left)));
      }
      if (!stale_copy) source_ = *source;
    }
    if (e.size() > 15) {
      // The pace, in Redis time: as of now_ms, seen here now.
      const std::int64_t redis_now = integer_of(e[15]);
      if (last > 0) f.since_full_ms = static_cast<double>(std::max<std::int64_t>(0, redis_now - last));
      f.age_ms = static_cast<double>(std::max<std::int64_t>(0, redis_now - at));
      pace_ = f;
      pace_seen_ = now;
    }
    // A configure sent after this heartbeat is newer than its cfg.
    if (generation == config_generation_)
      adopt_settings_locked(settings_from_fields(e[5].elements, settings_));

    std::set<std::uint64_t> held;
    for (const auto& h : e[1].elements) {
      const auto n = parse_own(h.str);
      if (!n) continue;
      held.insert(*n);
      if (requests_.count(*n)) {
        // Not on a probe's word: it did not extend this instance, whose liveness may have run
        // out, so that another instance may reap it and hand the seat on before the full
        // heartbeat sent on this reply extends it. That heartbeat's reply lists it again.
        if (!sent.probe) grants.emplace_back(*n, h.str);
      } else if (auto it = holders_.find(*n); it != holders_.end()) {
        it->second.local = false;
      } else if (link_ == Link::up) {
        // While degraded or recovering a permit of ours may be a seat reused
        // here: it is released only after the restore registered what runs.
        orphans.push_back(h.str);
      }
    }
    // Level-triggered loss detection: does Redis have what we hold and wait for?
    bool mismatch = lost;
    if (!lost) {
      for (const auto n : sent.holders) {
        if (holders_.count(n) && !held.count(n)) mismatch = true;  // a permit Redis forgot
      }
      std::size_t expected = 0;
      for (const auto n : sent.queued) expected += held.count(n) ? 0 : 1;
      const std::size_t in_redis = count_of(e[11]);
      // Acquires and cancels decided after the heartbeat was prepared may have reached
      // Redis before it (another thread; a call run inline on the connection's strand):
      // they explain that many waiters more, or fewer, than the heartbeat was sent about.
      const auto later_acquires = static_cast<std::size_t>(acquires_decided_ - sent.acquires);
      const auto later_cancels = static_cast<std::size_t>(cancels_decided_ - sent.cancels);
      if (in_redis + later_cancels < expected) mismatch = true;  // a waiter Redis forgot
      if (in_redis > expected + sent.inflight + later_acquires)
        clean_extras_ = true;  // one that should have left
    }
    if (mismatch || clean_extras_) restore_needed_ = true;
    // Another process heartbeating with this instance id sets the deadline between two of
    // ours, with its own tag, beat after beat: 3 of the last 10 are not a one-off. This
    // process's own late heartbeats (one that timed out but ran) carry its tag; a restore and the
    // extension after an outage carry none (0): neither is taken for another process. Nothing in
    // Redis tells the two processes apart otherwise, so the cap cannot hold: said loudly.
    if (e.size() > 18) {
      const std::int64_t found = integer_of(e[18]);
      const bool moved = !lost && found > 0 && found <= 255 && found != liveness_tag_;
      liveness_moved_ = static_cast<std::uint16_t>(((liveness_moved_ << 1) | (moved ? 1 : 0)) & 0x3ff);
      if (moved && std::popcount(liveness_moved_) >= 3) {
        if (engine_.instance_id_shared++ % 60 == 0) {
          logs.push_back(fmt::format(
              "another process heartbeats as instance '{}' (its liveness in Redis was set by someone "
              "else in {} of the last 10 heartbeats): two processes share one instance id, so each "
              "takes the other's permits for its own and the cap does not hold. Give every process "
              "its own id (--instance, FAIRGATE_INSTANCE), or leave it unset for a generated one",
              instance_, std::popcount(liveness_moved_)));
        }
      }
    }
    // Until a restore put back what was missing, every heartbeat counts the queue again.
    queue_seen_ = lost || restore_needed_ || restore_in_flight_
                      ? std::string()
                      : fmt::format("h{}:{}", integer_of(e[2]), integer_of(e[3]));
    if (!lost && !settings_.enabled && settings_.when_disabled == DisabledMode::reject)
      end_all_disabled_locked();

    if (link_ == Link::degraded) {
      if (up_since_ == Clock::time_point{}) up_since_ = now;
      if (now - up_since_ >= context_->options.recover_after) {
        // Redis answered long enough: hand everything back in one restore.
        link_ = Link::recovering;
        if (local_) {
          Settings frozen = local_->settings();
          frozen.max_concurrent = 0;
          LocalSink sink(*this, now);
          local_->configure(frozen, now, sink);  // no local grant while the restore is in flight
        }
        restore_needed_ = true;
      }
    }
    restore = restore_needed_ && !restore_in_flight_ && link_ != Link::degraded;
    if (link_ == Link::up && !restore_needed_ && !restore_in_flight_) {
      for (auto& [n, r] : requests_) {
        if (r->ticket.pending() && r->phase == Phase::unsent) {
          to_send_locked(r, to_send);
        }
      }
      update_positions_locked(sent, e.size() > 16 ? &e[16] : nullptr,
                              e.size() > 17 ? e[17].str : std::string(), held, positions);
    }
  }
  if (drop_subscriber)
    context_->client->drop_subscriber(wake_channel_, "this instance was not registered any more");
  for (auto& [request, status] : positions) post_position(request, status);
  for (const auto& [n, id] : grants) on_granted(n, id, /*recovered=*/true);
  release_orphans(orphans);
  for (const auto& line : logs) log(line);
  if (restore) {
    send_restore();
  } else {
    send_all(to_send);
  }
}

void RedisLimiter::end_all_disabled_locked() {
  // Disabled in reject mode: Redis removed every waiter; this instance ends its own.
  const auto waiting = requests_;
  for (const auto& [n, request] : waiting) {
    if (request->phase == Phase::local) continue;
    if (request->ticket.resume(core::TicketEvent::reject) != core::TicketAction::deliver) continue;
    end_locked(request, RejectReason::disabled);
  }
}

std::vector<RedisLimiter::RequestPtr> RedisLimiter::waiting_oldest_first_locked() const {
  // Those Redis had queued by their order score (the cluster-wide arrival
  // order), then the others by their arrival here.
  std::vector<RequestPtr> waiting;
  for (const auto& [n, r] : requests_) {
    if (r->ticket.pending()) waiting.push_back(r);
  }
  std::stable_sort(waiting.begin(), waiting.end(), [](const RequestPtr& a, const RequestPtr& b) {
    const bool qa = a->order > 0, qb = b->order > 0;
    if (qa != qb) return qa;
    return qa ? a->order < b->order : a->n < b->n;
  });
  return waiting;
}

void RedisLimiter::send_restore(bool even_if_stopped) {
  const auto& o = context_->options;
  std::vector<std::string> args;
  {
    std::lock_guard lock(mu_);
    if (restore_in_flight_ || (heartbeats_stopped_ && !even_if_stopped)) return;
    restore_in_flight_ = true;
    const auto now = Clock::now();
    args = {instance_, std::to_string(o.liveness_ttl.count()),
            std::to_string(std::max<std::int64_t>(o.fence().count(), fence_seen_ms_)),
            std::to_string(next_n_), std::to_string(holders_.size())};
    for (const auto& [n, holder] : holders_) {
      args.push_back(std::to_string(n));
      args.push_back(holder.tenant);
      args.push_back(holder.local ? "l" : "r");
      args.push_back(std::to_string(since(holder.granted, now).count()));
    }
    for (const auto& r : waiting_oldest_first_locked()) {
      // An acquire on its way (Phase::sending) may reach Redis after this restore (sent from
      // another thread, or run inline on the connection's strand ahead of it), and a first
      // acquire does not look for a place a restore gave it: one request would wait twice.
      // Listed with no time left, it is kept if there and never added; its own reply says
      // where it stands.
      const bool on_its_way = r->phase == Phase::sending;
      if (!on_its_way) r->reached = true;
      args.push_back(std::to_string(r->n));
      args.push_back(r->order > 0 ? std::to_string(r->order) : std::string());
      args.push_back(on_its_way ? std::string("0")
                                : std::to_string(std::max<std::int64_t>(
                                      0, duration_cast<milliseconds>(r->deadline - now).count())));
      args.push_back(std::to_string(since(r->arrived, now).count()));
      args.push_back(std::to_string(r->weight));
      args.push_back(r->tenant);
    }
  }
  call(scripts::kRestore, std::move(args),
       [self = std::weak_ptr<LimiterImpl>(weak_from_this()), sent_at = Clock::now()](
           boost::system::error_code ec, Reply reply) {
         auto s = self.lock();
         if (!s) return;
         auto& me = static_cast<RedisLimiter&>(*s);
         if (ec || !(is_verdict(reply, "ok", kRestored) || is_verdict(reply, "lost"))) {
           me.context_->count_failure(ec);
           if (ec) {
             me.note_failure(ec);
           } else {
             me.note_success();
             me.log("restore failed: " + why(ec, reply));
           }
           std::lock_guard lock(me.mu_);
           me.restore_in_flight_ = false;  // the next heartbeat tries again
           if (me.link_ == Link::recovering) {
             me.link_ = Link::degraded;
             me.up_since_ = {};
             if (me.local_) {
               Settings resumed = me.local_->settings();
               resumed.max_concurrent = static_cast<std::uint32_t>(me.engine_.local_cap);
               LocalSink sink(me, Clock::now());
               me.local_->configure(resumed, Clock::now(), sink);
             }
           }
           return;
         }
         me.note_success();
         {
           std::lock_guard lock(me.mu_);
           me.last_heard_ = Clock::now();
           if (is_verdict(reply, "ok", kRestored)) me.last_good_beat_sent_ = sent_at;
         }
         me.on_restore_reply(reply);
       });
}

void RedisLimiter::on_restore_reply(const Reply& reply) {
  const auto& e = reply.elements;
  std::vector<std::pair<std::uint64_t, std::string>> grants;
  std::vector<std::string> orphans, logs;
  std::vector<RequestPtr> to_send;
  std::vector<std::pair<RequestPtr, QueueStatus>> positions;
  const auto now = Clock::now();
  {
    std::lock_guard lock(mu_);
    restore_in_flight_ = false;
    if (!is_verdict(reply, "ok", kRestored)) {
      // The state went away again before the restore ran: the next heartbeat
      // re-creates it, and the restore follows.
      restore_needed_ = true;
      registered_.store(false);
    } else {
      restore_needed_ = false;
      clean_extras_ = false;
      queue_version_.clear();  // the restore moved the queue: every place is counted again
      registered_.store(true);
      restores_.fetch_add(1, std::memory_order_relaxed);
      ++engine_.restores;
      const std::size_t permits = count_of(e[1]), waiters = count_of(e[2]);
      in_use_ = count_of(e[6]);
      const milliseconds fence_left(integer_of(e[7]));
      note_fence_locked(now, fence_left);
      for (auto& [n, h] : holders_) h.local = false;
      const bool was_open = link_ == Link::recovering && settings_.on_redis_down == RedisDownPolicy::open;
      if (link_ == Link::recovering) leave_degraded_locked(now, logs);
      for (const auto& g : e[3].elements) {
        if (const auto n = integer_of(g); n > 0)
          grants.emplace_back(static_cast<std::uint64_t>(n), permit_id(static_cast<std::uint64_t>(n)));
      }
      // Degraded meanwhile (this restore went through, later calls did not):
      // the local fallback keeps serving; the restore that ends it follows.
      const bool still_degraded = link_ == Link::degraded;
      const auto& orders = still_degraded ? std::vector<Reply>{} : e[4].elements;
      for (std::size_t i = 0; i + 1 < orders.size(); i += 2) {
        const auto n = integer_of(orders[i]);
        auto it = n > 0 ? requests_.find(static_cast<std::uint64_t>(n)) : requests_.end();
        if (it == requests_.end() || !it->second->ticket.pending()) continue;
        // Listed while its acquire was on its way: that acquire's reply tells it (on one
        // connection it comes first; a call redirected in a Cluster can come after).
        if (it->second->phase == Phase::sending) continue;
        auto& r = it->second;
        r->phase = Phase::queued;
        r->order = integer_of(orders[i + 1]);
        // Queued by this restore before any acquire of its own was answered (it arrived
        // while the restore was due): told where it waits now, not at the next heartbeat.
        // From its order there (under fairness its arrival rank, until the next heartbeat
        // brings the round robin's count).
        if (r->told_position == 0) tell_position_locked(r, now, positions);
      }
      // Orphans the restore released itself (not held here, not waited for), and those
      // that ended after it was sent, released right after.
      for (const auto& h : e[10].elements) {
        if (const auto n = parse_own(h.str)) unsent_releases_.erase(*n);
        orphans_.fetch_add(1, std::memory_order_relaxed);
      }
      for (const auto& h : e[5].elements) {
        const auto n = parse_own(h.str);
        if (n && !holders_.count(*n) && !requests_.count(*n)) orphans.push_back(h.str);
      }
      // Requests that arrived while the restore was in flight.
      for (auto& [n, r] : requests_) {
        if (still_degraded) break;
        if (r->ticket.pending() && (r->phase == Phase::unsent || r->phase == Phase::local)) {
          to_send_locked(r, to_send);
        }
      }
      if (permits > 0 || waiters > 0 || integer_of(e[8]) == 0) {
        logs.push_back(fmt::format("restored to Redis: {} permit(s) and {} waiter(s) Redis did not have",
                                   permits, waiters));
      }
      // Orphans in the held list (seats reused here, releases that never
      // reached Redis) are released right after: they are not running.
      const std::size_t running = in_use_ - std::min(in_use_, orphans.size());
      if (permits > 0 && running > settings_.max_concurrent) {
        const auto over = std::min(permits, running - settings_.max_concurrent);
        engine_.overshoot_restored += over;
        const char* cause = was_open
                                ? "they were let through while Redis was unreachable (on_redis_down = open)"
                                : "Redis counted them no more while their work kept running (this instance "
                                  "was paused or cut off longer than the liveness TTL), or counts more than "
                                  "runs (it restarted from an older copy of the state, which still lists "
                                  "permits released since)";
        logs.push_back(
            fmt::format("{} restored permit(s) are above the cap ({} in use, max_concurrent {}): {}; "
                        "nothing more is granted until below the cap",
                        over, running, settings_.max_concurrent, cause));
      }
      if (integer_of(e[9]) != 0) {
        logs.push_back(
            fmt::format("Redis had lost permits it granted to this instance (lost writes, e.g. a "
                        "failover, or a deleted key): fenced for {}",
                        seconds(fence_left)));
      }
    }
  }
  for (auto& [request, status] : positions) post_position(request, status);
  for (const auto& [n, id] : grants) on_granted(n, id, /*recovered=*/true);
  release_orphans(orphans);
  for (const auto& line : logs) log(line);
  send_all(to_send);
  if (!is_verdict(reply, "ok", kRestored)) heartbeat();
}

void RedisLimiter::note_fence_locked(Clock::time_point now, milliseconds left) {
  // engine_.fenced_time holds the fences that are over and replaced; the last
  // one seen is [fence_seen_since_, fence_until_) (snapshot() adds it).
  const bool active = fence_until_ > now;
  if (left.count() > 0) {
    if (!active) {
      if (fence_until_ > fence_seen_since_)
        engine_.fenced_time += duration_cast<milliseconds>(fence_until_ - fence_seen_since_);
      fence_seen_since_ = now;
    }
    fence_until_ = now + left;
  } else if (active) {
    fence_until_ = now;  // over sooner than the last reply said
  }
}

// --- link health, degraded modes ------------------------------------------

void RedisLimiter::note_success() {
  std::lock_guard lock(mu_);
  if (link_ == Link::failing) {
    link_ = Link::up;  // a hiccup, over: unsent releases come back as orphans in the next held list
    unsent_releases_.clear();
  }
}

void RedisLimiter::note_failure(boost::system::error_code ec) {
  if (ec == make_error_code(Error::closed)) return;
  std::vector<std::string> logs;
  {
    std::lock_guard lock(mu_);
    const auto now = Clock::now();
    up_since_ = {};
    last_failure_denied_ = ec == make_error_code(Error::denied);
    if (link_ == Link::up) {
      link_ = Link::failing;
      failing_since_ = now;
    }
    if (link_ == Link::failing && now - failing_since_ >= context_->options.degrade_after && !shut_down_)
      enter_degraded_locked(now, logs);
  }
  for (const auto& line : logs) log(line);
}

void RedisLimiter::enter_degraded_locked(Clock::time_point now, std::vector<std::string>& logs) {
  link_ = Link::degraded;
  degraded_.store(true);
  degraded_since_ = now;
  up_since_ = {};
  ++engine_.degraded_entries;
  seats_expired_ = false;
  const auto unreachable = seconds(since(failing_since_, now));
  // What the operator looks for: a Redis away, or one that refuses this user.
  const char* down =
      last_failure_denied_ ? "Redis refused this user's calls (docs/redis-acl.md)" : "Redis unreachable";
  const std::vector<RequestPtr> waiting = waiting_oldest_first_locked();
  switch (settings_.on_redis_down) {
    case RedisDownPolicy::local: {
      // Cap-safe by default: the seats this instance holds are counted for it in
      // Redis (nobody reaps while Redis is away), so reusing them never adds to
      // the cluster total. A fixed local_share is the operator's choice.
      const std::size_t cap =
          settings_.local_share ? *settings_.local_share : holders_.size() + unsent_releases_.size();
      engine_.local_cap = cap;
      Settings local = settings_;
      local.max_concurrent = static_cast<std::uint32_t>(cap);
      local_.emplace(local);
      for (const auto& [n, h] : holders_) local_->adopt(n, h.granted, h.tenant);
      // max_per_tenant counts a tenant's permits on every instance, and each decides alone
      // now: a tenant reuses only the seats it holds here (Redis counts them for it).
      if (!settings_.local_share && settings_.max_per_tenant) local_->cap_tenants_at_their_holders();
      for (const auto& r : waiting) local_admit_locked(r, now);
      logs.push_back(fmt::format(
          "degraded: {} for {}; on_redis_down = local: {} seat(s) ({}), {} waiter(s) kept in "
          "order",
          down, unreachable, cap, settings_.local_share ? "local_share" : "the permits Redis counts for it",
          waiting.size()));
      // With other instances alive, Redis would reap this one's permits one
      // TTL after its last heartbeat if only this instance is cut off: its
      // seats are reusable until then.
      const bool alone = instances_.empty() || (instances_.size() == 1 && instances_[0] == instance_);
      if (!settings_.local_share && !alone && seats_timer_) {
        const auto until = alive_at_least_until(last_good_beat_sent_);
        seats_timer_->expires_at(until);
        seats_timer_->async_wait(
            [self = std::weak_ptr<LimiterImpl>(weak_from_this())](boost::system::error_code ec) {
              if (ec == boost::asio::error::operation_aborted) return;
              if (auto s = self.lock()) static_cast<RedisLimiter&>(*s).on_seats_expired();
            });
      }
      break;
    }
    case RedisDownPolicy::open:
      for (const auto& r : waiting) {
        r->ticket.resume(core::TicketEvent::grant);
        forget_locked(r);
        holders_.emplace(r->n, Holder{r->tenant, now, /*local=*/true});
        deliver_granted(*r, now);
      }
      logs.push_back(
          fmt::format("degraded: {} for {}; on_redis_down = open: everything is let "
                      "through ({} waiter(s) granted now)",
                      down, unreachable, waiting.size()));
      break;
    case RedisDownPolicy::closed:
      logs.push_back(
          fmt::format("degraded: {} for {}; on_redis_down = closed: new requests are "
                      "rejected, {} waiter(s) wait for Redis",
                      down, unreachable, waiting.size()));
      break;
  }
}

void RedisLimiter::local_admit_locked(const RequestPtr& request, Clock::time_point now) {
  const auto a = local_->admit(request->n, now, request->deadline, request->tenant, request->weight);
  switch (a.kind) {
    case core::Admission::Kind::granted:
      request->ticket.resume(core::TicketEvent::grant);
      forget_locked(request);
      holders_.emplace(request->n, Holder{request->tenant, now, /*local=*/true});
      deliver_granted(*request, now);
      return;
    case core::Admission::Kind::queued:
      request->phase = Phase::local;
      if (request->on_queued) {
        request->told_position = a.position;
        post_position(request, QueueStatus{a.position, local_->queued(), a.estimated_wait, request->n,
                                           permit_id(request->n)});
      }
      return;
    case core::Admission::Kind::rejected: {
      const auto event =
          a.reason == RejectReason::timeout ? core::TicketEvent::timeout : core::TicketEvent::reject;
      if (request->ticket.resume(event) == core::TicketAction::deliver && end_locked(request, a.reason))
        clean_extras_ = true;
      return;
    }
  }
}

void RedisLimiter::on_seats_expired() {
  std::string line;
  {
    std::lock_guard lock(mu_);
    if (link_ != Link::degraded || !local_ || settings_.local_share || seats_expired_) return;
    seats_expired_ = true;
    engine_.local_cap = 0;
    Settings none = local_->settings();
    none.max_concurrent = 0;
    LocalSink sink(*this, Clock::now());
    local_->configure(none, Clock::now(), sink);
    line =
        "degraded: this instance's liveness in Redis has run out by now; if only this instance is cut off, "
        "its seats went to others: no more local grants (waiters wait for Redis or their max wait)";
  }
  log(line);
}

void RedisLimiter::leave_degraded_locked(Clock::time_point now, std::vector<std::string>& logs) {
  const auto took = since(degraded_since_, now);
  engine_.degraded_time += took;
  link_ = Link::up;
  degraded_.store(false);
  local_.reset();
  unsent_releases_.clear();  // the restore's held list showed them: released as orphans
  if (seats_timer_) seats_timer_->cancel();
  logs.push_back(
      fmt::format("left degraded mode after {}: permits and waiters handed back to Redis", seconds(took)));
}

// --- snapshot, settings, configure, shutdown -----------------------------

Snapshot RedisLimiter::snapshot() const {
  Snapshot s;
  s.name = name_;
  std::lock_guard lock(mu_);
  const auto t = Clock::now();
  s.settings = settings_;
  s.in_use = local_ ? local_->in_use() : in_use_;
  s.queued = local_ ? local_->queued() : queued_;
  s.stats = stats_;
  s.engine = engine_;
  s.engine.degraded = link_ == Link::degraded || link_ == Link::recovering;
  if (!local_) s.engine.local_cap = 0;
  s.engine.settings_source = settings_source_;
  if (fence_until_ > t) s.engine.fence_left = duration_cast<milliseconds>(fence_until_ - t);
  if (fence_until_ > fence_seen_since_)
    s.engine.fenced_time += duration_cast<milliseconds>(std::min(fence_until_, t) - fence_seen_since_);
  if (s.engine.degraded) s.engine.degraded_time += since(degraded_since_, t);
  std::vector<std::pair<Clock::time_point, HolderInfo>> holders;
  for (const auto& [n, h] : holders_)
    holders.emplace_back(h.granted, HolderInfo{permit_id(n), h.tenant, since(h.granted, t), instance_});
  std::stable_sort(holders.begin(), holders.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [when, h] : holders) s.holders.push_back(std::move(h));
  std::vector<std::pair<std::pair<int, std::int64_t>, WaiterInfo>> waiters;
  for (const auto& [n, r] : requests_) {
    std::size_t position = 0;
    std::pair<int, std::int64_t> key{2, static_cast<std::int64_t>(n)};
    if (r->phase == Phase::queued) {
      position = position_locked(r->order);
      key = {0, r->order};
    } else if (r->phase == Phase::local && local_) {
      position = local_->position(n).value_or(0);
      key = {1, static_cast<std::int64_t>(position)};
    }
    waiters.emplace_back(key, WaiterInfo{permit_id(n), r->tenant, position, since(r->arrived, t), instance_});
  }
  std::sort(waiters.begin(), waiters.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [key, w] : waiters) s.waiters.push_back(std::move(w));
  if (s.queued == 0 && s.in_use < s.settings.max_concurrent) {
    s.estimated_wait = milliseconds(0);
  } else if (!local_) {
    s.estimated_wait = estimate_locked(s.queued + 1, t);
  }
  return s;
}

namespace {
/// The instance of a permit id or waiter member "inst|n...".
std::string instance_of(std::string_view id) { return std::string(id.substr(0, id.find('|'))); }

milliseconds age(std::int64_t now_ms, std::int64_t since_ms) {
  return since_ms < 0 ? milliseconds(0) : milliseconds(std::max<std::int64_t>(0, now_ms - since_ms));
}
}  // namespace

void RedisLimiter::start_status(const StatusQuery& query,
                                std::unique_ptr<detail::StatusCompletion> completion) {
  const auto fail = [&completion](Errc code, std::string message) {
    StatusResult r;
    r.error = make_error_code(code);
    r.message = std::move(message);
    completion->complete(std::move(r));
  };
  {
    std::lock_guard lock(mu_);
    if (link_ == Link::degraded || link_ == Link::recovering) {
      return fail(Errc::unavailable,
                  fmt::format("Redis is unreachable: this instance runs the limiter on its on_redis_down "
                              "policy ({}); the cluster-wide status needs Redis",
                              to_string(settings_.on_redis_down)));
    }
  }
  auto box = std::make_shared<std::unique_ptr<detail::StatusCompletion>>(std::move(completion));
  call(scripts::kSnapshot, {std::to_string(query.offset), std::to_string(query.limit)},
       [self = std::weak_ptr<LimiterImpl>(weak_from_this()), box, query](boost::system::error_code ec,
                                                                         Reply reply) {
         StatusResult r;
         r.offset = query.offset;
         r.limit = query.limit;
         auto s = self.lock();
         if (!s) {
           r.error = make_error_code(Errc::shut_down);
           r.message = "the limiter is gone";
           return (*box)->complete(std::move(r));
         }
         auto& me = static_cast<RedisLimiter&>(*s);
         if (ec || !is_verdict(reply, "ok", kSnapshot)) {
           r.error = make_error_code(Errc::unavailable);
           if (!ec && is_verdict(reply, "lost")) {
             r.message =
                 "the limiter's state in Redis is gone (expired, flushed or lost in a failover): the "
                 "instances re-create and restore it at their next heartbeat";
             me.heartbeat();
           } else {
             me.context_->count_failure(ec);
             r.message = "Redis did not answer the status call: " + why(ec, reply);
           }
           return (*box)->complete(std::move(r));
         }
         const auto& e = reply.elements;
         const std::int64_t now = integer_of(e[1]);
         r.snapshot = me.snapshot();
         r.snapshot.shadow = me.shadow_run().status();
         r.snapshot.in_use = count_of(e[2]);
         r.snapshot.queued = count_of(e[3]);
         r.snapshot.holders.clear();
         for (std::size_t i = 0; i + 2 < e[4].elements.size(); i += 3) {
           const std::string& id = e[4].elements[i].str;
           r.snapshot.holders.push_back(HolderInfo{
               id, e[4].elements[i + 1].str, age(now, integer_of(e[4].elements[i + 2])), instance_of(id)});
         }
         r.snapshot.waiters.clear();
         for (std::size_t i = 0; i + 3 < e[5].elements.size(); i += 4) {
           const std::string& id = e[5].elements[i].str;
           r.snapshot.waiters.push_back(
               WaiterInfo{id, e[5].elements[i + 1].str, count_of(e[5].elements[i + 3]),
                          age(now, integer_of(e[5].elements[i + 2])), instance_of(id)});
         }
         for (const auto& id : e[6].elements) r.instances.push_back(id.str);
         std::sort(r.instances.begin(), r.instances.end());
         {
           // The wait estimate of a new arrival, with the counts of this call.
           std::lock_guard lock(me.mu_);
           const Snapshot& sn = r.snapshot;
           if (sn.queued == 0 && sn.in_use < sn.settings.max_concurrent) {
             r.snapshot.estimated_wait = milliseconds(0);
           } else if (!me.local_) {
             r.snapshot.estimated_wait = me.estimate_locked(sn.queued + 1, Clock::now());
           }
         }
         (*box)->complete(std::move(r));
       });
}

Settings RedisLimiter::settings() const {
  std::lock_guard lock(mu_);
  return settings_;
}

bool RedisLimiter::shut_down() const noexcept {
  std::lock_guard lock(mu_);
  return shut_down_;
}

namespace {
/// The shared fields `u` changes, as the cfg hash stores them, with their values in `next`.
std::vector<std::string> changed_fields(const SettingsUpdate& u, const Settings& next) {
  std::vector<std::string> out;
  for (const auto& spec : core::kSettings) {
    if (!spec.shared() || !spec.in_update(u)) continue;
    out.emplace_back(spec.wire);
    out.push_back(core::wire_value(spec, spec.get(next)));
  }
  return out;
}
}  // namespace

boost::system::result<Settings, SettingsError> RedisLimiter::configure(const SettingsUpdate& update) {
  Settings next;
  std::vector<std::string> args;
  {
    std::lock_guard lock(mu_);
    next = apply(settings_, update);
    if (auto error = validate(next)) return *error;
    settings_changed(settings_, next);
    settings_ = next;
    ++config_generation_;
    // Only the fields that change, so two instances changing different fields
    // do not undo each other. The local-only fields are never sent.
    args = changed_fields(update, next);
  }
  if (!args.empty()) {
    call(scripts::kConfigure, std::move(args),
         [self = std::weak_ptr<LimiterImpl>(weak_from_this())](boost::system::error_code ec, Reply reply) {
           auto s = self.lock();
           if (!s) return;
           auto& me = static_cast<RedisLimiter&>(*s);
           if (ec || !(is_verdict(reply, "ok", kConfigured) || is_verdict(reply, "lost"))) {
             me.context_->count_failure(ec);
             me.log("configure failed (Redis did not confirm; its settings win at the next heartbeat): " +
                    why(ec, reply));
           } else if (is_verdict(reply, "lost")) {
             me.heartbeat();  // re-creates the state with the settings in force here
           }
         });
  }
  return next;
}

void RedisLimiter::start_configure(const SettingsUpdate& update,
                                   std::unique_ptr<detail::ConfigureCompletion> completion) {
  std::vector<std::string> args;
  {
    std::lock_guard lock(mu_);
    const Settings next = apply(settings_, update);
    ConfigureResult r;
    if (auto error = validate(next)) {
      r.error = make_error_code(Errc::invalid_settings);
      r.message = error->message();
      r.settings = settings_;
      completion->complete(std::move(r));
      return;
    }
    if (shut_down_) {
      r.error = make_error_code(Errc::shut_down);
      r.message = "the backend has been shut down";
      r.settings = settings_;
      completion->complete(std::move(r));
      return;
    }
    core::copy_local_settings(next, settings_);
    args = changed_fields(update, next);
    if (args.empty()) {
      r.settings = settings_;
      completion->complete(std::move(r));
      return;
    }
  }
  // Applied here only once Redis confirmed it (its reply carries the
  // cluster-wide settings): a 200 means every instance has it.
  send_configure(std::move(args),
                 std::make_shared<std::unique_ptr<detail::ConfigureCompletion>>(std::move(completion)), 1);
}

void RedisLimiter::send_configure(std::vector<std::string> fields,
                                  std::shared_ptr<std::unique_ptr<detail::ConfigureCompletion>> completion,
                                  int attempt) {
  auto resend = fields;
  call(scripts::kConfigure, std::move(fields),
       [self = std::weak_ptr<LimiterImpl>(weak_from_this()), resend = std::move(resend), completion, attempt](
           boost::system::error_code ec, Reply reply) mutable {
         auto s = self.lock();
         if (!s) return;
         auto& me = static_cast<RedisLimiter&>(*s);
         const bool lost = !ec && is_verdict(reply, "lost");
         if (lost && attempt < 2) {
           // The state is gone: a heartbeat re-creates it (with the settings in
           // force here) and runs before the second try, on the same connection.
           me.heartbeat(/*force=*/true);
           me.send_configure(std::move(resend), std::move(completion), attempt + 1);
           return;
         }
         ConfigureResult r;
         {
           std::lock_guard lock(me.mu_);
           if (ec || !is_verdict(reply, "ok", kConfigured)) {
             me.context_->count_failure(ec);
             r.error = make_error_code(Errc::unavailable);
             r.message = "Redis did not confirm the change: " +
                         (lost ? std::string("its state is gone") : why(ec, reply));
           } else {
             ++me.config_generation_;
             me.adopt_settings_locked(settings_from_fields(reply.elements[1].elements, me.settings_));
             if (!me.settings_.enabled && me.settings_.when_disabled == DisabledMode::reject)
               me.end_all_disabled_locked();
           }
           r.settings = me.settings_;
         }
         (*completion)->complete(std::move(r));
       });
}

void RedisLimiter::shutdown() {
  std::vector<std::uint64_t> cancels;
  {
    std::lock_guard lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    const auto waiting = requests_;
    for (const auto& [n, request] : waiting) {
      if (request->ticket.resume(core::TicketEvent::reject) != core::TicketAction::deliver) continue;
      if (end_locked(request, RejectReason::shutdown)) cancels.push_back(n);
    }
  }
  for (const auto n : cancels) send_cancel(n);
  leave_if_done();  // after the cancels, on the same connection
}

void RedisLimiter::leave_if_done() {
  {
    std::lock_guard lock(mu_);
    if (!shut_down_ || !holders_.empty() || leaving_ || link_ != Link::up || restore_needed_) return;
    leaving_ = true;
    // Out of Redis: a heartbeat now would register this instance again.
    heartbeats_stopped_ = true;
    if (heartbeat_timer_) heartbeat_timer_->cancel();
  }
  call(scripts::kLeave, {instance_},
       [self = std::weak_ptr<LimiterImpl>(weak_from_this())](boost::system::error_code ec, Reply reply) {
         if (!ec && has_shape(reply, kLeft)) return;
         // Still listed: the other instances reap it when its liveness runs out, as after a crash.
         if (auto s = self.lock()) static_cast<RedisLimiter&>(*s).context_->count_failure(ec);
       });
}

}  // namespace fairgate::redis
