// gateway/upstream.hpp — the upstream call of a gateway request: the request
// as the upstream gets it, the connection (pooled or new), and the relay of
// the answer to the client.
#pragma once

#include "gateway/gateway.hpp"
#include "gateway/usage.hpp"
#include "serve/config.hpp"
#include "serve/session.hpp"

#include <chrono>
#include <string>

namespace fairgate::serve {

/// What one upstream call learned besides its result.
struct CallState {
  std::chrono::steady_clock::time_point arrived;  ///< when the client's request arrived (time to first token)
  bool client_gone = false;                       ///< the client went away (or could not be written to)
  /// The whole answer was written to the client: one that closes at once after it did not
  /// leave early, even if its close is seen before the call returns.
  bool delivered = false;
};

/// The upstream's request target: the client's, or with the route's prefix
/// replaced by the upstream URL's path when it has one.
std::string upstream_target(const RouteConfig& rc, const Request& req);

/// The request the upstream gets: the client's, without hop-by-hop headers,
/// with X-Forwarded-For and the upstream's Host, on a keep-alive connection.
http::request<http::string_body> upstream_request(const Session& s, const RouteConfig& rc,
                                                  const Request& req);

/// Calls the upstream and relays its answer; returns whether the client
/// connection may carry another request. `header_sent`: our own 200 and SSE
/// header went out while the request waited. `tap` (if any) sees the answer;
/// `extra` headers are added to a passed-through answer. Cancelled (the
/// client left), it ends with `cs.client_gone`, never as an upstream error.
net::awaitable<bool> call_upstream(Session& s, const Request& req, Gateway::Route& route, bool header_sent,
                                   UsageTap* tap, const http::fields* extra, CallState& cs);

}  // namespace fairgate::serve
