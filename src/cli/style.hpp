// cli/style.hpp — ANSI colors for terminal output, off unless stdout is a
// terminal (and NO_COLOR is unset, TERM is not "dumb", no --no-color).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <unistd.h>

namespace fairgate::cli {

class Style {
 public:
  explicit Style(bool enabled) noexcept : enabled_(enabled) {}

  /// Whether `stream` should get colors when the user did not turn them off.
  static bool wanted_for(std::FILE* stream) noexcept {
    const char* no_color = std::getenv("NO_COLOR");
    if (no_color != nullptr && *no_color != '\0') return false;
    const char* term = std::getenv("TERM");
    if (term != nullptr && std::string_view(term) == "dumb") return false;
    return ::isatty(::fileno(stream)) == 1;
  }

  bool enabled() const noexcept { return enabled_; }

  std::string dim(std::string_view s) const { return wrap("2", s); }
  std::string bold(std::string_view s) const { return wrap("1", s); }
  std::string red(std::string_view s) const { return wrap("31", s); }
  std::string green(std::string_view s) const { return wrap("32", s); }
  std::string yellow(std::string_view s) const { return wrap("33", s); }
  std::string cyan(std::string_view s) const { return wrap("36", s); }
  /// One of six distinguishable colors, picked by `index`.
  std::string pick(std::size_t index, std::string_view s) const {
    static constexpr std::string_view kCodes[] = {"36", "35", "34", "33", "32", "31"};
    return wrap(kCodes[index % std::size(kCodes)], s);
  }

 private:
  std::string wrap(std::string_view code, std::string_view s) const {
    if (!enabled_) return std::string(s);
    std::string out;
    out.reserve(s.size() + code.size() + 8);
    out += "\x1b[";
    out += code;
    out += 'm';
    out += s;
    out += "\x1b[0m";
    return out;
  }

  bool enabled_;
};

}  // namespace fairgate::cli
