// `fairgate serve --redis redis://[USER:PASSWORD@]HOST:PORT/DB` against a
// real redis-server: a database the server does not have, a refused password
// or a missing one is an error at start (exit 1, the server's reason), never
// a silent database 0 or a server that starts and retries for ever.
#include "support/redis_server.hpp"

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace {

using fairgate::test::RedisServer;

struct Outcome {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

Outcome run_fairgate(const std::string& args) {
  Outcome r;
  // A server that starts instead of refusing runs until the timeout (exit 124).
  const std::string cmd = "timeout 30 " + std::string(FAIRGATE_BIN) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), p) != nullptr) r.output += buf.data();
  const int status = ::pclose(p);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

TEST(ServeRedisDatabase, ADatabaseTheServerLacksIsAnErrorAtStart) {
  RedisServer server({"--databases", "16"});
  const std::string where = "127.0.0.1:" + std::to_string(server.port());
  const Outcome r =
      run_fairgate("serve --listen 127.0.0.1:0 --limiter chat=3 --redis redis://" + where + "/99");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.output, "fairgate serve: error: Redis at " + where +
                          ": database 99 cannot be selected: ERR DB index is out of range\n");
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
    const Outcome r =
        run_fairgate("serve --listen 127.0.0.1:0 --limiter chat=3 --redis redis://" + userinfo + where);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_EQ(r.output, "fairgate serve: error: Redis at " + where + line + "\n");
  }
}

}  // namespace
