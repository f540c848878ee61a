// http/sse.cpp — SSE framing and parsing (http/sse.hpp).
#include "http/sse.hpp"

namespace fairgate::http {

std::string sse_event(std::string_view name, std::string_view data) {
  std::string out;
  out.reserve(name.size() + data.size() + 16);
  if (!name.empty()) {
    out += "event: ";
    out += name;
    out += '\n';
  }
  for (;;) {
    const auto nl = data.find('\n');
    out += "data: ";
    out += data.substr(0, nl);
    out += '\n';
    if (nl == std::string_view::npos) break;
    data.remove_prefix(nl + 1);
  }
  out += '\n';
  return out;
}

std::string sse_comment(std::string_view text) {
  std::string out = ": ";
  out += text;
  out += "\n\n";
  return out;
}

boost::beast::http::response<boost::beast::http::empty_body> sse_header(const Request& req,
                                                                        std::string_view server) {
  boost::beast::http::response<boost::beast::http::empty_body> res{status::ok, req.version()};
  res.set(field::server, server);
  res.set(field::content_type, "text/event-stream");
  res.set(field::cache_control, "no-store");
  res.set("X-Accel-Buffering", "no");
  res.keep_alive(false);
  return res;
}

bool SseReader::parse_block(std::string_view block, SseEvent& event) {
  bool has_data = false;
  while (!block.empty()) {
    const auto nl = block.find('\n');
    const std::string_view line = block.substr(0, nl);
    block = nl == std::string_view::npos ? std::string_view() : block.substr(nl + 1);
    const auto colon = line.find(':');
    if (colon == 0) continue;  // a comment (": keepalive")
    const std::string_view name = line.substr(0, colon);
    std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    if (name == "event") {
      event.name = value;
    } else if (name == "data") {
      if (has_data) event.data += '\n';
      event.data += value;
      has_data = true;
    }
  }
  return has_data || !event.name.empty();
}

}  // namespace fairgate::http
