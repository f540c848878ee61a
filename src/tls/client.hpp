// tls/client.hpp — the client side of TLS on Asio SSL with OpenSSL, for any
// connection (Redis, the gateway's upstreams): the context of one Options,
// the per-session setup (SNI, the name or address to verify) and the error
// lines that say what failed and which setting fixes it.
#pragma once

#include "tls/options.hpp"

#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/verify_context.hpp>
#include <boost/system/error_code.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <variant>

namespace fairgate::tls {

/// The client context for `options` (CA file or the system's CA paths, the
/// client certificate and key, verification mode), or one line saying what
/// is wrong ("tls_ca_file '/x': cannot read it: No such file or directory";
/// a file that is not a regular one is refused: OpenSSL would read /dev/zero
/// for ever).
std::variant<std::shared_ptr<boost::asio::ssl::context>, std::string> make_context(const Options& options,
                                                                                   const Words& words = {});

/// What one handshake checks, and why it rejected a certificate.
struct Check {
  std::string expected_name;  ///< what the certificate must name
  std::string rejected;       ///< the certificate verification rejected, and why (empty: none)
};

/// Sets SNI (host names only) and the name or IP the certificate must carry
/// (options.server_name, else `host`) on `ssl`, a new session. Empty, or what
/// went wrong. With verification on, the stream's verify callback should be
/// remember_rejection(check).
std::string prepare(SSL* ssl, Check& check, const std::string& host, const Options& options);

/// A verify callback that keeps OpenSSL's verdict and records in `check`
/// which certificate it rejected and why.
std::function<bool(bool, boost::asio::ssl::verify_context&)> remember_rejection(Check& check);

/// One line for a failed handshake with host:port: verification (which name,
/// which certificate, why, which setting) or the TLS error (a plain port?).
std::string describe_handshake_failure(SSL* ssl, const Check& check, const std::string& host,
                                       std::uint16_t port, const Options& options,
                                       const boost::system::error_code& ec, const Words& words = {});

}  // namespace fairgate::tls
