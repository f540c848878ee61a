#include "redis/redis_limiter.hpp"

#include "api/outcome.hpp"

#include <boost/asio/post.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <utility>

namespace fairgate::redis {

namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

milliseconds since(Clock::time_point start, Clock::time_point t) {
  return t > start ? duration_cast<milliseconds>(t - start) : milliseconds(0);
}

template <typename T>
std::optional<T> parse_number(std::string_view s) {
  T value{};
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  return value;
}

bool is_array(const Reply& r, std::size_t at_least) {
  return r.type == Reply::Type::array && r.elements.size() >= at_least;
}

void log_error(const std::string& limiter, const char* what, const std::string& detail) {
  std::fprintf(stderr, "fairgate redis [%s]: %s: %s\n", limiter.c_str(), what, detail.c_str());
}

}  // namespace

BackendContext::~BackendContext() {
  if (subscriber) subscriber->close();
  if (commands) {
    // Close once every command sent before has been answered (replies come in
    // order), so the last releases are not cut off by the close.
    commands->exec({"PING"}, [c = commands](boost::system::error_code, Reply) { c->close(); });
  }
}

RedisLimiter::RedisLimiter(std::shared_ptr<BackendContext> context, std::string name, Settings defaults)
    : context_(std::move(context)),
      name_(std::move(name)),
      instance_(context_->options.instance_id),
      defaults_(defaults),
      settings_(std::move(defaults)),
      heartbeat_timer_(std::in_place, context_->executor) {
  const std::string base = context_->options.key_prefix + ":{" + name_ + "}:";
  keys_ = {base + "cfg", base + "holders", base + "queue", base + "seq", base + "instances"};
  wake_prefix_ = base + "wake:";
  wake_channel_ = wake_prefix_ + instance_;
}

RedisLimiter::~RedisLimiter() = default;

std::string RedisLimiter::permit_id(std::uint64_t n) const { return instance_ + "|" + std::to_string(n); }

std::uint64_t RedisLimiter::commands_sent() const noexcept {
  return context_->commands->commands_sent() + context_->subscriber->commands_sent();
}

std::optional<std::uint64_t> RedisLimiter::parse_own(std::string_view id) const {
  if (id.size() <= instance_.size() + 1 || id.compare(0, instance_.size(), instance_) != 0 ||
      id[instance_.size()] != '|') {
    return std::nullopt;
  }
  return parse_number<std::uint64_t>(id.substr(instance_.size() + 1));
}

void RedisLimiter::call(const Script& script, std::vector<std::string> args, Connection::Callback callback) {
  args.insert(args.begin(), wake_prefix_);
  call_script(*context_->commands, script, keys_, args, std::move(callback));
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
  {
    std::lock_guard lock(mu_);
    ++stats_.acquires;
    if (shut_down_) {
      request->ticket.resume(core::TicketEvent::reject);
      deliver_ended(*request, RejectReason::shutdown, t);
      return;
    }
    const auto checked =
        core::effective_max_wait(options.max_wait, settings_, request->tenant.size(), request->weight);
    if (!checked) {
      request->ticket.resume(core::TicketEvent::reject);
      deliver_ended(*request, RejectReason::invalid_argument, t);
      return;
    }
    const milliseconds max_wait = *checked;
    request->max_wait = max_wait;
    request->n = next_n_++;
    // Registered before the acquire is sent: the wake can overtake the reply.
    requests_.emplace(request->n, request);
    if (max_wait.count() > 0) {
      request->timer.emplace(context_->executor);
      request->timer->expires_at(t + max_wait);
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
  }
  send_acquire(request);
}

void RedisLimiter::send_acquire(const RequestPtr& request) {
  call(scripts::kAcquire,
       {instance_, std::to_string(request->n), std::to_string(request->max_wait.count()), request->tenant,
        std::to_string(request->weight)},
       [request, self = std::weak_ptr<LimiterImpl>(weak_from_this())](boost::system::error_code ec,
                                                                      Reply reply) {
         if (auto s = self.lock()) static_cast<RedisLimiter&>(*s).on_acquire_reply(request, ec, reply);
       });
}

void RedisLimiter::on_acquire_reply(const RequestPtr& request, boost::system::error_code ec,
                                    const Reply& reply) {
  const std::string id = permit_id(request->n);
  if (ec || !is_array(reply, 1)) {
    context_->redis_errors.fetch_add(1, std::memory_order_relaxed);
    const std::string why = ec                 ? ec.message()
                            : reply.is_error() ? reply.str
                                               : "unexpected reply " + reply.debug_string();
    log_error(name_, "acquire failed", why);
    bool granted = false;
    {
      std::lock_guard lock(mu_);
      if (request->ticket.resume(core::TicketEvent::reject) == core::TicketAction::deliver) {
        forget_locked(request);
        deliver_ended(*request, RejectReason::unavailable, Clock::now(), "limiter is unavailable: " + why);
      }
      // A wake may have delivered the grant already: that permit is the caller's.
      granted = request->ticket.state() == core::TicketState::granted;
    }
    // The script may have run (a timeout or a drop after sending): if it
    // granted, give the permit back now. If it queued, the waiter leaves at its
    // deadline, or is granted and then released as an orphan (wake/heartbeat).
    if (!granted) send_release(id, "release after failed acquire");
    return;
  }
  const std::string& kind = reply.elements[0].str;
  if (kind == "granted") {
    on_granted(request->n, id, false);
    return;
  }
  if (kind == "queued" && is_array(reply, 4)) {
    std::string cancel_member;
    {
      std::lock_guard lock(mu_);
      const auto state = request->ticket.state();
      if (state == core::TicketState::pending) {
        request->member = reply.elements[1].str;
        request->seq = reply.elements[2].integer;
        const auto position = static_cast<std::size_t>(std::max<std::int64_t>(1, reply.elements[3].integer));
        queued_ = std::max(queued_, position);
        if (request->on_queued) {
          request->told_position = position;
          post_position(request, QueueStatus{position, queued_, std::nullopt,
                                             static_cast<std::uint64_t>(request->seq)});
        }
      } else if (state != core::TicketState::granted) {
        cancel_member = reply.elements[1].str;  // ended while the acquire was in flight
      }
    }
    if (!cancel_member.empty()) send_cancel(cancel_member);
    return;
  }
  if (kind == "rejected" && is_array(reply, 2)) {
    const std::string& why = reply.elements[1].str;
    const RejectReason reason = why == "queue_full" ? RejectReason::queue_full
                                : why == "disabled" ? RejectReason::disabled
                                : why == "timeout"  ? RejectReason::timeout
                                                    : RejectReason::unavailable;
    std::lock_guard lock(mu_);
    const auto event =
        reason == RejectReason::timeout ? core::TicketEvent::timeout : core::TicketEvent::reject;
    if (request->ticket.resume(event) == core::TicketAction::deliver) {
      forget_locked(request);
      deliver_ended(*request, reason, Clock::now());
    }
    return;
  }
  if (kind == "dead" || kind == "lost") {
    bool retry = false;
    {
      std::lock_guard lock(mu_);
      if (!request->retried && request->ticket.pending() && !shut_down_) {
        request->retried = true;
        retry = true;
      } else if (request->ticket.resume(core::TicketEvent::reject) == core::TicketAction::deliver) {
        forget_locked(request);
        deliver_ended(*request, RejectReason::unavailable, Clock::now(),
                      "limiter is unavailable: this instance could not re-register with Redis");
      }
    }
    if (retry) {
      // Re-register (the heartbeat reports lost and restores), then try again;
      // both go down the same connection, so Redis sees them in this order.
      heartbeat([request, self = std::weak_ptr<LimiterImpl>(weak_from_this())] {
        auto s = self.lock();
        if (s && request->ticket.pending()) static_cast<RedisLimiter&>(*s).send_acquire(request);
      });
    }
    return;
  }
  context_->redis_errors.fetch_add(1, std::memory_order_relaxed);
  log_error(name_, "unexpected acquire reply", reply.debug_string());
  bool granted = false;
  {
    std::lock_guard lock(mu_);
    if (request->ticket.resume(core::TicketEvent::reject) == core::TicketAction::deliver) {
      forget_locked(request);
      deliver_ended(*request, RejectReason::unavailable, Clock::now());
    }
    granted = request->ticket.state() == core::TicketState::granted;
  }
  if (!granted) send_release(id, "release after unexpected acquire reply");
}

void RedisLimiter::on_granted(std::uint64_t n, const std::string& id, bool from_heartbeat) {
  bool orphan = false;
  {
    std::lock_guard lock(mu_);
    auto it = requests_.find(n);
    if (it == requests_.end()) {
      // Not waiting here: a duplicate of a grant we already delivered, or a
      // grant for a request that ended (timed out, cancelled, failed).
      orphan = holders_.count(n) == 0;
    } else {
      RequestPtr request = it->second;
      const auto action = request->ticket.resume(core::TicketEvent::grant);
      forget_locked(request);
      if (action == core::TicketAction::deliver) {
        const auto t = Clock::now();
        holders_.emplace(n, Holder{request->tenant, t});
        if (from_heartbeat) lost_wakes_.fetch_add(1, std::memory_order_relaxed);
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

void RedisLimiter::on_wake(const std::string& id) {
  if (auto n = parse_own(id)) on_granted(*n, id, false);
}

void RedisLimiter::on_deadline(const RequestPtr& request) {
  std::string member;
  {
    std::lock_guard lock(mu_);
    if (request->ticket.resume(core::TicketEvent::timeout) != core::TicketAction::deliver) return;
    forget_locked(request);
    deliver_ended(*request, RejectReason::timeout, Clock::now());
    member = request->member;  // empty: the acquire reply cleans up
  }
  if (!member.empty()) send_cancel(member);
}

void RedisLimiter::on_cancel(const RequestPtr& request) {
  std::string member;
  {
    std::lock_guard lock(mu_);
    if (request->ticket.resume(core::TicketEvent::cancel) != core::TicketAction::deliver) return;
    forget_locked(request);
    deliver_ended(*request, RejectReason::cancelled, Clock::now());
    member = request->member;
  }
  if (!member.empty()) send_cancel(member);
}

void RedisLimiter::forget_locked(const RequestPtr& request) {
  requests_.erase(request->n);
  if (request->timer) request->timer->cancel();
}

void RedisLimiter::send_release(const std::string& id, const char* why, const std::string* tenant) {
  std::vector<std::string> args{id};
  if (tenant) args.push_back(*tenant);
  call(scripts::kRelease, std::move(args),
       [ctx = std::weak_ptr<BackendContext>(context_), name = name_, id, why](boost::system::error_code ec,
                                                                              Reply reply) {
         if (!ec && !reply.is_error()) return;
         if (auto c = ctx.lock()) c->redis_errors.fetch_add(1, std::memory_order_relaxed);
         log_error(name, why, id + ": " + (ec ? ec.message() : reply.str));
       });
}

void RedisLimiter::send_cancel(const std::string& member) {
  call(scripts::kCancel, {member},
       [ctx = std::weak_ptr<BackendContext>(context_), name = name_, member](boost::system::error_code ec,
                                                                             Reply reply) {
         if (!ec && !reply.is_error()) return;
         if (auto c = ctx.lock()) c->redis_errors.fetch_add(1, std::memory_order_relaxed);
         // The waiter stays until its deadline (dispatch drops it) or is granted
         // and then released as an orphan by the next heartbeat.
         log_error(name, "cancel failed", member + ": " + (ec ? ec.message() : reply.str));
       });
}

// --- release, delivery -----------------------------------------------------

void RedisLimiter::release(const std::string& id) noexcept {
  try {
    const auto n = parse_own(id);
    if (!n) return;
    std::string tenant;
    {
      std::lock_guard lock(mu_);
      auto it = holders_.find(*n);
      if (it == holders_.end()) return;
      tenant = std::move(it->second.tenant);
      holders_.erase(it);
      ++stats_.releases;
    }
    send_release(id, "release failed", &tenant);
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
  request.completion->complete(
      detail::end_request(stats_, reason, since(request.arrived, t), std::move(message), settings_));
}

void RedisLimiter::post_position(const RequestPtr& request, QueueStatus status) {
  boost::asio::post(context_->executor, [request, status] {
    if (request->ticket.pending()) request->on_queued(status);
  });
}

// --- heartbeat, restore ----------------------------------------------------

void RedisLimiter::start() {
  subscribe();
  heartbeat();
  schedule_heartbeat(context_->options.heartbeat_interval);
}

void RedisLimiter::subscribe() {
  context_->subscriber->exec({"SUBSCRIBE", wake_channel_},
                             [name = name_, self = std::weak_ptr<LimiterImpl>(weak_from_this())](
                                 boost::system::error_code ec, Reply r) {
                               // A failure here is repaired by the connect handler (re-SUBSCRIBE after
                               // the reconnect) and, meanwhile, by the heartbeat's held list.
                               if (ec && ec != make_error_code(Error::closed)) {
                                 log_error(name, "SUBSCRIBE failed", ec.message());
                               } else if (r.is_error()) {
                                 log_error(name, "SUBSCRIBE failed", r.str);
                               } else if (!ec) {
                                 if (auto s = self.lock())
                                   static_cast<RedisLimiter&>(*s).subscribed_.store(true);
                               }
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
        {
          std::lock_guard lock2(me.mu_);
          if (me.heartbeats_stopped_) return;
          if (me.shut_down_ && me.holders_.empty()) {
            me.heartbeats_stopped_ = true;  // nothing left to keep alive
            return;
          }
        }
        me.heartbeat();
        me.schedule_heartbeat(me.context_->options.heartbeat_interval);
      });
}

void RedisLimiter::stop_heartbeats_for_test() {
  std::lock_guard lock(mu_);
  heartbeats_stopped_ = true;
  if (heartbeat_timer_) heartbeat_timer_->cancel();
}

void RedisLimiter::heartbeat(std::function<void()> then) {
  std::uint64_t generation = 0;
  std::uint64_t count = 0;
  {
    std::lock_guard lock(mu_);
    // A periodic heartbeat is skipped while one is in flight; a heartbeat
    // someone waits for (`then`) is always sent.
    if (heartbeat_in_flight_ && !then) return;
    heartbeat_in_flight_ = true;
    generation = config_generation_;
    count = heartbeats_sent_++;
  }
  const auto& o = context_->options;
  const auto expiry = (count % kExpiryEvery == 0) ? o.key_expiry.count() : 0;
  call(scripts::kHeartbeat,
       {instance_, std::to_string(o.liveness_ttl.count()), std::to_string(expiry),
        std::to_string(defaults_.max_concurrent),
        defaults_.max_queue ? std::to_string(*defaults_.max_queue) : std::string(),
        defaults_.enabled ? "1" : "0", defaults_.when_disabled == DisabledMode::reject ? "reject" : "pass",
        std::to_string(defaults_.max_wait.count()), defaults_.tenant_fairness ? "1" : "0",
        defaults_.max_per_tenant ? std::to_string(*defaults_.max_per_tenant) : std::string()},
       [self = std::weak_ptr<LimiterImpl>(weak_from_this()), generation, then = std::move(then)](
           boost::system::error_code ec, Reply reply) {
         auto s = self.lock();
         if (!s) return;
         auto& me = static_cast<RedisLimiter&>(*s);
         {
           std::lock_guard lock(me.mu_);
           me.heartbeat_in_flight_ = false;
         }
         if (ec || !is_array(reply, 6)) {
           me.context_->redis_errors.fetch_add(1, std::memory_order_relaxed);
           log_error(me.name_, "heartbeat failed", ec ? ec.message() : reply.debug_string());
         } else {
           me.on_heartbeat_reply(reply, generation);
         }
         if (then) then();
       });
}

void RedisLimiter::on_heartbeat_reply(const Reply& reply, std::uint64_t generation) {
  heartbeats_.fetch_add(1, std::memory_order_relaxed);
  const bool lost = reply.elements[0].integer != 0;
  std::vector<std::pair<std::uint64_t, std::string>> grants;
  std::vector<std::string> orphans;
  std::vector<std::pair<RequestPtr, QueueStatus>> positions;
  {
    std::lock_guard lock(mu_);
    head_seq_ = reply.elements[2].integer;
    queued_ = static_cast<std::size_t>(std::max<std::int64_t>(0, reply.elements[3].integer));
    in_use_ = static_cast<std::size_t>(std::max<std::int64_t>(0, reply.elements[4].integer));
    // A configure sent after this heartbeat is newer than its cfg.
    if (generation == config_generation_) {
      const auto& cfg = reply.elements[5].elements;
      for (std::size_t i = 0; i + 1 < cfg.size(); i += 2) {
        const std::string& field = cfg[i].str;
        const std::string& value = cfg[i + 1].str;
        if (field == "max_concurrent") {
          if (auto v = parse_number<std::uint32_t>(value)) settings_.max_concurrent = *v;
        } else if (field == "max_queue") {
          if (value.empty())
            settings_.max_queue.reset();
          else if (auto v = parse_number<std::uint32_t>(value))
            settings_.max_queue = *v;
        } else if (field == "enabled") {
          settings_.enabled = value != "0";
        } else if (field == "when_disabled") {
          settings_.when_disabled = value == "reject" ? DisabledMode::reject : DisabledMode::pass_through;
        } else if (field == "max_wait_ms") {
          if (auto v = parse_number<std::int64_t>(value)) settings_.max_wait = milliseconds(*v);
        } else if (field == "tenant_fairness") {
          settings_.tenant_fairness = value == "1";
        } else if (field == "max_per_tenant") {
          if (value.empty())
            settings_.max_per_tenant.reset();
          else if (auto v = parse_number<std::uint32_t>(value))
            settings_.max_per_tenant = *v;
        }
      }
    }
    for (const auto& e : reply.elements[1].elements) {
      const auto n = parse_own(e.str);
      if (!n) continue;
      if (requests_.count(*n))
        grants.emplace_back(*n, e.str);
      else if (!holders_.count(*n))
        orphans.push_back(e.str);
    }
    // Positions: our waiters' distance from the head (an upper bound: waiters
    // that left ahead of us leave gaps in the sequence). Under tenant fairness
    // the sequence says nothing about the rotation: the position the acquire
    // reply gave stays (an estimate, see acquire.lua).
    for (auto& [n, request] : requests_) {
      if (settings_.tenant_fairness) break;
      if (!request->on_queued || request->member.empty() || head_seq_ <= 0) continue;
      auto position = static_cast<std::size_t>(std::max<std::int64_t>(1, request->seq - head_seq_ + 1));
      position = std::min(position, std::max<std::size_t>(queued_, 1));
      if (position == request->told_position) continue;
      request->told_position = position;
      positions.emplace_back(
          request, QueueStatus{position, queued_, std::nullopt, static_cast<std::uint64_t>(request->seq)});
    }
  }
  for (auto& [request, status] : positions) post_position(request, status);
  for (const auto& [n, id] : grants) on_granted(n, id, /*from_heartbeat=*/true);
  for (const auto& id : orphans) {
    orphans_.fetch_add(1, std::memory_order_relaxed);
    send_release(id, "release of an orphan permit");
  }
  if (lost) send_restore();
}

void RedisLimiter::send_restore() {
  std::vector<std::string> args{instance_};
  {
    std::lock_guard lock(mu_);
    args.push_back(std::to_string(holders_.size()));
    for (const auto& [n, holder] : holders_) {
      std::string permit = permit_id(n);
      if (!holder.tenant.empty()) permit.append("|").append(holder.tenant);
      args.push_back(std::move(permit));
    }
    std::vector<std::pair<std::int64_t, std::string>> waiting;
    for (const auto& [n, request] : requests_) {
      if (!request->member.empty()) waiting.emplace_back(request->seq, request->member);
    }
    std::sort(waiting.begin(), waiting.end());
    for (auto& [seq, member] : waiting) args.push_back(std::move(member));
  }
  restores_.fetch_add(1, std::memory_order_relaxed);
  call(scripts::kRestore, std::move(args),
       [ctx = std::weak_ptr<BackendContext>(context_), name = name_](boost::system::error_code ec,
                                                                     Reply reply) {
         if (!ec && !reply.is_error()) return;
         if (auto c = ctx.lock()) c->redis_errors.fetch_add(1, std::memory_order_relaxed);
         // The next heartbeat reports lost again and retries.
         log_error(name, "restore failed", ec ? ec.message() : reply.str);
       });
}

// --- snapshot, settings, configure, shutdown -----------------------------

Snapshot RedisLimiter::snapshot() const {
  Snapshot s;
  s.name = name_;
  std::lock_guard lock(mu_);
  const auto t = Clock::now();
  s.settings = settings_;
  s.in_use = in_use_;
  s.queued = queued_;
  s.stats = stats_;
  std::vector<std::pair<Clock::time_point, HolderInfo>> holders;
  for (const auto& [n, h] : holders_)
    holders.emplace_back(h.granted, HolderInfo{permit_id(n), h.tenant, since(h.granted, t)});
  std::stable_sort(holders.begin(), holders.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [when, h] : holders) s.holders.push_back(std::move(h));
  std::vector<std::pair<std::int64_t, WaiterInfo>> waiters;
  for (const auto& [n, r] : requests_) {
    if (r->member.empty()) continue;
    const auto position =
        head_seq_ > 0 ? static_cast<std::size_t>(std::max<std::int64_t>(1, r->seq - head_seq_ + 1)) : 0;
    waiters.emplace_back(r->seq, WaiterInfo{permit_id(n), r->tenant, position, since(r->arrived, t)});
  }
  std::sort(waiters.begin(), waiters.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [seq, w] : waiters) s.waiters.push_back(std::move(w));
  return s;
}

Settings RedisLimiter::settings() const {
  std::lock_guard lock(mu_);
  return settings_;
}

boost::system::result<Settings, SettingsError> RedisLimiter::configure(const SettingsUpdate& update) {
  Settings next;
  {
    std::lock_guard lock(mu_);
    next = apply(settings_, update);
    if (auto error = validate(next)) return *error;
    settings_ = next;
    ++config_generation_;
  }
  // Only the fields that change, so two instances changing different fields
  // do not undo each other. early_reject is local to this instance.
  std::vector<std::string> args;
  if (update.max_concurrent) {
    args.insert(args.end(), {"max_concurrent", std::to_string(next.max_concurrent)});
  }
  if (update.max_queue) {
    args.insert(args.end(), {"max_queue", next.max_queue ? std::to_string(*next.max_queue) : std::string()});
  }
  if (update.enabled) args.insert(args.end(), {"enabled", next.enabled ? "1" : "0"});
  if (update.when_disabled) {
    args.insert(args.end(),
                {"when_disabled", next.when_disabled == DisabledMode::reject ? "reject" : "pass"});
  }
  if (update.max_wait) args.insert(args.end(), {"max_wait_ms", std::to_string(next.max_wait.count())});
  if (update.tenant_fairness) args.insert(args.end(), {"tenant_fairness", next.tenant_fairness ? "1" : "0"});
  if (update.max_per_tenant) {
    args.insert(args.end(), {"max_per_tenant",
                             next.max_per_tenant ? std::to_string(*next.max_per_tenant) : std::string()});
  }
  if (!args.empty()) {
    call(scripts::kConfigure, std::move(args),
         [ctx = std::weak_ptr<BackendContext>(context_), name = name_](boost::system::error_code ec,
                                                                       Reply reply) {
           if (!ec && !reply.is_error()) return;
           if (auto c = ctx.lock()) c->redis_errors.fetch_add(1, std::memory_order_relaxed);
           log_error(name, "configure failed", ec ? ec.message() : reply.str);
         });
  }
  return next;
}

void RedisLimiter::shutdown() {
  std::vector<std::string> members;
  {
    std::lock_guard lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    const auto t = Clock::now();
    auto waiting = std::move(requests_);
    requests_.clear();
    for (auto& [n, request] : waiting) {
      if (request->timer) request->timer->cancel();
      if (request->ticket.resume(core::TicketEvent::reject) != core::TicketAction::deliver) continue;
      deliver_ended(*request, RejectReason::shutdown, t);
      // No member yet: the acquire reply finds the ticket ended and cleans up.
      if (!request->member.empty()) members.push_back(request->member);
    }
  }
  for (const auto& m : members) send_cancel(m);
}

}  // namespace fairgate::redis
