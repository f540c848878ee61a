// gateway/upstream_stream.hpp — one connection to a route's upstream: plain
// TCP, or TLS over it (https://), and the pool that keeps idle TLS connections
// with their sessions (TlsUpstreamPool, declared in gateway/gateway.hpp).
#pragma once

#include "gateway/gateway.hpp"
#include "tls/client.hpp"

#include <boost/asio/async_result.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/beast/core/tcp_stream.hpp>

#include <optional>
#include <utility>

namespace fairgate::serve {

/// The executor a new upstream connection is made on: the io_context's own
/// when `session` is a strand of it, so that a pooled connection carries no
/// session's strand. Every completion still runs on the executor of the
/// coroutine that awaits it (the session's strand), never on the connection's.
net::any_io_executor connection_executor(const net::any_io_executor& session);

/// The connection to the upstream: plain TCP (plain(), a beast::tcp_stream, whose
/// timeouts bound every read and write), or TLS over it (https://). Reads and
/// writes go to whichever it is. Not movable once TLS started (the session
/// refers to the TCP stream): kept by unique_ptr, also in TlsUpstreamPool.
class UpstreamStream {
 public:
  using executor_type = beast::tcp_stream::executor_type;
  explicit UpstreamStream(tcp::socket socket) : tcp_(std::move(socket)) {}
  UpstreamStream(const UpstreamStream&) = delete;
  UpstreamStream& operator=(const UpstreamStream&) = delete;

  executor_type get_executor() noexcept { return tcp_.get_executor(); }
  beast::tcp_stream& plain() noexcept { return tcp_; }
  bool tls() const noexcept { return tls_.has_value(); }
  /// The TLS session's OpenSSL handle (tls() only).
  ssl_st* tls_native_handle() noexcept { return tls_->native_handle(); }
  /// A TLS session over the connected socket (before its handshake).
  net::ssl::stream<beast::tcp_stream&>& start_tls(net::ssl::context& context) {
    return tls_.emplace(tcp_, context);
  }
  /// What the TLS handshake verifies, and why it rejected: lives as long as
  /// the session, whose verify callback refers to it.
  fairgate::tls::Check& check() noexcept { return check_; }

  template <class Buffers, class Token>
  auto async_read_some(const Buffers& buffers, Token&& token) {
    return initiate(buffers, std::forward<Token>(token), [](auto& stream, const Buffers& b, auto handler) {
      stream.async_read_some(b, std::move(handler));
    });
  }
  template <class Buffers, class Token>
  auto async_write_some(const Buffers& buffers, Token&& token) {
    return initiate(buffers, std::forward<Token>(token), [](auto& stream, const Buffers& b, auto handler) {
      stream.async_write_some(b, std::move(handler));
    });
  }

 private:
  /// Starts `op` (a read or a write of `buffers`) on the TLS session if there is one, else on TCP.
  template <class Buffers, class Token, class Op>
  auto initiate(const Buffers& buffers, Token&& token, Op op) {
    return net::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
        [this, op](auto handler, const Buffers& b) {
          if (tls_) {
            op(*tls_, b, std::move(handler));
          } else {
            op(tcp_, b, std::move(handler));
          }
        },
        token, buffers);
  }

  beast::tcp_stream tcp_;
  fairgate::tls::Check check_;  // before tls_: the session's verify callback refers to it
  std::optional<net::ssl::stream<beast::tcp_stream&>> tls_;
};

}  // namespace fairgate::serve
