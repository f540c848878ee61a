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
  body.append(data, n);
  std::size_t start = 0;
  for (;;) {
    const auto nl = body.find('\n', start);
    if (nl == std::string::npos) break;
    line(std::string_view(body).substr(start, nl - start));
    start = nl + 1;
  }
  body.erase(0, start);
  if (body.size() > kMaxBody) body.clear();  // a line this long is not a chunk we read
}

void UsageTap::finish() {
  if (sse || body.empty()) return;
  boost::system::error_code ec;
  const json::value v = json::parse(body, ec);
  if (!ec && v.is_object()) read_usage(v.as_object());
  body.clear();  // read once
}

void UsageTap::line(std::string_view l) {
  if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
  if (l.substr(0, 5) != "data:") return;
  l.remove_prefix(5);
  while (!l.empty() && l.front() == ' ') l.remove_prefix(1);
  if (l.empty() || l == "[DONE]") return;
  boost::system::error_code ec;
  const json::value v = json::parse(l, ec);
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
