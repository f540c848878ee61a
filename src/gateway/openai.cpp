// gateway/openai.cpp — the OpenAI shapes of gateway/openai.hpp.
#include "gateway/openai.hpp"

#include "serve/views.hpp"

#include <boost/json.hpp>

#include <fmt/format.h>

namespace fairgate::serve {

namespace json = boost::json;

std::string openai_error(std::string_view message, std::string_view type, std::string_view code) {
  json::object e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = nullptr;
  e["code"] = code;
  json::object o;
  o["error"] = std::move(e);
  return json::serialize(o);
}

OpenAiReject openai_reject(RejectReason reason) {
  switch (reason) {
    case RejectReason::timeout: return {http::status::too_many_requests, "rate_limit_error", "queue_timeout"};
    case RejectReason::queue_full: return {http::status::too_many_requests, "rate_limit_error", "queue_full"};
    case RejectReason::would_time_out:
      return {http::status::too_many_requests, "rate_limit_error", "would_time_out"};
    case RejectReason::invalid_argument:
      return {http::status::bad_request, "invalid_request_error", "invalid_argument"};
    case RejectReason::disabled: return {http::status::service_unavailable, "server_error", "disabled"};
    default: return {http::status::service_unavailable, "server_error", "unavailable"};
  }
}

std::string timeout_message(std::chrono::milliseconds max_wait) {
  return fmt::format("no capacity within {} ms; {}", max_wait.count(), kBusyText);
}

std::string rejection_message(const AcquireResult& result, std::chrono::milliseconds max_wait) {
  return result.reason() == RejectReason::timeout ? timeout_message(max_wait) : result.message();
}

Response openai_response(http::status status, const Request& req, std::string body) {
  Response res = make_response(status, req, std::move(body), "application/json");
  res.body() += "\n";
  res.prepare_payload();
  return res;
}

Response openai_error_response(http::status status, const Request& req, std::string_view message,
                               std::string_view type, std::string_view code) {
  return openai_response(status, req, openai_error(message, type, code));
}

std::string stream_error(std::string_view error_json) {
  std::string out = "data: ";
  out += error_json;
  out += "\n\n";
  return out;
}

std::string seed_rejection(const std::string& ticket, std::string_view body) {
  json::object meta;
  meta["conversationId"] = nullptr;
  boost::system::error_code ec;
  const json::value req = json::parse(body, ec);
  if (!ec && req.is_object()) {
    if (const auto* id = req.as_object().if_contains("conversation_id"); id != nullptr && id->is_string())
      meta["conversationId"] = *id;
  }
  meta["taskId"] = ticket;
  json::object reject;
  reject["type"] = "response";
  reject["delta"] = kBusyText;
  json::object finish;
  finish["messageId"] = ticket;
  finish["title"] = nullptr;
  std::string out = sse_event("META", meta);
  out += sse_event("REJECT", reject);
  out += sse_event("FINISH", finish);
  out += "event: DONE\ndata: [DONE]\n\n";
  return out;
}

}  // namespace fairgate::serve
