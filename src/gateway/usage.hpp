// gateway/usage.hpp — what a token budget refunds from (docs/ratelimit.md,
// "Token budgets"): the tap on an upstream answer that reads its usage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <boost/json/object.hpp>

namespace fairgate::serve {

/// Watches an upstream answer for what a token budget refunds from
/// (docs/ratelimit.md, "Token budgets"): the `usage` the upstream reports
/// (a JSON answer's, or a stream's final chunk's), else the number of
/// streamed content chunks.
struct UsageTap {
  static constexpr std::size_t kMaxBody = 1024 * 1024;
  bool reached = false;  // the upstream answered (any status)
  unsigned status = 0;
  bool sse = false;
  std::string body;  // a JSON answer (bounded), or the unfinished SSE line
  std::optional<std::int64_t> usage_total;
  std::int64_t streamed = 0;  // content chunks seen

  /// The upstream answered `st` with `content_type`.
  void start(unsigned st, std::string_view content_type);
  /// Body bytes, as relayed.
  void feed(const char* data, std::size_t n);
  /// The answer ended (a JSON answer's usage is read here, once).
  void finish();

 private:
  bool too_long_ = false;       // a JSON answer over kMaxBody, or an SSE line or event over it: not read
  bool skip_lf_ = false;        // the last read ended with CR: an LF first in the next ends the same line
  bool has_data_ = false;       // the SSE event being read has a data field
  bool data_too_long_ = false;  // ... over kMaxBody: not read
  std::string data_;            // its data lines, joined with LF
  void line(std::string_view l);
  void event(std::string_view data);
  void read_usage(const boost::json::object& o);
};

}  // namespace fairgate::serve
