// cli/parse.hpp — command-line values: whole numbers and decimal factors,
// with one-line error texts (without the flag name, which the caller adds).
#pragma once

#include "cli/command.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace fairgate::cli {

/// A parsed command-line value, or what is wrong with the text.
template <typename T>
struct Parsed {
  std::optional<T> value;
  /// One line, e.g. `0 not in 1..1000`; empty when value is set.
  std::string error;

  static Parsed ok(T v) { return Parsed{std::move(v), {}}; }
  static Parsed fail(std::string problem) { return Parsed{std::nullopt, std::move(problem)}; }
  explicit operator bool() const noexcept { return value.has_value(); }
};

/// A whole number in lo..hi, e.g. "10".
/// Errors: `"ten" is not a whole number`, `0 not in 1..1000`.
Parsed<std::uint64_t> parse_count(std::string_view text, std::uint64_t lo, std::uint64_t hi);

/// A decimal number in lo..hi, e.g. "2.5" or "10".
/// Errors: `"fast" is not a number`, `0 not in 0.01..1000`.
Parsed<double> parse_number(std::string_view text, double lo, double hi);

/// `text` quoted for an error message, cut to a sane length.
std::string quoted(std::string_view text);

/// The value, or throws UsageError "<flag>: <problem>".
template <typename T>
T checked(std::string_view flag, Parsed<T> parsed) {
  if (!parsed) throw UsageError(std::string(flag) + ": " + parsed.error);
  return *parsed.value;
}

}  // namespace fairgate::cli
