// The text `fairgate demo` prints (src/cli/demo/render.cpp), without colors:
// the summary's figures, table and verdict, the header, a timeline line.
#include "cli/demo/render.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using namespace fairgate::cli::demo;
using fairgate::cli::Style;
using namespace std::chrono_literals;

const Clock::time_point t0{};
const Style plain(false);

TEST(DemoRender, SecondsAndWaitRanges) {
  EXPECT_EQ(seconds_text(1.5), "1.50s");
  EXPECT_EQ(wait_range({}), "-");
  EXPECT_EQ(wait_range({1.001, 1.004}), "1.00s");  // equal at the shown precision
  EXPECT_EQ(wait_range({3.0, 1.0, 2.0}), "1.00s .. 3.00s (median 2.00s)");
  EXPECT_EQ(wait_range({4.0, 1.0, 3.0, 2.0}), "1.00s .. 4.00s (median 3.00s)");  // the upper middle
}

TEST(DemoRender, NamesShowTwentyThenHowManyMore) {
  EXPECT_EQ(names({}), "(none)");
  std::vector<Seen> users(22);
  std::vector<const Seen*> list;
  for (std::size_t i = 0; i < users.size(); ++i) {
    users[i].name = "u" + std::to_string(i + 1);
    list.push_back(&users[i]);
  }
  EXPECT_EQ(names({list[0], list[1]}), "u1 u2");
  const std::string all = names(list);
  EXPECT_TRUE(all.starts_with("u1 u2 u3 ")) << all;
  EXPECT_TRUE(all.ends_with(" u19 u20 ... (2 more)")) << all;
}

TEST(DemoRender, BarAndTimelineLine) {
  EXPECT_EQ(bar(plain, 5, 20), "[#####---------------]");
  EXPECT_EQ(bar(plain, 30, 20), "[####################]");
  EXPECT_EQ(bar(plain, 0, 0), "[####################]");
  EXPECT_EQ(timeline_line(plain, 1.2345, 3, "user-03", "hello"), "   1.234s  user-03  hello\n");
}

/// Two users on 2 seats at speed 2: user-1 served (seat after 0.5 s real,
/// answer 1 s real), user-2 told busy after 1 s real.
struct TwoUsers {
  std::vector<Seen> users = std::vector<Seen>(2);
  Summary s;

  TwoUsers() {
    Seen& a = users[0];
    a.name = "user-1";
    a.arrival_rank = 1;
    a.tokens = 5;
    a.streamed = 5;
    a.ends = 1;
    a.phase = Phase::done;
    a.arrived_at = t0;
    a.seated_at = t0 + 500ms;
    a.ended_at = t0 + 1500ms;
    Seen& b = users[1];
    b.name = "user-2";
    b.arrival_rank = 2;
    b.tokens = 7;
    b.ends = 1;
    b.phase = Phase::busy;
    b.arrived_at = t0 + 1ms;
    b.ended_at = t0 + 1001ms;
    s.scale.speed = 2.0;
    s.table = true;
    s.users = {&a, &b};
    s.by_arrival = {Row{&a, "A"}, Row{&b, "B"}};
    s.by_seat = {&a};
    s.fronts = {Front{"http://a", 1}, Front{"http://b", 1}};
    s.total = 1500ms;
    s.facts.seats = 2;
    s.facts.arrivals = 2;
    s.facts.model_peak_in_flight = 1;
    s.facts.model_completed = 1;
    s.facts.final_in_use = 0;
    s.facts.final_queued = 0;
    s.model_requests = 1;
    s.verdict.granted = 1;
    s.verdict.busy = 1;
    s.verdict.under_cap = true;
    s.verdict.limiter_empty = true;
  }
};

TEST(DemoRender, WaitsAreStorySecondsPerOutcome) {
  const TwoUsers r;
  EXPECT_EQ(waits(r.s, Phase::done), std::vector<double>{1.0});
  EXPECT_EQ(waits(r.s, Phase::busy), std::vector<double>{2.0});
  EXPECT_TRUE(waits(r.s, Phase::other).empty());
}

TEST(DemoRender, EndedOnceEachWantsOneEndAndEveryToken) {
  TwoUsers r;
  EXPECT_TRUE(ended_once_each(r.s.users));
  r.users[1].ends = 2;
  EXPECT_FALSE(ended_once_each(r.s.users));
  r.users[1].ends = 1;
  r.users[0].streamed = 4;
  EXPECT_FALSE(ended_once_each(r.s.users));
}

TEST(DemoRender, TheSummaryOfACleanRun) {
  const TwoUsers r;
  EXPECT_EQ(summary_text(plain, r.s),
            "\n"
            "Summary\n"
            "  asked  user      via  outcome   waited   tokens   held\n"
            "    1st  user-1      A  seat       1.00s        5   2.00s\n"
            "    2nd  user-2      B  busy       2.00s        -   -\n"
            "\n"
            "  users:             2 arrived, 1 got a seat, 1 busy\n"
            "  total time:        3.00s\n"
            "  gateways:          A http://a asked by 1, B http://b asked by 1\n"
            "  arrival order:     user-1 user-2\n"
            "  service order:     user-1\n"
            "  FIFO held:         yes \u2014 every seat went to the user waiting longest\n"
            "  max concurrent:    1 of 2 seats (answers in flight at the model, 0 refused) \u2014 never "
            "above the cap\n"
            "  waited for a seat: 1.00s\n"
            "  told busy after:   2.00s\n"
            "  ended once each:   yes\n"
            "  model:             1 requests, 1 answers completed, 0 refused (429)\n"
            "  limiter at end:    in use 0, queued 0 \u2014 every seat given back\n"
            "\n"
            "All invariants held: at most 1 of 2 seats in use, seats in arrival order, max wait kept, "
            "every request ended exactly once.\n");
}

TEST(DemoRender, TheSummaryOfABrokenRun) {
  TwoUsers r;
  r.s.table = false;
  r.users[1].phase = Phase::other;
  r.s.verdict.busy = 0;
  r.s.verdict.other = 1;
  r.s.verdict.fifo_problem = "user-2 before user-1";
  r.s.verdict.under_cap = false;
  r.s.verdict.limiter_empty = false;
  r.s.facts.final_queued.reset();
  r.s.total.reset();
  r.s.violations = {"first", "second"};
  const std::string text = summary_text(plain, r.s);
  EXPECT_EQ(text.find("asked  user"), std::string::npos) << text;  // no table
  EXPECT_EQ(text.find("total time:"), std::string::npos) << text;
  EXPECT_EQ(text.find("told busy after:"), std::string::npos) << text;
  EXPECT_NE(text.find("  users:             2 arrived, 1 got a seat, 0 busy, 1 other\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("  FIFO held:         NO \u2014 user-2 before user-1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\u2014 ABOVE THE CAP\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  limiter at end:    in use 0, queued ? \u2014 NOT EMPTY\n"), std::string::npos)
      << text;
  EXPECT_TRUE(text.ends_with("\nINVARIANTS VIOLATED:\n  - first\n  - second\n")) << text;
}

TEST(DemoRender, TheHeaderSaysWhereTheGatewaysRun) {
  Header h;
  h.users = 10;
  h.seats = 3;
  h.tokens = 20;
  h.tokens_per_second = 15;
  h.max_wait = 4000ms;
  h.seed = 148;
  h.detail = true;
  h.model_url = "http://m";
  h.limiter = "chat";
  h.gateway_urls = {"http://a", "http://b"};
  const std::string memory = header_text(plain, h);
  EXPECT_TRUE(
      memory.starts_with("fairgate demo \u2014 10 users, 3 seats, max wait 4s  "
                         "(memory backend, one process, seed 148)\n"))
      << memory;
  EXPECT_NE(memory.find("two gateways in this process, A (http://a) and B (http://b),\n"
                        "share one limiter \"chat\" of 3 seats;"),
            std::string::npos)
      << memory;
  EXPECT_NE(memory.find("streams 20-40 tokens\nat 15 tokens/s. Only 3 answers may stream"), std::string::npos)
      << memory;
  EXPECT_EQ(memory.find("faster"), std::string::npos) << memory;
  EXPECT_TRUE(memory.ends_with("is told the system is busy.\n\n")) << memory;

  h.redis = "redis://127.0.0.1:6379";
  h.gateway_pids = {11, 12};
  h.speed = 4;
  h.seats = 1;
  h.detail = false;
  const std::string redis = header_text(plain, h);
  EXPECT_NE(redis.find("(Redis redis://127.0.0.1:6379, seed 148)"), std::string::npos) << redis;
  EXPECT_NE(
      redis.find("A (http://a, pid 11)\nand B (http://b, pid 12), share one limiter \"chat\" of 1 seats "
                 "through Redis;"),
      std::string::npos)
      << redis;
  EXPECT_NE(redis.find("Only 1 answer may stream"), std::string::npos) << redis;
  EXPECT_NE(redis.find("Running 4x faster; all times are shown at story scale.\n"), std::string::npos)
      << redis;
  EXPECT_NE(redis.find("More than 30 users: queue moves and streaming progress are not shown.\n"),
            std::string::npos)
      << redis;
}

}  // namespace
