// redis/client.hpp — the seam between the limiter and Redis: one interface,
// three clients (docs/redis-cluster.md).
//
//  * standalone (redis://): one command connection and one Pub/Sub connection;
//  * Sentinel (redis+sentinel://): the same two connections, pointed at the
//    master the sentinels name, moved on +switch-master;
//  * Cluster (redis+cluster://): one pipelined command connection per master
//    (chosen by the key's hash slot), MOVED/ASK/TRYAGAIN/CLUSTERDOWN handled
//    here, and one shard-channel (SSUBSCRIBE) connection per master that owns
//    a wake channel.
//
// Routing is by key: every command of one limiter names a key with the
// limiter's hash tag ({name}), so all of them go to the master that owns it.
// Wake messages are sharded Pub/Sub everywhere (SPUBLISH in the scripts,
// SSUBSCRIBE here; standalone Redis 7 has them too): one code path.
//
// Invariants (each client):
//  * Every callback runs exactly once, with the same meaning of errors as
//    Connection (timeout / disconnected: may have run; not_sent: did not run).
//    A command a redirection or TRYAGAIN/CLUSTERDOWN kept from running and
//    whose time ran out ends with not_sent.
//  * Scripts are loaded on every connection before anything that can call
//    them (preload), and NOSCRIPT is handled on the node that said it, by the
//    engine-faults rule (repeated only if still_wanted says so).
//  * The resubscribe handler runs whenever a wake subscription may have been
//    lost (a subscriber reconnected, a slot moved, the master changed): the
//    limiters subscribe again (idempotent in Redis).
#pragma once

#include "redis/connection.hpp"
#include "redis/scripts.hpp"
#include "redis/url.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fairgate::redis {

struct ClientOptions {
  Target target;
  std::chrono::milliseconds command_timeout{200};
  std::string client_name;  ///< commands: CLIENT SETNAME; Pub/Sub: this with "-sub"
  std::function<void(const std::string&)> log;
  /// Set by make_client: the connections' problem lines (TLS failures, ...)
  /// to `log`, deduplicated.
  std::function<void(const std::string&)> connection_log;
  /// Send a call again (within its command timeout) when Redis refuses it for
  /// now (OOM, MISCONF, NOREPLICAS, BUSY: refusal() in
  /// redis/database_check.hpp), as after LOADING. Off: the refusal is the
  /// reply at once (the rate limiter decides by on_redis_down rather than
  /// wait: a rate decision cannot wait).
  bool retry_refusals = true;
};

class Client {
 public:
  using Callback = Connection::Callback;
  virtual ~Client() = default;

  /// Handlers run on a connection's strand. Set before start().
  virtual void set_push_handler(Connection::PushHandler handler) = 0;
  virtual void set_resubscribe_handler(std::function<void()> handler) = 0;
  virtual void start() = 0;
  /// Closes the Pub/Sub side (no more wake messages).
  virtual void close_subscriber() = 0;
  /// Closes the command side once everything sent before is answered.
  virtual void close_after_pending() = 0;

  /// One command on the node owning `key`'s slot (standalone: the server).
  virtual void exec(const std::string& key, std::vector<std::string> args, Callback callback) = 0;
  /// EVALSHA of `script`, routed by keys[0] (redis::call_script on that node).
  virtual void call_script(const Script& script, const std::vector<std::string>& keys,
                           const std::vector<std::string>& args, Callback callback,
                           std::function<bool()> still_wanted) = 0;
  /// SSUBSCRIBE `channel` (on the node owning its slot).
  virtual void subscribe(const std::string& channel, Callback callback) = 0;
  /// Drops the Pub/Sub connection carrying `channel` (it reconnects; the
  /// resubscribe handler runs).
  virtual void drop_subscriber(const std::string& channel, const char* why) = 0;

  /// The command side can send now (the node of `key`, standalone: the server).
  virtual bool connected(const std::string& key) const = 0;
  /// Every connection this client keeps is up.
  virtual bool all_connected() const = 0;
  /// Commands written so far, every connection.
  virtual std::uint64_t commands_sent() const = 0;
  /// "redis", "redis-cluster" or "redis-sentinel", for health and logs.
  virtual std::string_view kind() const noexcept = 0;
};

/// The client for `options.target` (not started).
std::shared_ptr<Client> make_client(boost::asio::any_io_executor executor, ClientOptions options);

/// CRC16 (XMODEM) of the key's hash tag (or the whole key) mod 16384.
unsigned key_slot(std::string_view key);

/// Slots `first`..`last` (0..16383) are served by the master at host:port.
struct SlotRange {
  unsigned first = 0;
  unsigned last = 0;
  std::string host;
  std::uint16_t port = 0;
  bool operator==(const SlotRange&) const = default;
};

/// The ranges of a CLUSTER SLOTS reply, [[first, last, [host, port, id, ...],
/// replicas...], ...]. A range of another shape, outside 0..16383, with a port
/// outside 1..65535 or a host that is not a string of visible ASCII is left
/// out (a reply of nonsense gives no range). A master that does not know its
/// address (host nil, empty or "?") is `answered_by`, the node that answered.
std::vector<SlotRange> slot_ranges(const Reply& reply, const std::string& answered_by);

/// The master's address in a SENTINEL get-master-addr-by-name reply
/// ([host, port]); nothing for nil (no such master), an error, an empty host
/// or a port outside 1..65535.
std::optional<std::pair<std::string, std::uint16_t>> master_address(const Reply& reply);

}  // namespace fairgate::redis
