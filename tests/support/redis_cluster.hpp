// tests/support/redis_cluster.hpp — a real Redis Cluster for tests: N masters
// (and R replicas each) of Debian's redis-server on free loopback ports, each
// a RedisServer (so kill -9, restart, SIGSTOP work per node), joined with
// CLUSTER ADDSLOTSRANGE / MEET / REPLICATE (no redis-cli sleeps), returned
// once every node says cluster_state:ok and agrees on the slot map.
//
// And a real Sentinel setup: one master, one replica, three sentinels
// (`redis-server --sentinel`).
//
// Not thread-safe (like RedisServer).
#pragma once

#include "support/redis_server.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fairgate::test {

class RedisCluster {
 public:
  struct Options {
    int masters = 3;
    int replicas_per_master = 0;
    /// cluster-node-timeout: a master that does not answer for this long is failed over.
    std::chrono::milliseconds node_timeout{1000};
    /// Set: every node TLS-only, with the cluster bus and replication over TLS
    /// (--tls-cluster yes --tls-replication yes); url() is rediss+cluster://.
    std::optional<RedisServer::Tls> tls;
  };
  explicit RedisCluster(Options options);
  RedisCluster() : RedisCluster(Options{}) {}
  ~RedisCluster();
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  /// redis+cluster://127.0.0.1:p1,127.0.0.1:p2 (the first two masters as seeds);
  /// with TLS rediss+cluster://...?tls_ca_file=<ca_file>.
  std::string url() const;
  std::size_t size() const { return nodes_.size(); }
  /// Node i: the masters first (0..masters-1), then the replicas (replica j of master m is
  /// masters + m * replicas_per_master + j).
  RedisServer& node(std::size_t i) { return *nodes_.at(i); }
  const std::string& node_id(std::size_t i) const { return ids_.at(i); }
  /// The slot of `key` (CLUSTER KEYSLOT on a live node).
  unsigned slot_of(const std::string& key) const;
  /// The index of the node that serves `slot` now, from a live node's CLUSTER SLOTS (-1: none).
  int owner_of_slot(unsigned slot) const;
  /// A limiter name ("<base>-<k>") whose keys "<prefix>:{name}:..." live on node `index` now.
  std::string name_on(std::size_t index, const std::string& base) const;
  /// Waits until every live node says cluster_state:ok and they agree on the owner of
  /// every slot, and every live replica's link to its master is up. False after `timeout`.
  bool wait_stable(std::chrono::milliseconds timeout) const;
  /// Moves `slot` from node `from` to node `to` the way redis-cli --cluster reshard does:
  /// SETSLOT IMPORTING / MIGRATING, MIGRATE the keys (all in one MIGRATE ... KEYS call),
  /// SETSLOT NODE on every master. `between` runs after MIGRATING/IMPORTING are set and
  /// before the keys move (the window where clients meet ASK and TRYAGAIN).
  void migrate_slot(unsigned slot, std::size_t from, std::size_t to,
                    const std::function<void()>& between = {});
  /// Runs `args` on the node that owns `key`'s slot.
  std::string command_for(const std::string& key, const std::vector<std::string>& args) const;

 private:
  int live_node() const;
  Options options_;
  std::vector<std::unique_ptr<RedisServer>> nodes_;
  std::vector<std::string> ids_;
};

class RedisSentinels {
 public:
  /// Starts a master, a replica of it and three sentinels watching it as `master_name`
  /// (quorum 2, down-after `down_after`, failover-timeout a few seconds).
  /// With `tls`: every data node and sentinel TLS-only, replication and the
  /// sentinels' links over TLS; url() is rediss+sentinel://...?tls_ca_file=<ca_file>.
  /// With `password`: requirepass on the data nodes (masterauth for the
  /// replica) and on the sentinels (auth-pass to the data nodes, sentinel-pass
  /// between sentinels); url() gives it as the data nodes' password only.
  explicit RedisSentinels(std::string master_name = "mymaster",
                          std::chrono::milliseconds down_after = std::chrono::milliseconds(1000),
                          std::optional<RedisServer::Tls> tls = std::nullopt, std::string password = {});
  ~RedisSentinels();
  RedisSentinels(const RedisSentinels&) = delete;
  RedisSentinels& operator=(const RedisSentinels&) = delete;

  /// redis+sentinel://[:password@]127.0.0.1:s1,127.0.0.1:s2,127.0.0.1:s3/<master_name>
  /// (rediss+sentinel with TLS)
  std::string url() const;
  RedisServer& data(std::size_t i) { return *data_.at(i); }  ///< 0: the first master, 1: its replica
  RedisServer& sentinel(std::size_t i) { return *sentinels_.at(i); }
  /// "host:port" of the master the sentinels name now (ask sentinel 0, then the others).
  std::string master_address() const;
  /// The index (0 or 1) of the data node at `master_address()`, -1 if neither.
  int master_index() const;

 private:
  std::string name_;
  std::optional<RedisServer::Tls> tls_;
  std::string password_;
  std::vector<std::unique_ptr<RedisServer>> data_;
  std::vector<std::unique_ptr<RedisServer>> sentinels_;
};

}  // namespace fairgate::test
