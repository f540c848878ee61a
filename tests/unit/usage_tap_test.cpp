// tests/unit/usage_tap_test.cpp — what a token budget charges a streamed answer
// (src/gateway/usage.cpp, docs/ratelimit.md "Token budgets"): the usage the
// upstream reports, else one token per streamed chunk with content. Every
// framing server-sent events allows counts the same: LF, CRLF or CR alone
// (also cut between CR and LF), an event's JSON over several data lines; and
// the Responses API's events. A helper saw 4 charged for 34 with CR alone and
// with JSON over two data lines (each line was parsed alone, lines split at LF).
#include "gateway/usage.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace {

using fairgate::serve::UsageTap;

std::string chunk(int i, const std::string& eol) {
  return "data: {\"choices\":[{\"delta\":{\"content\":\"t" + std::to_string(i) + "\"}}]}" + eol + eol;
}

/// Feeds `body` in reads of `step` bytes (0: whole), then ends the answer.
UsageTap tap(const std::string& body, std::size_t step = 0) {
  UsageTap t;
  t.start(200, "text/event-stream");
  if (step == 0) step = body.size();
  for (std::size_t at = 0; at < body.size(); at += step)
    t.feed(body.data() + at, std::min(step, body.size() - at));
  t.finish();
  return t;
}

TEST(UsageTap, EveryLineEndOfServerSentEventsCountsEachChunk) {
  for (const std::string eol : {"\n", "\r\n", "\r"}) {
    std::string body;
    for (int i = 0; i < 30; ++i) body += chunk(i, eol);
    body += "data: [DONE]" + eol + eol;
    for (const std::size_t step : {0, 1, 2, 7}) {
      const UsageTap t = tap(body, step);
      EXPECT_EQ(t.streamed, 30) << "line end "
                                << (eol == "\r"   ? "CR"
                                    : eol == "\n" ? "LF"
                                                  : "CRLF")
                                << ", reads of " << step;
      EXPECT_FALSE(t.usage_total.has_value());
    }
  }
}

TEST(UsageTap, AnEventsJsonOverSeveralDataLinesIsOneChunk) {
  std::string body;
  for (int i = 0; i < 30; ++i)
    body += "event: message\ndata: {\"choices\":[{\"delta\":\n: a comment\ndata: {\"content\":\"t\"}}]}\n\n";
  body += "data: {\"choices\":[],\ndata: \"usage\":{\"total_tokens\":77}}\n\n";
  EXPECT_EQ(tap(body).streamed, 30);
  EXPECT_EQ(tap(body).usage_total, 77);
  EXPECT_EQ(tap(body, 3).streamed, 30);
}

TEST(UsageTap, TheLastEventCountsWithoutTheBlankLineAfterIt) {
  EXPECT_EQ(tap(chunk(1, "\n") + "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}").streamed, 2);
  EXPECT_EQ(tap(chunk(1, "\n") + "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n").streamed, 2);
}

TEST(UsageTap, ResponsesApiDeltasCountAndTheCompletedResponsesUsageIsRead) {
  std::string body =
      "event: response.created\ndata: "
      "{\"type\":\"response.created\",\"response\":{\"status\":\"in_progress\"}}\n\n";
  for (int i = 0; i < 30; ++i)
    body +=
        "event: response.output_text.delta\ndata: "
        "{\"type\":\"response.output_text.delta\",\"delta\":\"t\"}\n\n";
  UsageTap without = tap(body);
  EXPECT_EQ(without.streamed, 30);
  EXPECT_FALSE(without.usage_total.has_value());
  body +=
      "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":"
      "{\"input_tokens\":3,\"output_tokens\":24,\"total_tokens\":27}}}\n\n";
  EXPECT_EQ(tap(body).usage_total, 27);
}

}  // namespace
