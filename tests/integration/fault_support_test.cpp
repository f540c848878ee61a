// The fault-injection support itself (tests/support): RedisServer's process
// controls, TcpProxy and NetNamespace, against real redis-server and
// redis-cli processes. Timing bounds are loose (2 cores, ASan, TSan): a lower
// bound is what the fault guarantees, an upper bound only catches a hang.
#include "support/netns.hpp"
#include "support/redis_server.hpp"
#include "support/tcp_proxy.hpp"
#include "support/wait.hpp"

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

using fairgate::test::NetNamespace;
using fairgate::test::ProcessResult;
using fairgate::test::RedisServer;
using fairgate::test::run_process;
using fairgate::test::TcpProxy;
using fairgate::test::wait_until;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::chrono::milliseconds since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t);
}

bool is_error(const std::string& reply) { return reply.rfind("(error)", 0) == 0; }

// A blocking hiredis connection that stays open across commands (what the
// proxy's controls act on). One thread at a time.
class Client {
 public:
  Client(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout = 5s) {
    const timeval tv{static_cast<time_t>(timeout.count() / 1000),
                     static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
    c_ = redisConnectWithTimeout(host.c_str(), port, tv);
    if (c_ && !c_->err) redisSetTimeout(c_, tv);
  }
  ~Client() {
    if (c_) redisFree(c_);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool connected() const { return c_ && !c_->err; }

  /// The reply as text; "(error) ..." for an error reply or an I/O error.
  std::string cmd(const std::vector<std::string>& args) {
    send(args);
    return receive();
  }
  /// Queues a command and writes it out (a pipeline: receive() later).
  void send(const std::vector<std::string>& args) {
    if (!connected()) return;
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    redisAppendCommandArgv(c_, static_cast<int>(args.size()), argv.data(), lens.data());
    for (int done = 0; !done;)
      if (redisBufferWrite(c_, &done) != REDIS_OK) return;
  }
  std::string receive() {
    if (!connected()) return "(error) io: " + std::string(c_ ? c_->errstr : "no context");
    void* r = nullptr;
    if (redisGetReply(c_, &r) != REDIS_OK || !r) return "(error) io: " + std::string(c_->errstr);
    auto* reply = static_cast<redisReply*>(r);
    std::string text;
    switch (reply->type) {
      case REDIS_REPLY_ERROR: text = "(error) " + std::string(reply->str, reply->len); break;
      case REDIS_REPLY_INTEGER: text = std::to_string(reply->integer); break;
      case REDIS_REPLY_NIL: text = "(nil)"; break;
      case REDIS_REPLY_ARRAY: text = "(array of " + std::to_string(reply->elements) + ")"; break;
      default: text = std::string(reply->str, reply->len);
    }
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 3) {  // pubsub: the count or the message
      const redisReply* last = reply->element[2];
      text = last->type == REDIS_REPLY_INTEGER ? std::to_string(last->integer)
                                               : std::string(last->str, last->len);
    }
    freeReplyObject(reply);
    return text;
  }

  /// The elements of an array reply, each in a readable form ("\"a\"", "7",
  /// "nil", "[1]"); empty for any other reply.
  std::vector<std::string> elements(const std::vector<std::string>& args) {
    send(args);
    void* r = nullptr;
    if (!connected() || redisGetReply(c_, &r) != REDIS_OK || !r) return {};
    auto* reply = static_cast<redisReply*>(r);
    std::vector<std::string> out;
    if (reply->type == REDIS_REPLY_ARRAY) {
      for (std::size_t i = 0; i < reply->elements; ++i) out.push_back(describe(reply->element[i]));
    }
    freeReplyObject(reply);
    return out;
  }

 private:
  static std::string describe(const redisReply* r) {
    switch (r->type) {
      case REDIS_REPLY_INTEGER: return std::to_string(r->integer);
      case REDIS_REPLY_NIL: return "nil";
      case REDIS_REPLY_ARRAY: {
        std::string s = "[";
        for (std::size_t i = 0; i < r->elements; ++i) s += (i ? "," : "") + describe(r->element[i]);
        return s + "]";
      }
      default: return "\"" + std::string(r->str, r->len) + "\"";
    }
  }

  redisContext* c_ = nullptr;
};

// --- RedisServer: the process controls.

TEST(RedisServerFaults, RestartWithAppendonlyKeepsPortAndData) {
  RedisServer server(RedisServer::Options{.appendonly = true});
  ASSERT_EQ(server.command({"SET", "k", "survives"}), "OK");
  const auto port = server.port();
  const pid_t before = server.pid();
  server.restart();
  EXPECT_EQ(server.port(), port);
  EXPECT_NE(server.pid(), before) << "a new process";
  EXPECT_TRUE(server.running());
  EXPECT_EQ(server.command({"GET", "k"}), "survives") << "the AOF (fsync always) was read back";
  EXPECT_EQ(server.command({"CONFIG", "GET", "appendonly"}), "appendonly\nyes");
}

TEST(RedisServerFaults, RestartWithoutAppendonlyLosesData) {
  RedisServer server(RedisServer::Options{});
  ASSERT_EQ(server.command({"SET", "k", "lost"}), "OK");
  const auto port = server.port();
  server.restart();
  EXPECT_EQ(server.port(), port);
  EXPECT_EQ(server.command({"GET", "k"}), "(nil)");
}

TEST(RedisServerFaults, StoppedServerTimesOutUntilContinued) {
  RedisServer server(RedisServer::Options{});
  ASSERT_EQ(server.command({"PING"}), "PONG");
  server.stop_process();
  server.stop_process();  // idempotent
  EXPECT_TRUE(server.running()) << "stopped is not gone";

  const auto t0 = Clock::now();
  const std::string timed_out = server.command({"PING"}, 300ms);
  EXPECT_TRUE(is_error(timed_out)) << timed_out;
  EXPECT_GE(since(t0), 250ms) << "it waited for the reply";
  EXPECT_LT(since(t0), 5s) << "and gave up after its timeout";

  // A command sent while it is stopped is answered once it continues.
  auto pending = std::async(std::launch::async, [&] { return server.command({"PING"}, 20s); });
  EXPECT_EQ(pending.wait_for(500ms), std::future_status::timeout) << "nothing answers a stopped server";
  server.continue_process();
  server.continue_process();  // idempotent
  ASSERT_EQ(pending.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(pending.get(), "PONG");
  EXPECT_EQ(server.command({"PING"}), "PONG");
}

TEST(RedisServerFaults, KillHardThenStartAgain) {
  RedisServer server(RedisServer::Options{});
  const pid_t pid = server.pid();
  const auto port = server.port();
  ASSERT_GT(pid, 0);
  EXPECT_THROW(server.start_again(), std::logic_error) << "it is running";
  server.kill_hard();
  EXPECT_FALSE(server.running());
  EXPECT_EQ(server.pid(), -1);
  EXPECT_EQ(::kill(pid, 0), -1) << "killed and reaped";
  const std::string refused = server.command({"PING"}, 1s);
  EXPECT_TRUE(is_error(refused)) << refused;
  server.kill_hard();  // idempotent

  server.start_again();
  EXPECT_TRUE(server.running());
  EXPECT_EQ(server.port(), port);
  EXPECT_EQ(server.command({"PING"}), "PONG");
}

TEST(RedisServerFaults, KillHardEndsAStoppedServer) {
  RedisServer server(RedisServer::Options{});
  server.stop_process();
  server.kill_hard();
  EXPECT_FALSE(server.running());
  server.restart();  // from "killed"
  EXPECT_EQ(server.command({"PING"}), "PONG");
}

TEST(RedisServerFaults, DestructorEndsAStoppedServerAndRemovesItsDirectory) {
  pid_t pid = -1;
  std::string dir;
  {
    RedisServer server(RedisServer::Options{.appendonly = true});
    pid = server.pid();
    dir = server.dir();
    ASSERT_EQ(server.command({"SET", "k", "v"}), "OK");
    server.stop_process();
  }
  EXPECT_EQ(::kill(pid, 0), -1);
  EXPECT_EQ(errno, ESRCH) << "no process (nor zombie) left";
  EXPECT_NE(::access(dir.c_str(), F_OK), 0) << dir;
}

TEST(RedisServerFaults, DebugCommandOption) {
  RedisServer with(RedisServer::Options{});
  EXPECT_EQ(with.command({"DEBUG", "SLEEP", "0"}), "OK");
  RedisServer without(RedisServer::Options{.debug_command = false});
  EXPECT_TRUE(is_error(without.command({"DEBUG", "SLEEP", "0"})));
  // The plain constructor, as before: extra arguments, DEBUG from loopback.
  RedisServer secured({"--requirepass", "s3cret"});
  EXPECT_EQ(secured.command({"PING"}).rfind("(error) NOAUTH", 0), 0u) << secured.command({"PING"});
}

TEST(RedisServerPorts, ClusterPortsLeaveRoomForTheBusPort) {
  // redis-server --cluster-enabled exits at once on a port above 55535 (its
  // bus port, port + 10000, would not exist); about one in five ephemeral
  // ports is one, which made cluster tests fail to start now and then.
  for (int i = 0; i < 300; ++i) {
    const auto port = fairgate::test::free_loopback_cluster_port();
    ASSERT_LE(port, 55535) << "draw " << i;
    ASSERT_GT(port, 0);
  }
  RedisServer node(RedisServer::Options{.extra_args = {"--cluster-enabled", "yes"}, .cluster = true});
  EXPECT_EQ(node.command({"CLUSTER", "MYID"}).size(), 40u);
}

TEST(RedisServerPorts, AServerThatCannotStartSaysWhyFromItsLog) {
  // Our --port is overridden by one no cluster node may have: above 55535,
  // and free (a port in use would fail earlier, with another reason).
  std::uint16_t high = 0;
  for (int i = 0; i < 1000 && high <= 55535; ++i) high = fairgate::test::free_loopback_port();
  ASSERT_GT(high, 55535) << "no free ephemeral port above 55535 in 1000 draws";
  try {
    RedisServer bad(
        RedisServer::Options{.extra_args = {"--cluster-enabled", "yes", "--port", std::to_string(high)}});
    FAIL() << "started on port " << high << " with cluster mode on";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("could not start redis-server"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("port number too high"), std::string::npos) << e.what();
  }
}

// --- TcpProxy, in front of a real redis-server.

class TcpProxyTest : public ::testing::Test {
 protected:
  static RedisServer& redis() { return RedisServer::shared(); }
  std::unique_ptr<Client> client(std::chrono::milliseconds timeout = 5s) const {
    return std::make_unique<Client>("127.0.0.1", proxy_.port(), timeout);
  }
  // One PING's round trip through the proxy (on a connection already open).
  static std::chrono::milliseconds round_trip(Client& c) {
    const auto t0 = Clock::now();
    EXPECT_EQ(c.cmd({"PING"}), "PONG");
    return since(t0);
  }

  TcpProxy proxy_{redis().host(), redis().port()};
};

TEST_F(TcpProxyTest, ForwardsCommandsBothWays) {
  auto c = client();
  ASSERT_TRUE(c->connected());
  EXPECT_EQ(c->cmd({"PING"}), "PONG");
  EXPECT_EQ(c->cmd({"SET", "proxy:k", std::string(100'000, 'x')}), "OK") << "more than one chunk";
  EXPECT_EQ(c->cmd({"GET", "proxy:k"}).size(), 100'000u);
  EXPECT_EQ(redis().command({"STRLEN", "proxy:k"}), "100000") << "it reached the real server";
  EXPECT_EQ(proxy_.connections(), 1u);
  EXPECT_GT(proxy_.bytes_forwarded(), 200'000u);
  c.reset();
  EXPECT_TRUE(wait_until([&] { return proxy_.connections() == 0; })) << "a client's close is passed on";
}

TEST_F(TcpProxyTest, DelayAddsToEveryRoundTrip) {
  auto c = client();
  ASSERT_EQ(c->cmd({"PING"}), "PONG");
  proxy_.set_delay(200ms);
  const auto slow = round_trip(*c);
  EXPECT_GE(slow, 390ms) << "200 ms each way";
  EXPECT_LT(slow, 5s);
  proxy_.set_delay(0ms);
  EXPECT_LT(round_trip(*c), 350ms) << "back to no delay (it was 400+)";
}

TEST_F(TcpProxyTest, DelayKeepsOrderWhenItShrinks) {
  auto c = client();
  ASSERT_FALSE(is_error(c->cmd({"DEL", "proxy:order"})));
  proxy_.set_delay(300ms);
  c->send({"SET", "proxy:order", "first"});
  std::this_thread::sleep_for(50ms);
  proxy_.set_delay(0ms);
  c->send({"SET", "proxy:order", "second"});  // due at once, but behind "first"
  EXPECT_EQ(c->receive(), "OK");
  EXPECT_EQ(c->receive(), "OK");
  EXPECT_EQ(redis().command({"GET", "proxy:order"}), "second");
}

TEST_F(TcpProxyTest, StallHoldsTrafficUntilResume) {
  auto quick = client(300ms);
  auto c = client(20s);
  ASSERT_EQ(quick->cmd({"PING"}), "PONG");
  ASSERT_FALSE(is_error(c->cmd({"DEL", "proxy:stalled"})));
  proxy_.stall();
  proxy_.stall();  // idempotent

  const auto t0 = Clock::now();
  const std::string timed_out = quick->cmd({"PING"});
  EXPECT_TRUE(is_error(timed_out)) << timed_out;
  EXPECT_GE(since(t0), 250ms);
  EXPECT_EQ(proxy_.connections(), 2u) << "the connections stay open";

  // Client to server: held, not lost.
  auto pending = std::async(std::launch::async, [&] { return c->cmd({"SET", "proxy:stalled", "1"}); });
  EXPECT_EQ(pending.wait_for(500ms), std::future_status::timeout);
  EXPECT_EQ(redis().command({"GET", "proxy:stalled"}), "(nil)") << "it did not reach the server";
  proxy_.resume();
  proxy_.resume();  // idempotent
  ASSERT_EQ(pending.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(pending.get(), "OK");

  // Server to client: a message published while stalled arrives after resume().
  ASSERT_EQ(c->cmd({"SUBSCRIBE", "proxy:ch"}), "1");  // the subscribe reply's count
  proxy_.stall();
  EXPECT_EQ(redis().command({"PUBLISH", "proxy:ch", "held"}), "1");
  auto message = std::async(std::launch::async, [&] { return c->receive(); });
  EXPECT_EQ(message.wait_for(500ms), std::future_status::timeout);
  proxy_.resume();
  ASSERT_EQ(message.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(message.get(), "held");
}

TEST_F(TcpProxyTest, CutClosesEveryConnection) {
  auto a = client();
  auto b = client();
  ASSERT_EQ(a->cmd({"PING"}), "PONG");
  ASSERT_EQ(b->cmd({"PING"}), "PONG");
  proxy_.cut();
  EXPECT_EQ(proxy_.connections(), 0u) << "at once";
  proxy_.cut();  // idempotent
  const auto t0 = Clock::now();
  const std::string closed = a->cmd({"PING"});
  EXPECT_TRUE(is_error(closed)) << closed;
  EXPECT_LT(since(t0), 2s) << "closed, not timed out";
  EXPECT_TRUE(is_error(b->cmd({"PING"})));
  auto c = client();
  EXPECT_EQ(c->cmd({"PING"}), "PONG") << "new connections still work";
}

TEST_F(TcpProxyTest, RefuseClosesNewConnectionsAtOnce) {
  auto before = client();
  ASSERT_EQ(before->cmd({"PING"}), "PONG");
  proxy_.refuse(true);
  proxy_.refuse(true);  // idempotent
  auto refused = client();
  const auto t0 = Clock::now();
  const std::string closed = refused->cmd({"PING"});
  EXPECT_TRUE(is_error(closed)) << closed;
  EXPECT_LT(since(t0), 2s) << "closed at once, not timed out (5 s)";
  EXPECT_EQ(proxy_.connections(), 1u);
  EXPECT_EQ(before->cmd({"PING"}), "PONG") << "open connections are not affected";
  proxy_.refuse(false);
  EXPECT_EQ(client()->cmd({"PING"}), "PONG");
}

TEST_F(TcpProxyTest, MangleRepliesReplacesWholeRepliesOneForOneUntilStopped) {
  auto c = client();
  ASSERT_TRUE(c->connected());
  // A reply far longer than one read, so it reaches the proxy in pieces.
  const std::string big(200 * 1024, 'x');
  ASSERT_EQ(c->cmd({"SET", "mangle:big", big}), "OK");
  proxy_.mangle_replies(1.0, 7);
  int changed = 0;
  for (int i = 0; i < 40; ++i) changed += c->cmd({"PING"}) != "PONG";
  EXPECT_EQ(changed, 40);
  EXPECT_EQ(proxy_.replies_mangled(), 40u);
  // On but (almost) never firing: whole replies pass as they were, however cut.
  proxy_.mangle_replies(1e-12, 7);
  EXPECT_EQ(c->cmd({"GET", "mangle:big"}), big);
  // A pipeline: each reply replaced by exactly one, so the stream stays in step.
  proxy_.mangle_replies(0.5, 11);
  for (int i = 0; i < 50; ++i) c->send({"ECHO", "echo-" + std::to_string(i)});
  int kept = 0;
  for (int i = 0; i < 50; ++i) kept += c->receive() == "echo-" + std::to_string(i);
  // Only the replies to one command.
  proxy_.mangle_replies(1.0, 3, "echo");
  EXPECT_EQ(c->cmd({"PING"}), "PONG");
  EXPECT_NE(c->cmd({"ECHO", "x"}), "x");
  EXPECT_EQ(c->cmd({"PING"}), "PONG");
  proxy_.mangle_replies(0);
  EXPECT_EQ(c->cmd({"PING"}), "PONG") << "one reply per command, in order";
  EXPECT_EQ(c->cmd({"ECHO", "y"}), "y");
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, 50);
  EXPECT_EQ(proxy_.replies_mangled(), 40u + (50u - static_cast<unsigned>(kept)) + 1u);
  EXPECT_EQ(c->cmd({"DEL", "mangle:big"}), "1");
}

TEST_F(TcpProxyTest, MangleInnerReplacesOneFieldOfAnArrayReplyWithAnotherType) {
  auto c = client();
  ASSERT_TRUE(c->connected());
  c->cmd({"DEL", "mangle:list"});
  ASSERT_EQ(c->cmd({"RPUSH", "mangle:list", "a", "b", "c"}), "3");
  const std::vector<std::string> sound = c->elements({"LRANGE", "mangle:list", "0", "-1"});
  ASSERT_EQ(sound, (std::vector<std::string>{"\"a\"", "\"b\"", "\"c\""}));
  proxy_.mangle_replies(1.0, 9, "", fairgate::test::Mangling::inner);
  std::set<std::string> seen;
  for (int i = 0; i < 30; ++i) {
    const auto got = c->elements({"LRANGE", "mangle:list", "0", "-1"});
    ASSERT_EQ(got.size(), sound.size()) << "the frame stays: one element for one";
    int changed = 0;
    for (std::size_t k = 0; k < got.size(); ++k) {
      if (got[k] == sound[k]) continue;
      ++changed;
      seen.insert(got[k]);
      EXPECT_NE(got[k].front(), '"') << "a string becomes another type: " << got[k];
    }
    EXPECT_EQ(changed, 1);
  }
  EXPECT_EQ(seen, (std::set<std::string>{"nil", "[]", "[1]"})) << "each replacement of a string in turn";
  // A reply with nothing inside passes as it is, and is not counted.
  EXPECT_EQ(c->cmd({"PING"}), "PONG");
  EXPECT_EQ(proxy_.replies_mangled(), 30u);
  proxy_.mangle_replies(0);
  EXPECT_EQ(c->elements({"LRANGE", "mangle:list", "0", "-1"}), sound);
  EXPECT_EQ(c->cmd({"DEL", "mangle:list"}), "1");
}

TEST(TcpProxyLifetime, TargetRefusingClosesTheClient) {
  RedisServer gone(RedisServer::Options{});
  TcpProxy proxy(gone.host(), gone.port());
  gone.kill_hard();
  Client c("127.0.0.1", proxy.port());
  EXPECT_TRUE(is_error(c.cmd({"PING"})));
  EXPECT_TRUE(wait_until([&] { return proxy.connections() == 0; }));
}

TEST(TcpProxyLifetime, DestructorClosesOpenAndStalledConnections) {
  auto& redis = RedisServer::shared();
  std::optional<TcpProxy> proxy(std::in_place, redis.host(), redis.port());
  Client a("127.0.0.1", proxy->port());
  ASSERT_EQ(a.cmd({"PING"}), "PONG");
  proxy->set_delay(10s);
  a.send({"PING"});  // queued for 10 s
  proxy->stall();
  const auto t0 = Clock::now();
  proxy.reset();
  EXPECT_LT(since(t0), 2s) << "it does not wait for queued data";
  EXPECT_TRUE(is_error(a.receive()));
}

// --- NetNamespace: a child in its own network namespace, partitioned by nftables.

// `redis-cli -h host -p port ARGS...` inside the namespace, killed after `seconds`
// (redis-cli 7.0 has no connect timeout option).
ProcessResult redis_cli(const NetNamespace& ns, const RedisServer& server, int seconds,
                        std::vector<std::string> args) {
  std::vector<std::string> argv = ns.exec_prefix();
  const std::vector<std::string> cli{
      "timeout", std::to_string(seconds),      "redis-cli", "-h", ns.host_address(),
      "-p",      std::to_string(server.port())};
  argv.insert(argv.end(), cli.begin(), cli.end());
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv);
}

TEST(NetNamespace, ChildReachesTheHostUntilPartitioned) {
  REQUIRE_NETNS_OR_SKIP();
  NetNamespace ns;
  EXPECT_EQ(ns.name().rfind("fg" + std::to_string(::getpid()) + "n", 0), 0u) << ns.name();
  EXPECT_EQ(ns.exec_prefix().back(), ns.name());
  EXPECT_EQ(ns.host_address().rfind("10.213.", 0), 0u) << ns.host_address();
  RedisServer server(RedisServer::Options{.bind = {"127.0.0.1", ns.host_address()}});
  ASSERT_EQ(server.command({"PING"}), "PONG") << "still on loopback";

  auto ok = redis_cli(ns, server, 10, {"PING"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ok.out, "PONG\n");
  auto who = redis_cli(ns, server, 10, {"CLIENT", "INFO"});
  EXPECT_NE(who.out.find("addr=" + ns.ns_address() + ":"), std::string::npos) << "from inside: " << who.out;

  ns.partition();
  ns.partition();  // idempotent
  EXPECT_TRUE(ns.partitioned());
  const auto t0 = Clock::now();
  auto cut = redis_cli(ns, server, 2, {"PING"});
  EXPECT_NE(cut.exit_code, 0) << cut.out << cut.err;
  EXPECT_EQ(cut.out.find("PONG"), std::string::npos);
  EXPECT_EQ(cut.exit_code, 124) << "timed out (a drop, not a refusal): " << cut.err;
  EXPECT_GE(since(t0), 1500ms);
  EXPECT_EQ(server.command({"PING"}), "PONG") << "only the namespace is cut off";

  ns.heal();
  ns.heal();  // idempotent
  EXPECT_FALSE(ns.partitioned());
  auto healed = redis_cli(ns, server, 10, {"PING"});
  EXPECT_EQ(healed.exit_code, 0) << healed.err;
  EXPECT_EQ(healed.out, "PONG\n");
}

TEST(NetNamespace, PartitionStallsAnEstablishedConnection) {
  REQUIRE_NETNS_OR_SKIP();
  NetNamespace ns;
  RedisServer server(RedisServer::Options{.bind = {"127.0.0.1", ns.host_address()}});
  std::unique_ptr<Client> quick, inside, subscriber;
  ns.run_inside([&] {
    quick = std::make_unique<Client>(ns.host_address(), server.port(), 500ms);
    inside = std::make_unique<Client>(ns.host_address(), server.port(), 30s);
    subscriber = std::make_unique<Client>(ns.host_address(), server.port(), 30s);
  });
  ASSERT_EQ(quick->cmd({"PING"}), "PONG");
  ASSERT_EQ(inside->cmd({"CLIENT", "SETNAME", "inside"}), "OK");
  ASSERT_EQ(subscriber->cmd({"SUBSCRIBE", "netns:ch"}), "1");
  EXPECT_NE(server.command({"CLIENT", "LIST"}).find("addr=" + ns.ns_address()), std::string::npos)
      << "the socket belongs to the namespace";

  ns.partition();
  const std::string timed_out = quick->cmd({"PING"});
  EXPECT_TRUE(is_error(timed_out)) << timed_out;
  // Namespace to host: the SET does not arrive. Host to namespace: nor does the message.
  auto pending = std::async(std::launch::async, [&] { return inside->cmd({"SET", "netns:k", "late"}); });
  EXPECT_EQ(server.command({"PUBLISH", "netns:ch", "late"}), "1");
  auto message = std::async(std::launch::async, [&] { return subscriber->receive(); });
  EXPECT_EQ(pending.wait_for(1s), std::future_status::timeout) << "stalled, not closed";
  EXPECT_EQ(message.wait_for(1ms), std::future_status::timeout) << "stalled, not closed";
  EXPECT_EQ(server.command({"GET", "netns:k"}), "(nil)");
  EXPECT_NE(server.command({"CLIENT", "LIST"}).find("name=inside"), std::string::npos)
      << "the server still sees the connection";

  ns.heal();  // TCP retransmits the SET: the same connection goes on
  ASSERT_EQ(pending.wait_for(20s), std::future_status::ready);
  EXPECT_EQ(pending.get(), "OK");
  EXPECT_EQ(server.command({"GET", "netns:k"}), "late");
  ASSERT_EQ(message.wait_for(20s), std::future_status::ready);
  EXPECT_EQ(message.get(), "late");
}

// Whether `ip netns list` shows this namespace (lines are "NAME" or "NAME (id: N)").
bool netns_listed(const std::string& name) {
  const std::string listed = fairgate::test::run_checked({"ip", "netns", "list"});
  std::size_t at = 0;
  while (at < listed.size()) {
    const std::size_t end = std::min(listed.find_first_of(" \n", at), listed.size());
    if (listed.compare(at, end - at, name) == 0) return true;
    at = listed.find('\n', at);
    at = at == std::string::npos ? listed.size() : at + 1;
  }
  return false;
}

TEST(NetNamespace, DestructorRemovesNamespaceAndVeth) {
  REQUIRE_NETNS_OR_SKIP();
  std::string name, host_address;
  {
    NetNamespace a;
    NetNamespace b;
    name = a.name();
    host_address = a.host_address();
    EXPECT_NE(a.name(), b.name());
    EXPECT_NE(a.host_address(), b.host_address());
    a.partition();  // removed with it
    EXPECT_TRUE(netns_listed(name));
  }
  EXPECT_FALSE(netns_listed(name));
  EXPECT_EQ(fairgate::test::run_checked({"ip", "-o", "-4", "addr", "show", "to", host_address}), "")
      << "the host side went with it";
}

TEST(ProcessHelpers, RunCheckedReportsCommandAndStderr) {
  EXPECT_EQ(fairgate::test::run_checked({"echo", "hi"}), "hi\n");
  try {
    fairgate::test::run_checked({"ls", "/nonexistent-fairgate"});
    ADD_FAILURE() << "no throw";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("ls /nonexistent-fairgate"), std::string::npos) << what;
    EXPECT_NE(what.find("No such file"), std::string::npos) << what;
  }
  EXPECT_THROW(fairgate::test::run_process({"/nonexistent-fairgate-tool"}), std::runtime_error);
}

}  // namespace
