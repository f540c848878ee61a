// What `fairgate top` draws (src/cli/top_view.cpp): the server's JSON into
// rows, per-second rates, sorting, and a screen that fits the terminal.
#include "cli/top_view.hpp"

#include <gtest/gtest.h>

#include <regex>

#include <fmt/format.h>

#include <string>
#include <vector>

namespace {

using namespace fairgate::cli::top;
using namespace std::chrono_literals;

const char* kTwo = R"({"limiters":[
  {"name":"chat","max_concurrent":3,"in_use":3,"queued":7,"estimated_wait_ms":4200,"enabled":true,
   "degraded":false,"stats":{"grants":10,"timeouts":1,"rejections":2}},
  {"name":"export","max_concurrent":2,"in_use":1,"queued":0,"estimated_wait_ms":null,"enabled":false,
   "degraded":false,"stats":{"grants":5,"timeouts":0,"rejections":0}}]})";

TEST(TopView, ParsesTheLimiters) {
  std::string error;
  const auto rows = parse_limiters(kTwo, error);
  ASSERT_TRUE(rows) << error;
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].name, "chat");
  EXPECT_EQ((*rows)[0].in_use, 3);
  EXPECT_EQ((*rows)[0].queued, 7);
  EXPECT_EQ((*rows)[0].estimated_wait_ms, 4200);
  EXPECT_EQ((*rows)[0].counters.rejections, 2);
  EXPECT_FALSE((*rows)[1].estimated_wait_ms);
  EXPECT_FALSE((*rows)[1].enabled);
}

TEST(TopView, BadJsonIsAnErrorNotACrash) {
  std::string error;
  EXPECT_FALSE(parse_limiters("{", error));
  EXPECT_NE(error.find("not JSON"), std::string::npos);
  EXPECT_FALSE(parse_limiters(R"({"limiters":3})", error));
  EXPECT_EQ(error, "no \"limiters\" array");
  EXPECT_FALSE(parse_detail(R"({"name":"x"})", error));
  // Entries of the wrong type are skipped.
  const auto rows =
      parse_limiters(R"({"limiters":[1,"x",{"in_use":2},{"name":"ok","in_use":"many"}]})", error);
  ASSERT_TRUE(rows);
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].in_use, 0);
}

TEST(TopView, RatesComeFromCounterDeltas) {
  RateTracker tracker;
  const auto t0 = RateTracker::Clock::time_point{} + 100s;
  std::vector<LimiterRow> rows(1);
  rows[0].name = "chat";
  rows[0].counters = {100, 10, 0};
  tracker.observe(rows, t0);
  EXPECT_FALSE(rows[0].rates) << "one sample is no rate";
  rows[0].counters = {120, 10, 4};
  tracker.observe(rows, t0 + 2s);
  ASSERT_TRUE(rows[0].rates);
  EXPECT_DOUBLE_EQ(rows[0].rates->grants, 10.0);
  EXPECT_DOUBLE_EQ(rows[0].rates->timeouts, 0.0);
  EXPECT_DOUBLE_EQ(rows[0].rates->rejections, 2.0);
  // Old samples leave the 5 s window.
  rows[0].counters = {130, 10, 4};
  tracker.observe(rows, t0 + 8s);
  ASSERT_TRUE(rows[0].rates);
  EXPECT_DOUBLE_EQ(rows[0].rates->grants, 10.0 / 6.0);
  // A restarted instance (counters went down) restarts the window instead of a negative rate.
  rows[0].counters = {3, 0, 0};
  tracker.observe(rows, t0 + 9s);
  EXPECT_FALSE(rows[0].rates);
}

TEST(TopView, SortsByTheChosenKey) {
  std::vector<LimiterRow> rows(3);
  rows[0].name = "b";
  rows[0].queued = 5;
  rows[1].name = "c";
  rows[1].queued = 9;
  rows[1].in_use = 1;
  rows[2].name = "a";
  rows[2].estimated_wait_ms = 100;
  sort_rows(rows, SortKey::queued);
  EXPECT_EQ(rows[0].name + rows[1].name + rows[2].name, "cba");
  sort_rows(rows, SortKey::name);
  EXPECT_EQ(rows[0].name + rows[1].name + rows[2].name, "abc");
  sort_rows(rows, SortKey::wait);
  EXPECT_EQ(rows[0].name, "a");
  sort_rows(rows, SortKey::in_use);
  EXPECT_EQ(rows[0].name, "c");
  EXPECT_EQ(next(SortKey::wait), SortKey::name);
  EXPECT_EQ(parse_sort_key("in_use"), SortKey::in_use);
  EXPECT_FALSE(parse_sort_key("size"));
}

Screen busy_screen(std::size_t limiters, std::size_t holders, std::size_t waiters) {
  Screen sc;
  sc.url = "http://127.0.0.1:8080";
  sc.status = "live";
  for (std::size_t i = 0; i < limiters; ++i) {
    LimiterRow r;
    r.name = fmt::format("limiter-{:03}", i);
    r.max_concurrent = 3;
    sc.rows.push_back(r);
  }
  sc.selected = sc.rows.front().name;
  Detail d;
  d.name = sc.selected;
  for (std::size_t i = 0; i < holders; ++i) d.holders.push_back({fmt::format("p{}", i), "tenant-a", 1000});
  for (std::size_t i = 0; i < waiters; ++i)
    d.queue.push_back({fmt::format("t{}", i), "tenant-b", static_cast<std::int64_t>(i + 1), 500});
  sc.detail = d;
  return sc;
}

TEST(TopView, ThousandWaitersFitEightyByTwentyFour) {
  const auto lines = render(busy_screen(40, 30, 1000), 80, 24);
  ASSERT_EQ(lines.size(), 24u);
  for (const auto& l : lines) EXPECT_LE(l.size(), 80u) << l;
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  EXPECT_NE(all.find("> limiter-000"), std::string::npos) << all;
  EXPECT_NE(all.find("more limiters"), std::string::npos) << all;
  EXPECT_NE(all.find("limiter-000: 30 holding, longest 1.0s; 1000 waiting, longest 0.5s"), std::string::npos)
      << all;
  // The lists that do not fit end in a count of the rest, on the last line.
  EXPECT_NE(lines.back().find("more"), std::string::npos) << all;
}

// Names, tenants and ids come from the server: a tab, an escape or a UTF-8
// byte would move the cursor or take a column the layout did not count.
TEST(TopView, WhatTheServerSentIsDrawnAsPrintableAscii) {
  Screen sc = busy_screen(2, 1, 1);
  sc.rows[1].name = "caf\xc3\xa9\t\x1b[2J";
  sc.detail->holders[0].tenant = "t\x1b]0;title\x07";
  const auto lines = render(sc, 80, 24);
  std::string all;
  for (const auto& l : lines) {
    EXPECT_LE(l.size(), 80u) << l;
    for (const unsigned char c : l) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << l;
    all += l + "\n";
  }
  EXPECT_NE(all.find("caf????[2J"), std::string::npos) << all;
  EXPECT_NE(all.find("t?]0;title?"), std::string::npos) << all;
}

// The server lists the first page (100) of every instance's holders and queue
// with the totals: the summary and the "... N more" count the totals.
TEST(TopView, TotalsBeyondTheListedPageAreCounted) {
  std::string error;
  const auto d = parse_detail(
      R"({"name":"chat","holders":[],"queue":[{"ticket":"a|1","tenant":"","position":1,"waited_ms":5,)"
      R"("instance":"a"}],"holders_total":0,"queue_total":5000})",
      error);
  ASSERT_TRUE(d) << error;
  EXPECT_EQ(d->queue_total, 5000);
  Screen sc = busy_screen(1, 2, 100);
  sc.detail->queue_total = 5000;
  std::string all;
  for (const auto& l : render(sc, 80, 24)) all += l + "\n";
  EXPECT_NE(all.find("2 holding, longest 1.0s; 5000 waiting"), std::string::npos) << all;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(all, m, std::regex(R"(\.\.\. ([0-9]+) more\s*\n$)"))) << all;
  EXPECT_GT(std::stoi(m[1].str()), 4900) << all;
  // All 100 listed rows fit (--once draws on a tall page): the rest is still counted, side by
  // side as well as stacked (the side-by-side layout ended without it).
  for (const std::size_t width : {100u, 50u}) {
    const auto tall = render(sc, width, 400);
    EXPECT_NE(tall.back().find("... 4900 more"), std::string::npos) << width << ": " << tall.back();
  }
}

TEST(TopView, NarrowTerminalsStackTheLists) {
  const auto lines = render(busy_screen(2, 2, 3), 50, 40);
  std::string all;
  for (const auto& l : lines) {
    EXPECT_LE(l.size(), 50u) << l;
    all += l + "\n";
  }
  const auto holders = all.find("  HOLDERS\n"), queue = all.find("  QUEUE\n");
  ASSERT_NE(holders, std::string::npos) << all;
  ASSERT_NE(queue, std::string::npos) << all;
  EXPECT_LT(holders, queue);
  EXPECT_NE(all.find("p1"), std::string::npos) << all;
  EXPECT_NE(all.find("t2"), std::string::npos) << all;
}

TEST(TopView, ATerminalTooSmallGetsOneLineThatSaysSo) {
  // Drawn at 40x10 anyway, every line wrapped and the header scrolled away.
  const auto lines = render(busy_screen(2, 2, 3), 30, 8);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_LE(lines[0].size(), 30u);
  EXPECT_EQ(lines[0].rfind("terminal 30x8", 0), 0u) << lines[0];
  EXPECT_TRUE(render(busy_screen(2, 2, 3), 0, 0).empty());
}

TEST(TopView, StatesAndDurations) {
  Screen sc = busy_screen(3, 0, 0);
  sc.detail.reset();
  sc.rows[1].enabled = false;
  sc.rows[2].fence_left_ms = 1500;
  const auto lines = render(sc, 100, 20);
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  EXPECT_NE(all.find("disabled"), std::string::npos) << all;
  EXPECT_NE(all.find("fenced 1.5s"), std::string::npos) << all;
  // Shadow mode (docs/shadow.md): the state says so, with what runs for real.
  std::string error;
  const auto shadow = parse_limiters(
      R"({"limiters":[{"name":"s","in_use":3,"max_concurrent":3,"mode":"shadow","shadow":{"in_flight":7}}]})",
      error);
  ASSERT_TRUE(shadow && shadow->size() == 1) << error;
  sc.rows = *shadow;
  std::string drawn;
  for (const auto& l : render(sc, 100, 20)) drawn += l + "\n";
  EXPECT_NE(drawn.find("shadow 7 run"), std::string::npos) << drawn;
  // At 80 columns too, whole (it was cut to 8 characters: "shadow 1").
  sc.rows[0].shadow_in_flight = 12;
  sc.rows.push_back(sc.rows[0]);
  sc.rows[1].name = "fenced-limiter-name";
  sc.rows[1].shadow = false;
  sc.rows[1].fence_left_ms = 10'000;
  drawn.clear();
  for (const auto& l : render(sc, 80, 24)) {
    EXPECT_LE(l.size(), 80u) << l;
    drawn += l + "\n";
  }
  EXPECT_NE(drawn.find("shadow 12 run\n"), std::string::npos) << drawn;
  EXPECT_NE(drawn.find("fenced 10s\n"), std::string::npos) << drawn;
  EXPECT_EQ(duration_text(420), "0.4s");
  EXPECT_EQ(duration_text(42'000), "42s");
  EXPECT_EQ(duration_text(723'000), "12m03s");
  EXPECT_EQ(duration_text(7'500'000), "2h05m");
  EXPECT_EQ(duration_text(-5), "0.0s");
}

}  // namespace
