#include "core/limiter_state.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace fairgate::core {

namespace {
using std::chrono::duration_cast;
using std::chrono::milliseconds;
}  // namespace

bool would_time_out(milliseconds estimate, milliseconds max_wait) noexcept {
  return estimate > max_wait + std::max(kRejectEarlyMargin, max_wait / 4);
}

bool LimiterState::has_room() const noexcept {
  if (!settings_.enabled) return settings_.when_disabled == DisabledMode::pass_through;
  return holders_.size() < settings_.max_concurrent;
}

bool LimiterState::at_cap(const std::string& name, const Tenant& t) const noexcept {
  // A disabled limiter in pass-through mode limits nothing, per tenant neither.
  if (!settings_.enabled) return false;
  if (held_caps_) {
    const auto it = held_caps_->find(name);
    if (t.holders >= (it == held_caps_->end() ? 0 : it->second)) return true;
  }
  return settings_.max_per_tenant && t.holders >= *settings_.max_per_tenant;
}

void LimiterState::cap_tenants_at_their_holders() {
  held_caps_.emplace();
  for (const auto& [name, t] : tenants_) {
    if (t.holders > 0) held_caps_->emplace(name, t.holders);
  }
  rebuild_tenants();  // a tenant that waits and is at its cap now is parked
}

void LimiterState::grant(RequestId id, Time now, std::string tenant) {
  ++tenants_[tenant].holders;
  holders_.emplace(id, Holder{next_grant_seq_++, now, std::move(tenant)});
}

std::size_t round_robin_position(const std::vector<std::size_t>& lengths, std::size_t i, std::size_t k) {
  std::size_t position = 1;
  for (std::size_t u = 0; u < lengths.size(); ++u) {
    position += std::min(lengths[u], k - 1);
    if (u < i && lengths[u] >= k) ++position;
  }
  return position;
}

std::vector<std::pair<const std::string*, const LimiterState::Tenant*>> LimiterState::rotation() const {
  std::vector<std::pair<const std::string*, const Tenant*>> order;
  order.reserve(waiting_tenants_);
  for (const auto& [score, name] : ready_) order.emplace_back(&name, &tenants_.at(name));
  const auto ready = order.size();
  for (const auto& [name, t] : tenants_) {
    if (!t.queue.empty() && !t.ready_score) order.emplace_back(&name, &t);
  }
  std::sort(order.begin() + static_cast<std::ptrdiff_t>(ready), order.end(),
            [](const auto& a, const auto& b) {
              return a.second->queue.begin()->first < b.second->queue.begin()->first;
            });
  return order;
}

std::pair<std::vector<std::size_t>, std::size_t> LimiterState::rotation_lengths(
    const std::string& tenant) const {
  std::vector<std::size_t> lengths;
  std::optional<std::size_t> mine;
  for (const auto& [name, t] : rotation()) {
    if (*name == tenant) mine = lengths.size();
    lengths.push_back(t->queue.size());
  }
  if (!mine) {
    mine = lengths.size();
    lengths.push_back(0);
  }
  return {std::move(lengths), *mine};
}

std::unordered_map<RequestId, std::size_t> LimiterState::fair_positions() const {
  // round_robin_position() for every waiter at once: O(waiters + tenants).
  const auto order = rotation();
  std::size_t longest = 0;
  for (const auto& [name, t] : order) longest = std::max(longest, t->queue.size());
  // with[j]: tenants with at least j waiters; before[k] = sum over tenants of min(length, k - 1);
  // ahead[k]: tenants with at least k waiters ahead in the rotation (as the walk goes).
  std::vector<std::size_t> with(longest + 1, 0), before(longest + 1, 0), ahead(longest + 1, 0);
  for (const auto& [name, t] : order) {
    for (std::size_t j = 1; j <= t->queue.size(); ++j) ++with[j];
  }
  for (std::size_t k = 2; k <= longest; ++k) before[k] = before[k - 1] + with[k - 1];
  std::unordered_map<RequestId, std::size_t> positions;
  positions.reserve(queue_.size());
  for (const auto& [name, t] : order) {
    std::size_t k = 0;
    for (const auto& [seq, id] : t->queue) {
      ++k;
      positions.emplace(id, 1 + before[k] + ahead[k]);
    }
    for (std::size_t j = 1; j <= t->queue.size(); ++j) ++ahead[j];
  }
  return positions;
}

Admission LimiterState::admit(RequestId id, Time now, Time deadline, std::string tenant,
                              std::uint32_t weight) {
  Admission a;
  if (!settings_.enabled && settings_.when_disabled == DisabledMode::reject) {
    a.reason = RejectReason::disabled;
    return a;
  }
  auto t = tenants_.find(tenant);
  bool grant_now = false;
  if (settings_.tenant_aware()) {
    // I3': ready_ is empty unless there is no room, so an empty ready_ means
    // every waiter (if any) belongs to a parked tenant: a newcomer below its
    // own cap passes nobody who could be served.
    static const Tenant kNew;  // a tenant not seen yet: holds nothing
    grant_now = ready_.empty() && has_room() && !at_cap(tenant, t == tenants_.end() ? kNew : t->second);
  } else {
    grant_now = queue_.empty() && has_room();
  }
  if (grant_now) {
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
  std::size_t position = queue_.size() + 1;
  if (settings_.tenant_fairness) {
    // As position() will say once it is queued: last in its tenant's queue; a new tenant
    // joins the back of the rotation.
    auto [lengths, mine] = rotation_lengths(tenant);
    const std::size_t k = ++lengths[mine];
    position = round_robin_position(lengths, mine, k);
  }
  const auto estimate = pace_.estimate(position, now);
  if (settings_.reject_early && estimate && rejects_early(*estimate, deadline, now)) {
    a.reason = RejectReason::would_time_out;
    return a;
  }
  const std::uint64_t seq = next_seq_++;
  queue_.emplace(seq, id);
  deadlines_.emplace(deadline, id);
  if (t == tenants_.end()) t = tenants_.try_emplace(tenant).first;
  const bool first = t->second.queue.empty();
  t->second.queue.emplace(seq, id);
  if (first) {
    ++waiting_tenants_;
    if (settings_.tenant_aware()) place(t);
  }
  waiters_.emplace(id, Waiter{seq, now, deadline, std::move(tenant), weight});
  a.kind = Admission::Kind::queued;
  a.position = position;
  a.estimated_wait = estimate;
  return a;
}

bool LimiterState::rejects_early(milliseconds estimate, Time deadline, Time now) const {
  const auto max_wait = duration_cast<milliseconds>(deadline - now);
  if (!would_time_out(estimate, max_wait)) return false;
  // Under tenant fairness the turn order is not the queue order: the
  // position-based estimate decides. In one FIFO, the waiters ahead that will
  // time out before their turn free no seat but make way (docs/eta.md).
  if (settings_.tenant_fairness) return true;
  auto it = queue_.begin();
  const auto next = [&]() -> std::optional<double> {
    if (it == queue_.end()) return std::nullopt;
    const Time d = waiters_.at((it++)->second).deadline;
    return std::chrono::duration<double, std::milli>(d - now).count();
  };
  // No margin here: this estimate has no bias to absorb (docs/eta.md).
  const double limit = static_cast<double>(max_wait.count());
  const auto wait = wait_behind(seat_pace_.figures(now), next, limit);
  if (!wait) return true;  // no seat pace yet: the queue pace alone
  return *wait > limit;
}

void LimiterState::place(TenantMap::iterator t) {
  Tenant& ts = t->second;
  if (ts.queue.empty() || ts.ready_score) return;
  if (at_cap(t->first, ts)) {
    ts.parked = true;
    return;
  }
  ts.parked = false;
  ts.credit = 0;
  ts.ready_score = settings_.tenant_fairness ? next_turn_++ : ts.queue.begin()->first;
  ready_.emplace(*ts.ready_score, t->first);
}

void LimiterState::unplace(const std::string& name, Tenant& ts) {
  if (ts.ready_score) {
    ready_.erase({*ts.ready_score, name});
    ts.ready_score.reset();
  }
  ts.parked = false;
  ts.credit = 0;
}

void LimiterState::forget_if_idle(TenantMap::iterator t) {
  if (t->second.queue.empty() && t->second.holders == 0) tenants_.erase(t);
}

void LimiterState::remove_waiter(std::unordered_map<RequestId, Waiter>::iterator it) {
  const Waiter& w = it->second;
  queue_.erase(w.seq);
  deadlines_.erase({w.deadline, it->first});
  auto t = tenants_.find(w.tenant);
  Tenant& ts = t->second;
  const bool was_head = ts.queue.begin()->first == w.seq;
  ts.queue.erase(w.seq);
  if (ts.queue.empty()) {
    --waiting_tenants_;
    unplace(t->first, ts);
  } else if (was_head && ts.ready_score && !settings_.tenant_fairness) {
    // FIFO across tenants: a tenant is ordered by its oldest waiter.
    ready_.erase({*ts.ready_score, t->first});
    ts.ready_score = ts.queue.begin()->first;
    ready_.emplace(*ts.ready_score, t->first);
  }
  waiters_.erase(it);
  forget_if_idle(t);
}

void LimiterState::dispatch(Time now, DispatchSink& sink) {
  if (settings_.tenant_aware()) {
    dispatch_tenants(now, sink);
    return;
  }
  while (!queue_.empty() && has_room()) {
    const RequestId id = queue_.begin()->second;
    auto it = waiters_.find(id);
    Waiter w = it->second;
    remove_waiter(it);
    if (w.deadline <= now) {
      sink.drop(id, RejectReason::timeout);
      continue;
    }
    if (sink.try_grant(id)) grant(id, now, std::move(w.tenant));
  }
}

void LimiterState::dispatch_tenants(Time now, DispatchSink& sink) {
  while (!ready_.empty() && has_room()) {
    auto t = tenants_.find(ready_.begin()->second);
    if (at_cap(t->first, t->second)) {  // its cap was lowered: skip it until a permit returns
      unplace(t->first, t->second);
      t->second.parked = true;
      continue;
    }
    const RequestId id = t->second.queue.begin()->second;
    auto it = waiters_.find(id);
    Waiter w = it->second;
    // A turn starts with the weight of the waiter served first in it.
    const std::uint32_t credit = t->second.credit != 0 ? t->second.credit : w.weight;
    remove_waiter(it);  // may forget the tenant (t is not used below)
    if (w.deadline <= now) {
      sink.drop(id, RejectReason::timeout);
      continue;
    }
    if (!sink.try_grant(id)) continue;
    grant(id, now, w.tenant);
    Tenant& ts = tenants_.at(w.tenant);
    if (!ts.ready_score) continue;  // its queue is empty: it left the rotation
    if (at_cap(w.tenant, ts)) {
      unplace(w.tenant, ts);
      ts.parked = true;
      continue;
    }
    if (!settings_.tenant_fairness) continue;  // ordered by its head, already re-keyed
    if (credit <= 1) {
      // Turn over: to the back of the rotation.
      ready_.erase({*ts.ready_score, w.tenant});
      ts.ready_score = next_turn_++;
      ready_.emplace(*ts.ready_score, w.tenant);
      ts.credit = 0;
    } else {
      ts.credit = credit - 1;
    }
  }
}

void LimiterState::rebuild_tenants() {
  ready_.clear();
  std::vector<std::pair<std::uint64_t, TenantMap::iterator>> waiting;
  for (auto t = tenants_.begin(); t != tenants_.end(); ++t) {
    t->second.ready_score.reset();
    t->second.parked = false;
    t->second.credit = 0;
    if (!t->second.queue.empty()) waiting.emplace_back(t->second.queue.begin()->first, t);
  }
  if (!settings_.tenant_aware()) return;
  std::sort(waiting.begin(), waiting.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [seq, t] : waiting) place(t);
}

bool LimiterState::release(RequestId id, Time now, DispatchSink& sink) {
  auto h = holders_.find(id);
  if (h == holders_.end()) return false;
  auto t = tenants_.find(h->second.tenant);
  holders_.erase(h);
  --t->second.holders;
  if (t->second.parked && !at_cap(t->first, t->second)) {
    t->second.parked = false;
    place(t);  // back of the rotation
  }
  forget_if_idle(t);
  dispatch(now, sink);
  // A freed seat is what moves the queue: the pace, measured while full.
  pace_.on_release(now, settings_.enabled && holders_.size() >= settings_.max_concurrent);
  seat_pace_.on_release(now, settings_.enabled && holders_.size() >= settings_.max_concurrent);
  return true;
}

bool LimiterState::withdraw(RequestId id, std::optional<Time> now) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return false;
  remove_waiter(it);
  if (now) pace_.on_departure(*now);
  return true;
}

void LimiterState::expire(Time now, DispatchSink& sink) {
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const RequestId id = deadlines_.begin()->second;
    remove_waiter(waiters_.find(id));
    pace_.on_departure(now);
    sink.drop(id, RejectReason::timeout);
  }
}

void LimiterState::configure(Settings settings, Time now, DispatchSink& sink) {
  const bool retenant = settings.tenant_fairness != settings_.tenant_fairness ||
                        settings.max_per_tenant != settings_.max_per_tenant ||
                        settings.enabled != settings_.enabled;
  if (settings.max_concurrent != settings_.max_concurrent || settings.enabled != settings_.enabled) {
    pace_.interrupt();  // seats changed without a release: the running interval is no gap
    seat_pace_.interrupt();
  }
  settings_ = std::move(settings);
  // Waiters keep their sequence and their place in their tenant's queue; the
  // rotation restarts in order of each tenant's oldest waiter.
  if (retenant) rebuild_tenants();
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
  if (settings_.tenant_fairness) {
    const auto [lengths, mine] = rotation_lengths(it->second.tenant);
    const auto& q = tenants_.at(it->second.tenant).queue;
    return round_robin_position(
        lengths, mine, static_cast<std::size_t>(std::distance(q.begin(), q.find(it->second.seq))) + 1);
  }
  return static_cast<std::size_t>(std::distance(queue_.begin(), queue_.find(it->second.seq))) + 1;
}

std::size_t LimiterState::tenant_holders(const std::string& tenant) const {
  auto t = tenants_.find(tenant);
  return t == tenants_.end() ? 0 : t->second.holders;
}

std::size_t LimiterState::tenant_queued(const std::string& tenant) const {
  auto t = tenants_.find(tenant);
  return t == tenants_.end() ? 0 : t->second.queue.size();
}

bool LimiterState::tenant_parked(const std::string& tenant) const {
  auto t = tenants_.find(tenant);
  return t != tenants_.end() && t->second.parked;
}

}  // namespace fairgate::core
