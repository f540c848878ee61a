#include "support/redis_cluster.hpp"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <unistd.h>

namespace fairgate::test {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    out.push_back(line);
  }
  return out;
}

bool is_error(const std::string& reply) { return reply.rfind("(error)", 0) == 0; }

std::string must(const RedisServer& s, const std::vector<std::string>& args) {
  const std::string r = s.command(args);
  if (is_error(r)) {
    std::string cmd;
    for (const auto& a : args) cmd += a + " ";
    throw std::runtime_error("redis " + std::to_string(s.port()) + ": " + cmd + "-> " + r);
  }
  return r;
}

}  // namespace

RedisCluster::RedisCluster(Options options) : options_(options) {
  const int total = options.masters * (1 + options.replicas_per_master);
  for (int i = 0; i < total; ++i) {
    RedisServer::Options o;
    o.cluster = true;
    o.extra_args = {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", std::to_string(options.node_timeout.count()),
                    // A replica may take over however long it was cut off (the tests kill masters).
                    "--cluster-replica-validity-factor", "0", "--cluster-require-full-coverage", "yes",
                    "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"};
    if (options.tls) {
      o.tls = options.tls;
      o.tls->cluster = true;
      o.tls->replication = true;
    }
    nodes_.push_back(std::make_unique<RedisServer>(o));
  }
  for (auto& n : nodes_) ids_.push_back(must(*n, {"CLUSTER", "MYID"}));
  // Distinct config epochs up front: no collision to resolve.
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    must(*nodes_[i], {"CLUSTER", "SET-CONFIG-EPOCH", std::to_string(i + 1)});
  const int m = options.masters;
  for (int i = 0; i < m; ++i) {
    const int lo = 16384 * i / m;
    const int hi = 16384 * (i + 1) / m - 1;
    must(*nodes_[static_cast<std::size_t>(i)],
         {"CLUSTER", "ADDSLOTSRANGE", std::to_string(lo), std::to_string(hi)});
  }
  for (std::size_t i = 1; i < nodes_.size(); ++i)
    must(*nodes_[0], {"CLUSTER", "MEET", nodes_[i]->host(), std::to_string(nodes_[i]->port())});
  // Replicas follow their master once they know it.
  for (int mi = 0; mi < m; ++mi) {
    for (int j = 0; j < options.replicas_per_master; ++j) {
      auto& replica = *nodes_[static_cast<std::size_t>(m + mi * options.replicas_per_master + j)];
      const auto deadline = Clock::now() + 20s;
      for (;;) {
        const std::string r = replica.command({"CLUSTER", "REPLICATE", ids_[static_cast<std::size_t>(mi)]});
        if (!is_error(r)) break;
        if (Clock::now() > deadline) throw std::runtime_error("CLUSTER REPLICATE: " + r);
        std::this_thread::sleep_for(50ms);
      }
    }
  }
  if (!wait_stable(30s)) throw std::runtime_error("the test cluster did not become stable in 30 s");
}

RedisCluster::~RedisCluster() = default;

std::string RedisCluster::url() const {
  std::string u = options_.tls ? "rediss+cluster://" : "redis+cluster://";
  for (std::size_t i = 0; i < std::min<std::size_t>(2, nodes_.size()); ++i) {
    if (i) u += ",";
    u += nodes_[i]->host() + ":" + std::to_string(nodes_[i]->port());
  }
  if (options_.tls) u += "?tls_ca_file=" + options_.tls->ca_file;
  return u;
}

int RedisCluster::live_node() const {
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i]->running() && nodes_[i]->command({"PING"}, 1s) == "PONG") return static_cast<int>(i);
  }
  return -1;
}

unsigned RedisCluster::slot_of(const std::string& key) const {
  const int i = live_node();
  if (i < 0) throw std::runtime_error("no live cluster node");
  return static_cast<unsigned>(
      std::stoul(must(*nodes_[static_cast<std::size_t>(i)], {"CLUSTER", "KEYSLOT", key})));
}

namespace {
/// node index by "host:port" port.
int index_of_port(const std::vector<std::unique_ptr<RedisServer>>& nodes, int port) {
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i]->port() == port) return static_cast<int>(i);
  return -1;
}

/// CLUSTER NODES of `s`: id -> (port, flags, slots text). Lines:
/// <id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slot> ...
struct NodeLine {
  std::string id, flags, master, link;
  int port = 0;
  std::vector<std::pair<int, int>> slots;
};
std::vector<NodeLine> cluster_nodes(const RedisServer& s) {
  std::vector<NodeLine> out;
  const std::string text = s.command({"CLUSTER", "NODES"}, 2s);
  if (is_error(text)) return out;
  for (const auto& line : lines_of(text)) {
    std::istringstream in(line);
    NodeLine n;
    std::string addr, ping, pong, epoch;
    if (!(in >> n.id >> addr >> n.flags >> n.master >> ping >> pong >> epoch >> n.link)) continue;
    const auto colon = addr.rfind(':');
    const auto at = addr.find('@');
    if (colon != std::string::npos) n.port = std::atoi(addr.substr(colon + 1, at - colon - 1).c_str());
    for (std::string range; in >> range;) {
      if (range.front() == '[') continue;  // migrating/importing markers
      const auto dash = range.find('-');
      const int lo = std::atoi(range.substr(0, dash).c_str());
      const int hi = dash == std::string::npos ? lo : std::atoi(range.substr(dash + 1).c_str());
      n.slots.emplace_back(lo, hi);
    }
    out.push_back(std::move(n));
  }
  return out;
}
}  // namespace

int RedisCluster::owner_of_slot(unsigned slot) const {
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (!nodes_[i]->running()) continue;
    for (const auto& n : cluster_nodes(*nodes_[i])) {
      if (n.flags.find("master") == std::string::npos || n.flags.find("fail") != std::string::npos) continue;
      for (const auto& [lo, hi] : n.slots)
        if (static_cast<int>(slot) >= lo && static_cast<int>(slot) <= hi)
          return index_of_port(nodes_, n.port);
    }
    return -1;
  }
  return -1;
}

std::string RedisCluster::name_on(std::size_t index, const std::string& base) const {
  for (int k = 0; k < 10000; ++k) {
    const std::string name = base + "-" + std::to_string(k);
    if (owner_of_slot(slot_of("{" + name + "}")) == static_cast<int>(index)) return name;
  }
  throw std::runtime_error("no limiter name found on node " + std::to_string(index));
}

bool RedisCluster::wait_stable(std::chrono::milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    bool ok = true;
    std::map<int, int> owner_first;  // port of the owner of each range start, from the first node
    std::string view;
    for (std::size_t i = 0; i < nodes_.size() && ok; ++i) {
      if (!nodes_[i]->running()) continue;
      const std::string info = nodes_[i]->command({"CLUSTER", "INFO"}, 2s);
      if (info.find("cluster_state:ok") == std::string::npos) ok = false;
      // Agreement: every live node lists the same masters with the same slots, and nothing failing.
      std::string mine;
      for (const auto& n : cluster_nodes(*nodes_[i])) {
        if (n.flags.find("fail") != std::string::npos && n.flags.find("fail?") == std::string::npos) {
          // A dead node may be flagged fail: only a problem if it is alive.
          const int idx = index_of_port(nodes_, n.port);
          if (idx >= 0 && nodes_[static_cast<std::size_t>(idx)]->running()) ok = false;
          continue;
        }
        if (n.flags.find("fail?") != std::string::npos || n.flags.find("handshake") != std::string::npos ||
            n.flags.find("noaddr") != std::string::npos)
          ok = false;
        if (n.flags.find("master") != std::string::npos && !n.slots.empty()) {
          mine += std::to_string(n.port) + ":";
          for (const auto& [lo, hi] : n.slots) mine += std::to_string(lo) + "-" + std::to_string(hi) + ",";
          mine += ";";
        }
        if (n.flags.find("myself") != std::string::npos && n.flags.find("slave") != std::string::npos) {
          const std::string repl = nodes_[i]->command({"INFO", "replication"}, 2s);
          if (repl.find("master_link_status:up") == std::string::npos) ok = false;
        }
      }
      // Order of lines differs per node: compare sorted.
      std::vector<std::string> parts;
      std::istringstream in(mine);
      for (std::string p; std::getline(in, p, ';');) parts.push_back(p);
      std::sort(parts.begin(), parts.end());
      std::string key;
      for (const auto& p : parts) key += p + ";";
      if (view.empty()) {
        view = key;
      } else if (view != key) {
        ok = false;
      }
    }
    if (ok && !view.empty()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

void RedisCluster::migrate_slot(unsigned slot, std::size_t from, std::size_t to,
                                const std::function<void()>& between) {
  auto& src = *nodes_.at(from);
  auto& dst = *nodes_.at(to);
  const std::string s = std::to_string(slot);
  must(dst, {"CLUSTER", "SETSLOT", s, "IMPORTING", ids_.at(from)});
  must(src, {"CLUSTER", "SETSLOT", s, "MIGRATING", ids_.at(to)});
  if (between) between();
  for (;;) {
    const std::string keys = must(src, {"CLUSTER", "GETKEYSINSLOT", s, "1000"});
    const auto list = lines_of(keys);
    if (keys.empty() || list.empty()) break;
    std::vector<std::string> cmd{"MIGRATE", dst.host(), std::to_string(dst.port()), "", "0", "5000", "KEYS"};
    cmd.insert(cmd.end(), list.begin(), list.end());
    must(src, cmd);
  }
  // The new owner first (as redis-cli does), then the old one, then everyone else.
  must(dst, {"CLUSTER", "SETSLOT", s, "NODE", ids_.at(to)});
  must(src, {"CLUSTER", "SETSLOT", s, "NODE", ids_.at(to)});
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (i == from || i == to || !nodes_[i]->running()) continue;
    nodes_[i]->command({"CLUSTER", "SETSLOT", s, "NODE", ids_.at(to)});
  }
}

std::string RedisCluster::command_for(const std::string& key, const std::vector<std::string>& args) const {
  const int owner = owner_of_slot(slot_of(key));
  if (owner < 0) return "(error) no owner";
  return nodes_[static_cast<std::size_t>(owner)]->command(args);
}

// --- Sentinel -------------------------------------------------------------------

RedisSentinels::RedisSentinels(std::string master_name, std::chrono::milliseconds down_after,
                               std::optional<RedisServer::Tls> tls, std::string password)
    : name_(std::move(master_name)), tls_(std::move(tls)), password_(std::move(password)) {
  if (tls_) tls_->replication = true;
  // Either may become the master: both want the password and give it to the other.
  std::vector<std::string> masterauth;
  if (!password_.empty()) masterauth = {"--masterauth", password_};
  RedisServer::Options master;
  master.tls = tls_;
  master.extra_args = masterauth;
  master.password = password_;
  data_.push_back(std::make_unique<RedisServer>(master));
  RedisServer::Options replica;
  replica.tls = tls_;
  replica.password = password_;
  replica.extra_args = {"--replicaof",
                        data_[0]->host(),
                        std::to_string(data_[0]->port()),
                        "--repl-diskless-sync",
                        "yes",
                        "--repl-diskless-sync-delay",
                        "0"};
  replica.extra_args.insert(replica.extra_args.end(), masterauth.begin(), masterauth.end());
  data_.push_back(std::make_unique<RedisServer>(replica));
  // The replica is in sync before the sentinels start (a failover needs it).
  const auto deadline = Clock::now() + 20s;
  while (data_[1]->command({"INFO", "replication"}).find("master_link_status:up") == std::string::npos) {
    if (Clock::now() > deadline) throw std::runtime_error("the replica did not sync");
    std::this_thread::sleep_for(50ms);
  }
  for (int i = 0; i < 3; ++i) {
    char tmpl[] = "/tmp/fairgate-sentinel-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    const std::string conf = std::string(tmpl) + "/sentinel.conf";
    std::ofstream out(conf);
    out << "sentinel monitor " << name_ << " " << data_[0]->host() << " " << data_[0]->port() << " 2\n"
        << "sentinel down-after-milliseconds " << name_ << " " << down_after.count() << "\n"
        << "sentinel failover-timeout " << name_ << " 5000\n"
        << "sentinel parallel-syncs " << name_ << " 1\n";
    if (!password_.empty())  // (requirepass: RedisServer::Options::password)
      out << "sentinel auth-pass " << name_ << " " << password_ << "\n"
          << "sentinel sentinel-pass " << password_ << "\n";
    out.close();
    RedisServer::Options o;
    o.password = password_;
    o.config_file = conf;
    o.debug_command = false;
    o.extra_args = {"--sentinel"};
    o.tls = tls_;
    sentinels_.push_back(std::make_unique<RedisServer>(o));
  }
  // Every sentinel knows the replica and the other sentinels before a test kills anything.
  const auto until = Clock::now() + 30s;
  for (;;) {
    bool ready = true;
    for (auto& s : sentinels_) {
      const std::string r = s->command({"SENTINEL", "MASTER", name_});
      const auto lines = lines_of(r);
      std::map<std::string, std::string> kv;
      for (std::size_t i = 0; i + 1 < lines.size(); i += 2) kv[lines[i]] = lines[i + 1];
      if (kv["num-slaves"] != "1" || kv["num-other-sentinels"] != "2" || kv["flags"] != "master")
        ready = false;
    }
    if (ready) break;
    if (Clock::now() > until) throw std::runtime_error("the sentinels did not see each other in 30 s");
    std::this_thread::sleep_for(100ms);
  }
}

RedisSentinels::~RedisSentinels() {
  sentinels_.clear();
  data_.clear();
}

std::string RedisSentinels::url() const {
  std::string u = tls_ ? "rediss+sentinel://" : "redis+sentinel://";
  if (!password_.empty()) u += ":" + password_ + "@";
  for (std::size_t i = 0; i < sentinels_.size(); ++i) {
    if (i) u += ",";
    u += sentinels_[i]->host() + ":" + std::to_string(sentinels_[i]->port());
  }
  u += "/" + name_;
  if (tls_) u += "?tls_ca_file=" + tls_->ca_file;
  return u;
}

std::string RedisSentinels::master_address() const {
  for (const auto& s : sentinels_) {
    if (!s->running()) continue;
    const auto lines = lines_of(s->command({"SENTINEL", "GET-MASTER-ADDR-BY-NAME", name_}));
    if (lines.size() == 2) return lines[0] + ":" + lines[1];
  }
  return {};
}

int RedisSentinels::master_index() const {
  const std::string addr = master_address();
  for (std::size_t i = 0; i < data_.size(); ++i)
    if (addr == data_[i]->host() + ":" + std::to_string(data_[i]->port())) return static_cast<int>(i);
  return -1;
}

}  // namespace fairgate::test
