// serve/config.hpp — the settings of `fairgate serve`: defaults, the TOML
// file, environment overrides and command-line flags, merged and validated.
//
// Precedence (lowest first): built-in defaults, the config file, environment
// variables, flags. Every problem is reported as a ConfigError whose what() is
// one line "field: problem" (docs/api.md: exit 2 and one line naming the field).
#pragma once

#include "serve/log.hpp"
#include "tls/options.hpp"

#include <fairgate/rate_rule.hpp>
#include <fairgate/redis_backend.hpp>
#include <fairgate/settings.hpp>

#include <boost/asio/ip/address.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace fairgate::serve {

/// A bad setting; what() is "field: problem" on one line.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One limiter to open at start-up.
struct LimiterConfig {
  std::string name;
  Settings settings;  ///< includes on_redis_down and local_share (D1)
};

/// A trusted proxy: an address with a prefix length ("10.0.0.0/8", "::1/128").
struct TrustedProxy {
  boost::asio::ip::address address;
  unsigned prefix = 32;
};

/// HTTP protections (S7) and server tuning: the `[server]` table.
struct ServerLimits {
  unsigned threads = 2;                                  ///< I/O threads
  std::size_t max_connections = 10'000;                  ///< open connections at once
  std::size_t max_header_bytes = 8 * 1024;               ///< request line + headers
  std::size_t max_body_bytes = 64 * 1024;                ///< request body
  std::chrono::milliseconds header_timeout{10'000};      ///< to receive a whole request once it started
  std::chrono::milliseconds idle_timeout{60'000};        ///< keep-alive connection with no request
  std::chrono::milliseconds write_timeout{10'000};       ///< one response or event write
  std::chrono::milliseconds keepalive_interval{15'000};  ///< SSE ": keepalive" comments
  std::chrono::milliseconds events_interval{1'000};      ///< GET /v1/events snapshot period
  std::size_t max_waiters_per_client = 1'000;            ///< waiting acquires per client address
  std::chrono::milliseconds lease{60'000};               ///< JSON permit lease (default)
  std::chrono::milliseconds max_lease{3'600'000};        ///< longest lease a client may ask for
  std::chrono::milliseconds shutdown_grace{5'000};       ///< SIGTERM: wait this long for connections to end
  /// Browser pages allowed to use the admission API (CORS): normalized
  /// origins ("https://app.example.com"), or {"*"}; empty = none (the default).
  std::vector<std::string> cors_origins;
  /// Peers whose X-Forwarded-For is believed (the client IP of rate-limit
  /// keys); empty = none: the client IP is always the peer's address.
  std::vector<TrustedProxy> trusted_proxies;
  /// The log: server.log_level, server.log_format, server.access_log.
  LogConfig log;
};

/// One part of the key a gateway route derives for a rate-limit rule (R2).
enum class RateKeyPart : std::uint8_t {
  header,  ///< the value of a request header (`header:X-User-Id`)
  tenant,  ///< the route's tenant (its tenant_header's value)
  ip,      ///< the client's address (X-Forwarded-For only from server.trusted_proxies)
  route,   ///< the route's path
  global,  ///< one key for every request ("global")
};

struct RateKeySpec {
  RateKeyPart part = RateKeyPart::global;
  std::string header;  ///< part == header: the header's name
};

/// What one gateway request costs a rule.
enum class RateCostMode : std::uint8_t {
  fixed,   ///< `cost` units (default 1)
  tokens,  ///< max_tokens (or default_max_tokens) + the prompt's estimate; refunded from `usage`
};

/// One `[ratelimit.NAME]` table (docs/ratelimit.md, "In fairgate serve").
struct RateRuleConfig {
  std::string name;
  RateRule rule;
  /// Gateway routes: how the key is derived; several parts = a composite key.
  /// Empty: the rule is only for POST /v1/ratelimit/{rule} (a route may not name it).
  std::vector<RateKeySpec> key;
  RateCostMode cost_mode = RateCostMode::fixed;
  std::int64_t cost = 1;
  /// cost = "tokens": what a request without max_tokens reserves for its answer.
  std::int64_t default_max_tokens = 1024;
  /// cost = "tokens": prompt characters per token for the prompt's estimate.
  std::int64_t chars_per_token = 4;
};

/// What a gateway route sends while a streaming request waits (docs/api.md).
enum class QueueEvents : std::uint8_t {
  comment,  ///< ": queued position=3 queued=10" SSE comments (every client ignores them)
  named,    ///< "event: queue" with {"position","queued"}
  seed,     ///< comments while waiting; the seeds' META / REJECT / FINISH / DONE on rejection
  none,     ///< nothing: the response waits for admission, so a timeout is a real 429
};

std::string_view to_string(QueueEvents mode) noexcept;

/// One `[[route]]`: a path prefix proxied to an upstream through a limiter.
struct RouteConfig {
  std::string path;      ///< prefix on segment boundaries: "/v1/chat/completions"
  std::string upstream;  ///< as written: "http://127.0.0.1:9000[/base]" or "https://…"
  std::string upstream_host;
  std::uint16_t upstream_port = 80;  ///< 443 by default for https://
  /// https://: TLS to the upstream (its certificate and name verified unless
  /// upstream_tls_verify is false). Pooled with their sessions (TlsUpstreamPool).
  bool upstream_tls = false;
  std::string upstream_ca_file;    ///< PEM CA bundle; empty: the system's CA certificates
  std::string upstream_cert_file;  ///< PEM client certificate (mutual TLS), with upstream_key_file
  std::string upstream_key_file;
  /// The name (or IP) the certificate must carry, and the SNI sent; empty: the URL's host.
  std::string upstream_server_name;
  bool upstream_tls_verify = true;  ///< false: no chain or name check (tests, never production)
  /// With a path in the upstream URL (even "/"), the matched route prefix is
  /// replaced by it (nginx proxy_pass semantics); without one the target is sent unchanged.
  bool upstream_has_path = false;
  std::string upstream_base;  ///< that path without a trailing slash
  std::string limiter;        ///< empty = none: proxied at once, without a permit (no queue, no queue events)
  std::string tenant_header;  ///< empty = no tenant
  QueueEvents queue_events = QueueEvents::comment;
  std::optional<std::chrono::milliseconds> max_wait;  ///< unset: the limiter's max_wait
  std::chrono::milliseconds connect_timeout{5'000};
  /// Upstream response headers must arrive within this, and no gap between
  /// body bytes may be longer.
  std::chrono::milliseconds upstream_timeout{300'000};
  std::size_t max_body_bytes = 4 * 1024 * 1024;  ///< request body
  std::size_t pool_size = 64;                    ///< idle keep-alive connections kept to the upstream
  /// Rate-limit rules checked (all must allow) before the concurrency queue.
  std::vector<std::string> ratelimit;
};

struct ServeConfig {
  std::string listen_host = "127.0.0.1";
  std::uint16_t listen_port = 8080;  ///< 0 = any free port (printed at start)
  /// Set: the Redis backend with these options; unset: the memory backend.
  std::optional<RedisBackendOptions> redis;
  std::string instance;     ///< instance id (Redis); empty = generated
  std::string admin_token;  ///< empty = admin routes always answer 401
  std::vector<LimiterConfig> limiters;
  ServerLimits server;
  std::vector<RouteConfig> routes;
  std::vector<RateRuleConfig> rate_rules;  ///< `[ratelimit.NAME]`, in file order
};

/// What the command line gave (already parsed; unset = not given).
struct ServeFlags {
  std::optional<std::string> config_file;
  std::optional<std::string> listen;
  std::optional<std::string> redis_url;
  std::optional<std::string> instance;
  std::optional<std::string> admin_token;
  std::optional<std::string> log_level;   ///< --log-level (checked by load_config)
  std::optional<std::string> log_format;  ///< --log-format
  std::optional<std::string> access_log;  ///< --access-log on|off
  std::vector<LimiterConfig> limiters;    ///< replace file limiters of the same name
};

/// Reads an environment variable; nullptr when unset.
using EnvLookup = std::function<const char*(const char*)>;

/// The environment variables load_config() reads, for --help and docs.
inline constexpr const char* kEnvHelp =
    "FAIRGATE_CONFIG (config file), FAIRGATE_LISTEN, FAIRGATE_REDIS, FAIRGATE_INSTANCE, "
    "FAIRGATE_ADMIN_TOKEN, FAIRGATE_THREADS, FAIRGATE_LOG_LEVEL, FAIRGATE_LOG_FORMAT";

/// Merges defaults, the file (flags.config_file, else $FAIRGATE_CONFIG), the
/// environment and the flags, and validates the result. Throws ConfigError.
ServeConfig load_config(const ServeFlags& flags, const EnvLookup& env);

/// Reads an upstream URL "http[s]://HOST[:PORT][/base]" into `route`. Throws ConfigError naming `field`.
void parse_upstream(std::string_view url, std::string_view field, RouteConfig& route);

/// An https:// route's TLS settings (tls/options.hpp), and the keys its error lines name.
tls::Options upstream_tls_options(const RouteConfig& route);
inline constexpr tls::Words kUpstreamTlsWords{"upstream_ca_file", "upstream_cert_file", "upstream_key_file",
                                              "upstream_server_name", "http://"};

/// Whether `client` is inside one of `proxies`.
bool is_trusted_proxy(const boost::asio::ip::address& client, const std::vector<TrustedProxy>& proxies);

/// Reads "HOST:PORT" as http::parse_listen does ("[::1]:8080", "localhost:0",
/// ":8080" = loopback, "*:8080" = every interface). Throws ConfigError naming `field`.
void parse_listen(std::string_view text, std::string_view field, ServeConfig& out);

}  // namespace fairgate::serve
