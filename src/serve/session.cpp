// serve/session.cpp — the write helpers of serve/session.hpp.
#include "serve/session.hpp"

#include "serve/views.hpp"

#include "http/message.hpp"
#include "http/sse.hpp"
#include "http/write.hpp"

#include <boost/asio/write.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <array>

namespace fairgate::serve {

namespace json = boost::json;
using net::awaitable;

Response make_response(http::status status, const Request& req, std::string body, std::string_view type) {
  return fairgate::http::make_response(status, req, std::move(body), type, kServerName);
}

Response json_response(http::status status, const Request& req, const json::value& v) {
  return fairgate::http::json_response(status, req, v, kServerName);
}

Response error_response(http::status status, const Request& req, std::string_view reason,
                        std::string_view message) {
  return json_response(status, req, error_json(reason, message));
}

namespace {

/// A page from an allowed origin may read the answer, and Retry-After with it.
template <class Fields>
void add_cors_headers(const Session& s, Fields& fields) {
  if (s.cors_origin.empty()) return;
  fields.set(http::field::access_control_allow_origin, s.cors_origin);
  fields.set(http::field::vary, "Origin");
  fields.set(http::field::access_control_expose_headers, "Retry-After");
}

}  // namespace

awaitable<bool> send(Session& s, Response res) {
  add_cors_headers(s, res);
  // Draining (docs/serve.md, "Shutdown"): the connection closes after this answer (the
  // session loop stops), and says so.
  if (s.shared->stopping.load()) res.keep_alive(false);
  s.record.status = res.result_int();
  s.stream.expires_after(s.shared->config.server.write_timeout);
  const auto ec = co_await fairgate::http::write_response(s.stream, res, s.head_only);
  s.stream.expires_never();
  co_return !ec;
}

awaitable<bool> send_error(Session& s, const Request& req, http::status status, std::string_view reason,
                           std::string_view message) {
  s.shared->metrics.http_bad_requests.fetch_add(1, std::memory_order_relaxed);
  Response res = error_response(status, req, reason, message);
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

awaitable<bool> send_raw(Session& s, const std::string& bytes) {
  s.stream.expires_after(s.shared->config.server.write_timeout);
  auto [ec, n] = co_await net::async_write(s.stream, net::buffer(bytes), nothrow);
  s.stream.expires_never();
  co_return !ec;
}

awaitable<bool> send_sse_header(Session& s, const Request& req, const http::fields* extra) {
  auto res = fairgate::http::sse_header(req, kServerName);
  add_cors_headers(s, res);
  if (extra != nullptr)
    for (const auto& f : *extra) res.set(f.name_string(), f.value());
  s.record.status = res.result_int();
  http::response_serializer<http::empty_body> sr{res};
  s.stream.expires_after(s.shared->config.server.write_timeout);
  auto [ec, n] = co_await http::async_write_header(s.stream, sr, nothrow);
  s.stream.expires_never();
  co_return !ec;
}

awaitable<void> watch_disconnect(Session& s, bool& dropped) {
  // Read into the coroutine's own small array, not into the session's buffer:
  // a waiting connection that sends nothing holds no buffer (see serve_connection).
  const std::size_t keep = std::min(s.buffer.max_size(), kWatchKeepsBytes);
  std::array<char, 512> scratch{};
  for (;;) {
    auto [ec, n] = co_await s.stream.socket().async_read_some(net::buffer(scratch), nothrow);
    if (ec) co_return;
    if (!dropped && s.buffer.size() + n <= keep) {
      s.buffer.commit(net::buffer_copy(s.buffer.prepare(n), net::buffer(scratch.data(), n)));
    } else {
      dropped = true;  // read on, to see the client leave
    }
  }
}

std::string retry_after_seconds(const Limiter& limiter, std::optional<std::chrono::milliseconds> max_wait) {
  using std::chrono::milliseconds;
  const Snapshot snap = limiter.snapshot();
  const milliseconds wait = max_wait.value_or(snap.settings.max_wait);
  const milliseconds cap = std::clamp(wait, milliseconds(1000), milliseconds(60'000));
  const milliseconds after = snap.estimated_wait
                                 ? std::clamp(*snap.estimated_wait - wait, milliseconds(1000), cap)
                                 : milliseconds(1000);
  return std::to_string((after.count() + 999) / 1000);
}

}  // namespace fairgate::serve
