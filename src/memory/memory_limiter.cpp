#include "memory/memory_limiter.hpp"

#include "api/outcome.hpp"

#include "core/acquire_rules.hpp"
#include "core/number.hpp"

#include <boost/asio/post.hpp>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace fairgate::memory {

namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

core::Time now() { return std::chrono::steady_clock::now(); }

milliseconds since(core::Time start, core::Time t) {
  return t > start ? duration_cast<milliseconds>(t - start) : milliseconds(0);
}

}  // namespace

MemoryLimiter::MemoryLimiter(std::string name, Settings settings, boost::asio::any_io_executor executor)
    : name_(std::move(name)),
      executor_(std::move(executor)),
      state_(std::move(settings)),
      deadline_timer_(std::in_place, executor_),
      positions_timer_(std::in_place, executor_) {}

MemoryLimiter::~MemoryLimiter() = default;

void MemoryLimiter::start_acquire(AcquireOptions options, std::unique_ptr<detail::Completion> completion,
                                  boost::asio::cancellation_slot slot) {
  const core::Time t = now();
  auto request = std::make_shared<Request>();
  request->completion = std::move(completion);
  request->on_queued = std::move(options.on_queued);
  request->arrived = t;

  std::lock_guard lock(mu_);
  ++stats_.acquires;
  if (shut_down_) {
    request->ticket.resume(core::TicketEvent::reject);
    deliver_ended(*request, RejectReason::shutdown, t);
    return;
  }
  const auto checked =
      core::effective_max_wait(options.max_wait, state_.settings(), options.tenant, options.weight);
  if (!checked) {
    request->ticket.resume(core::TicketEvent::reject);
    deliver_ended(
        *request, RejectReason::invalid_argument, t,
        core::acquire_options_problem(options.max_wait, state_.settings(), options.tenant, options.weight));
    return;
  }
  const milliseconds max_wait = *checked;
  request->max_wait = max_wait;
  request->id = next_id_++;
  const core::Admission admission =
      state_.admit(request->id, t, t + max_wait, std::move(options.tenant), options.weight);
  switch (admission.kind) {
    case core::Admission::Kind::granted:
      request->ticket.resume(core::TicketEvent::grant);
      deliver_granted(*request, t);
      return;
    case core::Admission::Kind::rejected:
      request->ticket.resume(admission.reason == RejectReason::timeout ? core::TicketEvent::timeout
                                                                       : core::TicketEvent::reject);
      if (admission.reason == RejectReason::timeout) {
        // Decided at arrival: it may not wait at all.
        deliver_ended(*request, admission.reason, t, "no permit free and max_wait is 0 ms");
      } else if (admission.reason == RejectReason::would_time_out) {
        // Early rejection (F7): the estimate already exceeds its max wait by the margin.
        const auto estimate = state_.estimated_wait(state_.queued() + 1, t);
        deliver_ended(*request, admission.reason, t,
                      "estimated wait " + std::to_string(estimate ? estimate->count() : 0) +
                          " ms exceeds max_wait of " + std::to_string(max_wait.count()) + " ms");
      } else {
        deliver_ended(*request, admission.reason, t);
      }
      return;
    case core::Admission::Kind::queued: break;
  }
  waiting_.emplace(request->id, request);
  if (request->on_queued) ++listeners_;
  if (slot.is_connected()) {
    slot.assign([weak = std::weak_ptr<Request>(request),
                 self = std::weak_ptr<LimiterImpl>(weak_from_this())](boost::asio::cancellation_type) {
      auto r = weak.lock();
      auto s = self.lock();
      if (r && s) static_cast<MemoryLimiter&>(*s).cancel(r);
    });
  }
  arm_deadline_timer_locked();
  if (request->on_queued) schedule_positions_locked(/*urgent=*/true);
}

void MemoryLimiter::release(const std::string& id) noexcept {
  const auto parsed = core::parse_number<core::RequestId>(id);
  if (!parsed) return;
  const core::RequestId rid = *parsed;
  std::lock_guard lock(mu_);
  const std::size_t queued_before = state_.queued();
  op_now_ = now();
  if (!state_.release(rid, op_now_, *this)) return;
  ++stats_.releases;
  if (state_.queued() != queued_before) schedule_positions_locked(false);
  disarm_deadline_timer_if_idle_locked();
}

MemoryLimiter::RequestPtr MemoryLimiter::take_waiting(core::RequestId id) {
  auto it = waiting_.find(id);
  if (it == waiting_.end()) return nullptr;
  RequestPtr request = std::move(it->second);
  waiting_.erase(it);
  if (request->on_queued) --listeners_;
  return request;
}

bool MemoryLimiter::try_grant(core::RequestId id) {
  RequestPtr request = take_waiting(id);
  if (!request) return false;
  // A ticket that already ended (its cancel is on the way to mu_) gets
  // return_permit: we simply do not make the permit.
  if (request->ticket.resume(core::TicketEvent::grant) != core::TicketAction::deliver) return false;
  deliver_granted(*request, op_now_);
  return true;
}

void MemoryLimiter::drop(core::RequestId id, RejectReason reason) {
  RequestPtr request = take_waiting(id);
  if (!request) return;
  const auto event = reason == RejectReason::timeout ? core::TicketEvent::timeout : core::TicketEvent::reject;
  if (request->ticket.resume(event) == core::TicketAction::deliver) deliver_ended(*request, reason, op_now_);
}

void MemoryLimiter::deliver_granted(Request& request, core::Time t) {
  ++stats_.grants;
  Permit permit(shared_from_this(), std::to_string(request.id), since(request.arrived, t));
  request.completion->complete(AcquireResult::granted(std::move(permit)));
}

void MemoryLimiter::deliver_ended(Request& request, RejectReason reason, core::Time t, std::string message) {
  request.completion->complete(detail::end_request(stats_, reason, since(request.arrived, t),
                                                   request.max_wait, std::move(message), state_.settings()));
}

void MemoryLimiter::cancel(const RequestPtr& request) {
  if (request->ticket.resume(core::TicketEvent::cancel) != core::TicketAction::deliver) return;
  std::lock_guard lock(mu_);
  state_.withdraw(request->id, now());
  take_waiting(request->id);
  deliver_ended(*request, RejectReason::cancelled, now());
  schedule_positions_locked(false);
  disarm_deadline_timer_if_idle_locked();
}

void MemoryLimiter::disarm_deadline_timer_if_idle_locked() {
  if (!deadline_timer_ || !deadline_armed_for_ || state_.queued() > 0) return;
  deadline_armed_for_.reset();
  deadline_timer_->cancel();
}

void MemoryLimiter::arm_deadline_timer_locked() {
  const auto next = state_.next_deadline();
  // An armed timer that fires with nothing to expire is harmless, so only
  // re-arm when the earliest deadline moved earlier.
  if (!deadline_timer_ || !next || (deadline_armed_for_ && *deadline_armed_for_ <= *next)) return;
  deadline_armed_for_ = next;
  deadline_timer_->expires_at(*next);
  deadline_timer_->async_wait(
      [self = std::weak_ptr<LimiterImpl>(weak_from_this())](boost::system::error_code ec) {
        if (ec == boost::asio::error::operation_aborted) return;
        if (auto s = self.lock()) static_cast<MemoryLimiter&>(*s).on_deadline_timer();
      });
}

void MemoryLimiter::on_deadline_timer() {
  std::lock_guard lock(mu_);
  deadline_armed_for_.reset();
  const std::size_t queued_before = state_.queued();
  op_now_ = now();
  state_.expire(op_now_, *this);
  arm_deadline_timer_locked();
  if (state_.queued() != queued_before) schedule_positions_locked(false);
}

void MemoryLimiter::schedule_positions_locked(bool urgent) {
  if (listeners_ == 0 || !positions_timer_) return;
  positions_urgent_ = positions_urgent_ || urgent;
  if (positions_scheduled_) {
    positions_dirty_ = true;
    return;
  }
  positions_scheduled_ = true;
  positions_dirty_ = false;
  const core::Time at = positions_urgent_ ? now() : last_positions_ + kPositionInterval;
  positions_timer_->expires_at(at);
  positions_timer_->async_wait(
      [self = std::weak_ptr<LimiterImpl>(weak_from_this())](boost::system::error_code) {
        if (auto s = self.lock()) static_cast<MemoryLimiter&>(*s).run_positions();
      });
}

void MemoryLimiter::run_positions() {
  std::vector<std::pair<RequestPtr, QueueStatus>> updates;
  {
    std::lock_guard lock(mu_);
    const core::Time t = now();
    last_positions_ = t;
    positions_urgent_ = false;
    positions_dirty_ = false;
    const std::size_t queued = state_.queued();
    state_.for_each_waiter(
        [&](core::RequestId id, std::size_t position, const core::LimiterState::Waiter& w) {
          auto it = waiting_.find(id);
          if (it == waiting_.end() || !it->second->on_queued || it->second->told_position == position) return;
          it->second->told_position = position;
          updates.emplace_back(it->second, QueueStatus{position, queued, state_.estimated_wait(position, t),
                                                       w.seq, std::to_string(id)});
        });
  }
  // Outside the lock: callbacks may call back into the limiter.
  for (auto& [request, status] : updates) {
    if (request->ticket.pending()) request->on_queued(status);
  }
  std::lock_guard lock(mu_);
  positions_scheduled_ = false;
  if (positions_dirty_ || positions_urgent_) schedule_positions_locked(false);
}

Snapshot MemoryLimiter::snapshot() const {
  Snapshot s;
  s.name = name_;
  std::lock_guard lock(mu_);
  const core::Time t = now();
  s.settings = state_.settings();
  s.in_use = state_.in_use();
  s.queued = state_.queued();
  s.stats = stats_;
  std::vector<std::pair<std::uint64_t, HolderInfo>> holders;
  state_.for_each_holder([&](core::RequestId id, const core::LimiterState::Holder& h) {
    holders.emplace_back(h.grant_seq, HolderInfo{std::to_string(id), h.tenant, since(h.granted, t)});
  });
  std::sort(holders.begin(), holders.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  s.holders.reserve(holders.size());
  for (auto& [seq, h] : holders) s.holders.push_back(std::move(h));
  s.waiters.reserve(s.queued);
  state_.for_each_waiter([&](core::RequestId id, std::size_t position, const core::LimiterState::Waiter& w) {
    s.waiters.push_back(WaiterInfo{std::to_string(id), w.tenant, position, since(w.enqueued, t)});
  });
  // A new arrival: served at once when nobody waits and a seat is free.
  s.estimated_wait = s.queued == 0 && s.in_use < s.settings.max_concurrent
                         ? std::optional<milliseconds>(0)
                         : state_.estimated_wait(s.queued + 1, t);
  return s;
}

Settings MemoryLimiter::settings() const {
  std::lock_guard lock(mu_);
  return state_.settings();
}

bool MemoryLimiter::shut_down() const noexcept {
  std::lock_guard lock(mu_);
  return shut_down_;
}

boost::system::result<Settings, SettingsError> MemoryLimiter::configure(const SettingsUpdate& update) {
  std::lock_guard lock(mu_);
  Settings next = apply(state_.settings(), update);
  if (auto error = validate(next)) return *error;
  const std::size_t queued_before = state_.queued();
  op_now_ = now();
  settings_changed(state_.settings(), next);
  state_.configure(next, op_now_, *this);
  if (state_.queued() != queued_before) schedule_positions_locked(false);
  disarm_deadline_timer_if_idle_locked();
  return next;
}

void MemoryLimiter::shutdown() {
  std::lock_guard lock(mu_);
  shut_down_ = true;
  op_now_ = now();
  state_.drop_all(RejectReason::shutdown, *this);
  deadline_timer_.reset();
  positions_timer_.reset();
  deadline_armed_for_.reset();
}

}  // namespace fairgate::memory
