// serve/routes.hpp — the admission API's routes in one table: the dispatcher
// matches requests with it (server.cpp), a 405's Allow and a preflight's
// Access-Control-Allow-Methods come from it, and a test checks it against
// docs/openapi.yaml in both directions (tests/serve/serve_openapi_test.cpp).
// Adding a route means adding a row here (and documenting it). Pure, no I/O.
// Gateway routes ([[route]] in the config) are not in the table: their paths
// come from the config, and they pass every method to the upstream.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace fairgate::serve {

enum class RouteId {
  healthz,
  metrics,
  openapi_yaml,
  openapi_json,
  limiters,
  limiter,
  acquire,
  permit,
  renew,
  events,
  dashboard,
  ratelimits,
  ratelimit_rule,
  ratelimit_refund,
};

struct RouteSpec {
  RouteId id;
  /// "/v1/limiters/{name}/acquire": literal segments and "{param}" segments
  /// (one path segment each), as written in docs/openapi.yaml.
  std::string_view pattern;
  /// "GET, POST": the methods served, as sent in Allow.
  std::string_view methods;
};

inline constexpr std::array<RouteSpec, 14> kRoutes{{
    {RouteId::healthz, "/healthz", "GET"},
    {RouteId::metrics, "/metrics", "GET"},
    {RouteId::openapi_yaml, "/openapi.yaml", "GET"},
    {RouteId::openapi_json, "/openapi.json", "GET"},
    {RouteId::limiters, "/v1/limiters", "GET"},
    {RouteId::limiter, "/v1/limiters/{name}", "GET, PUT"},
    {RouteId::acquire, "/v1/limiters/{name}/acquire", "GET, POST"},
    {RouteId::permit, "/v1/permits/{permit}", "DELETE"},
    {RouteId::renew, "/v1/permits/{permit}/renew", "POST"},
    {RouteId::events, "/v1/events", "GET"},
    {RouteId::dashboard, "/dashboard", "GET"},
    {RouteId::ratelimits, "/v1/ratelimit", "GET"},
    {RouteId::ratelimit_rule, "/v1/ratelimit/{rule}", "GET, POST, PUT"},
    {RouteId::ratelimit_refund, "/v1/ratelimit/{rule}/refund", "POST"},
}};

/// The route whose pattern matches the decoded path `segments`, with the
/// values of its "{param}" segments in order; nullptr when none does.
const RouteSpec* match_route(const std::vector<std::string>& segments, std::vector<std::string>& params);

/// Whether `method` ("GET") is one of `route.methods`.
bool route_allows(const RouteSpec& route, std::string_view method) noexcept;

/// Whether HEAD is answered on `route` (RFC 9110, 9.3.2): every route with a GET but the
/// acquire, whose GET takes a permit. A 405's Allow lists it there too.
bool answers_head(const RouteSpec& route) noexcept;

}  // namespace fairgate::serve
