// tests/fuzz/check.hpp — what a fuzz target asserts beyond "no crash": a
// failed check prints the rule and aborts, which libFuzzer (and the corpus
// runner, tests/fuzz/corpus_main.cpp) reports with the input that did it.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

#define FUZZ_CHECK(cond, what)                                                               \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s (%s)\n", __FILE__, __LINE__, #cond, \
                   std::string_view(what).data());                                           \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)

namespace fairgate::fuzz {

/// An error message a user reads: not empty, one line, no control characters.
inline bool is_clear_message(std::string_view m) {
  if (m.empty()) return false;
  for (const unsigned char c : m)
    if (c < 0x20 || c == 0x7f) return false;
  return true;
}

/// A parser's answer: `ok`, or else what it said must be a clear message.
/// Returns `ok`.
inline bool ok_or_clear(bool ok, std::string_view message) {
  if (!ok) FUZZ_CHECK(is_clear_message(message), message);
  return ok;
}

/// The fuzz input as text, and a reader that takes it apart piece by piece.
class Input {
 public:
  Input(const unsigned char* data, std::size_t size) : text_(reinterpret_cast<const char*>(data), size) {}
  /// The next byte (0 once the input is used up).
  unsigned char byte() {
    if (text_.empty()) return 0;
    const auto c = static_cast<unsigned char>(text_.front());
    text_.remove_prefix(1);
    return c;
  }
  /// Up to the next '\n' (not included), or the rest.
  std::string_view line() {
    const auto nl = text_.find('\n');
    const std::string_view l = text_.substr(0, nl);
    text_.remove_prefix(nl == std::string_view::npos ? text_.size() : nl + 1);
    return l;
  }
  std::string_view rest() {
    const std::string_view r = text_;
    text_ = {};
    return r;
  }
  bool empty() const noexcept { return text_.empty(); }

 private:
  std::string_view text_;
};

}  // namespace fairgate::fuzz
