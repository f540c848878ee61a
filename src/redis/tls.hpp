// redis/tls.hpp — TLS to Redis (rediss://) on Asio SSL with OpenSSL: the
// client context of one TlsOptions, and the per-connection setup (which name
// to verify, SNI) and error texts (docs/redis-cluster.md, "TLS").
//
// Kept out of connection.hpp so that only connection.cpp and tls.cpp pay for
// the OpenSSL and asio/ssl headers.
#pragma once

#include "redis/url.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>

#include <memory>
#include <string>
#include <variant>

namespace fairgate::redis {

/// The client context for `tls` (CA file or the system's CA paths, the
/// client certificate and key, verification mode), or one line saying what
/// is wrong ("tls_ca_file '/x': cannot read it: No such file or directory").
std::variant<std::shared_ptr<boost::asio::ssl::context>, std::string> make_tls_context(const TlsOptions& tls);

/// One TLS session over a connection's socket (a new one per connect: a
/// session cannot be reused after a drop).
struct TlsStream {
  TlsStream(boost::asio::ip::tcp::socket& socket, boost::asio::ssl::context& context)
      : stream(socket, context) {}
  boost::asio::ssl::stream<boost::asio::ip::tcp::socket&> stream;
  std::string expected_name;  ///< what the certificate must name
  std::string rejected;       ///< the certificate verification rejected, and why (empty: none)
};

/// Sets SNI (host names only) and the name or IP the certificate must carry,
/// and records why a certificate is rejected. Empty, or what went wrong.
std::string prepare_tls_stream(TlsStream& tls, const Endpoint& endpoint);

/// One line for a failed handshake: verification (which name, which
/// certificate, why) or the TLS error, naming the server.
std::string describe_handshake_failure(TlsStream& tls, const Endpoint& endpoint,
                                       const boost::system::error_code& ec);

}  // namespace fairgate::redis
