// The memory backend through the public API: FIFO grants, deadlines,
// cancellation, queue limits, position updates, hot config, disabled modes,
// named limiters, shutdown, permits, snapshots, and the run helpers.
//
// Most tests run the backend's io_context on the test thread, so the order of
// events is deterministic; time-based tests assert a lower bound exactly and
// an upper bound generously (sanitizer builds are slow).
#include <fairgate/fairgate.hpp>

#include "support/gate_executor.hpp"
#include "support/wait.hpp"

#include <gtest/gtest.h>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using fairgate::AcquireOptions;
using fairgate::AcquireResult;
using fairgate::Limiter;
using fairgate::Outcome;
using fairgate::Permit;
using fairgate::QueueStatus;
using fairgate::RejectReason;
using fairgate::Settings;
using fairgate::SettingsUpdate;
using Clock = std::chrono::steady_clock;

// Where one request's single outcome lands.
struct Outcome1 {
  std::optional<AcquireResult> result;
  int calls = 0;
  Clock::time_point at{};
  bool done() const { return calls > 0; }
  bool granted() const { return result && result->granted(); }
  auto handler() {
    return [this](AcquireResult r) {
      ++calls;
      at = Clock::now();
      result = std::move(r);
    };
  }
};

std::uint64_t by_reason(const fairgate::Snapshot& s, RejectReason r) {
  return s.stats.by_reason[static_cast<std::size_t>(r)];
}

// Every request ended exactly one way.
void expect_balanced(const fairgate::LimiterStats& st) {
  EXPECT_EQ(st.grants + st.timeouts + st.cancels + st.rejections, st.acquires);
}

class MemoryBackendTest : public ::testing::Test {
 protected:
  Settings cap(std::uint32_t n) {
    Settings s;
    s.max_concurrent = n;
    return s;
  }
  Limiter open(const std::string& name, const Settings& s) { return backend->open(name, s).value(); }
  template <typename Pred>
  bool run_until(Pred pred, std::chrono::milliseconds timeout = 10s) {
    return fairgate::test::run_until(io, pred, timeout);
  }
  // Acquires and waits for the grant.
  Permit hold(Limiter& lim) {
    Outcome1 o;
    lim.async_acquire(AcquireOptions{}, o.handler());
    EXPECT_TRUE(run_until([&] { return o.done(); }));
    EXPECT_TRUE(o.granted());
    return o.result ? o.result->take_permit() : Permit{};
  }

  asio::io_context io;
  std::shared_ptr<fairgate::Backend> backend = fairgate::make_memory_backend(io.get_executor());
};

// --- FIFO (F2) --------------------------------------------------------------------

TEST_F(MemoryBackendTest, WaitersAreGrantedInArrivalOrder) {
  auto lim = open("fifo", cap(1));
  Permit first = hold(lim);
  constexpr int kWaiters = 8;
  std::vector<int> order;
  std::vector<std::string> ids;
  std::deque<Outcome1> outs(kWaiters);
  for (int i = 0; i < kWaiters; ++i) {
    AcquireOptions o;
    o.max_wait = 10s;
    lim.async_acquire(o, [&, i](AcquireResult r) {
      ++outs[i].calls;
      order.push_back(i);
      if (r.granted()) ids.push_back(r.permit().id());
      r.permit().release();  // the next waiter's turn
    });
  }
  run_until([&] { return lim.snapshot().queued == kWaiters; }, 1s);
  EXPECT_TRUE(order.empty()) << "nobody may be granted while the permit is held";
  first.release();
  ASSERT_TRUE(run_until([&] { return order.size() == kWaiters; }));
  for (int i = 0; i < kWaiters; ++i) EXPECT_EQ(order[i], i);
  ASSERT_EQ(ids.size(), static_cast<std::size_t>(kWaiters));
  for (std::size_t i = 1; i < ids.size(); ++i) EXPECT_LT(std::stoull(ids[i - 1]), std::stoull(ids[i]));
  for (const auto& o : outs) EXPECT_EQ(o.calls, 1);
  const auto s = lim.snapshot();
  EXPECT_EQ(s.in_use, 0u);
  EXPECT_EQ(s.stats.grants, kWaiters + 1u);
  EXPECT_EQ(s.stats.releases, kWaiters + 1u);
}

TEST_F(MemoryBackendTest, NewArrivalDoesNotTakeAFreedPermitFromAWaiter) {
  auto lim = open("fair", cap(1));
  Permit first = hold(lim);
  Outcome1 waiter, late;
  lim.async_acquire(AcquireOptions{}, waiter.handler());
  first.release();  // decided now, under the limiter's lock: the waiter gets it
  lim.async_acquire(AcquireOptions{}, late.handler());
  ASSERT_TRUE(run_until([&] { return waiter.done(); }));
  EXPECT_TRUE(waiter.granted());
  run_until([&] { return late.done(); }, 50ms);
  EXPECT_FALSE(late.done()) << "the late arrival must queue";
  EXPECT_EQ(lim.snapshot().queued, 1u);
}

// --- max wait (F3) ------------------------------------------------------------------

TEST_F(MemoryBackendTest, MaxWaitEndsAsTimedOutAtTheDeadline) {
  auto lim = open("slow", cap(1));
  Permit first = hold(lim);
  Outcome1 w;
  AcquireOptions o;
  o.max_wait = 150ms;
  const auto start = Clock::now();
  lim.async_acquire(o, w.handler());
  ASSERT_TRUE(run_until([&] { return w.done(); }));
  const auto elapsed = w.at - start;
  EXPECT_GE(elapsed, 150ms) << "timed out before the deadline";
  EXPECT_LT(elapsed, 150ms + 2s) << "timed out far too late";
  ASSERT_TRUE(w.result);
  EXPECT_EQ(w.result->outcome(), Outcome::timed_out);
  EXPECT_EQ(w.result->reason(), RejectReason::timeout);
  EXPECT_EQ(w.result->error(), RejectReason::timeout);
  EXPECT_GE(w.result->waited(), 150ms);
  EXPECT_FALSE(w.result->permit().held());
  // The max wait asked, not the time measured (150 ms waits a little longer).
  EXPECT_EQ(w.result->message(), "no permit became free within 150 ms");
  auto s = lim.snapshot();
  EXPECT_EQ(s.queued, 0u);
  EXPECT_EQ(s.stats.timeouts, 1u);
  EXPECT_EQ(by_reason(s, RejectReason::timeout), 1u);
  // The timed-out request never gets the permit later.
  first.release();
  fairgate::test::run_for(io, 30ms);
  EXPECT_EQ(lim.snapshot().in_use, 0u);
  EXPECT_EQ(w.calls, 1);
  expect_balanced(lim.snapshot().stats);
}

TEST_F(MemoryBackendTest, DefaultMaxWaitComesFromTheSettings) {
  Settings s = cap(1);
  s.max_wait = 100ms;
  auto lim = open("dflt", s);
  Permit first = hold(lim);
  Outcome1 w;
  const auto start = Clock::now();
  lim.async_acquire(AcquireOptions{}, w.handler());
  ASSERT_TRUE(run_until([&] { return w.done(); }));
  EXPECT_GE(w.at - start, 100ms);
  EXPECT_LT(w.at - start, 100ms + 2s);
  EXPECT_EQ(w.result->outcome(), Outcome::timed_out);
}

TEST_F(MemoryBackendTest, DeadlinesExpireInDeadlineOrderEvenWhenAnEarlierOneArrivesLater) {
  auto lim = open("order", cap(1));
  Permit first = hold(lim);
  std::vector<int> ended;
  const std::array<std::chrono::milliseconds, 3> waits = {900ms, 100ms, 300ms};
  const auto start = Clock::now();
  std::array<Clock::time_point, 3> at{};
  for (int i = 0; i < 3; ++i) {
    AcquireOptions o;
    o.max_wait = waits[i];
    lim.async_acquire(o, [&, i](AcquireResult r) {
      EXPECT_EQ(r.outcome(), Outcome::timed_out);
      at[i] = Clock::now();
      ended.push_back(i);
    });
  }
  ASSERT_TRUE(run_until([&] { return ended.size() == 3; }));
  EXPECT_EQ(ended, (std::vector<int>{1, 2, 0}));
  for (int i = 0; i < 3; ++i) EXPECT_GE(at[i] - start, waits[i]) << i;
  // The 100 ms waiter arrived after the timer was armed for 900 ms: it must
  // not have waited for that timer.
  EXPECT_LT(at[1] - start, 800ms);
}

TEST_F(MemoryBackendTest, ZeroMaxWaitNeverWaits) {
  auto lim = open("zero", cap(1));
  Outcome1 a, b;
  AcquireOptions o;
  o.max_wait = 0ms;
  lim.async_acquire(o, a.handler());
  lim.async_acquire(o, b.handler());
  ASSERT_TRUE(run_until([&] { return a.done() && b.done(); }));
  EXPECT_TRUE(a.granted()) << "with room, max_wait 0 is granted";
  EXPECT_EQ(b.result->outcome(), Outcome::timed_out);
  EXPECT_EQ(lim.snapshot().queued, 0u);
}

// The one tenant rule (fairgate::valid_tenant): the same in the library, the
// HTTP API (serve_params_test) and the gateway's header (gateway_client.mjs).
TEST(TenantRule, PrintableAsciiWithoutSpacesUpTo128) {
  EXPECT_TRUE(fairgate::valid_tenant("user-42"));
  EXPECT_TRUE(fairgate::valid_tenant("org/acme+team@example.com|\"quoted\""));
  EXPECT_TRUE(fairgate::valid_tenant("!~"));
  EXPECT_TRUE(fairgate::valid_tenant(std::string(fairgate::kMaxTenantLength, 't')));
  EXPECT_FALSE(fairgate::valid_tenant(""));
  EXPECT_FALSE(fairgate::valid_tenant(std::string(fairgate::kMaxTenantLength + 1, 't')));
  EXPECT_FALSE(fairgate::valid_tenant("a b"));
  EXPECT_FALSE(fairgate::valid_tenant("tab\there"));
  EXPECT_FALSE(fairgate::valid_tenant(std::string("nul\0", 4)));
  EXPECT_FALSE(fairgate::valid_tenant("\x7f"));
  EXPECT_FALSE(fairgate::valid_tenant("caf\xc3\xa9"));  // UTF-8: not ASCII
}

TEST_F(MemoryBackendTest, TenantsOutsideTheRuleAreInvalidArguments) {
  auto lim = open("tenants", cap(5));
  std::vector<std::unique_ptr<Outcome1>> outcomes;
  const std::vector<std::string> tenants = {"a b", std::string(129, 't'), "caf\xc3\xa9",
                                            "",    "org/acme+1",          std::string(128, 't')};
  for (const auto& t : tenants) {
    AcquireOptions o;
    o.tenant = t;
    outcomes.push_back(std::make_unique<Outcome1>());
    lim.async_acquire(o, outcomes.back()->handler());
  }
  ASSERT_TRUE(run_until([&] {
    for (const auto& o : outcomes)
      if (!o->done()) return false;
    return true;
  }));
  for (std::size_t i = 0; i < tenants.size(); ++i) {
    const bool valid = i >= 3;  // "" is no tenant; the last two follow the rule
    EXPECT_EQ(outcomes[i]->result->outcome(), valid ? Outcome::granted : Outcome::rejected) << i;
    if (!valid) {
      EXPECT_EQ(outcomes[i]->result->reason(), RejectReason::invalid_argument) << i;
    }
  }
}

TEST_F(MemoryBackendTest, InvalidAcquireOptionsAreRejected) {
  auto lim = open("opts", cap(1));
  Outcome1 neg, huge, tenant;
  AcquireOptions o1;
  o1.max_wait = -1ms;
  lim.async_acquire(o1, neg.handler());
  AcquireOptions o2;
  o2.max_wait = fairgate::kMaxWaitLimit + 1ms;
  lim.async_acquire(o2, huge.handler());
  AcquireOptions o3;
  o3.tenant = std::string(10'000, 't');
  lim.async_acquire(o3, tenant.handler());
  Outcome1 weight;
  AcquireOptions o4;
  o4.weight = 0;
  lim.async_acquire(o4, weight.handler());
  ASSERT_TRUE(run_until([&] { return neg.done() && huge.done() && tenant.done() && weight.done(); }));
  for (auto* o : {&neg, &huge, &tenant, &weight}) {
    EXPECT_EQ(o->result->outcome(), Outcome::rejected);
    EXPECT_EQ(o->result->reason(), RejectReason::invalid_argument);
  }
  // Each message names the option that is wrong.
  EXPECT_EQ(neg.result->message(), "max_wait: -1 ms is not in 0..86400000 ms");
  EXPECT_EQ(huge.result->message(), "max_wait: 86400001 ms is not in 0..86400000 ms");
  EXPECT_EQ(tenant.result->message().rfind("tenant: must be ", 0), 0u) << tenant.result->message();
  EXPECT_EQ(weight.result->message(), "weight: 0 is not in 1..1000");
  const auto s = lim.snapshot();
  EXPECT_EQ(s.in_use, 0u) << "an invalid request takes no permit";
  EXPECT_EQ(by_reason(s, RejectReason::invalid_argument), 4u);
  expect_balanced(s.stats);
}

// --- cancellation (F4) ---------------------------------------------------------------

// io_context::run() returns once nobody waits: no timer stays armed for the deadline of a waiter
// already granted or cancelled (it kept run() busy until then: 20 s by default, here 1 h).
TEST_F(MemoryBackendTest, RunReturnsOnceNobodyWaitsNotAtTheLastDeadline) {
  auto lim = open("run-ends", cap(1));
  AcquireOptions o;
  o.max_wait = 1h;
  const auto runs_out = [&] {
    io.restart();
    io.run_for(10s);  // returns at once when there is no work left; 10 s only if there is
    return io.stopped();
  };
  // A waiter granted on a release (each result drops its permit at once).
  int granted = 0;
  for (int i = 0; i < 2; ++i) lim.async_acquire(o, [&](AcquireResult r) { granted += r.granted(); });
  EXPECT_TRUE(runs_out()) << "after a grant";
  EXPECT_EQ(granted, 2);
  // A waiter cancelled.
  Permit held = hold(lim);
  asio::cancellation_signal sig;
  Outcome1 cancelled;
  lim.async_acquire(o, asio::bind_cancellation_slot(sig.slot(), cancelled.handler()));
  ASSERT_EQ(lim.snapshot().queued, 1u);
  sig.emit(asio::cancellation_type::terminal);
  held.release();
  EXPECT_TRUE(runs_out()) << "after a cancel";
  EXPECT_TRUE(cancelled.done());
  // A waiter admitted by a raised cap.
  held = hold(lim);
  Outcome1 admitted;
  lim.async_acquire(o, admitted.handler());
  ASSERT_EQ(lim.snapshot().queued, 1u);
  SettingsUpdate u;
  u.max_concurrent = 2;
  ASSERT_TRUE(lim.configure(u).has_value());
  EXPECT_TRUE(runs_out()) << "after a raised cap";
  EXPECT_TRUE(admitted.granted());
  held.release();
}

TEST_F(MemoryBackendTest, CancelWhileQueuedRemovesTheWaiter) {
  for (auto type : {asio::cancellation_type::terminal, asio::cancellation_type::partial,
                    asio::cancellation_type::total}) {
    SCOPED_TRACE(static_cast<int>(type));
    auto lim = open("cancel" + std::to_string(static_cast<int>(type)), cap(1));
    Permit first = hold(lim);
    asio::cancellation_signal sig;
    Outcome1 b, c;
    lim.async_acquire(AcquireOptions{}, asio::bind_cancellation_slot(sig.slot(), b.handler()));
    lim.async_acquire(AcquireOptions{}, c.handler());
    ASSERT_EQ(lim.snapshot().queued, 2u);
    sig.emit(type);
    ASSERT_TRUE(run_until([&] { return b.done(); }));
    EXPECT_EQ(b.result->outcome(), Outcome::cancelled);
    EXPECT_EQ(b.result->reason(), RejectReason::cancelled);
    auto s = lim.snapshot();
    EXPECT_EQ(s.queued, 1u);
    ASSERT_EQ(s.waiters.size(), 1u);
    EXPECT_EQ(s.waiters[0].position, 1u) << "the next waiter moves up";
    EXPECT_EQ(s.stats.cancels, 1u);
    first.release();
    ASSERT_TRUE(run_until([&] { return c.done(); }));
    EXPECT_TRUE(c.granted());
    EXPECT_EQ(b.calls, 1);
    sig.emit(type);  // again, after the end: nothing
    fairgate::test::run_for(io, 5ms);
    EXPECT_EQ(b.calls, 1);
    EXPECT_EQ(lim.snapshot().stats.cancels, 1u);
    EXPECT_EQ(lim.snapshot().in_use, 1u);
  }
}

TEST_F(MemoryBackendTest, CancelAfterGrantDoesNothing) {
  auto lim = open("late-cancel", cap(1));
  asio::cancellation_signal sig;
  Outcome1 a;
  lim.async_acquire(AcquireOptions{}, asio::bind_cancellation_slot(sig.slot(), a.handler()));
  ASSERT_TRUE(run_until([&] { return a.done(); }));
  ASSERT_TRUE(a.granted());
  sig.emit(asio::cancellation_type::terminal);
  fairgate::test::run_for(io, 5ms);
  EXPECT_TRUE(a.result->permit().held());
  EXPECT_EQ(lim.snapshot().in_use, 1u);
  EXPECT_EQ(lim.snapshot().stats.cancels, 0u);
}

TEST_F(MemoryBackendTest, CancelAfterTheGrantWasDecidedButBeforeDeliveryDoesNothing) {
  auto lim = open("race-cancel", cap(1));
  Permit first = hold(lim);
  asio::cancellation_signal sig;
  Outcome1 b;
  lim.async_acquire(AcquireOptions{}, asio::bind_cancellation_slot(sig.slot(), b.handler()));
  first.release();  // b is granted now; its handler is posted but has not run
  EXPECT_FALSE(b.done());
  sig.emit(asio::cancellation_type::terminal);
  ASSERT_TRUE(run_until([&] { return b.done(); }));
  EXPECT_TRUE(b.granted()) << "the grant won; the cancel must not take the permit away";
  EXPECT_EQ(b.calls, 1);
  fairgate::test::run_for(io, 5ms);
  const auto s = lim.snapshot();
  EXPECT_EQ(s.in_use, 1u);
  EXPECT_EQ(s.stats.cancels, 0u);
  EXPECT_EQ(s.stats.grants, 2u);
  expect_balanced(s.stats);
}

TEST_F(MemoryBackendTest, CancelAfterTimeoutDoesNothing) {
  auto lim = open("to-cancel", cap(1));
  Permit first = hold(lim);
  asio::cancellation_signal sig;
  Outcome1 b;
  AcquireOptions o;
  o.max_wait = 20ms;
  lim.async_acquire(o, asio::bind_cancellation_slot(sig.slot(), b.handler()));
  ASSERT_TRUE(run_until([&] { return b.done(); }));
  sig.emit(asio::cancellation_type::terminal);
  fairgate::test::run_for(io, 5ms);
  EXPECT_EQ(b.calls, 1);
  EXPECT_EQ(b.result->outcome(), Outcome::timed_out);
  EXPECT_EQ(lim.snapshot().stats.cancels, 0u);
  EXPECT_EQ(lim.snapshot().stats.timeouts, 1u);
}

// The cancel-in-flight race of core/ticket.hpp, made deterministic: waiter b
// is cancelled (its ticket ends at once, outside the limiter's lock) while
// another thread is in the middle of a dispatch that reaches b next. The
// dispatch must skip b without making a permit, serve the waiter behind it,
// and b must end exactly once, as cancelled.
TEST_F(MemoryBackendTest, CancelInFlightDuringADispatchSkipsTheWaiterAndServesTheNext) {
  int raced = 0;
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE(round);
    auto lim = open("inflight-" + std::to_string(round), cap(1));
    Permit holder = hold(lim);
    fairgate::test::Gate gate;
    Outcome1 w0, b, x;
    asio::cancellation_signal sig;
    lim.async_acquire(
        AcquireOptions{},
        asio::bind_executor(fairgate::test::GateExecutor{io.get_executor(), &gate}, w0.handler()));
    lim.async_acquire(AcquireOptions{}, asio::bind_cancellation_slot(sig.slot(), b.handler()));
    lim.async_acquire(AcquireOptions{}, x.handler());
    ASSERT_EQ(lim.snapshot().queued, 3u);
    gate.arm();
    // Raising the cap to 3 dispatches w0, then b, then (b being cancelled) x.
    std::thread configurer([&] {
      SettingsUpdate u;
      u.max_concurrent = 3;
      EXPECT_TRUE(lim.configure(u).has_value());
    });
    // The configurer now holds the limiter's lock, posting w0's grant.
    ASSERT_TRUE(gate.wait_entered(10s));
    std::thread canceller([&] { sig.emit(asio::cancellation_type::terminal); });
    std::this_thread::sleep_for(100ms);  // the cancel ends b's ticket, then waits for the lock
    gate.open();
    configurer.join();
    canceller.join();
    ASSERT_TRUE(run_until([&] { return w0.done() && b.done(); }));
    EXPECT_TRUE(w0.granted());
    if (b.result->outcome() == Outcome::cancelled) {
      ++raced;
      ASSERT_TRUE(run_until([&] { return x.done(); })) << "the waiter behind a skipped one must be served";
      EXPECT_TRUE(x.granted());
      const auto s = lim.snapshot();
      EXPECT_EQ(s.in_use, 3u);
      EXPECT_EQ(s.queued, 0u);
      EXPECT_EQ(s.stats.cancels, 1u);
      EXPECT_EQ(s.stats.grants, 3u) << "no permit may be made for the cancelled waiter";
    } else {
      // The canceller was too slow: b was granted first, and a cancel after
      // the grant does nothing.
      EXPECT_TRUE(b.granted());
      EXPECT_EQ(lim.snapshot().in_use, 3u);
      EXPECT_EQ(lim.snapshot().stats.cancels, 0u);
    }
    fairgate::test::run_for(io, 5ms);
    EXPECT_EQ(w0.calls, 1);
    EXPECT_EQ(b.calls, 1) << "exactly one outcome";
    EXPECT_LE(x.calls, 1);
    expect_balanced(lim.snapshot().stats);
  }
  EXPECT_GT(raced, 0) << "the cancel never got in between: the race was not exercised";
}

// --- bounded queue (F8) ----------------------------------------------------------------

TEST_F(MemoryBackendTest, QueueFullRejectsAtOnce) {
  Settings s = cap(1);
  s.max_queue = 2;
  auto lim = open("bounded", s);
  Permit first = hold(lim);
  Outcome1 w1, w2, w3;
  lim.async_acquire(AcquireOptions{}, w1.handler());
  lim.async_acquire(AcquireOptions{}, w2.handler());
  lim.async_acquire(AcquireOptions{}, w3.handler());
  ASSERT_TRUE(run_until([&] { return w3.done(); }));
  EXPECT_EQ(w3.result->outcome(), Outcome::rejected);
  EXPECT_EQ(w3.result->reason(), RejectReason::queue_full);
  EXPECT_EQ(w3.result->error(), RejectReason::queue_full);
  EXPECT_EQ(w3.result->error().category(), fairgate::reject_category());
  EXPECT_FALSE(w1.done() || w2.done());
  const auto snap = lim.snapshot();
  EXPECT_EQ(snap.queued, 2u);
  EXPECT_EQ(snap.stats.rejections, 1u);
  EXPECT_EQ(by_reason(snap, RejectReason::queue_full), 1u);
}

TEST_F(MemoryBackendTest, MaxQueueZeroNeverQueues) {
  Settings s = cap(1);
  s.max_queue = 0;
  auto lim = open("noqueue", s);
  Permit first = hold(lim);
  Outcome1 w;
  lim.async_acquire(AcquireOptions{}, w.handler());
  ASSERT_TRUE(run_until([&] { return w.done(); }));
  EXPECT_EQ(w.result->reason(), RejectReason::queue_full);
  EXPECT_EQ(lim.snapshot().queued, 0u);
}

// --- positions (F7) ------------------------------------------------------------------------

TEST_F(MemoryBackendTest, OnQueuedReportsPositionsThatOnlyMoveForward) {
  auto lim = open("positions", cap(1));
  Permit holder = hold(lim);
  constexpr std::size_t kWaiters = 4;
  std::array<std::vector<QueueStatus>, kWaiters> seen;
  std::array<std::size_t, kWaiters> seen_at_grant{};
  std::deque<Outcome1> outs(kWaiters);
  for (std::size_t i = 0; i < kWaiters; ++i) {
    AcquireOptions o;
    o.on_queued = [&seen, i](const QueueStatus& st) { seen[i].push_back(st); };
    lim.async_acquire(o, [&, i](AcquireResult r) {
      seen_at_grant[i] = seen[i].size();
      outs[i].handler()(std::move(r));
    });
  }
  ASSERT_TRUE(run_until(
      [&] { return std::all_of(seen.begin(), seen.end(), [](const auto& v) { return !v.empty(); }); }));
  for (std::size_t i = 0; i < kWaiters; ++i) {
    EXPECT_EQ(seen[i].front().position, i + 1) << "first update of waiter " << i;
    EXPECT_EQ(seen[i].front().queued, kWaiters);
  }
  // Serve them one by one; after each grant every remaining waiter is told
  // its new position before the next release.
  for (std::size_t k = 0; k < kWaiters; ++k) {
    holder.release();
    ASSERT_TRUE(run_until([&] { return outs[k].done(); }));
    ASSERT_TRUE(outs[k].granted());
    holder = outs[k].result->take_permit();
    ASSERT_TRUE(run_until([&] {
      for (std::size_t j = k + 1; j < kWaiters; ++j) {
        if (seen[j].back().position != j - k) return false;
      }
      return true;
    })) << "positions not updated after grant "
        << k;
  }
  fairgate::test::run_for(io, 50ms);
  for (std::size_t i = 0; i < kWaiters; ++i) {
    std::vector<std::size_t> positions;
    for (const auto& st : seen[i]) positions.push_back(st.position);
    std::vector<std::size_t> want;
    for (std::size_t p = i + 1; p >= 1; --p) want.push_back(p);
    EXPECT_EQ(positions, want) << "waiter " << i;
    for (std::size_t n = 1; n < seen[i].size(); ++n) {
      EXPECT_LT(seen[i][n].position, seen[i][n - 1].position) << "a position went up or repeated";
      EXPECT_LE(seen[i][n].queued, seen[i][n - 1].queued);
    }
    EXPECT_EQ(seen[i].size(), seen_at_grant[i]) << "on_queued called after the request was granted";
  }
}

TEST_F(MemoryBackendTest, OnQueuedIsNotCalledForAnImmediateGrant) {
  auto lim = open("immediate", cap(1));
  int calls = 0;
  Outcome1 a;
  AcquireOptions o;
  o.on_queued = [&](const QueueStatus&) { ++calls; };
  lim.async_acquire(o, a.handler());
  ASSERT_TRUE(run_until([&] { return a.done(); }));
  fairgate::test::run_for(io, 40ms);
  EXPECT_TRUE(a.granted());
  EXPECT_EQ(calls, 0);
}

// --- wait estimates (F7), early rejection, ids ------------------------------------

// The estimate is absent without history, then comes from the pace of a full
// limiter; every queued event names the request as snapshots do, and the
// permit it gets carries the same id. Time only gives lower bounds here: each
// gap is at least 60 ms because the test waits that long between releases.
TEST_F(MemoryBackendTest, EstimateIsAbsentWithoutHistoryThenFollowsThePaceAndIdsMatchSnapshots) {
  Settings s = cap(1);
  auto lim = open("eta", s);
  Permit holder = hold(lim);
  constexpr std::size_t kWaiters = 6;
  std::array<std::vector<QueueStatus>, kWaiters> seen;
  std::deque<Outcome1> outs(kWaiters);
  for (std::size_t i = 0; i < kWaiters; ++i) {
    AcquireOptions o;
    o.max_wait = 60s;
    o.on_queued = [&seen, i](const QueueStatus& st) { seen[i].push_back(st); };
    lim.async_acquire(o, outs[i].handler());
  }
  ASSERT_TRUE(run_until(
      [&] { return std::all_of(seen.begin(), seen.end(), [](const auto& v) { return !v.empty(); }); }));
  const auto snap = lim.snapshot();
  ASSERT_EQ(snap.waiters.size(), kWaiters);
  for (std::size_t i = 0; i < kWaiters; ++i) {
    EXPECT_EQ(seen[i].front().estimated_wait, std::nullopt) << "no history: no estimate, not a guess";
    EXPECT_EQ(seen[i].front().ticket, snap.waiters[i].ticket) << "waiter " << i;
  }
  EXPECT_EQ(snap.estimated_wait, std::nullopt);
  // Four releases 60+ ms apart, each handing the seat on: three gaps.
  for (std::size_t k = 0; k < 4; ++k) {
    fairgate::test::run_for(io, 60ms);
    holder.release();
    ASSERT_TRUE(run_until([&] { return outs[k].done(); }));
    ASSERT_TRUE(outs[k].granted());
    holder = outs[k].result->take_permit();
    EXPECT_EQ(holder.id(), seen[k].back().ticket) << "the permit id is the ticket the waiter was given";
  }
  ASSERT_TRUE(run_until([&] { return seen[4].back().position == 1 && seen[5].back().position == 2; }));
  const auto& head = seen[4].back();
  const auto& second = seen[5].back();
  ASSERT_TRUE(head.estimated_wait.has_value());
  ASSERT_TRUE(second.estimated_wait.has_value());
  EXPECT_GE(*head.estimated_wait, 30ms) << "at least half a gap";
  EXPECT_GE(*second.estimated_wait, 90ms) << "one gap more than the head's next one";
  EXPECT_GT(*second.estimated_wait, *head.estimated_wait);
  ASSERT_TRUE(lim.snapshot().estimated_wait.has_value());
  EXPECT_GE(*lim.snapshot().estimated_wait, 150ms) << "a newcomer at position 3";

  // reject_early: a newcomer (position 3, >= 150 ms) with 1 ms to wait is
  // turned away at once; within the margin it queues.
  Outcome1 plain;
  AcquireOptions quick;
  quick.max_wait = 1ms;
  lim.async_acquire(quick, plain.handler());
  ASSERT_TRUE(run_until([&] { return plain.done(); }));
  EXPECT_EQ(plain.result->reason(), RejectReason::timeout) << "off: it waits its 1 ms";
  SettingsUpdate on;
  on.reject_early = true;
  ASSERT_TRUE(lim.configure(on).has_value());
  Outcome1 early;
  lim.async_acquire(quick, early.handler());
  ASSERT_TRUE(run_until([&] { return early.done(); }));
  ASSERT_FALSE(early.granted());
  EXPECT_EQ(early.result->reason(), RejectReason::would_time_out);
  EXPECT_EQ(early.result->waited(), 0ms);
  EXPECT_EQ(by_reason(lim.snapshot(), RejectReason::would_time_out), 1u);
  Outcome1 patient;
  AcquireOptions slow;
  slow.max_wait = 60s;
  lim.async_acquire(slow, patient.handler());
  fairgate::test::run_for(io, 20ms);
  EXPECT_FALSE(patient.done()) << "an estimate within its max wait queues";
  for (std::size_t k = 4; k < kWaiters; ++k) {
    holder.release();
    ASSERT_TRUE(run_until([&] { return outs[k].done(); }));
    ASSERT_TRUE(outs[k].granted());
    holder = outs[k].result->take_permit();
  }
  holder.release();
  ASSERT_TRUE(run_until([&] { return patient.done(); }));
  EXPECT_TRUE(patient.granted());
  expect_balanced(lim.snapshot().stats);
}

// --- hot config (F9) ---------------------------------------------------------------------------

TEST_F(MemoryBackendTest, RaisingTheCapAdmitsWaitersImmediately) {
  auto lim = open("raise", cap(1));
  Permit first = hold(lim);
  std::deque<Outcome1> outs(3);
  for (auto& o : outs) lim.async_acquire(AcquireOptions{}, o.handler());
  ASSERT_EQ(lim.snapshot().queued, 3u);
  SettingsUpdate u;
  u.max_concurrent = 4;
  auto r = lim.configure(u);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->max_concurrent, 4u);
  // Decided inside configure(), before any handler ran.
  auto s = lim.snapshot();
  EXPECT_EQ(s.in_use, 4u);
  EXPECT_EQ(s.queued, 0u);
  EXPECT_EQ(s.settings.max_concurrent, 4u);
  ASSERT_TRUE(
      run_until([&] { return std::all_of(outs.begin(), outs.end(), [](auto& o) { return o.done(); }); }));
  for (auto& o : outs) EXPECT_TRUE(o.granted());
}

TEST_F(MemoryBackendTest, LoweringTheCapNeverRevokes) {
  auto lim = open("lower", cap(3));
  Permit p1 = hold(lim), p2 = hold(lim), p3 = hold(lim);
  Outcome1 w;
  lim.async_acquire(AcquireOptions{}, w.handler());
  SettingsUpdate u;
  u.max_concurrent = 1;
  ASSERT_TRUE(lim.configure(u).has_value());
  EXPECT_TRUE(p1.held() && p2.held() && p3.held());
  EXPECT_EQ(lim.snapshot().in_use, 3u);
  p1.release();
  fairgate::test::run_for(io, 20ms);
  EXPECT_FALSE(w.done()) << "in_use 2 >= cap 1";
  p2.release();
  fairgate::test::run_for(io, 20ms);
  EXPECT_FALSE(w.done()) << "in_use 1 >= cap 1";
  EXPECT_EQ(lim.snapshot().in_use, 1u);
  p3.release();
  ASSERT_TRUE(run_until([&] { return w.done(); }));
  EXPECT_TRUE(w.granted());
  EXPECT_EQ(lim.snapshot().in_use, 1u);
}

TEST_F(MemoryBackendTest, InvalidUpdateReturnsTheErrorAndChangesNothing) {
  auto lim = open("invalid", cap(1));
  Permit first = hold(lim);
  Outcome1 w;
  lim.async_acquire(AcquireOptions{}, w.handler());
  const Settings before = lim.settings();

  SettingsUpdate bad_wait;
  bad_wait.max_concurrent = 5;  // valid on its own, but the update is applied whole or not at all
  bad_wait.max_wait = -1ms;
  auto r = lim.configure(bad_wait);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().field, "max_wait");
  EXPECT_EQ(lim.settings(), before);
  EXPECT_EQ(lim.snapshot().queued, 1u) << "a rejected raise must not admit anyone";

  SettingsUpdate bad_cap;
  bad_cap.max_concurrent = 0;
  r = lim.configure(bad_cap);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().field, "max_concurrent");
  EXPECT_EQ(lim.settings(), before);

  SettingsUpdate bad_queue;
  bad_queue.max_queue = std::optional<std::uint32_t>(fairgate::kMaxQueueLimit + 1);
  r = lim.configure(bad_queue);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().field, "max_queue");
  EXPECT_EQ(lim.settings(), before);
  fairgate::test::run_for(io, 10ms);
  EXPECT_FALSE(w.done());
}

TEST_F(MemoryBackendTest, ConfigureAppliesOnlyTheGivenFields) {
  Settings s = cap(2);
  s.max_wait = 5s;
  s.max_queue = 7;
  auto lim = open("partial", s);
  SettingsUpdate u;
  u.max_wait = 9s;
  auto r = lim.configure(u);
  ASSERT_TRUE(r.has_value());
  Settings want = s;
  want.max_wait = 9s;
  EXPECT_EQ(*r, want);
  EXPECT_EQ(lim.settings(), want);
  EXPECT_EQ(lim.snapshot().settings, want);
}

// --- disabled mode (F11) ----------------------------------------------------------------------------

TEST_F(MemoryBackendTest, DisabledPassThroughLetsEveryoneIn) {
  auto lim = open("pass", cap(1));
  Permit first = hold(lim);
  std::deque<Outcome1> waiting(2);
  for (auto& o : waiting) lim.async_acquire(AcquireOptions{}, o.handler());
  SettingsUpdate off;
  off.enabled = false;
  off.when_disabled = fairgate::DisabledMode::pass_through;
  ASSERT_TRUE(lim.configure(off).has_value());
  Outcome1 later;
  lim.async_acquire(AcquireOptions{}, later.handler());
  ASSERT_TRUE(run_until([&] { return waiting[0].done() && waiting[1].done() && later.done(); }));
  EXPECT_TRUE(waiting[0].granted() && waiting[1].granted()) << "queued waiters pass when disabled";
  EXPECT_TRUE(later.granted());
  EXPECT_EQ(lim.snapshot().in_use, 4u) << "pass-through permits are counted";

  // Enabled again: the cap applies to new arrivals.
  SettingsUpdate on;
  on.enabled = true;
  ASSERT_TRUE(lim.configure(on).has_value());
  Outcome1 queued;
  lim.async_acquire(AcquireOptions{}, queued.handler());
  fairgate::test::run_for(io, 10ms);
  EXPECT_FALSE(queued.done());
  EXPECT_EQ(lim.snapshot().queued, 1u);
}

TEST_F(MemoryBackendTest, DisabledRejectEndsWaitersAndRejectsArrivals) {
  auto lim = open("rej", cap(1));
  Permit first = hold(lim);
  std::deque<Outcome1> waiting(2);
  for (auto& o : waiting) lim.async_acquire(AcquireOptions{}, o.handler());
  SettingsUpdate off;
  off.enabled = false;
  off.when_disabled = fairgate::DisabledMode::reject;
  ASSERT_TRUE(lim.configure(off).has_value());
  Outcome1 later;
  lim.async_acquire(AcquireOptions{}, later.handler());
  ASSERT_TRUE(run_until([&] { return waiting[0].done() && waiting[1].done() && later.done(); }));
  for (auto* o : {&waiting[0], &waiting[1], &later}) {
    EXPECT_EQ(o->result->outcome(), Outcome::rejected);
    EXPECT_EQ(o->result->reason(), RejectReason::disabled);
  }
  EXPECT_TRUE(first.held());
  const auto s = lim.snapshot();
  EXPECT_EQ(s.in_use, 1u);
  EXPECT_EQ(s.queued, 0u);
  EXPECT_EQ(by_reason(s, RejectReason::disabled), 3u);
  expect_balanced(s.stats);
}

// --- named limiters (F10) -------------------------------------------------------------------------

TEST_F(MemoryBackendTest, NamedLimitersAreIndependent) {
  EXPECT_EQ(backend->kind(), "memory");
  constexpr int kLimiters = 40;
  std::vector<Limiter> lims;
  std::vector<Permit> held;
  for (int i = 0; i < kLimiters; ++i) {
    lims.push_back(open("lim-" + std::to_string(100 + i), cap(1)));
    held.push_back(hold(lims.back()));  // each has its own single permit
  }
  for (int i = 0; i < kLimiters; ++i) {
    EXPECT_TRUE(held[i].held()) << i;
    EXPECT_EQ(lims[i].snapshot().in_use, 1u);
  }
  // Queue in one does not affect another.
  Outcome1 w;
  lims[0].async_acquire(AcquireOptions{}, w.handler());
  EXPECT_EQ(lims[0].snapshot().queued, 1u);
  EXPECT_EQ(lims[1].snapshot().queued, 0u);
  held[1].release();
  fairgate::test::run_for(io, 10ms);
  EXPECT_FALSE(w.done());

  auto all = backend->limiters();
  ASSERT_EQ(all.size(), static_cast<std::size_t>(kLimiters));
  EXPECT_TRUE(std::is_sorted(all.begin(), all.end(),
                             [](const Limiter& a, const Limiter& b) { return a.name() < b.name(); }));
}

TEST_F(MemoryBackendTest, OpeningTheSameNameTwiceGivesTheSameLimiter) {
  auto a = open("chat", cap(3));
  Settings other = cap(10);
  other.max_wait = 1s;
  auto b = open("chat", other);
  EXPECT_EQ(b.settings().max_concurrent, 3u) << "an existing limiter keeps its settings";
  Permit p = hold(a);
  EXPECT_EQ(b.snapshot().in_use, 1u) << "same limiter, same permits";
  SettingsUpdate u;
  u.max_concurrent = 5;
  ASSERT_TRUE(b.configure(u).has_value());
  EXPECT_EQ(a.settings().max_concurrent, 5u);
  auto found = backend->find("chat");
  ASSERT_TRUE(found);
  EXPECT_EQ(found->snapshot().in_use, 1u);
  EXPECT_FALSE(backend->find("nope"));
  EXPECT_EQ(backend->limiters().size(), 1u);
}

TEST_F(MemoryBackendTest, InvalidNamesAndSettingsAreRejected) {
  for (const char* name : {"", ".x", "-x", "a b", "a/b", "\xff"}) {
    auto r = backend->open(name, cap(1));
    ASSERT_FALSE(r.has_value()) << name;
    EXPECT_EQ(r.error().field, "name");
  }
  auto too_long = backend->open(std::string(fairgate::kMaxNameLength + 1, 'x'), cap(1));
  ASSERT_FALSE(too_long.has_value());
  EXPECT_EQ(too_long.error().field, "name");
  auto bad = backend->open("ok", cap(0));
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().field, "max_concurrent");
  EXPECT_THROW((void)backend->open("", cap(1)).value(), std::invalid_argument);
  EXPECT_TRUE(backend->limiters().empty()) << "nothing may be created by a failed open";
}

TEST_F(MemoryBackendTest, EmptyLimiterHandleThrows) {
  Limiter empty;
  EXPECT_FALSE(empty.valid());
  EXPECT_THROW((void)empty.name(), std::logic_error);
  EXPECT_THROW((void)empty.snapshot(), std::logic_error);
}

// --- shutdown -------------------------------------------------------------------------------------------

TEST_F(MemoryBackendTest, ShutdownEndsWaitersAndRejectsLaterAcquires) {
  auto a = open("a", cap(1));
  auto b = open("b", cap(1));
  Permit pa = hold(a);
  Permit pb = hold(b);
  std::deque<Outcome1> waiting(3);
  a.async_acquire(AcquireOptions{}, waiting[0].handler());
  a.async_acquire(AcquireOptions{}, waiting[1].handler());
  b.async_acquire(AcquireOptions{}, waiting[2].handler());
  backend->shutdown();
  ASSERT_TRUE(run_until(
      [&] { return std::all_of(waiting.begin(), waiting.end(), [](auto& o) { return o.done(); }); }));
  for (auto& o : waiting) {
    EXPECT_EQ(o.result->outcome(), Outcome::rejected);
    EXPECT_EQ(o.result->reason(), RejectReason::shutdown);
    EXPECT_EQ(o.calls, 1);
  }
  Outcome1 later;
  a.async_acquire(AcquireOptions{}, later.handler());
  ASSERT_TRUE(run_until([&] { return later.done(); }));
  EXPECT_EQ(later.result->reason(), RejectReason::shutdown);

  // Held permits stay valid and can still be returned.
  EXPECT_TRUE(pa.held());
  EXPECT_EQ(a.snapshot().in_use, 1u);
  pa.release();
  EXPECT_EQ(a.snapshot().in_use, 0u);
  EXPECT_EQ(a.snapshot().stats.releases, 1u);
  backend->shutdown();  // idempotent
  EXPECT_FALSE(backend->open("c", cap(1)).has_value());
  const auto s = a.snapshot();
  EXPECT_EQ(by_reason(s, RejectReason::shutdown), 3u);
  expect_balanced(s.stats);
}

// --- permits (F4) ----------------------------------------------------------------------------------------

TEST_F(MemoryBackendTest, PermitIsReleasedExactlyOnceWhateverIsDoneWithIt) {
  auto lim = open("permits", cap(3));
  Permit p1 = hold(lim);
  Permit p2 = hold(lim);
  ASSERT_TRUE(p1.held() && p2.held());
  EXPECT_NE(p1.id(), p2.id());
  const std::string id1 = p1.id();

  Permit moved(std::move(p1));
  EXPECT_FALSE(p1.held());  // NOLINT(bugprone-use-after-move): a moved-from permit holds nothing
  EXPECT_TRUE(p1.id().empty());
  EXPECT_TRUE(moved.held());
  EXPECT_EQ(moved.id(), id1);
  EXPECT_EQ(lim.snapshot().in_use, 2u) << "a move is not a release";
  EXPECT_EQ(lim.snapshot().stats.releases, 0u);

  // Move-assigning over a held permit returns the old one.
  moved = std::move(p2);
  EXPECT_EQ(lim.snapshot().in_use, 1u);
  EXPECT_EQ(lim.snapshot().stats.releases, 1u);
  EXPECT_FALSE(p2.held());  // NOLINT(bugprone-use-after-move)

  moved.release();
  moved.release();
  p1.release();
  p2.release();
  EXPECT_EQ(lim.snapshot().in_use, 0u);
  EXPECT_EQ(lim.snapshot().stats.releases, 2u);

  {
    Permit scoped = hold(lim);
    EXPECT_EQ(lim.snapshot().in_use, 1u);
  }
  EXPECT_EQ(lim.snapshot().in_use, 0u) << "destruction releases";
  EXPECT_EQ(lim.snapshot().stats.releases, 3u);

  Permit none;
  EXPECT_FALSE(none.held());
  none.release();
  EXPECT_EQ(lim.snapshot().stats.releases, 3u);

  // Self move-assignment keeps the permit.
  Permit self = hold(lim);
  Permit& alias = self;
  self = std::move(alias);
  EXPECT_TRUE(self.held());
  EXPECT_EQ(lim.snapshot().in_use, 1u);
  self.release();
  const auto s = lim.snapshot();
  EXPECT_EQ(s.stats.grants, s.stats.releases);
}

TEST_F(MemoryBackendTest, PermitOutlivingTheBackendCanStillBeReleased) {
  auto lim = open("outlive", cap(1));
  Permit p = hold(lim);
  backend.reset();  // destroys (and shuts down) the backend
  EXPECT_TRUE(p.held());
  p.release();
  EXPECT_EQ(lim.snapshot().in_use, 0u);
}

// --- snapshot
// -------------------------------------------------------------------------------------------------

TEST_F(MemoryBackendTest, SnapshotShowsHoldersAndWaitersInOrder) {
  Settings s = cap(2);
  s.max_queue = 9;
  auto lim = open("snap", s);
  std::deque<Outcome1> outs(4);
  for (int i = 0; i < 4; ++i) {
    AcquireOptions o;
    o.tenant = "tenant-" + std::to_string(i);
    lim.async_acquire(o, outs[i].handler());
  }
  ASSERT_TRUE(run_until([&] { return outs[0].done() && outs[1].done(); }));
  auto snap = lim.snapshot();
  EXPECT_EQ(snap.name, "snap");
  EXPECT_EQ(snap.settings, s);
  EXPECT_EQ(snap.in_use, 2u);
  EXPECT_EQ(snap.queued, 2u);
  ASSERT_EQ(snap.holders.size(), 2u);
  EXPECT_EQ(snap.holders[0].tenant, "tenant-0");
  EXPECT_EQ(snap.holders[1].tenant, "tenant-1");
  EXPECT_EQ(snap.holders[0].permit, outs[0].result->permit().id());
  EXPECT_EQ(snap.holders[1].permit, outs[1].result->permit().id());
  ASSERT_EQ(snap.waiters.size(), 2u);
  EXPECT_EQ(snap.waiters[0].tenant, "tenant-2");
  EXPECT_EQ(snap.waiters[0].position, 1u);
  EXPECT_EQ(snap.waiters[1].tenant, "tenant-3");
  EXPECT_EQ(snap.waiters[1].position, 2u);
  EXPECT_NE(snap.waiters[0].ticket, snap.waiters[1].ticket);
  EXPECT_EQ(snap.stats.acquires, 4u);
  EXPECT_EQ(snap.stats.grants, 2u);

  // The first holder leaves: the first waiter becomes the youngest holder.
  outs[0].result->permit().release();
  ASSERT_TRUE(run_until([&] { return outs[2].done(); }));
  snap = lim.snapshot();
  ASSERT_EQ(snap.holders.size(), 2u);
  EXPECT_EQ(snap.holders[0].tenant, "tenant-1");
  EXPECT_EQ(snap.holders[1].tenant, "tenant-2");
  EXPECT_EQ(snap.holders[1].permit, outs[2].result->permit().id());
  ASSERT_EQ(snap.waiters.size(), 1u);
  EXPECT_EQ(snap.waiters[0].tenant, "tenant-3");
  EXPECT_EQ(snap.waiters[0].position, 1u);
  EXPECT_EQ(snap.stats.releases, 1u);
}

// --- run helpers
// ----------------------------------------------------------------------------------------------

TEST(MemoryRunHelper, RunReturnsTheRejectErrorWhenItTimesOut) {
  asio::thread_pool pool(1);
  auto backend = fairgate::make_memory_backend(pool.get_executor());
  auto lim = backend->open("run", Settings{}).value();
  auto held = lim.async_acquire(AcquireOptions{}, asio::use_future).get();
  ASSERT_TRUE(held.granted());
  bool called = false;
  AcquireOptions o;
  o.max_wait = 50ms;
  const auto start = Clock::now();
  auto r = fairgate::run(
      lim,
      [&] {
        called = true;
        return 7;
      },
      o);
  EXPECT_GE(Clock::now() - start, 50ms);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), RejectReason::timeout);
  EXPECT_EQ(r.error().category(), fairgate::reject_category());
  EXPECT_FALSE(called) << "the work must not run without a permit";
  held.permit().release();

  auto ok = fairgate::run(lim, [&] { return lim.snapshot().in_use; });
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(*ok, 1u) << "the work runs while the permit is held";
  EXPECT_EQ(lim.snapshot().in_use, 0u) << "and it is returned afterwards";

  EXPECT_THROW((void)fairgate::run(lim, []() -> int { throw std::runtime_error("boom"); }),
               std::runtime_error);
  EXPECT_EQ(lim.snapshot().in_use, 0u) << "released when the work throws";
  auto s = lim.snapshot();
  EXPECT_EQ(s.stats.grants, s.stats.releases);
  backend->shutdown();
  pool.join();
}

TEST(MemoryRunHelper, CoRunWithUseAwaitable) {
  asio::io_context io;
  auto backend = fairgate::make_memory_backend(io.get_executor());
  auto lim = backend->open("co", Settings{}).value();
  std::optional<boost::system::result<int>> awaited, plain, timed_out;
  std::optional<AcquireResult> direct;
  std::size_t in_use_inside = 0;
  bool late_work_ran = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        // A long tenant (heap-allocated string) exercises the g++ 12 copy bug
        // the options must survive: name the options, never brace them inline.
        AcquireOptions opts;
        opts.tenant = std::string(100, 'q');
        opts.max_wait = 5s;
        awaited = co_await fairgate::co_run(
            lim,
            [&]() -> asio::awaitable<int> {
              in_use_inside = lim.snapshot().in_use;
              co_return 42;
            },
            opts);
        plain = co_await fairgate::co_run(
            lim, [&] { return static_cast<int>(lim.snapshot().in_use) + 100; }, opts);

        // Now hold the permit and see co_run time out with the reject error.
        direct = co_await lim.async_acquire(opts, asio::use_awaitable);
        AcquireOptions short_wait;
        short_wait.max_wait = 30ms;
        timed_out = co_await fairgate::co_run(
            lim,
            [&]() -> asio::awaitable<int> {
              late_work_ran = true;
              co_return 0;
            },
            short_wait);
      },
      asio::detached);
  ASSERT_TRUE(fairgate::test::run_until(io, [&] { return timed_out.has_value(); }));
  ASSERT_TRUE(awaited && awaited->has_value());
  EXPECT_EQ(**awaited, 42);
  EXPECT_EQ(in_use_inside, 1u);
  ASSERT_TRUE(plain && plain->has_value());
  EXPECT_EQ(**plain, 101);
  ASSERT_TRUE(direct && direct->granted());
  ASSERT_FALSE(timed_out->has_value());
  EXPECT_EQ(timed_out->error(), RejectReason::timeout);
  EXPECT_FALSE(late_work_ran);
  EXPECT_EQ(lim.snapshot().in_use, 1u);
  direct->permit().release();
  const auto s = lim.snapshot();
  EXPECT_EQ(s.in_use, 0u);
  EXPECT_EQ(s.stats.grants, 3u);
  EXPECT_EQ(s.stats.releases, 3u);
  EXPECT_EQ(s.stats.timeouts, 1u);
}

// async_status on the memory backend (GET /v1/limiters/{name}): everything it
// has, paged like the Redis backend — the totals always, one page of holders
// (oldest grant first) and of waiters (queue order) with tenant and age; the
// ids are those the waiters are told; instance "" and no instance list.
TEST_F(MemoryBackendTest, AsyncStatusPagesHoldersAndWaitersWithTotals) {
  auto lim = open("status", cap(2));
  AcquireOptions first;
  first.tenant = "h1";
  Outcome1 h1;
  lim.async_acquire(first, h1.handler());
  ASSERT_TRUE(run_until([&] { return h1.done(); }));
  fairgate::test::run_for(io, 30ms);
  Permit p2 = hold(lim);
  constexpr std::size_t kWaiters = 5;
  std::array<std::vector<QueueStatus>, kWaiters> seen;
  std::deque<Outcome1> outs(kWaiters);
  for (std::size_t i = 0; i < kWaiters; ++i) {
    AcquireOptions o;
    o.max_wait = 60s;
    o.tenant = "w" + std::to_string(i);
    o.on_queued = [&seen, i](const QueueStatus& st) { seen[i].push_back(st); };
    lim.async_acquire(o, outs[i].handler());
  }
  ASSERT_TRUE(run_until(
      [&] { return std::all_of(seen.begin(), seen.end(), [](const auto& v) { return !v.empty(); }); }));
  fairgate::test::run_for(io, 20ms);
  const auto status = [&](std::size_t offset, std::size_t limit) {
    std::optional<fairgate::StatusResult> r;
    lim.async_status(fairgate::StatusQuery{offset, limit},
                     [&](fairgate::StatusResult s) { r = std::move(s); });
    EXPECT_TRUE(run_until([&] { return r.has_value(); }));
    return std::move(*r);
  };
  auto all = status(0, 100);
  ASSERT_FALSE(all.error) << all.message;
  EXPECT_EQ(all.snapshot.in_use, 2u);
  EXPECT_EQ(all.snapshot.queued, kWaiters);
  EXPECT_TRUE(all.instances.empty());
  ASSERT_EQ(all.snapshot.holders.size(), 2u);
  EXPECT_EQ(all.snapshot.holders[0].tenant, "h1") << "oldest grant first";
  EXPECT_EQ(all.snapshot.holders[0].permit, h1.result->permit().id());
  EXPECT_GE(all.snapshot.holders[0].held, 50ms);
  EXPECT_EQ(all.snapshot.holders[0].instance, "");
  ASSERT_EQ(all.snapshot.waiters.size(), kWaiters);
  for (std::size_t i = 0; i < kWaiters; ++i) {
    EXPECT_EQ(all.snapshot.waiters[i].ticket, seen[i].front().ticket) << i;
    EXPECT_EQ(all.snapshot.waiters[i].tenant, "w" + std::to_string(i));
    EXPECT_EQ(all.snapshot.waiters[i].position, i + 1);
    EXPECT_GE(all.snapshot.waiters[i].waited, 20ms);
  }
  auto page = status(1, 2);
  EXPECT_EQ(page.offset, 1u);
  EXPECT_EQ(page.limit, 2u);
  EXPECT_EQ(page.snapshot.in_use, 2u) << "totals whatever the page";
  EXPECT_EQ(page.snapshot.queued, kWaiters);
  ASSERT_EQ(page.snapshot.holders.size(), 1u);
  EXPECT_EQ(page.snapshot.holders[0].permit, p2.id());
  ASSERT_EQ(page.snapshot.waiters.size(), 2u);
  EXPECT_EQ(page.snapshot.waiters[0].position, 2u);
  EXPECT_EQ(page.snapshot.waiters[1].ticket, seen[2].front().ticket);
  auto past = status(10, 5);
  EXPECT_TRUE(past.snapshot.holders.empty());
  EXPECT_TRUE(past.snapshot.waiters.empty());
  EXPECT_EQ(past.snapshot.queued, kWaiters);
  EXPECT_EQ(status(0, 5000).limit, fairgate::kMaxStatusLimit) << "the limit is capped";
  backend->shutdown();
  run_until([&] { return std::all_of(outs.begin(), outs.end(), [](const auto& o) { return o.done(); }); });
}

}  // namespace
