// tests/fuzz/fuzz_usage_tap.cpp — the gateway's reading of an upstream
// answer for the tokens it used (src/gateway/usage.cpp, docs/ratelimit.md
// "Token budgets"). Whatever the model server sends, the usage read is a
// count (never negative: a token budget refunds reservation − usage), and it
// does not depend on how the answer was cut into reads.
//
// Input: status and content-type bytes, split points, then the body.
#include "fuzz/check.hpp"

#include "gateway/usage.hpp"

#include <cstdint>
#include <vector>

using fairgate::serve::UsageTap;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fairgate::fuzz::Input in(data, size);
  const unsigned status = in.byte() % 2 == 0 ? 200 : 100 + in.byte() % 500;
  const std::string_view type = in.byte() % 2 == 0 ? "text/event-stream; charset=utf-8" : "application/json";
  std::vector<std::size_t> cuts;
  for (unsigned n = in.byte() % 8; n > 0; --n) cuts.push_back(in.byte());
  const std::string_view body = in.rest();

  UsageTap whole;
  whole.start(status, type);
  whole.feed(body.data(), body.size());
  whole.finish();
  if (whole.usage_total) FUZZ_CHECK(*whole.usage_total >= 0, "usage is a count");
  FUZZ_CHECK(whole.streamed >= 0, "chunks are a count");

  UsageTap pieces;
  pieces.start(status, type);
  std::size_t at = 0;
  for (const std::size_t c : cuts) {
    const std::size_t n = std::min(c, body.size() - at);
    pieces.feed(body.data() + at, n);
    at += n;
  }
  pieces.feed(body.data() + at, body.size() - at);
  pieces.finish();
  FUZZ_CHECK(pieces.usage_total == whole.usage_total, "the same usage, however the reads were cut");
  FUZZ_CHECK(pieces.streamed == whole.streamed, "the same chunk count, however the reads were cut");
  return 0;
}
