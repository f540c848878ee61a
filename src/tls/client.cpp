// tls/client.cpp — see tls/client.hpp.
#include "tls/client.hpp"

#include <boost/asio/error.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ssl/error.hpp>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <fmt/format.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace fairgate::tls {

namespace ssl = boost::asio::ssl;

namespace {

/// "tls_ca_file '/x': cannot read it: No such file or directory", or empty. A device or a
/// FIFO is refused too: OpenSSL would read /dev/zero for ever.
std::string unreadable(const char* field, const std::string& path) {
  if (::access(path.c_str(), R_OK) != 0)
    return std::string(field) + " '" + path + "': cannot read it: " + std::strerror(errno);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    return std::string(field) + " '" + path + "': not a regular file";
  return {};
}

std::string name_of(X509_NAME* name) {
  if (!name) return "?";
  char buf[512];
  X509_NAME_oneline(name, buf, sizeof buf);
  return buf;
}

}  // namespace

std::variant<std::shared_ptr<ssl::context>, std::string> make_context(const Options& tls,
                                                                      const Words& words) {
  const std::string ca_field(words.ca_file), cert_field(words.cert_file), key_field(words.key_file);
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                   ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
  boost::system::error_code ec;
  if (tls.verify) {
    if (!tls.ca_file.empty()) {
      if (auto problem = unreadable(ca_field.c_str(), tls.ca_file); !problem.empty()) return problem;
      ctx->load_verify_file(tls.ca_file, ec);
      if (ec)
        return ca_field + " '" + tls.ca_file + "': not a PEM CA certificate bundle (" + ec.message() + ")";
    } else {
      ctx->set_default_verify_paths(ec);
      if (ec)
        return "the system's CA certificates could not be loaded (" + ec.message() + "); set " + ca_field;
    }
    ctx->set_verify_mode(ssl::verify_peer, ec);
  } else {
    ctx->set_verify_mode(ssl::verify_none, ec);
  }
  if (!tls.cert_file.empty()) {
    if (auto problem = unreadable(cert_field.c_str(), tls.cert_file); !problem.empty()) return problem;
    if (auto problem = unreadable(key_field.c_str(), tls.key_file); !problem.empty()) return problem;
    ctx->use_certificate_chain_file(tls.cert_file, ec);
    if (ec) return cert_field + " '" + tls.cert_file + "': not a PEM certificate (" + ec.message() + ")";
    ctx->use_private_key_file(tls.key_file, ssl::context::pem, ec);
    if (ec)
      return key_field + " '" + tls.key_file + "': not the PEM private key of " + cert_field + " (" +
             ec.message() + ")";
  }
  return ctx;
}

std::string prepare(SSL* ssl, Check& check, const std::string& host, const Options& options) {
  const std::string& name = options.server_name.empty() ? host : options.server_name;
  check.expected_name = name;
  check.rejected.clear();
  boost::system::error_code not_ip;
  boost::asio::ip::make_address(name, not_ip);
  // SNI carries host names only (RFC 6066), never an IP address.
  if (not_ip && SSL_set_tlsext_host_name(ssl, name.c_str()) != 1) return "cannot set SNI '" + name + "'";
  if (!options.verify) return {};
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  if (not_ip) {
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    if (X509_VERIFY_PARAM_set1_host(param, name.c_str(), name.size()) != 1)
      return "cannot verify against the name '" + name + "'";
  } else if (X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str()) != 1) {
    return "cannot verify against the address '" + name + "'";
  }
  return {};
}

std::function<bool(bool, ssl::verify_context&)> remember_rejection(Check& check) {
  // OpenSSL checks the chain and the name; this only remembers which
  // certificate it rejected and why, for the error line.
  return [&check](bool preverified, ssl::verify_context& vc) {
    if (!preverified && check.rejected.empty()) {
      X509_STORE_CTX* store = vc.native_handle();
      X509* cert = X509_STORE_CTX_get_current_cert(store);
      check.rejected = "certificate " + name_of(cert ? X509_get_subject_name(cert) : nullptr) +
                       " (issued by " + name_of(cert ? X509_get_issuer_name(cert) : nullptr) +
                       "): " + X509_verify_cert_error_string(X509_STORE_CTX_get_error(store));
    }
    return preverified;
  };
}

std::string describe_handshake_failure(SSL* ssl, const Check& check, const std::string& host,
                                       std::uint16_t port, const Options& options,
                                       const boost::system::error_code& ec, const Words& words) {
  const bool ipv6 = host.find(':') != std::string::npos;
  const std::string where = (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  const long result = SSL_get_verify_result(ssl);
  if (!check.rejected.empty() || (options.verify && result != X509_V_OK)) {
    const std::string why = check.rejected.empty() ? X509_verify_cert_error_string(result) : check.rejected;
    return fmt::format(
        "TLS certificate verification failed for {} (expected name '{}'): {} ({}: the CA that signed it{})",
        where, check.expected_name, why, words.ca_file,
        words.server_name.empty() ? std::string()
                                  : fmt::format("; {}: the name it carries", words.server_name));
  }
  std::string line = "TLS handshake with " + where + " failed: " + ec.message();
  const std::string reason =
      ec.category() == boost::asio::error::get_ssl_category()
          ? std::string(ERR_reason_error_string(ec.value()) ? ERR_reason_error_string(ec.value()) : "")
          : std::string();
  if (ec == boost::asio::ssl::error::stream_truncated || ec == boost::asio::error::eof ||
      ec == boost::asio::error::connection_reset ||
      reason.find("wrong version number") != std::string::npos ||
      reason.find("packet length too long") != std::string::npos)
    line += fmt::format(
        " (is it a plain, non-TLS port? then use {}; or does it want a client certificate: {}, {}?)",
        words.plain_scheme, words.cert_file, words.key_file);
  return line;
}

}  // namespace fairgate::tls
