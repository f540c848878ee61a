#include "core/limiter_state.hpp"

#include <algorithm>
#include <cmath>

namespace fairgate::core {

namespace {
using std::chrono::duration_cast;
using std::chrono::milliseconds;
}  // namespace

void GrantRate::record(Time t) noexcept {
  times_[count_ % kWindow] = t;
  ++count_;
}

std::optional<milliseconds> GrantRate::estimate(std::size_t position, Time now) const noexcept {
  const std::size_t n = std::min(count_, kWindow);
  if (n < 2) return std::nullopt;
  const Time oldest = times_[(count_ - n) % kWindow];
  // Rate over [oldest grant, now]: the time since the last grant counts too,
  // so a limiter whose holders all run long is not thought to be fast.
  const double span_ms = std::chrono::duration<double, std::milli>(now - oldest).count();
  if (span_ms <= 0.0) return std::nullopt;
  const double per_grant_ms = span_ms / static_cast<double>(n);
  return milliseconds(static_cast<std::int64_t>(std::ceil(per_grant_ms * static_cast<double>(position))));
}

bool LimiterState::has_room() const noexcept {
  if (!settings_.enabled) return settings_.when_disabled == DisabledMode::pass_through;
  return holders_.size() < settings_.max_concurrent;
}

void LimiterState::grant(RequestId id, Time now, std::string tenant) {
  holders_.emplace(id, Holder{next_grant_seq_++, now, std::move(tenant)});
}

Admission LimiterState::admit(RequestId id, Time now, Time deadline, std::string tenant) {
  Admission a;
  if (!settings_.enabled && settings_.when_disabled == DisabledMode::reject) {
    a.reason = RejectReason::disabled;
    return a;
  }
  if (queue_.empty() && has_room()) {
    grant(id, now, std::move(tenant));
    a.kind = Admission::Kind::granted;
    return a;
  }
  if (deadline <= now) {
    a.reason = RejectReason::timeout;
    return a;
  }
  if (settings_.max_queue && queue_.size() >= *settings_.max_queue) {
    a.reason = RejectReason::queue_full;
    return a;
  }
  const std::size_t position = queue_.size() + 1;
  const auto estimate = rate_.estimate(position, now);
  if (settings_.early_reject && estimate && now + *estimate > deadline) {
    a.reason = RejectReason::timeout;
    return a;
  }
  const std::uint64_t seq = next_seq_++;
  queue_.emplace(seq, id);
  deadlines_.emplace(deadline, id);
  waiters_.emplace(id, Waiter{seq, now, deadline, std::move(tenant)});
  a.kind = Admission::Kind::queued;
  a.position = position;
  a.estimated_wait = estimate;
  return a;
}

void LimiterState::remove_waiter(std::unordered_map<RequestId, Waiter>::iterator it) {
  queue_.erase(it->second.seq);
  deadlines_.erase({it->second.deadline, it->first});
  waiters_.erase(it);
}

void LimiterState::dispatch(Time now, DispatchSink& sink) {
  while (!queue_.empty() && has_room()) {
    const RequestId id = queue_.begin()->second;
    auto it = waiters_.find(id);
    Waiter w = std::move(it->second);
    remove_waiter(it);
    if (w.deadline <= now) {
      sink.drop(id, RejectReason::timeout);
      continue;
    }
    if (sink.try_grant(id)) grant(id, now, std::move(w.tenant));
  }
}

bool LimiterState::release(RequestId id, Time now, DispatchSink& sink) {
  if (holders_.erase(id) == 0) return false;
  rate_.record(now);  // a freed seat is what moves the queue: the service rate
  dispatch(now, sink);
  return true;
}

bool LimiterState::withdraw(RequestId id) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return false;
  remove_waiter(it);
  return true;
}

void LimiterState::expire(Time now, DispatchSink& sink) {
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const RequestId id = deadlines_.begin()->second;
    remove_waiter(waiters_.find(id));
    sink.drop(id, RejectReason::timeout);
  }
}

void LimiterState::configure(Settings settings, Time now, DispatchSink& sink) {
  settings_ = std::move(settings);
  if (!settings_.enabled && settings_.when_disabled == DisabledMode::reject) {
    drop_all(RejectReason::disabled, sink);
    return;
  }
  // A smaller max_queue applies to new arrivals; those queued keep their place.
  dispatch(now, sink);
}

void LimiterState::drop_all(RejectReason reason, DispatchSink& sink) {
  while (!queue_.empty()) {
    const RequestId id = queue_.begin()->second;
    remove_waiter(waiters_.find(id));
    sink.drop(id, reason);
  }
}

std::optional<Time> LimiterState::next_deadline() const {
  if (deadlines_.empty()) return std::nullopt;
  return deadlines_.begin()->first;
}

const LimiterState::Waiter* LimiterState::waiter(RequestId id) const {
  auto it = waiters_.find(id);
  return it == waiters_.end() ? nullptr : &it->second;
}

const LimiterState::Holder* LimiterState::holder(RequestId id) const {
  auto it = holders_.find(id);
  return it == holders_.end() ? nullptr : &it->second;
}

std::optional<std::size_t> LimiterState::position(RequestId id) const {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return std::nullopt;
  return static_cast<std::size_t>(std::distance(queue_.begin(), queue_.find(it->second.seq))) + 1;
}

}  // namespace fairgate::core
