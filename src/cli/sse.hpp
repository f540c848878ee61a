// cli/sse.hpp — what the commands that read fairgate's event streams share
// (`fairgate demo` reads its users' answers, `fairgate top` reads /v1/events):
// the HTTP layer's SSE reader and JSON field access.
#pragma once

#include "http/sse.hpp"

#include <boost/json.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fairgate::cli {

/// The SSE reader of the HTTP layer (src/http/sse.hpp).
using fairgate::http::SseEvent;
using fairgate::http::SseReader;

/// `o[key]` as an integer, if it is a number that fits.
inline std::optional<std::int64_t> int_field(const boost::json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  if (v == nullptr || !v->is_number()) return std::nullopt;
  boost::system::error_code ec;
  const auto n = v->to_number<std::int64_t>(ec);
  if (ec) return std::nullopt;
  return n;
}

/// `o[key]` as a string; empty when absent or not a string.
inline std::string string_field(const boost::json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  return v != nullptr && v->is_string() ? std::string(v->as_string()) : std::string();
}

}  // namespace fairgate::cli
