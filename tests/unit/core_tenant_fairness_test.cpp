// core::LimiterState with tenants (F12): the weighted rotation, FIFO within a
// tenant, the per-tenant cap (skip, then grant when the tenant frees a
// permit), timeouts and cancels of a tenant's waiters, positions, toggling
// fairness and the cap at run time — and a random walk that checks I1, I2',
// I3', I6, one exit per request and the no-starvation bound after every step.
#include "core/limiter_state.hpp"

#include "support/recording_sink.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using fairgate::RejectReason;
using fairgate::Settings;
using fairgate::core::Admission;
using fairgate::core::LimiterState;
using fairgate::core::RequestId;
using fairgate::core::Time;
using fairgate::test::RecordingSink;
using Kind = Admission::Kind;

const Time t0 = Time{} + 1h;

Settings fair(std::uint32_t max_concurrent, std::optional<std::uint32_t> per_tenant = std::nullopt,
              bool fairness = true) {
  Settings s;
  s.max_concurrent = max_concurrent;
  s.tenant_fairness = fairness;
  s.max_per_tenant = per_tenant;
  return s;
}

Kind admit(LimiterState& st, RequestId id, const std::string& tenant, std::uint32_t weight = 1, Time now = t0,
           std::chrono::milliseconds wait = 10s) {
  return st.admit(id, now, now + wait, tenant, weight).kind;
}

// Releases `holder` and returns what got granted for it.
std::vector<RequestId> release(LimiterState& st, RequestId holder, Time now = t0) {
  RecordingSink sink;
  EXPECT_TRUE(st.release(holder, now, sink));
  return sink.granted;
}

// With one seat: releases the holder over and over and returns the grant order.
std::vector<RequestId> drain_one_seat(LimiterState& st, RequestId holder, Time now = t0) {
  std::vector<RequestId> order;
  for (;;) {
    auto g = release(st, holder, now);
    if (g.empty()) break;
    EXPECT_EQ(g.size(), 1u) << "one seat: one grant per release";
    order.push_back(g.front());
    holder = g.front();
  }
  return order;
}

// --- rotation ----------------------------------------------------------------

TEST(TenantFairness, EqualWeightsRotateOneGrantPerTenant) {
  LimiterState st(fair(1));
  ASSERT_EQ(admit(st, 1, "h"), Kind::granted);
  // A floods first, then B and C arrive.
  for (RequestId id : {10, 11, 12, 13}) ASSERT_EQ(admit(st, id, "A"), Kind::queued);
  for (RequestId id : {20, 21}) ASSERT_EQ(admit(st, id, "B"), Kind::queued);
  ASSERT_EQ(admit(st, 30, "C"), Kind::queued);
  EXPECT_EQ(st.waiting_tenants(), 3u);
  EXPECT_EQ(drain_one_seat(st, 1), (std::vector<RequestId>{10, 20, 30, 11, 21, 12, 13}));
  EXPECT_EQ(st.waiting_tenants(), 0u);
}

TEST(TenantFairness, WeightGivesThatManyGrantsPerTurn) {
  LimiterState st(fair(1));
  ASSERT_EQ(admit(st, 1, "h"), Kind::granted);
  for (RequestId id : {10, 11, 12, 13, 14}) ASSERT_EQ(admit(st, id, "A", 2), Kind::queued);
  for (RequestId id : {20, 21, 22}) ASSERT_EQ(admit(st, id, "B", 1), Kind::queued);
  for (RequestId id : {30, 31, 32, 33}) ASSERT_EQ(admit(st, id, "C", 3), Kind::queued);
  EXPECT_EQ(drain_one_seat(st, 1), (std::vector<RequestId>{10, 11, 20, 30, 31, 32, 12, 13, 21, 33, 14, 22}));
}

TEST(TenantFairness, ANewTenantJoinsAtTheBackOfTheRotation) {
  LimiterState st(fair(1));
  ASSERT_EQ(admit(st, 1, "h"), Kind::granted);
  for (RequestId id : {10, 11, 12}) admit(st, id, "A");
  for (RequestId id : {20, 21}) admit(st, id, "B");
  EXPECT_EQ(release(st, 1), std::vector<RequestId>{10});  // A's turn is over: A goes behind B
  admit(st, 30, "C");                                     // C joins behind A
  EXPECT_EQ(drain_one_seat(st, 10), (std::vector<RequestId>{20, 11, 30, 21, 12}));
}

TEST(TenantFairness, FairnessOffWithTenantsIsGlobalFifo) {
  LimiterState st(fair(1, std::nullopt, /*fairness=*/false));
  ASSERT_EQ(admit(st, 1, "h"), Kind::granted);
  for (RequestId id : {10, 11, 12}) admit(st, id, "A");
  admit(st, 20, "B");
  admit(st, 13, "A");
  admit(st, 30, "C");
  EXPECT_EQ(drain_one_seat(st, 1), (std::vector<RequestId>{10, 11, 12, 20, 13, 30}));
}

// --- per-tenant cap ----------------------------------------------------------

TEST(TenantCap, SkipsATenantAtItsCapAndGrantsItWhenItFreesAPermit) {
  for (bool fairness : {false, true}) {
    SCOPED_TRACE(fairness ? "fairness on" : "fairness off");
    LimiterState st(fair(3, /*per_tenant=*/1, fairness));
    ASSERT_EQ(admit(st, 10, "A"), Kind::granted);
    EXPECT_EQ(admit(st, 11, "A"), Kind::queued) << "room, but A is at its cap";
    EXPECT_TRUE(st.tenant_parked("A"));
    EXPECT_EQ(admit(st, 12, "A"), Kind::queued);
    EXPECT_EQ(admit(st, 20, "B"), Kind::granted) << "B is below its cap and nobody eligible waits";
    EXPECT_EQ(st.in_use(), 2u) << "a seat stays free: only A waits, and A is at its cap (I3')";
    EXPECT_EQ(release(st, 20), std::vector<RequestId>{}) << "B's release cannot serve A";
    EXPECT_EQ(release(st, 10), std::vector<RequestId>{11}) << "A freed a permit: its head is served";
    EXPECT_EQ(st.tenant_holders("A"), 1u);
    EXPECT_TRUE(st.tenant_parked("A"));
    EXPECT_EQ(release(st, 11), std::vector<RequestId>{12});
    EXPECT_FALSE(st.tenant_parked("A"));
  }
}

// The Redis backend's local fallback (seats): each tenant reuses only the seats
// it held when Redis went away, so max_per_tenant holds across instances that
// each decide alone; a tenant that held none waits.
TEST(TenantCap, CappedAtTheirHoldersTenantsReuseOnlyTheirOwnSeats) {
  for (bool fairness : {false, true}) {
    SCOPED_TRACE(fairness ? "fairness on" : "fairness off");
    LimiterState st(fair(4, /*per_tenant=*/2, fairness));
    st.adopt(10, t0, "B");
    st.adopt(11, t0, "B");
    st.adopt(20, t0, "C");
    st.cap_tenants_at_their_holders();
    EXPECT_EQ(admit(st, 30, "A"), Kind::queued) << "a seat is free, but A held none here";
    EXPECT_EQ(admit(st, 21, "C"), Kind::queued) << "C holds the one seat it had";
    EXPECT_EQ(release(st, 10), std::vector<RequestId>{}) << "B's seat is B's: A and C wait";
    EXPECT_EQ(admit(st, 12, "B"), Kind::granted) << "B reuses its own seat";
    EXPECT_EQ(admit(st, 13, "B"), Kind::queued) << "and no more than it had";
    EXPECT_EQ(release(st, 20), std::vector<RequestId>{21}) << "C's seat goes to C";
    EXPECT_EQ(st.tenant_holders("A"), 0u);
    EXPECT_EQ(st.in_use(), 3u) << "a seat stays free: nobody waiting may take it";
  }
}

TEST(TenantCap, FifoSkipsOnlyTheCappedTenant) {
  LimiterState st(fair(2, 2, /*fairness=*/false));
  ASSERT_EQ(admit(st, 10, "A"), Kind::granted);
  ASSERT_EQ(admit(st, 11, "A"), Kind::granted);
  admit(st, 12, "A");
  admit(st, 20, "B");
  admit(st, 13, "A");
  admit(st, 21, "B");
  // A holds 2 = its cap: B's waiters pass A's older ones.
  EXPECT_EQ(release(st, 10), std::vector<RequestId>{12})
      << "A's own release serves A (oldest waiter overall)";
  EXPECT_EQ(st.tenant_holders("A"), 2u);
  // Lower max_per_tenant to 1: A (2 holders) is over it, nothing is revoked.
  RecordingSink sink;
  st.configure(fair(2, 1, false), t0, sink);
  EXPECT_TRUE(sink.granted.empty());
  EXPECT_EQ(release(st, 11), std::vector<RequestId>{20}) << "A still at its cap of 1: B is served";
  EXPECT_EQ(release(st, 12), std::vector<RequestId>{13}) << "A below its cap again: A's head (older than 21)";
}

TEST(TenantCap, RaisingOrRemovingTheCapAdmitsParkedTenantsAtOnce) {
  LimiterState st(fair(4, 1));
  ASSERT_EQ(admit(st, 10, "A"), Kind::granted);
  admit(st, 11, "A");
  admit(st, 12, "A");
  RecordingSink sink;
  st.configure(fair(4, 2), t0, sink);
  EXPECT_EQ(sink.granted, std::vector<RequestId>{11});
  sink.clear();
  st.configure(fair(4, std::nullopt), t0, sink);
  EXPECT_EQ(sink.granted, std::vector<RequestId>{12});
  EXPECT_EQ(st.queued(), 0u);
}

TEST(TenantCap, DisabledPassThroughIgnoresTheCap) {
  LimiterState st(fair(1, 1));
  ASSERT_EQ(admit(st, 10, "A"), Kind::granted);
  admit(st, 11, "A");
  Settings s = fair(1, 1);
  s.enabled = false;
  RecordingSink sink;
  st.configure(s, t0, sink);
  EXPECT_EQ(sink.granted, std::vector<RequestId>{11});
  EXPECT_EQ(admit(st, 12, "A"), Kind::granted);
}

// --- timeouts, cancels, positions, toggling ------------------------------------

TEST(TenantFairness, AnExpiredHeadIsDroppedAndItsTenantKeepsItsTurn) {
  LimiterState st(fair(1));
  ASSERT_EQ(admit(st, 1, "h"), Kind::granted);
  admit(st, 10, "A", 1, t0, 1s);  // expires at t0 + 1 s
  admit(st, 11, "A", 1, t0, 10s);
  admit(st, 20, "B", 1, t0, 10s);
  RecordingSink sink;
  ASSERT_TRUE(st.release(1, t0 + 2s, sink));
  EXPECT_EQ(sink.dropped, (std::vector<RecordingSink::Drop>{{10, RejectReason::timeout}}));
  EXPECT_EQ(sink.granted, std::vector<RequestId>{11}) << "A's next waiter, still in A's turn";
  EXPECT_EQ(drain_one_seat(st, 11, t0 + 2s), std::vector<RequestId>{20});
}

TEST(TenantFairness, ExpireRemovesTheHeadOfAParkedTenant) {
  LimiterState st(fair(2, 1));
  ASSERT_EQ(admit(st, 10, "A"), Kind::granted);
  admit(st, 11, "A", 1, t0, 1s);
  EXPECT_EQ(st.next_deadline(), t0 + 1s);
  RecordingSink sink;
  st.expire(t0 + 1s, sink);
  EXPECT_EQ(sink.dropped, (std::vector<RecordingSink::Drop>{{11, RejectReason::timeout}}));
  EXPECT_EQ(st.waiting_tenants(), 0u);
  EXPECT_FALSE(st.tenant_parked("A"));
  EXPECT_EQ(release(st, 10), std::vector<RequestId>{});
  EXPECT_EQ(st.tenant_holders("A"), 0u);
}

TEST(TenantFairness, CancelOfATenantsLastWaiterTakesItOutOfTheRotation) {
  LimiterState st(fair(1));
  ASSERT_EQ(admit(st, 1, "h"), Kind::granted);
  admit(st, 10, "A");
  admit(st, 20, "B");
  admit(st, 30, "C");
  admit(st, 11, "A");
  EXPECT_TRUE(st.withdraw(20));
  EXPECT_EQ(st.waiting_tenants(), 2u);
  EXPECT_EQ(st.tenant_queued("B"), 0u);
  EXPECT_EQ(drain_one_seat(st, 1), (std::vector<RequestId>{10, 30, 11}));
}

TEST(TenantFairness, PositionsFollowTheRotation) {
  LimiterState st(fair(1));
  ASSERT_EQ(admit(st, 1, "h"), Kind::granted);
  EXPECT_EQ(st.admit(10, t0, t0 + 10s, "A", 1).position, 1u);
  EXPECT_EQ(st.admit(11, t0, t0 + 10s, "A", 1).position, 2u);
  EXPECT_EQ(st.admit(12, t0, t0 + 10s, "A", 1).position, 3u);
  EXPECT_EQ(st.admit(20, t0, t0 + 10s, "B", 1).position, 2u) << "B's first waiter is second in the rotation";
  // Two tenants wait, A first in the rotation: A's k-th waiter is served in
  // round k, after the tenants ahead of A in that round.
  EXPECT_EQ(st.position(10), 1u);
  EXPECT_EQ(st.position(20), 2u);
  EXPECT_EQ(st.position(11), 3u);
  EXPECT_EQ(st.position(12), 4u) << "B has no second waiter: none in round 3";
  std::map<RequestId, std::size_t> seen;
  st.for_each_waiter(
      [&](RequestId id, std::size_t position, const LimiterState::Waiter&) { seen[id] = position; });
  EXPECT_EQ(seen, (std::map<RequestId, std::size_t>{{10, 1}, {11, 3}, {12, 4}, {20, 2}}));
  EXPECT_EQ(drain_one_seat(st, 1), (std::vector<RequestId>{10, 20, 11, 12})) << "served in position order";
}

// A tenant with fewer waiters than another's rank takes no place in the later
// rounds: A's third waiter (12) is served 6th (10 20 30 11 31 12 32), not 7th as
// (k-1) x T + r said (B has no third waiter).
TEST(TenantFairness, PositionsCountOnlyTheWaitersEachTenantHas) {
  LimiterState st(fair(1));
  ASSERT_EQ(admit(st, 1, "h"), Kind::granted);
  for (RequestId id : {10, 11, 12}) admit(st, id, "A");
  admit(st, 20, "B");
  EXPECT_EQ(st.admit(30, t0, t0 + 10s, "C", 1).position, 3u);
  EXPECT_EQ(st.admit(31, t0, t0 + 10s, "C", 1).position, 5u);
  EXPECT_EQ(st.admit(32, t0, t0 + 10s, "C", 1).position, 7u);
  std::map<RequestId, std::size_t> seen;
  st.for_each_waiter(
      [&](RequestId id, std::size_t position, const LimiterState::Waiter&) { seen[id] = position; });
  EXPECT_EQ(seen, (std::map<RequestId, std::size_t>{
                      {10, 1}, {20, 2}, {30, 3}, {11, 4}, {31, 5}, {12, 6}, {32, 7}}));
  for (const auto& [id, position] : seen) EXPECT_EQ(st.position(id), position) << id;
  EXPECT_EQ(drain_one_seat(st, 1), (std::vector<RequestId>{10, 20, 30, 11, 31, 12, 32}));
}

// With weights 1, no tenant cap and nobody arriving, the positions are the
// order of service — whatever the tenants, their queues and the rotation so far.
TEST(TenantFairness, PositionsAreTheOrderOfServiceInRandomQueues) {
  std::mt19937 rng(20261206);
  for (int round = 0; round < 200; ++round) {
    LimiterState st(fair(1));
    ASSERT_EQ(admit(st, 1, "h"), Kind::granted);
    const int tenants = 1 + static_cast<int>(rng() % 6);
    const int arrivals = 1 + static_cast<int>(rng() % 30);
    RequestId next = 100;
    for (int i = 0; i < arrivals; ++i) admit(st, next++, "t" + std::to_string(rng() % tenants));
    // Serve a few first, so that the rotation is under way (a tenant mid-round).
    RequestId holder = 1;
    for (unsigned served = rng() % 4; served > 0 && st.queued() > 0; --served) {
      const auto g = release(st, holder);
      ASSERT_EQ(g.size(), 1u);
      holder = g.front();
    }
    std::vector<std::pair<std::size_t, RequestId>> by_position;
    st.for_each_waiter([&](RequestId id, std::size_t position, const LimiterState::Waiter&) {
      by_position.emplace_back(position, id);
      EXPECT_EQ(st.position(id), position);
    });
    std::sort(by_position.begin(), by_position.end());
    std::vector<RequestId> expected;
    for (std::size_t i = 0; i < by_position.size(); ++i) {
      EXPECT_EQ(by_position[i].first, i + 1) << "positions 1..n, each once (round " << round << ")";
      expected.push_back(by_position[i].second);
    }
    EXPECT_EQ(drain_one_seat(st, holder), expected) << "round " << round;
  }
}

TEST(TenantFairness, TogglingAtRunTimeKeepsEveryWaitersPlaceInItsTenant) {
  LimiterState st(fair(1, std::nullopt, /*fairness=*/false));
  ASSERT_EQ(admit(st, 1, "h"), Kind::granted);
  for (RequestId id : {10, 11, 12}) admit(st, id, "A");
  for (RequestId id : {20, 21}) admit(st, id, "B");
  RecordingSink sink;
  st.configure(fair(1), t0, sink);  // fairness on: rotation A, B (by oldest waiter)
  EXPECT_TRUE(sink.granted.empty());
  auto g = release(st, 1);
  ASSERT_EQ(g, std::vector<RequestId>{10});
  g = release(st, 10);
  ASSERT_EQ(g, std::vector<RequestId>{20});
  st.configure(fair(1, std::nullopt, false), t0, sink);  // off again: global FIFO by arrival
  EXPECT_EQ(drain_one_seat(st, 20), (std::vector<RequestId>{11, 12, 21}));
}

TEST(TenantFairness, InvalidWeightOrCapIsRejectedByValidate) {
  Settings s = fair(3, 0);
  auto e = fairgate::validate(s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->field, "max_per_tenant");
  s.max_per_tenant = 10;  // above max_concurrent: allowed, never binds
  EXPECT_EQ(fairgate::validate(s), std::nullopt);
}

// --- random walk ---------------------------------------------------------------

class TenantModelTest : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(TenantModelTest, InvariantsHoldAfterEveryStep) {
  std::mt19937_64 rng(GetParam());
  auto pick = [&](std::uint64_t n) { return rng() % n; };
  const bool with_caps = GetParam() % 2 == 1;  // even seeds: no caps, fixed fairness → starvation bound
  Settings s = fair(3, with_caps ? std::optional<std::uint32_t>(2) : std::nullopt);
  LimiterState st(s);
  const std::vector<std::string> names{"", "a", "b", "c", "d"};
  constexpr std::uint32_t kMaxWeight = 3;

  struct W {
    std::string tenant;
    std::uint64_t seq;
    Time deadline;
  };
  std::map<RequestId, W> waiting;  // the model's waiters
  std::map<RequestId, std::string> holding;
  std::set<RequestId> ended;                        // each id ends once
  std::map<std::string, std::size_t> others_since;  // grants to other tenants while this one waited
  std::uint64_t seq = 0;
  std::uint64_t grants = 0, drops = 0, parked_seen = 0;
  Time now = t0;
  RecordingSink sink;

  auto tenant_waits = [&](const std::string& t) {
    return std::any_of(waiting.begin(), waiting.end(), [&](const auto& w) { return w.second.tenant == t; });
  };
  sink.on_try_grant = [&](RequestId id) {
    ASSERT_TRUE(waiting.contains(id)) << "offered a non-waiter";
    const W w = waiting.at(id);
    const Settings& cur = st.settings();
    if (cur.enabled) {
      EXPECT_LT(st.in_use(), cur.max_concurrent) << "I1";
      if (cur.max_per_tenant) {
        EXPECT_LT(st.tenant_holders(w.tenant), *cur.max_per_tenant) << "I6";
      }
    }
    // Waiters this same pass already dropped (expired heads) or offered have left.
    const auto left = [&](RequestId other) {
      return std::any_of(sink.dropped.begin(), sink.dropped.end(),
                         [&](const auto& d) { return d.id == other; }) ||
             std::find(sink.offered.begin(), sink.offered.end(), other) != sink.offered.end();
    };
    for (const auto& [other, ow] : waiting) {
      if (ow.tenant == w.tenant && !left(other)) {
        EXPECT_GE(ow.seq, w.seq) << "I2': FIFO within tenant " << w.tenant;
      }
    }
  };

  RequestId next_id = 1;
  for (int op = 0; op < 40'000; ++op) {
    sink.clear();
    const auto r = pick(100);
    now += std::chrono::milliseconds(pick(3));
    if (r < 45) {
      const RequestId id = next_id++;
      const std::string t = names[pick(op % 1000 < 500 ? 2 : names.size())];  // phases of a flood
      const auto wait = std::chrono::milliseconds(1 + pick(400));
      const auto weight = static_cast<std::uint32_t>(1 + pick(kMaxWeight));
      const std::size_t before = st.in_use();
      const Admission a = st.admit(id, now, now + wait, t, weight);
      if (a.kind == Kind::granted) {
        EXPECT_LT(before, s.max_concurrent) << "I1 at admission";
        holding[id] = t;
        ++grants;
        for (auto& [other, n] : others_since) {
          if (other != t) ++n;
        }
      } else {
        ASSERT_EQ(a.kind, Kind::queued);
        EXPECT_GE(a.position, 1u);
        EXPECT_LE(a.position, st.queued());
        if (!tenant_waits(t)) others_since[t] = 0;
        waiting[id] = W{t, seq++, now + wait};
      }
    } else if (r < 75) {
      if (holding.empty()) continue;
      auto it = holding.begin();
      std::advance(it, static_cast<long>(pick(holding.size())));
      const RequestId id = it->first;
      holding.erase(it);
      ASSERT_TRUE(st.release(id, now, sink));
    } else if (r < 83) {
      if (waiting.empty()) continue;
      auto it = waiting.begin();
      std::advance(it, static_cast<long>(pick(waiting.size())));
      ASSERT_TRUE(st.withdraw(it->first));
      ASSERT_TRUE(ended.insert(it->first).second);
      waiting.erase(it);
    } else if (r < 95) {
      st.expire(now, sink);
    } else if (with_caps) {
      Settings next = s;
      next.max_concurrent = static_cast<std::uint32_t>(1 + pick(4));
      next.max_per_tenant = pick(3) == 0 ? std::nullopt : std::optional<std::uint32_t>(1 + pick(2));
      next.tenant_fairness = pick(2) == 0;
      s = next;
      st.configure(s, now, sink);
    } else {
      continue;
    }
    // Apply what the state decided to the model.
    for (RequestId id : sink.granted) {
      const W w = waiting.at(id);
      EXPECT_GT(w.deadline, now) << "I4: granted past its deadline";
      waiting.erase(id);
      ASSERT_TRUE(ended.insert(id).second) << "one exit";
      holding[id] = w.tenant;
      ++grants;
      for (auto& [other, n] : others_since) {
        if (other != w.tenant) ++n;
      }
      others_since[w.tenant] = 0;
    }
    for (const auto& d : sink.dropped) {
      ASSERT_EQ(d.reason, RejectReason::timeout);
      ASSERT_TRUE(waiting.contains(d.id));
      EXPECT_LE(waiting.at(d.id).deadline, now);
      waiting.erase(d.id);
      ASSERT_TRUE(ended.insert(d.id).second) << "one exit";
      ++drops;
    }
    for (auto it = others_since.begin(); it != others_since.end();) {
      it = tenant_waits(it->first) ? std::next(it) : others_since.erase(it);
    }
    // The state agrees with the model.
    ASSERT_EQ(st.queued(), waiting.size());
    ASSERT_EQ(st.in_use(), holding.size());
    for (const auto& [id, w] : waiting) ASSERT_TRUE(st.waiting(id));
    // I3': room is left only when every waiter's tenant is at its cap.
    const Settings& cur = st.settings();
    if (cur.enabled && st.in_use() < cur.max_concurrent) {
      for (const auto& [id, w] : waiting) {
        ASSERT_TRUE(cur.max_per_tenant && st.tenant_holders(w.tenant) >= *cur.max_per_tenant)
            << "I3': waiter " << id << " of '" << w.tenant << "' could be served";
        ASSERT_TRUE(st.tenant_parked(w.tenant));
        ++parked_seen;
      }
    }
    // No starvation: while a tenant waits, the others get at most one turn
    // each (<= kMaxWeight grants) before it is served.
    if (!with_caps) {
      for (const auto& [t, n] : others_since) {
        ASSERT_LE(n, kMaxWeight * (names.size() - 1)) << "tenant '" << t << "' starved";
      }
    }
  }
  EXPECT_GT(grants, 5000u);
  EXPECT_GT(drops, 100u);
  if (with_caps) {
    EXPECT_GT(parked_seen, 100u);
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, TenantModelTest, ::testing::Values(1u, 2u, 77u, 1234567u));

}  // namespace
