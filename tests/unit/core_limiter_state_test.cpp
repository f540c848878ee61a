// core::LimiterState — admission, FIFO grants, drops, hot config and the
// invariants I1-I5 of core/limiter_state.hpp, with a fake clock (time is a
// parameter). The last test drives a random sequence of operations against a
// small model and checks every invariant after every step.
#include "core/limiter_state.hpp"

#include "support/recording_sink.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace std::chrono_literals;
using fairgate::DisabledMode;
using fairgate::RejectReason;
using fairgate::Settings;
using fairgate::core::Admission;
using fairgate::core::LimiterState;
using fairgate::core::PaceFigures;
using fairgate::core::RequestId;
using fairgate::core::ServicePace;
using fairgate::core::Time;
using fairgate::test::RecordingSink;
using Drop = RecordingSink::Drop;
using Kind = Admission::Kind;

const Time t0 = Time{} + 1h;  // any fixed instant; the state never reads a clock

Settings cap(std::uint32_t n, std::optional<std::uint32_t> max_queue = std::nullopt) {
  Settings s;
  s.max_concurrent = n;
  s.max_queue = max_queue;
  return s;
}

// Admits `id` at `now` with deadline now + wait.
Admission admit(LimiterState& st, RequestId id, Time now = t0, std::chrono::milliseconds wait = 1s,
                std::string tenant = "") {
  return st.admit(id, now, now + wait, std::move(tenant));
}

std::vector<RequestId> queue_of(const LimiterState& st) {
  std::vector<RequestId> ids;
  st.for_each_waiter([&](RequestId id, std::size_t position, const LimiterState::Waiter&) {
    EXPECT_EQ(position, ids.size() + 1);
    ids.push_back(id);
  });
  return ids;
}

// --- admission ---------------------------------------------------------------

TEST(LimiterStateAdmit, GrantsWhileThereIsRoomThenQueues) {
  LimiterState st(cap(2));
  EXPECT_EQ(admit(st, 1).kind, Kind::granted);
  EXPECT_EQ(admit(st, 2).kind, Kind::granted);
  const Admission third = admit(st, 3);
  EXPECT_EQ(third.kind, Kind::queued);
  EXPECT_EQ(third.position, 1u);
  const Admission fourth = admit(st, 4);
  EXPECT_EQ(fourth.kind, Kind::queued);
  EXPECT_EQ(fourth.position, 2u);
  EXPECT_EQ(st.in_use(), 2u);
  EXPECT_EQ(st.queued(), 2u);
  EXPECT_TRUE(st.holding(1) && st.holding(2));
  EXPECT_TRUE(st.waiting(3) && st.waiting(4));
  EXPECT_FALSE(st.holding(3) || st.waiting(1));
  EXPECT_EQ(st.position(3), 1u);
  EXPECT_EQ(st.position(4), 2u);
  EXPECT_EQ(st.position(1), std::nullopt) << "a holder has no queue position";
}

TEST(LimiterStateAdmit, QueueFullBeyondMaxQueue) {
  LimiterState st(cap(1, 2));
  ASSERT_EQ(admit(st, 1).kind, Kind::granted);
  EXPECT_EQ(admit(st, 2).kind, Kind::queued);
  EXPECT_EQ(admit(st, 3).kind, Kind::queued);
  const Admission full = admit(st, 4);
  EXPECT_EQ(full.kind, Kind::rejected);
  EXPECT_EQ(full.reason, RejectReason::queue_full);
  EXPECT_EQ(st.queued(), 2u);
  EXPECT_FALSE(st.waiting(4));
}

TEST(LimiterStateAdmit, MaxQueueZeroNeverQueues) {
  LimiterState st(cap(2, 0));
  EXPECT_EQ(admit(st, 1).kind, Kind::granted);
  EXPECT_EQ(admit(st, 2).kind, Kind::granted);
  for (RequestId id = 3; id < 10; ++id) {
    const Admission a = admit(st, id);
    EXPECT_EQ(a.kind, Kind::rejected);
    EXPECT_EQ(a.reason, RejectReason::queue_full);
  }
  EXPECT_EQ(st.queued(), 0u);
  EXPECT_EQ(st.next_deadline(), std::nullopt);
}

TEST(LimiterStateAdmit, DeadlineNotAfterNowIsTimeoutWhenThereIsNoRoom) {
  LimiterState st(cap(1));
  // With room, a request that cannot wait is still granted (max_wait 0 = never wait).
  EXPECT_EQ(st.admit(1, t0, t0, "").kind, Kind::granted);
  const Admission at_now = st.admit(2, t0, t0, "");
  EXPECT_EQ(at_now.kind, Kind::rejected);
  EXPECT_EQ(at_now.reason, RejectReason::timeout);
  const Admission past = st.admit(3, t0, t0 - 1ms, "");
  EXPECT_EQ(past.kind, Kind::rejected);
  EXPECT_EQ(past.reason, RejectReason::timeout);
  EXPECT_EQ(st.admit(4, t0, t0 + 1ns, "").kind, Kind::queued);
}

TEST(LimiterStateAdmit, ArrivalsQueueBehindWaitersAndTheHeadIsServedFirst) {
  LimiterState st(cap(1));
  RecordingSink sink;
  ASSERT_EQ(admit(st, 1).kind, Kind::granted);
  ASSERT_EQ(admit(st, 2).kind, Kind::queued);
  ASSERT_EQ(admit(st, 3).kind, Kind::queued);
  ASSERT_TRUE(st.release(1, t0, sink));
  EXPECT_TRUE(st.holding(2));
  EXPECT_TRUE(st.waiting(3));
  // Waiter 3 is refused at dispatch (its ticket ended): the permit goes to
  // nobody, the queue empties, and only then may a new arrival take it.
  sink.refuse.insert(3);
  ASSERT_TRUE(st.release(2, t0, sink));
  EXPECT_EQ(st.in_use(), 0u);
  EXPECT_EQ(st.queued(), 0u);
  EXPECT_EQ(admit(st, 4).kind, Kind::granted);
}

// --- release and FIFO ----------------------------------------------------------

TEST(LimiterStateRelease, GrantsWaitersInArrivalOrder) {
  LimiterState st(cap(1));
  RecordingSink sink;
  ASSERT_EQ(admit(st, 100).kind, Kind::granted);
  // Ids deliberately not in numeric order: order is arrival, not id.
  const std::vector<RequestId> arrivals = {7, 3, 42, 5, 1};
  for (RequestId id : arrivals) ASSERT_EQ(admit(st, id).kind, Kind::queued);
  EXPECT_EQ(queue_of(st), arrivals);
  RequestId holder = 100;
  for (RequestId want : arrivals) {
    ASSERT_TRUE(st.release(holder, t0 + 1ms, sink));
    ASSERT_TRUE(st.holding(want));
    holder = want;
  }
  EXPECT_EQ(sink.granted, arrivals);
  EXPECT_TRUE(sink.dropped.empty());
  EXPECT_EQ(st.queued(), 0u);
}

TEST(LimiterStateRelease, DoubleOrUnknownReleaseIsHarmless) {
  LimiterState st(cap(1));
  RecordingSink sink;
  ASSERT_EQ(admit(st, 1).kind, Kind::granted);
  ASSERT_EQ(admit(st, 2).kind, Kind::queued);
  EXPECT_TRUE(st.release(1, t0, sink));
  EXPECT_FALSE(st.release(1, t0, sink)) << "second release of the same id";
  EXPECT_FALSE(st.release(99, t0, sink)) << "unknown id";
  EXPECT_FALSE(st.release(3, t0, sink));
  EXPECT_EQ(st.in_use(), 1u);
  EXPECT_TRUE(st.holding(2));
  EXPECT_EQ(sink.granted, (std::vector<RequestId>{2}));
}

TEST(LimiterStateRelease, ReleasingAWaiterIdDoesNothing) {
  LimiterState st(cap(1));
  RecordingSink sink;
  ASSERT_EQ(admit(st, 1).kind, Kind::granted);
  ASSERT_EQ(admit(st, 2).kind, Kind::queued);
  EXPECT_FALSE(st.release(2, t0, sink));
  EXPECT_TRUE(st.waiting(2));
  EXPECT_EQ(st.in_use(), 1u);
}

TEST(LimiterStateRelease, TryGrantFalseDropsTheWaiterWithoutMakingAHolder) {
  LimiterState st(cap(1));
  RecordingSink sink;
  ASSERT_EQ(admit(st, 1).kind, Kind::granted);
  ASSERT_EQ(admit(st, 2).kind, Kind::queued);
  ASSERT_EQ(admit(st, 3).kind, Kind::queued);
  sink.refuse.insert(2);
  ASSERT_TRUE(st.release(1, t0, sink));
  EXPECT_EQ(sink.offered, (std::vector<RequestId>{2, 3}));
  EXPECT_EQ(sink.granted, (std::vector<RequestId>{3}));
  EXPECT_TRUE(sink.dropped.empty()) << "a refused grant is not reported as a drop";
  EXPECT_FALSE(st.waiting(2));
  EXPECT_FALSE(st.holding(2));
  EXPECT_TRUE(st.holding(3));
  EXPECT_EQ(st.in_use(), 1u);
  EXPECT_EQ(st.queued(), 0u);
  EXPECT_EQ(st.next_deadline(), std::nullopt) << "the refused waiter's deadline must go too";
}

// --- deadlines ------------------------------------------------------------------

TEST(LimiterStateExpire, DropsOnlyExpiredWaitersWithReasonTimeout) {
  LimiterState st(cap(1));
  RecordingSink sink;
  ASSERT_EQ(admit(st, 1).kind, Kind::granted);
  ASSERT_EQ(admit(st, 10, t0, 10ms).kind, Kind::queued);
  ASSERT_EQ(admit(st, 30, t0, 30ms).kind, Kind::queued);
  ASSERT_EQ(admit(st, 20, t0, 20ms).kind, Kind::queued);
  ASSERT_EQ(admit(st, 40, t0, 40ms).kind, Kind::queued);
  EXPECT_EQ(st.next_deadline(), t0 + 10ms);

  st.expire(t0 + 9ms, sink);
  EXPECT_TRUE(sink.dropped.empty());
  EXPECT_EQ(st.queued(), 4u);

  st.expire(t0 + 20ms, sink);  // deadline == now counts as passed
  EXPECT_EQ(sink.dropped, (std::vector<Drop>{{10, RejectReason::timeout}, {20, RejectReason::timeout}}));
  EXPECT_EQ(queue_of(st), (std::vector<RequestId>{30, 40}));
  EXPECT_EQ(st.position(30), 1u);
  EXPECT_EQ(st.next_deadline(), t0 + 30ms);
  EXPECT_TRUE(sink.granted.empty()) << "expire never grants";
  EXPECT_EQ(st.in_use(), 1u);
}

TEST(LimiterStateDispatch, DropsAHeadWhoseDeadlinePassedInsteadOfGrantingIt) {
  LimiterState st(cap(1));
  RecordingSink sink;
  ASSERT_EQ(admit(st, 1).kind, Kind::granted);
  ASSERT_EQ(admit(st, 2, t0, 10ms).kind, Kind::queued);
  ASSERT_EQ(admit(st, 3, t0, 10ms).kind, Kind::queued);
  ASSERT_EQ(admit(st, 4, t0, 100ms).kind, Kind::queued);
  // No expire() ran (the timer is late): release must still not grant 2 or 3 (I4).
  ASSERT_TRUE(st.release(1, t0 + 10ms, sink));
  EXPECT_EQ(sink.dropped, (std::vector<Drop>{{2, RejectReason::timeout}, {3, RejectReason::timeout}}));
  EXPECT_EQ(sink.granted, (std::vector<RequestId>{4}));
  EXPECT_EQ(sink.offered, (std::vector<RequestId>{4})) << "expired waiters are never offered a permit";
  EXPECT_TRUE(st.holding(4));
}

TEST(LimiterStateWithdraw, RemovesOnlyWaiters) {
  LimiterState st(cap(1));
  RecordingSink sink;
  ASSERT_EQ(admit(st, 1).kind, Kind::granted);
  ASSERT_EQ(admit(st, 2, t0, 10ms).kind, Kind::queued);
  ASSERT_EQ(admit(st, 3, t0, 20ms).kind, Kind::queued);
  ASSERT_EQ(admit(st, 4, t0, 30ms).kind, Kind::queued);
  EXPECT_TRUE(st.withdraw(2));
  EXPECT_FALSE(st.withdraw(2)) << "twice";
  EXPECT_FALSE(st.withdraw(1)) << "a holder cannot withdraw";
  EXPECT_FALSE(st.withdraw(77));
  EXPECT_TRUE(st.holding(1));
  EXPECT_EQ(queue_of(st), (std::vector<RequestId>{3, 4}));
  EXPECT_EQ(st.next_deadline(), t0 + 20ms) << "the withdrawn waiter's deadline must go";
  // A withdrawn waiter is neither granted nor dropped later.
  st.expire(t0 + 15ms, sink);
  ASSERT_TRUE(st.release(1, t0 + 15ms, sink));
  EXPECT_EQ(sink.granted, (std::vector<RequestId>{3}));
  EXPECT_TRUE(sink.dropped.empty());
}

// --- hot config (F9) and disabled mode (F11) --------------------------------------

TEST(LimiterStateConfigure, RaisingTheCapGrantsWaitersAtOnce) {
  LimiterState st(cap(1));
  RecordingSink sink;
  ASSERT_EQ(admit(st, 1).kind, Kind::granted);
  for (RequestId id = 2; id <= 5; ++id) ASSERT_EQ(admit(st, id).kind, Kind::queued);
  st.configure(cap(3), t0, sink);
  EXPECT_EQ(sink.granted, (std::vector<RequestId>{2, 3}));
  EXPECT_EQ(st.in_use(), 3u);
  EXPECT_EQ(queue_of(st), (std::vector<RequestId>{4, 5}));
  st.configure(cap(10), t0, sink);
  EXPECT_EQ(sink.granted, (std::vector<RequestId>{2, 3, 4, 5}));
  EXPECT_EQ(st.queued(), 0u);
  EXPECT_EQ(st.settings().max_concurrent, 10u);
}

TEST(LimiterStateConfigure, LoweringTheCapNeverRevokesAndGrantsNothingUntilBelow) {
  LimiterState st(cap(3));
  RecordingSink sink;
  for (RequestId id = 1; id <= 3; ++id) ASSERT_EQ(admit(st, id).kind, Kind::granted);
  ASSERT_EQ(admit(st, 4).kind, Kind::queued);
  ASSERT_EQ(admit(st, 5).kind, Kind::queued);
  st.configure(cap(1), t0, sink);
  EXPECT_EQ(st.in_use(), 3u) << "lowering must not revoke";
  EXPECT_TRUE(st.holding(1) && st.holding(2) && st.holding(3));
  EXPECT_TRUE(sink.granted.empty());
  EXPECT_EQ(admit(st, 6).kind, Kind::queued);
  ASSERT_TRUE(st.release(1, t0, sink));
  EXPECT_EQ(st.in_use(), 2u);
  EXPECT_TRUE(sink.granted.empty()) << "in_use 2 >= cap 1: no grant";
  ASSERT_TRUE(st.release(2, t0, sink));
  EXPECT_EQ(st.in_use(), 1u);
  EXPECT_TRUE(sink.granted.empty()) << "in_use 1 >= cap 1: no grant";
  ASSERT_TRUE(st.release(3, t0, sink));
  EXPECT_EQ(sink.granted, (std::vector<RequestId>{4}));
  EXPECT_EQ(st.in_use(), 1u);
  EXPECT_EQ(queue_of(st), (std::vector<RequestId>{5, 6}));
}

TEST(LimiterStateConfigure, LoweringMaxQueueKeepsQueuedWaiters) {
  LimiterState st(cap(1));
  RecordingSink sink;
  ASSERT_EQ(admit(st, 1).kind, Kind::granted);
  for (RequestId id = 2; id <= 4; ++id) ASSERT_EQ(admit(st, id).kind, Kind::queued);
  st.configure(cap(1, 1), t0, sink);
  EXPECT_EQ(st.queued(), 3u);
  EXPECT_TRUE(sink.dropped.empty());
  EXPECT_EQ(admit(st, 5).reason, RejectReason::queue_full);
}

TEST(LimiterStateConfigure, DisabledPassThroughGrantsEveryoneIncludingWaiters) {
  LimiterState st(cap(1));
  RecordingSink sink;
  ASSERT_EQ(admit(st, 1).kind, Kind::granted);
  for (RequestId id = 2; id <= 4; ++id) ASSERT_EQ(admit(st, id).kind, Kind::queued);
  Settings off = cap(1);
  off.enabled = false;
  off.when_disabled = DisabledMode::pass_through;
  st.configure(off, t0, sink);
  EXPECT_EQ(sink.granted, (std::vector<RequestId>{2, 3, 4})) << "in FIFO order";
  EXPECT_EQ(st.queued(), 0u);
  EXPECT_EQ(st.in_use(), 4u);
  for (RequestId id = 5; id <= 8; ++id) EXPECT_EQ(admit(st, id).kind, Kind::granted);
  EXPECT_EQ(st.in_use(), 8u) << "pass-through grants are counted";

  // Enabled again with cap 2: arrivals queue until in_use drops below 2.
  st.configure(cap(2), t0, sink);
  EXPECT_EQ(admit(st, 9).kind, Kind::queued);
  sink.clear();
  for (RequestId id = 1; id <= 6; ++id) ASSERT_TRUE(st.release(id, t0, sink));
  EXPECT_TRUE(sink.granted.empty()) << "in_use was still >= 2";
  ASSERT_TRUE(st.release(7, t0, sink));
  EXPECT_EQ(sink.granted, (std::vector<RequestId>{9}));
  EXPECT_EQ(st.in_use(), 2u);
}

TEST(LimiterStateConfigure, DisabledRejectDropsWaitersAndRejectsArrivals) {
  LimiterState st(cap(1));
  RecordingSink sink;
  ASSERT_EQ(admit(st, 1).kind, Kind::granted);
  for (RequestId id = 2; id <= 4; ++id) ASSERT_EQ(admit(st, id).kind, Kind::queued);
  Settings off = cap(1);
  off.enabled = false;
  off.when_disabled = DisabledMode::reject;
  st.configure(off, t0, sink);
  EXPECT_EQ(sink.dropped,
            (std::vector<Drop>{
                {2, RejectReason::disabled}, {3, RejectReason::disabled}, {4, RejectReason::disabled}}));
  EXPECT_TRUE(sink.granted.empty());
  EXPECT_EQ(st.queued(), 0u);
  EXPECT_EQ(st.next_deadline(), std::nullopt);
  EXPECT_TRUE(st.holding(1)) << "holders keep their permits";
  const Admission a = admit(st, 5);
  EXPECT_EQ(a.kind, Kind::rejected);
  EXPECT_EQ(a.reason, RejectReason::disabled);
  ASSERT_TRUE(st.release(1, t0, sink));
  EXPECT_EQ(st.in_use(), 0u);
  EXPECT_EQ(admit(st, 6).reason, RejectReason::disabled) << "even with room";
  // Enabled again: normal service.
  st.configure(cap(1), t0, sink);
  EXPECT_EQ(admit(st, 7).kind, Kind::granted);
}

TEST(LimiterStateDropAll, DropsEveryWaiterInOrderWithTheReason) {
  LimiterState st(cap(1));
  RecordingSink sink;
  ASSERT_EQ(admit(st, 1).kind, Kind::granted);
  ASSERT_EQ(admit(st, 2).kind, Kind::queued);
  ASSERT_EQ(admit(st, 3).kind, Kind::queued);
  st.drop_all(RejectReason::shutdown, sink);
  EXPECT_EQ(sink.dropped, (std::vector<Drop>{{2, RejectReason::shutdown}, {3, RejectReason::shutdown}}));
  EXPECT_EQ(st.queued(), 0u);
  EXPECT_TRUE(st.holding(1));
}

// --- estimates (F7) ---------------------------------------------------------------

TEST(ServicePaceTest, NoEstimateWithoutThreeSaturatedGaps) {
  ServicePace p;
  EXPECT_EQ(p.estimate(1, t0), std::nullopt);
  // Releases that leave a seat free measure nothing, however many.
  for (int i = 0; i < 10; ++i) p.on_release(t0 + i * 10ms, /*full_after=*/false);
  EXPECT_EQ(p.estimate(1, t0 + 100ms), std::nullopt);
  p.on_release(t0 + 200ms, true);  // starts a gap
  p.on_release(t0 + 300ms, true);  // 1
  p.on_release(t0 + 400ms, true);  // 2
  EXPECT_EQ(p.estimate(1, t0 + 400ms), std::nullopt) << "two gaps are no pace yet";
  p.on_release(t0 + 500ms, true);  // 3
  EXPECT_EQ(p.estimate(1, t0 + 500ms), 100ms);
  EXPECT_EQ(p.figures(t0 + 500ms).samples, 3u);
}

TEST(ServicePaceTest, EstimateIsPositionTimesTheGap) {
  ServicePace p;
  for (int i = 0; i <= 4; ++i) p.on_release(t0 + i * 100ms, true);
  const Time now = t0 + 400ms;  // just after a release
  EXPECT_EQ(p.estimate(1, now), 100ms);
  EXPECT_EQ(p.estimate(2, now), 200ms);
  EXPECT_EQ(p.estimate(10, now), 1000ms);
  // Mid-gap: the next release is partly elapsed ...
  EXPECT_EQ(p.estimate(1, now + 40ms), 60ms);
  EXPECT_EQ(p.estimate(3, now + 40ms), 260ms);
  // ... but a late one is never counted below half a gap.
  EXPECT_EQ(p.estimate(1, now + 90ms), 50ms);
  EXPECT_EQ(p.estimate(1, now + 5s), 50ms);
  EXPECT_EQ(p.estimate(2, now + 5s), 150ms);
}

TEST(ServicePaceTest, IdleTimeAndUnsaturatedReleasesDoNotSlowIt) {
  // The old estimate divided the time since the 32nd last grant by 32: an hour
  // idle made the next waiter's estimate huge.
  ServicePace p;
  for (int i = 0; i <= 4; ++i) p.on_release(t0 + i * 100ms, true);
  p.on_release(t0 + 500ms, false);  // ends the 5th gap; the queue ran dry: a seat stays free
  const Time later = t0 + 5min;
  EXPECT_EQ(p.estimate(1, later), 100ms) << "idle time is no gap";
  EXPECT_EQ(p.estimate(4, later), 400ms);
  p.on_release(later, true);  // full again: one gap starts, none measured across the idle time
  EXPECT_EQ(p.figures(later).samples, 5u);
  EXPECT_EQ(p.estimate(2, later + 10ms), 190ms);
}

TEST(ServicePaceTest, OldHistoryIsNoEstimate) {
  ServicePace p;
  for (int i = 0; i <= 4; ++i) p.on_release(t0 + i * 100ms, true);
  p.on_release(t0 + 500ms, false);
  const Time last_gap = t0 + 500ms;
  EXPECT_NE(p.estimate(1, last_gap + fairgate::core::kPaceStale), std::nullopt);
  EXPECT_EQ(p.estimate(1, last_gap + fairgate::core::kPaceStale + 1ms), std::nullopt);
}

TEST(ServicePaceTest, MeanOfTheFirstGapsThenAnExponentialMean) {
  ServicePace p;
  p.on_release(t0, true);
  p.on_release(t0 + 100ms, true);  // 100
  p.on_release(t0 + 400ms, true);  // 300
  p.on_release(t0 + 600ms, true);  // 200: mean 200
  EXPECT_DOUBLE_EQ(p.figures(t0 + 600ms).gap_ms, 200.0);
  for (int i = 1; i <= 5; ++i) p.on_release(t0 + 600ms + i * 200ms, true);  // 8 gaps, mean 200
  EXPECT_DOUBLE_EQ(p.figures(t0 + 1600ms).gap_ms, 200.0);
  p.on_release(t0 + 2400ms, true);  // one gap of 800: weight 1/8 -> 275
  EXPECT_DOUBLE_EQ(p.figures(t0 + 2400ms).gap_ms, 275.0);
}

TEST(ServicePaceTest, InterruptEndsTheRunningGap) {
  ServicePace p;
  for (int i = 0; i <= 3; ++i) p.on_release(t0 + i * 100ms, true);
  p.interrupt();  // the cap changed
  p.on_release(t0 + 10s, true);
  EXPECT_EQ(p.figures(t0 + 10s).samples, 3u);
  EXPECT_DOUBLE_EQ(p.figures(t0 + 10s).gap_ms, 100.0);
}

TEST(ServicePaceTest, WaitersLeavingAFullLimiterMoveTheQueueToo) {
  ServicePace p;
  p.on_departure(t0);  // not full since a release: measures nothing
  EXPECT_EQ(p.figures(t0).samples, 0u);
  p.on_release(t0, true);
  p.on_departure(t0 + 100ms);  // timed out while full: one advance
  p.on_departure(t0 + 200ms);
  p.on_release(t0 + 300ms, true);
  EXPECT_EQ(p.figures(t0 + 300ms).samples, 3u);
  EXPECT_EQ(p.estimate(2, t0 + 300ms), 200ms);
  p.on_release(t0 + 400ms, false);  // a seat stays free: departures count no more
  p.on_departure(t0 + 500ms);
  EXPECT_EQ(p.figures(t0 + 500ms).samples, 4u);
}

TEST(LimiterStateEstimate, TimeoutsAheadCountAsTheQueueMoving) {
  LimiterState st(cap(1));
  RecordingSink sink;
  ASSERT_EQ(admit(st, 1, t0).kind, Kind::granted);
  for (RequestId id = 2; id <= 4; ++id) ASSERT_EQ(admit(st, id, t0, 1h).kind, Kind::queued);
  for (RequestId id = 5; id <= 7; ++id)
    ASSERT_EQ(admit(st, id, t0, std::chrono::milliseconds(100 * static_cast<int>(id))).kind, Kind::queued);
  ASSERT_TRUE(st.release(1, t0 + 100ms, sink));  // 2 holds: full, a gap starts
  st.expire(t0 + 500ms, sink);                   // 5 leaves (gap 400)
  st.expire(t0 + 650ms, sink);                   // 7 is not due: 6 leaves (gap 150)
  EXPECT_TRUE(st.waiting(7));
  ASSERT_TRUE(st.withdraw(3, t0 + 800ms));  // a cancel (gap 150): mean (400 + 150 + 150) / 3
  EXPECT_EQ(st.pace(t0 + 800ms).samples, 3u);
  EXPECT_EQ(st.estimated_wait(1, t0 + 800ms), 233ms);
  ASSERT_TRUE(st.withdraw(4));  // without a time: not counted
  EXPECT_EQ(st.pace(t0 + 800ms).samples, 3u);
}

TEST(ServicePaceTest, WouldTimeOutNeedsTheMargin) {
  using fairgate::core::would_time_out;
  EXPECT_FALSE(would_time_out(1100ms, 1000ms));
  EXPECT_FALSE(would_time_out(1250ms, 1000ms)) << "margin max(100 ms, max_wait / 4)";
  EXPECT_TRUE(would_time_out(1251ms, 1000ms));
  EXPECT_FALSE(would_time_out(200ms, 100ms));
  EXPECT_TRUE(would_time_out(201ms, 100ms));
  EXPECT_TRUE(would_time_out(101ms, 0ms));
}

// Builds a history of one seat freed (and handed on at once) every `gap`,
// on a limiter of one seat: 1 granted at t0, then releases at t0 + k x gap,
// k = 1..4, each handing over to the next waiter: three saturated gaps by
// t0 + 4 x gap, where 5 holds and 6, 7 still wait.
void seat_every(LimiterState& st, RecordingSink& sink, std::chrono::milliseconds gap) {
  ASSERT_EQ(admit(st, 1, t0).kind, Kind::granted);
  for (RequestId id = 2; id <= 7; ++id) ASSERT_EQ(admit(st, id, t0, 1h).kind, Kind::queued);
  for (RequestId id = 1; id <= 4; ++id) {
    ASSERT_TRUE(st.release(id, t0 + static_cast<int>(id) * gap, sink));
    ASSERT_TRUE(st.holding(id + 1));
  }
}

TEST(LimiterStateEstimate, QueuedAdmissionCarriesTheEstimate) {
  LimiterState st(cap(1));
  RecordingSink sink;
  seat_every(st, sink, 100ms);
  const Time now = t0 + 400ms;
  EXPECT_EQ(st.queued(), 2u);
  const Admission a = admit(st, 8, now, 10s);
  ASSERT_EQ(a.kind, Kind::queued);
  EXPECT_EQ(a.position, 3u);
  EXPECT_EQ(a.estimated_wait, 300ms);
  EXPECT_EQ(st.estimated_wait(1, now), 100ms);
  EXPECT_EQ(st.estimated_wait(4, now + 20ms), 380ms);
}

TEST(LimiterStateEstimate, NoEstimateBeforeAnyHistory) {
  LimiterState st(cap(1));
  ASSERT_EQ(admit(st, 1, t0).kind, Kind::granted);
  const Admission a = admit(st, 2, t0 + 1s, 10s);
  ASSERT_EQ(a.kind, Kind::queued);
  EXPECT_EQ(a.estimated_wait, std::nullopt);
}

TEST(LimiterStateEstimate, ReleasesIntoFreeSeatsMeasureNothing) {
  // Cap 3, one request at a time: every release leaves seats free.
  LimiterState st(cap(3));
  RecordingSink sink;
  for (RequestId id = 1; id <= 20; ++id) {
    ASSERT_EQ(admit(st, id, t0 + static_cast<int>(id) * 1s).kind, Kind::granted);
    ASSERT_TRUE(st.release(id, t0 + static_cast<int>(id) * 1s + 10ms, sink));
  }
  EXPECT_EQ(st.pace(t0 + 30s).samples, 0u);
  EXPECT_EQ(st.estimated_wait(1, t0 + 30s), std::nullopt);
}

TEST(LimiterStateEstimate, EarlyRejectWhenTheEstimateExceedsMaxWaitByTheMargin) {
  Settings s = cap(1);
  s.reject_early = true;
  LimiterState st(s);
  RecordingSink sink;
  seat_every(st, sink, 1s);  // 2 wait: a newcomer is at position 3, about 3 s away
  const Time now = t0 + 4s;
  const Admission too_short = st.admit(10, now, now + 2s, "");
  EXPECT_EQ(too_short.kind, Kind::rejected);
  EXPECT_EQ(too_short.reason, RejectReason::would_time_out);
  EXPECT_FALSE(st.waiting(10));
  // 3 s estimated, 2.5 s max wait: within the margin (625 ms), it waits.
  const Admission close = st.admit(11, now, now + 2500ms, "");
  EXPECT_EQ(close.kind, Kind::queued);
  // Position 4 now: 4 s away by the queue pace — but 11 times out (2.5 s)
  // before its seat (3 s) and makes way: 12 is served at ~3 s, within 3.1 s.
  EXPECT_EQ(st.admit(12, now, now + 3100ms, "").kind, Kind::queued);
  EXPECT_EQ(st.admit(13, now, now + 1h, "").kind, Kind::queued);
  // Seats at 1 s (6), 2 s (7), 3 s (12), 4 s (13): the next is 5 s away,
  // past 3.1 s and 4.7 s (the queue pace says 6 s), within 5 s.
  EXPECT_EQ(st.admit(14, now, now + 3100ms, "").reason, RejectReason::would_time_out);
  EXPECT_EQ(st.admit(15, now, now + 4700ms, "").reason, RejectReason::would_time_out);
  EXPECT_EQ(st.admit(16, now, now + 5000ms, "").kind, Kind::queued);

  // Off: the same request waits.
  s.reject_early = false;
  st.configure(s, now, sink);
  EXPECT_EQ(st.admit(14, now, now + 1ms, "").kind, Kind::queued);
}

TEST(ServicePaceTest, WaitBehindSkipsWaitersThatTimeOutFirst) {
  using fairgate::core::wait_behind;
  PaceFigures seats;
  seats.gap_ms = 100;
  seats.samples = 5;
  seats.since_full_ms = 30;  // the next seat in 70 ms
  std::vector<double> ahead{500, 50, 1000, 120};
  std::size_t i = 0;
  const auto next = [&]() -> std::optional<double> {
    return i < ahead.size() ? std::optional<double>(ahead[i++]) : std::nullopt;
  };
  // 500 takes the seat at 70; 50 is gone by 170; 1000 takes 170; 120 is gone
  // by 270: the newcomer's seat is at 270.
  EXPECT_DOUBLE_EQ(*wait_behind(seats, next, 10'000), 270.0);
  // It stops once past the limit (and says so with a value above it).
  i = 0;
  ahead.assign(1000, 1e9);
  EXPECT_GT(*wait_behind(seats, next, 1000), 1000.0);
  EXPECT_LT(i, 20u) << "read the queue only up to the limit";
  // No seat pace: no answer.
  seats.samples = 2;
  EXPECT_EQ(wait_behind(seats, next, 1000), std::nullopt);
}

// --- views --------------------------------------------------------------------------

TEST(LimiterStateViews, PositionsWaitersAndHolders) {
  LimiterState st(cap(2));
  RecordingSink sink;
  ASSERT_EQ(st.admit(1, t0, t0 + 1s, "alice").kind, Kind::granted);
  ASSERT_EQ(st.admit(2, t0 + 1ms, t0 + 1s, "bob").kind, Kind::granted);
  ASSERT_EQ(st.admit(3, t0 + 2ms, t0 + 3s, "carol").kind, Kind::queued);
  ASSERT_EQ(st.admit(4, t0 + 3ms, t0 + 2s, "dave").kind, Kind::queued);
  ASSERT_EQ(st.admit(5, t0 + 4ms, t0 + 4s, "erin").kind, Kind::queued);

  const auto* h = st.holder(2);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->tenant, "bob");
  EXPECT_EQ(h->granted, t0 + 1ms);
  EXPECT_LT(st.holder(1)->grant_seq, h->grant_seq);
  EXPECT_EQ(st.holder(3), nullptr);

  const auto* w = st.waiter(4);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->tenant, "dave");
  EXPECT_EQ(w->enqueued, t0 + 3ms);
  EXPECT_EQ(w->deadline, t0 + 2s);
  EXPECT_LT(st.waiter(3)->seq, w->seq);
  EXPECT_EQ(st.waiter(1), nullptr);
  EXPECT_EQ(st.next_deadline(), t0 + 2s);

  EXPECT_EQ(st.position(3), 1u);
  EXPECT_EQ(st.position(4), 2u);
  EXPECT_EQ(st.position(5), 3u);
  ASSERT_TRUE(st.withdraw(3));
  EXPECT_EQ(st.position(4), 1u);
  EXPECT_EQ(st.position(5), 2u);

  std::set<RequestId> holders;
  st.for_each_holder([&](RequestId id, const LimiterState::Holder&) { holders.insert(id); });
  EXPECT_EQ(holders, (std::set<RequestId>{1, 2}));

  ASSERT_TRUE(st.release(1, t0 + 10ms, sink));
  EXPECT_EQ(st.holder(4)->tenant, "dave");
  EXPECT_EQ(st.holder(4)->granted, t0 + 10ms);
  EXPECT_GT(st.holder(4)->grant_seq, st.holder(2)->grant_seq);
  EXPECT_EQ(st.position(5), 1u);
}

// --- the model-based random test ------------------------------------------------------
//
// A random sequence of admit / release / withdraw / expire / configure with a
// fake clock, against a minimal model (a FIFO list of waiters and a set of
// holders). The model is updated from the decisions the state reports to its
// sink, and every decision is checked when it is made:
//   I1 a grant (at admission or from the queue) happens only while
//      holders < max_concurrent (enabled), and the excess above the cap left
//      by a lowering only shrinks;
//   I2 a grant from the queue goes to the model's head; an admission is
//      granted only when the queue is empty; grant_seq increases;
//   I3 after every operation: queue empty or no room;
//   I4 nobody past their deadline is offered a permit; timeout drops are due;
//   I5 the state's waiters and holders equal the model's, disjointly, and
//      the positions follow the model's order.
class ModelTest : public ::testing::TestWithParam<std::uint64_t> {};

struct ModelWaiter {
  RequestId id;
  Time deadline;
};

class Model final : public fairgate::core::DispatchSink {
 public:
  LimiterState& st;
  Time now = t0;
  std::vector<ModelWaiter> queue;  // arrival order
  std::set<RequestId> holders;
  std::set<RequestId> refuse;  // tickets that "ended" while queued
  bool configuring_disabled_reject = false;
  std::uint64_t last_grant_seq = 0;
  bool any_grant = false;
  std::uint64_t grants = 0, drops = 0, refused = 0;

  explicit Model(LimiterState& s) : st(s) {}

  bool room() const {
    const Settings& s = st.settings();
    if (!s.enabled) return s.when_disabled == DisabledMode::pass_through;
    return st.in_use() < s.max_concurrent;
  }

  void note_grant(RequestId id) {
    const auto* h = st.holder(id);
    ASSERT_NE(h, nullptr);
    if (any_grant) {
      EXPECT_GT(h->grant_seq, last_grant_seq) << "I2: grant order";
    }
    last_grant_seq = h->grant_seq;
    any_grant = true;
    holders.insert(id);
    ++grants;
  }

  bool try_grant(RequestId id) override {
    // Called before the state adds the holder: there must be room now (I1).
    EXPECT_TRUE(room()) << "I1: grant of " << id << " with in_use " << st.in_use() << " and cap "
                        << st.settings().max_concurrent;
    EXPECT_FALSE(queue.empty()) << "try_grant with an empty model queue";
    if (queue.empty()) return false;
    EXPECT_EQ(queue.front().id, id) << "I2: only the head may be granted";
    EXPECT_GT(queue.front().deadline, now) << "I4: expired waiter offered a permit";
    queue.erase(queue.begin());
    if (refuse.erase(id) > 0) {
      ++refused;
      return false;
    }
    pending_holder = id;
    return true;
  }

  void drop(RequestId id, RejectReason reason) override {
    ++drops;
    auto it = std::find_if(queue.begin(), queue.end(), [&](const ModelWaiter& w) { return w.id == id; });
    EXPECT_NE(it, queue.end()) << "drop of " << id << " which is not waiting";
    if (it == queue.end()) return;
    if (reason == RejectReason::timeout) {
      EXPECT_LE(it->deadline, now) << "I4: timeout drop before the deadline";
    } else if (reason == RejectReason::disabled) {
      EXPECT_TRUE(configuring_disabled_reject);
      EXPECT_EQ(it, queue.begin()) << "disabled drops go in queue order";
    } else {
      ADD_FAILURE() << "unexpected drop reason " << fairgate::to_string(reason);
    }
    refuse.erase(id);
    queue.erase(it);
  }

  // The grant a successful try_grant promised becomes visible in the state
  // only after try_grant returns; settle it on the next sink call or op end.
  std::optional<RequestId> pending_holder;
  void settle() {
    if (pending_holder) {
      note_grant(*pending_holder);
      pending_holder.reset();
    }
  }
};

// A sink adaptor that settles the model's previous grant before each call.
class SettlingSink final : public fairgate::core::DispatchSink {
 public:
  explicit SettlingSink(Model& m) : m_(m) {}
  bool try_grant(RequestId id) override {
    m_.settle();
    return m_.try_grant(id);
  }
  void drop(RequestId id, RejectReason reason) override {
    m_.settle();
    m_.drop(id, reason);
  }

 private:
  Model& m_;
};

void check_consistency(const LimiterState& st, const Model& m, bool full) {
  // I3
  const bool room = m.room();
  EXPECT_TRUE(st.queued() == 0 || !room)
      << "I3: " << st.queued() << " waiting with room (in_use " << st.in_use() << ")";
  // I5
  ASSERT_EQ(st.in_use(), m.holders.size());
  ASSERT_EQ(st.queued(), m.queue.size());
  for (RequestId id : m.holders) {
    ASSERT_TRUE(st.holding(id)) << id;
    ASSERT_FALSE(st.waiting(id)) << id;
  }
  if (!full) {
    if (!m.queue.empty()) {
      EXPECT_TRUE(st.waiting(m.queue.front().id));
      EXPECT_EQ(st.position(m.queue.front().id), 1u);
    }
    return;
  }
  std::size_t i = 0;
  st.for_each_waiter([&](RequestId id, std::size_t position, const LimiterState::Waiter& w) {
    ASSERT_LT(i, m.queue.size());
    EXPECT_EQ(id, m.queue[i].id) << "I2/I5: queue order at " << position;
    EXPECT_EQ(position, i + 1);
    EXPECT_EQ(w.deadline, m.queue[i].deadline);
    EXPECT_FALSE(st.holding(id));
    ++i;
  });
  std::optional<Time> earliest;
  for (const auto& w : m.queue) earliest = earliest ? std::min(*earliest, w.deadline) : w.deadline;
  EXPECT_EQ(st.next_deadline(), earliest);
}

TEST_P(ModelTest, RandomOperationsKeepEveryInvariant) {
  const std::uint64_t seed = GetParam();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto pick = [&](std::uint64_t n) { return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(rng); };

  LimiterState st(cap(3, 20));
  Model m(st);
  SettlingSink sink(m);
  RequestId next_id = 1;
  std::size_t excess = 0;  // holders above the cap left by a lowering (I1)
  std::uint64_t admitted = 0, queued = 0, rejected = 0, configured = 0;
  constexpr int kOps = 50'000;

  for (int op = 0; op < kOps && !HasFailure(); ++op) {
    m.now += std::chrono::microseconds(pick(3000));
    const std::size_t in_use_before = st.in_use();
    const std::uint64_t r = pick(100);
    bool was_configure = false;
    if (r < 38) {
      // admit
      const RequestId id = next_id++;
      const auto wait = pick(10) == 0 ? 0ms : std::chrono::milliseconds(1 + pick(60));
      const Time deadline = m.now + wait;
      const Settings s = st.settings();
      const std::size_t position = m.queue.size() + 1;
      const auto estimate = st.estimated_wait(position, m.now);
      // The expected decision, from the rules.
      RejectReason want_reason = RejectReason::unavailable;
      Admission::Kind want = Kind::rejected;
      if (!s.enabled && s.when_disabled == DisabledMode::reject) {
        want_reason = RejectReason::disabled;
      } else if (m.queue.empty() && m.room()) {
        want = Kind::granted;
      } else if (deadline <= m.now) {
        want_reason = RejectReason::timeout;
      } else if (s.max_queue && m.queue.size() >= *s.max_queue) {
        want_reason = RejectReason::queue_full;
      } else if (s.reject_early && estimate &&
                 fairgate::core::would_time_out(
                     *estimate, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - m.now))) {
        want_reason = RejectReason::would_time_out;
      } else {
        want = Kind::queued;
      }
      const Admission a = st.admit(id, m.now, deadline, "t");
      ++admitted;
      ASSERT_EQ(a.kind, want) << "op " << op;
      if (a.kind == Kind::granted) {
        m.note_grant(id);
      } else if (a.kind == Kind::queued) {
        ++queued;
        EXPECT_EQ(a.position, position);
        EXPECT_EQ(a.estimated_wait, estimate);
        m.queue.push_back({id, deadline});
        // Some waiters end (cancel in flight) before they reach the head.
        if (pick(20) == 0) m.refuse.insert(id);
      } else {
        ++rejected;
        EXPECT_EQ(a.reason, want_reason);
        EXPECT_FALSE(st.waiting(id) || st.holding(id));
      }
    } else if (r < 70) {
      // release a random holder, now and then an id that holds nothing
      if (pick(15) == 0 || m.holders.empty()) {
        const RequestId bogus =
            m.queue.empty() || pick(2) ? next_id + 1000 : m.queue[pick(m.queue.size())].id;
        EXPECT_FALSE(st.release(bogus, m.now, sink));
      } else {
        auto it = m.holders.begin();
        std::advance(it, static_cast<long>(pick(m.holders.size())));
        const RequestId id = *it;
        m.holders.erase(it);
        EXPECT_TRUE(st.release(id, m.now, sink));
        EXPECT_FALSE(st.holding(id));
      }
    } else if (r < 78) {
      // withdraw (cancel) a random waiter, or someone not waiting
      if (!m.queue.empty() && pick(6) != 0) {
        const std::size_t i = pick(m.queue.size());
        const RequestId id = m.queue[i].id;
        m.queue.erase(m.queue.begin() + static_cast<long>(i));
        m.refuse.erase(id);
        EXPECT_TRUE(st.withdraw(id));
      } else {
        const RequestId id = m.holders.empty() ? next_id + 7 : *m.holders.begin();
        EXPECT_FALSE(st.withdraw(id));
      }
    } else if (r < 95) {
      st.expire(m.now, sink);
      for (const auto& w : m.queue) EXPECT_GT(w.deadline, m.now) << "expire left an expired waiter";
    } else {
      // configure
      was_configure = true;
      ++configured;
      Settings s;
      s.max_concurrent = static_cast<std::uint32_t>(1 + pick(6));
      const std::uint64_t q = pick(4);
      s.max_queue =
          q == 0 ? std::nullopt : std::optional<std::uint32_t>(static_cast<std::uint32_t>(pick(25)));
      s.enabled = pick(8) != 0;
      s.when_disabled = pick(2) ? DisabledMode::pass_through : DisabledMode::reject;
      s.reject_early = pick(5) == 0;
      const bool lowering = s.enabled && s.max_concurrent <= in_use_before;
      m.configuring_disabled_reject = !s.enabled && s.when_disabled == DisabledMode::reject;
      const std::size_t grants_before = m.grants;
      st.configure(s, m.now, sink);
      m.settle();
      m.configuring_disabled_reject = false;
      if (lowering) {
        EXPECT_EQ(m.grants, grants_before) << "I1: grant after lowering the cap to " << s.max_concurrent
                                           << " with " << in_use_before << " holders";
        EXPECT_EQ(st.in_use(), in_use_before) << "lowering must not revoke";
      }
    }
    m.settle();

    // I1 (bounded): while enabled, holders above the cap only ever come from a
    // lowering (or a disabled pass-through period), and that excess only shrinks.
    const Settings& s = st.settings();
    if (s.enabled) {
      const std::size_t over = st.in_use() > s.max_concurrent ? st.in_use() - s.max_concurrent : 0;
      if (!was_configure) {
        EXPECT_LE(over, excess) << "I1: holders " << st.in_use() << " > cap " << s.max_concurrent;
      }
      excess = over;
    } else {
      excess = st.in_use();  // pass-through may grant beyond any cap
    }
    check_consistency(st, m, /*full=*/m.queue.size() < 64 || op % 64 == 0);
  }
  // The random walk must actually have visited the interesting states.
  EXPECT_GT(m.grants, 1000u);
  EXPECT_GT(queued, 1000u);
  EXPECT_GT(rejected, 100u);
  EXPECT_GT(m.drops, 100u);
  EXPECT_GT(m.refused, 10u);
  EXPECT_GT(configured, 100u);
  EXPECT_GT(admitted, 1000u);
}

// Four seeds x 50,000 operations = 200,000 operations.
INSTANTIATE_TEST_SUITE_P(Seeds, ModelTest, ::testing::Values(1u, 20240601u, 0xfa19a7eu, 987654321u));

}  // namespace
