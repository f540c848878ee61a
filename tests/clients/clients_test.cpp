// tests/clients/clients_test.cpp — the Python and Node clients (clients/)
// against real `fairgate serve` processes (ctest -L clients).
//
// This binary owns the servers: `fairgate serve` on free loopback ports, on
// the memory backend or on a real redis-server started here
// (tests/support/redis_server.hpp). The clients are driven by
// coordinator.py, which starts one puppet process per client kind (Python
// blocking, Python asyncio, Node) and judges from the clients' own
// timestamps and the server's status; it exits 1 on a failed check. Every
// server is stopped with SIGTERM and must exit 0; only pids started here are
// signalled; every wait is bounded.
#include "serve/harness.hpp"
#include "support/redis_server.hpp"

#include <gtest/gtest.h>

#include <signal.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace fairgate::test;

const std::string kDir = CLIENTS_TEST_DIR;

/// The limiters every scenario uses: cap 3 (fifo, cap), cap 1 (release), and
/// one of each rejection (reasons).
std::string config(const std::string& server_extra = "") {
  return "[server]\n"
         "keepalive_ms = 500\n" +
         server_extra +
         "[limiters.fifo]\nmax_concurrent = 3\nmax_wait_ms = 60000\n"
         "[limiters.cap]\nmax_concurrent = 3\nmax_wait_ms = 60000\n"
         "[limiters.rel]\nmax_concurrent = 1\nmax_wait_ms = 60000\n"
         "[limiters.r-tmo]\nmax_concurrent = 1\n"
         "[limiters.r-full]\nmax_concurrent = 1\nmax_queue = 1\n"
         "[limiters.r-off]\nmax_concurrent = 1\nenabled = false\nwhen_disabled = \"reject\"\n";
}

struct Servers {
  Servers() = default;
  Servers(Servers&&) = default;
  Servers& operator=(Servers&&) = delete;
  std::vector<std::unique_ptr<Serve>> list;
  std::string urls() const {
    std::string out;
    for (const auto& s : list) out += (out.empty() ? "" : ",") + s->url();
    return out;
  }
  ~Servers() {
    for (auto& s : list) EXPECT_EQ(s->terminate(), 0) << "SIGTERM must end fairgate serve with exit code 0";
  }
};

Servers memory_server(const std::string& server_extra = "") {
  Servers s;
  s.list.push_back(std::make_unique<Serve>(config(server_extra), std::vector<std::string>{}));
  return s;
}

/// `n` instances sharing one redis-server (each test its own key prefix).
Servers redis_servers(int n, const std::string& test) {
  Servers s;
  auto& redis = RedisServer::shared();
  for (int i = 0; i < n; ++i) {
    const std::string extra = "[redis]\nkey_prefix = \"clients-" + test + "\"\n";
    s.list.push_back(std::make_unique<Serve>(
        config() + extra,
        std::vector<std::string>{"--redis", redis.url(), "--instance", test + "-" + std::to_string(i)}));
  }
  return s;
}

/// Runs coordinator.py; `on_line` sees each line as it comes.
ClientRun coordinate(const std::string& scenario, const Servers& servers, const std::string& limiter,
                     std::vector<std::string> extra = {},
                     const std::function<void(const std::string&)>& on_line = {}) {
  std::vector<std::string> argv{PYTHON_BIN,     kDir + "/coordinator.py",
                                scenario,       "--urls",
                                servers.urls(), "--limiter",
                                limiter,        "--node",
                                NODE_BIN};
  argv.insert(argv.end(), extra.begin(), extra.end());
  if (kSanitized) ::setenv("FAIRGATE_CLIENTS_SLOW", "4", 1);
  Child child(argv, true);
  ClientRun run;
  std::string line;
  const auto deadline = Clock::now() + (kSanitized ? 400s : 200s);
  while (Clock::now() < deadline && !child.eof()) {
    if (!child.read_line(line, 1s)) continue;
    run.output += line + "\n";
    if (on_line) on_line(line);
  }
  if (!child.eof()) run.output += "(the coordinator did not finish in time)\n";
  run.exit_code = child.wait(10s);
  return run;
}

#define SKIP_WITHOUT_TOOLS()                                                      \
  if (std::string_view(PYTHON_BIN).empty() || std::string_view(NODE_BIN).empty()) \
  GTEST_SKIP() << "python3 or node not found at configure time"

// --- memory backend -------------------------------------------------------------

TEST(ClientsMemory, FifoAcrossPythonSyncAsyncAndNode) {
  SKIP_WITHOUT_TOOLS();
  auto servers = memory_server();
  EXPECT_CLIENT_OK(coordinate("fifo", servers, "fifo"));
}

TEST(ClientsMemory, NeverMoreThanThreeHoldersByClientClocksAndStatus) {
  SKIP_WITHOUT_TOOLS();
  auto servers = memory_server();
  EXPECT_CLIENT_OK(coordinate("cap", servers, "cap"));
}

TEST(ClientsMemory, ReleaseOnExceptionAbortKillAndKeyboardInterrupt) {
  SKIP_WITHOUT_TOOLS();
  auto servers = memory_server();
  EXPECT_CLIENT_OK(coordinate("release", servers, "rel"));
}

TEST(ClientsMemory, RejectionReasonsMappedInEveryClient) {
  SKIP_WITHOUT_TOOLS();
  auto servers = memory_server();
  EXPECT_CLIENT_OK(coordinate("reasons", servers, "r"));
}

/// SIGTERM while clients wait and hold: waiters hear `unavailable`, the holder
/// learns its permit is lost; a 4th waiter from one address is refused first.
TEST(ClientsMemory, ShutdownEndsWaitersWithUnavailableAndTellsTheHolder) {
  SKIP_WITHOUT_TOOLS();
  auto servers = memory_server("max_waiters_per_client = 3\n");
  Serve& server = *servers.list[0];
  int code = -100;
  const auto run = coordinate("shutdown", servers, "rel", {}, [&](const std::string& line) {
    if (line == "ACTION sigterm") code = server.terminate();
  });
  EXPECT_CLIENT_OK(run);
  EXPECT_EQ(code, 0) << "SIGTERM must end fairgate serve with exit code 0";
  servers.list.clear();
}

// --- Redis: two instances share each limiter --------------------------------------

TEST(ClientsRedis, FifoAcrossTwoInstancesAndBothLanguages) {
  SKIP_WITHOUT_TOOLS();
  auto servers = redis_servers(2, "fifo");
  EXPECT_CLIENT_OK(coordinate("fifo", servers, "fifo"));
}

TEST(ClientsRedis, NeverMoreThanThreeHoldersAcrossTwoInstances) {
  SKIP_WITHOUT_TOOLS();
  auto servers = redis_servers(2, "cap");
  EXPECT_CLIENT_OK(coordinate("cap", servers, "cap"));
}

TEST(ClientsRedis, ReleaseOnExceptionAbortKillAndKeyboardInterrupt) {
  SKIP_WITHOUT_TOOLS();
  auto servers = redis_servers(2, "release");
  EXPECT_CLIENT_OK(coordinate("release", servers, "rel"));
}

TEST(ClientsRedis, RejectionReasonsMappedInEveryClient) {
  SKIP_WITHOUT_TOOLS();
  auto servers = redis_servers(1, "reasons");
  EXPECT_CLIENT_OK(coordinate("reasons", servers, "r"));
}

ClientRun run_script(const std::vector<std::string>& argv) {
  Child child(argv, true);
  ClientRun run;
  std::string line;
  const auto deadline = Clock::now() + 300s;
  while (Clock::now() < deadline && !child.eof()) {
    if (child.read_line(line, 1s)) run.output += line + "\n";
  }
  run.exit_code = child.wait(10s);
  return run;
}

// --- rate limits -----------------------------------------------------------------------

/// rate_limit / refund / rate_rules in Python (sync and asyncio) and Node:
/// exactly 3 pass, the 4th is refused, a refund of 1 lets one more through.
TEST(ClientsRateLimit, PythonAndNodeCheckRefundAndList) {
  SKIP_WITHOUT_TOOLS();
  Serve server("[ratelimit.cl]\nalgorithm = \"gcra\"\nrate = 3\nperiod_ms = 600000\n", {});
  EXPECT_CLIENT_OK(run_script({PYTHON_BIN, kDir + "/ratelimit_check.py", server.url()}));
  EXPECT_CLIENT_OK(run_script({NODE_BIN, kDir + "/ratelimit_check.mjs", server.url()}));
  EXPECT_EQ(server.terminate(), 0);
}

// --- the OpenAPI document -----------------------------------------------------------

/// docs/openapi.yaml against a running server: every operation called, every
/// answer documented and valid, 405 + Allow = the documented methods per path.
TEST(ClientsOpenApi, DocumentMatchesTheRunningServer) {
  SKIP_WITHOUT_TOOLS();
  Serve server(
      "admin_token = \"oa-token\"\n"
      "[limiters.oa]\nmax_concurrent = 1\n"
      "[limiters.oa-off]\nmax_concurrent = 1\nenabled = false\nwhen_disabled = \"reject\"\n"
      "[ratelimit.oa-rl]\nalgorithm = \"gcra\"\nrate = 2\nperiod_ms = 600000\n"
      "[[route]]\npath = \"/v1/chat/completions\"\nupstream = \"http://127.0.0.1:1\"\nlimiter = \"oa\"\n"
      "tenant_header = \"x-user-id\"\n",
      {});
  const auto run =
      run_script({PYTHON_BIN, kDir + "/openapi_check.py", "--url", server.url(), "--token", "oa-token"});
  EXPECT_CLIENT_OK(run);
  EXPECT_EQ(server.terminate(), 0);
}

// --- packaging of the clients ----------------------------------------------------

/// `pip install ./clients/python` works offline (Debian's python3 and venv).
TEST(ClientsPackaging, PipInstallIntoAFreshVenvOfflineThenAcquire) {
  SKIP_WITHOUT_TOOLS();
  auto servers = memory_server();
  const auto run = run_script(
      {"/bin/bash", kDir + "/pip_install_check.sh", PYTHON_BIN, REPO_DIR, servers.list[0]->url(), "rel"});
  EXPECT_CLIENT_OK(run);
}

/// index.d.ts type-checks a strict TypeScript program, and its `await using`
/// releases the permit at the end of the block, also when the block throws.
TEST(ClientsPackaging, TypeScriptTypesCompileAndAwaitUsingReleases) {
  SKIP_WITHOUT_TOOLS();
  auto servers = memory_server();
  const auto run =
      run_script({"/bin/bash", kDir + "/types_check.sh", NODE_BIN, servers.list[0]->url(), "rel"});
  if (run.exit_code == 77) {
    const char* require = std::getenv("FAIRGATE_REQUIRE_SDK");
    if (require == nullptr || std::string_view(require) != "1") GTEST_SKIP() << run.output;
  }
  EXPECT_CLIENT_OK(run);
}

}  // namespace
