// tests/examples/examples_test.cpp — the examples (ctest -L examples).
//
//  * every config in examples/config/ and packaging/fairgate.toml starts a
//    real `fairgate serve` (on a real redis-server for redis.toml) that serves
//    the limiters and routes the file declares, and stops with exit code 0;
//    a broken copy exits 2 with one line naming the field;
//  * examples/python-rag/app.py against a real `fairgate serve`
//    (python_rag_check.py).
// Only pids started here are signalled; every wait is bounded.
#include "serve/harness.hpp"
#include "support/redis_server.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace fairgate::test;

const std::string kRepo = REPO_DIR;
const std::string kHere = kRepo + "/tests/examples";

ClientRun run_python(const std::vector<std::string>& args) {
  std::vector<std::string> argv{PYTHON_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  Child child(argv, true);
  ClientRun run;
  std::string line;
  const auto deadline = Clock::now() + (kSanitized ? 240s : 120s);
  while (Clock::now() < deadline && !child.eof()) {
    if (child.read_line(line, 1s)) run.output += line + "\n";
  }
  run.exit_code = child.wait(10s);
  return run;
}

#define SKIP_WITHOUT_PYTHON() \
  if (std::string_view(PYTHON_BIN).empty()) GTEST_SKIP() << "python3 not found at configure time"

/// Starts `fairgate serve --config FILE` (+ args) on a free port, runs config_check.py, stops it.
void expect_config_serves(const std::string& file, const std::vector<std::string>& extra,
                          const std::vector<std::string>& check_args) {
  std::vector<std::string> argv{FAIRGATE_BIN, "serve", "--config", file, "--listen", "127.0.0.1:0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Listening server(argv, "fairgate serve --config " + file);
  std::vector<std::string> args{kHere + "/config_check.py", server.url()};
  args.insert(args.end(), check_args.begin(), check_args.end());
  EXPECT_CLIENT_OK(run_python(args));
  EXPECT_EQ(server.terminate(), 0) << file << ": SIGTERM must end fairgate serve with exit code 0";
}

TEST(ExamplesConfig, MemoryConfigServesItsLimiters) {
  SKIP_WITHOUT_PYTHON();
  expect_config_serves(kRepo + "/examples/config/memory.toml", {}, {"--limiters", "chat,document-upload"});
}

TEST(ExamplesConfig, RedisConfigServesItsLimitersOnARealRedis) {
  SKIP_WITHOUT_PYTHON();
  // The file's url is a placeholder; --redis points it at this test's redis-server (flags win).
  expect_config_serves(kRepo + "/examples/config/redis.toml",
                       {"--redis", RedisServer::shared().url(), "--instance", "examples-1"},
                       {"--limiters", "chat,document-upload", "--redis", "up"});
}

TEST(ExamplesConfig, GatewayConfigServesItsRoutes) {
  SKIP_WITHOUT_PYTHON();
  expect_config_serves(kRepo + "/examples/config/gateway.toml", {},
                       {"--limiters", "chat,embeddings", "--route", "/v1/chat/completions"});
}

TEST(ExamplesConfig, PackagedConfigServesChatAndDocumentUpload) {
  SKIP_WITHOUT_PYTHON();
  expect_config_serves(kRepo + "/packaging/fairgate.toml", {}, {"--limiters", "chat,document-upload"});
}

/// The check above can fail: a typo in a copy of memory.toml is refused at start.
TEST(ExamplesConfig, BrokenCopyExitsTwoNamingTheField) {
  std::ifstream in(kRepo + "/examples/config/memory.toml");
  std::stringstream text;
  text << in.rdbuf();
  const std::string broken =
      std::regex_replace(text.str(), std::regex("max_concurrent = 3"), "max_concurent = 3");
  ASSERT_NE(broken, text.str());
  TempConfig config(broken);
  Child child({FAIRGATE_BIN, "serve", "--config", config.path(), "--listen", "127.0.0.1:0"}, true);
  std::string out, line;
  while (child.read_line(line, 10s)) out += line + "\n";
  EXPECT_EQ(child.wait(10s), 2) << out;
  EXPECT_EQ(out, "fairgate serve: limiters.chat.max_concurent: unknown key\n");
}

TEST(ExamplesPythonRag, StreamsAnswersRejectsWithSeedEventsReleasesWhenTheBrowserLeaves) {
  SKIP_WITHOUT_PYTHON();
  Serve server("[limiters.rag]\nmax_concurrent = 1\nmax_wait_ms = 60000\n", {});
  EXPECT_CLIENT_OK(
      run_python({kHere + "/python_rag_check.py", "--fairgate", server.url(), "--limiter", "rag"}));
  EXPECT_EQ(server.terminate(), 0);
}

}  // namespace
