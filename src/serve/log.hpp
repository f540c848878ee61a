// serve/log.hpp — the log of `fairgate serve` (docs/serve.md, "Logs"): one
// spdlog logger with a level, a text or JSON line format and timestamps
// (UTC), shared by every thread of the server, and the sink the library's
// messages (fairgate/log.hpp) go into while the server runs.
//
// Line formats (one line per message):
//   text: 2026-01-02T03:04:05.678Z info fairgate serve: listening on ...
//   json: {"time":"2026-01-02T03:04:05.678Z","level":"info","msg":"fairgate serve: listening on ...", ...}
// where the JSON object may carry more fields (the access log's).
//
// Thread-safety: every member is const and may be called from any thread
// (spdlog's _mt sinks serialize the writes).
#pragma once

#include <fairgate/log.hpp>

#include <boost/json/object.hpp>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace spdlog {
class logger;
}

namespace fairgate::serve {

enum class LogFormat : std::uint8_t { text, json };

/// The log settings: `--log-level`, `--log-format`, `--access-log`, or the
/// `[server]` keys log_level, log_format, access_log.
struct LogConfig {
  LogLevel level = LogLevel::info;
  LogFormat format = LogFormat::text;
  /// One line per HTTP request, at info. Off by default: a log nobody reads
  /// (a pipe left full) would stall every request behind its writes.
  bool access_log = false;
};

/// "trace" ... "off"; nullopt for anything else.
std::optional<LogLevel> parse_log_level(std::string_view text);
/// "text" or "json"; nullopt for anything else.
std::optional<LogFormat> parse_log_format(std::string_view text);
std::string_view to_string(LogFormat format) noexcept;

/// What the access log says of one HTTP request.
struct AccessEntry {
  std::string_view method;
  std::string_view path;  ///< the request target without its query string
  unsigned status = 0;    ///< 0: no response was sent (the client left first)
  double duration_ms = 0;
  std::string_view limiter;  ///< empty: the request asked no limiter
  std::string_view outcome;  ///< "granted", a rejection reason, "client_gone", ...; empty: none
  std::optional<long long> wait_ms;
  std::string_view route;  ///< a gateway route's path; empty: none
};

class Log {
 public:
  /// A log that drops everything (a Server embedded without run_server, e.g. the demo).
  Log();
  /// Writes to `out` (stdout for `fairgate serve`).
  Log(const LogConfig& config, std::FILE* out);
  ~Log();
  Log(const Log&) = delete;
  Log& operator=(const Log&) = delete;

  bool enabled(LogLevel level) const noexcept;
  bool access_enabled() const noexcept { return access_ && enabled(LogLevel::info); }
  /// One line; `fields` are extra members of the JSON object (ignored in text).
  void write(LogLevel level, std::string_view msg, const boost::json::object* fields = nullptr) const;
  void access(const AccessEntry& entry) const;

  /// A sink for fairgate::set_log_sink() that writes the library's messages
  /// here (holding this log's logger, not this object).
  LogSink library_sink() const;

 private:
  std::shared_ptr<spdlog::logger> logger_;
  LogFormat format_ = LogFormat::text;
  bool access_ = false;
};

}  // namespace fairgate::serve
