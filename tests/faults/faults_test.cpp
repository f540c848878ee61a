// The engine-faults suite (label "faults"): real `fairgate bench-worker`
// processes on a real redis-server, each fault injected for real while the
// clients loop (acquire, hold 20-80 ms, release; more clients than permits, so
// there is always a queue). Every run is judged from the clients' own
// timestamps by Cluster::finish (harness.hpp): overshoot 0, every request ends
// exactly once, no timeout and no "unavailable" (the max wait is 30 s, far
// longer than any fault), Redis empty once everybody left. Some tests check
// more (the fence, the gap rule, the degraded policies, the state after Redis
// returns).
#include "faults/harness.hpp"

#include <gtest/gtest.h>
#include <boost/json.hpp>

#include <signal.h>

#include <cstdio>
#include <limits>
#include <thread>

namespace {

using namespace std::chrono_literals;
using fairgate::faults::Cluster;
using fairgate::faults::Refusal;
using fairgate::faults::Refusing;
using fairgate::faults::Report;
using fairgate::faults::Route;
using fairgate::faults::RunOptions;
using fairgate::faults::Worker;
using fairgate::test::Mangling;
using fairgate::test::RedisServer;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

#ifdef FAIRGATE_FAULTS_SANITIZED
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

std::string test_name() { return ::testing::UnitTest::GetInstance()->current_test_info()->name(); }

RunOptions run(std::size_t clients = 3) {
  RunOptions o;
  o.limiter = test_name();
  o.clients = clients;
  o.duration = kSanitized ? 8s : 5s;
  // Sanitized processes are several times slower: no spurious timeouts.
  o.command_timeout = kSanitized ? 400ms : 300ms;
  return o;
}

milliseconds finish_within(const RunOptions& o) { return o.duration + 30s; }

/// Some holders still run when a long fault ends: reaping them (instead of
/// waiting for their instance) would show as an overshoot.
RunOptions long_holds(RunOptions o) {
  o.hold_min = 300ms;
  o.hold_max = 3000ms;
  o.duration += 2s;
  return o;
}

void sleep(milliseconds d) { std::this_thread::sleep_for(d); }

std::int64_t sum(Cluster& c, const char* field) {
  std::int64_t total = 0;
  for (auto* w : c.live()) {
    if (auto st = w->status()) {
      const auto& v = st->at(field);
      total += v.is_bool() ? (v.get_bool() ? 1 : 0) : v.to_number<std::int64_t>();
    }
  }
  return total;
}

/// Calls `read()` every 50 ms (it asks the workers for their status) until it
/// returns true or `timeout` passes. For counts the instances keep when a
/// reply comes (a restore's, a spoiled one): they can lag what Redis or the
/// proxy already shows, since the reply is read a moment after it was sent.
template <typename Read>
void poll_counts(Read read, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto until = Clock::now() + timeout;
  while (!read() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

/// sum(c, field) once it is at least `n`, or after poll_counts' timeout.
std::int64_t sum_reaching(Cluster& c, const char* field, std::int64_t n) {
  std::int64_t total = 0;
  poll_counts([&] { return (total = sum(c, field)) >= n; });
  return total;
}

/// Grants made (client time) inside [from, to).
std::size_t grants_between(Cluster& c, std::int64_t from, std::int64_t to) {
  std::size_t n = 0;
  for (auto* w : c.all()) {
    w->drain();
    for (const auto& [i, t] : w->grants()) n += (t >= from && t < to) ? 1 : 0;
  }
  return n;
}

#define EXPECT_RUN_OK(report) EXPECT_TRUE((report).ok()) << (report).summary()

// --- state loss ----------------------------------------------------------------

TEST(Faults, FlushallMidRun) {
  Cluster c(run());
  c.start();
  c.start();
  c.go();
  sleep(1500ms);
  const auto created_before = sum(c, "recreations");  // 1: the first start created it
  ASSERT_EQ(c.redis().command({"FLUSHALL"}), "OK");
  sleep(300ms);
  EXPECT_EQ(c.redis().command({"HEXISTS", c.key("cfg"), "epoch"}), "1") << "the state was created again";
  const auto whole = c.wait_whole(10s);
  EXPECT_TRUE(whole) << "Redis had every permit and waiter of the instances again";
  EXPECT_GE(sum_reaching(c, "restores", 1), 1) << "the instances restored what they held";
  EXPECT_EQ(sum(c, "recreations"), created_before + 1) << "exactly one instance created the state again";
  EXPECT_EQ(sum(c, "overshoot_restored"), 0);
  const Report r = c.finish(finish_within(c.options()));
  EXPECT_RUN_OK(r);
  EXPECT_GT(r.grants, 20u) << "and the limiter kept working";
}

TEST(Faults, FlushallTwiceInARowAndDuringTheFence) {
  Cluster c(run());
  c.start();
  c.start();
  c.go();
  sleep(1200ms);
  ASSERT_EQ(c.redis().command({"FLUSHALL"}), "OK");
  sleep(150ms);  // inside the fence (ttl + heartbeat = 1.25 s), restores under way
  ASSERT_EQ(c.redis().command({"FLUSHALL"}), "OK");
  EXPECT_TRUE(c.wait_whole(10s));
  const Report r = c.finish(finish_within(c.options()));
  EXPECT_RUN_OK(r);
}

TEST(Faults, ScriptFlushMidRun) {
  Cluster c(run());
  c.start();
  c.start();
  c.go();
  for (int i = 0; i < 3; ++i) {
    sleep(700ms);
    ASSERT_EQ(c.redis().command({"SCRIPT", "FLUSH"}), "OK");
  }
  const Report r = c.finish(finish_within(c.options()));
  EXPECT_RUN_OK(r);
  EXPECT_GT(r.grants, 20u);
}

// Each key of the state deleted on its own while permits run and requests
// wait, as an evicting maxmemory-policy or a DEL does (docs/faults.md,
// "Eviction"): no grant on top of permits whose key went (holders), no waiter
// stranded in the index when the queue went, Redis whole again after each.
TEST(Faults, EachKeyDeletedOnItsOwnMidRun) {
  Cluster c(long_holds(run()));
  c.start();
  c.start();
  c.go();
  for (const char* what : {"holders", "queue", "seq", "byinst", "instances", "cfg"}) {
    // Delete it while it has something (permits run, requests wait).
    poll_counts([&] { return c.zcard("holders") > 0 && c.zcard("queue") > 0; }, 5s);
    ASSERT_EQ(c.redis().command({"DEL", c.key(what)}), "1") << what;
    EXPECT_TRUE(c.wait_whole(10s)) << "Redis had every permit and waiter again after " << what << " went";
  }
  EXPECT_GE(sum(c, "restores"), 1);
  const Report r = c.finish(finish_within(c.options()));
  EXPECT_RUN_OK(r);
  EXPECT_GT(r.grants, 10u) << "and the limiter kept working";
}

// The tenant keys (tenant fairness with max_per_tenant), each deleted on its
// own mid-run (docs/faults.md, "Eviction"): three instances, each its own
// tenant, at most 2 permits per tenant with a cap of 3, so tenants wait, take
// turns and park. After each deletion every waiting tenant is soon ready or
// parked again (nobody stranded); no timeout, overshoot 0. With the scripts of
// before: tenants stranded, their waiters timed out.
TEST(Faults, EachTenantKeyDeletedOnItsOwnMidRun) {
  RunOptions o = long_holds(run());
  o.tenant_per_instance = true;
  o.tenant_fairness = true;
  o.max_per_tenant = 2;
  Cluster c(o);
  c.start();
  c.start();
  c.start();
  c.go();
  // tcredit is left out: written only for weights above 1, which this workload never has
  // (TenantKeysTest.ADeletedTurnCreditStartsTheTurnAgain covers it).
  for (const char* what : {"tholders", "tready", "tparked", "tq:t1", "trot"}) {
    // Deleted while it exists and requests wait (tried until both hold at once).
    bool deleted = false;
    poll_counts(
        [&] {
          return deleted = c.zcard("queue") > 0 && c.redis().command({"DEL", c.key(what)}) == "1";
        },
        5s);
    EXPECT_TRUE(deleted) << what << " never existed while requests waited: the fault was not injected";
    EXPECT_TRUE(c.wait_whole(10s)) << "after " << what << " went: " << c.unplaced_tenant()
                                   << " waits, neither ready nor parked";
  }
  const Report r = c.finish(finish_within(c.options()));
  EXPECT_RUN_OK(r);
  EXPECT_GT(r.grants, 10u) << "and the limiter kept working";
}

TEST(Faults, RestartWithoutPersistence) {
  Cluster c(run());
  c.start();
  c.start();
  c.go();
  sleep(1500ms);
  const auto created_before = sum(c, "recreations");
  c.redis().restart();  // kill -9, then up again on the same port: everything is gone
  EXPECT_TRUE(c.wait_whole(15s));
  EXPECT_EQ(sum(c, "recreations"), created_before + 1);
  const Report r = c.finish(finish_within(c.options()));
  EXPECT_RUN_OK(r);
}

// Redis away for longer than the TTL, its data kept (AOF): on its return
// nobody is reaped (the gap rule) and everybody goes on.
TEST(Faults, RestartWithAofAfterAnOutageLongerThanTheTtl) {
  RedisServer::Options aof;
  aof.appendonly = true;
  Cluster c(long_holds(run()), aof);
  c.start();
  c.start();
  c.go();
  sleep(1500ms);
  const auto created_before = sum(c, "recreations");
  c.redis().kill_hard();
  sleep(c.options().ttl + 1000ms);
  c.redis().start_again();
  EXPECT_TRUE(c.wait_whole(15s));
  EXPECT_EQ(sum(c, "recreations"), created_before) << "the data survived: no state was created again";
  EXPECT_EQ(sum(c, "overshoot_restored"), 0) << "nobody was reaped, so nothing came back above the cap";
  const Report r = c.finish(finish_within(c.options()));
  EXPECT_RUN_OK(r);
}

// Redis killed and started again from an RDB snapshot taken before the
// first instance's clients started (Redis' default persistence loses what
// came after the last snapshot): the state and both registrations are there,
// but the first instance's grants of the 400 ms since are not, while those
// holders (300 ms to 3 s) still run. The second instance's clients start
// right after the restart; it holds nothing, so nothing tells it to restore
// first. Rule 14 (docs/design.md): the first script about to grant on the
// restarted Redis sees its new replication id and fences the state until
// every instance restored what it runs. Overshoot 0 (without the rule: 6
// holders with cap 3 in three runs of three — the 3 lost ones and 3 new).
TEST(Faults, RestartFromASnapshotThatMissesTheRunningGrants) {
  Cluster c(long_holds(run()));
  Worker& holding = c.start();
  Worker& arriving = c.start();
  sleep(c.options().ttl + c.options().heartbeat + 250ms);  // past the new state's fence
  const auto created_before = sum(c, "recreations");
  ASSERT_EQ(c.redis().command({"SAVE"}), "OK");  // both registered, nothing held yet
  holding.send("go");
  sleep(400ms);
  const auto lost = grants_between(c, 0, std::numeric_limits<std::int64_t>::max());
  c.redis().restart();  // kill -9, then up from the snapshot: those grants are gone
  arriving.send("go");
  EXPECT_TRUE(c.wait_whole(15s));
  EXPECT_EQ(sum(c, "recreations"), created_before) << "the state itself survived";
  EXPECT_GE(sum_reaching(c, "redis_switches", 1), 1) << "the first grant after the restart saw the new Redis";
  const Report r = c.finish(finish_within(c.options()));
  std::printf("restart from a snapshot without the %zu running grants: %s\n", lost, r.summary().c_str());
  EXPECT_GE(lost, 3u) << "every seat was taken when Redis went";
  EXPECT_RUN_OK(r);
}

// --- stalls ----------------------------------------------------------------------

TEST(Faults, SigstopOfRedisLongerThanTheTtl) {
  Cluster c(long_holds(run()));
  c.start();
  c.start();
  c.go();
  sleep(1500ms);
  c.redis().stop_process();
  sleep(c.options().ttl + 1000ms);
  c.redis().continue_process();
  EXPECT_TRUE(c.wait_whole(15s));
  EXPECT_EQ(sum(c, "overshoot_restored"), 0) << "an outage is not a crash: nobody was reaped";
  const Report r = c.finish(finish_within(c.options()));
  EXPECT_RUN_OK(r);
}

// The same stop, but the instances do not come back together: one reaches
// Redis a moment (less than a TTL) after the other. When Redis runs again
// every liveness has run out; the first script to see that must extend them
// all ("Redis was away", docs/design.md) rather than reap the instance that is
// not back yet, whose holders still run (here they hold for 8 s, through the
// whole fault): reaped, their seats would go to the other instance's waiters
// and come back above the cap when it restores them. In the test above both
// instances reconnect within milliseconds, so it passes without the extension.
TEST(Faults, SigstopOfRedisThenOneInstanceBackLater) {
  Cluster c(long_holds(run()));
  RunOptions late_options = c.options();
  late_options.hold_min = late_options.hold_max = 8000ms;
  late_options.clients = 2;
  Worker& late = c.start(Route::proxy, late_options);
  c.start();
  c.go();
  // The late instance holds its seats before the fault (its holds outlast it).
  std::int64_t held_before = 0;
  poll_counts([&] {
    const auto st = late.status();
    if (st) held_before = st->at("holders").to_number<std::int64_t>();
    return held_before >= 1;
  });
  ASSERT_GE(held_before, 1);
  c.proxy().stall();
  c.redis().stop_process();
  sleep(c.options().ttl + 1000ms);
  c.redis().continue_process();  // the direct instance's calls run at once
  sleep(250ms);
  c.proxy().resume();
  EXPECT_TRUE(c.wait_whole(15s));
  EXPECT_EQ(sum(c, "overshoot_restored"), 0) << "the late instance was reaped and restored above the cap";
  const Report r = c.finish(finish_within(c.options()));
  EXPECT_RUN_OK(r);
}

// Replies time out (DEBUG SLEEP > command timeout) but Redis is back before
// degrade_after: a hiccup, never a rejection (the clients have 30 s).
TEST(Faults, DebugSleepLongerThanTheCommandTimeoutIsNotARejection) {
  Cluster c(run());
  c.start();
  c.start();
  c.go();
  for (int i = 0; i < 3; ++i) {
    sleep(800ms);
    c.redis().command({"DEBUG", "SLEEP", kSanitized ? "0.8" : "0.6"}, 10s);
  }
  EXPECT_EQ(sum(c, "degraded_entries"), 0) << "shorter than degrade_after: not degraded";
  const Report r = c.finish(finish_within(c.options()));
  EXPECT_RUN_OK(r);
  EXPECT_EQ(r.unavailable, 0u);
}

TEST(Faults, ClientKillOfEveryConnection) {
  Cluster c(run());
  c.start();
  c.start();
  c.go();
  for (int i = 0; i < 4; ++i) {
    sleep(600ms);
    c.redis().command({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"});
    c.redis().command({"CLIENT", "KILL", "TYPE", "pubsub"});
  }
  const Report r = c.finish(finish_within(c.options()));
  EXPECT_RUN_OK(r);
  EXPECT_GT(r.grants, 20u);
}

// Redis refusing calls for a while (docs/faults.md, "Redis refuses writes"):
// each refusal in turn for longer than the TTL, in the middle of a run. The
// same as a stall: the arrivals wait and are sent again, never rejected
// "unavailable", overshoot 0, and once Redis takes calls again the state is
// whole. The Refusing helper (harness.hpp) checks that a write is refused
// with the expected answer before the wait, and works again after it.
void refused_mid_run(std::initializer_list<Refusal> kinds) {
  Cluster c(long_holds(run()), fairgate::faults::refusal_redis_options());
  c.start();
  c.start();
  c.go();
  sleep(1500ms);
  for (const Refusal kind : kinds) {
    Refusing refusing(c, kind);
    sleep(c.options().ttl + 1000ms);
    refusing.end();
  }
  EXPECT_TRUE(c.wait_whole(15s));
  const Report r = c.finish(finish_within(c.options()));
  EXPECT_RUN_OK(r);
  EXPECT_EQ(r.unavailable, 0u);
}

// Out of memory (maxmemory reached, policy noeviction): every command that
// would add data is refused with -OOM (an arrival cannot queue, a heartbeat
// cannot extend its liveness), while a release, which only removes, still
// runs. Before: 91 of 108 requests rejected "unavailable", each at once.
TEST(Faults, RedisOutOfMemoryMidRun) { refused_mid_run({Refusal::oom}); }

// Every write refused, releases included: MISCONF (a failed RDB snapshot,
// stop-writes-on-bgsave-error on by default), then NOREPLICAS
// (min-replicas-to-write 1 with no replica, the setting docs/faults.md
// suggests against two masters at once).
TEST(Faults, RedisRefusingWritesMidRun) { refused_mid_run({Refusal::misconf, Refusal::noreplicas}); }

// Another client's script runs away (a loop, past busy-reply-threshold):
// Redis answers BUSY to everything else until SCRIPT KILL ends it.
TEST(Faults, ARunawayScriptOnRedisMidRun) { refused_mid_run({Refusal::busy}); }

// --- the network -----------------------------------------------------------------

// One instance cut off from Redis (nftables drop inside its own network
// namespace) for longer than the TTL: the other goes on with the whole cap;
// the cut-off one reuses its seats only while Redis still counts them, then
// waits; back, it restores and its waiters are served.
TEST(Faults, PartitionOfOneInstanceLongerThanTheTtl) {
  REQUIRE_NETNS_OR_SKIP();
  Cluster c(run(), {}, /*with_netns=*/true);
  Worker& cut = c.start(Route::netns);
  c.start();
  c.go();
  sleep(1500ms);
  c.netns().partition();
  sleep(c.options().ttl * 2 + 500ms);
  c.netns().heal();
  EXPECT_TRUE(c.wait_whole(20s));
  const auto st = cut.status();
  ASSERT_TRUE(st);
  EXPECT_GE(st->at("degraded_entries").to_number<int>(), 1) << "the cut-off instance ran on its policy";
  const Report r = c.finish(finish_within(c.options()));
  EXPECT_RUN_OK(r);
}

TEST(Faults, ProxyStallsCutsAndDelays) {
  Cluster c(run());
  c.start(Route::proxy);
  c.start();
  c.go();
  sleep(800ms);
  c.proxy().stall();  // replies time out for a while, shorter than degrade_after
  sleep(600ms);
  c.proxy().resume();
  sleep(400ms);
  c.proxy().cut();  // every connection through it closed
  sleep(400ms);
  c.proxy().set_delay(40ms);
  sleep(800ms);
  c.proxy().set_delay(0ms);
  const Report r = c.finish(finish_within(c.options()));
  EXPECT_RUN_OK(r);
  EXPECT_GT(r.grants, 20u);
}

// --- bad replies ---------------------------------------------------------------------

// A Redis that now and then answers nonsense: the proxy replaces 30 % of the
// script replies (EVALSHA: acquire, release, cancel, heartbeat, restore) two
// instances get with ones of the wrong type or shape, or errors
// (an integer for an array, nil, -ERR, -MOVED to nowhere, -NOSCRIPT, an
// unknown verdict; no false "granted": a Redis that lies well-formed is not a
// fault anything can detect). No crash, no overshoot, every request ends
// exactly once, the instances and Redis agree again once the replies are
// sound, and nothing stays in Redis. An acquire answered with nonsense may be
// rejected "unavailable": a clear answer at once, not a hang.
//
// Mangling::inner replaces instead one element inside an array reply with
// one of another type (a word for a number, nil or [] for a string, 7 for
// an array): the verdict may be intact and the frame sound, so this tries the
// reading of every field — a field read leniently (a word read as 0, nil as
// an empty list) must not become a plausible value.
void bad_replies(Mangling how) {
  RunOptions o = run();
  Cluster c(o);
  c.start(Route::proxy);
  c.start(Route::proxy);
  c.start();
  c.go();
  sleep(800ms);
  const auto transport_before = sum(c, "command_timeouts") + sum(c, "disconnects");
  c.proxy().mangle_replies(0.3, 2026, "EVALSHA", how);
  sleep(2000ms);
  c.proxy().mangle_replies(0);
  const auto mangled = static_cast<std::int64_t>(c.proxy().replies_mangled());  // final: set on its thread
  EXPECT_GT(mangled, 10);
  // Each bad reply must be seen as one (counted in the backend's health), not
  // read as a plausible answer — unless its command had already ended: a
  // reply later than the command timeout is discarded unread (counted as a
  // timeout), and one cut off with its connection never arrives (a
  // disconnect). The proxy counts a reply when it spoils it; the instance
  // reads it a moment later, on a loaded machine after the test's next status
  // call (that race was CI's 60 spoiled, 59 seen, and the fresh clone's 62/61:
  // the late one was always counted just after the test looked). So the count
  // is awaited, bounded, before anything is compared. (A whole reply spoiled
  // into -NOSCRIPT is not an error but a script reload: not awaited there.)
  std::int64_t noticed = 0, unread = 0;
  poll_counts([&] {
    noticed = sum(c, "error_replies");
    unread = sum(c, "command_timeouts") + sum(c, "disconnects") - transport_before;
    return how == Mangling::whole || noticed + unread >= mangled;
  });
  EXPECT_TRUE(c.wait_whole(20s).has_value()) << "the instances and Redis agree again";
  const Report r = c.finish(finish_within(o), /*expect_unavailable=*/true);
  // The figures docs/faults.md ("Bad replies") quotes.
  std::printf("bad replies (%s): %lld mangled, %lld seen as bad, %lld commands ended unanswered; %s\n",
              how == Mangling::whole ? "whole" : "inner", static_cast<long long>(mangled),
              static_cast<long long>(noticed), static_cast<long long>(unread), r.summary().c_str());
  if (how == Mangling::inner) {
    // Only spoiled replies are bad, and every spoiled one was seen as bad or
    // never read. A field read leniently misses many (the heartbeat's old
    // check: 59 spoiled, 54 seen).
    EXPECT_LE(noticed, mangled);
    EXPECT_GE(noticed + unread, mangled);
  }
  EXPECT_RUN_OK(r);
  EXPECT_GT(r.grants, 20u);
}

TEST(Faults, BadRepliesNeverCrashStrandOrLeak) { bad_replies(Mangling::whole); }

TEST(Faults, BadFieldsInRepliesNeverCrashStrandOrLeak) { bad_replies(Mangling::inner); }

// --- crashes -----------------------------------------------------------------------

TEST(Faults, KillMinus9OfInstancesInALoop) {
  RunOptions o = run();
  o.duration = kSanitized ? 12s : 8s;
  Cluster c(o);
  c.start();
  c.start();
  c.start();
  c.go();
  for (int i = 0; i < 4; ++i) {
    sleep(1200ms);
    auto live = c.live();
    live.front()->kill9();
    Worker& fresh = c.start();
    fresh.send("go");
  }
  const Report r = c.finish(finish_within(o));
  EXPECT_RUN_OK(r);
  EXPECT_EQ(r.killed, 4u);
}

// --- the degraded policies, and the state after Redis returns -----------------------

// local: while Redis is away the instances serve their own waiters, in order,
// with the seats they held (permits Redis still counts for them: cap-safe),
// for as long as Redis would still count them; back, everything is handed to
// Redis. Long holds, so that seats are held when Redis goes away, and a TTL
// long enough for the seats to outlive degrade_after.
TEST(Faults, PolicyLocalServesFromItsSeatsWhileRedisIsAway) {
  RunOptions o = run();
  o.ttl = 4s;
  o.heartbeat = 500ms;
  o.fence = 0ms;  // not about the fence: grants from the start
  o.hold_min = 3000ms;
  o.hold_max = 4500ms;
  o.duration = kSanitized ? 10s : 7s;
  Cluster c(o);
  c.start();
  c.start();
  c.go();
  sleep(1000ms);  // the first 3 hold until 3-4.5 s: still held when the instances degrade (at 2 s)
  c.redis().stop_process();
  const auto stopped = fairgate::bench::now_ns();
  sleep(o.degrade_after + 2000ms);
  EXPECT_GE(sum(c, "degraded"), 1) << "degraded after degrade_after";
  const auto resumed = fairgate::bench::now_ns();
  c.redis().continue_process();
  const std::size_t served = grants_between(
      c, stopped + std::chrono::duration_cast<std::chrono::nanoseconds>(o.degrade_after + 100ms).count(),
      resumed);
  EXPECT_GT(served, 0u) << "requests were served locally, in seats released meanwhile, while Redis was away";
  EXPECT_TRUE(c.wait_whole(15s)) << "back: permits and waiters handed back to Redis";
  const Report r = c.finish(finish_within(o));
  EXPECT_RUN_OK(r);
}

// local_share: the operator's fixed share while Redis is away (here one
// instance, so nobody else uses the cap): at most that many at once, and
// served even with no seat held when Redis went away.
TEST(Faults, PolicyLocalShareServesThatManyAtOnce) {
  RunOptions o = run(4);
  o.local_share = 2;
  o.hold_min = o.hold_max = 50ms;
  Cluster c(o);
  c.start();
  c.go();
  sleep(1500ms);
  c.redis().stop_process();
  const auto stopped = fairgate::bench::now_ns();
  sleep(o.degrade_after + 1500ms);
  const auto resumed = fairgate::bench::now_ns();
  c.redis().continue_process();
  const auto from =
      stopped + std::chrono::duration_cast<std::chrono::nanoseconds>(o.degrade_after + 200ms).count();
  EXPECT_GT(grants_between(c, from, resumed), 5u) << "served locally while Redis was away";
  EXPECT_TRUE(c.wait_whole(15s));
  const Report r = c.finish(finish_within(o));
  EXPECT_RUN_OK(r);
  // While degraded at most local_share at once: measured from the records of that window.
  std::vector<std::pair<std::int64_t, std::int64_t>> during;
  for (auto* w : c.all()) {
    for (const auto& rec : w->records()) {
      if (rec.granted() && rec.grant_ns >= from && rec.grant_ns < resumed)
        during.emplace_back(rec.grant_ns, rec.release_ns);
    }
  }
  EXPECT_LE(fairgate::faults::max_concurrent(during), 2u);
}

// open: while Redis is away everything is let through (the cap is not
// enforced, by choice); back, the permits are registered (above the cap) and
// nothing more is granted until below it.
TEST(Faults, PolicyOpenLetsEverythingThroughAndRecovers) {
  RunOptions o = run(4);
  o.policy = "open";
  o.hold_min = o.hold_max = 50ms;
  Cluster c(o);
  c.start();
  c.start();
  c.go();
  sleep(1500ms);
  c.redis().stop_process();
  sleep(o.degrade_after + 1000ms);
  EXPECT_EQ(sum(c, "degraded"), 2);
  c.redis().continue_process();
  EXPECT_TRUE(c.wait_whole(15s));
  const Report r = c.finish(finish_within(o), false, /*overshoot_allowed=*/true);
  EXPECT_RUN_OK(r);
  EXPECT_GT(r.max_holders, o.cap) << "open: 8 clients ran at once while Redis was away";
}

// closed: while Redis is away new requests are rejected "unavailable" at once
// (within about one command timeout, never after max_wait); back, the
// clients are served again.
TEST(Faults, PolicyClosedRejectsAtOnceWhileRedisIsAway) {
  RunOptions o = run();
  o.policy = "closed";
  Cluster c(o);
  c.start();
  c.start();
  c.go();
  sleep(1500ms);
  c.redis().kill_hard();
  sleep(o.degrade_after + 1000ms);
  c.redis().start_again();
  EXPECT_TRUE(c.wait_whole(15s));
  const Report r = c.finish(finish_within(o), /*expect_unavailable=*/true);
  EXPECT_RUN_OK(r);
  EXPECT_GT(r.unavailable, 0u) << "arrivals were rejected while Redis was away";
  for (auto* w : c.all()) {
    for (const auto& rec : w->records()) {
      if (rec.reason != "unavailable") continue;
      EXPECT_LE(rec.end_ns - rec.arrive_ns, std::chrono::nanoseconds(2s).count())
          << "rejected within about one command timeout (after detection), never after its max wait";
    }
  }
}

}  // namespace
