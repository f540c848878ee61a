// http/pool.hpp — the client side's keep-alive pool: idle connections to one
// server, taken by whichever strand needs one next.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <chrono>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>

namespace fairgate::http {

/// Whether an idle keep-alive connection can carry another request: still
/// open, with nothing unread (EOF, an error or stray bytes — such as a TLS
/// close_notify — mean the server closed it or broke the exchange).
bool idle_connection_usable(int fd) noexcept;

/// Idle keep-alive connections to one server (a gateway route's upstream),
/// shared by every strand.
///
/// Connections are kept as bare file descriptors and re-wrapped on the
/// caller's strand, so a connection never carries the executor of the
/// session that opened it. Thread-safe.
class ConnectionPool {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ConnectionPool(std::size_t capacity) : capacity_(capacity) {}
  ~ConnectionPool();
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  /// A live idle connection re-made on `executor`, or nullopt. Connections the
  /// upstream closed meanwhile, or idle longer than kMaxIdle, are dropped.
  std::optional<boost::asio::ip::tcp::socket> take(const boost::asio::any_io_executor& executor);
  /// Keeps `socket` for reuse (closes it when the pool is full).
  void put(boost::asio::ip::tcp::socket socket);
  /// The idle connections that can carry a request: those the upstream closed
  /// meanwhile, or idle longer than kMaxIdle, are dropped first (as take() would).
  std::size_t idle();

  static constexpr std::chrono::seconds kMaxIdle{30};

 private:
  struct Idle {
    int fd;
    bool v6;
    Clock::time_point since;
  };
  mutable std::mutex mu_;
  std::deque<Idle> idle_;
  std::size_t capacity_;
};

}  // namespace fairgate::http
