// serve/upstream_tls.hpp — a route's https:// upstream as the TLS code of
// redis/tls.hpp takes it: the options (CA file, client certificate, whether
// to verify), the endpoint (the name the certificate must carry is the URL's
// host) and the words its error lines use for the route's keys.
#pragma once

#include "redis/tls.hpp"
#include "serve/config.hpp"

namespace fairgate::serve {

/// The route keys named in TLS error lines; "http://" for a plain port.
inline constexpr redis::TlsWords kUpstreamTlsWords{"upstream_ca_file", "upstream_cert_file",
                                                   "upstream_key_file", "upstream_server_name", "http://"};

inline redis::TlsOptions upstream_tls_options(const RouteConfig& r) {
  redis::TlsOptions o;
  o.enabled = r.upstream_tls;
  o.ca_file = r.upstream_ca_file;
  o.cert_file = r.upstream_cert_file;
  o.key_file = r.upstream_key_file;
  o.server_name = r.upstream_server_name;
  o.verify = r.upstream_tls_verify;
  return o;
}

inline redis::Endpoint upstream_endpoint(const RouteConfig& r) {
  redis::Endpoint e;
  e.host = r.upstream_host;
  e.port = r.upstream_port;
  e.tls = upstream_tls_options(r);
  return e;
}

}  // namespace fairgate::serve
