// redis/log_level.hpp — the level of a Redis backend message for the
// library's log sink (fairgate/log.hpp): a setup that breaks the cap is an
// error, problems (failures, degraded mode, fences, lost connections) are
// warnings, other state changes information.
#pragma once

#include <fairgate/log.hpp>

#include <array>
#include <string_view>

namespace fairgate::redis {

inline LogLevel level_of(std::string_view line) noexcept {
  if (line.find("the cap does not hold") != std::string_view::npos) return LogLevel::error;
  // A recovery is information, though it names what it recovers from.
  if (line.find("left degraded mode") != std::string_view::npos) return LogLevel::info;
  static constexpr std::array<std::string_view, 25> kProblems = {"fail",
                                                                 "degraded",
                                                                 "unexpected",
                                                                 "cannot",
                                                                 "lost",
                                                                 "no node",
                                                                 "unreachable",
                                                                 "fence",
                                                                 "overshoot",
                                                                 "timeout",
                                                                 "refused",
                                                                 "error",
                                                                 "no sentinel",
                                                                 "wants a password",
                                                                 "out of memory",
                                                                 "may evict",
                                                                 "refuses",
                                                                 "busy running a script",
                                                                 "turns this client away",
                                                                 "does not know",
                                                                 "timed out",
                                                                 "before any reply",
                                                                 "answered with TLS",
                                                                 "no reply",
                                                                 "ended before"};
  for (const auto word : kProblems)
    if (line.find(word) != std::string_view::npos) return LogLevel::warn;
  return LogLevel::info;
}

}  // namespace fairgate::redis
