// http/sse.hpp — server-sent events, both sides: framing an event or a
// comment (servers), the header that opens a stream, and a reader that cuts
// a byte stream into events (clients: `fairgate demo`, `fairgate top`).
// Pure, no I/O.
#pragma once

#include "http/message.hpp"

#include <boost/beast/http/empty_body.hpp>

#include <cstddef>
#include <string>
#include <string_view>

namespace fairgate::http {

/// "event: NAME\ndata: LINE\n…\n\n": each line of `data` on its own `data:`
/// line (an empty `name`: a plain message, no `event:` line).
std::string sse_event(std::string_view name, std::string_view data);

/// ": TEXT\n\n", a comment (keep-alives, progress a client may ignore).
std::string sse_comment(std::string_view text);

/// The header of an event stream answering `req`: 200, text/event-stream,
/// no caching, no proxy buffering; the body runs until the connection closes.
boost::beast::http::response<boost::beast::http::empty_body> sse_header(const Request& req,
                                                                        std::string_view server);

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

  /// Calls `on_event(const SseEvent&)` for each event `bytes` completes.
  template <class OnEvent>
  void feed(std::string_view bytes, OnEvent&& on_event) {
    if (overflowed_) return;
    for (char ch : bytes)
      if (ch != '\r') pending_ += ch;
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
      const bool complete = parse_block(std::string_view(pending_.data(), end), event);
      pending_.erase(0, end + 2);
      if (complete) on_event(event);
    }
  }

 private:
  /// Fills `event` from one blank-line-terminated block; false when it holds
  /// neither a name nor data (only comments).
  static bool parse_block(std::string_view block, SseEvent& event);

  std::size_t max_event_bytes_;
  bool overflowed_ = false;
  std::string pending_;
};

}  // namespace fairgate::http
