// The Redis client against a real redis-server started on a free loopback port.
#include "redis/connection.hpp"
#include "redis/database_check.hpp"
#include "redis/log_level.hpp"
#include "redis/scripts.hpp"
#include "support/acl.hpp"
#include "support/log_lines.hpp"
#include "support/netns.hpp"
#include "support/redis_server.hpp"
#include "support/wait.hpp"

#include <gtest/gtest.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
using fairgate::redis::Connection;
using fairgate::redis::ConnectionOptions;
using fairgate::redis::Error;
using fairgate::redis::Reply;
using fairgate::test::RedisServer;
using namespace std::chrono_literals;

struct Result {
  boost::system::error_code ec;
  Reply reply;
};

// What a connection whose handshake the server refuses did (refused_handshake()).
struct Refused {
  Result set;  ///< the SET that waited for the handshake
  bool connected = false;
  std::uint64_t connects = 0, commands_sent = 0;
  std::vector<std::string> lines;  ///< what it logged
};

// An io_context on its own thread, and a blocking exec() for readable tests.
class RedisConnectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    for (auto& c : connections_) c->close();
    work_.reset();
    thread_.join();
  }

  std::shared_ptr<Connection> connect(ConnectionOptions options) {
    auto c = Connection::create(io_.get_executor(), std::move(options));
    connections_.push_back(c);
    c->start();
    return c;
  }
  std::shared_ptr<Connection> connect(const RedisServer& server, std::string name = {}) {
    ConnectionOptions o;
    o.endpoint.port = server.port();
    o.client_name = std::move(name);
    return connect(std::move(o));
  }

  static Result exec(Connection& c, std::vector<std::string> args,
                     std::optional<std::chrono::milliseconds> timeout = std::nullopt) {
    std::promise<Result> done;
    auto fut = done.get_future();
    c.exec(
        std::move(args),
        [&done](boost::system::error_code ec, Reply r) {
          done.set_value({ec, std::move(r)});
        },
        timeout);
    return fut.get();
  }

  // A connection whose handshake the server refuses (SELECT, AUTH): a SET
  // waits for the handshake and a preload would follow it, writing
  // `<key>:k` and `<key>:preload`, while the connection connects again and
  // again (20-40 ms apart) for 300 ms; then it is closed.
  Refused refused_handshake(ConnectionOptions o, const std::string& key) {
    fairgate::test::LogLines log;
    o.reconnect_min = 20ms;
    o.reconnect_max = 40ms;
    o.log = log.sink();
    auto c = Connection::create(io_.get_executor(), o);
    connections_.push_back(c);
    c->set_preload({{"SET", key + ":preload", "x"}});
    c->start();
    Refused out;
    out.set = exec(*c, {"SET", key + ":k", "x"}, 300ms);
    out.connected = c->connected();
    out.connects = c->connects();
    out.commands_sent = c->commands_sent();
    c->close();
    out.lines = log.lines();
    return out;
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  std::thread thread_;
  std::vector<std::shared_ptr<Connection>> connections_;
};

TEST_F(RedisConnectionTest, SetGetAndCountsCommands) {
  auto& server = RedisServer::shared();
  auto c = connect(server);
  auto set = exec(*c, {"SET", "conn:k", "v\r\nwith crlf"});
  ASSERT_FALSE(set.ec) << set.ec.message();
  EXPECT_EQ(set.reply.str, "OK");
  auto get = exec(*c, {"GET", "conn:k"});
  EXPECT_EQ(get.reply.type, Reply::Type::string);
  EXPECT_EQ(get.reply.str, "v\r\nwith crlf") << "binary-safe arguments";
  EXPECT_TRUE(exec(*c, {"GET", "conn:missing"}).reply.is_nil());
  EXPECT_TRUE(exec(*c, {"NOSUCHCOMMAND"}).reply.is_error());
  EXPECT_EQ(c->commands_sent(), 4u);
}

TEST_F(RedisConnectionTest, PipelinedRepliesArriveInOrder) {
  auto& server = RedisServer::shared();
  auto c = connect(server);
  exec(*c, {"DEL", "conn:counter"});
  constexpr int kCount = 5000;
  std::vector<std::int64_t> seen;
  std::promise<void> done;
  for (int i = 0; i < kCount; ++i) {
    c->exec(
        {"INCR", "conn:counter"},
        [&, i](boost::system::error_code ec, Reply r) {
          ASSERT_FALSE(ec);
          seen.push_back(r.integer);  // callbacks run on the connection's strand
          if (i == kCount - 1) done.set_value();
        },
        5s);
  }
  done.get_future().wait();
  ASSERT_EQ(seen.size(), static_cast<std::size_t>(kCount));
  for (int i = 0; i < kCount; ++i) ASSERT_EQ(seen[i], i + 1) << "reply " << i << " out of order";
}

TEST_F(RedisConnectionTest, TimeoutKeepsLaterRepliesAligned) {
  auto& server = RedisServer::shared();
  auto sleeper = connect(server);
  auto c = connect(server);
  ASSERT_FALSE(exec(*c, {"PING"}).ec);
  // Block the whole server for 300 ms; our PING must time out after 100 ms.
  std::promise<Result> slept;
  sleeper->exec(
      {"DEBUG", "SLEEP", "0.3"},
      [&](boost::system::error_code ec, Reply r) {
        slept.set_value({ec, std::move(r)});
      },
      2s);
  std::this_thread::sleep_for(50ms);
  auto t0 = std::chrono::steady_clock::now();
  auto ping = exec(*c, {"PING"}, 100ms);
  auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(ping.ec, Error::timeout);
  EXPECT_GE(waited, 100ms);
  EXPECT_LT(waited, 290ms);
  // The late PONG must be discarded, not handed to the next command.
  auto echo = exec(*c, {"ECHO", "after"}, 2s);
  ASSERT_FALSE(echo.ec) << echo.ec.message();
  EXPECT_EQ(echo.reply.str, "after");
  EXPECT_FALSE(slept.get_future().get().ec);
}

TEST_F(RedisConnectionTest, ReconnectsAfterTheServerKillsTheClient) {
  auto& server = RedisServer::shared();
  auto c = connect(server, "victim");
  ASSERT_FALSE(exec(*c, {"PING"}).ec);
  EXPECT_EQ(c->connects(), 1u);
  EXPECT_EQ(server.command({"CLIENT", "KILL", "USER", "default", "SKIPME", "yes"}).substr(0, 7) == "(error)",
            false);
  // The first command after the kill may fail (in flight when the socket died);
  // within a few tries the connection is back and works.
  bool ok = false;
  for (int i = 0; i < 50 && !ok; ++i) {
    auto r = exec(*c, {"ECHO", "back"}, 500ms);
    ok = !r.ec && r.reply.str == "back";
    if (!ok) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(ok);
  EXPECT_GE(c->connects(), 2u);
  EXPECT_NE(server.command({"CLIENT", "LIST"}).find("name=victim"), std::string::npos)
      << "CLIENT SETNAME is sent again after a reconnect";
}

TEST_F(RedisConnectionTest, PubSubResubscribesAfterKill) {
  auto& server = RedisServer::shared();
  ConnectionOptions o;
  o.endpoint.port = server.port();
  o.subscriber = true;
  auto sub = Connection::create(io_.get_executor(), o);
  connections_.push_back(sub);
  std::mutex mu;
  std::vector<std::string> messages;
  std::atomic<int> subscribed{0};
  sub->set_push_handler([&](Reply r) {
    std::lock_guard lock(mu);
    messages.push_back(r.elements.at(2).str);
  });
  sub->set_connect_handler([&, raw = sub.get()] {
    raw->exec({"SUBSCRIBE", "conn:chan"}, [&](boost::system::error_code ec, Reply) {
      if (!ec) ++subscribed;
    });
  });
  sub->start();
  auto pub = connect(server);
  auto publish_until_seen = [&](const std::string& payload) {
    for (int i = 0; i < 100; ++i) {
      exec(*pub, {"PUBLISH", "conn:chan", payload});
      std::this_thread::sleep_for(10ms);
      std::lock_guard lock(mu);
      if (std::find(messages.begin(), messages.end(), payload) != messages.end()) return true;
    }
    return false;
  };
  EXPECT_TRUE(publish_until_seen("one"));
  const int before = subscribed.load();
  server.command({"CLIENT", "KILL", "TYPE", "pubsub"});
  EXPECT_TRUE(publish_until_seen("two")) << "messages flow again after the pubsub connection was killed";
  EXPECT_GT(subscribed.load(), before);
}

TEST_F(RedisConnectionTest, AuthSelectsDatabaseAndRejectsWrongPassword) {
  RedisServer secured({"--requirepass", "s3cret"});
  auto url = fairgate::redis::parse_url("redis://:s3cret@127.0.0.1:" + std::to_string(secured.port()) + "/3");
  ASSERT_TRUE(std::holds_alternative<fairgate::redis::Endpoint>(url));
  ConnectionOptions o;
  o.endpoint = std::get<fairgate::redis::Endpoint>(url);
  auto c = connect(o);
  auto set = exec(*c, {"SET", "k", "in-db-3"}, 1s);
  ASSERT_FALSE(set.ec) << set.ec.message();
  EXPECT_EQ(set.reply.str, "OK");
  auto info = exec(*c, {"CLIENT", "INFO"}, 1s);
  EXPECT_NE(info.reply.str.find("db=3"), std::string::npos) << info.reply.str;

  ConnectionOptions wrong = o;
  wrong.endpoint.password = "nope";
  auto w = connect(wrong);
  auto r = exec(*w, {"GET", "k"}, 500ms);
  EXPECT_TRUE(r.ec || r.reply.is_error()) << "a wrong password never reads data: " << r.reply.excerpt();
}

// /99 on a server with 16 databases: SELECT is refused, and nothing runs in
// database 0 instead (neither what waited nor the preload, which follow SELECT
// on a connection); the connection connects again and again, the log line
// (the database, the server's reason) comes once.
TEST_F(RedisConnectionTest, ADatabaseTheServerLacksIsNeverDatabaseZero) {
  RedisServer server({"--databases", "16"});
  ConnectionOptions o;
  o.endpoint.port = server.port();
  o.endpoint.db = 99;
  o.client_name = "select-test";
  const Refused r = refused_handshake(o, "select");
  EXPECT_EQ(r.set.ec, Error::not_sent) << r.set.ec.message() << " " << r.set.reply.excerpt();
  EXPECT_FALSE(r.connected);
  EXPECT_EQ(r.connects, 0u);
  EXPECT_GE(r.commands_sent, 2u) << "SELECT once per attempt: it connects again";
  EXPECT_EQ(server.command({"EXISTS", "select:k"}), "0") << "the SET ran in database 0";
  EXPECT_EQ(server.command({"EXISTS", "select:preload"}), "0") << "the preload ran in database 0";
  ASSERT_EQ(r.lines.size(), 1u) << "logged once until the connection works";
  EXPECT_EQ(r.lines.front(), "Redis at 127.0.0.1:" + std::to_string(server.port()) +
                                 ": database 99 cannot be selected: ERR DB index is out of range");
}

// A refused AUTH on a server whose default user needs no password: Redis
// would run what follows AUTH on the same connection as that default user.
// Nothing follows it (neither what waited nor the preload nor CLIENT SETNAME);
// the connection connects again, the line (user, the server's reason, never
// the password) comes once.
TEST_F(RedisConnectionTest, ARefusedAuthRunsNothingAsTheDefaultUser) {
  RedisServer server(RedisServer::Options{});
  ASSERT_EQ(server.command({"ACL", "SETUSER", "fg", "on", ">right", "~*", "+@all"}), "OK");
  ConnectionOptions o;
  o.endpoint.port = server.port();
  o.endpoint.user = "fg";
  o.endpoint.password = "wrong-pw";
  o.client_name = "auth-test";
  const Refused r = refused_handshake(o, "auth");
  EXPECT_TRUE(r.set.ec) << "the SET ran: " << r.set.reply.excerpt();
  EXPECT_EQ(r.connects, 0u);
  EXPECT_GE(r.commands_sent, 2u) << "AUTH once per attempt: it connects again";
  EXPECT_EQ(server.command({"EXISTS", "auth:k"}), "0") << "the SET ran as the default user";
  EXPECT_EQ(server.command({"EXISTS", "auth:preload"}), "0") << "the preload ran as the default user";
  EXPECT_EQ(server.command({"CLIENT", "LIST"}).find("name=auth-test"), std::string::npos);
  ASSERT_EQ(r.lines.size(), 1u) << "logged once until the connection works";
  EXPECT_EQ(r.lines.front(),
            "Redis at 127.0.0.1:" + std::to_string(server.port()) +
                " refused AUTH as user 'fg': WRONGPASS invalid username-password pair or user is "
                "disabled.");
  EXPECT_EQ(r.lines.front().find("wrong-pw"), std::string::npos);

  // The right password: what waited runs, as that user.
  o.endpoint.password = "right";
  auto good = connect(o);
  auto ok = exec(*good, {"SET", "auth:k", "as-fg"}, 2s);
  ASSERT_FALSE(ok.ec) << ok.ec.message();
  EXPECT_EQ(ok.reply.str, "OK");
  EXPECT_EQ(exec(*good, {"ACL", "WHOAMI"}, 2s).reply.str, "fg");
}

// A server that wants a password, none given: every command is answered
// NOAUTH, and the connection says once what to do.
TEST_F(RedisConnectionTest, APasswordTheServerWantsIsNamedOnce) {
  RedisServer server({"--requirepass", "s3cret"});
  fairgate::test::LogLines log;
  ConnectionOptions o;
  o.endpoint.port = server.port();
  o.log = log.sink();
  auto c = connect(o);
  for (int i = 0; i < 3; ++i) {
    auto r = exec(*c, {"GET", "k"}, 2s);
    ASSERT_FALSE(r.ec) << r.ec.message();
    EXPECT_TRUE(r.reply.is_error());
    EXPECT_EQ(r.reply.str.rfind("NOAUTH", 0), 0u) << r.reply.excerpt();
  }
  const auto lines = log.lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines.front(), "Redis at 127.0.0.1:" + std::to_string(server.port()) +
                               " wants a password (NOAUTH Authentication required.): give it in the URL, "
                               "redis://:PASSWORD@HOST:PORT or redis://USER:PASSWORD@HOST:PORT");
}

// A server that may evict keys (maxmemory with a policy other than
// noeviction) can drop a limiter's keys, and permits or waiters with them:
// a connection that carries a limiter's commands asks at each connect and
// says so once (docs/faults.md, "Redis refuses writes"). Checked from
// the server's own settings, changed between reconnects.
TEST_F(RedisConnectionTest, AServerThatMayEvictKeysIsNamedAtConnect) {
  RedisServer server({"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"});
  fairgate::test::LogLines log;
  ConnectionOptions o;
  o.endpoint.port = server.port();
  o.log = log.sink();
  o.check_eviction = true;
  auto c = connect(o);
  // INFO goes right after the handshake, before what waited: once a PING is
  // answered, so was it.
  const auto ping = [&] { ASSERT_FALSE(exec(*c, {"PING"}, 5s).ec); };
  const auto reconnect = [&](std::uint64_t n) {
    c->drop("test");
    ping();
    ASSERT_EQ(c->connects(), n);
  };
  ping();
  for (int i = 0; i < 3; ++i) ping();
  auto lines = log.lines();
  ASSERT_EQ(lines.size(), 1u) << log.all();
  const std::string at = "Redis at 127.0.0.1:" + std::to_string(server.port());
  EXPECT_EQ(lines[0], at + " may evict fairgate's keys (maxmemory 104857600 bytes, maxmemory-policy "
                           "allkeys-lru): a key evicted takes permits or waiters with it, which the "
                           "instances must find and restore (grants pause meanwhile; tenant limits may not "
                           "hold); set maxmemory-policy noeviction, or give fairgate a Redis of its own "
                           "(docs/faults.md, \"Redis refuses writes\")");
  EXPECT_EQ(fairgate::redis::level_of(lines[0]), fairgate::LogLevel::warn);

  ASSERT_EQ(server.command({"CONFIG", "SET", "maxmemory-policy", "noeviction"}), "OK");
  reconnect(2);
  EXPECT_EQ(log.lines().size(), 1u) << "noeviction: nothing to say\n" << log.all();
  // fairgate's keys carry an expiry: the volatile-* policies may take them too.
  ASSERT_EQ(server.command({"CONFIG", "SET", "maxmemory-policy", "volatile-lru"}), "OK");
  reconnect(3);
  lines = log.lines();
  ASSERT_EQ(lines.size(), 2u) << log.all();
  EXPECT_NE(lines[1].find("maxmemory-policy volatile-lru)"), std::string::npos) << lines[1];
  ASSERT_EQ(server.command({"CONFIG", "SET", "maxmemory", "0"}), "OK");
  ASSERT_EQ(server.command({"CONFIG", "SET", "maxmemory-policy", "allkeys-random"}), "OK");
  reconnect(4);
  EXPECT_EQ(log.lines().size(), 2u) << "no memory limit: nothing is evicted\n" << log.all();

  // A connection not asked to check does not ask.
  ASSERT_EQ(server.command({"CONFIG", "SET", "maxmemory", "100mb"}), "OK");
  fairgate::test::LogLines quiet;
  o.check_eviction = false;
  o.log = quiet.sink();
  auto plain = connect(o);
  ASSERT_FALSE(exec(*plain, {"PING"}, 5s).ec);
  EXPECT_TRUE(quiet.lines().empty()) << quiet.all();
}

// Where an ACL denies INFO the check is left out: the connection works, says
// nothing, and does not ask again at the next connect.
TEST_F(RedisConnectionTest, AnAclWithoutInfoSkipsTheEvictionCheck) {
  RedisServer server({"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"});
  ASSERT_EQ(server.command({"ACL", "SETUSER", "fg", "on", ">pw", "~*", "&*", "+@all", "-info"}), "OK");
  fairgate::test::LogLines log;
  ConnectionOptions o;
  o.endpoint.port = server.port();
  o.endpoint.user = "fg";
  o.endpoint.password = "pw";
  o.log = log.sink();
  o.check_eviction = true;
  auto c = connect(o);
  ASSERT_EQ(exec(*c, {"SET", "acl-info:k", "x"}, 5s).reply.str, "OK");
  c->drop("test");
  ASSERT_EQ(exec(*c, {"GET", "acl-info:k"}, 5s).reply.str, "x");
  EXPECT_EQ(c->connects(), 2u);
  EXPECT_TRUE(log.lines().empty()) << log.all();
  const auto stats = server.command({"INFO", "commandstats"});
  EXPECT_NE(stats.find("cmdstat_info:calls=0,usec=0,usec_per_call=0.00,rejected_calls=1,failed_calls=0"),
            std::string::npos)
      << "asked once, refused once\n"
      << stats;
}

// A server at maxclients answers a new connection with an error and closes
// it: the connection says so once (not as a refused AUTH, which its first
// command is, and not silently), connects again with backoff, and works once
// a slot is free.
TEST_F(RedisConnectionTest, AServerAtMaxclientsIsNamedOnce) {
  RedisServer::Options so;
  so.extra_args = {"--maxclients", "1"};
  so.password = "pw";
  RedisServer server(so);
  ConnectionOptions o;
  o.endpoint.port = server.port();
  o.endpoint.password = "pw";
  auto first = connect(o);
  ASSERT_EQ(exec(*first, {"PING"}, 5s).reply.str, "PONG");
  fairgate::test::LogLines log;
  o.reconnect_min = 20ms;
  o.reconnect_max = 40ms;
  o.log = log.sink();
  auto second = connect(o);
  EXPECT_TRUE(exec(*second, {"PING"}, 500ms).ec) << "no slot: it never runs";
  const auto lines = log.lines();
  ASSERT_EQ(lines.size(), 1u) << log.all();
  EXPECT_EQ(lines[0], "Redis at 127.0.0.1:" + std::to_string(server.port()) +
                          " refuses new connections (ERR max number of clients reached): it is at "
                          "maxclients; fairgate connects again with backoff. Raise maxclients, or close "
                          "what else holds connections to it");
  EXPECT_EQ(fairgate::redis::level_of(lines[0]), fairgate::LogLevel::warn);
  first->close();
  EXPECT_EQ(exec(*second, {"PING"}, 5s).reply.str, "PONG") << "a slot is free";
  EXPECT_EQ(log.lines().size(), 1u) << log.all();
}

// A server in protected mode turns away a client that is not on loopback
// (DENIED, then it closes the connection): a connection from a network
// namespace of the test's own says so once, with the fix, and its command
// never runs.
TEST(RedisTurnedAway, AServerInProtectedModeIsNamedOnceFromAnotherHost) {
  REQUIRE_NETNS_OR_SKIP();
  fairgate::test::NetNamespace ns;
  RedisServer::Options so;
  so.bind = {"127.0.0.1", ns.host_address()};
  so.extra_args = {"--protected-mode", "yes"};
  RedisServer server(so);
  fairgate::test::LogLines log;
  ConnectionOptions o;
  o.endpoint.host = ns.host_address();
  o.endpoint.port = server.port();
  o.reconnect_min = 20ms;
  o.reconnect_max = 40ms;
  o.log = log.sink();
  Result r;
  // The connection's sockets are made on the io thread: run it inside.
  ns.run_inside([&] {
    asio::io_context io;
    auto c = Connection::create(io.get_executor(), o);
    c->start();
    c->exec(
        {"SET", "denied:k", "x"},
        [&](boost::system::error_code ec, Reply reply) {
          r = {ec, std::move(reply)};
          c->close();
        },
        500ms);
    io.run_for(10s);
  });
  EXPECT_TRUE(r.ec) << "never ran: " << r.reply.excerpt();
  EXPECT_EQ(server.command({"EXISTS", "denied:k"}), "0");
  const auto lines = log.lines();
  ASSERT_EQ(lines.size(), 1u) << log.all();
  EXPECT_EQ(lines[0], fairgate::redis::protected_mode(o.endpoint));
  EXPECT_NE(lines[0].find("turns this client away (DENIED: it runs in protected mode"), std::string::npos);
  EXPECT_EQ(fairgate::redis::level_of(lines[0]), fairgate::LogLevel::warn);
}

// The answers that mean "not now, nothing ran" (the client sends the call
// again; redis/client.cpp), each with its own line, and nothing else.
TEST(RedisRefusal, EachKindIsNamedWithItsFix) {
  fairgate::redis::Endpoint ep;
  ep.host = "10.0.0.7";
  ep.port = 6380;
  const std::string tail =
      "; limiters send them again and follow on_redis_down after degrade_after (rate limits at once). ";
  const std::string doc = " (docs/faults.md, \"Redis refuses writes\")";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"OOM command not allowed when used memory > 'maxmemory'. script: 0f, on @user_script:495.",
       "Redis at 10.0.0.7:6380 is out of memory (OOM: used memory above maxmemory, and nothing it may evict "
       "frees enough): it refuses every command that would add data, so arrivals cannot queue and heartbeats "
       "fail" +
           tail + "Free memory or raise maxmemory" + doc},
      {"MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
       "Redis at 10.0.0.7:6380 refuses writes (MISCONF: its last RDB snapshot failed and "
       "stop-writes-on-bgsave-error is on): arrivals, releases and heartbeats fail" +
           tail + "Redis' log says why the snapshot failed" + doc},
      {"NOREPLICAS Not enough good replicas to write.",
       "Redis at 10.0.0.7:6380 refuses writes (NOREPLICAS: fewer replicas connected than "
       "min-replicas-to-write): arrivals, releases and heartbeats fail" +
           tail + "Bring a replica back, or lower min-replicas-to-write" + doc},
      {"BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
       "Redis at 10.0.0.7:6380 is busy running a script past busy-reply-threshold (BUSY) and answers "
       "nothing else: arrivals, releases and heartbeats fail" +
           tail + "End it with SCRIPT KILL (SHUTDOWN NOSAVE if it wrote)" + doc},
      {"READONLY You can't write against a read only replica.",
       "Redis at 10.0.0.7:6380 is a read-only replica (READONLY): it refuses fairgate's writes, so "
       "arrivals, releases and heartbeats fail until it is a master again" +
           tail + "Give fairgate the master's address (a redis+sentinel:// URL follows failovers)" + doc},
  };
  for (const auto& [reply, line] : cases) {
    EXPECT_TRUE(fairgate::redis::refusal(reply)) << reply;
    EXPECT_EQ(fairgate::redis::refusal_line(ep, reply), line);
    EXPECT_EQ(fairgate::redis::level_of(line), fairgate::LogLevel::warn) << line;
  }
  for (const std::string other :
       {"BUSYKEY Target key name already exists.", "BUSYGROUP Consumer Group name already exists",
        "ERR unknown command", "NOSCRIPT No matching script.", "OOMPH", "NOAUTH x",
        "WRONGTYPE Operation against a key holding the wrong kind of value", ""}) {
    EXPECT_FALSE(fairgate::redis::refusal(other)) << other;
    EXPECT_EQ(fairgate::redis::refusal_line(ep, other), std::nullopt) << other;
  }
}

// A program that embeds fairgate and starts another one (fork and exec)
// must not hand it fairgate's connections: Asio opens sockets without
// FD_CLOEXEC, and a connection inherited by a child outlived its close()
// (Redis still listed the client while the child ran).
TEST_F(RedisConnectionTest, AChildProcessDoesNotInheritTheConnection) {
  auto& server = RedisServer::shared();
  const std::string name = "cloexec-" + std::to_string(::getpid());
  auto c = connect(server, name);
  auto r = exec(*c, {"PING"}, 2s);
  ASSERT_FALSE(r.ec) << r.ec.message();
  const auto listed = [&] {
    return server.command({"CLIENT", "LIST"}).find("name=" + name + " ") != std::string::npos;
  };
  ASSERT_TRUE(fairgate::test::wait_until(listed, 5s));
  pid_t child = -1;
  char sleep_path[] = "/bin/sleep";
  char seconds[] = "30";
  char* argv[] = {sleep_path, seconds, nullptr};
  ASSERT_EQ(::posix_spawn(&child, sleep_path, nullptr, nullptr, argv, environ), 0);
  c->close();
  EXPECT_TRUE(fairgate::test::wait_until([&] { return !listed(); }, 5s))
      << "the connection is still open after close(): the child holds it";
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

// A database the server has: what waited for the connection runs there, after SELECT.
TEST_F(RedisConnectionTest, WhatWaitedRunsInTheSelectedDatabase) {
  RedisServer server({"--databases", "16"});
  ConnectionOptions o;
  o.endpoint.port = server.port();
  o.endpoint.db = 15;
  auto c = Connection::create(io_.get_executor(), o);
  connections_.push_back(c);
  c->set_preload({{"SET", "select:preload", "in-db-15"}});
  std::promise<Result> done;
  c->exec(
      {"SET", "select:k", "in-db-15"},
      [&done](boost::system::error_code ec, Reply r) {
        done.set_value({ec, std::move(r)});
      },
      5s);
  c->start();  // the SET waited for the connection
  const auto r = done.get_future().get();
  ASSERT_FALSE(r.ec) << r.ec.message();
  EXPECT_TRUE(c->connected());
  EXPECT_EQ(c->connects(), 1u);
  EXPECT_EQ(exec(*c, {"GET", "select:k"}, 5s).reply.str, "in-db-15");
  EXPECT_EQ(exec(*c, {"GET", "select:preload"}, 5s).reply.str, "in-db-15");
  const auto info = exec(*c, {"CLIENT", "INFO"}, 5s);
  EXPECT_NE(info.reply.str.find(" db=15 "), std::string::npos) << info.reply.str;
  c->close();
  EXPECT_EQ(server.command({"EXISTS", "select:k"}), "0");
  EXPECT_EQ(server.command({"EXISTS", "select:preload"}), "0");
  EXPECT_EQ(server.command({"DBSIZE"}), "0");
}

// The start-up check of `fairgate serve` (redis/database_check.hpp).
TEST(RedisDatabaseCheck, ARefusedDatabaseIsTheProblemWithTheServersReason) {
  RedisServer server({"--databases", "16"});
  fairgate::redis::Endpoint ep;
  ep.port = server.port();
  ep.db = 99;
  EXPECT_EQ(fairgate::redis::start_problem(ep, 2s),
            "Redis at 127.0.0.1:" + std::to_string(server.port()) +
                ": database 99 cannot be selected: ERR DB index is out of range");
  ep.db = 15;
  EXPECT_EQ(fairgate::redis::start_problem(ep, 2s), std::nullopt);
  ep.db = 0;
  EXPECT_EQ(fairgate::redis::start_problem(ep, 2s), std::nullopt);
}

TEST(RedisDatabaseCheck, AuthComesFirstAndWhatItCannotTellIsNoProblem) {
  RedisServer server({"--databases", "16", "--requirepass", "s3cret"});
  fairgate::redis::Endpoint ep;
  ep.port = server.port();
  ep.db = 99;
  ep.password = "s3cret";
  EXPECT_EQ(fairgate::redis::start_problem(ep, 2s),
            "Redis at 127.0.0.1:" + std::to_string(server.port()) +
                ": database 99 cannot be selected: ERR DB index is out of range");
  const std::string at = "Redis at 127.0.0.1:" + std::to_string(server.port());
  ep.password = "wrong";  // refused before the database is asked
  EXPECT_EQ(
      fairgate::redis::start_problem(ep, 2s),
      at + " refused AUTH as user 'default': WRONGPASS invalid username-password pair or user is disabled.");
  ep.password.clear();  // NOAUTH: a password is missing, whatever the database
  for (const int db : {99, 3, 0}) {
    ep.db = db;
    EXPECT_EQ(fairgate::redis::start_problem(ep, 2s),
              at + " wants a password (NOAUTH Authentication required.): give it in the URL, "
                   "redis://:PASSWORD@HOST:PORT or redis://USER:PASSWORD@HOST:PORT")
        << "db " << db;
  }
  ep.password = "s3cret";
  EXPECT_EQ(fairgate::redis::start_problem(ep, 2s), std::nullopt) << "database 0, the right password";
  ep.port = fairgate::test::free_loopback_port();  // nothing there: serve starts degraded
  EXPECT_EQ(fairgate::redis::start_problem(ep, 2s), std::nullopt);
}

// A server busy with a script answers SELECT with BUSY: no problem with the
// URL (serve starts, degraded until the script ends), not "database cannot be
// selected".
TEST(RedisDatabaseCheck, AServerBusyWithAScriptIsNoProblem) {
  RedisServer server({"--databases", "16", "--busy-reply-threshold", "50"});
  std::thread script([&] { server.command({"EVAL", "while true do end", "0"}, 10s); });
  ASSERT_TRUE(fairgate::test::wait_until(
      [&] { return server.command({"PING"}, 500ms).rfind("(error) BUSY", 0) == 0; }, 5s));
  fairgate::redis::Endpoint ep;
  ep.port = server.port();
  ep.db = 3;
  EXPECT_EQ(fairgate::redis::start_problem(ep, 2s), std::nullopt);
  EXPECT_EQ(server.command({"SCRIPT", "KILL"}), "OK");
  script.join();
}

// An ACL user's wrong password: refused with the user's name, the password
// never shown.
TEST(RedisDatabaseCheck, AnAclUsersRefusedPasswordNamesTheUser) {
  RedisServer server(RedisServer::Options{});
  ASSERT_EQ(server.command({"ACL", "SETUSER", "fg", "on", ">right", "~*", "+@all"}), "OK");
  fairgate::redis::Endpoint ep;
  ep.port = server.port();
  ep.user = "fg";
  ep.password = "wrong-pw";
  const auto problem = fairgate::redis::start_problem(ep, 2s);
  ASSERT_TRUE(problem.has_value());
  EXPECT_EQ(*problem, "Redis at 127.0.0.1:" + std::to_string(server.port()) +
                          " refused AUTH as user 'fg': WRONGPASS invalid username-password pair or user is "
                          "disabled.");
  ep.password = "right";
  EXPECT_EQ(fairgate::redis::start_problem(ep, 2s), std::nullopt);
}

// A user that may log in but not do what fairgate does (docs/redis-acl.md):
// each part the ACL leaves out is named at start, with the user and Redis'
// own words, before any limiter runs. Nothing runs on the way (a script
// that does not exist is asked for: NOPERM comes before NOSCRIPT).
TEST(RedisDatabaseCheck, WhatTheUserMayNotDoIsNamedAtStart) {
  RedisServer server(RedisServer::Options{});
  fairgate::redis::Endpoint ep;
  ep.port = server.port();
  ep.password = "pw";
  const auto probe = fairgate::redis::start_probe("fairgate", {"chat"}, {"per-user"});  // as serve asks
  EXPECT_EQ(probe.script, fairgate::redis::scripts::kAcquire.text());
  EXPECT_EQ(probe.keys,
            (std::vector<std::string>{"fairgate:{chat}:cfg", "fairgate:rl:{per-user:start-check}:x"}));
  EXPECT_EQ(probe.channels, std::vector<std::string>{"fairgate:{chat}:wake:start-check"});
  const auto without = [](std::vector<std::string> acl, const std::string& word) {
    const auto it = std::find(acl.begin(), acl.end(), word);
    EXPECT_NE(it, acl.end()) << word << " is in the documented ACL";
    if (it != acl.end()) acl.erase(it);
    return acl;
  };
  const auto with_user = [&](const std::string& user, std::vector<std::string> acl) {
    EXPECT_EQ(server.command(acl), "OK") << user;
    ep.user = user;
    return fairgate::redis::start_problem(ep, 2s, probe);
  };
  const std::string at = "Redis at 127.0.0.1:" + std::to_string(server.port());
  const std::string then =
      "); until it is allowed, limiters follow on_redis_down after degrade_after (rate limits at once). Give "
      "the user the commands, keys and channels in docs/redis-acl.md";
  const auto line = [&](const std::string& user, const std::string& says) {
    return at + " refused a call of fairgate's as user '" + user + "' (" + says + then;
  };

  EXPECT_EQ(with_user("fg-doc", fairgate::test::documented_acl("fg-doc", "pw")), std::nullopt)
      << "the documented user may do all of it";
  EXPECT_EQ(server.command({"KEYS", "*"}), "") << "nothing was written";
  EXPECT_EQ(with_user("fg-noeval", without(fairgate::test::documented_acl("fg-noeval", "pw"), "+evalsha")),
            line("fg-noeval", "NOPERM this user has no permissions to run the 'evalsha' command"));
  EXPECT_EQ(
      with_user("fg-noload", without(fairgate::test::documented_acl("fg-noload", "pw"), "+script|load")),
      line("fg-noload", "NOPERM this user has no permissions to run the 'script|load' command"));
  auto other_keys = fairgate::test::documented_acl("fg-keys", "pw", "other");
  EXPECT_EQ(
      with_user("fg-keys", other_keys),
      line("fg-keys", "NOPERM this user has no permissions to access one of the keys used as arguments"));
  auto rl_keys = fairgate::test::documented_acl("fg-rl", "pw");
  std::replace(rl_keys.begin(), rl_keys.end(), std::string("~fairgate:*"), std::string("~fairgate:{*"));
  EXPECT_EQ(with_user("fg-rl", rl_keys),
            line("fg-rl", "NOPERM this user has no permissions to access one of the keys used as arguments"))
      << "the rate rules' keys are asked too";
  EXPECT_EQ(with_user("fg-nochan", without(fairgate::test::documented_acl("fg-nochan", "pw"), "&fairgate:*")),
            line("fg-nochan",
                 "NOPERM this user has no permissions to access one of the channels used as arguments"));
  EXPECT_EQ(server.command({"KEYS", "*"}), "") << "nothing was written";

  // A server that renames its script commands away, or one without sharded
  // Pub/Sub (older than 7.0, where SSUBSCRIBE is unknown: renamed here),
  // cannot run fairgate at all.
  const auto unknown = [](const RedisServer& other, const std::string& says) {
    return "Redis at 127.0.0.1:" + std::to_string(other.port()) +
           " does not know a command fairgate needs (" + says +
           "): fairgate needs Redis 7.0 or newer (SSUBSCRIBE: sharded Pub/Sub) with its script commands "
           "(SCRIPT "
           "LOAD, EVALSHA); this server is older, or renames or leaves them out (rename-command)";
  };
  RedisServer renamed({"--rename-command", "EVALSHA", ""});
  fairgate::redis::Endpoint plain;
  plain.port = renamed.port();
  EXPECT_EQ(fairgate::redis::start_problem(plain, 2s, probe),
            unknown(renamed,
                    "ERR unknown command 'EVALSHA', with args beginning with: "
                    "'0000000000000000000000000000000000000000' '1' 'fairgate:{chat}:cfg' "));
  RedisServer no_sharded({"--rename-command", "SSUBSCRIBE", ""});
  fairgate::redis::Endpoint older;
  older.port = no_sharded.port();
  EXPECT_EQ(
      fairgate::redis::start_problem(older, 2s, probe),
      unknown(
          no_sharded,
          "ERR unknown command 'SSUBSCRIBE', with args beginning with: 'fairgate:{chat}:wake:start-check' "));
  EXPECT_EQ(fairgate::redis::start_problem(plain, 2s), std::nullopt) << "without a probe: the login only";
}

// docs/troubleshooting.md lists every problem line fairgate logs about Redis.
// Each phrase in bold there is what the code writes: from the function that
// makes the line, or (a limiter's or the client's lines) from the source
// that builds it. A line reworded without the page fails here.
TEST(RedisLines, EachProblemLineIsOnTheTroubleshootingPage) {
  const auto read = [](const std::string& path) {
    std::ifstream in(std::string(FAIRGATE_SOURCE_DIR) + "/" + path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string page = read("docs/troubleshooting.md");
  ASSERT_FALSE(page.empty());
  namespace r = fairgate::redis;
  r::Endpoint ep;
  ep.host = "10.0.0.7";
  ep.port = 6380;
  ep.db = 99;
  ep.user = "fg";
  const std::vector<std::pair<std::string, std::string>> made = {
      {r::auth_refused(ep, "WRONGPASS invalid username-password pair"), "refused AUTH as user"},
      {r::password_missing(ep, "NOAUTH Authentication required."), "wants a password"},
      {r::database_refused(ep, "ERR DB index is out of range"), "cannot be selected"},
      {r::protected_mode(ep), "turns this client away"},
      {r::too_many_clients(ep), "refuses new connections"},
      {r::denied_line(ep, "NOPERM this user has no permissions to run the 'evalsha' command"),
       "refused a call of fairgate's as user"},
      {r::unknown_command(ep, "ERR unknown command 'SSUBSCRIBE'"), "does not know a command fairgate needs"},
      {r::refusal_line(ep, "OOM command not allowed").value_or(""), "is out of memory"},
      {r::refusal_line(ep, "MISCONF Redis is configured to save").value_or(""), "refuses writes (MISCONF"},
      {r::refusal_line(ep, "NOREPLICAS Not enough good replicas").value_or(""), "refuses writes (NOREPLICAS"},
      {r::refusal_line(ep, "BUSY Redis is busy running a script").value_or(""), "is busy running a script"},
      {r::refusal_line(ep, "READONLY You can't write against a read only replica.").value_or(""),
       "is a read-only replica"},
      {r::eviction_risk(ep, "maxmemory:100\r\nmaxmemory_policy:allkeys-lru\r\n").value_or(""),
       "may evict fairgate's keys"},
  };
  for (const auto& [line, phrase] : made) {
    EXPECT_NE(line.find(phrase), std::string::npos) << "the code writes: " << line;
    EXPECT_NE(page.find("**" + phrase), std::string::npos) << "the page has: " << phrase;
  }
  const std::string connection = read("src/redis/connection.cpp");
  const std::string limiter = read("src/redis/redis_limiter.cpp");
  const std::vector<std::pair<const std::string*, std::string>> written = {
      {&connection, "answered with TLS: use rediss://"},
      {&connection, "closed the connection before any reply"},
      {&limiter, "does not let this user run INFO"},
      {&limiter, "Redis refused this user's calls (docs/redis-acl.md)"},
      {&limiter, "Redis unreachable"},
      {&limiter, "no state in Redis"},
      {&limiter, "the limiter's state is on another Redis than before"},
  };
  for (const auto& [source, phrase] : written) {
    EXPECT_NE(source->find(phrase), std::string::npos) << "the code writes: " << phrase;
    EXPECT_NE(page.find(phrase), std::string::npos) << "the page has: " << phrase;
  }
}

// A command that could not be sent before its timeout: not_sent (it never
// reached Redis), not timeout (sent, no reply: it may still run).
TEST_F(RedisConnectionTest, UnreachableServerFailsCommandsAsNotSent) {
  ConnectionOptions o;
  o.endpoint.port = 1;  // nothing listens on port 1
  o.reconnect_min = 20ms;
  auto c = connect(o);
  auto t0 = std::chrono::steady_clock::now();
  auto r = exec(*c, {"PING"}, 150ms);
  EXPECT_EQ(r.ec, Error::not_sent);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_FALSE(c->connected());
}

// A peer that announces an array longer than any reply fairgate asks for
// (a server gone wrong, or the URL pointing at something that is not Redis):
// a protocol error at once, the connection reset — not an allocation of the
// announced size (hiredis allocates the array when it reads the header: 16 GB
// here) followed by a wait for elements that never come.
/// A peer on a free loopback port that answers the first thing it reads with
/// an array header of 2^31 - 1 elements, then waits for the client to close.
class HugeArrayPeer {
 public:
  HugeArrayPeer() : acceptor_(io_, {asio::ip::address_v4::loopback(), 0}) {
    thread_ = std::thread([this] {
      boost::system::error_code ec;
      asio::ip::tcp::socket s(io_);
      acceptor_.accept(s, ec);
      std::array<char, 256> buf{};
      if (!ec) s.read_some(asio::buffer(buf), ec);
      if (!ec) asio::write(s, asio::buffer(std::string_view("*2147483647\r\n")), ec);
      if (!ec) s.read_some(asio::buffer(buf), ec);  // until the client closes
    });
  }
  ~HugeArrayPeer() { thread_.join(); }
  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }

 private:
  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_;
  std::thread thread_;
};

TEST_F(RedisConnectionTest, AnArrayHeaderLongerThanAnyReplyIsAProtocolError) {
  HugeArrayPeer peer;
  ConnectionOptions o;
  o.endpoint.port = peer.port();
  o.reconnect_min = 10s;  // one connection is enough
  auto c = connect(o);
  const auto t0 = std::chrono::steady_clock::now();
  const Result r = exec(*c, {"PING"}, 5s);
  EXPECT_EQ(r.ec, Error::disconnected) << r.ec.message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s) << "at once, not at the command timeout";
  c->close();
}

// The same for the start-up check of the database number (its own blocking
// hiredis context): no answer to read, at once.
TEST(RedisDatabaseCheck, AnArrayHeaderLongerThanAnyReplyEndsTheCheckAtOnce) {
  HugeArrayPeer peer;
  fairgate::redis::Endpoint e;
  e.port = peer.port();
  e.db = 3;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(fairgate::redis::start_problem(e, 5s), std::nullopt) << "what it cannot tell is no problem";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s) << "at once, not at the timeout";
}

TEST_F(RedisConnectionTest, CloseFailsWaitingCommands) {
  ConnectionOptions o;
  o.endpoint.port = 1;
  auto c = connect(o);
  std::promise<Result> done;
  c->exec(
      {"PING"},
      [&](boost::system::error_code ec, Reply r) {
        done.set_value({ec, std::move(r)});
      },
      10s);
  c->close();
  auto fut = done.get_future();
  ASSERT_EQ(fut.wait_for(2s), std::future_status::ready);
  EXPECT_EQ(fut.get().ec, Error::closed);
  EXPECT_EQ(exec(*c, {"PING"}).ec, Error::closed);
}

// Scripts are loaded on every (re)connect before anything that waited: after
// a restart (empty script cache) the first EVALSHA finds its script.
TEST_F(RedisConnectionTest, PreloadRunsBeforeEveryCommandOnEachConnect) {
  RedisServer server;
  const std::string script = "return 'preloaded'";
  auto sha = exec(*connect(server), {"SCRIPT", "LOAD", script}).reply.str;
  ASSERT_EQ(sha.size(), 40u);
  ConnectionOptions o;
  o.endpoint.port = server.port();
  o.reconnect_min = 10ms;
  auto c = Connection::create(io_.get_executor(), o);
  connections_.push_back(c);
  c->set_preload({{"SCRIPT", "LOAD", script}});
  ASSERT_EQ(exec(*connect(server), {"SCRIPT", "FLUSH"}).reply.str, "OK");
  // Queued before the connection exists: it must still run after the preload.
  std::promise<Result> first;
  c->exec(
      {"EVALSHA", sha, "0"},
      [&](boost::system::error_code ec, Reply r) {
        first.set_value({ec, std::move(r)});
      },
      5s);
  c->start();
  auto r = first.get_future().get();
  ASSERT_FALSE(r.ec) << r.ec.message();
  EXPECT_EQ(r.reply.str, "preloaded") << r.reply.excerpt();
  // Redis restarts (script cache empty); the reconnect preloads again.
  server.restart();
  auto again = exec(*c, {"EVALSHA", sha, "0"}, 5s);
  ASSERT_FALSE(again.ec) << again.ec.message();
  EXPECT_EQ(again.reply.str, "preloaded") << again.reply.excerpt();
}

// While a command waits, the reconnect backoff never exceeds its timeout: once
// Redis is back, the next command goes through at once, although the backoff
// had grown to reconnect_max.
TEST_F(RedisConnectionTest, AWaitingCommandBringsTheReconnectForward) {
  RedisServer server;
  ConnectionOptions o;
  o.endpoint.port = server.port();
  o.reconnect_min = 20ms;
  o.reconnect_max = 5s;
  auto c = connect(o);
  ASSERT_FALSE(exec(*c, {"PING"}, 2s).ec);
  server.kill_hard();
  std::this_thread::sleep_for(1500ms);  // failed attempts double the backoff: 20, 40, ... 640, 1280 ms
  server.start_again();
  const auto t0 = std::chrono::steady_clock::now();
  auto r = exec(*c, {"PING"}, 1s);
  EXPECT_FALSE(r.ec) << r.ec.message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 600ms);
}

}  // namespace
