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

/// `text` with every byte that is not part of well-formed UTF-8 (RFC 3629: no
/// overlong forms, no surrogates, nothing above U+10FFFF) replaced by U+FFFD.
/// JSON is UTF-8 (RFC 8259): outside bytes echoed into an answer or a JSON log
/// line (a path segment %ff, a query value) must not make it unreadable.
inline std::string valid_utf8(std::string text) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const auto continuation = [&](std::size_t i) { return i < text.size() && (byte(i) & 0xc0) == 0x80; };
  // The length of the well-formed sequence at i, or 0.
  const auto sequence = [&](std::size_t i) -> std::size_t {
    const unsigned char b = byte(i);
    if (b < 0x80) return 1;
    if (b >= 0xc2 && b <= 0xdf) return continuation(i + 1) ? 2 : 0;
    if (b >= 0xe0 && b <= 0xef) {
      if (!continuation(i + 1) || !continuation(i + 2)) return 0;
      const unsigned char b1 = byte(i + 1);
      if ((b == 0xe0 && b1 < 0xa0) || (b == 0xed && b1 > 0x9f)) return 0;  // overlong; surrogate
      return 3;
    }
    if (b >= 0xf0 && b <= 0xf4) {
      if (!continuation(i + 1) || !continuation(i + 2) || !continuation(i + 3)) return 0;
      const unsigned char b1 = byte(i + 1);
      if ((b == 0xf0 && b1 < 0x90) || (b == 0xf4 && b1 > 0x8f)) return 0;  // overlong; > U+10FFFF
      return 4;
    }
    return 0;
  };
  std::size_t i = 0;
  while (i < text.size()) {  // the common case: nothing to replace, no copy
    const std::size_t n = sequence(i);
    if (n == 0) break;
    i += n;
  }
  if (i == text.size()) return text;
  std::string out = text.substr(0, i);
  while (i < text.size()) {
    const std::size_t n = sequence(i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(text, i, n);
      i += n;
    }
  }
  return out;
}

}  // namespace fairgate::core
