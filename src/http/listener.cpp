// http/listener.cpp — the accept loop (http/listener.hpp).
#include "http/listener.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>

namespace fairgate::http {

namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

/// A new strand for one connection. A strand of the io_context's own
/// executor fits inside any_io_executor; a strand of an any_io_executor would
/// be a heap-allocated, reference-counted executor for every connection (and
/// its atomics are what ThreadSanitizer cannot follow through Boost's fences).
net::any_io_executor new_strand(const net::any_io_executor& executor) {
  if (const auto* io = executor.target<net::io_context::executor_type>()) return net::make_strand(*io);
  return net::make_strand(executor);
}

}  // namespace

boost::asio::awaitable<void> accept_loop(tcp::acceptor& acceptor, net::any_io_executor executor,
                                         ListenerHooks hooks) {
  constexpr auto nothrow = net::as_tuple(net::use_awaitable);
  for (;;) {
    tcp::socket socket(new_strand(executor));
    auto [ec] = co_await acceptor.async_accept(socket, nothrow);
    if (hooks.stopping && hooks.stopping()) co_return;
    if (ec) {
      if (ec == net::error::operation_aborted || ec == net::error::bad_descriptor) co_return;
      // Out of descriptors and the like: back off a little, then go on.
      net::steady_timer pause(acceptor.get_executor(), std::chrono::milliseconds(50));
      co_await pause.async_wait(nothrow);
      continue;
    }
    boost::system::error_code oec;
    if (hooks.full && hooks.full()) {
      if (hooks.refused) hooks.refused();
      // A fixed answer, written without waiting: a full server spends nothing on it.
      socket.non_blocking(true, oec);
      socket.write_some(net::buffer(hooks.busy), oec);
      socket.shutdown(tcp::socket::shutdown_both, oec);
      socket.close(oec);
      continue;
    }
    socket.set_option(tcp::no_delay(true), oec);
    hooks.accepted(std::move(socket));
  }
}

}  // namespace fairgate::http
