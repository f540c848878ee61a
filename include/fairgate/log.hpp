// fairgate/log.hpp — where the library's own messages go.
//
// libfairgate never writes to stderr or stdout itself. What it has to say
// (the Redis backend's state changes: degraded, restored, fenced, settings
// adopted from Redis, connection problems, ...) goes to one process-wide sink
// that the application sets, e.g. into its own logger:
//
//   fairgate::set_log_sink([](fairgate::LogLevel level, std::string_view line) {
//     my_logger.log(level, line);
//   });
//
// The default sink writes "fairgate: LINE" to stderr (messages at info and
// above), as the library did before the sink existed. set_log_sink({})
// restores it; set_log_sink(discard_log_sink()) silences the library.
// A backend's own RedisBackendOptions::log, when set, takes that backend's
// messages instead of the sink.
//
// Thread-safety: the sink is called from the library's threads (the
// executors' threads), possibly from several at once: it must be thread-safe.
// set_log_sink() may be called at any time from any thread; a call already
// under way finishes with the sink it started with.
#pragma once

#include <functional>
#include <string_view>

namespace fairgate {

/// Severity of a library message, lowest first.
enum class LogLevel : int { trace = 0, debug, info, warn, error, off };

/// "trace", "debug", "info", "warn", "error", "off".
std::string_view to_string(LogLevel level) noexcept;

using LogSink = std::function<void(LogLevel level, std::string_view line)>;

/// Replaces the process-wide sink; an empty function restores the default (stderr).
void set_log_sink(LogSink sink);

/// A sink that drops every message.
LogSink discard_log_sink();

/// Sends one message to the sink in force (for the library and its backends).
void log(LogLevel level, std::string_view line);

}  // namespace fairgate
