#include "cli/duration.hpp"

#include <fmt/format.h>

#include <cstdint>

namespace fairgate::cli {

namespace {

constexpr std::string_view kHint = "use ms, s, m or h: 250ms, 20s, 5m";

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::int64_t unit_ms(std::string_view unit) {
  if (unit == "ms") return 1;
  if (unit == "s") return 1'000;
  if (unit == "m") return 60'000;
  if (unit == "h") return 3'600'000;
  return 0;
}

}  // namespace

Parsed<std::chrono::milliseconds> parse_duration(std::string_view text) {
  using P = Parsed<std::chrono::milliseconds>;
  if (text.empty()) return P::fail(fmt::format("empty duration ({})", kHint));
  if (text == "0") return P::ok(std::chrono::milliseconds(0));
  const std::int64_t max_ms = kMaxDuration.count();
  std::int64_t total = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    // <digits>[.<digits>]
    const std::size_t number_start = i;
    std::int64_t whole = 0;
    bool too_big = false;
    while (i < text.size() && is_digit(text[i])) {
      whole = whole * 10 + (text[i] - '0');
      if (whole > max_ms) {
        too_big = true;
        whole = max_ms;
      }
      ++i;
    }
    const bool has_whole = i > number_start;
    std::int64_t frac = 0;
    std::int64_t frac_scale = 1;
    bool has_frac = false;
    if (i < text.size() && text[i] == '.') {
      ++i;
      while (i < text.size() && is_digit(text[i])) {
        has_frac = true;
        if (frac_scale < 1'000'000'000) {
          frac = frac * 10 + (text[i] - '0');
          frac_scale *= 10;
        } else if (text[i] != '0') {
          return P::fail(fmt::format("{} is finer than 1 ms", quoted(text)));
        }
        ++i;
      }
    }
    if (!has_whole && !has_frac) {
      if (text[number_start] == '-') return P::fail(fmt::format("{} is negative", quoted(text)));
      return P::fail(fmt::format("{} is not a duration ({})", quoted(text), kHint));
    }
    // <unit>
    const std::size_t unit_start = i;
    while (i < text.size() && is_letter(text[i])) ++i;
    const std::string_view unit = text.substr(unit_start, i - unit_start);
    if (unit.empty()) {
      if (i < text.size()) return P::fail(fmt::format("{} is not a duration ({})", quoted(text), kHint));
      return P::fail(fmt::format("{} has no unit ({})", quoted(text), kHint));
    }
    const std::int64_t scale = unit_ms(unit);
    if (scale == 0)
      return P::fail(fmt::format("unknown unit {} in {} ({})", quoted(unit), quoted(text), kHint));
    if (too_big || whole > max_ms / scale) return P::fail(fmt::format("{} is too long", quoted(text)));
    // frac / frac_scale of a unit must be a whole number of milliseconds.
    const std::int64_t frac_units = frac * scale;  // frac < 1e9, scale <= 3.6e6: fits in 63 bits
    if (frac_units % frac_scale != 0) return P::fail(fmt::format("{} is finer than 1 ms", quoted(text)));
    total += whole * scale + frac_units / frac_scale;
    if (total > max_ms) return P::fail(fmt::format("{} is too long", quoted(text)));
  }
  return P::ok(std::chrono::milliseconds(total));
}

std::string format_duration(std::chrono::milliseconds d) {
  std::int64_t ms = d.count();
  std::string out;
  if (ms < 0) {
    out = "-";
    ms = -ms;
  }
  if (ms == 0) return "0ms";
  if (ms < 1000) return out + fmt::format("{}ms", ms);
  const std::int64_t hours = ms / 3'600'000;
  const std::int64_t minutes = ms / 60'000 % 60;
  const std::int64_t seconds_ms = ms % 60'000;
  if (hours > 0) out += fmt::format("{}h", hours);
  if (minutes > 0 || (hours > 0 && seconds_ms > 0)) out += fmt::format("{}m", minutes);
  if (seconds_ms > 0) {
    std::string s = fmt::format("{}.{:03}", seconds_ms / 1000, seconds_ms % 1000);
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
    out += s + "s";
  }
  return out;
}

}  // namespace fairgate::cli
