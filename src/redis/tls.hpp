// redis/tls.hpp — TLS to Redis (rediss://) on Asio SSL with OpenSSL: the
// client context of one TlsOptions, and the per-connection setup (which name
// to verify, SNI) and error texts (docs/redis-cluster.md, "TLS").
//
// Kept out of connection.hpp so that only connection.cpp and tls.cpp pay for
// the OpenSSL and asio/ssl headers.
#pragma once

#include "redis/url.hpp"
#include "tls/client.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/ssl/verify_context.hpp>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <variant>

namespace fairgate::redis {

/// tls::make_context() with a Redis URL's words.
std::variant<std::shared_ptr<boost::asio::ssl::context>, std::string> make_tls_context(const TlsOptions& tls);

/// One TLS session over a Redis connection's socket (a new one per connect: a
/// session cannot be reused after a drop).
struct TlsStream {
  TlsStream(boost::asio::ip::tcp::socket& socket, boost::asio::ssl::context& context)
      : stream(socket, context) {}
  boost::asio::ssl::stream<boost::asio::ip::tcp::socket&> stream;
  fairgate::tls::Check check;
};

/// tls::prepare() and the verify callback for a Redis connection.
std::string prepare_tls_stream(TlsStream& tls, const Endpoint& endpoint);

/// tls::describe_handshake_failure() with a Redis URL's words.
std::string describe_handshake_failure(TlsStream& tls, const Endpoint& endpoint,
                                       const boost::system::error_code& ec);

}  // namespace fairgate::redis
