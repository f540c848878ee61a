// gateway/gateway.hpp — gateway mode of `fairgate serve` (docs/api.md "HTTP —
// gateway"): `[[route]]`s send a path prefix to an upstream (an
// OpenAI-compatible model server) through a limiter — or, on a route without
// one, at once, without a permit.
//
// A request on a route waits for a permit (with queue feedback that standard
// clients ignore), then is proxied to the upstream with the response body
// passed through byte for byte; the permit is held until the response has
// been relayed, and released on every exit (RAII). A client that goes away
// while waiting cancels its place; while streaming, it releases the permit
// and aborts the upstream call.
//
// The parts: proxy.cpp (the steps of a request), wait.cpp (the wait for a
// permit), rates.cpp (the route's rate limits), upstream.cpp (the upstream
// call and the relay), upstream_stream.cpp (the connection, plain or TLS, and
// the pool of TLS ones), usage.cpp (what token budgets refund from),
// openai.cpp (every error answer, in OpenAI's shape).
#pragma once

#include "gateway/openai.hpp"
#include "http/pool.hpp"
#include "serve/config.hpp"
#include "serve/session.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace boost::asio::ssl {
class context;
}
struct ssl_st;          // OpenSSL's SSL
struct ssl_session_st;  // OpenSSL's SSL_SESSION

namespace fairgate::serve {

/// Idle keep-alive connections to one http:// upstream (src/http/pool.hpp).
using UpstreamPool = fairgate::http::ConnectionPool;

class UpstreamStream;  // gateway/upstream_stream.hpp

/// Idle keep-alive connections to one https:// upstream, each with its TLS
/// session, so a call on one makes no handshake. Only the route that made a
/// connection takes it again (its CA, certificate and name were checked).
/// Dropped after UpstreamPool::kMaxIdle idle or when the upstream closed it;
/// the most recently used is taken first. Thread-safe.
class TlsUpstreamPool {
 public:
  explicit TlsUpstreamPool(std::size_t capacity);
  ~TlsUpstreamPool();
  TlsUpstreamPool(const TlsUpstreamPool&) = delete;
  TlsUpstreamPool& operator=(const TlsUpstreamPool&) = delete;

  /// A live idle connection (its handshake done), or null.
  std::unique_ptr<UpstreamStream> take();
  /// Keeps `conn` (an answer fully read, keep-alive) for reuse; drops the oldest when full.
  void put(std::unique_ptr<UpstreamStream> conn);
  /// The idle connections that can carry a request: those too old or closed
  /// by the upstream are dropped first (as take() would).
  std::size_t idle();

  /// Keeps the TLS session of `ssl` (a connection that has read an answer, so
  /// a TLS 1.3 server's session tickets have arrived), when it can be resumed.
  void remember_session(ssl_st* ssl);
  /// Offers the last session kept to `ssl` (before its handshake), so that a
  /// new connection resumes it: an abbreviated handshake, no certificate sent
  /// or checked again. The upstream may refuse; then it is a full handshake.
  void offer_session(ssl_st* ssl) const;

 private:
  struct Idle {
    std::unique_ptr<UpstreamStream> conn;
    std::chrono::steady_clock::time_point since;
  };
  static bool usable(const Idle& item, std::chrono::steady_clock::time_point now);
  mutable std::mutex mu_;
  std::deque<Idle> idle_;
  std::size_t capacity_;
  std::shared_ptr<ssl_session_st> session_;  // the last resumable session (SSL_SESSION_free)
};

/// Counters of one route (Prometheus: fairgate_gateway_*{route="…"}).
struct RouteStats {
  std::atomic<std::uint64_t> requests{0};
  std::atomic<std::uint64_t> admitted{0};
  std::atomic<std::uint64_t> rejected{0};  ///< no permit: timeout, queue full, disabled, unavailable
  /// `rejected` by RejectReason (index = the enum's value).
  std::array<std::atomic<std::uint64_t>, 16> rejected_by_reason{};
  std::atomic<std::uint64_t> rate_limited{0};  ///< refused by the route's rate limits (before the queue)
  /// Client left while waiting or while streaming (never also counted as an upstream error).
  std::atomic<std::uint64_t> client_gone{0};
  std::atomic<std::uint64_t> upstream_2xx{0};
  std::atomic<std::uint64_t> upstream_4xx{0};
  std::atomic<std::uint64_t> upstream_5xx{0};
  std::atomic<std::uint64_t> upstream_other{0};   ///< 1xx/3xx
  std::atomic<std::uint64_t> upstream_errors{0};  ///< connect failures, timeouts, resets
  std::atomic<std::uint64_t> connections_opened{0};
  std::atomic<std::uint64_t> connections_reused{0};
  /// New https:// connections whose handshake resumed a kept TLS session.
  std::atomic<std::uint64_t> connections_resumed{0};
  /// Token budgets: tokens answers used beyond what their request reserved (then charged).
  std::atomic<std::uint64_t> tokens_over_reservation{0};
  /// Streamed answers: request arrival to the first byte of the upstream's body relayed.
  Histogram time_to_first_token;
  /// Upstream calls: connect (or a pooled connection) to the end of the upstream's answer.
  Histogram upstream_latency;
};

/// The routes of one server, with their pools and counters.
class Gateway {
 public:
  struct Route {
    /// Throws std::runtime_error when an https:// upstream's TLS settings do not load.
    explicit Route(RouteConfig c);
    RouteConfig config;
    UpstreamPool pool;         ///< http:// upstreams
    TlsUpstreamPool tls_pool;  ///< https:// upstreams
    /// https:// upstreams: the client context (CA, client certificate, verification).
    std::shared_ptr<boost::asio::ssl::context> tls;
    RouteStats stats;
  };

  explicit Gateway(const std::vector<RouteConfig>& routes);

  /// The route whose path is the longest prefix of `path` on a segment
  /// boundary ("/v1/chat" matches "/v1/chat" and "/v1/chat/x", not "/v1/chats"), or null.
  Route* match(std::string_view path);
  const std::vector<std::unique_ptr<Route>>& routes() const { return routes_; }

  /// Appends the fairgate_gateway_* series to a /metrics page.
  void render_metrics(std::string& out) const;

 private:
  std::vector<std::unique_ptr<Route>> routes_;
};

/// Serves one request on `route`: admission, the upstream call, the relay.
/// Returns whether the client connection may carry another request.
net::awaitable<bool> proxy(std::shared_ptr<Session> self, const Request& req, Gateway::Route& route);

/// The path of a request target ("/a/b?x=1" → "/a/b").
std::string_view target_path(std::string_view target) noexcept;

/// Whether a JSON request body asks for a stream ("stream": true). Bodies
/// that are not JSON objects read as not streaming.
bool wants_stream(std::string_view body);

/// Whether `name` is a hop-by-hop header (RFC 9110 §7.6.1) that a proxy must
/// not forward: Connection, Keep-Alive, Proxy-*, TE, Trailer,
/// Transfer-Encoding, Upgrade, or any header `connection` lists.
bool is_hop_by_hop(std::string_view name, std::string_view connection) noexcept;

}  // namespace fairgate::serve
