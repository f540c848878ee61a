// `fairgate serve --redis redis://[USER:PASSWORD@]HOST:PORT/DB` against a
// real redis-server: a database the server does not have, a refused password
// or a missing one is an error at start (exit 1, the server's reason), never
// a silent database 0 or a server that starts and retries for ever.
#include "support/acl.hpp"
#include "support/netns.hpp"
#include "support/redis_server.hpp"
#include "support/run_shell.hpp"

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <string>
#include <utility>
#include <vector>

namespace {

using fairgate::test::NetNamespace;
using fairgate::test::RedisServer;

using fairgate::test::expect_serve_refuses_at_start;

TEST(ServeRedisDatabase, ADatabaseTheServerLacksIsAnErrorAtStart) {
  RedisServer server({"--databases", "16"});
  const std::string where = "127.0.0.1:" + std::to_string(server.port());
  expect_serve_refuses_at_start(
      "redis://" + where + "/99",
      "Redis at " + where + ": database 99 cannot be selected: ERR DB index is out of range");
  EXPECT_EQ(server.command({"DBSIZE"}), "0") << "nothing was written to database 0";
}

TEST(ServeRedisDatabase, ARefusedOrMissingPasswordIsAnErrorAtStart) {
  RedisServer server({"--requirepass", "s3cret"});
  const std::string where = "127.0.0.1:" + std::to_string(server.port());
  for (const auto& [userinfo, line] : std::vector<std::pair<std::string, std::string>>{
           {":not-it@",
            " refused AUTH as user 'default': WRONGPASS invalid username-password pair or user "
            "is disabled."},
           {"",
            " wants a password (NOAUTH Authentication required.): give it in the URL, "
            "redis://:PASSWORD@HOST:PORT or redis://USER:PASSWORD@HOST:PORT"}}) {
    expect_serve_refuses_at_start("redis://" + userinfo + where, "Redis at " + where + line);
  }
}

// A user that may log in but not call fairgate's scripts on its keys: an
// error at start with the user, Redis' words and the fix, not a server that
// starts, says "ok" on /healthz and answers every request 503. The documented
// user (docs/redis-acl.md) starts.
TEST(ServeRedisDatabase, AUserThatMayNotRunFairgatesScriptsIsAnErrorAtStart) {
  RedisServer server(RedisServer::Options{});
  const std::string where = "127.0.0.1:" + std::to_string(server.port());
  auto acl = fairgate::test::documented_acl("fg-other-keys", "pw", "other");
  ASSERT_EQ(server.command(acl), "OK");
  expect_serve_refuses_at_start(
      "redis://fg-other-keys:pw@" + where,
      "Redis at " + where +
          " refused a call of fairgate's as user 'fg-other-keys' (NOPERM this user has "
          "no permissions to access one of the keys used as arguments); until it is "
          "allowed, limiters follow on_redis_down after degrade_after (rate limits at "
          "once). Give the user the commands, keys and channels in docs/redis-acl.md");
  ASSERT_EQ(server.command(fairgate::test::documented_acl("fg-doc", "pw")), "OK");
  fairgate::test::expect_serve_starts("redis://fg-doc:pw@" + where);
}

// A URL that names a replica (an easy slip: the replica's address from a
// failover, or a read-only endpoint of a managed Redis): before, serve
// started, said "Redis unreachable", /healthz said Redis was down and every
// request waited out its max wait. Now an error at start naming the cause and
// the fix; the master starts. The check writes nothing (a DEL of an unused key).
TEST(ServeRedisDatabase, AReplicaIsAnErrorAtStart) {
  RedisServer master(RedisServer::Options{});
  RedisServer replica({"--replicaof", "127.0.0.1", std::to_string(master.port())});
  const std::string where = "127.0.0.1:" + std::to_string(replica.port());
  expect_serve_refuses_at_start(
      "redis://" + where,
      "Redis at " + where +
          " is a read-only replica (READONLY): it refuses fairgate's writes, so arrivals, releases and "
          "heartbeats fail until it is a master again; limiters send them again and follow on_redis_down "
          "after degrade_after (rate limits at once). Give fairgate the master's address (a "
          "redis+sentinel:// URL follows failovers) (docs/faults.md, \"Redis refuses writes\")");
  fairgate::test::expect_serve_starts("redis://127.0.0.1:" + std::to_string(master.port()));
}

// A server in protected mode (no password for the default user) turns away
// every client that is not on loopback: from another host (here a network
// namespace of the test's own) that is an error at start with the fix, not a
// server that retries for ever with "Redis unreachable".
TEST(ServeRedisDatabase, AServerInProtectedModeIsAnErrorAtStartFromAnotherHost) {
  REQUIRE_NETNS_OR_SKIP();
  NetNamespace ns;
  RedisServer::Options o;
  o.bind = {"127.0.0.1", ns.host_address()};
  o.extra_args = {"--protected-mode", "yes"};
  RedisServer server(o);
  std::string prefix;
  for (const auto& a : ns.exec_prefix()) prefix += a + " ";
  const std::string where = ns.host_address() + ":" + std::to_string(server.port());
  expect_serve_refuses_at_start(
      "redis://" + where,
      "Redis at " + where +
          " turns this client away (DENIED: it runs in protected mode, with no password "
          "for the default user, and then accepts clients on loopback only): give Redis "
          "a password (requirepass, or an ACL user: docs/redis-acl.md) and put it in the "
          "URL, or, where only trusted hosts reach it, set protected-mode no",
      "chat=3", prefix);
}

// A server at maxclients is no error at start (a slot may free): serve starts
// and says why it cannot connect yet — not "refused AUTH", which the error
// Redis writes on the new connection used to be read as.
TEST(ServeRedisDatabase, AServerAtMaxclientsIsNoErrorAtStart) {
  RedisServer::Options o;
  o.extra_args = {"--maxclients", "1"};
  o.password = "pw";
  RedisServer server(o);
  redisContext* slot = redisConnect("127.0.0.1", server.port());  // takes the one slot
  ASSERT_TRUE(slot != nullptr && slot->err == 0);
  const std::string where = "127.0.0.1:" + std::to_string(server.port());
  const auto r =
      fairgate::test::run_serve("--listen 127.0.0.1:0 --limiter chat=3 --redis redis://:pw@" + where, 3);
  redisFree(slot);
  EXPECT_EQ(r.exit_code, 124) << "still running: " << r.output;
  EXPECT_EQ(r.output.find("refused AUTH"), std::string::npos) << r.output;
  EXPECT_NE(
      r.output.find("Redis at " + where + " refuses new connections (ERR max number of clients reached)"),
      std::string::npos)
      << r.output;
}

}  // namespace
