// http/router.cpp — route pattern matching (http/router.hpp).
#include "http/router.hpp"

namespace fairgate::http {
namespace {

bool is_param(std::string_view seg) { return seg.size() > 2 && seg.front() == '{' && seg.back() == '}'; }

}  // namespace

bool match_pattern(std::string_view pattern, const std::vector<std::string>& segments,
                   std::vector<std::string>& params) {
  params.clear();
  std::string_view rest = pattern.empty() ? pattern : pattern.substr(1);  // patterns start with '/'
  std::size_t i = 0;
  while (!rest.empty()) {
    const auto slash = rest.find('/');
    const std::string_view seg = rest.substr(0, slash);
    rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
    if (i >= segments.size() || (!is_param(seg) && segments[i] != seg)) {
      params.clear();
      return false;
    }
    if (is_param(seg)) params.push_back(segments[i]);
    ++i;
  }
  if (i == segments.size()) return true;
  params.clear();
  return false;
}

}  // namespace fairgate::http
