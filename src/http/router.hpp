// http/router.hpp — matching a decoded request path against route patterns
// ("/v1/limiters/{name}/acquire": literal segments and "{param}" segments,
// one path segment each). A route table is any range of specs that have a
// `pattern` member; the first match wins. Pure, no I/O.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fairgate::http {

/// Whether the path `segments` match `pattern`; the values of its "{param}"
/// segments are appended to `params`, in order (cleared when it does not match).
bool match_pattern(std::string_view pattern, const std::vector<std::string>& segments,
                   std::vector<std::string>& params);

/// The first spec of `table` whose pattern matches `segments`, with its
/// params; nullptr when none does.
template <class Table>
auto match_route(const Table& table, const std::vector<std::string>& segments,
                 std::vector<std::string>& params) -> decltype(&*std::begin(table)) {
  for (const auto& spec : table)
    if (match_pattern(spec.pattern, segments, params)) return &spec;
  return nullptr;
}

}  // namespace fairgate::http
