// redis/database_check.hpp — does the server of a redis://[USER:PASSWORD@]HOST:PORT/DB
// URL accept its credentials and have its database? Asked once at start
// (fairgate serve), so that a wrong password, a missing one, or /99 on a
// server with 16 databases is an error there rather than a connection that
// retries for ever (docs/redis-cluster.md). The same lines are what a
// connection logs when it meets these at run time.
#pragma once

#include "redis/url.hpp"

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fairgate::redis {

/// The line a refused SELECT is reported with, by the connection and by
/// start_problem(): "Redis at HOST:PORT: database 99 cannot be selected:
/// <the server's reason>".
std::string database_refused(const Endpoint& endpoint, std::string_view reason);

/// The line a refused AUTH is reported with: "Redis at HOST:PORT refused
/// AUTH as user 'U': <the server's reason>" (the password is never shown).
std::string auth_refused(const Endpoint& endpoint, std::string_view reason);

/// The line a NOAUTH answer is reported with: the server wants a password and
/// the URL gives none. `hint` says where it goes (empty: in the URL's
/// user:password@).
std::string password_missing(const Endpoint& endpoint, std::string_view reason, std::string_view hint = {});

/// Does this error reply say the server refuses the command for now, without
/// running it? "OOM" (maxmemory reached under noeviction: every command
/// that would add data), "MISCONF" (the last RDB snapshot failed and
/// stop-writes-on-bgsave-error is on: every write), "NOREPLICAS" (fewer
/// replicas than min-replicas-to-write: every write), "BUSY" (another
/// client's script runs past busy-reply-threshold: every command). Redis
/// refuses a script these only at its first write (BUSY: before it runs).
bool refusal(std::string_view error);

/// The line a server at maxclients is reported with (it answers a new
/// connection "ERR max number of clients reached" and closes it).
std::string too_many_clients(const Endpoint& endpoint);

/// The line a server in protected mode is reported with (no password for
/// the default user, so it answers a client not on loopback "DENIED ..."
/// and closes the connection).
std::string protected_mode(const Endpoint& endpoint);

/// What a server writes on a new connection it will not serve, before it
/// closes it: maxclients, protected mode. The line for it, or nothing.
std::optional<std::string> turned_away(const Endpoint& endpoint, std::string_view error);

/// The line such a refusal is reported with: what the server says, what
/// fairgate does meanwhile (the call is sent again, then it counts as Redis
/// failing: on_redis_down after degrade_after) and the fix. Nothing for any
/// other reply.
std::optional<std::string> refusal_line(const Endpoint& endpoint, std::string_view error);

/// From the text of `INFO memory`: the line for a server that may evict
/// keys — maxmemory set and a maxmemory_policy other than noeviction (the
/// volatile-* policies too: fairgate's keys carry an expiry). Nothing for
/// noeviction, for maxmemory 0 (no limit), or when a field is missing or
/// not readable.
std::optional<std::string> eviction_risk(const Endpoint& endpoint, std::string_view info);

/// Does this error reply say that the ACL refused the call: "NOPERM" (the
/// command, a key or a channel), or a command inside a script (Redis 7.0:
/// "ERR The user executing the script can't ..."; the script may have run
/// in part)?
bool denied(std::string_view error);

/// The line such a refusal is reported with: the user (never the password),
/// what Redis says, what fairgate does meanwhile and the fix
/// (docs/redis-acl.md).
std::string denied_line(const Endpoint& endpoint, std::string_view error);

/// The line for a server that does not know SCRIPT LOAD, EVALSHA or
/// SSUBSCRIBE ("ERR unknown command": older than Redis 7.0, or renamed or
/// left out).
std::string unknown_command(const Endpoint& endpoint, std::string_view error);

/// The line for an error reply that says fairgate's setup is wrong, not
/// Redis failing for now: denied_line() for what the ACL refuses,
/// unknown_command() for a command the server does not know ("ERR unknown
/// command"). Nothing for any other reply.
std::optional<std::string> setup_problem(const Endpoint& endpoint, std::string_view error);

/// What start_problem() asks beyond the login, to see that the user may do
/// what fairgate does: SCRIPT LOAD of `script`, EVALSHA on each of `keys`
/// (of a script that does not exist: the ACL is checked first, then
/// NOSCRIPT; nothing runs), SSUBSCRIBE to each of `channels`.
struct StartProbe {
  std::string script;
  std::vector<std::string> keys;
  std::vector<std::string> channels;
};

/// The probe for these limiters and rate-limit rules under `key_prefix`:
/// fairgate's acquire script (each connection loads it anyway), each
/// limiter's cfg key and wake channel, a key of each rule.
StartProbe start_probe(std::string_view key_prefix, const std::vector<std::string>& limiters,
                       const std::vector<std::string>& rate_rules);

/// AUTH [USER] PASSWORD for `endpoint` (which has a password), as the
/// connection and start_problem() send it first.
std::vector<std::string> auth_command(const Endpoint& endpoint);

/// Connects to `endpoint` (plain TCP; blocking, each step within `timeout`),
/// sends AUTH when it has a password, then SELECT of its database (PING for
/// database 0). Returns the line for what the server refuses: auth_refused()
/// for a refused AUTH, password_missing() for NOAUTH, database_refused() for
/// a refused SELECT, protected_mode() for a server that turns this client
/// away (a server at maxclients is no problem: a slot may free; the
/// connection says so at run time); then what `probe` asks: denied_line()
/// for what the ACL refuses, unknown_command() for a server without the script
/// commands or sharded Pub/Sub. Over TLS the same questions go through the
/// client's own connection (whose line names a login problem, or a certificate
/// the CA does not vouch for). Nothing when all is accepted, or when the check
/// cannot tell (no server there, no answer, a server busy with a script:
/// serve starts degraded then). Everything it opens is closed on every path.
std::optional<std::string> start_problem(const Endpoint& endpoint, std::chrono::milliseconds timeout,
                                         const StartProbe& probe = {});

/// The masters a Redis Cluster node's CLUSTER SLOTS names, with `seed`'s
/// credentials (over TLS for a TLS seed); empty when it cannot tell (no
/// answer, not a cluster).
std::vector<Endpoint> cluster_masters(const Endpoint& seed, std::chrono::milliseconds timeout);

/// start_problem() for a Redis Cluster URL: every seed, then every master
/// the first seed that answers names (ACL users are not replicated: each
/// node has its own), with the same probe. The first problem, or nothing.
std::optional<std::string> cluster_start_problem(const std::vector<Endpoint>& seeds,
                                                 std::chrono::milliseconds timeout,
                                                 const StartProbe& probe = {});

/// The master the sentinels of a Sentinel target name now (the first that
/// answers, with the URL's sentinel credentials), carrying the URL's data
/// credentials and database (over TLS for TLS sentinels); nothing when none
/// answers.
std::optional<Endpoint> sentinel_master(const Target& target, std::chrono::milliseconds timeout);

}  // namespace fairgate::redis
