// redis/scripts.hpp — the limiter's Lua scripts (src/redis/scripts/*.lua,
// embedded at build time) and a runner that calls them by SHA.
#pragma once

#include "redis/connection.hpp"

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace fairgate::redis {

/// One Lua script: its name, full text (lib.lua + the script) and SHA1.
class Script {
 public:
  Script(std::string_view name, std::string_view text);
  std::string_view name() const noexcept { return name_; }
  std::string_view text() const noexcept { return text_; }
  /// Lower-case hex SHA1 of text(), as SCRIPT LOAD returns it.
  const std::string& sha() const noexcept { return sha_; }

 private:
  std::string_view name_;
  std::string_view text_;
  std::string sha_;
};

namespace scripts {
extern const Script kAcquire;
extern const Script kRelease;
extern const Script kCancel;
extern const Script kHeartbeat;
extern const Script kRestore;
extern const Script kConfigure;
extern const Script kSnapshot;
extern const Script kLeave;

/// Every script, for Connection::set_preload (SCRIPT LOAD on each connect).
std::vector<std::vector<std::string>> preload_commands();
}  // namespace scripts

/// The shapes of the scripts' replies (has_shape, redis/reply.hpp), verdict
/// first where there is one; each script's header says what each element is.
/// The limiter reads a reply of any other shape as a bad reply (a failure),
/// never one of its fields as a plausible value.
namespace shapes {
inline constexpr std::string_view kVerdict = "s";         // {'granted'}, {'lost'}, {'removed'}, ...
inline constexpr std::string_view kQueued = "sii|i";      // {'queued', order, position, estimate}
inline constexpr std::string_view kRejected = "ss";       // {'rejected', reason}
inline constexpr std::string_view kReleased = "ii";       // {released, grants made}
inline constexpr std::string_view kLeft = "ii";           // {left, grants made}
inline constexpr std::string_view kConfigured = "s[ss]";  // {'ok', the cfg hash}
/// lost, held, head_order, queued, in_use, the cfg hash, reaped, granted,
/// created, away, fence_left, my_waiters, epoch, older, instances, Redis' now,
/// positions (under tenant fairness, of the waiters asked about), the queue's
/// version (under tenant fairness, while waiters are asked about; else ''), this
/// instance's liveness deadline as the call found it.
inline constexpr std::string_view kHeartbeat = "i[s]iii[ss]iiiiiiii[s]|i[i]si";
/// 'ok', permits, waiters, granted, orders (n, order), held, in_use,
/// fence_left, was_registered, fenced, released (the orphans released).
inline constexpr std::string_view kRestored = "sii[i][ii][s]iiii[s]";
/// 'ok', now, in_use, queued, holders (id, tenant, granted), waiters (id,
/// tenant, arrived, position), instances.
inline constexpr std::string_view kSnapshot = "siii[ssi][ssii][s]";

/// Every shape a reply of `script` may have.
std::vector<std::string_view> of(const Script& script);
}  // namespace shapes

/// Calls `script` with EVALSHA. Scripts are loaded on every (re)connect before
/// any call (Connection::set_preload), so NOSCRIPT means the script cache was
/// flushed while connected (SCRIPT FLUSH). The call did not run then, but calls
/// sent after it may have: it is repeated (after SCRIPT LOAD) only if
/// `still_wanted` (empty = always) says so at that moment, since only the caller
/// knows whether running it late is still right; otherwise `callback` gets
/// Error::no_script. `callback` runs once on the connection's strand.
/// `timeout`: of each command (default: the connection's); `asking`: ASKING
/// first (a Cluster ASK redirection).
void call_script(Connection& connection, const Script& script, const std::vector<std::string>& keys,
                 const std::vector<std::string>& args, Connection::Callback callback,
                 std::function<bool()> still_wanted = {},
                 std::optional<std::chrono::milliseconds> timeout = std::nullopt, bool asking = false);

/// Every key of limiter `base` ("<prefix>:{<name>}:"), in the order the scripts
/// expect them as KEYS (src/redis/scripts/lib.lua): cfg, holders, queue, seq,
/// instances, byinst, then the tenant keys ptenant, tready, tparked, tholders,
/// tcredit, trot.
std::vector<std::string> limiter_keys(const std::string& base);

/// The member a limiter's holders zset keeps beside its permits while the
/// state exists: a holders key without it was deleted with the permits in it
/// (src/redis/scripts/lib.lua, HOLDERS_MARK; docs/design.md, recovery rule 15).
inline constexpr std::string_view kHoldersMark = "!";

/// The field a tholders hash keeps beside the tenants' counts while the limiter
/// is tenant-aware (src/redis/scripts/lib.lua, TENANTS_MARK): no tenant has a space.
inline constexpr std::string_view kTenantsMark = "* mark";

/// The command that counts the permits of holders key `key`: every member but the mark.
inline std::vector<std::string> count_permits(const std::string& key) {
  return {"ZLEXCOUNT", key, "(" + std::string(kHoldersMark), "+"};
}

}  // namespace fairgate::redis
