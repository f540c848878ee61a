// redis/database_check.hpp — is the database of a redis://HOST:PORT/DB URL
// one the server has? Asked once at start (fairgate serve), so that /99 on a
// server with 16 databases is an error there rather than a connection that
// retries for ever (docs/redis-cluster.md).
#pragma once

#include "redis/url.hpp"

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fairgate::redis {

/// The line a refused SELECT is reported with, by the connection and by
/// database_problem(): "Redis at HOST:PORT: database 99 cannot be selected:
/// <the server's reason>".
std::string database_refused(const Endpoint& endpoint, std::string_view reason);

/// AUTH [USER] PASSWORD for `endpoint` (which has a password), as the
/// connection and database_problem() send it first.
std::vector<std::string> auth_command(const Endpoint& endpoint);

/// Connects to `endpoint` (plain TCP; blocking, each step within `timeout`),
/// sends AUTH when it has a password, then SELECT of its database. Returns
/// database_refused() when the server refuses the SELECT; nothing when it
/// accepts it, when the database is 0 or the endpoint is TLS (not asked), or
/// when the check cannot tell (no server there, AUTH refused or missing:
/// serve starts degraded then, as with database 0). Everything it opens is closed on every path.
std::optional<std::string> database_problem(const Endpoint& endpoint, std::chrono::milliseconds timeout);

}  // namespace fairgate::redis
