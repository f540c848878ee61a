// serve/views.hpp — the JSON shapes of docs/api.md ("status and admin", the
// acquire events), built from library values. No I/O.
#pragma once

#include <fairgate/limiter.hpp>

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <string>
#include <string_view>

namespace fairgate::serve {

/// One entry of GET /v1/limiters; with `detail`, plus `holders` and `queue`
/// (as listed in `snapshot`, each entry with its instance).
boost::json::object limiter_json(const Snapshot& snapshot, std::string_view backend, bool detail);

/// GET /v1/limiters/{name}: limiter_json of the status (every instance's
/// holders and queue on Redis, one page of each) plus `offset`, `limit`,
/// `holders_total`, `queue_total` and, on Redis, `instances`.
boost::json::object limiter_status_json(const StatusResult& status, std::string_view backend);

/// The wire name of a rejection: timeout | queue_full | disabled | unavailable
/// (shutdown reads as unavailable) | invalid_argument | cancelled.
std::string_view wire_reason(RejectReason reason) noexcept;

/// {"error":{"reason":…,"message":…}}
boost::json::value error_json(std::string_view reason, std::string_view message);

/// One SSE event: "event: NAME\ndata: JSON\n\n".
std::string sse_event(std::string_view name, const boost::json::value& data);

}  // namespace fairgate::serve
