// serve/session.hpp — what the routes of `fairgate serve` share: one client
// connection (Session), the server-wide state (Shared), the per-client cap on
// waiting requests (WaiterSlot) and the write helpers with their timeouts.
//
// Invariants: everything that touches a Session runs on its strand; Shared's
// members are thread-safe (atomics, the mutex, or read-only after start).
#pragma once

#include "http/connections.hpp"
#include "http/sse_stream.hpp"
#include "serve/config.hpp"
#include "serve/leases.hpp"
#include "serve/metrics.hpp"

#include <fairgate/backend.hpp>
#include <fairgate/limiter.hpp>
#include <fairgate/rate_limiter.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json/value.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fairgate::serve {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

inline constexpr auto nothrow = net::as_tuple(net::use_awaitable);
inline constexpr std::string_view kServerName = "fairgate";

class Gateway;
class EventHub;

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

struct Shared;

/// One client connection.
struct Session : fairgate::http::Connection {
  Session(tcp::socket socket, std::shared_ptr<Shared> s, std::uint64_t session_id, std::size_t buffer_limit)
      : Connection(std::move(socket), session_id, buffer_limit), shared(std::move(s)) {
    boost::system::error_code ec;
    const auto ep = stream.socket().remote_endpoint(ec);
    client = ec ? std::string("unknown") : ep.address().to_string();
  }

  /// On the strand: closes the socket; every pending operation ends.
  void close() {
    closing = true;
    Connection::close();
  }

  std::shared_ptr<Shared> shared;
  std::string client;
  bool closing = false;
  /// A gateway request is being served (waiting, or relaying the upstream's
  /// answer): a graceful shutdown lets it finish within shutdown_grace_ms.
  bool in_gateway = false;
  /// The current request is a HEAD (a GET route serves it as its GET): answers carry their
  /// header (Content-Length included) and no body.
  bool head_only = false;
  /// The current request's Origin when it is allowed (server.cors_origins):
  /// every answer to it carries the CORS headers. Empty: none.
  std::string cors_origin;
  /// The event stream of a granted SSE acquire or a /v1/events watcher: told
  /// of a shutdown with a final `closing` event (on the strand).
  std::weak_ptr<fairgate::http::SseStream> farewell;

  /// What the access log and /metrics learn of the request being served
  /// (reset for each request).
  struct Record {
    unsigned status = 0;  ///< the response's status; 0 = none sent
    std::string limiter;  ///< the limiter asked, if any
    std::string outcome;  ///< "granted", a rejection reason, "client_gone", ...
    std::optional<long long> wait_ms;
    std::string route;  ///< the gateway route's path
  } record;
};

/// What every connection shares.
struct Shared {
  Shared(const ServeConfig& c, net::io_context& context, std::vector<std::string> limiter_names)
      : config(c),
        io(context),
        metrics(limiter_names),
        acceptor_strand(net::make_strand(context)),
        acceptor(acceptor_strand) {}

  ServeConfig config;
  net::io_context& io;
  /// The log (run_server sets it; otherwise it drops everything).
  std::shared_ptr<const Log> log = std::make_shared<const Log>();
  std::shared_ptr<Backend> backend;
  /// The `[ratelimit.NAME]` rules (their state in Redis, or in this process).
  RateLimiter rates;
  /// The config of each rule, by name (key derivation and cost on gateway routes).
  std::unordered_map<std::string, RateRuleConfig> rate_configs;
  /// The [[route]]s (gateway mode); null when there are none.
  std::shared_ptr<Gateway> gateway;
  /// The snapshots of GET /v1/events, one per tick for every subscriber.
  std::shared_ptr<EventHub> events;
  Metrics metrics;
  LeaseTable leases;
  net::strand<net::io_context::executor_type> acceptor_strand;
  tcp::acceptor acceptor;
  std::atomic<bool> stopping{false};
  /// A second SIGTERM/SIGINT: stop draining, close every connection now.
  std::atomic<bool> force_stop{false};
  std::atomic<std::uint64_t> next_ticket{1};

  /// Open connections (a stop reaches each through it).
  fairgate::http::Connections<Session> sessions;
  std::mutex mu;  ///< guards waiting_by_client
  std::unordered_map<std::string, std::size_t> waiting_by_client;

  std::size_t session_count() const { return sessions.size(); }
  /// Posts to every session's strand: a final `closing` event to a granted
  /// SSE acquire or an events watcher, whose stream then ends.
  void say_farewell(const std::shared_ptr<const std::string>& event) {
    for (auto& s : sessions.all())
      net::post(s->stream.get_executor(), [s, event] {
        if (auto stream = s->farewell.lock()) {
          stream->push(event);
          stream->finish();
        }
      });
  }
  /// Posts close() to every session's strand; unless `force`, sessions in
  /// the middle of a gateway request are left to finish it.
  void close_sessions(bool force) {
    for (auto& s : sessions.all())
      net::post(s->stream.get_executor(), [s, force] {
        if (force || !s->in_gateway) s->close();
      });
  }
};

/// A place in the per-client cap of waiting requests; given back on destruction.
class WaiterSlot {
 public:
  WaiterSlot() = default;
  WaiterSlot(const WaiterSlot&) = delete;
  WaiterSlot& operator=(const WaiterSlot&) = delete;
  WaiterSlot(WaiterSlot&& o) noexcept : shared_(std::move(o.shared_)), client_(std::move(o.client_)) {}
  WaiterSlot& operator=(WaiterSlot&& o) noexcept {
    if (this != &o) {
      reset();
      shared_ = std::move(o.shared_);
      client_ = std::move(o.client_);
    }
    return *this;
  }
  ~WaiterSlot() { reset(); }

  /// A slot for `client`, or an empty one (held() false) when it has too many.
  static WaiterSlot take(const std::shared_ptr<Shared>& shared, const std::string& client) {
    WaiterSlot slot;
    std::lock_guard lock(shared->mu);
    auto& n = shared->waiting_by_client[client];
    if (n >= shared->config.server.max_waiters_per_client) {
      if (n == 0) shared->waiting_by_client.erase(client);
      return slot;
    }
    ++n;
    slot.shared_ = shared;
    slot.client_ = client;
    return slot;
  }
  bool held() const noexcept { return shared_ != nullptr; }
  void reset() noexcept {
    const std::shared_ptr<Shared> shared = std::move(shared_);  // outlives the lock below
    if (shared == nullptr) return;
    std::lock_guard lock(shared->mu);
    const auto it = shared->waiting_by_client.find(client_);
    if (it != shared->waiting_by_client.end() && --it->second == 0) shared->waiting_by_client.erase(it);
  }

 private:
  // Owned, not referenced: a completion handler holding this slot may outlive
  // every connection (at worst it is destroyed with the io_context).
  std::shared_ptr<Shared> shared_;
  std::string client_;
};

// --- responses --------------------------------------------------------------

Response make_response(http::status status, const Request& req, std::string body, std::string_view type);
Response json_response(http::status status, const Request& req, const boost::json::value& v);
Response error_response(http::status status, const Request& req, std::string_view reason,
                        std::string_view message);

/// Writes `res`; false when the client is gone (or too slow).
net::awaitable<bool> send(Session& s, Response res);

/// Answers a malformed or refused request (counted), keeping the connection when allowed.
net::awaitable<bool> send_error(Session& s, const Request& req, http::status status, std::string_view reason,
                                std::string_view message);

/// Writes raw bytes (SSE), with the write timeout.
net::awaitable<bool> send_raw(Session& s, const std::string& bytes);

/// The header of an event stream, plus the `extra` fields (the gateway's rate
/// limit headers); the body runs until the connection closes.
net::awaitable<bool> send_sse_header(Session& s, const Request& req, const http::fields* extra = nullptr);

/// Seconds a rejected client should wait before it tries again (Retry-After),
/// from the same wait estimate as the queue events: the estimate for a new
/// arrival minus the `max_wait` it may spend queued (the limiter's when
/// nullopt), at least 1 s and at most max(1 s, max_wait) and 60 s; 1 s without
/// an estimate (docs/eta.md).
std::string retry_after_seconds(const Limiter& limiter, std::optional<std::chrono::milliseconds> max_wait);

/// What watch_disconnect keeps of the bytes a client sends while its request
/// waits or is relayed (at most; less when the session's buffer is smaller).
inline constexpr std::size_t kWatchKeepsBytes = 64 * 1024;

/// Completes when the client closes the connection (or it fails). Bytes the
/// client sends meanwhile — its next request, sent as soon as it has read the
/// answer that is still being finished here, or pipelined — are kept in the
/// session's buffer for the next read, up to kWatchKeepsBytes. Beyond that
/// they are read and dropped (so a client that leaves is still seen) and
/// `dropped` is set: the connection must then close after the answer.
net::awaitable<void> watch_disconnect(Session& s, bool& dropped);

}  // namespace fairgate::serve
