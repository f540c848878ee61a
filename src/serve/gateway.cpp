// serve/gateway.cpp — why it is shaped this way:
//  * One coroutine per request, on the client's strand, in two phases, each
//    raced against the client's disconnect: wait for a permit, then call the
//    upstream and relay its answer. Losing the race cancels the other side:
//    a waiting request leaves the queue, an upstream call is aborted (its
//    socket is closed, not pooled). The permit is a local, so every exit
//    releases it.
//  * A streaming request that has to wait gets its 200 and SSE header early,
//    so it can see queue feedback; from then on failures are SSE error events
//    (what OpenAI's SDKs read from a stream). A request that never waited
//    gets the upstream's status and headers as they are.
//  * The relay is Beast's buffer_body pass-through: body bytes are forwarded
//    as they arrive (a token is never held back to fill a buffer), unchanged;
//    only the framing (Content-Length or chunked) is re-done for the client.
#include "serve/gateway.hpp"

#include "serve/ratelimit.hpp"
#include "serve/views.hpp"

#include <fairgate/limiter.hpp>
#include <fairgate/rate_limiter.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/json.hpp>

#include <fmt/format.h>

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>

namespace fairgate::serve {

namespace json = boost::json;
using net::awaitable;
using namespace net::experimental::awaitable_operators;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// --- Gateway -------------------------------------------------------------------

Gateway::Gateway(const std::vector<RouteConfig>& routes) {
  for (const auto& r : routes) routes_.push_back(std::make_unique<Route>(r));
}

Gateway::Route* Gateway::match(std::string_view path) {
  Route* best = nullptr;
  for (const auto& r : routes_) {
    const std::string& prefix = r->config.path;
    const bool hit = prefix == "/" || path == prefix ||
                     (path.size() > prefix.size() && path.substr(0, prefix.size()) == prefix &&
                      path[prefix.size()] == '/');
    if (hit && (best == nullptr || prefix.size() > best->config.path.size())) best = r.get();
  }
  return best;
}

void Gateway::render_metrics(std::string& out) const {
  using Counter = std::atomic<std::uint64_t> RouteStats::*;
  const auto series = [&](std::string_view name, std::string_view help, Counter counter) {
    out += fmt::format("# HELP {} {}\n# TYPE {} counter\n", name, help, name);
    for (const auto& r : routes_)
      out += fmt::format("{}{{route=\"{}\"}} {}\n", name, r->config.path,
                         (r->stats.*counter).load(std::memory_order_relaxed));
  };
  series("fairgate_gateway_requests_total", "Requests on a gateway route.", &RouteStats::requests);
  series("fairgate_gateway_admitted_total", "Requests that got a permit and went upstream.",
         &RouteStats::admitted);
  out +=
      "# HELP fairgate_gateway_rejected_total Requests that got no permit, by reason (timeout, queue_full, "
      "...).\n"
      "# TYPE fairgate_gateway_rejected_total counter\n";
  for (const auto& r : routes_) {
    const auto line = [&](RejectReason reason) {
      out += fmt::format(
          "fairgate_gateway_rejected_total{{route=\"{}\",reason=\"{}\"}} {}\n", r->config.path,
          to_string(reason),
          r->stats.rejected_by_reason[static_cast<std::size_t>(reason)].load(std::memory_order_relaxed));
    };
    line(RejectReason::timeout);  // a queue timeout is a rejection of the gateway's request
    for (const auto reason : kRejectionReasons) line(reason);
  }
  series("fairgate_gateway_rate_limited_total",
         "Requests refused by the route's rate limits (before the queue).", &RouteStats::rate_limited);
  series("fairgate_gateway_client_gone_total", "Clients that left while waiting or while streaming.",
         &RouteStats::client_gone);
  series("fairgate_gateway_upstream_errors_total", "Upstream connect failures, timeouts and resets.",
         &RouteStats::upstream_errors);
  series("fairgate_gateway_upstream_connections_opened_total", "New connections to the upstream.",
         &RouteStats::connections_opened);
  series("fairgate_gateway_upstream_connections_reused_total", "Upstream calls on a pooled connection.",
         &RouteStats::connections_reused);
  out +=
      "# HELP fairgate_gateway_upstream_responses_total Upstream answers by status class.\n"
      "# TYPE fairgate_gateway_upstream_responses_total counter\n";
  for (const auto& r : routes_) {
    const auto& s = r->stats;
    for (const auto& [cls, v] : {std::pair{"2xx", &s.upstream_2xx}, std::pair{"4xx", &s.upstream_4xx},
                                 std::pair{"5xx", &s.upstream_5xx}, std::pair{"other", &s.upstream_other}}) {
      out += fmt::format("fairgate_gateway_upstream_responses_total{{route=\"{}\",class=\"{}\"}} {}\n",
                         r->config.path, cls, v->load(std::memory_order_relaxed));
    }
  }
  const auto histogram = [&](std::string_view name, std::string_view help, Histogram RouteStats::*h) {
    out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    for (const auto& r : routes_)
      (r->stats.*h).render(name, fmt::format("route=\"{}\"", r->config.path), out);
  };
  histogram("fairgate_gateway_time_to_first_token_seconds",
            "Streamed answers: request arrival (queue wait included) to the first byte of the upstream's "
            "answer relayed.",
            &RouteStats::time_to_first_token);
  histogram("fairgate_gateway_upstream_seconds",
            "Upstream calls: from connecting (or taking a pooled connection) to the end of the upstream's "
            "answer.",
            &RouteStats::upstream_latency);
}

// --- pure helpers ----------------------------------------------------------------

std::string_view target_path(std::string_view target) noexcept { return target.substr(0, target.find('?')); }

bool wants_stream(std::string_view body) {
  boost::system::error_code ec;
  const json::value v = json::parse(body, ec);
  if (ec || !v.is_object()) return false;
  const auto* stream = v.as_object().if_contains("stream");
  return stream != nullptr && stream->is_bool() && stream->as_bool();
}

namespace {

bool iequals(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

bool is_hop_by_hop(std::string_view name, std::string_view connection) noexcept {
  static constexpr std::array<std::string_view, 9> kHop = {"connection",
                                                           "keep-alive",
                                                           "proxy-authenticate",
                                                           "proxy-authorization",
                                                           "proxy-connection",
                                                           "te",
                                                           "trailer",
                                                           "transfer-encoding",
                                                           "upgrade"};
  for (const auto h : kHop)
    if (iequals(name, h)) return true;
  while (!connection.empty()) {
    const auto comma = connection.find(',');
    if (iequals(trim(connection.substr(0, comma)), name)) return true;
    if (comma == std::string_view::npos) break;
    connection.remove_prefix(comma + 1);
  }
  return false;
}

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

// --- the request -------------------------------------------------------------------

namespace {

constexpr std::string_view kBusyText = "The system is busy, please try again later";
constexpr std::size_t kMaxUpstreamHeader = 64 * 1024;
constexpr std::size_t kMaxErrorBody = 64 * 1024;

/// How a rejection reads to an OpenAI client.
struct OpenAiReject {
  http::status status;
  std::string_view type;
  std::string_view code;
};

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

/// A waiting request: shared by the coroutine, on_queued and the completion, all on the session strand.
struct Wait {
  explicit Wait(const net::any_io_executor& strand) : wake(strand) {}
  net::steady_timer wake;  // cancelled when there is news
  net::cancellation_signal cancel;
  std::deque<std::string> out;  // queue events not yet written
  std::optional<AcquireResult> result;
  std::size_t told_position = 0;
  bool closed = false;  // the coroutine left: a late grant is released at once
};

std::string queue_event(QueueEvents mode, const QueueStatus& q) {
  if (mode == QueueEvents::named) {
    json::object data;
    data["position"] = q.position;
    data["queued"] = q.queued;
    if (q.estimated_wait) data["estimated_wait_ms"] = q.estimated_wait->count();
    return sse_event("queue", data);
  }
  return fmt::format(": queued position={} queued={}\n\n", q.position, q.queued);
}

/// Sent once a stream that queued is admitted: a comment, or a named event in `named` mode.
std::string admitted_event(QueueEvents mode, std::chrono::milliseconds waited) {
  if (mode == QueueEvents::named) {
    json::object data;
    data["waited_ms"] = waited.count();
    return sse_event("admitted", data);
  }
  return fmt::format(": admitted waited_ms={}\n\n", waited.count());
}

/// The seeds' rejection: META / REJECT / FINISH / DONE.
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

/// An error inside an event stream: "data: {"error":{…}}" (what the OpenAI SDKs raise from a stream).
std::string stream_error(std::string_view error_json) {
  std::string out = "data: ";
  out += error_json;
  out += "\n\n";
  return out;
}

Response openai_response(http::status status, const Request& req, std::string body) {
  Response res = make_response(status, req, std::move(body), "application/json");
  res.body() += "\n";
  res.prepare_payload();
  return res;
}

/// Waits until the acquire completed (st.result set) or a write to the client failed,
/// writing queue events (and keep-alive comments) as they come.
awaitable<void> wait_for_permit(Session& s, Wait& st, const Request& req, bool& header_sent,
                                bool& write_failed) {
  const auto keepalive = s.shared->config.server.keepalive_interval;
  for (;;) {
    if (st.result) co_return;
    if (!st.out.empty()) {
      if (!header_sent) {
        if (!co_await send_sse_header(s, req)) {
          write_failed = true;
          co_return;
        }
        header_sent = true;
      }
      while (!st.out.empty()) {
        const std::string bytes = std::move(st.out.front());
        st.out.pop_front();
        if (!co_await send_raw(s, bytes)) {
          write_failed = true;
          co_return;
        }
      }
      continue;
    }
    st.wake.expires_after(header_sent ? keepalive : std::chrono::milliseconds(std::chrono::hours(24)));
    auto [ec] = co_await st.wake.async_wait(nothrow);
    if (!ec && header_sent && !st.result) st.out.push_back(": keepalive\n\n");
  }
}

/// The upstream's request target: the client's, or with the route's prefix
/// replaced by the upstream URL's path when it has one.
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
  std::string forwarded_for;
  for (const auto& field : req) {
    const std::string_view name(field.name_string().data(), field.name_string().size());
    // Expect: the body is read already (and sent in one go).
    if (is_hop_by_hop(name, connection) || field.name() == http::field::host ||
        field.name() == http::field::content_length || field.name() == http::field::expect)
      continue;
    if (iequals(name, "x-forwarded-for")) {
      forwarded_for.assign(field.value().data(), field.value().size());
      continue;
    }
    up.insert(field.name_string(), field.value());
  }
  if (!forwarded_for.empty()) forwarded_for += ", ";
  forwarded_for += s.client;
  up.set("X-Forwarded-For", forwarded_for);
  const bool v6 = rc.upstream_host.find(':') != std::string::npos;
  std::string host = v6 ? "[" + rc.upstream_host + "]" : rc.upstream_host;
  if (rc.upstream_port != 80) {
    host += ':';
    host += std::to_string(rc.upstream_port);
  }
  up.set(http::field::host, host);
  up.body() = req.body();
  up.keep_alive(true);
  up.prepare_payload();
  return up;
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

/// Reads the next piece of an upstream body into `chunk`; the number of bytes
/// (possibly 0, e.g. after a chunk header), or nullopt on an error or timeout.
awaitable<std::optional<std::size_t>> read_body_chunk(beast::tcp_stream& conn, beast::flat_buffer& buffer,
                                                      http::response_parser<http::buffer_body>& parser,
                                                      std::array<char, 16 * 1024>& chunk,
                                                      std::chrono::milliseconds timeout) {
  auto& body = parser.get().body();
  body.data = chunk.data();
  body.size = chunk.size();
  conn.expires_after(timeout);
  auto [ec, n] = co_await http::async_read_some(conn, buffer, parser, nothrow);
  if (ec == http::error::need_buffer) ec = {};
  if (ec) co_return std::nullopt;
  co_return chunk.size() - body.size;
}

/// What one upstream call learned besides its result.
struct CallState {
  Clock::time_point arrived;  ///< when the client's request arrived (time to first token)
  bool client_gone = false;   ///< the client went away (or could not be written to)
};

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

  void start(unsigned st, std::string_view content_type) {
    reached = true;
    status = st;
    sse = content_type.find("text/event-stream") != std::string_view::npos;
  }
  void feed(const char* data, std::size_t n) {
    if (!sse) {
      if (body.size() + n <= kMaxBody) body.append(data, n);
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
  void finish() {
    if (sse || body.empty()) return;
    boost::system::error_code ec;
    const json::value v = json::parse(body, ec);
    if (!ec && v.is_object()) read_usage(v.as_object());
  }

 private:
  void line(std::string_view l) {
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
  void read_usage(const json::object& o) {
    const auto* u = o.if_contains("usage");
    if (!u || !u->is_object()) return;
    const auto& uo = u->as_object();
    if (const auto* t = uo.if_contains("total_tokens"); t && t->is_int64()) {
      usage_total = t->as_int64();
    } else if (t && t->is_uint64()) {
      usage_total = static_cast<std::int64_t>(std::min<std::uint64_t>(t->as_uint64(), kMaxCost));
    }
  }
};

/// Calls the upstream and relays its answer; returns whether the client
/// connection may carry another request. `tap` (if any) sees the answer;
/// `extra` headers are added to a passed-through answer.
awaitable<bool> call_upstream(Session& s, const Request& req, Gateway::Route& route, bool header_sent,
                              UsageTap* tap, const http::fields* extra, CallState& cs) {
  const RouteConfig& rc = route.config;
  RouteStats& stats = route.stats;
  const auto executor = s.stream.get_executor();
  auto up = upstream_request(s, rc, req);
  const auto call_started = Clock::now();
  const auto since = [](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t);
  };
  // Cancelled: the client left while the call was under way (proxy() races the
  // call against the client's hang-up). A failed upstream connect or read is
  // then not the upstream's fault: counted as client gone only.
  const net::cancellation_state cancel_state = co_await net::this_coro::cancellation_state;
  const auto cancelled = [&cancel_state](const boost::system::error_code& ec) {
    return cancel_state.cancelled() != net::cancellation_type::none || ec == net::error::operation_aborted;
  };

  for (int attempt = 0;; ++attempt) {
    std::optional<tcp::socket> pooled;
    if (attempt == 0) pooled = route.pool.take(executor);
    const bool reused = pooled.has_value();
    beast::tcp_stream conn(reused ? std::move(*pooled) : tcp::socket(executor));
    if (reused) {
      stats.connections_reused.fetch_add(1, std::memory_order_relaxed);
    } else {
      tcp::resolver resolver(executor);
      conn.expires_after(rc.connect_timeout);
      const std::string port = std::to_string(rc.upstream_port);
      auto [rec, endpoints] = co_await resolver.async_resolve(rc.upstream_host, port, nothrow);
      boost::system::error_code cec = rec;
      if (!rec) {
        auto [ec, ep] = co_await conn.async_connect(endpoints, nothrow);
        cec = ec;
      }
      if (cec) {
        if (cancelled(cec)) {
          cs.client_gone = true;
          co_return false;
        }
        const bool timeout = cec == beast::error::timeout;
        const UpstreamFailure f{timeout ? http::status::gateway_timeout : http::status::bad_gateway,
                                timeout ? "upstream_timeout" : "upstream_unreachable",
                                fmt::format("cannot connect to the upstream {}: {}", rc.upstream,
                                            timeout ? std::string("timed out") : cec.message())};
        upstream_failed(s, route, static_cast<unsigned>(f.status), f.message);
        co_return co_await send_upstream_failure(s, req, header_sent, f);
      }
      stats.connections_opened.fetch_add(1, std::memory_order_relaxed);
      boost::system::error_code ignored;
      conn.socket().set_option(tcp::no_delay(true), ignored);
    }

    conn.expires_after(rc.upstream_timeout);
    auto [wec, wn] = co_await http::async_write(conn, up, nothrow);
    beast::flat_buffer buffer;
    http::response_parser<http::buffer_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(kMaxUpstreamHeader));
    parser.body_limit(boost::none);
    // The upstream connection goes back to the pool as soon as its answer is
    // read, before the client gets the last bytes: a client that sends its
    // next request at once then finds it there (not after our last write).
    bool given_back = false;
    const auto give_back = [&] {
      if (given_back || !parser.is_done()) return;
      given_back = true;
      if (parser.keep_alive()) route.pool.put(conn.release_socket());
    };
    boost::system::error_code hec = wec;
    if (!wec) {
      auto [ec, n] = co_await http::async_read_header(conn, buffer, parser, nothrow);
      hec = ec;
    }
    if (hec) {
      // A pooled connection the upstream closed just before our request: once more on a new one.
      const bool stale = reused && buffer.size() == 0 &&
                         (wec || hec == http::error::end_of_stream || hec == net::error::connection_reset ||
                          hec == net::error::eof);
      if (stale) continue;
      if (cancelled(hec)) {
        cs.client_gone = true;
        co_return false;
      }
      const bool timeout = hec == beast::error::timeout;
      const UpstreamFailure f{timeout ? http::status::gateway_timeout : http::status::bad_gateway,
                              timeout ? "upstream_timeout" : "upstream_error",
                              fmt::format("the upstream {} did not answer: {}", rc.upstream,
                                          timeout ? std::string("timed out") : hec.message())};
      upstream_failed(s, route, static_cast<unsigned>(f.status), f.message);
      co_return co_await send_upstream_failure(s, req, header_sent, f);
    }

    auto& res = parser.get();
    const unsigned status = res.result_int();
    count_status(stats, status);
    if (tap)
      tap->start(status, std::string_view(res[http::field::content_type].data(),
                                          res[http::field::content_type].size()));

    std::array<char, 16 * 1024> chunk{};
    const bool streamed = status / 100 == 2 && std::string_view(res[http::field::content_type].data(),
                                                                res[http::field::content_type].size())
                                                       .find("text/event-stream") != std::string_view::npos;
    bool first_relayed = false;
    // The first byte of a streamed answer reached the client: the time to first token.
    const auto relayed = [&] {
      if (first_relayed || !streamed) return;
      first_relayed = true;
      stats.time_to_first_token.observe(since(cs.arrived));
    };
    // The upstream's body broke off: its fault unless the client left (and cancelled the read).
    const auto body_failed = [&] {
      if (cancelled({})) {
        cs.client_gone = true;
      } else {
        upstream_failed(s, route, 0, fmt::format("the upstream {} broke off its answer", rc.upstream));
      }
    };

    if (header_sent) {
      // Our own 200 and SSE header went out while the request waited.
      if (status / 100 == 2) {
        while (!parser.is_done()) {
          const auto got = co_await read_body_chunk(conn, buffer, parser, chunk, rc.upstream_timeout);
          if (!got) {
            body_failed();
            co_return false;
          }
          give_back();
          if (*got == 0) continue;
          if (tap) tap->feed(chunk.data(), *got);
          s.stream.expires_after(s.shared->config.server.write_timeout);
          auto [ec, n] = co_await net::async_write(s.stream, net::buffer(chunk.data(), *got), nothrow);
          s.stream.expires_never();
          if (ec) {
            cs.client_gone = true;
            co_return false;
          }
          relayed();
        }
        stats.upstream_latency.observe(since(call_started));
        if (tap) tap->finish();
        give_back();
        co_return false;  // the event stream ends with the connection
      }
      // An upstream error after our 200: read its body (bounded) and send it as a stream error.
      std::string body;
      while (!parser.is_done() && body.size() < kMaxErrorBody) {
        const auto got = co_await read_body_chunk(conn, buffer, parser, chunk, rc.upstream_timeout);
        if (!got) break;
        body.append(chunk.data(), *got);
      }
      if (parser.is_done()) stats.upstream_latency.observe(since(call_started));
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
      co_await send_raw(s, event);
      co_return false;
    }

    // Pass the answer through: the upstream's status and end-to-end headers, the body as it comes.
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

    give_back();
    http::response_serializer<http::buffer_body> sr{res};
    s.stream.expires_after(s.shared->config.server.write_timeout);
    s.record.status = status;
    auto [hwec, hwn] = co_await http::async_write_header(s.stream, sr, nothrow);
    s.stream.expires_never();
    if (hwec) {
      cs.client_gone = true;
      co_return false;
    }
    while (!parser.is_done()) {
      const auto got = co_await read_body_chunk(conn, buffer, parser, chunk, rc.upstream_timeout);
      // Cut mid-answer: the client sees a truncated body and a closed connection.
      if (!got) {
        body_failed();
        co_return false;
      }
      give_back();
      if (*got == 0) continue;
      if (tap) tap->feed(chunk.data(), *got);
      res.body().data = chunk.data();
      res.body().size = *got;
      res.body().more = true;
      s.stream.expires_after(s.shared->config.server.write_timeout);
      auto [ec, n] = co_await http::async_write(s.stream, sr, nothrow);
      s.stream.expires_never();
      if (ec == http::error::need_buffer) ec = {};
      if (ec) {
        cs.client_gone = true;
        co_return false;
      }
      relayed();
    }
    stats.upstream_latency.observe(since(call_started));
    if (!sr.is_done()) {
      res.body().data = nullptr;
      res.body().size = 0;
      res.body().more = false;
      s.stream.expires_after(s.shared->config.server.write_timeout);
      auto [ec, n] = co_await http::async_write(s.stream, sr, nothrow);
      s.stream.expires_never();
      if (ec) {
        cs.client_gone = true;
        co_return false;
      }
    }
    if (tap) tap->finish();
    give_back();
    co_return client_keep;
  }
}

/// A tenant key from a header, under the one tenant rule (fairgate::valid_tenant).
std::optional<std::string> tenant_of(const Request& req, const RouteConfig& rc, std::string& problem) {
  if (rc.tenant_header.empty()) return std::string();
  const auto it = req.find(rc.tenant_header);
  if (it == req.end()) return std::string();
  const std::string_view v(it->value().data(), it->value().size());
  if (v.empty()) return std::string();  // an empty header: no tenant, as without it
  if (!fairgate::valid_tenant(v)) {
    problem = fmt::format("header {}: a tenant must be {}", rc.tenant_header, fairgate::kTenantRule);
    return std::nullopt;
  }
  return std::string(v);
}

/// Asks for the permit; the completion and queue events land in `st`, on `strand`.
/// (A plain function, not part of the coroutine: g++ 12 mis-sizes some coroutine
/// locals that never live across a suspension, as ASan showed for AcquireOptions.)
void start_acquire(Limiter& limiter, std::optional<std::chrono::milliseconds> max_wait, std::string tenant,
                   QueueEvents events, const std::shared_ptr<Wait>& st, const net::any_io_executor& strand,
                   WaiterSlot slot) {
  AcquireOptions options;
  options.max_wait = max_wait;
  options.tenant = std::move(tenant);
  if (events != QueueEvents::none) {
    options.on_queued = [st, strand, events](const QueueStatus& q) {
      net::post(strand, [st, q, events] {
        if (st->result || st->closed || q.position == st->told_position) return;
        st->told_position = q.position;
        st->out.push_back(queue_event(events, q));
        st->wake.cancel();
      });
    };
  }
  auto on_done = [st, slot = std::make_shared<WaiterSlot>(std::move(slot))](AcquireResult r) {
    slot->reset();
    if (st->closed) return;  // the client left while this was on its way: a permit is released here
    st->result.emplace(std::move(r));
    st->wake.cancel();
  };
  limiter.async_acquire(
      std::move(options),
      net::bind_cancellation_slot(st->cancel.slot(), net::bind_executor(strand, std::move(on_done))));
}

/// The rate limits of a route, checked before the queue: the requests sent
/// and the answer (whose decisions token budgets refund from).
struct RouteRates {
  std::vector<const RateRuleConfig*> configs;
  std::vector<std::int64_t> prompt;  // per rule: the prompt's part of a token cost
  RateResult result;
  http::fields headers;  // RateLimit-*, X-RateLimit-* for the answer
};

/// Builds the checks of `rc.ratelimit` for `req`; false with `problem` when a key cannot be derived.
bool rate_requests(const Shared& sh, const Session& s, const Request& req, const RouteConfig& rc,
                   std::string_view tenant, RouteRates& rates, std::vector<RateRequest>& out,
                   std::string& problem) {
  const auto xff = req["X-Forwarded-For"];
  const std::string ip =
      client_ip(s.client, std::string_view(xff.data(), xff.size()), sh.config.server.trusted_proxies);
  const KeyInputs in{static_cast<const http::fields*>(&req), tenant, ip, rc.path};
  for (const auto& name : rc.ratelimit) {
    const auto it = sh.rate_configs.find(name);
    if (it == sh.rate_configs.end()) continue;  // checked at start (config.cpp)
    auto key = derive_rate_key(it->second, in, problem);
    if (!key) return false;
    std::int64_t prompt = 0;
    const std::int64_t cost = it->second.cost_mode == RateCostMode::tokens
                                  ? estimate_token_cost(req.body(), it->second, &prompt)
                                  : it->second.cost;
    out.push_back(RateRequest{name, std::move(*key), cost});
    rates.configs.push_back(&it->second);
    rates.prompt.push_back(prompt);
  }
  return true;
}

/// Token budgets: gives back what a request reserved and did not use
/// (docs/ratelimit.md, "Token budgets"). Fire and forget.
void refund_token_budgets(Shared& sh, const RouteRates& rates, const UsageTap& tap) {
  if (!rates.result.allowed) return;
  for (std::size_t i = 0; i < rates.configs.size() && i < rates.result.decisions.size(); ++i) {
    if (rates.configs[i]->cost_mode != RateCostMode::tokens) continue;
    const RateDecision& d = rates.result.decisions[i];
    if (!d.allowed) continue;  // a shadow rule that would have refused took nothing
    std::int64_t used = 0;
    if (!tap.reached || tap.status / 100 != 2) {
      used = 0;  // nothing was generated
    } else if (tap.usage_total) {
      used = *tap.usage_total;
    } else if (tap.sse) {
      used = rates.prompt[i] + tap.streamed;
    } else {
      used = d.cost;  // an answer without usage: keep the reservation
    }
    const std::int64_t back = d.cost - used;
    if (back <= 0 || d.at_us == 0) continue;  // used it all, or decided without the store (degraded)
    sh.rates.async_refund(d, back, [](RefundResult) {});
  }
}

}  // namespace

awaitable<bool> proxy(std::shared_ptr<Session> self, const Request& req, Gateway::Route& route) {
  Session& s = *self;
  Shared& sh = *s.shared;
  const RouteConfig& rc = route.config;
  RouteStats& stats = route.stats;
  stats.requests.fetch_add(1, std::memory_order_relaxed);
  CallState cs;
  cs.arrived = Clock::now();
  s.record.route = rc.path;
  s.record.limiter = rc.limiter;

  if (sh.stopping.load()) {
    Response res =
        openai_response(http::status::service_unavailable, req,
                        openai_error("the gateway is shutting down", "server_error", "unavailable"));
    res.set(http::field::retry_after, "1");
    co_return co_await send(s, std::move(res)) && req.keep_alive();
  }
  auto limiter = sh.backend->find(rc.limiter);
  if (!limiter) {
    Response res = openai_response(
        http::status::service_unavailable, req,
        openai_error(fmt::format("limiter \"{}\" is not open", rc.limiter), "server_error", "unavailable"));
    co_return co_await send(s, std::move(res)) && req.keep_alive();
  }
  std::string problem;
  auto tenant = tenant_of(req, rc, problem);
  if (!tenant) {
    sh.metrics.http_bad_requests.fetch_add(1, std::memory_order_relaxed);
    Response res = openai_response(http::status::bad_request, req,
                                   openai_error(problem, "invalid_request_error", "invalid_tenant"));
    co_return co_await send(s, std::move(res)) && req.keep_alive();
  }
  // Rate limits (docs/ratelimit.md, "Gateway rules"): all must allow, before the queue.
  RouteRates rates;
  if (!rc.ratelimit.empty()) {
    std::vector<RateRequest> checks;
    if (!rate_requests(sh, s, req, rc, *tenant, rates, checks, problem)) {
      sh.metrics.http_bad_requests.fetch_add(1, std::memory_order_relaxed);
      Response res =
          openai_response(http::status::bad_request, req,
                          openai_error(problem, "invalid_request_error", "rate_limit_key_missing"));
      co_return co_await send(s, std::move(res)) && req.keep_alive();
    }
    rates.result = co_await rate_check(sh.rates, checks);
    const RateResult& rr = rates.result;
    if (rr.error) {
      const bool bad = rr.error == make_error_code(RejectReason::invalid_argument);
      Response res = openai_response(bad ? http::status::bad_request : http::status::service_unavailable, req,
                                     openai_error(rr.message, bad ? "invalid_request_error" : "server_error",
                                                  bad ? "invalid_argument" : "unavailable"));
      co_return co_await send(s, std::move(res)) && req.keep_alive();
    }
    // The headers tell of the refusing rule, else of the one with the least left.
    std::size_t shown = 0;
    for (std::size_t i = 0; i < rr.decisions.size(); ++i) {
      const auto& d = rr.decisions[i];
      if (!d.allowed && !d.shadow) {
        shown = i;
        break;
      }
      if (d.remaining < rr.decisions[shown].remaining) shown = i;
    }
    if (!rr.decisions.empty()) {
      const RateDecision& d = rr.decisions[shown];
      set_rate_headers(rates.headers, d, sh.rates.rule(d.rule).value_or(RateRule{}));
    }
    if (!rr.allowed) {
      stats.rate_limited.fetch_add(1, std::memory_order_relaxed);
      s.record.outcome = "rate_limited";
      const RateDecision& d = rr.decisions[shown];
      const bool unavailable = rr.reason.has_value();
      const bool tokens = rates.configs[shown]->cost_mode == RateCostMode::tokens;
      std::string message =
          unavailable ? rr.message
          : d.retry_after.count() < 0
              ? fmt::format("Request too large for rate limit \"{}\": {}", d.rule, rr.message)
              : fmt::format(
                    "Rate limit reached for \"{}\" (limit {} {} per {} ms): please try again in {} ms",
                    d.rule, d.limit, tokens ? "tokens" : "requests",
                    sh.rates.rule(d.rule).value_or(RateRule{}).period_ms, d.retry_after.count());
      Response res = openai_response(
          unavailable ? http::status::service_unavailable : http::status::too_many_requests, req,
          openai_error(message,
                       unavailable ? "server_error"
                       : tokens    ? "tokens"
                                   : "requests",
                       unavailable ? "unavailable" : "rate_limit_exceeded"));
      for (const auto& f : rates.headers) res.set(f.name_string(), f.value());
      if (unavailable) res.set(http::field::retry_after, "1");
      co_return co_await send(s, std::move(res)) && req.keep_alive();
    }
  }
  UsageTap tap;
  // Every exit from here on gives back the unused part of a token budget.
  struct RefundOnExit {
    Shared& sh;
    const RouteRates& rates;
    const UsageTap& tap;
    ~RefundOnExit() { refund_token_budgets(sh, rates, tap); }
  } refund_on_exit{sh, rates, tap};

  WaiterSlot slot = WaiterSlot::take(self->shared, s.client);
  if (!slot.held()) {
    sh.metrics.client_cap_refusals.fetch_add(1, std::memory_order_relaxed);
    Response res = openai_response(http::status::too_many_requests, req,
                                   openai_error(fmt::format("this client already has {} waiting requests",
                                                            sh.config.server.max_waiters_per_client),
                                                "rate_limit_error", "too_many_waiters"));
    res.set(http::field::retry_after, "1");
    co_return co_await send(s, std::move(res)) && req.keep_alive();
  }

  const bool stream = wants_stream(req.body());
  const QueueEvents mode = rc.queue_events;
  const std::string ticket = fmt::format("t-{}", sh.next_ticket.fetch_add(1, std::memory_order_relaxed));
  const auto strand = s.stream.get_executor();
  auto st = std::make_shared<Wait>(strand);

  start_acquire(*limiter, rc.max_wait, std::move(*tenant), stream ? mode : QueueEvents::none, st, strand,
                std::move(slot));

  bool header_sent = false;
  bool write_failed = false;
  bool saw_data = false;
  co_await (wait_for_permit(s, *st, req, header_sent, write_failed) || watch_disconnect(s, saw_data));
  if (!st->result || write_failed) {
    // The client is gone: leave the queue (a grant racing this is released by on_done).
    st->closed = true;
    if (!st->result) st->cancel.emit(net::cancellation_type::terminal);
    st->result.reset();
    stats.client_gone.fetch_add(1, std::memory_order_relaxed);
    s.record.outcome = "client_gone";
    co_return false;
  }
  AcquireResult result = std::move(*st->result);
  st->result.reset();
  st->closed = true;
  const bool keep = req.keep_alive() && !saw_data;

  s.record.wait_ms = result.waited().count();
  if (!result.granted()) {
    stats.rejected.fetch_add(1, std::memory_order_relaxed);
    const auto reason = static_cast<std::size_t>(result.reason());
    if (reason < stats.rejected_by_reason.size())
      stats.rejected_by_reason[reason].fetch_add(1, std::memory_order_relaxed);
    s.record.outcome = wire_reason(result.reason());
    const OpenAiReject r = openai_reject(result.reason());
    std::string message = result.message();
    if (result.reason() == RejectReason::timeout)
      message = fmt::format("no capacity within {} ms; {}", result.waited().count(), kBusyText);
    const std::string error = openai_error(message, r.type, r.code);
    if (stream && (header_sent || mode == QueueEvents::seed)) {
      if (!header_sent && !co_await send_sse_header(s, req)) co_return false;
      const std::string events =
          mode == QueueEvents::seed ? seed_rejection(ticket, req.body()) : stream_error(error);
      co_await send_raw(s, events);
      co_return false;
    }
    Response res = openai_response(r.status, req, error);
    if (result.reason() != RejectReason::invalid_argument)
      res.set(http::field::retry_after, retry_after_seconds(*limiter, rc.max_wait));
    res.keep_alive(keep);
    co_return co_await send(s, std::move(res)) && keep;
  }

  Permit permit = result.take_permit();
  stats.admitted.fetch_add(1, std::memory_order_relaxed);
  s.record.outcome = "granted";
  if (auto* h = sh.metrics.wait_histogram(rc.limiter)) h->observe(permit.waited());
  // The hold time: from here until the permit goes (declared after it, destroyed before it).
  struct HoldTimer {
    Histogram* histogram;
    Clock::time_point since = Clock::now();
    ~HoldTimer() {
      if (histogram)
        histogram->observe(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since));
    }
  } hold{sh.metrics.hold_histogram(rc.limiter)};
  if (header_sent) {
    // Queued streams learn when they got their seat (the model's first token comes later).
    const std::string admitted = admitted_event(mode, permit.waited());
    if (!co_await send_raw(s, admitted)) {
      stats.client_gone.fetch_add(1, std::memory_order_relaxed);
      s.record.outcome = "client_gone";
      co_return false;
    }
  }
  auto relayed =
      co_await (call_upstream(s, req, route, header_sent, rc.ratelimit.empty() ? nullptr : &tap,
                              rates.headers.begin() == rates.headers.end() ? nullptr : &rates.headers, cs) ||
                watch_disconnect(s, saw_data));
  if (relayed.index() != 0 || cs.client_gone) {
    // The client left mid-call (the upstream call was cancelled, its connection
    // closed) or could not be written to: counted once, as client gone.
    stats.client_gone.fetch_add(1, std::memory_order_relaxed);
    s.record.outcome = "client_gone";
    co_return false;
  }
  co_return std::get<0>(relayed) && keep && !saw_data;
}

}  // namespace fairgate::serve
