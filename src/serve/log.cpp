// serve/log.cpp — spdlog underneath: the logger filters by level, stamps the
// time (UTC, milliseconds) and writes through a thread-safe (_mt) sink; the
// level name and the line (text, or the JSON members) are written here, so
// both formats name levels alike ("warn", not spdlog's "warning") and a JSON
// line is always one well-formed object.
#include "serve/log.hpp"

#include "core/text.hpp"

#include <boost/json/serialize.hpp>
#include <boost/json/string.hpp>

#include <fmt/format.h>
#include <spdlog/logger.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace fairgate::serve {
namespace {

namespace json = boost::json;

spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::trace: return spdlog::level::trace;
    case LogLevel::debug: return spdlog::level::debug;
    case LogLevel::info: return spdlog::level::info;
    case LogLevel::warn: return spdlog::level::warn;
    case LogLevel::error: return spdlog::level::err;
    case LogLevel::off: return spdlog::level::off;
  }
  return spdlog::level::info;
}

void emit(spdlog::logger& logger, LogFormat format, LogLevel level, std::string_view msg,
          const json::object* fields) {
  const auto lvl = to_spdlog(level);
  if (level == LogLevel::off || !logger.should_log(lvl)) return;
  std::string line;
  if (format == LogFormat::json) {
    line = fmt::format("\"level\":\"{}\",\"msg\":{}", to_string(level), json::serialize(json::string(msg)));
    if (fields) {
      for (const auto& [key, value] : *fields) {
        line += ',';
        line += json::serialize(json::string(key));
        line += ':';
        // Doubles as written by hand ("3.6", not Boost.JSON's "3.6E0").
        line += value.is_double() ? fmt::format("{}", value.get_double()) : json::serialize(value);
      }
    }
    line += '}';
    line = core::valid_utf8(std::move(line));  // JSON is UTF-8: outside bytes in a path, a name
  } else {
    line = fmt::format("{} ", to_string(level));
    // One message, one line: a newline inside would start a line of its own.
    for (const char c : msg) line += (c == '\n' || c == '\r') ? ' ' : c;
  }
  logger.log(lvl, spdlog::string_view_t(line.data(), line.size()));
}

}  // namespace

std::optional<LogLevel> parse_log_level(std::string_view text) {
  for (const auto level :
       {LogLevel::trace, LogLevel::debug, LogLevel::info, LogLevel::warn, LogLevel::error, LogLevel::off})
    if (text == to_string(level)) return level;
  return std::nullopt;
}

std::optional<LogFormat> parse_log_format(std::string_view text) {
  if (text == "text") return LogFormat::text;
  if (text == "json") return LogFormat::json;
  return std::nullopt;
}

std::string_view to_string(LogFormat format) noexcept { return format == LogFormat::json ? "json" : "text"; }

Log::Log()
    : logger_(std::make_shared<spdlog::logger>("fairgate", std::make_shared<spdlog::sinks::null_sink_mt>())) {
  logger_->set_level(spdlog::level::off);
}

Log::Log(const LogConfig& config, std::FILE* out)
    : logger_(std::make_shared<spdlog::logger>(
          "fairgate",
          std::make_shared<spdlog::sinks::stdout_sink_base<spdlog::details::console_mutex>>(out))),
      format_(config.format),
      access_(config.access_log) {
  // The JSON object is opened here, closed by emit() (which writes its members).
  const std::string pattern =
      config.format == LogFormat::json ? R"({"time":"%Y-%m-%dT%H:%M:%S.%eZ",%v)" : "%Y-%m-%dT%H:%M:%S.%eZ %v";
  logger_->set_formatter(
      std::make_unique<spdlog::pattern_formatter>(pattern, spdlog::pattern_time_type::utc));
  logger_->set_level(to_spdlog(config.level));
  logger_->flush_on(spdlog::level::trace);  // every line at once: other programs wait for "listening on"
}

Log::~Log() = default;

bool Log::enabled(LogLevel level) const noexcept {
  return level != LogLevel::off && logger_->should_log(to_spdlog(level));
}

void Log::write(LogLevel level, std::string_view msg, const json::object* fields) const {
  emit(*logger_, format_, level, msg, fields);
}

void Log::access(const AccessEntry& e) const {
  if (!access_enabled()) return;
  std::string msg = fmt::format("access: {} {} {} {:.1f}ms", e.method, e.path, e.status, e.duration_ms);
  if (!e.route.empty()) msg += fmt::format(" route={}", e.route);
  if (!e.limiter.empty()) msg += fmt::format(" limiter={}", e.limiter);
  if (!e.outcome.empty()) msg += fmt::format(" outcome={}", e.outcome);
  if (e.wait_ms) msg += fmt::format(" wait_ms={}", *e.wait_ms);
  if (format_ == LogFormat::text) {
    write(LogLevel::info, msg);
    return;
  }
  json::object f;
  f["method"] = e.method;
  f["path"] = e.path;
  f["status"] = e.status;
  f["duration_ms"] = static_cast<double>(static_cast<long long>(e.duration_ms * 10.0 + 0.5)) / 10.0;
  if (!e.route.empty()) f["route"] = e.route;
  if (!e.limiter.empty()) f["limiter"] = e.limiter;
  if (!e.outcome.empty()) f["outcome"] = e.outcome;
  if (e.wait_ms) f["wait_ms"] = *e.wait_ms;
  write(LogLevel::info, msg, &f);
}

LogSink Log::library_sink() const {
  return [logger = logger_, format = format_](LogLevel level, std::string_view line) {
    emit(*logger, format, level, fmt::format("fairgate: {}", line), nullptr);
  };
}

}  // namespace fairgate::serve
