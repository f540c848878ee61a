// serve/routes.cpp — matching a request path against the route table.
#include "serve/routes.hpp"

namespace fairgate::serve {
namespace {

bool is_param(std::string_view seg) { return seg.size() > 2 && seg.front() == '{' && seg.back() == '}'; }

}  // namespace

const RouteSpec* match_route(const std::vector<std::string>& segments, std::vector<std::string>& params) {
  for (const RouteSpec& route : kRoutes) {
    params.clear();
    std::string_view rest = route.pattern.substr(1);  // patterns start with '/'
    std::size_t i = 0;
    bool ok = true;
    while (ok && !rest.empty()) {
      const auto slash = rest.find('/');
      const std::string_view seg = rest.substr(0, slash);
      rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
      if (i >= segments.size()) {
        ok = false;
      } else if (is_param(seg)) {
        params.push_back(segments[i]);
      } else if (segments[i] != seg) {
        ok = false;
      }
      ++i;
    }
    if (ok && i == segments.size()) return &route;
  }
  params.clear();
  return nullptr;
}

bool route_allows(const RouteSpec& route, std::string_view method) noexcept {
  std::string_view rest = route.methods;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    std::string_view m = rest.substr(0, comma);
    while (!m.empty() && m.front() == ' ') m.remove_prefix(1);
    if (m == method) return true;
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  return false;
}

}  // namespace fairgate::serve
