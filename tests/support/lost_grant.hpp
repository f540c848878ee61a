// A failover that loses a grant, made on purpose on real servers, and what
// recovery rule 14 (docs/design.md) must do about it:
//
//   LostGrant scenario{url, prefix, name, master, replica};
//   scenario.run([&] { ...make `replica` the master the clients reach... });
//
// Two instances in this process share a limiter of cap 1. The replica is
// frozen (SIGSTOP) and cut off (CLIENT KILL TYPE replica on the master:
// SIGSTOP alone is not enough, its kernel would still take the stream); one
// instance is granted the seat; that instance freezes (no heartbeat can
// restore the permit first); the master is killed (kill -9); the replica
// goes on and `promote` makes it the master. It has the state and both
// registrations, not the grant. The other instance's acquire must queue: the
// new master has another replication id, so the state is fenced before
// anything is granted. The holder comes back and restores its permit; the
// waiter is granted only after its release. Judged from the clients' own times.
#pragma once

#include "support/holders_key.hpp"
#include "support/instance.hpp"
#include "support/redis_server.hpp"
#include "support/wait.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

namespace fairgate::test {

struct LostGrant {
  std::string url;
  std::string prefix;
  std::string name;  ///< the limiter, its keys on `master`
  RedisServer& master;
  RedisServer& replica;  ///< of `master`, its link up

  void run(const std::function<void()>& promote) {
    using namespace std::chrono_literals;
    RedisBackendOptions o;
    o.url = url;
    o.key_prefix = prefix;
    o.heartbeat_interval = 250ms;
    // The frozen holder is not reaped meanwhile, and the fence outlasts its
    // freeze after the switch by far (it restores within a heartbeat or two
    // of thawing): a loaded machine does not turn the fence's end into a grant.
    o.liveness_ttl = 9000ms;
    o.recovery_fence = 4500ms;
    o.command_timeout = 900ms;
    o.key_expiry = 0ms;
    Settings one;
    one.max_concurrent = 1;
    one.max_wait = 30s;
    Instance holder_instance(o);
    Instance other(o);
    Limiter lh = holder_instance.open(name, one);
    Limiter lo = other.open(name, one);
    ASSERT_TRUE(wait_until(
        [&] { return ready_past_fence(holder_instance, name, lh) && ready_past_fence(other, name, lo); },
        15s))
        << "past the new state's fence";
    ASSERT_EQ(master.command({"WAIT", "1", "5000"}), "1") << "the replica has the state";
    replica.stop_process();
    ASSERT_EQ(master.command({"CLIENT", "KILL", "TYPE", "replica"}), "1");
    auto held = acquire(lh);
    ASSERT_TRUE(wait_until([&] { return held->done(); }, 5s));
    ASSERT_EQ(held->outcome(), Outcome::granted) << held->message();
    holder_instance.freeze();
    master.kill_hard();
    replica.continue_process();
    promote();
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_EQ(holders(), "0") << "the grant was lost";
    ASSERT_EQ(replica.command(fairgate::test::count_command(key("instances"))), "2")
        << "the registrations were not";

    auto waiter = acquire_queued(lo);  // fails here if granted: two holders with a cap of 1
    ASSERT_FALSE(waiter->done()) << waiter->message();
    EXPECT_EQ(holders(), "0");
    EXPECT_TRUE(wait_until([&] { return lo.snapshot().engine.redis_switches >= 1; }, 5s))
        << "the switch seen and counted";
    EXPECT_FALSE(waiter->done())
        << "granted the lost seat while its holder runs: two holders with a cap of 1";
    EXPECT_EQ(holders(), "0");

    holder_instance.thaw();
    ASSERT_TRUE(wait_until([&] { return holder_instance.impl(name)->restores() >= 1; }, 10s));
    ASSERT_TRUE(wait_until([&] { return holders() == "1"; }, 10s)) << "the running permit is counted again";
    // Past the fence, the seat is still taken: the waiter waits for the release.
    ASSERT_TRUE(wait_until([&] { return !lo.snapshot().engine.fence_left.count(); }, 10s));
    std::this_thread::sleep_for(o.heartbeat_interval * 2);
    EXPECT_FALSE(waiter->done()) << "granted while the restored holder still runs";
    const auto released_at = std::chrono::steady_clock::now();
    held->release();
    ASSERT_TRUE(wait_until([&] { return waiter->done(); }, 10s));
    EXPECT_EQ(waiter->outcome(), Outcome::granted) << waiter->message();
    EXPECT_GE(waiter->at(), released_at) << "never two holders at once";
    waiter->release();
    EXPECT_TRUE(wait_until([&] { return holders() == "0"; }, 10s));
  }

 private:
  std::string key(const std::string& what) const { return prefix + ":{" + name + "}:" + what; }
  std::string holders() { return replica.command(fairgate::test::count_command(key("holders"))); }
};

}  // namespace fairgate::test
