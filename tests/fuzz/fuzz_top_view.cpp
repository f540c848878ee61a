// tests/fuzz/fuzz_top_view.cpp — what `fairgate top` makes of a server's
// JSON (src/cli/top_view.cpp): any reply is either read or refused with one
// line, and the screen drawn from it keeps its promise — at most `height`
// lines of at most `width` ASCII characters — whatever names, tenants or
// numbers the server sent.
//
// Input: width, height and sort key bytes; GET /v1/limiters' JSON up to '\n';
// the rest is GET /v1/limiters/{name}'s.
#include "fuzz/check.hpp"

#include "cli/top_view.hpp"

#include <cstdint>
#include <string>

using namespace fairgate::cli;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fairgate::fuzz::Input in(data, size);
  const std::size_t width = 40 + in.byte() % 160;
  const std::size_t height = 10 + in.byte() % 60;
  const auto sort = static_cast<top::SortKey>(in.byte() % 4);
  const std::string_view list_json = in.line();
  const std::string_view detail_json = in.rest();

  top::Screen screen;
  screen.url = "http://127.0.0.1:8080";
  screen.status = "live";
  screen.clock = "14:20:01";
  screen.sort = sort;
  std::string error;
  if (auto rows = top::parse_limiters(list_json, error)) {
    top::RateTracker rates;
    const auto t0 = top::RateTracker::Clock::time_point{};
    rates.observe(*rows, t0);
    rates.observe(*rows, t0 + std::chrono::seconds(1));
    top::sort_rows(*rows, sort);
    screen.rows = std::move(*rows);
    if (!screen.rows.empty()) screen.selected = screen.rows.front().name;
  } else {
    FUZZ_CHECK(fairgate::fuzz::is_clear_message(error), error);
  }
  error.clear();
  if (auto detail = top::parse_detail(detail_json, error)) {
    screen.detail = std::move(*detail);
  } else {
    FUZZ_CHECK(fairgate::fuzz::is_clear_message(error), error);
  }
  const auto lines = top::render(screen, width, height);
  FUZZ_CHECK(lines.size() <= height, "at most height lines");
  for (const auto& line : lines) {
    FUZZ_CHECK(line.size() <= width, line);
    for (const unsigned char c : line) FUZZ_CHECK(c >= 0x20 && c < 0x7f, line);
  }
  return 0;
}
