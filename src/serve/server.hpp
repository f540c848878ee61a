// serve/server.hpp — `fairgate serve`: the HTTP admission API (docs/api.md) on
// Boost.Beast, asynchronous throughout (S3): every connection is a coroutine
// on its own strand; a few I/O threads carry thousands of waiting clients.
#pragma once

#include "serve/config.hpp"

#include <fairgate/backend.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>

namespace fairgate::serve {

struct Shared;

/// One HTTP front end (admission API and gateway routes) on a caller's
/// io_context and backend. Several servers may share one backend: that is
/// how `fairgate demo` runs two gateways on one limiter in one process.
class Server {
 public:
  /// Opens config's limiters on `backend` (an existing limiter keeps its
  /// settings) and listens. Throws ConfigError when a limiter cannot be
  /// opened, std::runtime_error when it cannot listen. `logger` null: nothing is logged.
  Server(boost::asio::io_context& io, const ServeConfig& config, std::shared_ptr<Backend> backend,
         std::shared_ptr<const Log> logger = nullptr);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Starts accepting connections.
  void start();
  /// Stops accepting, releases JSON permits and closes every connection
  /// (within the shutdown grace period); then calls `done` on the io_context.
  /// The backend is left running (its owner shuts it down).
  void stop(std::function<void()> done);

  boost::asio::ip::tcp::endpoint endpoint() const { return endpoint_; }
  /// "http://HOST:PORT" with the real port.
  std::string url() const;
  std::shared_ptr<Shared> shared() const { return sh_; }

 private:
  std::shared_ptr<Shared> sh_;
  boost::asio::ip::tcp::endpoint endpoint_;
};

/// Opens the backend and the limiters of `config`, listens, and serves until
/// SIGTERM or SIGINT. Then it stops accepting, ends every waiting request,
/// releases every permit this instance holds, and returns 0.
///
/// Logs (config.server.log, to `out`) one line once listening:
///   "fairgate serve: listening on http://HOST:PORT (...)"
/// (with the real port when config.listen_port is 0), and one when stopped;
/// the library's messages go to the same log while it runs.
/// Throws ConfigError when a limiter cannot be opened with its settings and
/// std::runtime_error when it cannot listen.
int run_server(const ServeConfig& config, std::FILE* out);

}  // namespace fairgate::serve
