// gateway/usage.cpp — UsageTap (gateway/usage.hpp).
#include "gateway/usage.hpp"

#include <fairgate/rate_rule.hpp>

#include <boost/json.hpp>

#include <algorithm>

namespace fairgate::serve {

namespace json = boost::json;

void UsageTap::start(unsigned st, std::string_view content_type) {
  reached = true;
  status = st;
  sse = content_type.find("text/event-stream") != std::string_view::npos;
}

void UsageTap::feed(const char* data, std::size_t n) {
  if (!sse) {
    // An answer over kMaxBody is not read at all (not the parts that fit).
    if (too_long_ || body.size() + n > kMaxBody) {
      too_long_ = true;
      body.clear();
    } else {
      body.append(data, n);
    }
    return;
  }
  // Server-sent events (the WHATWG HTML standard, "Event stream interpretation"): lines end with
  // CRLF, LF or CR alone; an event's data lines are joined with LF; a blank line ends the event.
  std::string_view in(data, n);
  if (in.empty()) return;
  if (skip_lf_ && in.front() == '\n') in.remove_prefix(1);
  skip_lf_ = false;
  for (;;) {
    const auto end = in.find_first_of("\r\n");
    const std::string_view part = in.substr(0, end);
    if (!too_long_ && body.size() + part.size() <= kMaxBody) {
      body.append(part);
    } else {
      too_long_ = true;  // a line this long is not a chunk we read
      body.clear();
    }
    if (end == std::string_view::npos) return;
    if (too_long_) {
      too_long_ = false;
    } else {
      line(body);
    }
    body.clear();
    if (in[end] == '\r') {
      if (end + 1 == in.size())
        skip_lf_ = true;
      else if (in[end + 1] == '\n')
        in.remove_prefix(1);
    }
    in.remove_prefix(end + 1);
  }
}

void UsageTap::finish() {
  if (sse) {
    // A stream that ends without the blank line after its last event still sent that event.
    if (!body.empty() && !too_long_) line(body);
    body.clear();
    line({});
    return;
  }
  if (body.empty()) return;
  boost::system::error_code ec;
  const json::value v = json::parse(body, ec);
  if (!ec && v.is_object()) read_usage(v.as_object());
  body.clear();  // read once
}

void UsageTap::line(std::string_view l) {
  if (l.empty()) {  // the end of an event
    if (has_data_ && !data_too_long_) event(data_);
    has_data_ = data_too_long_ = false;
    data_.clear();
    return;
  }
  if (l.substr(0, 5) != "data:" || data_too_long_) return;  // event:, id:, retry:, a comment
  l.remove_prefix(5);
  if (!l.empty() && l.front() == ' ') l.remove_prefix(1);
  if (has_data_) data_ += '\n';
  has_data_ = true;
  if (data_.size() + l.size() > kMaxBody) {
    data_too_long_ = true;  // an event this long is not one we read
    data_.clear();
    return;
  }
  data_.append(l);
}

void UsageTap::event(std::string_view data) {
  while (!data.empty() && data.front() == ' ') data.remove_prefix(1);
  if (data.empty() || data == "[DONE]") return;
  boost::system::error_code ec;
  const json::value v = json::parse(data, ec);
  if (ec || !v.is_object()) return;
  const auto& o = v.as_object();
  read_usage(o);
  if (const auto* choices = o.if_contains("choices"); choices && choices->is_array()) {
    for (const auto& c : choices->as_array()) {
      if (!c.is_object()) continue;
      const auto* delta = c.as_object().if_contains("delta");
      const json::value* text = nullptr;
      if (delta && delta->is_object()) text = delta->as_object().if_contains("content");
      if (!text) text = c.as_object().if_contains("text");
      if (text && text->is_string() && !text->as_string().empty()) ++streamed;
    }
  }
  // The Responses API: text comes in response.output_text.delta events, the usage in the
  // response of response.completed (and the other events that carry the whole response).
  if (const auto* type = o.if_contains("type"); type && type->is_string()) {
    if (type->as_string() == "response.output_text.delta") {
      if (const auto* d = o.if_contains("delta"); d && d->is_string() && !d->as_string().empty()) ++streamed;
    }
    if (const auto* r = o.if_contains("response"); r && r->is_object()) read_usage(r->as_object());
  }
}

void UsageTap::read_usage(const json::object& o) {
  const auto* u = o.if_contains("usage");
  if (!u || !u->is_object()) return;
  const auto& uo = u->as_object();
  // A count: a negative one is not believed (the refund is reservation − usage).
  if (const auto* t = uo.if_contains("total_tokens"); t && t->is_int64()) {
    if (t->as_int64() >= 0) usage_total = t->as_int64();
  } else if (t && t->is_uint64()) {
    usage_total = static_cast<std::int64_t>(std::min<std::uint64_t>(t->as_uint64(), kMaxCost));
  }
}

}  // namespace fairgate::serve
