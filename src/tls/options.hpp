// tls/options.hpp — what a TLS client connection is asked to check (Redis's
// rediss:// URLs, the gateway's https:// upstreams), and the names its error
// lines give those settings. Plain data: no OpenSSL here (tls/client.hpp).
#pragma once

#include <string>
#include <string_view>

namespace fairgate::tls {

/// Verification is on unless verify is false: the server's chain must lead
/// to ca_file (empty: the system's CA store) and its certificate must name
/// the host connected to (or server_name if set).
struct Options {
  bool enabled = false;
  std::string ca_file;      ///< PEM CA bundle; empty: the system's default CA paths
  std::string cert_file;    ///< PEM client certificate chain (mutual TLS); needs key_file
  std::string key_file;     ///< PEM private key of cert_file
  std::string server_name;  ///< name (or IP) to verify and send as SNI; empty: the host
  bool verify = true;       ///< false: no chain or name check

  bool operator==(const Options&) const = default;
};

/// The names the error lines give the settings (a Redis URL's by default; a
/// gateway route names them upstream_ca_file, …) and the plain scheme.
struct Words {
  std::string_view ca_file = "tls_ca_file";
  std::string_view cert_file = "tls_cert_file";
  std::string_view key_file = "tls_key_file";
  std::string_view server_name = "tls_server_name";
  std::string_view plain_scheme = "redis://";
};

}  // namespace fairgate::tls
