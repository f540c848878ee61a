// mockllm/mock_llm.hpp — `fairgate mock-llm`: an OpenAI-compatible model
// server that answers chat completions with predictable text at a set speed,
// for demos, tests and benchmarks (docs/mock-llm.md).
//
// Embeddable: it runs on the caller's executor (any io_context, one or many
// threads); the CLI is only a thin wrapper around it. Beast stays out of this
// header.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace fairgate::mockllm {

namespace detail {
struct ServerState;
}

/// How the mock model behaves. Validated by Server's constructor.
struct Options {
  std::string host = "127.0.0.1";  ///< an IP address
  std::uint16_t port = 9000;       ///< 0: any free port (see Server::endpoint())
  /// Generation speed: after the first token, one token every 1/tokens_per_second.
  double tokens_per_second = 20;
  /// Answer length when the request has no max_tokens.
  std::uint32_t tokens = 40;
  /// At most this many generations at once; more are answered 429. 0: no ceiling.
  std::uint32_t max_concurrent = 0;
  /// Time from the request to the first token (time to first token).
  std::chrono::milliseconds first_token_delay{0};
  /// The model id reported in answers and by GET /v1/models.
  std::string model = "fairgate-mock";

  // Limits against hostile or stuck clients.
  std::chrono::milliseconds request_timeout{10'000};  ///< a started request must arrive within this
  std::chrono::milliseconds idle_timeout{60'000};     ///< a keep-alive connection may idle this long
  std::chrono::milliseconds write_timeout{10'000};    ///< each write must complete within this
};

/// Counters since start. A consistent snapshot (taken under one lock).
struct Stats {
  std::uint64_t requests = 0;        ///< POST /v1/chat/completions received (valid or not)
  std::uint64_t completed = 0;       ///< answers written in full
  std::uint64_t rejected_429 = 0;    ///< refused by the max_concurrent ceiling
  std::uint64_t bad_requests = 0;    ///< 400/404/405/408/413/431 answers and malformed HTTP, on any route
  std::uint64_t client_aborts = 0;   ///< generations ended because the client left or stopped reading
  std::uint32_t in_flight = 0;       ///< generations running now (what the ceiling counts)
  std::uint32_t peak_in_flight = 0;  ///< the most at once since start
};

/// The token texts: token i (0-based) of every answer is "t<i> " — "t0 ", "t1 ", …
/// so a complete answer of n tokens is "t0 t1 … t<n-1> " (with the trailing space).
std::string token_text(std::uint32_t index);

/// An HTTP server speaking the OpenAI chat completions API (streaming and not),
/// GET /v1/models, GET /stats and GET /healthz.
///
/// Thread-safety: stats() and stop() may be called from any thread. The
/// executor's io_context may run on several threads (each connection is a
/// coroutine on its own strand).
/// Lifetime: destroy the Server (it stops) before its io_context; the
/// connections still open end when they next run, or with the io_context.
class Server {
 public:
  /// Validates `options`, binds and listens (connections queue in the
  /// backlog until start()). Throws std::invalid_argument for bad options
  /// (e.g. "tokens_per_second: 0 must be > 0") and std::runtime_error when it
  /// cannot listen ("cannot listen on 127.0.0.1:9000: Address already in use").
  Server(boost::asio::any_io_executor executor, Options options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// The bound address (with the real port when Options::port was 0).
  boost::asio::ip::tcp::endpoint endpoint() const;

  /// Starts accepting connections (on the executor). Call once.
  void start();

  /// Stops accepting and closes every connection (generations in progress
  /// end without being counted as client aborts). Idempotent; returns at once,
  /// the closing happens on the executor.
  void stop();

  /// The counters now.
  Stats stats() const;

 private:
  std::shared_ptr<detail::ServerState> state_;
};

}  // namespace fairgate::mockllm
