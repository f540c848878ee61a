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
#include "support/loopback.hpp"
#include "support/redis_server.hpp"
#include "support/test_pki.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/write.hpp>

#include <fmt/format.h>

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

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
int closed_port() { return fairgate::test::free_loopback_port(); }

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

/// One HTTP/1.1 exchange over a raw socket, read as it arrives (the body
/// limit and drain tests need exact bytes and timing control).
class RawHttp {
 public:
  explicit RawHttp(const std::string& url) {
    fd_ = fairgate::test::connect_loopback(url);
    connected_ = fd_ >= 0;
  }
  ~RawHttp() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawHttp(const RawHttp&) = delete;
  RawHttp& operator=(const RawHttp&) = delete;

  bool send(const std::string& bytes) {
    std::size_t sent = 0;
    while (connected_ && sent < bytes.size()) {
      const auto n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<std::size_t>(n);
    }
    return connected_;
  }
  /// Reads until `needle` arrived (empty: until the server closes) or `limit` passed.
  bool read_until(std::string_view needle, std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      if (!needle.empty() && text_.find(needle) != std::string::npos) return true;
      if (eof_) return needle.empty();
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[16384];
      const auto n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        eof_ = true;
        continue;
      }
      text_.append(buf, static_cast<std::size_t>(n));
    }
    return false;
  }
  const std::string& text() const { return text_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
  std::string text_;
};

std::string chat_request(const std::string& path, const std::string& content, bool stream) {
  const std::string body = R"({"model":"fairgate-mock","stream":)" + std::string(stream ? "true" : "false") +
                           R"(,"messages":[{"role":"user","content":")" + content + R"("}]})";
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

/// One route with the default body limit and one with a small one, no other settings.
std::string plain_route_config(const std::string& mock, const std::string& server = "") {
  return "[server]\n" + server +
         "[limiters.chat]\n"
         "max_concurrent = 2\n"
         "max_wait_ms = 20000\n"
         "[[route]]\n"
         "path = \"/v1/chat/completions\"\n"
         "upstream = \"" +
         mock +
         "\"\n"
         "limiter = \"chat\"\n"
         "[[route]]\n"
         "path = \"/small/v1/chat/completions\"\n"
         "upstream = \"" +
         mock +
         "/v1/chat/completions\"\n"
         "limiter = \"chat\"\n"
         "max_body_bytes = 1000\n";
}

bool has(const std::string& text, std::string_view what) { return text.find(what) != std::string::npos; }

void expect_openai_413(const std::string& reply, std::string_view limit) {
  EXPECT_EQ(reply.rfind("HTTP/1.1 413", 0), 0u) << reply.substr(0, 400);
  EXPECT_TRUE(has(reply, "application/json")) << reply;
  EXPECT_TRUE(has(reply, R"("type":"invalid_request_error")")) << reply;
  EXPECT_TRUE(has(reply, R"("param":null)")) << reply;
  EXPECT_TRUE(has(reply, R"("code":"body_too_large")")) << reply;
  EXPECT_TRUE(has(reply, std::string("exceeds ") + std::string(limit) + " bytes")) << reply;
}

// A prompt with documents: 1 MiB of content passes the gateway (default
// max_body_bytes 4 MiB) and the mock answers it; a body over a route's limit
// gets 413 in OpenAI's error shape, before the upstream hears of it.
TEST(GatewayMemory, OneMebibyteChatRequestPassesAndOversizedBodyGetsOpenAiShaped413) {
  MockLlm mock(3);
  Serve gateway(plain_route_config(mock.url()), {});
  {
    RawHttp c(gateway.url());
    ASSERT_TRUE(c.send(chat_request("/v1/chat/completions", std::string(1024 * 1024, 'a'), false)));
    EXPECT_TRUE(c.read_until("", kSanitized ? 60s : 20s));
    EXPECT_EQ(c.text().rfind("HTTP/1.1 200", 0), 0u) << c.text().substr(0, 400);
    EXPECT_TRUE(has(c.text(), R"("object":"chat.completion")")) << c.text().substr(0, 400);
  }
  {
    // Over the default 4 MiB: refused on the header (Content-Length), no body sent.
    RawHttp c(gateway.url());
    ASSERT_TRUE(
        c.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Content-Length: 4194305\r\n\r\n"));
    EXPECT_TRUE(c.read_until("", kSanitized ? 60s : 20s));
    expect_openai_413(c.text(), "4194304");
  }
  {
    // A route's own limit, with the body sent: chunked, so it is counted as it comes.
    RawHttp c(gateway.url());
    const std::string chunk(1500, 'b');
    char size[16];
    std::snprintf(size, sizeof size, "%zx", chunk.size());
    ASSERT_TRUE(
        c.send("POST /small/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Transfer-Encoding: chunked\r\n\r\n" +
               std::string(size) + "\r\n" + chunk + "\r\n0\r\n\r\n"));
    EXPECT_TRUE(c.read_until("", kSanitized ? 60s : 20s));
    expect_openai_413(c.text(), "1000");
  }
  {
    // A body that cannot be read (a broken chunk) on a gateway route: 400, OpenAI's shape too.
    RawHttp c(gateway.url());
    ASSERT_TRUE(
        c.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"));
    EXPECT_TRUE(c.read_until("", kSanitized ? 60s : 20s));
    EXPECT_EQ(c.text().rfind("HTTP/1.1 400", 0), 0u) << c.text().substr(0, 400);
    EXPECT_TRUE(has(c.text(), R"("type":"invalid_request_error")")) << c.text();
    EXPECT_TRUE(has(c.text(), R"("code":"bad_request")")) << c.text();
  }
  {
    // The admission API keeps its own (smaller) server.max_body_bytes and error shape.
    RawHttp c(gateway.url());
    ASSERT_TRUE(
        c.send("POST /v1/limiters/chat/acquire HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"));
    EXPECT_TRUE(c.read_until("", kSanitized ? 60s : 20s));
    EXPECT_EQ(c.text().rfind("HTTP/1.1 413", 0), 0u) << c.text();
    EXPECT_TRUE(has(c.text(), R"("reason":"body_too_large")")) << c.text();
  }
  EXPECT_EQ(gateway.terminate(), 0);
  EXPECT_EQ(mock.terminate(), 0);
}

/// socat terminating TLS in front of `target` ("127.0.0.1:PORT"): an https:// model server
/// with the test PKI's certificate `cert` (server: for 127.0.0.1; wrongname: for wrong.example).
/// `idle_close_s` > 0: each connection is closed after that many seconds without traffic.
class TlsTerminator {
 public:
  TlsTerminator(const TestPki& pki, const std::string& target, const std::string& cert = "server",
                int idle_close_s = 0)
      : port_(free_loopback_port()) {
    if (::access("/usr/bin/socat", X_OK) != 0)
      throw std::runtime_error("socat is missing (scripts/setup.sh installs it)");
    std::vector<std::string> argv{"/usr/bin/socat", "-d", "-d"};
    if (idle_close_s > 0) argv.insert(argv.end(), {"-T", std::to_string(idle_close_s)});
    argv.push_back("OPENSSL-LISTEN:" + std::to_string(port_) +
                   ",bind=127.0.0.1,reuseaddr,fork,verify=0,cert=" + pki.file(cert + ".crt") +
                   ",key=" + pki.file(cert + ".key"));
    argv.push_back("TCP:" + target);
    child_ = std::make_unique<Child>(argv, true);
    if (count("listening on", 1, 10s) < 1) throw std::runtime_error("socat did not start listening");
  }
  std::string url() const { return "https://127.0.0.1:" + std::to_string(port_); }
  /// The lines socat printed that contain `what`, once there are `at_least` (or `limit` passed).
  int count(std::string_view what, int at_least, std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    const auto seen = [&] {
      return static_cast<int>(std::count_if(log_.begin(), log_.end(), [&](const std::string& line) {
        return line.find(what) != std::string::npos;
      }));
    };
    std::string line;
    while (seen() < at_least && Clock::now() < deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (child_->read_line(line, left)) log_.push_back(line);
    }
    // Whatever else has arrived by now counts too (a connection accepted beyond `at_least`).
    while (child_->read_line(line, 200ms)) log_.push_back(line);
    return seen();
  }

 private:
  int port_;
  std::unique_ptr<Child> child_;
  std::vector<std::string> log_;
};

/// A route counter on the gateway's /metrics page (-1: not there).
long long route_metric(const std::string& url, const std::string& name, const std::string& route) {
  const std::string page =
      http_exchange(url, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string key = "\n" + name + "{route=\"" + route + "\"} ";
  const auto at = page.find(key);
  return at == std::string::npos ? -1 : std::stoll(page.substr(at + key.size()));
}

// An https:// upstream (a model server behind TLS): the gateway verifies its certificate
// against upstream_ca_file and the URL's host, then relays as over http:// — a whole answer
// and a stream. A certificate from another CA, one for another name, or a plain port is a 502
// in OpenAI's shape that says what is wrong and which key fixes it; upstream_tls_verify = false
// skips the check.
TEST(GatewayMemory, HttpsUpstreamIsVerifiedAndRelayed) {
  const TestPki pki;
  MockLlm mock(3);
  const std::string mock_hostport = mock.url().substr(std::string("http://").size());
  TlsTerminator tls(pki, mock_hostport);
  TlsTerminator wrong_name(pki, mock_hostport, "wrongname");
  const std::string chat = "/v1/chat/completions";
  const auto route = [&](const std::string& prefix, const std::string& upstream, const std::string& extra) {
    return "[[route]]\npath = \"" + prefix + chat + "\"\nupstream = \"" + upstream + chat +
           "\"\nlimiter = \"chat\"\n" + extra;
  };
  const std::string config =
      "[limiters.chat]\nmax_concurrent = 2\nmax_wait_ms = 20000\n" +
      route("/ok", tls.url(), "upstream_ca_file = \"" + pki.file("ca.crt") + "\"\n") +
      route("/other-ca", tls.url(), "upstream_ca_file = \"" + pki.file("other-ca.crt") + "\"\n") +
      route("/no-verify", tls.url(),
            "upstream_ca_file = \"" + pki.file("other-ca.crt") + "\"\nupstream_tls_verify = false\n") +
      route("/plain-port", "https://" + mock_hostport,
            "upstream_ca_file = \"" + pki.file("ca.crt") + "\"\n") +
      route("/wrong-name", wrong_name.url(), "upstream_ca_file = \"" + pki.file("ca.crt") + "\"\n") +
      route("/server-name", wrong_name.url(),
            "upstream_ca_file = \"" + pki.file("ca.crt") + "\"\nupstream_server_name = \"wrong.example\"\n");
  Serve gateway(config, {});
  const auto ask = [&](const std::string& path, bool stream) {
    RawHttp c(gateway.url());
    EXPECT_TRUE(c.send(chat_request(path, "hello", stream)));
    EXPECT_TRUE(c.read_until("", kSanitized ? 60s : 20s));
    return c.text();
  };
  const std::string whole = ask("/ok" + chat, false);
  EXPECT_EQ(whole.rfind("HTTP/1.1 200", 0), 0u) << whole.substr(0, 400);
  EXPECT_TRUE(has(whole, R"("object":"chat.completion")")) << whole.substr(0, 400);
  const std::string streamed = ask("/ok" + chat, true);
  EXPECT_EQ(streamed.rfind("HTTP/1.1 200", 0), 0u) << streamed.substr(0, 400);
  EXPECT_TRUE(has(streamed, "data: [DONE]")) << streamed.substr(0, 400);

  const std::string wrong_ca = ask("/other-ca" + chat, false);
  EXPECT_EQ(wrong_ca.rfind("HTTP/1.1 502", 0), 0u) << wrong_ca.substr(0, 600);
  EXPECT_TRUE(has(wrong_ca, R"("code":"upstream_tls_failed")")) << wrong_ca;
  EXPECT_TRUE(has(wrong_ca, "TLS certificate verification failed for 127.0.0.1:")) << wrong_ca;
  EXPECT_TRUE(has(wrong_ca, "(expected name '127.0.0.1')")) << wrong_ca;
  EXPECT_TRUE(has(wrong_ca, "upstream_ca_file: the CA that signed it")) << wrong_ca;

  const std::string other_name = ask("/wrong-name" + chat, false);
  EXPECT_EQ(other_name.rfind("HTTP/1.1 502", 0), 0u) << other_name.substr(0, 600);
  EXPECT_TRUE(has(other_name, "(expected name '127.0.0.1')")) << other_name;
  EXPECT_TRUE(has(other_name, "wrong.example")) << other_name;
  EXPECT_TRUE(has(other_name, "upstream_server_name: the name it carries")) << other_name;
  // Connected by address, verified against the name the certificate carries.
  const std::string by_name = ask("/server-name" + chat, false);
  EXPECT_EQ(by_name.rfind("HTTP/1.1 200", 0), 0u) << by_name.substr(0, 600);

  const std::string unverified = ask("/no-verify" + chat, false);
  EXPECT_EQ(unverified.rfind("HTTP/1.1 200", 0), 0u) << unverified.substr(0, 400);

  const std::string plain = ask("/plain-port" + chat, false);
  EXPECT_EQ(plain.rfind("HTTP/1.1 502", 0), 0u) << plain.substr(0, 600);
  EXPECT_TRUE(has(plain, R"("code":"upstream_tls_failed")")) << plain;
  EXPECT_TRUE(has(plain, "is it a plain, non-TLS port? then use http://")) << plain;
  EXPECT_EQ(gateway.terminate(), 0);
  EXPECT_EQ(mock.terminate(), 0);
}

// https:// upstream connections are kept like http:// ones: sequential calls from
// different clients (sessions on different strands) share one TLS connection, one
// handshake — counted by the gateway and by the upstream's own accepts. A kept
// connection the upstream closed meanwhile is left for a new one, and the call succeeds.
TEST(GatewayMemory, HttpsUpstreamConnectionsArePooled) {
  const TestPki pki;
  MockLlm mock(3);
  const std::string mock_hostport = mock.url().substr(std::string("http://").size());
  TlsTerminator tls(pki, mock_hostport);
  TlsTerminator closing(pki, mock_hostport, "server", 1);  // closes a connection idle for 1 s
  const std::string chat = "/v1/chat/completions";
  const std::string ca = "upstream_ca_file = \"" + pki.file("ca.crt") + "\"\n";
  Serve gateway(
      "[limiters.chat]\nmax_concurrent = 2\nmax_wait_ms = 20000\n"
      "[[route]]\npath = \"/kept" +
          chat + "\"\nupstream = \"" + tls.url() + chat + "\"\nlimiter = \"chat\"\n" + ca +
          "[[route]]\npath = \"/closing" + chat + "\"\nupstream = \"" + closing.url() + chat +
          "\"\nlimiter = \"chat\"\n" + ca + "[[route]]\npath = \"/fresh" + chat + "\"\nupstream = \"" +
          tls.url() + chat + "\"\nlimiter = \"chat\"\npool_size = 0\n" + ca,
      {});
  const auto ask = [&](const std::string& path, bool stream) {
    RawHttp c(gateway.url());
    EXPECT_TRUE(c.send(chat_request(path, "hello", stream)));
    EXPECT_TRUE(c.read_until("", kSanitized ? 60s : 20s));
    return c.text();
  };
  const std::string opened = "fairgate_gateway_upstream_connections_opened_total";
  const std::string reused = "fairgate_gateway_upstream_connections_reused_total";
  constexpr int kCalls = 6;
  for (int i = 0; i < kCalls; ++i) {
    const bool stream = i % 2 == 1;
    const std::string answer = ask("/kept" + chat, stream);
    EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << i << ": " << answer.substr(0, 400);
    EXPECT_TRUE(has(answer, stream ? "data: [DONE]" : R"("object":"chat.completion")"))
        << i << ": " << answer;
  }
  EXPECT_EQ(route_metric(gateway.url(), opened, "/kept" + chat), 1);
  EXPECT_EQ(route_metric(gateway.url(), reused, "/kept" + chat), kCalls - 1);
  EXPECT_EQ(route_metric(gateway.url(), "fairgate_gateway_upstream_connections_idle", "/kept" + chat), 1);
  EXPECT_EQ(tls.count("accepting connection", 1, 5s), 1) << "the upstream saw more than one connection";

  // The upstream closes the kept connection (1 s idle): the next call makes a new one.
  EXPECT_EQ(ask("/closing" + chat, false).rfind("HTTP/1.1 200", 0), 0u);
  ASSERT_EQ(closing.count("exiting with status", 1, kSanitized ? 60s : 20s), 1)
      << "socat did not close the idle connection";
  // The gauge counts live connections: the closed one leaves it before any call finds it.
  const std::string idle = "fairgate_gateway_upstream_connections_idle";
  const auto until = std::chrono::steady_clock::now() + (kSanitized ? 30s : 10s);
  while (route_metric(gateway.url(), idle, "/closing" + chat) != 0 &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(route_metric(gateway.url(), idle, "/closing" + chat), 0);
  const std::string again = ask("/closing" + chat, true);
  EXPECT_EQ(again.rfind("HTTP/1.1 200", 0), 0u) << again.substr(0, 400);
  EXPECT_TRUE(has(again, "data: [DONE]")) << again;
  EXPECT_EQ(route_metric(gateway.url(), opened, "/closing" + chat), 2);
  EXPECT_EQ(closing.count("accepting connection", 2, 5s), 2);
  // The new connection resumed the first one's TLS session (socat's OpenSSL
  // issues TLS 1.3 tickets); the kept route never needed a second handshake.
  const std::string resumed = "fairgate_gateway_upstream_tls_resumed_total";
  EXPECT_EQ(route_metric(gateway.url(), resumed, "/closing" + chat), 1);
  EXPECT_EQ(route_metric(gateway.url(), resumed, "/kept" + chat), 0);

  // No pool: every call a new connection, each after the first resuming a session.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(ask("/fresh" + chat, i == 1).rfind("HTTP/1.1 200", 0), 0u) << i;
  EXPECT_EQ(route_metric(gateway.url(), opened, "/fresh" + chat), 3);
  EXPECT_EQ(route_metric(gateway.url(), resumed, "/fresh" + chat), 2);
  EXPECT_EQ(route_metric(gateway.url(), "fairgate_gateway_upstream_connections_idle", "/fresh" + chat), 0);
  EXPECT_EQ(route_metric(gateway.url(), "fairgate_gateway_upstream_errors_total", "/closing" + chat), 0);
  EXPECT_EQ(gateway.terminate(), 0);
  EXPECT_EQ(mock.terminate(), 0);
}

/// Accepts connections on `listen` and hands each to `on_accept`, until `stop`.
template <class OnAccept>
void accept_until(int listen, const std::atomic<bool>& stop, OnAccept on_accept) {
  while (!stop) {
    pollfd p{listen, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const int fd = ::accept4(listen, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) on_accept(fd);
  }
}

/// An https:// server on a free loopback port whose answers end with the
/// connection (no Content-Length, not chunked): it closes after TLS close_notify,
/// or without it (as many servers do), or — `cut_short` — declares 100 bytes,
/// sends fewer and closes without close_notify. One connection at a time.
class ClosingTlsServer {
 public:
  enum class End { close_notify, no_close_notify, cut_short };
  static constexpr std::string_view kBody = "hello, the whole body";

  ClosingTlsServer(const TestPki& pki, End end) : end_(end), context_(boost::asio::ssl::context::tls_server) {
    context_.use_certificate_chain_file(pki.file("server.crt"));
    context_.use_private_key_file(pki.file("server.key"), boost::asio::ssl::context::pem);
    listen_ = listen_loopback(port_, 8);
    thread_ = std::thread([this] { run(); });
  }
  ~ClosingTlsServer() {
    stop_ = true;
    thread_.join();
    ::close(listen_);
  }
  std::string url() const { return "https://127.0.0.1:" + std::to_string(port_); }

 private:
  void run() {
    accept_until(listen_, stop_, [this](int fd) { answer(fd); });
  }
  void answer(int fd) {
    namespace net = boost::asio;
    net::io_context io;
    net::ip::tcp::socket socket(io);
    boost::system::error_code ec;
    socket.assign(net::ip::tcp::v4(), fd, ec);
    if (ec) return;
    net::ssl::stream<net::ip::tcp::socket&> tls(socket, context_);
    tls.handshake(net::ssl::stream_base::server, ec);
    // The request: its header, then its body (Content-Length), all read before answering.
    std::string in;
    const std::size_t header = net::read_until(tls, net::dynamic_buffer(in), "\r\n\r\n", ec);
    if (ec) return;
    std::size_t length = 0;
    if (const auto at = in.find("Content-Length: "); at != std::string::npos && at < header)
      length = std::stoul(in.substr(at + 16));
    if (in.size() < header + length)
      net::read(tls, net::dynamic_buffer(in), net::transfer_exactly(header + length - in.size()), ec);
    const std::string answer =
        end_ == End::cut_short
            ? "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n" +
                  std::string(kBody)
            : "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n" + std::string(kBody);
    net::write(tls, net::buffer(answer), ec);
    if (end_ == End::close_notify)
      tls.shutdown(ec);  // sends close_notify; the gateway closes without answering it
    socket.close(ec);
  }

  End end_;
  boost::asio::ssl::context context_;
  int listen_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// An https:// answer whose body ends with the connection is relayed whole
// whether the upstream closes after TLS close_notify or without it (the end of
// the body, as over http://, not "broke off"); one that declares a length and
// stops short is still an upstream failure, its client's answer cut.
TEST(GatewayMemory, HttpsBodyEndingWithTheConnectionIsWholeWithOrWithoutCloseNotify) {
  const TestPki pki;
  using End = ClosingTlsServer::End;
  ClosingTlsServer notify(pki, End::close_notify);
  ClosingTlsServer bare(pki, End::no_close_notify);
  ClosingTlsServer cut(pki, End::cut_short);
  const std::string ca = "upstream_ca_file = \"" + pki.file("ca.crt") + "\"\n";
  const auto route = [&](const std::string& path, const ClosingTlsServer& server) {
    return "[[route]]\npath = \"" + path + "\"\nupstream = \"" + server.url() + "\"\n" + ca;
  };
  Serve gateway(route("/notify", notify) + route("/bare", bare) + route("/cut", cut), {});
  const auto ask = [&](const std::string& path) {
    RawHttp c(gateway.url());
    EXPECT_TRUE(
        c.send("POST " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"));
    EXPECT_TRUE(c.read_until("", kSanitized ? 60s : 20s));
    return c.text();
  };
  const std::string errors = "fairgate_gateway_upstream_errors_total";
  for (const std::string path : {"/notify", "/bare"}) {
    const std::string text = ask(path);
    EXPECT_EQ(text.rfind("HTTP/1.1 200", 0), 0u) << path << ": " << text;
    // Re-framed for the client as chunked, with its last chunk: the body is whole.
    EXPECT_TRUE(has(text, "Transfer-Encoding: chunked")) << path << ": " << text;
    EXPECT_TRUE(has(text, ClosingTlsServer::kBody)) << path << ": " << text;
    EXPECT_TRUE(text.size() >= 5 && text.compare(text.size() - 5, 5, "0\r\n\r\n") == 0)
        << path << ": " << text;
    EXPECT_EQ(route_metric(gateway.url(), errors, path), 0) << path;
  }
  const std::string cut_text = ask("/cut");
  EXPECT_EQ(cut_text.rfind("HTTP/1.1 200", 0), 0u) << cut_text;
  EXPECT_TRUE(has(cut_text, "Content-Length: 100")) << cut_text;
  EXPECT_TRUE(has(cut_text, ClosingTlsServer::kBody)) << cut_text;
  EXPECT_LT(cut_text.size() - cut_text.find("\r\n\r\n") - 4, 100u)
      << "the cut body reached the client whole?";
  EXPECT_EQ(route_metric(gateway.url(), errors, "/cut"), 1);
  EXPECT_EQ(gateway.terminate(), 0);
}

// A keep-alive client may send its next request before the gateway is done
// with the last one (pipelined, or the moment it has read the answer while the
// gateway still finishes the call). That request is kept and served next on
// the same connection — before, the disconnect watch read it and dropped it,
// and the connection was closed with the request unanswered.
/// A plain http:// upstream on a free loopback port that answers each request
/// it reads (header and Content-Length body) with `answer(fd, request)`, one
/// thread per connection, keep-alive: the answer decides what the gateway
/// sees. Closes a connection when `answer` returns false.
class ScriptedUpstream {
 public:
  using Answer = std::function<bool(int fd, const std::string& request)>;
  explicit ScriptedUpstream(Answer answer) : answer_(std::move(answer)) {
    listen_ = listen_loopback(port_);
    accept_ = std::thread([this] { run(); });
  }
  ~ScriptedUpstream() {
    stop_ = true;
    accept_.join();
    for (auto& t : connections_) t.join();
    ::close(listen_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  /// Every request read so far, header and body.
  std::vector<std::string> requests() {
    std::lock_guard lock(mu_);
    return requests_;
  }
  static void write_all(int fd, std::string_view bytes) {
    while (!bytes.empty()) {
      const auto n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return;
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
  }

 private:
  void run() {
    accept_until(listen_, stop_, [this](int fd) { connections_.emplace_back([this, fd] { serve(fd); }); });
  }
  void serve(int fd) {
    std::string in;
    while (!stop_) {
      const auto end = in.find("\r\n\r\n");
      if (end != std::string::npos) {
        std::string lower = in.substr(0, end);
        std::transform(lower.begin(), lower.end(), lower.begin(),
                       [](unsigned char ch) { return std::tolower(ch); });
        std::size_t length = 0;
        if (const auto at = lower.find("content-length:"); at != std::string::npos)
          length = std::stoul(lower.substr(at + 15));
        if (in.size() >= end + 4 + length) {
          const std::string request = in.substr(0, end + 4 + length);
          in.erase(0, request.size());
          {
            std::lock_guard lock(mu_);
            requests_.push_back(request);
          }
          if (!answer_(fd, request)) break;
          continue;
        }
      }
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[16384];
      const auto n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      in.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
  }

  Answer answer_;
  int listen_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread accept_;
  std::vector<std::thread> connections_;  // joined at the end (the accept thread alone adds)
  std::mutex mu_;
  std::vector<std::string> requests_;
};

/// The request line's target ("POST /a?u=x HTTP/1.1" -> "/a?u=x").
std::string target_of(const std::string& request) {
  const auto a = request.find(' '), b = request.find(' ', a + 1);
  return request.substr(a + 1, b - a - 1);
}

/// POST /v1/ratelimit/tokens with `body` ({"key":...}); the "remaining" it answers, -1 without one.
long long tokens_remaining(const std::string& url, const std::string& body) {
  const std::string r =
      http_exchange(url,
                    "POST /v1/ratelimit/tokens HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    "Connection: close\r\nContent-Length: " +
                        std::to_string(body.size()) + "\r\n\r\n" + body);
  const auto at = r.find("\"remaining\":");
  return at == std::string::npos ? -1 : std::stoll(r.substr(at + 12));
}

long long limiter_in_use(const std::string& url, const std::string& name) {
  const std::string page =
      http_exchange(url, "GET /v1/limiters/" + name + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const auto at = page.find("\"in_use\":");
  return at == std::string::npos ? -1 : std::stoll(page.substr(at + 9));
}

// Informational answers (103 Early Hints, 100 Continue) come before the final
// one: they are dropped, never relayed as the answer. Before, the 103 was the
// client's answer, its permit was released while the upstream still worked,
// and the connection went back to the pool with the real answer still to come
// — so the next client on it got the previous client's answer.
TEST(GatewayMemory, InformationalAnswersAreSkippedAndNeverReachAnotherClient) {
  ScriptedUpstream upstream([](int fd, const std::string& request) {
    ScriptedUpstream::write_all(fd, "HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n");
    std::this_thread::sleep_for(300ms);
    ScriptedUpstream::write_all(fd, "HTTP/1.1 100 Continue\r\n\r\n");
    const std::string body = R"({"for":")" + target_of(request) + R"("})";
    ScriptedUpstream::write_all(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                                        std::to_string(body.size()) + "\r\n\r\n" + body);
    return true;
  });
  Serve gateway("[limiters.chat]\nmax_concurrent = 2\n[[route]]\npath = \"/v1\"\nupstream = \"" +
                    upstream.url() + "\"\nlimiter = \"chat\"\n",
                {});
  for (int round = 0; round < 2; ++round) {  // the second round on the pooled connections
    RawHttp alice(gateway.url()), bob(gateway.url());
    ASSERT_TRUE(alice.send(chat_request("/v1/chat?u=alice", "hi", false)));
    std::this_thread::sleep_for(100ms);
    ASSERT_TRUE(bob.send(chat_request("/v1/chat?u=bob", "hi", false)));
    EXPECT_TRUE(alice.read_until("", kSanitized ? 30s : 10s));
    EXPECT_TRUE(bob.read_until("", kSanitized ? 30s : 10s));
    EXPECT_EQ(alice.text().rfind("HTTP/1.1 200", 0), 0u) << round << ": " << alice.text();
    EXPECT_TRUE(has(alice.text(), R"({"for":"/v1/chat?u=alice"})")) << round << ": " << alice.text();
    EXPECT_EQ(bob.text().rfind("HTTP/1.1 200", 0), 0u) << round << ": " << bob.text();
    EXPECT_TRUE(has(bob.text(), R"({"for":"/v1/chat?u=bob"})")) << round << ": " << bob.text();
    EXPECT_FALSE(has(alice.text() + bob.text(), "HTTP/1.1 103")) << "an informational answer was relayed";
    EXPECT_FALSE(has(alice.text() + bob.text(), "HTTP/1.1 100")) << "an informational answer was relayed";
  }
  EXPECT_EQ(route_metric(gateway.url(), "fairgate_gateway_upstream_errors_total", "/v1"), 0);
  EXPECT_EQ(limiter_in_use(gateway.url(), "chat"), 0);
  EXPECT_EQ(gateway.terminate(), 0);
}

// The answer to a HEAD has no body, whatever its Content-Length says: the
// permit is released at once and the client's connection carries the next
// request. Before, the gateway waited for the body until upstream_timeout_ms,
// holding the permit, then counted an upstream error and closed the connection.
TEST(GatewayMemory, AHeadRequestEndsWithItsHeader) {
  ScriptedUpstream upstream([](int fd, const std::string& request) {
    const std::string body = R"({"data":[]})";
    std::string answer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                         std::to_string(body.size()) + "\r\n\r\n";
    if (request.rfind("HEAD ", 0) != 0) answer += body;
    ScriptedUpstream::write_all(fd, answer);
    return true;
  });
  Serve gateway("[limiters.chat]\nmax_concurrent = 1\n[[route]]\npath = \"/v1\"\nupstream = \"" +
                    upstream.url() + "\"\nlimiter = \"chat\"\nupstream_timeout_ms = 60000\n",
                {});
  RawHttp c(gateway.url());
  ASSERT_TRUE(c.send("HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"));
  ASSERT_TRUE(c.read_until("\r\n\r\n", kSanitized ? 30s : 10s)) << c.text();
  EXPECT_EQ(c.text().rfind("HTTP/1.1 200", 0), 0u) << c.text();
  // The same connection, at once: answered well within the 60 s upstream timeout.
  ASSERT_TRUE(c.send("GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  ASSERT_TRUE(c.read_until("", kSanitized ? 30s : 10s)) << c.text();
  EXPECT_TRUE(has(c.text(), R"({"data":[]})")) << c.text();
  const auto second = c.text().find("HTTP/1.1 200", 1);
  EXPECT_NE(second, std::string::npos) << c.text();
  EXPECT_EQ(c.text().find(R"({"data":[]})"), c.text().rfind(R"({"data":[]})")) << "one body only";
  EXPECT_EQ(route_metric(gateway.url(), "fairgate_gateway_upstream_errors_total", "/v1"), 0);
  EXPECT_EQ(limiter_in_use(gateway.url(), "chat"), 0);
  EXPECT_EQ(gateway.terminate(), 0);
}

// A stream that waited got the gateway's own 200 (the queue feedback), so the
// end of its connection is the end of the answer: an upstream that breaks off,
// or pauses longer than upstream_timeout_ms, must be told with an error event.
// Before, the stream just ended and looked whole.
TEST(GatewayMemory, AQueuedStreamWhoseUpstreamBreaksOffGetsAnErrorEvent) {
  ScriptedUpstream upstream([](int fd, const std::string& request) {
    const std::string target = target_of(request);
    if (target.find("/hold") != std::string::npos) {
      std::this_thread::sleep_for(600ms);
      ScriptedUpstream::write_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}");
      return true;
    }
    if (target.find("/json") != std::string::npos) {  // "stream": true ignored: one JSON object
      const std::string body = "{\"id\":\"t0 \",\r\n\"choices\":[]}";
      ScriptedUpstream::write_all(fd,
                                  "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                                      std::to_string(body.size()) + "\r\n\r\n" + body);
      return true;
    }
    ScriptedUpstream::write_all(
        fd, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n");
    const std::string event = "data: {\"choices\":[{\"delta\":{\"content\":\"t0 \"}}]}\n\n";
    ScriptedUpstream::write_all(fd, fmt::format("{:x}\r\n{}\r\n", event.size(), event));
    if (target.find("/stall") != std::string::npos) std::this_thread::sleep_for(3s);
    // Cut inside an event: a chunk of 0x64 bytes of which only these arrive.
    if (target.find("/midcut") != std::string::npos)
      ScriptedUpstream::write_all(fd, "64\r\ndata: {\"choices\":[{\"delta\":{\"con");
    return false;  // closed without the last chunk
  });
  Serve gateway("[limiters.chat]\nmax_concurrent = 1\n[[route]]\npath = \"/v1\"\nupstream = \"" +
                    upstream.url() + "\"\nlimiter = \"chat\"\nupstream_timeout_ms = 1000\n",
                {});
  for (const std::string what : {"cut", "stall", "midcut", "json"}) {
    RawHttp hold(gateway.url());
    ASSERT_TRUE(hold.send(chat_request("/v1/hold", "hi", false)));
    std::this_thread::sleep_for(150ms);
    RawHttp stream(gateway.url());
    ASSERT_TRUE(stream.send(chat_request("/v1/" + what, "hi", true)));
    EXPECT_TRUE(stream.read_until("", kSanitized ? 30s : 10s)) << what;
    EXPECT_TRUE(has(stream.text(), ": admitted")) << what << ": it did not wait: " << stream.text();
    EXPECT_TRUE(has(stream.text(), "t0 ")) << what << ": " << stream.text();
    EXPECT_TRUE(hold.read_until("", kSanitized ? 30s : 10s));
    if (what == "json") {
      // One event, its lines data lines (CR dropped): an SSE client reads the object whole.
      EXPECT_TRUE(has(stream.text(), "\ndata: {\"id\":\"t0 \",\ndata: \"choices\":[]}\n\n")) << stream.text();
      EXPECT_FALSE(has(stream.text(), "error")) << stream.text();
      continue;
    }
    const std::string code = what == "stall" ? R"("code":"upstream_timeout")" : R"("code":"upstream_error")";
    // The error is an event of its own, also after an answer cut inside an event.
    EXPECT_TRUE(has(stream.text(), "\n\ndata: {\"error\":")) << what << ": " << stream.text();
    EXPECT_TRUE(has(stream.text(), code)) << what << ": " << stream.text();
  }
  EXPECT_EQ(route_metric(gateway.url(), "fairgate_gateway_upstream_errors_total", "/v1"), 3);
  EXPECT_EQ(limiter_in_use(gateway.url(), "chat"), 0);
  EXPECT_EQ(gateway.terminate(), 0);
}

// A token budget refunds from the usage in the upstream's answer, so on a
// route with one the gateway asks for an uncompressed answer (the SDKs send
// Accept-Encoding: gzip, and a gzipped answer's usage cannot be read: before,
// it kept its whole reservation). A route without a token budget passes the
// client's Accept-Encoding through.
TEST(GatewayMemory, ATokenBudgetRouteAsksForAnUncompressedAnswerAndRefundsFromIt) {
  ScriptedUpstream upstream([](int fd, const std::string&) {
    const std::string body = R"({"choices":[],"usage":{"total_tokens":5}})";
    ScriptedUpstream::write_all(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                                        std::to_string(body.size()) + "\r\n\r\n" + body);
    return true;
  });
  constexpr long long kLimit = 100000;
  Serve gateway(
      "[limiters.chat]\nmax_concurrent = 2\n"
      "[ratelimit.tokens]\nalgorithm = \"token_bucket\"\nrate = " +
          std::to_string(kLimit) +
          "\nperiod_ms = 3600000000\nkey = \"header:X-User-Id\"\ncost = \"tokens\"\n"
          "[[route]]\npath = \"/v1\"\nupstream = \"" +
          upstream.url() +
          "\"\nlimiter = \"chat\"\nratelimit = [\"tokens\"]\n"
          "[[route]]\npath = \"/plain\"\nupstream = \"" +
          upstream.url() + "\"\nlimiter = \"chat\"\n",
      {});
  const std::string body = R"({"max_tokens":100,"messages":[{"role":"user","content":"hi"}]})";
  const auto call = [&](const std::string& path) {
    return http_exchange(gateway.url(), "POST " + path +
                                            " HTTP/1.1\r\nHost: x\r\nX-User-Id: u1\r\nAccept-Encoding: gzip, "
                                            "br\r\nContent-Type: application/json\r\nConnection: close\r\n"
                                            "Content-Length: " +
                                            std::to_string(body.size()) + "\r\n\r\n" + body);
  };
  EXPECT_EQ(call("/v1/chat/completions").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(call("/plain/v1/chat/completions").rfind("HTTP/1.1 200", 0), 0u);
  const auto seen = upstream.requests();
  ASSERT_EQ(seen.size(), 2u);
  const auto lower = [](std::string t) {
    std::transform(t.begin(), t.end(), t.begin(), [](unsigned char ch) { return std::tolower(ch); });
    return t;
  };
  EXPECT_TRUE(has(lower(seen[0]), "\r\naccept-encoding: identity\r\n")) << seen[0];
  EXPECT_TRUE(has(lower(seen[1]), "\r\naccept-encoding: gzip, br\r\n")) << seen[1];
  // The budget keeps what the answer reported (5), not the reservation (over 100). Each
  // check below takes 1 itself; the refund may land a moment after the answer.
  long long used = -1;
  const auto until = std::chrono::steady_clock::now() + (kSanitized ? 30s : 10s);
  for (int checks = 1; used != 5 && std::chrono::steady_clock::now() < until; ++checks) {
    const long long remaining = tokens_remaining(gateway.url(), R"({"key":"u1"})");
    ASSERT_GE(remaining, 0);
    used = kLimit - remaining - checks;
    if (used != 5) std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(used, 5);
  EXPECT_EQ(gateway.terminate(), 0);
}

// A pooled connection that the upstream closes as our request arrives (its idle timeout) is
// retried once on a new one; an upstream that read the request, worked on it and then broke
// the connection (a crash mid-answer) is not sent the request again: the POST reached it once.
TEST(GatewayMemory, OnlyAConnectionClosedBeforeTheUpstreamWorkedIsRetried) {
  std::atomic<int> idle_closed{0};
  ScriptedUpstream upstream([&idle_closed](int fd, const std::string& request) {
    const std::string target = target_of(request);
    if (target.find("/idle-closed") != std::string::npos && idle_closed++ == 0)
      return false;  // closed at once, unanswered: as an idle timeout racing the request
    if (target.find("/crash") != std::string::npos) {
      std::this_thread::sleep_for(1200ms);  // worked on it
      return false;
    }
    ScriptedUpstream::write_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}");
    return true;
  });
  Serve gateway("[[route]]\npath = \"/v1\"\nupstream = \"" + upstream.url() + "\"\n", {});
  const auto post = [&](const std::string& path, const std::string& extra = "") {
    return http_exchange(gateway.url(), "POST " + path + " HTTP/1.1\r\nHost: x\r\n" + extra +
                                            "Content-Type: application/json\r\nConnection: close\r\n"
                                            "Content-Length: 2\r\n\r\n{}");
  };
  const auto count = [&](const std::string& path) {
    long n = 0;
    for (const auto& r : upstream.requests()) n += target_of(r) == path;
    return n;
  };
  ASSERT_EQ(post("/v1/warm").rfind("HTTP/1.1 200", 0), 0u);  // leaves a pooled connection
  EXPECT_EQ(post("/v1/idle-closed").rfind("HTTP/1.1 200", 0), 0u)
      << "the stale connection's request goes again on a new one";
  EXPECT_EQ(count("/v1/idle-closed"), 2);
  ASSERT_EQ(post("/v1/warm").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(post("/v1/crash").rfind("HTTP/1.1 502", 0), 0u);
  EXPECT_EQ(count("/v1/crash"), 1) << "a request the upstream worked on is not sent twice";
  EXPECT_EQ(gateway.terminate(), 0);
}

// A stream that waits gets our own 200 while it waits: it carries the rate limits' headers, as an
// answer admitted at once does (it had none).
TEST(GatewayMemory, AStreamThatWaitedCarriesTheRateLimitHeaders) {
  ScriptedUpstream upstream([](int fd, const std::string& request) {
    if (target_of(request).find("/hold") != std::string::npos) std::this_thread::sleep_for(600ms);
    ScriptedUpstream::write_all(
        fd,
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 14\r\n\r\n"
        "data: [DONE]\n\n");
    return true;
  });
  Serve gateway(
      "[limiters.chat]\nmax_concurrent = 1\n"
      "[ratelimit.calls]\nalgorithm = \"fixed_window\"\nrate = 100\nperiod_ms = 600000\nkey = \"global\"\n"
      "[[route]]\npath = \"/v1\"\nupstream = \"" +
          upstream.url() + "\"\nlimiter = \"chat\"\nratelimit = [\"calls\"]\n",
      {});
  RawHttp hold(gateway.url());
  ASSERT_TRUE(hold.send(chat_request("/v1/hold", "hi", false)));
  std::this_thread::sleep_for(150ms);
  RawHttp stream(gateway.url());
  ASSERT_TRUE(stream.send(chat_request("/v1/chat/completions", "hi", true)));
  EXPECT_TRUE(stream.read_until("", kSanitized ? 30s : 10s));
  const std::string head = stream.text().substr(0, stream.text().find("\r\n\r\n"));
  EXPECT_TRUE(has(stream.text(), ": admitted")) << "it did not wait: " << stream.text();
  EXPECT_TRUE(has(head, "\r\nRateLimit-Policy: ")) << head;
  EXPECT_TRUE(has(head, "\r\nX-RateLimit-Remaining: 98")) << head;
  EXPECT_TRUE(hold.read_until("", kSanitized ? 30s : 10s));
  EXPECT_EQ(gateway.terminate(), 0);
}

// A token budget charges what an answer used beyond its reservation: a request without
// max_tokens reserves default_max_tokens (10 here) plus its prompt's estimate, and the answer
// reports 300. Before, only the reservation was kept, so any client could spend far past its
// budget by leaving max_tokens out.
TEST(GatewayMemory, ATokenBudgetChargesWhatAnAnswerUsedBeyondItsReservation) {
  ScriptedUpstream upstream([](int fd, const std::string&) {
    const std::string body = R"({"choices":[],"usage":{"total_tokens":300}})";
    ScriptedUpstream::write_all(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                                        std::to_string(body.size()) + "\r\n\r\n" + body);
    return true;
  });
  constexpr long long kLimit = 1000;
  Serve gateway("[ratelimit.tokens]\nalgorithm = \"token_bucket\"\nrate = " + std::to_string(kLimit) +
                    "\nperiod_ms = 3600000000\nkey = \"header:X-User-Id\"\ncost = \"tokens\"\n"
                    "default_max_tokens = 10\n"
                    "[[route]]\npath = \"/v1\"\nupstream = \"" +
                    upstream.url() + "\"\nratelimit = [\"tokens\"]\n",
                {});
  const std::string body = R"({"messages":[{"role":"user","content":"hi"}]})";
  const auto chat = [&] {
    return http_exchange(gateway.url(),
                         "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-User-Id: u1\r\nContent-Type: "
                         "application/json\r\nConnection: close\r\nContent-Length: " +
                             std::to_string(body.size()) + "\r\n\r\n" + body);
  };
  const std::string reply = chat();
  ASSERT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  // Each check below takes 1 itself; the charge may land a moment after the answer.
  long long used = -1;
  const auto until = std::chrono::steady_clock::now() + (kSanitized ? 30s : 10s);
  for (int checks = 1; used != 300 && std::chrono::steady_clock::now() < until; ++checks) {
    const long long remaining = tokens_remaining(gateway.url(), R"({"key":"u1"})");
    ASSERT_GE(remaining, 0);
    used = kLimit - remaining - checks;
    if (used != 300) std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(used, 300) << "the budget keeps what the answer used, not the reservation";
  const long long over = route_metric(gateway.url(), "fairgate_gateway_tokens_over_reservation_total", "/v1");
  EXPECT_GT(over, 250);
  EXPECT_LT(over, 290);  // 300 - (10 + the prompt's estimate)
  // A budget without room for the whole rest gives what it has left: 1000 - 300 - the checks
  // above remain; three answers of 300 more leave nothing, and the next reservation is refused.
  for (int i = 0; i < 3; ++i) {
    const std::string r = chat();
    ASSERT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << i << ": " << r;
  }
  // Read with a check for the whole capacity: refused while anything is spent, it takes nothing.
  const std::string peek = R"({"key":"u1","cost":1000})";
  long long remaining = -1;
  const auto drained = std::chrono::steady_clock::now() + (kSanitized ? 30s : 10s);
  while (remaining != 0 && std::chrono::steady_clock::now() < drained) {
    remaining = tokens_remaining(gateway.url(), peek);
    ASSERT_GE(remaining, 0);
    if (remaining != 0) std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(remaining, 0) << "the last answer's rest takes what was left";
  const std::string refused = chat();
  EXPECT_EQ(refused.rfind("HTTP/1.1 429", 0), 0u) << refused;
  EXPECT_EQ(gateway.terminate(), 0);
}

TEST(GatewayMemory, ARequestSentWhileTheLastIsRelayedIsServedNext) {
  Listening mock({FAIRGATE_BIN, "mock-llm", "--listen", "127.0.0.1:0", "--tokens-per-second", "20",
                  "--tokens", "10", "--max-concurrent", "3"},
                 "fairgate mock-llm");
  Serve gateway(plain_route_config(mock.url()), {});
  std::string first = chat_request("/v1/chat/completions", "first", true);
  first.replace(first.find("Connection: close"), 17, "Connection: keep-alive");
  RawHttp c(gateway.url());
  ASSERT_TRUE(c.send(first));
  ASSERT_TRUE(c.read_until("t1 ", kSanitized ? 60s : 20s)) << c.text();
  // The stream is still being relayed (8 tokens to go at 20/s): the next request now.
  ASSERT_TRUE(c.send(chat_request("/v1/chat/completions", "second", false)));
  EXPECT_TRUE(c.read_until("", kSanitized ? 60s : 20s));
  const std::string& text = c.text();
  EXPECT_TRUE(has(text, "data: [DONE]")) << text;
  const auto second = text.find("HTTP/1.1 200", 1);
  ASSERT_NE(second, std::string::npos) << "the second request got no answer:\n" << text;
  EXPECT_TRUE(has(text.substr(second), R"("object":"chat.completion")")) << text.substr(second);
  EXPECT_EQ(gateway.terminate(), 0);
  EXPECT_EQ(mock.terminate(), 0);
}

// Rolling deploys: a streaming answer in flight when SIGTERM arrives is
// relayed whole (every token, the final chunk, [DONE]); new connections are
// refused meanwhile; the process then exits 0, well before the grace ends.
TEST(GatewayMemory, SigtermLetsAStreamInFlightFinishThenExitsZero) {
  // 30 tokens at 10/s: ~3 s of answer, most of it after the signal.
  Listening mock({FAIRGATE_BIN, "mock-llm", "--listen", "127.0.0.1:0", "--tokens-per-second", "10",
                  "--tokens", "30", "--max-concurrent", "3"},
                 "fairgate mock-llm");
  const auto grace = kSanitized ? 60s : 30s;
  Serve gateway(plain_route_config(
                    mock.url(),
                    "shutdown_grace_ms = " + std::to_string(std::chrono::milliseconds(grace).count()) + "\n"),
                {});
  RawHttp c(gateway.url());
  ASSERT_TRUE(c.send(chat_request("/v1/chat/completions", "hello", true)));
  // And a keep-alive client whose whole answer comes after the signal: it must say
  // Connection: close, since the drain closes the connection after it.
  RawHttp kept(gateway.url());
  std::string keep_alive = chat_request("/v1/chat/completions", "hello", false);
  keep_alive.erase(keep_alive.find("Connection: close\r\n"), std::string("Connection: close\r\n").size());
  ASSERT_TRUE(kept.send(keep_alive));
  ASSERT_TRUE(c.read_until("t1 ", kSanitized ? 60s : 20s)) << c.text();
  const auto signalled = Clock::now();
  ASSERT_EQ(::kill(gateway.pid(), SIGTERM), 0);
  EXPECT_TRUE(kept.read_until("", grace)) << kept.text();
  EXPECT_EQ(kept.text().rfind("HTTP/1.1 200", 0), 0u) << kept.text().substr(0, 400);
  EXPECT_TRUE(has(kept.text(), "Connection: close\r\n")) << kept.text().substr(0, 400);
  EXPECT_TRUE(c.read_until("", grace)) << "the stream did not end within the grace";
  const auto streamed = Clock::now();
  const std::string& text = c.text();
  EXPECT_EQ(text.rfind("HTTP/1.1 200", 0), 0u) << text.substr(0, 400);
  for (int i = 0; i < 30; ++i)
    EXPECT_TRUE(has(text, "t" + std::to_string(i) + " ")) << "token " << i << "\n" << text;
  EXPECT_TRUE(has(text, R"("finish_reason":"stop")")) << text;
  EXPECT_TRUE(has(text, "data: [DONE]")) << text;
  // No new connections while draining (the listener is closed at once).
  RawHttp late(gateway.url());
  EXPECT_TRUE(!late.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") || late.read_until("", 5s));
  EXPECT_FALSE(has(late.text(), "HTTP/1.1 200")) << late.text();
  EXPECT_EQ(gateway.wait_exit(grace), 0);  // already exiting: no second signal
  const auto gone = Clock::now();
  std::printf(
      "stream ended %lld ms after SIGTERM, process gone %lld ms after it (grace %lld ms)\n",
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(streamed - signalled).count()),
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(gone - signalled).count()),
      static_cast<long long>(std::chrono::milliseconds(grace).count()));
  EXPECT_LT(gone - signalled, grace);
  EXPECT_EQ(mock.terminate(), 0);
}

// A second SIGTERM during the drain stops at once: the stream in flight is
// cut (no [DONE]) and the process exits 0 long before the answer or the grace would end.
TEST(GatewayMemory, SecondSigtermStopsAtOnce) {
  // 300 tokens at 10/s: a 30-second answer; grace 60 s.
  Listening mock({FAIRGATE_BIN, "mock-llm", "--listen", "127.0.0.1:0", "--tokens-per-second", "10",
                  "--tokens", "300", "--max-concurrent", "3"},
                 "fairgate mock-llm");
  Serve gateway(plain_route_config(mock.url(), "shutdown_grace_ms = 60000\n"), {});
  RawHttp c(gateway.url());
  ASSERT_TRUE(c.send(chat_request("/v1/chat/completions", "hello", true)));
  ASSERT_TRUE(c.read_until("t1 ", kSanitized ? 60s : 20s)) << c.text();
  const auto signalled = Clock::now();
  ASSERT_EQ(::kill(gateway.pid(), SIGTERM), 0);
  ASSERT_TRUE(c.read_until("t3 ", 20s)) << "the first SIGTERM must not cut the stream\n" << c.text();
  ASSERT_EQ(::kill(gateway.pid(), SIGTERM), 0);
  EXPECT_EQ(gateway.wait_exit(20s), 0);
  const auto gone = Clock::now();
  EXPECT_TRUE(c.read_until("", 10s));
  EXPECT_FALSE(has(c.text(), "data: [DONE]")) << c.text();
  std::printf("process gone %lld ms after the first SIGTERM (answer 30 s, grace 60 s)\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(gone - signalled).count()));
  EXPECT_EQ(mock.terminate(), 0);
}

/// Limiter "one" (cap 1, max wait 5 s) behind /one (its own max wait 250 ms, no
/// queue events); /v1/models and /free (a slow chat) without a limiter; /limited
/// without a limiter but with a rate limit of one request per minute.
std::string no_limiter_config(const std::string& mock, const std::string& slow_mock) {
  return "[limiters.one]\n"
         "max_concurrent = 1\n"
         "max_wait_ms = 5000\n"
         "[ratelimit.once]\n"
         "algorithm = \"fixed_window\"\n"
         "rate = 1\n"
         "period_ms = 60000\n"
         "key = \"route\"\n"
         "[[route]]\n"
         "path = \"/one/v1/chat/completions\"\n"
         "upstream = \"" +
         mock +
         "/v1/chat/completions\"\n"
         "limiter = \"one\"\n"
         "max_wait_ms = 250\n"
         "queue_events = \"none\"\n"
         "[[route]]\n"
         "path = \"/v1/models\"\n"
         "upstream = \"" +
         mock +
         "\"\n"
         "[[route]]\n"
         "path = \"/free/v1/chat/completions\"\n"
         "upstream = \"" +
         slow_mock +
         "/v1/chat/completions\"\n"
         "[[route]]\n"
         "path = \"/limited\"\n"
         "upstream = \"" +
         mock +
         "/\"\n"
         "ratelimit = [\"once\"]\n";
}

std::string get_request(const std::string& path) {
  return "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
}

// A route without a limiter is proxied at once, without a permit: it answers
// while the only permit of another route's limiter is held, and is never a
// holder; its rate limits still apply.
TEST(GatewayMemory, ARouteWithoutALimiterAnswersWhileTheCapIsFullAndHoldsNothing) {
  MockLlm mock(3);
  // 30 tokens at 10/s: a stream that lasts ~3 s.
  Listening slow({FAIRGATE_BIN, "mock-llm", "--listen", "127.0.0.1:0", "--tokens-per-second", "10",
                  "--tokens", "30", "--max-concurrent", "3"},
                 "fairgate mock-llm");
  Serve gateway(no_limiter_config(mock.url(), slow.url()), {});
  RawSse held(gateway.url(), "one");
  ASSERT_TRUE(held.wait_for("event: granted", 10s)) << held.data();

  const std::string models = http_exchange(gateway.url(), get_request("/v1/models"));
  EXPECT_EQ(models.rfind("HTTP/1.1 200", 0), 0u) << models;
  EXPECT_TRUE(has(models, R"("object":"list")")) << models;

  // A stream through a route without a limiter: tokens flow while the cap is full,
  // and the limiter still has its one holder (the acquire above), nobody else.
  RawHttp stream(gateway.url());
  ASSERT_TRUE(stream.send(chat_request("/free/v1/chat/completions", "hello", true)));
  ASSERT_TRUE(stream.read_until("t1 ", kSanitized ? 60s : 20s)) << stream.text();
  EXPECT_FALSE(has(stream.text(), ": queued")) << stream.text();
  const std::string one = http_exchange(gateway.url(), get_request("/v1/limiters/one"));
  EXPECT_TRUE(has(one, R"("holders_total":1)")) << one;
  EXPECT_TRUE(has(one, R"("queue_total":0)")) << one;
  EXPECT_TRUE(stream.read_until("data: [DONE]", kSanitized ? 60s : 20s)) << stream.text();

  // Rate limits on a route without a limiter: the second request in the window is refused.
  const std::string first = http_exchange(gateway.url(), get_request("/limited/v1/models"));
  EXPECT_EQ(first.rfind("HTTP/1.1 200", 0), 0u) << first;
  const std::string second = http_exchange(gateway.url(), get_request("/limited/v1/models"));
  EXPECT_EQ(second.rfind("HTTP/1.1 429", 0), 0u) << second;
  EXPECT_TRUE(has(second, R"("code":"rate_limit_exceeded")")) << second;
  EXPECT_EQ(gateway.terminate(), 0);
  EXPECT_EQ(mock.terminate(), 0);
  EXPECT_EQ(slow.terminate(), 0);
}

// A queue timeout names the max wait the request was given (the route's
// max_wait_ms, 250 ms, not the limiter's 5000 ms), never the time measured.
TEST(GatewayMemory, AQueueTimeoutNamesTheRoutesMaxWait) {
  MockLlm mock(3);
  Serve gateway(no_limiter_config(mock.url(), mock.url()), {});
  RawSse held(gateway.url(), "one");
  ASSERT_TRUE(held.wait_for("event: granted", 10s)) << held.data();
  for (const bool stream : {false, true}) {
    RawHttp c(gateway.url());
    ASSERT_TRUE(c.send(chat_request("/one/v1/chat/completions", "hello", stream)));
    EXPECT_TRUE(c.read_until("", kSanitized ? 60s : 20s));
    EXPECT_EQ(c.text().rfind("HTTP/1.1 429", 0), 0u) << c.text();
    EXPECT_TRUE(has(c.text(), R"("code":"queue_timeout")")) << c.text();
    EXPECT_TRUE(has(c.text(), "no capacity within 250 ms; The system is busy")) << c.text();
  }
  EXPECT_EQ(gateway.terminate(), 0);
  EXPECT_EQ(mock.terminate(), 0);
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
