// serve/views.cpp — the JSON shapes of docs/api.md (see views.hpp); the key
// order is part of the output.
#include "serve/views.hpp"

#include "core/settings_table.hpp"
#include "http/sse.hpp"

#include <boost/json/array.hpp>
#include <boost/json/serialize.hpp>

namespace fairgate::serve {

namespace json = boost::json;

namespace {

/// One setting under its key, its value as the settings table reads it:
/// a number, null (unset), true/false, or a name.
void put(json::object& o, const core::SettingSpec& spec, const Settings& settings) {
  const core::SettingValue v = spec.get(settings);
  json::value& out = o[spec.key];
  if (!v) {
    out = nullptr;
    return;
  }
  switch (spec.kind) {
    case core::SettingKind::count:
    case core::SettingKind::optional_count:
    case core::SettingKind::duration_ms: out = *v; break;
    case core::SettingKind::flag: out = *v != 0; break;
    case core::SettingKind::choice: out = json::string(std::string_view(core::format_value(spec, v))); break;
  }
}

/// Redis recovery (docs/design.md): where the settings in force came from, and
/// whether grants are held back or served by the on_redis_down policy.
void add_recovery(json::object& o, const Snapshot& s) {
  o["settings_source"] = s.engine.settings_source;
  put(o, core::setting("on_redis_down"), s.settings);
  put(o, core::setting("local_share"), s.settings);
  if (s.engine.degraded && s.settings.on_redis_down == RedisDownPolicy::local)
    o["local_cap"] = s.engine.local_cap;
  o["fence_left_ms"] = s.engine.fence_left.count();
}

/// Shadow mode (docs/shadow.md): what was let through, and what enforcing
/// would have done with it.
json::object shadow_json(const ShadowStatus& sh) {
  json::object o;
  o["passed"] = sh.passed;
  o["in_flight"] = sh.in_flight;
  o["would_grant"] = sh.would_grant;
  o["would_queue"] = sh.would_queue;
  o["would_wait"] = sh.waiting;
  o["would_timeout"] = sh.would_end_by_reason[static_cast<std::size_t>(RejectReason::timeout)];
  o["would_reject"] =
      sh.would_end() - sh.would_end_by_reason[static_cast<std::size_t>(RejectReason::timeout)];
  json::object by_reason;
  for (std::size_t i = 0; i < sh.would_end_by_reason.size(); ++i) {
    if (sh.would_end_by_reason[i] == 0) continue;
    by_reason[std::string(to_string(static_cast<RejectReason>(i)))] = sh.would_end_by_reason[i];
  }
  o["would_end_by_reason"] = std::move(by_reason);
  o["would_wait_ms_mean"] =
      sh.would_grant ? static_cast<double>(sh.would_wait_ms_sum) / static_cast<double>(sh.would_grant) : 0.0;
  o["would_wait_ms_max"] = sh.would_wait_max.count();
  return o;
}

json::object stats_json(const LimiterStats& st) {
  json::object stats;
  stats["acquires"] = st.acquires;
  stats["grants"] = st.grants;
  stats["timeouts"] = st.timeouts;
  stats["cancels"] = st.cancels;
  stats["rejections"] = st.rejections;
  stats["releases"] = st.releases;
  return stats;
}

/// Who holds the permits, and who waits in what order (detail views).
void add_holders_and_queue(json::object& o, const Snapshot& s) {
  json::array holders;
  for (const auto& h : s.holders) {
    json::object e;
    e["permit"] = h.permit;
    e["tenant"] = h.tenant;
    e["held_ms"] = h.held.count();
    e["instance"] = h.instance;
    holders.push_back(std::move(e));
  }
  json::array queue;
  for (const auto& w : s.waiters) {
    json::object e;
    e["ticket"] = w.ticket;
    e["tenant"] = w.tenant;
    e["position"] = w.position;
    e["waited_ms"] = w.waited.count();
    e["instance"] = w.instance;
    queue.push_back(std::move(e));
  }
  o["holders"] = std::move(holders);
  o["queue"] = std::move(queue);
}

}  // namespace

json::object limiter_json(const Snapshot& s, std::string_view backend, bool detail) {
  json::object o;
  o["name"] = s.name;
  put(o, core::setting("max_concurrent"), s.settings);
  o["in_use"] = s.in_use;
  o["queued"] = s.queued;
  put(o, core::setting("max_wait"), s.settings);
  put(o, core::setting("max_queue"), s.settings);
  put(o, core::setting("enabled"), s.settings);
  put(o, core::setting("when_disabled"), s.settings);
  o["backend"] = backend;
  o["degraded"] = s.engine.degraded;
  put(o, core::setting("reject_early"), s.settings);
  put(o, core::setting("tenant_fairness"), s.settings);
  put(o, core::setting("max_per_tenant"), s.settings);
  if (s.estimated_wait)
    o["estimated_wait_ms"] = s.estimated_wait->count();
  else
    o["estimated_wait_ms"] = nullptr;
  if (backend == "redis") add_recovery(o, s);
  put(o, core::setting("mode"), s.settings);
  if (s.settings.mode == LimiterMode::shadow || s.shadow.passed > 0) o["shadow"] = shadow_json(s.shadow);
  o["stats"] = stats_json(s.stats);
  if (detail) add_holders_and_queue(o, s);
  return o;
}

json::object limiter_status_json(const StatusResult& status, std::string_view backend) {
  json::object o = limiter_json(status.snapshot, backend, true);
  o["offset"] = status.offset;
  o["limit"] = status.limit;
  o["holders_total"] = status.snapshot.in_use;
  o["queue_total"] = status.snapshot.queued;
  if (backend == "redis") {
    json::array instances;
    for (const auto& id : status.instances) instances.push_back(json::string(id));
    o["instances"] = std::move(instances);
  }
  return o;
}

std::string_view wire_reason(RejectReason reason) noexcept {
  return reason == RejectReason::shutdown ? std::string_view("unavailable") : to_string(reason);
}

json::value error_json(std::string_view reason, std::string_view message) {
  json::object inner;
  inner["reason"] = reason;
  inner["message"] = message;
  json::object o;
  o["error"] = std::move(inner);
  return o;
}

std::string sse_event(std::string_view name, const json::value& data) {
  return fairgate::http::sse_event(name, json::serialize(data));
}

}  // namespace fairgate::serve
