// serve/routes.cpp — matching a request path against the route table (the
// HTTP layer's pattern matching, src/http/router.hpp).
#include "serve/routes.hpp"

#include "http/message.hpp"
#include "http/router.hpp"

namespace fairgate::serve {

const RouteSpec* match_route(const std::vector<std::string>& segments, std::vector<std::string>& params) {
  return fairgate::http::match_route(kRoutes, segments, params);
}

bool route_allows(const RouteSpec& route, std::string_view method) noexcept {
  return fairgate::http::method_listed(route.methods, method);
}

bool answers_head(const RouteSpec& route) noexcept {
  return route_allows(route, "GET") && route.id != RouteId::acquire;
}

}  // namespace fairgate::serve
