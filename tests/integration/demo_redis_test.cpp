// `fairgate demo --redis`: the seeds' story across two real `fairgate serve`
// processes (children of the demo) on a real redis-server, the same binary
// users run. The demo checks its own invariants and says so in its exit code.
#include "support/redis_server.hpp"
#include "support/test_pki.hpp"

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace {

using fairgate::test::RedisServer;

struct DemoRun {
  int exit_code = -1;
  std::string output;  ///< stdout and stderr
};

DemoRun run_demo(const std::string& args, const std::string& url = RedisServer::shared().url()) {
  const std::string command =
      std::string(FAIRGATE_BIN) + " demo --redis '" + url + "' " + args + " --no-color 2>&1";
  DemoRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 4096> buffer{};
  std::size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) run.output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  return run;
}

/// Keys left behind by demo runs (each run deletes its own prefix when it ends).
std::string demo_keys(const RedisServer& server = RedisServer::shared()) {
  return server.command({"EVAL", "return #redis.call('KEYS', ARGV[1])", "0", "fairgate-demo-*"});
}

TEST(DemoRedis, TheStoryHoldsAcrossTwoProcesses) {
  const DemoRun run = run_demo("--speed 20 --quiet");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("two `fairgate serve` processes"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("FIFO held:         yes"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("limiter at end:    in use 0, queued 0"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("\nAll invariants held"), std::string::npos) << run.output;
  EXPECT_EQ(demo_keys(), "0");
}

TEST(DemoRedis, EveryoneServedInArrivalOrder) {
  const DemoRun run = run_demo("--users 40 --seats 5 --max-wait 5m --speed 50 --quiet");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("users:             40 arrived, 40 got a seat, 0 busy"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("\nAll invariants held"), std::string::npos) << run.output;
}

// The same over TLS: a TLS-only redis-server (--port 0 --tls-port), the
// demo's gateways and its own bookkeeping on rediss:// with the test CA.
TEST(DemoRedis, OverTls) {
  fairgate::test::TestPki pki;
  RedisServer::Options o;
  o.tls = RedisServer::Tls{};
  o.tls->cert_file = pki.file("server.crt");
  o.tls->key_file = pki.file("server.key");
  o.tls->ca_file = pki.file("ca.crt");
  RedisServer server(o);
  ASSERT_EQ(server.url().rfind("rediss://", 0), 0u);
  const DemoRun run = run_demo("--speed 20 --quiet", server.url());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("\nAll invariants held"), std::string::npos) << run.output;
  EXPECT_EQ(demo_keys(server), "0") << "the demo removed its keys over TLS";
  // A CA that did not sign the server's certificate: one clear line, exit 1.
  const DemoRun bad = run_demo("--speed 20 --quiet", "rediss://127.0.0.1:" + std::to_string(server.port()) +
                                                         "?tls_ca_file=" + pki.file("other-ca.crt"));
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("TLS certificate verification failed"), std::string::npos) << bad.output;
}

}  // namespace
