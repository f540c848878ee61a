// core::Ticket — the request state machine: the whole transition table, and
// the promise that racing events produce exactly one outcome (F4).
#include "core/acquire_rules.hpp"
#include "core/ticket.hpp"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

namespace {

using fairgate::core::Ticket;
using fairgate::core::TicketAction;
using fairgate::core::TicketEvent;
using fairgate::core::TicketState;
using fairgate::core::TicketTransition;
using fairgate::core::transition;

constexpr std::array kStates = {TicketState::pending, TicketState::granted, TicketState::timed_out,
                                TicketState::cancelled, TicketState::rejected};
constexpr std::array kEvents = {TicketEvent::grant, TicketEvent::timeout, TicketEvent::cancel,
                                TicketEvent::reject};

// The state an event leads to when it wins (the ticket was pending).
TicketState ended_by(TicketEvent event) {
  switch (event) {
    case TicketEvent::grant: return TicketState::granted;
    case TicketEvent::timeout: return TicketState::timed_out;
    case TicketEvent::cancel: return TicketState::cancelled;
    case TicketEvent::reject: return TicketState::rejected;
  }
  return TicketState::pending;
}

// The table written out by hand, independently of transition(): every one of
// the 5 x 4 cells.
TicketTransition expected(TicketState s, TicketEvent e) {
  using S = TicketState;
  using E = TicketEvent;
  using A = TicketAction;
  switch (s) {
    case S::pending:
      switch (e) {
        case E::grant: return {S::granted, A::deliver};
        case E::timeout: return {S::timed_out, A::deliver};
        case E::cancel: return {S::cancelled, A::deliver};
        case E::reject: return {S::rejected, A::deliver};
      }
      break;
    case S::granted:
      // A cancel or timeout after the grant does nothing: the permit is the caller's.
      return {S::granted, A::none};
    case S::timed_out:
    case S::cancelled:
    case S::rejected:
      // A grant reaching an ended request must hand its permit back.
      return {s, e == E::grant ? A::return_permit : A::none};
  }
  ADD_FAILURE() << "unreachable";
  return {s, A::none};
}

TEST(TicketTransition, WholeTable) {
  int cells = 0;
  for (TicketState s : kStates) {
    for (TicketEvent e : kEvents) {
      EXPECT_EQ(transition(s, e), expected(s, e))
          << fairgate::core::to_string(s) << " x " << fairgate::core::to_string(e);
      ++cells;
    }
  }
  EXPECT_EQ(cells, 20);
}

TEST(TicketTransition, IsUsableAtCompileTime) {
  static_assert(transition(TicketState::pending, TicketEvent::grant) ==
                TicketTransition{TicketState::granted, TicketAction::deliver});
  static_assert(transition(TicketState::cancelled, TicketEvent::grant) ==
                TicketTransition{TicketState::cancelled, TicketAction::return_permit});
  static_assert(transition(TicketState::granted, TicketEvent::cancel) ==
                TicketTransition{TicketState::granted, TicketAction::none});
  SUCCEED();
}

TEST(TicketTransition, EndedStatesAreAbsorbing) {
  for (TicketState s : kStates) {
    if (s == TicketState::pending) continue;
    for (TicketEvent e : kEvents) EXPECT_EQ(transition(s, e).next, s);
  }
}

TEST(TicketTransition, NamesAreDistinct) {
  EXPECT_EQ(fairgate::core::to_string(TicketState::pending), "PENDING");
  EXPECT_EQ(fairgate::core::to_string(TicketState::granted), "GRANTED");
  EXPECT_EQ(fairgate::core::to_string(TicketState::timed_out), "TIMED_OUT");
  EXPECT_EQ(fairgate::core::to_string(TicketState::cancelled), "CANCELLED");
  EXPECT_EQ(fairgate::core::to_string(TicketState::rejected), "REJECTED");
  EXPECT_EQ(fairgate::core::to_string(TicketEvent::grant), "grant");
  EXPECT_EQ(fairgate::core::to_string(TicketEvent::timeout), "timeout");
  EXPECT_EQ(fairgate::core::to_string(TicketEvent::cancel), "cancel");
  EXPECT_EQ(fairgate::core::to_string(TicketEvent::reject), "reject");
}

TEST(Ticket, FirstEventWinsThenEveryLaterEventIsAnsweredWithoutChange) {
  for (TicketEvent first : kEvents) {
    for (TicketEvent second : kEvents) {
      Ticket t;
      EXPECT_TRUE(t.pending());
      EXPECT_EQ(t.resume(first), TicketAction::deliver);
      EXPECT_EQ(t.state(), ended_by(first));
      EXPECT_FALSE(t.pending());
      const TicketAction again = t.resume(second);
      EXPECT_EQ(again, expected(ended_by(first), second).action);
      EXPECT_EQ(t.state(), ended_by(first)) << "a later event must not change an ended ticket";
    }
  }
}

TEST(Ticket, GrantAfterCancelReturnsThePermit) {
  Ticket t;
  ASSERT_EQ(t.resume(TicketEvent::cancel), TicketAction::deliver);
  EXPECT_EQ(t.resume(TicketEvent::grant), TicketAction::return_permit);
  EXPECT_EQ(t.resume(TicketEvent::grant), TicketAction::return_permit);
  EXPECT_EQ(t.state(), TicketState::cancelled);
}

TEST(Ticket, BeginCleanupIsTrueOnce) {
  Ticket t;
  EXPECT_TRUE(t.begin_cleanup());
  EXPECT_FALSE(t.begin_cleanup());
  EXPECT_FALSE(t.begin_cleanup());
  // Cleanup is independent of the outcome.
  EXPECT_EQ(t.resume(TicketEvent::timeout), TicketAction::deliver);
  EXPECT_FALSE(t.begin_cleanup());
}

// All threads wait at a spinning barrier, then fire at the same small block
// of tickets. (A blocking barrier would wake them one at a time and the first
// would finish the block alone.) Spinning with yield() keeps this fair on a
// machine with fewer cores than threads.
class SpinBarrier {
 public:
  explicit SpinBarrier(std::size_t n) : n_(n) {}
  void arrive_and_wait() {
    const std::size_t gen = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_acq_rel);
      return;
    }
    while (generation_.load(std::memory_order_acquire) == gen) std::this_thread::yield();
  }

 private:
  const std::size_t n_;
  std::atomic<std::size_t> arrived_{0};
  std::atomic<std::size_t> generation_{0};
};

// Eight threads fire events at the same ticket, for 20,000 tickets, in
// blocks of kChunk tickets between barriers.
TEST(Ticket, RacingEventsHaveExactlyOneWinner) {
  constexpr std::size_t kTickets = 20'000;
  constexpr std::size_t kChunk = 8;
  // Two threads per event, so a grant can also race another grant.
  constexpr std::array<TicketEvent, 8> kThreadEvents = {
      TicketEvent::grant, TicketEvent::timeout, TicketEvent::cancel, TicketEvent::reject,
      TicketEvent::grant, TicketEvent::timeout, TicketEvent::cancel, TicketEvent::reject};
  constexpr std::size_t kThreads = kThreadEvents.size();

  auto tickets = std::make_unique<Ticket[]>(kTickets);
  // actions[i][t]: what thread t was told for ticket i; cleanup[i][t]: begin_cleanup's answer.
  std::vector<std::array<TicketAction, kThreads>> actions(kTickets);
  std::vector<std::array<bool, kThreads>> cleanup(kTickets);
  std::vector<std::size_t> winner(kTickets, kThreads);

  SpinBarrier sync(kThreads);
  std::vector<std::thread> threads;
  for (std::size_t th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      for (std::size_t i = 0; i < kTickets; ++i) {
        if (i % kChunk == 0) sync.arrive_and_wait();
        // Alternate the order of resume and cleanup so both orders race.
        if ((i + th) % 2 == 0) {
          actions[i][th] = tickets[i].resume(kThreadEvents[th]);
          cleanup[i][th] = tickets[i].begin_cleanup();
        } else {
          cleanup[i][th] = tickets[i].begin_cleanup();
          actions[i][th] = tickets[i].resume(kThreadEvents[th]);
        }
      }
    });
  }
  for (auto& t : threads) t.join();

  std::array<std::size_t, 4> wins{};
  std::size_t failures = 0;
  for (std::size_t i = 0; i < kTickets && failures < 10; ++i) {
    const TicketState final_state = tickets[i].state();
    std::size_t delivers = 0, cleanups = 0;
    for (std::size_t th = 0; th < kThreads; ++th) {
      if (cleanup[i][th]) ++cleanups;
      const TicketAction a = actions[i][th];
      if (a == TicketAction::deliver) {
        ++delivers;
        winner[i] = th;
        ++wins[static_cast<std::size_t>(kThreadEvents[th])];
        if (ended_by(kThreadEvents[th]) != final_state) {
          ADD_FAILURE() << "ticket " << i << ": thread " << th << " delivered "
                        << fairgate::core::to_string(kThreadEvents[th]) << " but the state is "
                        << fairgate::core::to_string(final_state);
          ++failures;
        }
        continue;
      }
      // A loser: a grant must give its permit back unless the ticket was granted.
      const TicketAction want =
          (kThreadEvents[th] == TicketEvent::grant && final_state != TicketState::granted)
              ? TicketAction::return_permit
              : TicketAction::none;
      if (a != want) {
        ADD_FAILURE() << "ticket " << i << ": losing " << fairgate::core::to_string(kThreadEvents[th])
                      << " got action " << static_cast<int>(a) << ", want " << static_cast<int>(want);
        ++failures;
      }
    }
    if (delivers != 1) {
      ADD_FAILURE() << "ticket " << i << ": " << delivers << " deliver actions, want exactly 1";
      ++failures;
    }
    if (cleanups != 1) {
      ADD_FAILURE() << "ticket " << i << ": begin_cleanup true " << cleanups << " times, want exactly 1";
      ++failures;
    }
    if (final_state == TicketState::pending) {
      ADD_FAILURE() << "ticket " << i << " is still pending";
      ++failures;
    }
  }
  EXPECT_EQ(failures, 0u);
  std::size_t total = 0;
  for (auto w : wins) total += w;
  EXPECT_EQ(total, kTickets);
  // How often did the winner change within a block? Only a diagnostic: on a
  // single core there may be no overlap at all.
  std::size_t switches = 0;
  for (std::size_t i = 1; i < kTickets; ++i) {
    if (i % kChunk != 0 && winner[i] != winner[i - 1]) ++switches;
  }
  RecordProperty("winner_switches_within_blocks", static_cast<int>(switches));
  std::printf("winner switches within blocks: %zu of %zu\n", switches, kTickets);
}

// The measured wait of a timed-out request runs a little over its max wait:
// the message names the max wait it was given ("within 150 ms", not 151).
TEST(AcquireRules, ATimeoutNamesTheMaxWaitGivenNotTheTimeMeasured) {
  using namespace std::chrono_literals;
  EXPECT_EQ(
      fairgate::core::ended_message(fairgate::RejectReason::timeout, 151ms, 150ms, fairgate::Settings{}),
      "no permit became free within 150 ms");
  EXPECT_EQ(
      fairgate::core::ended_message(fairgate::RejectReason::cancelled, 151ms, 150ms, fairgate::Settings{}),
      "cancelled after waiting 151 ms");
}

}  // namespace
