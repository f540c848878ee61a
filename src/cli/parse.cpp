#include "cli/parse.hpp"

#include "core/text.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <system_error>

namespace fairgate::cli {

std::string quoted(std::string_view text) { return core::quoted(text, 40); }

namespace {

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (const char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

Parsed<std::uint64_t> parse_count(std::string_view text, std::uint64_t lo, std::uint64_t hi) {
  using P = Parsed<std::uint64_t>;
  const std::string range = fmt::format("not in {}..{}", lo, hi);
  if (text.empty()) return P::fail(fmt::format("empty value, expected a whole number in {}..{}", lo, hi));
  // "-3" is a whole number, just out of range.
  if (text.front() == '-' && all_digits(text.substr(1))) return P::fail(fmt::format("{} {}", text, range));
  if (!all_digits(text)) return P::fail(fmt::format("{} is not a whole number", quoted(text)));
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::result_out_of_range) return P::fail(fmt::format("{} {}", text, range));
  if (ec != std::errc{} || end != text.data() + text.size()) {
    return P::fail(fmt::format("{} is not a whole number", quoted(text)));
  }
  if (value < lo || value > hi) return P::fail(fmt::format("{} {}", value, range));
  return P::ok(value);
}

Parsed<double> parse_number(std::string_view text, double lo, double hi) {
  using P = Parsed<double>;
  if (text.empty()) return P::fail(fmt::format("empty value, expected a number in {}..{}", lo, hi));
  // Only plain decimal notation: digits with at most one '.', optional leading '-'.
  std::string_view body = text.front() == '-' ? text.substr(1) : text;
  bool digit = false;
  int dots = 0;
  for (const char c : body) {
    if (c >= '0' && c <= '9') {
      digit = true;
    } else if (c == '.') {
      ++dots;
    } else {
      digit = false;
      dots = 2;
      break;
    }
  }
  if (!digit || dots > 1) return P::fail(fmt::format("{} is not a number", quoted(text)));
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || !std::isfinite(value)) {
    return P::fail(fmt::format("{} not in {}..{}", text, lo, hi));
  }
  if (!(value >= lo && value <= hi)) return P::fail(fmt::format("{} not in {}..{}", text, lo, hi));
  return P::ok(value);
}

}  // namespace fairgate::cli
