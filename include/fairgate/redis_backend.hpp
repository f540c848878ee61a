// fairgate/redis_backend.hpp — the cluster-wide backend: limiters shared by
// every instance that points at the same Redis (standalone Redis 7, a Redis
// Cluster or a Sentinel-managed master: docs/redis-cluster.md).
//
// Each Backend object is one *instance*: it has its own instance id, one
// command connection and one Pub/Sub connection, and heartbeats every open
// limiter so that a crashed instance's permits and waiters are reaped within
// liveness_ttl + heartbeat_interval (F5).
#pragma once

#include <fairgate/backend.hpp>

#include <boost/asio/any_io_executor.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace fairgate {

struct RedisBackendOptions {
  /// redis://[user:password@]host[:port][/db],
  /// redis+cluster://[user:password@]host:port[,host:port...] (seeds), or
  /// redis+sentinel://[user:password@]host:port[,...]/master_name[/db];
  /// rediss://, rediss+cluster://, rediss+sentinel:// for TLS, with
  /// ?tls_ca_file=...&tls_cert_file=...&tls_key_file=...&tls_server_name=...
  /// &tls_verify=full|none (docs/redis-cluster.md, "TLS").
  std::string url = "redis://127.0.0.1:6379";
  /// TLS files for a rediss... URL (the URL's tls_* parameters win over
  /// these): the CA to trust instead of the system store, and a client
  /// certificate and key (both or neither). Refused with a plain URL.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  /// Every key is "<key_prefix>:{<limiter>}:...".
  std::string key_prefix = "fairgate";
  /// This instance's id, [A-Za-z0-9._-]{1,128}. Empty: hostname-pid-random.
  std::string instance_id;
  /// How often each open limiter heartbeats (liveness, reaping, lost-wake sync).
  std::chrono::milliseconds heartbeat_interval{1000};
  /// An instance that has not heartbeated for this long is dead: its permits
  /// return and its waiters leave. Must be greater than heartbeat_interval.
  std::chrono::milliseconds liveness_ttl{3000};
  /// Timeout of one Redis command.
  std::chrono::milliseconds command_timeout{200};
  /// The keys of a limiter nobody heartbeats expire after this long
  /// (refreshed every key_expiry / 4, at least every 10th heartbeat). 0 = never expire.
  std::chrono::milliseconds key_expiry = std::chrono::hours(1);
  /// Recovery fence: when a heartbeat finds a limiter's state gone (a new
  /// limiter, FLUSHALL, a restart without persistence) it re-creates it, and
  /// nothing is granted for this long, so every instance that was alive can
  /// re-register its running permits before the count is trusted again (D3).
  /// std::nullopt = liveness_ttl + heartbeat_interval (every live instance has
  /// heartbeated by then). 0 = no fence: grants resume at once, and the cap
  /// can be exceeded by the permits not yet re-registered (docs/design.md).
  std::optional<std::chrono::milliseconds> recovery_fence;
  /// Commands must keep failing (timeouts, no connection) for this long before
  /// a limiter applies its on_redis_down policy; shorter hiccups only delay
  /// requests (they are retried, never rejected for it).
  std::chrono::milliseconds degrade_after{1000};
  /// Redis must answer for this long before a degraded limiter hands its
  /// permits and waiters back to Redis (hysteresis: a flapping link does not
  /// flap the mode).
  std::chrono::milliseconds recover_after{1000};
  /// Receives one line per state change (degraded, restored, fence, settings
  /// adopted from Redis, ...). Empty: to the process-wide log sink
  /// (fairgate/log.hpp; by default stderr), with a level.
  std::function<void(std::string_view line)> log;

  /// The fence in force: recovery_fence, or liveness_ttl + heartbeat_interval.
  std::chrono::milliseconds fence() const {
    return recovery_fence.value_or(liveness_ttl + heartbeat_interval);
  }
};

/// std::nullopt if the options are acceptable, else the first problem found.
std::optional<SettingsError> validate(const RedisBackendOptions& options);

/// The id an instance gets when RedisBackendOptions::instance_id is empty:
/// "<hostname>-<pid>-<8 random hex digits>", new at every call.
std::string default_instance_id();

/// The Redis backend. Timers, Redis I/O and on_queued callbacks run on
/// `executor`. Throws std::invalid_argument ("field: problem") when
/// validate(options) fails. Connecting is asynchronous and retried in the
/// background. A request never fails because one Redis call did: it is
/// retried (idempotently) within its max_wait; when Redis stays unreachable
/// for degrade_after, each limiter follows Settings::on_redis_down.
///
/// Lifetime: as for every backend, destroy it (and release every Permit it
/// granted) before the io_context its executor belongs to. After shutdown()
/// the limiters keep heartbeating while this instance still holds permits, so
/// running work stays counted cluster-wide until it is released.
std::shared_ptr<Backend> make_redis_backend(boost::asio::any_io_executor executor,
                                            RedisBackendOptions options);

}  // namespace fairgate
