// http/listener.hpp — the accept loop every fairgate server runs: each
// connection gets its own strand and TCP_NODELAY (events and tokens are small
// writes that must leave at once), a server over its connection cap answers
// a fixed 503 and closes, and a transient accept failure (out of descriptors)
// backs off instead of spinning. Runs on the acceptor's strand until the
// acceptor is closed or `stopping` says so.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <functional>
#include <string_view>

namespace fairgate::http {

struct ListenerHooks {
  /// True once the server stops: the loop ends (the socket just accepted is dropped).
  std::function<bool()> stopping;
  /// True when the server has as many connections as it takes (empty: no cap).
  std::function<bool()> full;
  /// A connection refused because the server was full (before `busy` is written).
  std::function<void()> refused;
  /// A new connection, on its own strand: the server starts its session.
  std::function<void(boost::asio::ip::tcp::socket)> accepted;
  /// The whole answer written to a refused connection (a complete HTTP response).
  std::string_view busy;
};

/// Accepts connections on `acceptor` (whose executor should be a strand),
/// each on a new strand of `executor`, until the acceptor closes.
boost::asio::awaitable<void> accept_loop(boost::asio::ip::tcp::acceptor& acceptor,
                                         boost::asio::any_io_executor executor, ListenerHooks hooks);

}  // namespace fairgate::http
