// http/message.cpp — building answers (http/message.hpp).
#include "http/message.hpp"

#include "core/text.hpp"

#include <boost/json/serialize.hpp>

namespace fairgate::http {

Response make_response(status s, const Request& req, std::string body, std::string_view type,
                       std::string_view server) {
  Response res{s, req.version()};
  res.set(field::server, server);
  res.set(field::content_type, type);
  res.set(field::cache_control, "no-store");
  res.keep_alive(req.keep_alive());
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

Response json_response(status s, const Request& req, const boost::json::value& v, std::string_view server) {
  // JSON is UTF-8: outside bytes echoed in a message (a path segment %ff) are replaced.
  return make_response(s, req, core::valid_utf8(boost::json::serialize(v)) + "\n", "application/json",
                       server);
}

std::string field_list(const Request& req, std::string_view name) {
  std::string out;
  const auto [first, last] = req.equal_range(name);
  for (auto it = first; it != last; ++it) {
    if (!out.empty()) out += ", ";
    out.append(it->value().data(), it->value().size());
  }
  return out;
}

std::vector<std::string_view> list_elements(std::string_view list) {
  std::vector<std::string_view> out;
  while (!list.empty()) {
    const auto comma = list.find(',');
    std::string_view element = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    while (!element.empty() && (element.front() == ' ' || element.front() == '\t')) element.remove_prefix(1);
    while (!element.empty() && (element.back() == ' ' || element.back() == '\t')) element.remove_suffix(1);
    if (!element.empty()) out.push_back(element);
  }
  return out;
}

bool method_listed(std::string_view methods, std::string_view method) noexcept {
  // Split by hand (no allocation: it runs on every request).
  std::string_view rest = methods;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    std::string_view m = rest.substr(0, comma);
    while (!m.empty() && m.front() == ' ') m.remove_prefix(1);
    if (m == method) return true;
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  return false;
}

}  // namespace fairgate::http
