// gateway/upstream.cpp — the upstream call (gateway/upstream.hpp), in steps:
// connect (a pooled connection, else a new one), send the request and read
// the answer's header (a pooled connection the upstream had closed is retried
// once on a new one), then relay the answer: passed through as it is
// (relay_plain), or into the event stream our own 200 started while the
// request waited (relay_stream; an upstream error there becomes an error
// event). The relay is Beast's buffer_body pass-through: body bytes are
// forwarded as they arrive (a token is never held back to fill a buffer),
// unchanged; only the framing (Content-Length or chunked) is re-done for the
// client. The connection goes back to the pool as soon as the upstream's
// answer is fully read.
#include "gateway/upstream.hpp"

#include "gateway/openai.hpp"
#include "gateway/upstream_stream.hpp"
#include "http/message.hpp"
#include "tls/client.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/json.hpp>

#include <fmt/format.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <array>
#include <optional>
#include <vector>

namespace fairgate::serve {

namespace json = boost::json;
using net::awaitable;
using Clock = std::chrono::steady_clock;

std::string upstream_target(const RouteConfig& rc, const Request& req) {
  const std::string_view target(req.target().data(), req.target().size());
  if (!rc.upstream_has_path) return std::string(target);
  std::string t = rc.upstream_base;
  const std::string_view rest =
      rc.path == "/" ? target : target.substr(std::min(rc.path.size(), target.size()));
  t.append(rest.data(), rest.size());
  if (t.empty() || t.front() != '/') t.insert(0, 1, '/');
  return t;
}

http::request<http::string_body> upstream_request(const Session& s, const RouteConfig& rc,
                                                  const Request& req) {
  http::request<http::string_body> up{req.method(), upstream_target(rc, req), 11};
  const std::string connection(req[http::field::connection]);
  // Every X-Forwarded-For line, as one list, then the client (a proxy may add a line of its own).
  std::string forwarded_for = fairgate::http::field_list(req, "X-Forwarded-For");
  for (const auto& field : req) {
    const std::string_view name(field.name_string().data(), field.name_string().size());
    // Expect: the body is read already (and sent in one go).
    if (is_hop_by_hop(name, connection) || field.name() == http::field::host ||
        field.name() == http::field::content_length || field.name() == http::field::expect)
      continue;
    if (beast::iequals(name, "x-forwarded-for")) continue;
    up.insert(field.name_string(), field.value());
  }
  if (!forwarded_for.empty()) forwarded_for += ", ";
  forwarded_for += s.client;
  up.set("X-Forwarded-For", forwarded_for);
  const bool v6 = rc.upstream_host.find(':') != std::string::npos;
  std::string host = v6 ? "[" + rc.upstream_host + "]" : rc.upstream_host;
  if (rc.upstream_port != (rc.upstream_tls ? 443 : 80)) {
    host += ':';
    host += std::to_string(rc.upstream_port);
  }
  up.set(http::field::host, host);
  up.body() = req.body();
  up.keep_alive(true);
  up.prepare_payload();
  return up;
}

namespace {

constexpr std::size_t kMaxUpstreamHeader = 64 * 1024;
/// Informational (1xx) answers read and dropped before the final one; more is a broken upstream.
constexpr int kMaxInformational = 16;
/// A pooled connection that fails this soon after the request was written was closed before
/// the upstream read it (idle timeout, restart): the request is sent again on a new one.
constexpr std::chrono::milliseconds kStaleWithin{500};
constexpr std::size_t kMaxErrorBody = 64 * 1024;

std::chrono::milliseconds since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t);
}

/// What went wrong on the way to the upstream, for the client.
struct UpstreamFailure {
  http::status status;
  std::string code;
  std::string message;
};

/// Tells the client the upstream failed: an HTTP error, or an SSE error event once the stream started.
awaitable<bool> send_upstream_failure(Session& s, const Request& req, bool header_sent,
                                      const UpstreamFailure& f) {
  const std::string body = openai_error(f.message, "upstream_error", f.code);
  if (header_sent) {
    const std::string event = stream_error(body);  // g++ 12: no temporaries inside co_await
    co_await send_raw(s, event);
    co_return false;
  }
  Response res = openai_response(f.status, req, body);
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

void count_status(RouteStats& stats, unsigned status) {
  auto& counter = status >= 200 && status < 300   ? stats.upstream_2xx
                  : status >= 400 && status < 500 ? stats.upstream_4xx
                  : status >= 500 && status < 600 ? stats.upstream_5xx
                                                  : stats.upstream_other;
  counter.fetch_add(1, std::memory_order_relaxed);
}

/// A failed upstream call: counted, and logged as a warning with the upstream and the error.
void upstream_failed(Session& s, Gateway::Route& route, unsigned status, std::string_view message) {
  route.stats.upstream_errors.fetch_add(1, std::memory_order_relaxed);
  const Log& log = *s.shared->log;
  if (!log.enabled(LogLevel::warn)) return;
  json::object f;
  f["route"] = route.config.path;
  f["upstream"] = route.config.upstream;
  if (status != 0) f["status"] = status;
  f["error"] = message;
  log.write(LogLevel::warn,
            status != 0 ? fmt::format("fairgate serve: route {}: {} {}", route.config.path, status, message)
                        : fmt::format("fairgate serve: route {}: {}", route.config.path, message),
            &f);
}

/// One upstream call: what each of its steps needs.
struct Call {
  Session& s;
  const Request& req;
  Gateway::Route& route;
  bool header_sent;
  UsageTap* tap;
  const http::fields* extra;
  CallState& cs;
  /// Cancelled: the client left while the call was under way (proxy() races
  /// the call against the client's hang-up).
  net::cancellation_state cancel_state;
  http::request<http::string_body> up;
  Clock::time_point started;

  /// A failed upstream connect or read after a cancel is not the upstream's fault.
  bool cancelled(const boost::system::error_code& ec) const {
    return cancel_state.cancelled() != net::cancellation_type::none || ec == net::error::operation_aborted;
  }
  /// The client went away (or could not be written to): counted as client gone only.
  bool gone() {
    cs.client_gone = true;
    return false;
  }
};

/// One attempt on one upstream connection, and the answer as it is read.
struct Exchange {
  Exchange(std::unique_ptr<UpstreamStream> c, bool pooled, bool head)
      : conn(std::move(c)), reused(pooled), head_request(head) {
    next_answer();
  }
  std::unique_ptr<UpstreamStream> conn;  // null once given back to the TLS pool
  bool reused;
  bool head_request;  // the answer to a HEAD has a header only, whatever its Content-Length says
  beast::flat_buffer buffer;
  std::optional<http::response_parser<http::buffer_body>> answer;
  std::array<char, 16 * 1024> chunk{};
  /// The upstream's part of the last failed body read (nothing when the call was cancelled).
  boost::system::error_code body_error;

  http::response_parser<http::buffer_body>& parser() { return *answer; }
  /// A fresh parser for the next answer on the connection (after an informational 1xx one).
  void next_answer() {
    answer.emplace();
    answer->header_limit(static_cast<std::uint32_t>(kMaxUpstreamHeader));
    answer->body_limit(boost::none);
    if (head_request) answer->skip(true);
  }
  bool streamed = false;  // a 2xx event stream: its first byte relayed is the time to first token
  bool first_relayed = false;
  bool relayed_any = false;  // body bytes went into the client's event stream (relay_stream)
  bool given_back = false;

  /// The upstream connection goes back to the pool as soon as its answer is
  /// read, before the client gets the last bytes: a client that sends its
  /// next request at once then finds it there (not after our last write).
  void give_back(Gateway::Route& route) {
    if (given_back || !parser().is_done()) return;
    given_back = true;
    if (conn->tls() && !reused) route.tls_pool.remember_session(conn->tls_native_handle());
    if (!parser().keep_alive()) return;
    if (conn->tls()) {
      route.tls_pool.put(std::move(conn));
    } else {
      route.pool.put(conn->plain().release_socket());
    }
  }
};

/// Reads the next piece of the upstream's body into `x.chunk`; the number of
/// bytes (possibly 0, e.g. after a chunk header), or nullopt on an error or timeout.
awaitable<std::optional<std::size_t>> read_body_chunk(Exchange& x, std::chrono::milliseconds timeout) {
  auto& body = x.parser().get().body();
  body.data = x.chunk.data();
  body.size = x.chunk.size();
  x.conn->plain().expires_after(timeout);
  auto [ec, n] = co_await http::async_read_some(*x.conn, x.buffer, x.parser(), nothrow);
  if (ec == http::error::need_buffer) ec = {};
  // An https:// body that ends with the connection, closed without TLS close_notify (as many
  // servers do): the end of the body, as over http://. A body of known length cut short stays an error.
  if (ec == net::ssl::error::stream_truncated && x.parser().need_eof()) x.parser().put_eof(ec);
  if (ec) {
    x.body_error = ec;
    co_return std::nullopt;
  }
  co_return x.chunk.size() - body.size;
}

/// The first byte of a streamed answer reached the client: the time to first token.
void first_byte_relayed(Call& c, Exchange& x) {
  if (x.first_relayed || !x.streamed) return;
  x.first_relayed = true;
  c.route.stats.time_to_first_token.observe(since(c.cs.arrived));
}

/// The upstream's body broke off (or paused longer than upstream_timeout_ms): its fault unless
/// the client left (and cancelled the read). In an event stream our own 200 started (the
/// request waited), the client is told with an error event: the end of that stream is the end
/// of the connection, so it could not tell a cut answer from a whole one.
awaitable<void> body_failed(Call& c, const Exchange& x) {
  if (c.cancelled(x.body_error)) {
    c.gone();
    co_return;
  }
  const bool timeout = x.body_error == beast::error::timeout;
  const std::string message =
      timeout
          ? fmt::format("the upstream {} sent nothing more for upstream_timeout_ms", c.route.config.upstream)
          : fmt::format("the upstream {} broke off its answer", c.route.config.upstream);
  upstream_failed(c.s, c.route, 0, message);
  if (!c.header_sent) co_return;
  if (x.relayed_any) {
    // The answer may have stopped inside an event: end it first, or the error event's lines
    // would join it ("{\"delta\":{\"condata: {\"error\"..."). The cut event reaches the client
    // as it is, then the error; after a whole event these blank lines dispatch nothing.
    const std::string end = "\n\n";
    co_await send_raw(c.s, end);
  }
  const UpstreamFailure f{timeout ? http::status::gateway_timeout : http::status::bad_gateway,
                          timeout ? "upstream_timeout" : "upstream_error", message};
  co_await send_upstream_failure(c.s, c.req, true, f);  // an error event
}

/// The next piece of a relayed body, seen by the usage tap; the upstream
/// connection goes back to the pool once the answer is read, and the tap
/// finishes then (the usage is known, whatever the client does next).
/// nullopt: the upstream failed (counted by body_failed); 0: nothing to write yet.
awaitable<std::optional<std::size_t>> next_relayed_chunk(Call& c, Exchange& x) {
  const auto got = co_await read_body_chunk(x, c.route.config.upstream_timeout);
  if (!got) {
    co_await body_failed(c, x);
    co_return std::nullopt;
  }
  x.give_back(c.route);
  if (*got != 0 && c.tap) c.tap->feed(x.chunk.data(), *got);
  if (x.parser().is_done() && c.tap) c.tap->finish();
  co_return got;
}

/// A connect or an exchange failed with `ec` (not cancelled): counted, logged, and what the client is told.
UpstreamFailure upstream_failure(Call& c, const boost::system::error_code& ec, std::string_view what,
                                 std::string_view code) {
  const bool timeout = ec == beast::error::timeout;
  UpstreamFailure f{timeout ? http::status::gateway_timeout : http::status::bad_gateway,
                    std::string(timeout ? std::string_view("upstream_timeout") : code),
                    fmt::format("{}: {}", what, timeout ? std::string("timed out") : ec.message())};
  upstream_failed(c.s, c.route, static_cast<unsigned>(f.status), f.message);
  return f;
}

/// Where an upstream call stands after a step.
struct Step {
  enum Kind { go_on, retry, done } kind = go_on;
  bool keep = false;  ///< done: whether the client connection may carry another request
};

/// https://: the TLS handshake on a new connection, within connect_timeout, the
/// certificate checked against the URL's host (upstream_ca_file, or the system's CAs).
awaitable<Step> handshake(Call& c, Exchange& x) {
  const RouteConfig& rc = c.route.config;
  const fairgate::tls::Options options = upstream_tls_options(rc);
  auto& session = x.conn->start_tls(*c.route.tls);
  std::string problem =
      fairgate::tls::prepare(session.native_handle(), x.conn->check(), rc.upstream_host, options);
  boost::system::error_code hec;
  if (problem.empty()) {
    if (rc.upstream_tls_verify)
      session.set_verify_callback(fairgate::tls::remember_rejection(x.conn->check()));
    c.route.tls_pool.offer_session(session.native_handle());
    x.conn->plain().expires_after(rc.connect_timeout);
    auto [ec] = co_await session.async_handshake(net::ssl::stream_base::client, nothrow);
    hec = ec;
    if (!hec) {
      c.route.stats.connections_opened.fetch_add(1, std::memory_order_relaxed);
      if (SSL_session_reused(session.native_handle()) == 1)
        c.route.stats.connections_resumed.fetch_add(1, std::memory_order_relaxed);
      co_return Step{};
    }
    if (c.cancelled(hec)) co_return Step{Step::done, c.gone()};
    problem = hec == beast::error::timeout
                  ? fmt::format("TLS handshake with the upstream {} timed out", rc.upstream)
                  : fairgate::tls::describe_handshake_failure(session.native_handle(), x.conn->check(),
                                                              rc.upstream_host, rc.upstream_port, options,
                                                              hec, kUpstreamTlsWords);
  }
  const bool timeout = hec == beast::error::timeout;
  const UpstreamFailure f{timeout ? http::status::gateway_timeout : http::status::bad_gateway,
                          timeout ? "upstream_timeout" : "upstream_tls_failed", problem};
  upstream_failed(c.s, c.route, static_cast<unsigned>(f.status), f.message);
  const bool keep = co_await send_upstream_failure(c.s, c.req, c.header_sent, f);
  co_return Step{Step::done, keep};
}

/// A pooled connection is ready; a new one is resolved and connected.
awaitable<Step> connect(Call& c, Exchange& x) {
  RouteStats& stats = c.route.stats;
  if (x.reused) {
    stats.connections_reused.fetch_add(1, std::memory_order_relaxed);
    co_return Step{};
  }
  const RouteConfig& rc = c.route.config;
  tcp::resolver resolver(c.s.stream.get_executor());
  x.conn->plain().expires_after(rc.connect_timeout);
  const std::string port = std::to_string(rc.upstream_port);
  auto [rec, endpoints] = co_await resolver.async_resolve(rc.upstream_host, port, nothrow);
  boost::system::error_code cec = rec;
  if (!rec) {
    auto [ec, ep] = co_await x.conn->plain().async_connect(endpoints, nothrow);
    cec = ec;
  }
  if (cec) {
    if (c.cancelled(cec)) co_return Step{Step::done, c.gone()};
    const std::string what = fmt::format("cannot connect to the upstream {}", rc.upstream);
    const UpstreamFailure f = upstream_failure(c, cec, what, "upstream_unreachable");
    const bool keep = co_await send_upstream_failure(c.s, c.req, c.header_sent, f);
    co_return Step{Step::done, keep};
  }
  boost::system::error_code ignored;
  x.conn->plain().socket().set_option(tcp::no_delay(true), ignored);
  if (rc.upstream_tls) co_return co_await handshake(c, x);
  stats.connections_opened.fetch_add(1, std::memory_order_relaxed);
  co_return Step{};
}

/// Sends the request and reads the answer's header.
awaitable<Step> send_request(Call& c, Exchange& x) {
  const RouteConfig& rc = c.route.config;
  x.conn->plain().expires_after(rc.upstream_timeout);
  auto [wec, wn] = co_await http::async_write(*x.conn, c.up, nothrow);
  const auto written = Clock::now();
  boost::system::error_code hec = wec;
  // Informational answers (1xx: 100 Continue, 103 Early Hints) come before the final one on
  // the same connection: each is read and dropped, and the next is read with a fresh parser.
  for (int informational = 0; !hec; ++informational) {
    auto [ec, n] = co_await http::async_read_header(*x.conn, x.buffer, x.parser(), nothrow);
    hec = ec;
    if (hec) break;
    const unsigned status = x.parser().get().result_int();
    if (status / 100 != 1) co_return Step{};
    if (status == 101 || informational == kMaxInformational) {
      // We never ask to switch protocols; an upstream that does, or that sends nothing but
      // 1xx, is answered as one that failed (the connection is not kept).
      const UpstreamFailure f{
          http::status::bad_gateway, "upstream_error",
          status == 101
              ? fmt::format("the upstream {} switched protocols (101), which the gateway does not relay",
                            rc.upstream)
              : fmt::format("the upstream {} sent {} informational (1xx) answers and no final one",
                            rc.upstream, informational + 1)};
      upstream_failed(c.s, c.route, static_cast<unsigned>(f.status), f.message);
      const bool keep = co_await send_upstream_failure(c.s, c.req, c.header_sent, f);
      co_return Step{Step::done, keep};
    }
    x.next_answer();
  }
  // A pooled connection the upstream closed just before our request: once more on a new one.
  // Such a connection fails at once (a round trip); one that fails later was read and worked
  // on (an upstream that crashed mid-answer), and a POST is not sent twice.
  const bool closed = hec == http::error::end_of_stream || hec == net::error::connection_reset ||
                      hec == net::error::eof || hec == net::ssl::error::stream_truncated;
  const bool stale =
      x.reused && x.buffer.size() == 0 && (wec || (closed && Clock::now() - written < kStaleWithin));
  if (stale) co_return Step{Step::retry};
  if (c.cancelled(hec)) co_return Step{Step::done, c.gone()};
  const std::string what = fmt::format("the upstream {} did not answer", rc.upstream);
  const UpstreamFailure f = upstream_failure(c, hec, what, "upstream_error");
  const bool keep = co_await send_upstream_failure(c.s, c.req, c.header_sent, f);
  co_return Step{Step::done, keep};
}

/// A 2xx answer into the event stream our own 200 started while the request
/// waited: its body bytes as they come. The stream ends with the connection.
/// An answer that is not an event stream (an upstream that ignored
/// "stream": true and sent one JSON object) goes in as one event, its lines
/// as data lines: raw, its bytes would be no event at all.
awaitable<bool> relay_stream(Call& c, Exchange& x) {
  const bool wrap = !x.streamed;
  std::string piece;
  if (wrap) piece = "data: ";
  while (!x.parser().is_done()) {
    const auto got = co_await next_relayed_chunk(c, x);
    if (!got) co_return false;
    if (*got == 0) continue;
    net::const_buffer out(x.chunk.data(), *got);
    if (wrap) {
      for (std::size_t i = 0; i < *got; ++i) {
        const char ch = x.chunk[i];
        if (ch == '\r') continue;  // outside JSON strings (escaped inside): whitespace
        piece += ch;
        if (ch == '\n') piece += "data: ";
      }
      out = net::buffer(piece);
    }
    c.s.stream.expires_after(c.s.shared->config.server.write_timeout);
    auto [ec, n] = co_await net::async_write(c.s.stream, out, nothrow);
    c.s.stream.expires_never();
    if (ec) co_return c.gone();
    piece.clear();
    x.relayed_any = true;
    first_byte_relayed(c, x);
  }
  if (wrap && x.relayed_any) {
    piece += "\n\n";  // the event ends
    if (!co_await send_raw(c.s, piece)) co_return c.gone();
  }
  c.route.stats.upstream_latency.observe(since(c.started));
  if (c.tap) c.tap->finish();  // once (UsageTap::finish): an answer without a body
  x.give_back(c.route);
  c.cs.delivered = true;
  co_return false;
}

/// An upstream error after our 200: its body (bounded), sent as a stream error.
awaitable<bool> relay_stream_error(Call& c, Exchange& x, unsigned status) {
  std::string body;
  while (!x.parser().is_done() && body.size() < kMaxErrorBody) {
    const auto got = co_await read_body_chunk(x, c.route.config.upstream_timeout);
    if (!got) break;
    body.append(x.chunk.data(), *got);
  }
  if (x.parser().is_done()) c.route.stats.upstream_latency.observe(since(c.started));
  boost::system::error_code pec;
  const json::value v = json::parse(body, pec);
  std::string error;
  if (!pec && v.is_object() && v.as_object().contains("error")) {
    error = json::serialize(v);
  } else {
    error = openai_error(body.empty() ? fmt::format("the upstream answered {}", status) : body,
                         "upstream_error", std::to_string(status));
  }
  const std::string event = stream_error(error);
  co_await send_raw(c.s, event);
  co_return false;
}

/// Readies the upstream's answer for the client: its end-to-end headers plus
/// `extra`, the client's HTTP version and framing. Whether the client
/// connection may carry another request.
bool pass_through_header(http::response_parser<http::buffer_body>& parser, const Request& req,
                         const http::fields* extra) {
  auto& res = parser.get();
  const std::string connection(res[http::field::connection]);
  std::vector<std::string> drop;
  for (const auto& field : res) {
    const std::string_view name(field.name_string().data(), field.name_string().size());
    if (is_hop_by_hop(name, connection)) drop.emplace_back(name);
  }
  for (const auto& name : drop) res.erase(name);
  if (extra)
    for (const auto& f : *extra) res.set(f.name_string(), f.value());
  const bool has_length = parser.content_length().has_value();
  const bool no_body = parser.is_done();
  res.version(req.version());
  if (!has_length && !no_body && req.version() >= 11) res.chunked(true);
  const bool client_keep = req.keep_alive() && (has_length || no_body || req.version() >= 11);
  res.keep_alive(client_keep);
  return client_keep;
}

/// Passes the answer through: the upstream's status and end-to-end headers, the body as it comes.
awaitable<bool> relay_plain(Call& c, Exchange& x, unsigned status) {
  Session& s = c.s;
  auto& res = x.parser().get();
  bool client_keep = pass_through_header(x.parser(), c.req, c.extra);
  if (s.shared->stopping.load()) {
    // Draining (docs/serve.md, "Shutdown"): the connection closes after this answer, and says so.
    res.keep_alive(false);
    client_keep = false;
  }
  x.give_back(c.route);
  http::response_serializer<http::buffer_body> sr{res};
  s.stream.expires_after(s.shared->config.server.write_timeout);
  s.record.status = status;
  auto [hwec, hwn] = co_await http::async_write_header(s.stream, sr, nothrow);
  s.stream.expires_never();
  if (hwec) co_return c.gone();
  while (!x.parser().is_done()) {
    const auto got = co_await next_relayed_chunk(c, x);
    // Cut mid-answer: the client sees a truncated body and a closed connection.
    if (!got) co_return false;
    if (*got == 0) continue;
    res.body().data = x.chunk.data();
    res.body().size = *got;
    res.body().more = true;
    s.stream.expires_after(s.shared->config.server.write_timeout);
    auto [ec, n] = co_await http::async_write(s.stream, sr, nothrow);
    s.stream.expires_never();
    if (ec == http::error::need_buffer) ec = {};
    if (ec) co_return c.gone();
    first_byte_relayed(c, x);
  }
  c.route.stats.upstream_latency.observe(since(c.started));
  if (c.tap) c.tap->finish();  // once (UsageTap::finish): an answer without a body
  x.give_back(c.route);
  // A chunked answer ends with its last chunk; one of known length has been sent whole (a
  // client that closes at once after its last byte did not leave early).
  if (res.chunked() && !sr.is_done()) {
    res.body().data = nullptr;
    res.body().size = 0;
    res.body().more = false;
    s.stream.expires_after(s.shared->config.server.write_timeout);
    auto [ec, n] = co_await http::async_write(s.stream, sr, nothrow);
    s.stream.expires_never();
    if (ec) co_return c.gone();
  }
  c.cs.delivered = true;
  co_return client_keep;
}

/// The answer's header is read: counted, shown to the tap, and relayed the way the request needs.
awaitable<bool> relay(Call& c, Exchange& x) {
  auto& res = x.parser().get();
  const unsigned status = res.result_int();
  count_status(c.route.stats, status);
  const std::string_view type(res[http::field::content_type].data(), res[http::field::content_type].size());
  if (c.tap) c.tap->start(status, type);
  x.streamed = status / 100 == 2 && type.find("text/event-stream") != std::string_view::npos;
  if (!c.header_sent) co_return co_await relay_plain(c, x, status);
  if (status / 100 == 2) co_return co_await relay_stream(c, x);
  co_return co_await relay_stream_error(c, x, status);
}

}  // namespace

awaitable<bool> call_upstream(Session& s, const Request& req, Gateway::Route& route, bool header_sent,
                              UsageTap* tap, const http::fields* extra, CallState& cs) {
  const net::cancellation_state cancel_state = co_await net::this_coro::cancellation_state;
  Call c{s,           req,          route,
         header_sent, tap,          extra,
         cs,          cancel_state, upstream_request(s, route.config, req),
         Clock::now()};
  // A token budget refunds from the usage in the answer: asked for uncompressed, so it can be
  // read (an answer compressed anyway keeps its whole reservation).
  if (tap) c.up.set(http::field::accept_encoding, "identity");
  const auto executor = connection_executor(s.stream.get_executor());
  for (int attempt = 0;; ++attempt) {
    std::unique_ptr<UpstreamStream> conn;
    if (attempt == 0 && route.config.upstream_tls) {
      conn = route.tls_pool.take();
    } else if (attempt == 0) {
      if (auto pooled = route.pool.take(executor))
        conn = std::make_unique<UpstreamStream>(std::move(*pooled));
    }
    const bool reused = conn != nullptr;
    if (!conn) conn = std::make_unique<UpstreamStream>(tcp::socket(executor));
    Exchange x(std::move(conn), reused, req.method() == http::verb::head);
    Step step = co_await connect(c, x);
    if (step.kind == Step::go_on) step = co_await send_request(c, x);
    if (step.kind == Step::retry) continue;
    if (step.kind == Step::done) co_return step.keep;
    co_return co_await relay(c, x);
  }
}

}  // namespace fairgate::serve
