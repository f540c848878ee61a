// http/connections.hpp — what every server keeps of its open connections: a
// registry (so a stop can reach each one) and the life of one connection
// (serve it, then shut it down and close it; an exception, a bug, costs only
// that connection). Thread-safe: sessions come and go on their own strands.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace fairgate::http {

/// One client connection: its stream, its read buffer (bounded) and its id
/// in Connections. A server's session type derives from it.
struct Connection {
  Connection(boost::asio::ip::tcp::socket socket, std::uint64_t connection_id, std::size_t buffer_limit)
      : stream(std::move(socket)), buffer(buffer_limit), id(connection_id) {}

  /// On the connection's strand: closes the socket; every pending operation ends.
  void close() {
    boost::system::error_code ec;
    stream.socket().shutdown(boost::asio::ip::tcp::socket::shutdown_both, ec);
    stream.close();
  }

  boost::beast::tcp_stream stream;
  boost::beast::flat_buffer buffer;
  std::uint64_t id;
};

/// The open sessions of a server, by id (weakly: a session lives as long as its coroutine).
template <class Session>
class Connections {
 public:
  /// Registers the session `make(id)` returns (a shared_ptr<Session>) under a new id.
  template <class Make>
  std::shared_ptr<Session> add(Make make) {
    std::lock_guard lock(mu_);
    const std::uint64_t id = next_id_++;
    std::shared_ptr<Session> session = make(id);
    sessions_.emplace(id, session);
    return session;
  }
  void remove(std::uint64_t id) {
    std::lock_guard lock(mu_);
    sessions_.erase(id);
  }
  std::size_t size() const {
    std::lock_guard lock(mu_);
    return sessions_.size();
  }
  /// The sessions still open (a stop posts close() to each, on its strand).
  std::vector<std::shared_ptr<Session>> all() const {
    std::vector<std::shared_ptr<Session>> out;
    std::lock_guard lock(mu_);
    for (const auto& [id, weak] : sessions_)
      if (auto s = weak.lock()) out.push_back(std::move(s));
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::uint64_t, std::weak_ptr<Session>> sessions_;
  std::uint64_t next_id_ = 1;
};

/// Runs `serve` (an awaitable<void>) for the connection on `stream` (a
/// beast::tcp_stream), then shuts its sending side down and closes it.
template <class Stream, class Awaitable>
boost::asio::awaitable<void> run_connection(Stream& stream, Awaitable serve) {
  try {
    co_await std::move(serve);
  } catch (const std::exception&) {
    // A bug if it happens, but it must only cost this connection.
  }
  boost::system::error_code ec;
  stream.socket().shutdown(boost::asio::ip::tcp::socket::shutdown_send, ec);
  stream.close();
}

}  // namespace fairgate::http
