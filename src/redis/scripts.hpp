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

/// Every script, for Connection::set_preload (SCRIPT LOAD on each connect).
std::vector<std::vector<std::string>> preload_commands();
}  // namespace scripts

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

}  // namespace fairgate::redis
