// api/log.cpp — the process-wide sink of the library's messages (fairgate/log.hpp).
//
// The sink is held by a shared_ptr swapped under a mutex: a message takes a
// reference and calls the sink outside the lock, so a slow sink never blocks
// set_log_sink() and a sink being replaced stays alive until its last call ends.
#include <fairgate/log.hpp>

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace fairgate {
namespace {

void to_stderr(LogLevel level, std::string_view line) {
  if (level < LogLevel::info || level >= LogLevel::off) return;
  std::string text = "fairgate: ";
  text.append(line);
  text.push_back('\n');
  std::fputs(text.c_str(), stderr);
}

struct SinkHolder {
  std::mutex mu;
  std::shared_ptr<const LogSink> sink;
};

SinkHolder& holder() {
  static SinkHolder h;  // constructed on first use; never destroyed before its users (function-local static)
  return h;
}

}  // namespace

std::string_view to_string(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::trace: return "trace";
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warn: return "warn";
    case LogLevel::error: return "error";
    case LogLevel::off: return "off";
  }
  return "info";
}

void set_log_sink(LogSink sink) {
  auto next = sink ? std::make_shared<const LogSink>(std::move(sink)) : nullptr;
  std::shared_ptr<const LogSink> old;
  {
    auto& h = holder();
    std::lock_guard lock(h.mu);
    old = std::exchange(h.sink, std::move(next));
  }
  // `old` (and what it captured) is destroyed here, outside the lock.
}

LogSink discard_log_sink() {
  return [](LogLevel, std::string_view) {};
}

void log(LogLevel level, std::string_view line) {
  std::shared_ptr<const LogSink> sink;
  {
    auto& h = holder();
    std::lock_guard lock(h.mu);
    sink = h.sink;
  }
  if (sink) {
    (*sink)(level, line);
  } else {
    to_stderr(level, line);
  }
}

}  // namespace fairgate
