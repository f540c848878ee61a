// core/text.hpp — outside text echoed in a message (an error, a log line)
// with its control characters made visible, so the message stays one line
// and cannot move a terminal's cursor. Header-only: the HTTP layer, which
// links no other layer, uses it too.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace fairgate::core {

/// `text` with each control character (below 0x20, and 0x7f) as \xNN;
/// every other byte as it is.
inline std::string escape_controls(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 0xf];
    } else {
      out += c;
    }
  }
  return out;
}

/// "text" in double quotes, control characters escaped, cut to `max` bytes
/// (then "..." after the closing quote's text).
inline std::string quoted(std::string_view text, std::size_t max = 40) {
  std::string out = "\"" + escape_controls(text.substr(0, max));
  if (text.size() > max) out += "...";
  out += '"';
  return out;
}

}  // namespace fairgate::core
