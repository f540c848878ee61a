// The invariants `fairgate demo` checks at the end (src/cli/demo/checks.cpp),
// on hand-made runs: a clean one, then one broken invariant at a time.
#include "cli/demo/checks.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using namespace fairgate::cli::demo;
using namespace std::chrono_literals;

const Clock::time_point t0{};

/// A run of `n` users with 1 s max wait, 2 seats: user i asks at t0 + i ms.
struct DemoRun {
  std::vector<Seen> users;
  Facts facts;

  explicit DemoRun(std::size_t n) : users(n) {
    for (std::size_t i = 0; i < n; ++i) {
      Seen& u = users[i];
      u.name = "user-" + std::to_string(i + 1);
      u.arrival_rank = i + 1;
      u.tokens = 5;
      u.arrived_at = t0 + std::chrono::milliseconds(i);
    }
    facts.real_max_wait = 1000ms;
    facts.seats = 2;
    facts.arrivals = n;
    facts.final_in_use = 0;
    facts.final_queued = 0;
  }

  /// Served: seat at `seat` after t0, [DONE] 100 ms later.
  void serve(std::size_t i, Clock::duration seat) {
    Seen& u = users[i];
    u.phase = Phase::done;
    u.seated_at = t0 + seat;
    u.ended_at = u.seated_at + 100ms;
    u.ends = 1;
    u.streamed = u.tokens;
    ++facts.model_completed;
    facts.model_peak_in_flight = 2;
  }

  /// Told busy at its max wait.
  void busy(std::size_t i) {
    Seen& u = users[i];
    u.phase = Phase::busy;
    u.ended_at = u.arrived_at + 1000ms;
    u.ends = 1;
  }

  Verdict verdict() const {
    std::vector<const Seen*> all, by_arrival;
    for (const auto& u : users) all.push_back(&u);
    for (const auto& u : users)
      if (u.arrival_rank > 0) by_arrival.push_back(&u);
    return check(all, by_arrival, facts);
  }
};

/// 4 users, 2 seats: two at once, the third after the first's answer, the
/// fourth told busy after its max wait.
DemoRun clean() {
  DemoRun r(4);
  r.serve(0, 1ms);
  r.serve(1, 2ms);
  r.serve(2, 101ms);
  r.busy(3);
  return r;
}

bool mentions(const Verdict& v, const std::string& text) {
  for (const auto& s : v.violations)
    if (s.find(text) != std::string::npos) return true;
  return false;
}

TEST(DemoChecks, ACleanRunHoldsEveryInvariant) {
  const Verdict v = clean().verdict();
  EXPECT_TRUE(v.violations.empty()) << v.violations.front();
  EXPECT_EQ(v.granted, 3u);
  EXPECT_EQ(v.busy, 1u);
  EXPECT_EQ(v.other, 0u);
  EXPECT_FALSE(v.fifo_problem);
  EXPECT_TRUE(v.under_cap);
  EXPECT_TRUE(v.limiter_empty);
}

TEST(DemoChecks, ALaterUserSeatedFirstIsAFifoInversion) {
  DemoRun r = clean();
  r.serve(2, 101ms);
  r.serve(1, 150ms);  // the 2nd got its seat 49 ms after the 3rd
  const Verdict v = r.verdict();
  ASSERT_TRUE(v.fifo_problem);
  EXPECT_EQ(*v.fifo_problem, "user-3 (asked 3rd) got a seat while user-2 (asked 2nd) was still waiting");
  EXPECT_TRUE(mentions(v, "FIFO: user-3"));
}

TEST(DemoChecks, SeatsReadWithinTheOrderSlackAreATie) {
  DemoRun r = clean();
  r.serve(1, 101ms + kOrderSlack);  // read after the 3rd's, within the slack
  EXPECT_FALSE(r.verdict().fifo_problem);
  r.serve(1, 102ms + kOrderSlack);
  EXPECT_TRUE(r.verdict().fifo_problem);
}

TEST(DemoChecks, TheAdmittedEventCountsAsTheSeat) {
  DemoRun r = clean();
  // The 2nd's first chunk came late (slow model), but the gateway said it was
  // admitted before the 3rd: no inversion.
  r.serve(1, 300ms);
  r.users[1].admitted_at = t0 + 50ms;
  EXPECT_FALSE(r.verdict().fifo_problem);
}

TEST(DemoChecks, ASeatPastTheMaxWaitIsReported) {
  DemoRun r = clean();
  r.serve(2, 2ms + 1000ms + kSeatSlack + 1ms);
  EXPECT_TRUE(
      mentions(r.verdict(), "user-3 got a seat after 1101 ms (real time), past the max wait of 1000 ms"));
  // The limiter's own grant time wins over the client's first chunk.
  r.users[2].admitted_after = 900ms;
  EXPECT_FALSE(mentions(r.verdict(), "past the max wait"));
}

TEST(DemoChecks, BusyBeforeTheMaxWaitIsReported) {
  DemoRun r = clean();
  r.users[3].ended_at = r.users[3].arrived_at + 999ms;
  EXPECT_TRUE(mentions(r.verdict(), "user-4 was told busy after 999 ms, before the max wait"));
}

TEST(DemoChecks, EveryRequestEndsExactlyOnce) {
  DemoRun r = clean();
  r.users[0].ends = 2;
  r.users[3].ends = 0;
  const Verdict v = r.verdict();
  EXPECT_TRUE(mentions(v, "user-1 ended 2 times (must be exactly once)"));
  EXPECT_TRUE(mentions(v, "user-4 ended 0 times"));
}

TEST(DemoChecks, AMissingTokenIsReported) {
  DemoRun r = clean();
  r.users[2].streamed = 4;
  EXPECT_TRUE(mentions(r.verdict(), "user-3 got 4 of its 5 tokens"));
}

TEST(DemoChecks, MoreAnswersAtTheModelThanSeatsBreaksTheCap) {
  DemoRun r = clean();
  r.facts.model_peak_in_flight = 3;
  Verdict v = r.verdict();
  EXPECT_FALSE(v.under_cap);
  EXPECT_TRUE(mentions(v, "the model had 3 answers in flight with 2 seats"));
  r = clean();
  r.facts.model_rejected_429 = 1;
  v = r.verdict();
  EXPECT_FALSE(v.under_cap);
  EXPECT_TRUE(mentions(v, "the model refused 1 requests (429)"));
}

TEST(DemoChecks, TheModelAndTheUsersMustAgreeOnAnswers) {
  DemoRun r = clean();
  r.facts.model_completed = 2;
  EXPECT_TRUE(mentions(r.verdict(), "the model completed 2 answers, the users received 3"));
}

TEST(DemoChecks, TheLimiterMustBeEmptyAndReadableAtTheEnd) {
  DemoRun r = clean();
  r.facts.final_in_use = 1;
  Verdict v = r.verdict();
  EXPECT_FALSE(v.limiter_empty);
  EXPECT_TRUE(mentions(v, "at the end the limiter still had 1 in use and 0 queued"));
  r.facts.final_in_use.reset();
  v = r.verdict();
  EXPECT_FALSE(v.limiter_empty);
  EXPECT_TRUE(mentions(v, "could not read the limiter's state at the end"));
}

TEST(DemoChecks, UsersThatNeverAskedAreReported) {
  DemoRun r = clean();
  r.users[3] = Seen{};
  r.users[3].name = "user-4";
  r.facts.arrivals = 3;
  const Verdict v = r.verdict();
  EXPECT_TRUE(mentions(v, "only 3 of 4 users asked"));
  EXPECT_TRUE(mentions(v, "user-4 ended 0 times"));
}

TEST(DemoChecks, OtherEndsAreViolationsWithTheirMessage) {
  DemoRun r = clean();
  r.users[3].phase = Phase::other;
  r.users[3].message = "HTTP 502 from the gateway";
  const Verdict v = r.verdict();
  EXPECT_EQ(v.other, 1u);
  EXPECT_TRUE(mentions(v, "user-4: HTTP 502 from the gateway"));
}

TEST(DemoChecks, Ordinals) {
  EXPECT_EQ(ordinal(1), "1st");
  EXPECT_EQ(ordinal(2), "2nd");
  EXPECT_EQ(ordinal(3), "3rd");
  EXPECT_EQ(ordinal(4), "4th");
  EXPECT_EQ(ordinal(11), "11th");
  EXPECT_EQ(ordinal(12), "12th");
  EXPECT_EQ(ordinal(13), "13th");
  EXPECT_EQ(ordinal(21), "21st");
  EXPECT_EQ(ordinal(112), "112th");
}

}  // namespace
