// cli/sse.hpp — the client side of server-sent events and JSON field
// access, shared by the commands that read fairgate's event streams
// (`fairgate demo` reads its users' answers, `fairgate top` reads /v1/events).
#pragma once

#include <boost/json.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fairgate::cli {

/// One server-sent event: its `event:` name (empty: a plain message) and its `data:` lines.
struct SseEvent {
  std::string name;
  std::string data;
};

/// Cuts a byte stream into SSE events (blank-line separated; comments dropped).
class SseReader {
 public:
  /// An event longer than `max_event_bytes` is an error (see overflowed()).
  explicit SseReader(std::size_t max_event_bytes = 4 * 1024 * 1024) : max_event_bytes_(max_event_bytes) {}

  /// True once an event grew past the limit: the stream is not one to trust.
  bool overflowed() const { return overflowed_; }

  template <class OnEvent>
  void feed(std::string_view bytes, OnEvent&& on_event) {
    if (overflowed_) return;
    for (char ch : bytes) {
      if (ch != '\r') pending_ += ch;
    }
    for (;;) {
      const auto end = pending_.find("\n\n");
      if (end == std::string::npos) {
        if (pending_.size() > max_event_bytes_) {
          overflowed_ = true;
          pending_.clear();
        }
        return;
      }
      SseEvent event;
      bool has_data = false;
      std::string_view block(pending_.data(), end);
      while (!block.empty()) {
        const auto nl = block.find('\n');
        const std::string_view line = block.substr(0, nl);
        block = nl == std::string_view::npos ? std::string_view() : block.substr(nl + 1);
        const auto colon = line.find(':');
        if (colon == 0) continue;  // a comment (": keepalive")
        const std::string_view field = line.substr(0, colon);
        std::string_view value =
            colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
        if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
        if (field == "event") {
          event.name = value;
        } else if (field == "data") {
          if (has_data) event.data += '\n';
          event.data += value;
          has_data = true;
        }
      }
      pending_.erase(0, end + 2);
      if (has_data || !event.name.empty()) on_event(event);
    }
  }

 private:
  std::size_t max_event_bytes_;
  bool overflowed_ = false;
  std::string pending_;
};

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
