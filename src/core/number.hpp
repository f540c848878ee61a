// core/number.hpp — a whole text as one number, nothing before or after it.
#pragma once

#include <charconv>
#include <optional>
#include <string_view>
#include <system_error>

namespace fairgate::core {

/// `text` as a T when all of it is one number in T's range ("12"; not "",
/// " 12", "12ms", "+12" or "1e3"); no value otherwise. Used by everything that
/// reads a number from text it did not write itself: query strings, Redis
/// replies and hashes, URLs, permit ids.
template <typename T>
std::optional<T> parse_number(std::string_view text) noexcept {
  T value{};
  if (text.empty()) return std::nullopt;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace fairgate::core
