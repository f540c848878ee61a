// tests/gateway/gateway_test.cpp — the gateway of `fairgate serve` end to end
// (ctest -L gateway).
//
// Starts a real `fairgate mock-llm` (the model server, with its own
// concurrency ceiling) and real `fairgate serve` gateways with [[route]]s in
// front of it, on free loopback ports (memory backend, or a real
// redis-server), and drives them with gateway_client.mjs — the SDK scenarios
// through the official `openai` npm package. The mock's own counters decide
// the important checks: it must never answer 429 (the gateway never lets
// more than the cap through), and it must see the aborts of clients that
// left. Every process is stopped with SIGTERM and must exit 0.
#include "serve/harness.hpp"
#include "support/redis_server.hpp"

#include <netinet/in.h>
#include <sys/socket.h>

#include <filesystem>

namespace {

using namespace fairgate::test;

/// The openai package comes from `npm ci` (scripts/test.sh); without it the
/// SDK tests skip, unless FAIRGATE_REQUIRE_SDK=1 makes that a failure.
#define SKIP_WITHOUT_SDK()                                                                        \
  SKIP_WITHOUT_NODE();                                                                            \
  if (!std::filesystem::exists(std::string(GATEWAY_DIR) + "/node_modules/openai/package.json")) { \
    const char* require = std::getenv("FAIRGATE_REQUIRE_SDK");                                    \
    if (require != nullptr && std::string_view(require) == "1")                                   \
      FAIL() << "the openai npm package is missing: npm ci --prefix " GATEWAY_DIR;                \
    GTEST_SKIP() << "the openai npm package is not installed (npm ci --prefix " GATEWAY_DIR ")";  \
  }

/// `fairgate mock-llm` on a free port: 200 tokens/s, ceiling `ceiling`.
class MockLlm : public Listening {
 public:
  explicit MockLlm(int ceiling)
      : Listening({FAIRGATE_BIN, "mock-llm", "--listen", "127.0.0.1:0", "--tokens-per-second", "200",
                   "--tokens", "20", "--max-concurrent", std::to_string(ceiling)},
                  "fairgate mock-llm") {}
};

/// A loopback port nothing listens on (bound, then closed).
int closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

/// Limiter "chat" (cap 3, long wait) on the OpenAI path; limiter "one" (cap 1,
/// max wait 300 ms) behind the /one, /none, /named and /seed prefixes.
std::string gateway_config(const std::string& mock) {
  const std::string chat = mock + "/v1/chat/completions";
  return "[server]\n"
         "keepalive_ms = 500\n"
         "[limiters.chat]\n"
         "max_concurrent = 3\n"
         "max_wait_ms = 20000\n"
         "[limiters.one]\n"
         "max_concurrent = 1\n"
         "max_wait_ms = 300\n"
         "[[route]]\n"
         "path = \"/v1/chat/completions\"\n"
         "upstream = \"" +
         mock +
         "\"\n"
         "limiter = \"chat\"\n"
         "tenant_header = \"x-user-id\"\n"
         "[[route]]\n"
         "path = \"/one/v1/chat/completions\"\n"
         "upstream = \"" +
         chat +
         "\"\n"
         "limiter = \"one\"\n"
         "[[route]]\n"
         "path = \"/none/v1/chat/completions\"\n"
         "upstream = \"" +
         chat +
         "\"\n"
         "limiter = \"one\"\n"
         "queue_events = \"none\"\n"
         "[[route]]\n"
         "path = \"/named/v1/chat/completions\"\n"
         "upstream = \"" +
         chat +
         "\"\n"
         "limiter = \"one\"\n"
         "queue_events = \"named\"\n"
         "max_wait_ms = 5000\n"
         "[[route]]\n"
         "path = \"/seed/v1/chat/completions\"\n"
         "upstream = \"" +
         chat +
         "\"\n"
         "limiter = \"one\"\n"
         "queue_events = \"seed\"\n"
         "[[route]]\n"
         "path = \"/raw\"\n"
         "upstream = \"" +
         mock +
         "/\"\n"
         "limiter = \"chat\"\n"
         "[[route]]\n"
         "path = \"/down/v1/chat/completions\"\n"
         "upstream = \"http://127.0.0.1:" +
         std::to_string(closed_port()) +
         "/v1/chat/completions\"\n"
         "limiter = \"chat\"\n";
}

ClientRun run_client(const std::string& scenario, const std::string& gateways, const std::string& mock,
                     const std::vector<std::string>& args = {}) {
  std::vector<std::string> argv{
      std::string(GATEWAY_DIR) + "/gateway_client.mjs", scenario, "--gateway", gateways, "--mock", mock};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_node(argv);
}

TEST(GatewayMemory, OpenAiSdkTenConcurrentStreamsThroughCapThreeMockNever429s) {
  SKIP_WITHOUT_SDK();
  MockLlm mock(3);
  Serve gateway(gateway_config(mock.url()), {});
  const auto run = run_client("sdk", gateway.url(), mock.url(), {"--clients", "10", "--cap", "3"});
  EXPECT_CLIENT_OK(run);
  EXPECT_EQ(gateway.terminate(), 0);
  EXPECT_EQ(mock.terminate(), 0);
}

TEST(GatewayMemory, OpenAiSdkRaisesRateLimitErrorForQueueTimeouts) {
  SKIP_WITHOUT_SDK();
  MockLlm mock(3);
  Serve gateway(gateway_config(mock.url()), {});
  const auto run = run_client("timeouts", gateway.url(), mock.url());
  EXPECT_CLIENT_OK(run);
  EXPECT_EQ(gateway.terminate(), 0);
  EXPECT_EQ(mock.terminate(), 0);
}

TEST(GatewayMemory, ReverseProxyPassThroughErrorsDisconnectsEventsPoolingTenants) {
  SKIP_WITHOUT_NODE();
  MockLlm mock(3);
  Serve gateway(gateway_config(mock.url()), {});
  const auto run = run_client("proxy", gateway.url(), mock.url());
  EXPECT_CLIENT_OK(run);
  EXPECT_EQ(gateway.terminate(), 0);
  EXPECT_EQ(mock.terminate(), 0);
}

TEST(GatewayRedis, TwoGatewaysOneCapOpenAiSdkTenStreamsMockNever429s) {
  SKIP_WITHOUT_SDK();
  MockLlm mock(3);
  const std::string redis = RedisServer::shared().url();
  Serve a(gateway_config(mock.url()), {"--redis", redis, "--instance", "gw-a"});
  Serve b(gateway_config(mock.url()), {"--redis", redis, "--instance", "gw-b"});
  const auto run = run_client("sdk", a.url() + "," + b.url(), mock.url(), {"--clients", "10", "--cap", "3"});
  EXPECT_CLIENT_OK(run);
  EXPECT_EQ(a.terminate(), 0);
  EXPECT_EQ(b.terminate(), 0);
  EXPECT_EQ(mock.terminate(), 0);
}

}  // namespace
