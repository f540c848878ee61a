// `fairgate demo --redis`: the seeds' story across two real `fairgate serve`
// processes (children of the demo) on a real redis-server, the same binary
// users run. The demo checks its own invariants and says so in its exit code.
#include "support/redis_server.hpp"

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

DemoRun run_demo(const std::string& args) {
  const std::string command = std::string(FAIRGATE_BIN) + " demo --redis " + RedisServer::shared().url() +
                              " " + args + " --no-color 2>&1";
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
std::string demo_keys() {
  return RedisServer::shared().command(
      {"EVAL", "return #redis.call('KEYS', ARGV[1])", "0", "fairgate-demo-*"});
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

}  // namespace
