#include "redis/database_check.hpp"

#include "core/text.hpp"
#include "redis/client.hpp"
#include "redis/connection.hpp"
#include "redis/reply.hpp"
#include "redis/scripts.hpp"

#include <hiredis/hiredis.h>
#include <boost/asio/io_context.hpp>

#include <sys/time.h>
#include <algorithm>
#include <array>
#include <charconv>
#include <memory>
#include <vector>

namespace fairgate::redis {
namespace {

struct ContextFree {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
struct ReplyFree {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using ContextPtr = std::unique_ptr<redisContext, ContextFree>;
using ReplyPtr = std::unique_ptr<redisReply, ReplyFree>;

/// One blocking command; null when it could not be sent or read (timeout, connection closed).
ReplyPtr command(redisContext& c, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  return ReplyPtr(static_cast<redisReply*>(
      redisCommandArgv(&c, static_cast<int>(argv.size()), argv.data(), lens.data())));
}

bool is_error(const ReplyPtr& r) { return r && r->type == REDIS_REPLY_ERROR; }

/// A blocking connection to `host:port` (plain TCP) whose connect and every
/// command end within `timeout`, reading arrays no longer than fairgate's
/// bound; null when there is none.
ContextPtr connect_within(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(timeout).count();
  const timeval tv{static_cast<time_t>(us / 1'000'000), static_cast<suseconds_t>(us % 1'000'000)};
  ContextPtr c(redisConnectWithTimeout(host.c_str(), port, tv));
  if (!c || c->err != 0) return nullptr;
  bound_arrays(c->reader);
  if (redisSetTimeout(c.get(), tv) != REDIS_OK) return nullptr;
  return c;
}

}  // namespace

std::vector<std::string> auth_command(const Endpoint& endpoint) {
  std::vector<std::string> auth{"AUTH"};
  if (!endpoint.user.empty()) auth.push_back(endpoint.user);
  auth.push_back(endpoint.password);
  return auth;
}

std::string database_refused(const Endpoint& endpoint, std::string_view reason) {
  return "Redis at " + endpoint.host + ":" + std::to_string(endpoint.port) + ": database " +
         std::to_string(endpoint.db) + " cannot be selected: " + std::string(reason);
}

std::string auth_refused(const Endpoint& endpoint, std::string_view reason) {
  std::string out =
      "Redis at " + endpoint.host + ":" + std::to_string(endpoint.port) + " refused AUTH as user '";
  out.append(endpoint.user.empty() ? std::string("default") : core::escape_controls(endpoint.user));
  out.append("': ");
  out.append(core::escape_controls(reason));
  return out;
}

std::string password_missing(const Endpoint& endpoint, std::string_view reason, std::string_view hint) {
  std::string out = "Redis at " + endpoint.host + ":" + std::to_string(endpoint.port) + " wants a password (";
  out.append(core::escape_controls(reason));
  out.append("): ");
  if (!hint.empty()) {
    out.append(hint);
  } else {
    const char* scheme = endpoint.tls.enabled ? "rediss://" : "redis://";
    out.append("give it in the URL, ").append(scheme).append(":PASSWORD@HOST:PORT or ");
    out.append(scheme).append("USER:PASSWORD@HOST:PORT");
  }
  return out;
}

namespace {

std::string where(const Endpoint& endpoint) {
  return "Redis at " + endpoint.host + ":" + std::to_string(endpoint.port);
}

/// The value of `field` in INFO text ("field:value" lines), or nothing.
std::optional<std::string_view> info_field(std::string_view info, std::string_view field) {
  std::size_t at = 0;
  while (at < info.size()) {
    auto end = info.find('\n', at);
    if (end == std::string_view::npos) end = info.size();
    std::string_view line = info.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.size() > field.size() && line.starts_with(field) && line[field.size()] == ':')
      return line.substr(field.size() + 1);
    at = end + 1;
  }
  return std::nullopt;
}

}  // namespace

// How Redis 7.0 says that the ACL refused a command inside a script ("ERR
// The user executing the script can't run this command or subcommand ...").
constexpr std::string_view kDeniedInScript = "The user executing the script can't";

// What a server writes on a new connection it will not serve, then closes it.
constexpr std::string_view kMaxclients = "ERR max number of clients reached";
constexpr std::string_view kDenied = "DENIED ";

std::string too_many_clients(const Endpoint& endpoint) {
  return where(endpoint) +
         " refuses new connections (ERR max number of clients reached): it is at maxclients; fairgate "
         "connects again with backoff. Raise maxclients, or close what else holds connections to it";
}

std::string protected_mode(const Endpoint& endpoint) {
  return where(endpoint) +
         " turns this client away (DENIED: it runs in protected mode, with no password for the default "
         "user, and then accepts clients on loopback only): give Redis a password (requirepass, or an "
         "ACL user: docs/redis-acl.md) and put it in the URL, or, where only trusted hosts reach it, "
         "set protected-mode no";
}

std::optional<std::string> turned_away(const Endpoint& endpoint, std::string_view error) {
  if (error.starts_with(kMaxclients)) return too_many_clients(endpoint);
  if (error.starts_with(kDenied)) return protected_mode(endpoint);
  return std::nullopt;
}

namespace {

/// The answers that refuse a call for now (refusal()): what the server says, and the fix.
struct Refusal {
  std::string_view prefix, what, fix;
};
constexpr std::array<Refusal, 5> kRefusals{{
    {"OOM ",
     " is out of memory (OOM: used memory above maxmemory, and nothing it may evict frees enough): it "
     "refuses every command that would add data, so arrivals cannot queue and heartbeats fail",
     "Free memory or raise maxmemory"},
    {"MISCONF ",
     " refuses writes (MISCONF: its last RDB snapshot failed and stop-writes-on-bgsave-error is on): "
     "arrivals, releases and heartbeats fail",
     "Redis' log says why the snapshot failed"},
    {"NOREPLICAS ",
     " refuses writes (NOREPLICAS: fewer replicas connected than min-replicas-to-write): arrivals, "
     "releases and heartbeats fail",
     "Bring a replica back, or lower min-replicas-to-write"},
    {"BUSY ",
     " is busy running a script past busy-reply-threshold (BUSY) and answers nothing else: arrivals, "
     "releases and heartbeats fail",
     "End it with SCRIPT KILL (SHUTDOWN NOSAVE if it wrote)"},
    {"READONLY ",
     " is a read-only replica (READONLY): it refuses fairgate's writes, so arrivals, releases and "
     "heartbeats fail until it is a master again",
     "Give fairgate the master's address (a redis+sentinel:// URL follows failovers)"},
}};

const Refusal* refusal_of(std::string_view error) {
  for (const auto& r : kRefusals)
    if (error.starts_with(r.prefix)) return &r;
  return nullptr;
}

}  // namespace

bool refusal(std::string_view error) { return refusal_of(error) != nullptr; }

std::optional<std::string> refusal_line(const Endpoint& endpoint, std::string_view error) {
  const Refusal* r = refusal_of(error);
  if (!r) return std::nullopt;
  return where(endpoint) + std::string(r->what) +
         "; limiters send them again and follow on_redis_down after degrade_after (rate limits at once). " +
         std::string(r->fix) + " (docs/faults.md, \"Redis refuses writes\")";
}

bool denied(std::string_view error) {
  return error.starts_with("NOPERM") || error.find(kDeniedInScript) != std::string_view::npos;
}

std::string denied_line(const Endpoint& endpoint, std::string_view error) {
  return where(endpoint) + " refused a call of fairgate's as user '" +
         (endpoint.user.empty() ? std::string("default") : core::escape_controls(endpoint.user)) + "' (" +
         core::escape_controls(error.substr(0, 200)) +
         "); until it is allowed, limiters follow on_redis_down after degrade_after (rate limits at once). "
         "Give the user the commands, keys and channels in docs/redis-acl.md";
}

std::string unknown_command(const Endpoint& endpoint, std::string_view error) {
  return where(endpoint) + " does not know a command fairgate needs (" +
         core::escape_controls(error.substr(0, 200)) +
         "): fairgate needs Redis 7.0 or newer (SSUBSCRIBE: sharded Pub/Sub) with its script commands "
         "(SCRIPT LOAD, EVALSHA); this server is older, or renames or leaves them out (rename-command)";
}

std::optional<std::string> setup_problem(const Endpoint& endpoint, std::string_view error) {
  if (denied(error)) return denied_line(endpoint, error);
  if (error.starts_with("ERR unknown command")) return unknown_command(endpoint, error);
  return std::nullopt;
}

std::optional<std::string> eviction_risk(const Endpoint& endpoint, std::string_view info) {
  const auto max = info_field(info, "maxmemory");
  const auto policy = info_field(info, "maxmemory_policy");
  if (!max || !policy || policy->empty()) return std::nullopt;
  std::uint64_t bytes = 0;
  const auto [end, ec] = std::from_chars(max->data(), max->data() + max->size(), bytes);
  if (ec != std::errc{} || end != max->data() + max->size() || bytes == 0) return std::nullopt;
  if (*policy == "noeviction") return std::nullopt;
  return where(endpoint) + " may evict fairgate's keys (maxmemory " + std::to_string(bytes) +
         " bytes, maxmemory-policy " + core::escape_controls(policy->substr(0, 32)) +
         "): a key evicted takes permits or waiters with it, which the instances must find and restore "
         "(grants pause meanwhile; tenant limits may not hold); set maxmemory-policy noeviction, or give "
         "fairgate a Redis of its own (docs/faults.md, \"Redis refuses writes\")";
}

namespace {

/// Asks what `probe` asks through `ask` (the server's error reply for a
/// command, empty for any other answer or none). Each answer that says "not
/// this user" or "no such command" is a problem; any other (BUSY, LOADING,
/// OOM, ...) cannot tell.
template <class Ask>
std::optional<std::string> run_probe(const Endpoint& endpoint, const StartProbe& probe, Ask&& ask) {
  const auto problem = [&](const std::vector<std::string>& args) {
    return setup_problem(endpoint, ask(args));
  };
  if (!probe.script.empty())
    if (auto p = problem({"SCRIPT", "LOAD", probe.script})) return p;
  // A write that changes nothing (DEL of a key nobody uses, in the first
  // limiter's slot): a read-only replica refuses it. (Any other answer —
  // MOVED from a Cluster replica among the seeds, OOM, MISCONF — is not this
  // check's: a refusal for now is no mistake in the URL.)
  if (!probe.keys.empty()) {
    const std::string unused = probe.keys.front() + ":start-check";
    const std::string error = ask({"DEL", unused});
    if (error.starts_with("READONLY ")) return refusal_line(endpoint, error);
    if (auto p = setup_problem(endpoint, error)) return p;
  }
  // A script that does not exist, on each key: the ACL is checked first
  // (NOPERM), then NOSCRIPT. Nothing runs.
  for (const auto& key : probe.keys)
    if (auto p = problem({"EVALSHA", std::string(40, '0'), "1", key})) return p;
  // Last: a subscribed connection takes no other command.
  for (const auto& channel : probe.channels)
    if (auto p = problem({"SSUBSCRIBE", channel})) return p;
  return std::nullopt;
}

/// A line of the connection's that is a mistake in the URL or its TLS
/// settings, not a server that is away or slow: the login (AUTH, a missing
/// password, the database, protected mode) or the server's certificate.
bool login_problem(const Endpoint& endpoint, const std::string& line) {
  return line.starts_with(auth_refused(endpoint, "")) ||
         line.starts_with(where(endpoint) + " wants a password (") ||
         line.starts_with(database_refused(endpoint, "")) || line == protected_mode(endpoint) ||
         line.starts_with("TLS certificate verification failed for ");
}

/// Questions to one server over TLS, blocking, each answered within
/// `timeout`: through the client's own connection on a private io_context
/// (the hiredis here has no TLS). The connection logs in itself; a login
/// problem it reports ends every wait.
class TlsAsker {
 public:
  struct Answer {
    boost::system::error_code ec;
    Reply reply;
  };

  TlsAsker(const Endpoint& endpoint, std::chrono::milliseconds timeout)
      : endpoint_(endpoint), timeout_(timeout) {
    ConnectionOptions o;
    o.endpoint = endpoint;
    o.command_timeout = timeout;
    o.connect_timeout = timeout;
    o.log = [told = told_](const std::string& line) {
      if (told->empty()) *told = line;
    };
    connection_ = Connection::create(io_.get_executor(), o);
    connection_->start();
  }
  TlsAsker(const TlsAsker&) = delete;
  TlsAsker& operator=(const TlsAsker&) = delete;
  ~TlsAsker() {
    connection_->close();
    io_.run_for(std::chrono::milliseconds(50));  // the close's callbacks
  }

  /// Nothing when no answer came in time or the login failed (then the
  /// callback, if it still runs, writes into its own copy).
  std::optional<Answer> ask(std::vector<std::string> args) {
    auto out = std::make_shared<std::optional<Answer>>();
    connection_->exec(
        std::move(args),
        [out](boost::system::error_code ec, Reply r) {
          *out = Answer{ec, std::move(r)};
        },
        timeout_);
    const auto until = std::chrono::steady_clock::now() + timeout_ + std::chrono::milliseconds(500);
    while (!*out && !login_refused() && std::chrono::steady_clock::now() < until) io_.run_one_until(until);
    return *out;
  }

  /// The reply when it came and is no error.
  std::optional<Reply> ask_ok(std::vector<std::string> args) {
    auto a = ask(std::move(args));
    if (!a || a->ec || a->reply.is_error()) return std::nullopt;
    return std::move(a->reply);
  }

  /// The connection's line when it could not log in (a refused password, a
  /// database, protected mode, a certificate the CA does not vouch for).
  std::optional<std::string> login_refused() const {
    if (login_problem(endpoint_, *told_)) return *told_;
    return std::nullopt;
  }

 private:
  Endpoint endpoint_;
  std::chrono::milliseconds timeout_;
  boost::asio::io_context io_;
  std::shared_ptr<std::string> told_ =
      std::make_shared<std::string>();  // the connection's first problem line
  std::shared_ptr<Connection> connection_;
};

/// start_problem() over TLS: the same questions through a TlsAsker.
std::optional<std::string> tls_start_problem(const Endpoint& endpoint, std::chrono::milliseconds timeout,
                                             const StartProbe& probe) {
  TlsAsker asker(endpoint, timeout);
  const auto first = asker.ask({"PING"});
  if (auto problem = asker.login_refused()) return problem;
  if (!first || first->ec || first->reply.is_error()) return std::nullopt;
  return run_probe(endpoint, probe, [&](const std::vector<std::string>& args) {
    const auto a = asker.ask(args);
    return a && !a->ec && a->reply.is_error() ? a->reply.str : std::string();
  });
}

}  // namespace

StartProbe start_probe(std::string_view key_prefix, const std::vector<std::string>& limiters,
                       const std::vector<std::string>& rate_rules) {
  StartProbe probe;
  probe.script = std::string(scripts::kAcquire.text());
  const std::string prefix(key_prefix);
  for (const auto& name : limiters) {
    const std::string base = prefix + ":{" + name + "}:";  // as RedisLimiter names them
    probe.keys.push_back(limiter_keys(base).front());      // cfg
    probe.channels.push_back(base + "wake:start-check");
  }
  for (const auto& rule : rate_rules) probe.keys.push_back(prefix + ":rl:{" + rule + ":start-check}:x");
  return probe;
}

std::optional<std::string> start_problem(const Endpoint& endpoint, std::chrono::milliseconds timeout,
                                         const StartProbe& probe) {
  if (endpoint.tls.enabled) return tls_start_problem(endpoint, timeout, probe);
  const ContextPtr c = connect_within(endpoint.host, endpoint.port, timeout);
  if (!c) return std::nullopt;  // no server there (yet): serve starts degraded
  // A server that turns every new client away answers the first command so
  // (turned_away): protected mode is a problem, maxclients is not (a slot
  // may free; the connection says so meanwhile).
  if (!endpoint.password.empty()) {
    const ReplyPtr r = command(*c, auth_command(endpoint));
    if (!r) return std::nullopt;
    if (is_error(r)) {
      const std::string_view reason(r->str, r->len);
      if (reason.starts_with(kDenied)) return protected_mode(endpoint);
      if (reason.starts_with(kMaxclients)) return std::nullopt;
      return auth_refused(endpoint, reason);
    }
  }
  // SELECT of the database; with database 0 (never selected) a PING, which is
  // how a server that wants a password says so.
  const ReplyPtr r =
      command(*c, endpoint.db == 0 ? std::vector<std::string>{"PING"}
                                   : std::vector<std::string>{"SELECT", std::to_string(endpoint.db)});
  if (!r) return std::nullopt;
  if (is_error(r)) {
    const std::string_view reason(r->str, r->len);
    if (reason.starts_with(kDenied)) return protected_mode(endpoint);
    if (reason.starts_with(kMaxclients)) return std::nullopt;
    if (reason.starts_with("NOAUTH")) return password_missing(endpoint, reason);
    if (endpoint.db == 0) return std::nullopt;  // (an ACL without PING, a busy server: not for this check)
    // A script runs: busy, not wrong. (SELECT runs while Redis loads its data: no LOADING here.)
    if (reason.starts_with("BUSY")) return std::nullopt;
    return database_refused(endpoint, reason);
  }
  return run_probe(endpoint, probe, [&](const std::vector<std::string>& args) {
    const ReplyPtr a = command(*c, args);
    return is_error(a) ? std::string(a->str, a->len) : std::string();
  });
}

namespace {

/// Adds `node` to `nodes` unless a node at its host and port is there.
void add_node(std::vector<Endpoint>& nodes, Endpoint node) {
  const bool known = std::any_of(nodes.begin(), nodes.end(), [&](const Endpoint& e) {
    return e.host == node.host && e.port == node.port;
  });
  if (!known) nodes.push_back(std::move(node));
}

/// The reply of one command to `endpoint` (TLS or not, logged in with its
/// credentials), each step within `timeout`; nothing when none came or it is an error.
std::optional<Reply> ask_once(const Endpoint& endpoint, std::chrono::milliseconds timeout,
                              std::vector<std::string> args) {
  if (endpoint.tls.enabled) return TlsAsker(endpoint, timeout).ask_ok(std::move(args));
  const ContextPtr c = connect_within(endpoint.host, endpoint.port, timeout);
  if (!c) return std::nullopt;
  if (!endpoint.password.empty()) {
    const ReplyPtr r = command(*c, auth_command(endpoint));
    if (!r || is_error(r)) return std::nullopt;
  }
  const ReplyPtr r = command(*c, args);
  if (!r || is_error(r)) return std::nullopt;
  return reply_of(r.get());
}

}  // namespace

std::vector<Endpoint> cluster_masters(const Endpoint& seed, std::chrono::milliseconds timeout) {
  std::vector<Endpoint> out;
  const auto slots = ask_once(seed, timeout, {"CLUSTER", "SLOTS"});
  if (!slots) return out;
  for (const auto& range : slot_ranges(*slots, seed.host)) {
    Endpoint ep = seed;  // the URL's credentials
    ep.host = range.host;
    ep.port = range.port;
    add_node(out, std::move(ep));
  }
  return out;
}

std::optional<std::string> cluster_start_problem(const std::vector<Endpoint>& seeds,
                                                 std::chrono::milliseconds timeout, const StartProbe& probe) {
  std::vector<Endpoint> nodes = seeds;
  for (const auto& seed : seeds) {
    auto masters = cluster_masters(seed, timeout);
    if (masters.empty()) continue;
    for (auto& m : masters) add_node(nodes, std::move(m));
    break;
  }
  for (const auto& node : nodes)
    if (auto problem = start_problem(node, timeout, probe)) return problem;
  return std::nullopt;
}

std::optional<Endpoint> sentinel_master(const Target& target, std::chrono::milliseconds timeout) {
  if (target.kind != Target::Kind::sentinel || target.nodes.empty()) return std::nullopt;
  for (std::size_t i = 0; i < target.nodes.size(); ++i) {
    const auto r =
        ask_once(target.sentinel(i), timeout, {"SENTINEL", "get-master-addr-by-name", target.master_name});
    const auto address = r ? master_address(*r) : std::nullopt;
    if (!address) continue;
    Endpoint master = target.nodes[i];  // the data nodes' credentials and database ride on every node
    master.host = address->first;
    master.port = address->second;
    return master;
  }
  return std::nullopt;
}

}  // namespace fairgate::redis
