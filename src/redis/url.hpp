// redis/url.hpp — the Redis URLs fairgate accepts:
//   redis://[user:password@]host[:port][/db]                       one server
//   redis+cluster://[user:password@]host:port[,host:port...]       Redis Cluster seeds
//   redis+sentinel://[user:password@]host:port[,host:port...]/master_name[/db]
//       [?sentinel_user=...&sentinel_password=...]   (the sentinels' own AUTH)
// and the same with TLS: rediss://, rediss+cluster://, rediss+sentinel://,
// each taking ?tls_ca_file=...&tls_cert_file=...&tls_key_file=...
// &tls_server_name=...&tls_verify=full|none (docs/redis-cluster.md, "TLS").
#pragma once

#include "tls/options.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace fairgate::redis {

/// TLS to Redis (rediss://): tls/options.hpp.
using TlsOptions = tls::Options;

struct Endpoint {
  std::string host = "127.0.0.1";
  std::uint16_t port = 6379;
  std::string user;      ///< empty: AUTH with the password only (or no AUTH)
  std::string password;  ///< empty: no AUTH
  int db = 0;
  TlsOptions tls;

  /// The URL again, with the password masked ("redis://user:***@host:port/db").
  std::string redacted() const;
};

/// The endpoint, or one line saying what is wrong with the URL.
/// Accepts: redis://host, redis://host:port, redis://:password@host:port,
/// redis://user:password@host:port/db, and IPv6 hosts in brackets.
/// Percent-escapes in user and password are decoded. rediss:// is the same
/// with TLS, and takes the tls_* query parameters (url.hpp's header comment).
std::variant<Endpoint, std::string> parse_url(std::string_view url);

/// Where the limiters' state lives: one server, a Cluster, or the master a
/// set of Sentinels names.
struct Target {
  enum class Kind { standalone, cluster, sentinel };
  Kind kind = Kind::standalone;
  /// standalone: the server; cluster: the seed nodes; sentinel: the sentinels.
  /// Every node carries the URL's user, password (and, standalone or
  /// sentinel, db: the data node's database).
  std::vector<Endpoint> nodes;
  std::string master_name;  ///< sentinel only
  /// Sentinel only: AUTH for the sentinels themselves (requirepass or an ACL
  /// user in sentinel.conf), from ?sentinel_user=&sentinel_password=. Empty
  /// password: the sentinels are asked without AUTH.
  std::string sentinel_user;
  std::string sentinel_password;

  /// The URL again, password masked.
  std::string redacted() const;

  /// Sentinel `i` as fairgate connects to it: the sentinels' own
  /// credentials (?sentinel_user=, ?sentinel_password=), never the data
  /// node's, and database 0.
  Endpoint sentinel(std::size_t i) const;
};

/// The target, or one line saying what is wrong with the URL. Accepts every
/// form of parse_url, and redis+cluster:// and redis+sentinel:// (above), and
/// their rediss variants (TLS to every node: data nodes and sentinels alike).
/// The user and password apply to every node of a cluster; for Sentinel they
/// are the master's (the sentinels are asked without AUTH unless
/// ?sentinel_password= is given; see docs/redis-cluster.md).
std::variant<Target, std::string> parse_target(std::string_view url);

}  // namespace fairgate::redis
