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
#include <boost/asio/ssl/verify_context.hpp>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <variant>

namespace fairgate::redis {

/// The names the error lines give the settings (Redis URLs' by default; the
/// gateway's routes name theirs upstream_ca_file, …) and the plain scheme.
struct TlsWords {
  std::string_view ca_file = "tls_ca_file";
  std::string_view cert_file = "tls_cert_file";
  std::string_view key_file = "tls_key_file";
  std::string_view server_name = "tls_server_name";  ///< empty: no such setting
  std::string_view plain_scheme = "redis://";
};

/// The client context for `tls` (CA file or the system's CA paths, the
/// client certificate and key, verification mode), or one line saying what
/// is wrong ("tls_ca_file '/x': cannot read it: No such file or directory").
std::variant<std::shared_ptr<boost::asio::ssl::context>, std::string> make_tls_context(
    const TlsOptions& tls, const TlsWords& words = {});

/// What one handshake checks, and why it rejected a certificate.
struct TlsCheck {
  std::string expected_name;  ///< what the certificate must name
  std::string rejected;       ///< the certificate verification rejected, and why (empty: none)
};

/// Sets SNI (host names only) and the name or IP the certificate must carry
/// on `ssl` (a new session). Empty, or what went wrong. With verification on,
/// the stream's verify callback should be remember_rejection(check).
std::string prepare_tls(SSL* ssl, TlsCheck& check, const Endpoint& endpoint);
/// A verify callback that keeps OpenSSL's verdict and records in `check`
/// which certificate it rejected and why.
std::function<bool(bool, boost::asio::ssl::verify_context&)> remember_rejection(TlsCheck& check);

/// One line for a failed handshake: verification (which name, which
/// certificate, why) or the TLS error, naming the server.
std::string describe_handshake_failure(SSL* ssl, const TlsCheck& check, const Endpoint& endpoint,
                                       const boost::system::error_code& ec, const TlsWords& words);

/// One TLS session over a Redis connection's socket (a new one per connect: a
/// session cannot be reused after a drop).
struct TlsStream {
  TlsStream(boost::asio::ip::tcp::socket& socket, boost::asio::ssl::context& context)
      : stream(socket, context) {}
  boost::asio::ssl::stream<boost::asio::ip::tcp::socket&> stream;
  TlsCheck check;
};

/// prepare_tls() and the verify callback for a Redis connection.
std::string prepare_tls_stream(TlsStream& tls, const Endpoint& endpoint);

/// describe_handshake_failure() with the Redis URL's words.
std::string describe_handshake_failure(TlsStream& tls, const Endpoint& endpoint,
                                       const boost::system::error_code& ec);

}  // namespace fairgate::redis
