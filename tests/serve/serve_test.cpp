// tests/serve/serve_test.cpp — `fairgate serve` end to end (ctest -L serve).
//
// Starts real `fairgate serve` processes (the binary the build produced) on
// free loopback ports, on a real redis-server (tests/support) or on the memory
// backend, and drives them with HTTP/SSE clients written in Node
// (serve_client.mjs, which checks what the clients see and exits 1 on a
// failure). Every process is stopped with SIGTERM and must exit 0 (graceful
// shutdown); only pids this test started are signalled. Every wait is bounded.
#include "harness.hpp"
#include "support/redis_server.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <regex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using namespace fairgate::test;

constexpr const char* kToken = "test-token";

/// The limits the tests rely on (hostile: header timeout 1 s, idle 2 s, 64 connections).
std::string base_config(const std::string& extra = "") {
  return std::string("admin_token = \"") + kToken +
         "\"\n"
         "[server]\n"
         "header_timeout_ms = 1000\n"
         "idle_timeout_ms = 2000\n"
         "max_connections = 64\n"
         "keepalive_ms = 500\n" +
         extra;
}

/// Runs serve_client.mjs against `servers`; `on_line` sees each output line as it comes.
ClientRun run_client(const std::string& scenario, const std::vector<Serve*>& servers,
                     const std::vector<std::string>& args,
                     const std::function<void(const std::string&)>& on_line = {}) {
  std::string urls;
  for (const auto* s : servers) urls += (urls.empty() ? "" : ",") + s->url();
  std::vector<std::string> argv{SERVE_CLIENT, scenario, "--urls", urls, "--token", kToken};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_node(argv, on_line);
}

std::vector<std::string> redis_args(const std::string& instance) {
  return {"--redis", fairgate::test::RedisServer::shared().url(), "--instance", instance};
}

/// n servers on the shared redis-server, each with `limiter`.
std::vector<std::unique_ptr<Serve>> redis_cluster(int n, const std::string& limiter, const std::string& test,
                                                  const std::string& extra_config = "") {
  std::vector<std::unique_ptr<Serve>> servers;
  for (int i = 0; i < n; ++i) {
    auto args = redis_args(test + "-" + std::to_string(i));
    args.insert(args.end(), {"--limiter", limiter});
    servers.push_back(std::make_unique<Serve>(base_config(extra_config), args));
  }
  return servers;
}

std::vector<Serve*> raw(const std::vector<std::unique_ptr<Serve>>& v) {
  std::vector<Serve*> out;
  for (const auto& s : v) out.push_back(s.get());
  return out;
}

void expect_clean_exit(std::vector<std::unique_ptr<Serve>>& servers) {
  for (auto& s : servers) EXPECT_EQ(s->terminate(), 0) << "SIGTERM must end fairgate serve with exit code 0";
}

// --- Redis: three instances, one limiter --------------------------------------

TEST(ServeRedis, ThreeInstancesSixtySseClientsCapFifoAllGranted) {
  SKIP_WITHOUT_NODE();
  auto servers = redis_cluster(3, "fifo-a=3", "fifo");
  const auto run = run_client("fifo", raw(servers),
                              {"--limiter", "fifo-a", "--cap", "3", "--clients", "60", "--gap", "5",
                               "--hold_min", "50", "--hold_max", "150"});
  EXPECT_CLIENT_OK(run);
  expect_clean_exit(servers);
}

TEST(ServeRedis, MaxWaitShorterThanQueueRejectsLateOnesWithTimeout) {
  SKIP_WITHOUT_NODE();
  auto servers = redis_cluster(3, "timeout-a=2", "timeout");
  const auto run = run_client("timeout", raw(servers),
                              {"--limiter", "timeout-a", "--clients", "24", "--max_wait_ms", "400", "--hold",
                               "100", "--late_ms", kSanitized ? "3000" : "1500"});
  EXPECT_CLIENT_OK(run);
  expect_clean_exit(servers);
}

TEST(ServeRedis, DisconnectsWhileQueuedAndWhileHoldingKeepQueueAndHoldersExact) {
  SKIP_WITHOUT_NODE();
  auto servers = redis_cluster(3, "disconnect-a=2", "disconnect");
  const auto run =
      run_client("disconnect", raw(servers),
                 {"--limiter", "disconnect-a", "--cap", "2", "--waiters", "4", "--exact_positions", "0"});
  EXPECT_CLIENT_OK(run);
  expect_clean_exit(servers);
}

TEST(ServeRedis, LongPollLeaseRenewDeleteAndAdminOnEveryInstance) {
  SKIP_WITHOUT_NODE();
  auto servers = redis_cluster(2, "longpoll-a=1", "longpoll");
  const auto run = run_client("longpoll", raw(servers), {"--limiter", "longpoll-a"});
  EXPECT_CLIENT_OK(run);
  EXPECT_NE(run.output.find("\"redis\":\"up\""), std::string::npos) << "healthz should report redis up";
  expect_clean_exit(servers);
}

TEST(ServeRedis, SigtermReleasesHeldPermitsAndLeavesTheQueue) {
  // A long liveness TTL: a grant within a few seconds can only come from an
  // explicit release at shutdown, not from reaping a dead instance. (No
  // recovery fence: the new limiter would otherwise grant nothing for 21 s.)
  std::vector<std::unique_ptr<Serve>> servers;
  for (int i = 0; i < 2; ++i) {
    auto args = redis_args("sigterm-" + std::to_string(i));
    args.insert(args.end(), {"--limiter", "sigterm-a=1"});
    servers.push_back(std::make_unique<Serve>(
        "admin_token = \"t\"\n[redis]\nliveness_ttl_ms = 20000\nheartbeat_ms = 1000\nrecovery_fence_ms = 0\n",
        args));
  }
  Serve& a = *servers[0];
  Serve& b = *servers[1];
  RawSse holder(a.url(), "sigterm-a");
  ASSERT_TRUE(holder.wait_for("event: granted", 10s)) << holder.data();
  RawSse waiter_a(a.url(), "sigterm-a");
  ASSERT_TRUE(waiter_a.wait_for("event: queued", 10s)) << waiter_a.data();
  RawSse waiter_b(b.url(), "sigterm-a");
  ASSERT_TRUE(waiter_b.wait_for("\"position\":2", 10s)) << waiter_b.data();

  const auto t0 = Clock::now();
  EXPECT_EQ(a.terminate(), 0);
  // A's waiter hears why, and its stream ends; A's permit goes back at once,
  // so B's waiter (second in line, behind A's waiter that left) is granted.
  EXPECT_TRUE(waiter_a.wait_for("event: rejected", 5s)) << waiter_a.data();
  EXPECT_NE(waiter_a.data().find("\"reason\":\"unavailable\""), std::string::npos) << waiter_a.data();
  EXPECT_TRUE(holder.wait_for("event: closing", 5s)) << holder.data();
  EXPECT_TRUE(holder.wait_closed(5s)) << "the holder's stream must end at shutdown";
  ASSERT_TRUE(waiter_b.wait_for("event: granted", kSanitized ? 10s : 5s)) << waiter_b.data();
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  std::printf("B granted %lld ms after SIGTERM to A (liveness TTL 20000 ms)\n",
              static_cast<long long>(waited.count()));
  EXPECT_EQ(b.terminate(), 0);
}

/// The first capture of `pattern` (one group) in `text`, or "".
std::string first_capture(const std::string& text, const std::string& pattern) {
  std::smatch m;
  return std::regex_search(text, m, std::regex(pattern)) ? m[1].str() : std::string();
}

/// Issue 15, cluster-wide status: GET /v1/limiters/{name} on either of two
/// instances lists the holder and the waiter of both, with instance, tenant
/// and age, under the ids their SSE streams were given; totals, paging with
/// offset/limit, a bad parameter is 400.
TEST(ServeRedis, StatusOnEitherInstanceListsTheHoldersAndQueueOfBoth) {
  auto servers = redis_cluster(2, "status-a=1", "status");
  RawSse holder(servers[0]->url(), "status-a", "?tenant=t-hold");
  ASSERT_TRUE(holder.wait_for("event: granted", 10s)) << holder.data();
  ASSERT_TRUE(holder.wait_for("}\n\n", 10s)) << holder.data();
  const std::string permit = first_capture(holder.data(), R"re("permit":"([^"]+)")re");
  ASSERT_EQ(permit.rfind("status-0|", 0), 0u) << holder.data();
  RawSse waiter(servers[1]->url(), "status-a", "?tenant=t-wait");
  ASSERT_TRUE(waiter.wait_for("event: queued", 10s)) << waiter.data();
  ASSERT_TRUE(waiter.wait_for("}\n\n", 10s)) << waiter.data();
  const std::string ticket = first_capture(waiter.data(), R"re("ticket":"([^"]+)")re");
  ASSERT_EQ(ticket.rfind("status-1|", 0), 0u) << waiter.data();
  std::this_thread::sleep_for(200ms);
  const auto get = [&](const Serve& s, const std::string& query) {
    return http_exchange(
        s.url(), "GET /v1/limiters/status-a" + query + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  };
  for (const auto& s : servers) {
    const auto r = get(*s, "");
    ASSERT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
    EXPECT_NE(r.find(R"("in_use":1,"queued":1)"), std::string::npos) << r;
    EXPECT_NE(r.find(R"("holders":[{"permit":")" + permit + R"(","tenant":"t-hold","held_ms":)"),
              std::string::npos)
        << r;
    EXPECT_NE(r.find(R"(,"instance":"status-0"}])"), std::string::npos) << r;
    EXPECT_NE(r.find(R"("queue":[{"ticket":")" + ticket + R"(","tenant":"t-wait","position":1,"waited_ms":)"),
              std::string::npos)
        << r;
    EXPECT_NE(r.find(R"(,"instance":"status-1"}])"), std::string::npos) << r;
    EXPECT_GE(std::stoll(first_capture(r, R"re("held_ms":([0-9]+))re")), 150) << r;
    EXPECT_GE(std::stoll(first_capture(r, R"re("waited_ms":([0-9]+))re")), 150) << r;
    EXPECT_NE(r.find(R"("offset":0,"limit":100,"holders_total":1,"queue_total":1)"), std::string::npos) << r;
    EXPECT_NE(r.find(R"("instances":["status-0","status-1"])"), std::string::npos) << r;
    const auto page = get(*s, "?offset=1&limit=5");
    ASSERT_EQ(page.rfind("HTTP/1.1 200", 0), 0u) << page;
    EXPECT_NE(page.find(R"("holders":[],"queue":[])"), std::string::npos) << page;
    EXPECT_NE(page.find(R"("offset":1,"limit":5,"holders_total":1,"queue_total":1)"), std::string::npos)
        << page;
    const auto bad = get(*s, "?limit=5000");
    EXPECT_EQ(bad.rfind("HTTP/1.1 400", 0), 0u) << bad;
    EXPECT_NE(bad.find("limit: 5000 not in 0..1000"), std::string::npos) << bad;
    EXPECT_EQ(get(*s, "?page=2").rfind("HTTP/1.1 400", 0), 0u);
  }
  expect_clean_exit(servers);
}

TEST(ServeConfigFile, EveryKeyOfTheExampleIsReadAndRedisDownIsReported) {
  // The example's Redis is a closed port: the server starts anyway, says so on
  // /healthz, and answers acquires with 503 unavailable instead of hanging.
  Child child({FAIRGATE_BIN, "serve", "--config", SERVE_CONFIGS "/example.toml"}, false);
  std::string line, url, out;
  const std::regex listening("listening on (http://127\\.0\\.0\\.1:[0-9]+)");
  while (url.empty() && child.read_line(line, kSanitized ? 60s : 20s)) {
    out += line + "\n";
    std::smatch m;
    if (std::regex_search(line, m, listening)) url = m[1];
  }
  ASSERT_FALSE(url.empty()) << out;
  EXPECT_NE(line.find("instance example-1, limiters chat=3, document-upload=10"), std::string::npos) << line;
  const auto limiters =
      http_exchange(url, "GET /v1/limiters HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_NE(
      limiters.find(
          R"("name":"chat","max_concurrent":3,"in_use":0,"queued":0,"max_wait_ms":20000,"max_queue":1000,"enabled":true,"when_disabled":"reject","backend":"redis")"),
      std::string::npos)
      << limiters;
  EXPECT_NE(limiters.find(R"("name":"document-upload","max_concurrent":10)"), std::string::npos) << limiters;
  EXPECT_NE(
      limiters.find(R"("degraded":false,"reject_early":false,"tenant_fairness":true,"max_per_tenant":2)"),
      std::string::npos)
      << limiters;
  EXPECT_NE(limiters.find(R"("on_redis_down":"local","local_share":1)"), std::string::npos) << limiters;
  EXPECT_NE(limiters.find(R"("name":"document-upload")"), std::string::npos) << limiters;
  // document-upload runs on_redis_down = closed: rejected at once, 503.
  const auto acquire = http_exchange(url,
                                     "POST /v1/limiters/document-upload/acquire?max_wait_ms=10000 "
                                     "HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(acquire.rfind("HTTP/1.1 503", 0), 0u) << acquire;
  EXPECT_NE(acquire.find(R"("reason":"unavailable")"), std::string::npos) << acquire;
  // chat runs local with local_share = 1: once degraded (1 s), one request is served locally.
  const auto local = http_exchange(
      url,
      "POST /v1/limiters/chat/acquire?max_wait_ms=5000 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(local.rfind("HTTP/1.1 200", 0), 0u) << local;
  EXPECT_NE(local.find(R"("permit":")"), std::string::npos) << local;
  const auto health = http_exchange(url, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(health.rfind("HTTP/1.1 200", 0), 0u) << "chat can still admit: " << health;
  EXPECT_NE(health.find(R"({"status":"degraded","redis":"down")"), std::string::npos) << health;
  // A change Redis cannot confirm is not answered 200 (it would be undone at
  // the next heartbeat): 503 with the reason, nothing changed.
  const std::string body = R"({"max_concurrent":5})";
  const auto put = http_exchange(url,
                                 "PUT /v1/limiters/chat HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                 "Authorization: Bearer change-me\r\nContent-Type: application/json\r\n"
                                 "Content-Length: " +
                                     std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(put.rfind("HTTP/1.1 503", 0), 0u) << put;
  EXPECT_NE(put.find("Redis did not confirm the change"), std::string::npos) << put;
  const auto after = http_exchange(url, "GET /v1/limiters HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_NE(after.find(R"("name":"chat","max_concurrent":3)"), std::string::npos) << after;
  // The cluster-wide holders and queue need Redis: 503 with the reason.
  const auto detail =
      http_exchange(url, "GET /v1/limiters/chat HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(detail.rfind("HTTP/1.1 503", 0), 0u) << detail;
  EXPECT_NE(detail.find(R"("reason":"unavailable")"), std::string::npos) << detail;
  EXPECT_NE(detail.find("Retry-After: 1\r\n"), std::string::npos) << detail;
  EXPECT_EQ(child.stop(SIGTERM, kSanitized ? 60s : 20s), 0);
}

// --- Memory backend: one instance -------------------------------------------

std::unique_ptr<Serve> memory_server(const std::string& limiter, const std::string& extra_config = "") {
  return std::make_unique<Serve>(base_config(extra_config), std::vector<std::string>{"--limiter", limiter});
}

/// SIGTERM (docs/api.md, `event: closing`): a holder's stream and an events
/// watcher's are told `closing` (reason shutdown) before they end; a waiter
/// hears `rejected` (unavailable) and no `closing`.
TEST(ServeMemory, SigtermTellsHoldersAndWatchersClosingThenEndsTheirStreams) {
  auto s = memory_server("bye=1");
  RawSse holder(s->url(), "bye");
  ASSERT_TRUE(holder.wait_for("event: granted", 10s)) << holder.data();
  RawSse waiter(s->url(), "bye");
  ASSERT_TRUE(waiter.wait_for("event: queued", 10s)) << waiter.data();
  RawSse watcher = RawSse::events(s->url());
  ASSERT_TRUE(watcher.wait_for("event: snapshot", 10s)) << watcher.data();
  EXPECT_EQ(s->terminate(), 0);
  EXPECT_TRUE(holder.wait_for("event: closing\ndata: {\"reason\":\"shutdown\"", 5s)) << holder.data();
  EXPECT_TRUE(holder.wait_closed(5s));
  EXPECT_TRUE(watcher.wait_for("event: closing", 5s)) << watcher.data();
  EXPECT_TRUE(watcher.wait_closed(5s));
  EXPECT_TRUE(waiter.wait_for("event: rejected", 5s)) << waiter.data();
  EXPECT_TRUE(waiter.wait_closed(5s));
  EXPECT_EQ(waiter.data().find("event: closing"), std::string::npos) << waiter.data();
}

/// SIGHUP is ignored (docs/serve.md, "Signals"): the server keeps serving and
/// a permit it holds stays held; SIGTERM then still ends it with exit 0.
TEST(ServeMemory, SighupDoesNotKillAndHeldPermitStaysHeld) {
  auto s = memory_server("hup=1");
  const std::string acquire =
      "POST /v1/limiters/hup/acquire?max_wait_ms=200&lease_ms=600000 HTTP/1.1\r\nHost: x\r\n"
      "Connection: close\r\nContent-Length: 0\r\n\r\n";
  const auto first = http_exchange(s->url(), acquire);
  ASSERT_EQ(first.rfind("HTTP/1.1 200", 0), 0u) << first;
  ASSERT_EQ(::kill(s->pid(), SIGHUP), 0);
  ASSERT_EQ(::kill(s->pid(), SIGHUP), 0);
  // Still alive, still answering, and the permit is still held: a second
  // acquire of the only seat times out, and the limiter shows 1 in use.
  const std::string health = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  std::string reply;
  const auto deadline = Clock::now() + (kSanitized ? 30s : 10s);
  while (Clock::now() < deadline) {  // the signal is asynchronous: ask until it must have arrived
    reply = http_exchange(s->url(), health);
    if (reply.empty()) break;
    if (reply.rfind("HTTP/1.1 200", 0) == 0) break;
  }
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << "after SIGHUP: " << reply;
  std::this_thread::sleep_for(200ms);  // a late fatal SIGHUP would have ended it by now
  const auto second = http_exchange(s->url(), acquire);
  EXPECT_EQ(second.rfind("HTTP/1.1 429", 0), 0u) << second;
  EXPECT_NE(second.find(R"("reason":"timeout")"), std::string::npos) << second;
  const auto limiter =
      http_exchange(s->url(), "GET /v1/limiters/hup HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_NE(limiter.find(R"("in_use":1)"), std::string::npos) << limiter;
  EXPECT_EQ(s->terminate(), 0) << "SIGTERM after SIGHUP must still end fairgate serve with exit code 0";
}

TEST(ServeMemory, ShadowModeLetsEverythingThroughReportsAndSwitchesAtRunTime) {
  auto s = memory_server("chat=1,max_wait=300ms,mode=shadow");
  const auto get = [&](const std::string& path) {
    return http_exchange(s->url(), "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  };
  const auto put = [&](const std::string& body) {
    return http_exchange(s->url(),
                         "PUT /v1/limiters/chat HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                         "Authorization: Bearer " +
                             std::string(kToken) + "\r\nContent-Type: application/json\r\nContent-Length: " +
                             std::to_string(body.size()) + "\r\n\r\n" + body);
  };
  const std::string acquire =
      "POST /v1/limiters/chat/acquire?lease_ms=600000 HTTP/1.1\r\nHost: x\r\n"
      "Connection: close\r\nContent-Length: 0\r\n\r\n";
  // Cap 1, three at once: all let through, none waited.
  for (int i = 0; i < 3; ++i) {
    const auto r = http_exchange(s->url(), acquire);
    ASSERT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
    EXPECT_NE(r.find(R"("ticket":"shadow-)"), std::string::npos) << r;
  }
  // Enforcing, the 2nd and 3rd would have timed out after 300 ms.
  std::string status;
  const auto deadline = Clock::now() + (kSanitized ? 30s : 10s);
  while (Clock::now() < deadline) {
    status = get("/v1/limiters/chat");
    if (status.find(R"("would_timeout":2)") != std::string::npos) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_NE(
      status.find(R"("mode":"shadow","shadow":{"passed":3,"in_flight":3,"would_grant":1,"would_queue":0,)"
                  R"("would_wait":0,"would_timeout":2,"would_reject":0,"would_end_by_reason":{"timeout":2})"),
      std::string::npos)
      << status;
  EXPECT_NE(status.find(R"("in_use":1,"queued":0)"), std::string::npos) << "the would-be holder: " << status;
  const auto metrics = get("/metrics");
  EXPECT_NE(metrics.find("fairgate_shadow{limiter=\"chat\"} 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("fairgate_shadow_passed_total{limiter=\"chat\"} 3\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("fairgate_shadow_would_end_total{limiter=\"chat\",reason=\"timeout\"} 2\n"),
            std::string::npos)
      << metrics;

  // A bad mode is refused; enforce takes effect at once, and the shadow of the
  // request still running keeps its seat: a newcomer times out.
  const auto bad = put(R"({"mode":"dry-run"})");
  EXPECT_EQ(bad.rfind("HTTP/1.1 400", 0), 0u) << bad;
  EXPECT_NE(bad.find(R"(mode: must be \"enforce\" or \"shadow\")"), std::string::npos) << bad;
  const auto on = put(R"({"mode":"enforce"})");
  ASSERT_EQ(on.rfind("HTTP/1.1 200", 0), 0u) << on;
  const auto refused = http_exchange(s->url(),
                                     "POST /v1/limiters/chat/acquire?max_wait_ms=100 HTTP/1.1\r\nHost: x\r\n"
                                     "Connection: close\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(refused.rfind("HTTP/1.1 429", 0), 0u) << refused;
  EXPECT_NE(get("/v1/limiters/chat").find(R"("mode":"enforce")"), std::string::npos);
  EXPECT_EQ(s->terminate(), 0);
}

TEST(ServeMemory, SixtySseClientsCapFifoAllGranted) {
  SKIP_WITHOUT_NODE();
  auto s = memory_server("chat=3");
  const auto run = run_client("fifo", {s.get()}, {"--limiter", "chat", "--cap", "3", "--clients", "60"});
  EXPECT_CLIENT_OK(run);
  EXPECT_EQ(s->terminate(), 0);
}

TEST(ServeMemory, MaxWaitShorterThanQueueRejectsLateOnesWithTimeout) {
  SKIP_WITHOUT_NODE();
  auto s = memory_server("chat=2");
  const auto run = run_client("timeout", {s.get()},
                              {"--limiter", "chat", "--clients", "20", "--max_wait_ms", "300", "--hold",
                               "100", "--late_ms", kSanitized ? "3000" : "1000"});
  EXPECT_CLIENT_OK(run);
  EXPECT_EQ(s->terminate(), 0);
}

TEST(ServeMemory, DisconnectsWhileQueuedAndWhileHoldingKeepQueueAndHoldersExact) {
  SKIP_WITHOUT_NODE();
  auto s = memory_server("chat=2");
  const auto run = run_client("disconnect", {s.get()}, {"--limiter", "chat", "--cap", "2", "--waiters", "4"});
  EXPECT_CLIENT_OK(run);
  EXPECT_EQ(s->terminate(), 0);
}

TEST(ServeMemory, GarbageOversizedSlowAndHostileRequestsGet4xxAndServerKeepsServing) {
  SKIP_WITHOUT_NODE();
  auto s = memory_server("chat=2");
  const auto run = run_client("hostile", {s.get()}, {"--limiter", "chat"});
  EXPECT_CLIENT_OK(run);
  EXPECT_EQ(s->terminate(), 0);
}

TEST(ServeMemory, LongPollLeaseRenewDeleteEventsMetricsAdmin) {
  SKIP_WITHOUT_NODE();
  auto s = memory_server("chat=1");
  const auto run = run_client("longpoll", {s.get()}, {"--limiter", "chat"});
  EXPECT_CLIENT_OK(run);
  EXPECT_EQ(s->terminate(), 0);
}

TEST(ServeMemory, PerClientCapOnWaitingRequests) {
  SKIP_WITHOUT_NODE();
  auto s = memory_server("chat=1", "max_waiters_per_client = 3\n");
  const auto run = run_client("clientcap", {s.get()}, {"--limiter", "chat", "--client_cap", "3"});
  EXPECT_CLIENT_OK(run);
  EXPECT_EQ(s->terminate(), 0);
}

/// The first capture of `pattern` (one group) in `text`, or "".
std::string capture(const std::string& text, const std::string& pattern) {
  std::smatch m;
  return std::regex_search(text, m, std::regex(pattern)) ? m[1].str() : std::string();
}

/// Issue 15: the id an SSE client is given is the one GET /v1/limiters/{name}
/// lists for it (queue ticket, then holder permit), and a long-poll permit's
/// `ticket` is the holder id GET lists (its `permit` stays the lease token).
/// Without history a queued event carries no estimate, and a 1 s max_wait
/// does not get a Retry-After longer than 1 s.
TEST(ServeMemory, SseAndLongPollIdsAreTheIdsTheStatusListsAndNoHistoryMeansNoEstimate) {
  auto s = memory_server("ids=1");
  const auto lp = http_exchange(s->url(),
                                "POST /v1/limiters/ids/acquire?lease_ms=600000 HTTP/1.1\r\nHost: x\r\n"
                                "Connection: close\r\nContent-Length: 0\r\n\r\n");
  ASSERT_EQ(lp.rfind("HTTP/1.1 200", 0), 0u) << lp;
  const std::string token = capture(lp, R"re("permit":"(lp-[0-9a-f]+)")re");
  const std::string lp_id = capture(lp, R"re("ticket":"([^"]+)")re");
  ASSERT_FALSE(token.empty()) << lp;
  ASSERT_FALSE(lp_id.empty()) << lp;
  const std::string status_req = "GET /v1/limiters/ids HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  auto status = http_exchange(s->url(), status_req);
  EXPECT_NE(status.find(R"("permit":")" + lp_id + "\""), std::string::npos) << lp_id << " in " << status;

  RawSse waiter(s->url(), "ids");
  ASSERT_TRUE(waiter.wait_for("event: queued", 10s)) << waiter.data();
  ASSERT_TRUE(waiter.wait_for("}\n\n", 10s)) << waiter.data();
  const std::string ticket = capture(waiter.data(), R"re("ticket":"([^"]+)")re");
  ASSERT_FALSE(ticket.empty()) << waiter.data();
  EXPECT_EQ(waiter.data().find("estimated_wait_ms"), std::string::npos) << "no history: " << waiter.data();
  status = http_exchange(s->url(), status_req);
  EXPECT_NE(status.find(R"("ticket":")" + ticket + "\""), std::string::npos) << ticket << " in " << status;

  const auto busy = http_exchange(s->url(),
                                  "POST /v1/limiters/ids/acquire?max_wait_ms=1000 HTTP/1.1\r\nHost: x\r\n"
                                  "Connection: close\r\nContent-Length: 0\r\n\r\n");
  ASSERT_EQ(busy.rfind("HTTP/1.1 429", 0), 0u) << busy;
  EXPECT_NE(busy.find("Retry-After: 1\r\n"), std::string::npos) << busy;

  const auto del = http_exchange(
      s->url(), "DELETE /v1/permits/" + token + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  ASSERT_EQ(del.rfind("HTTP/1.1 204", 0), 0u) << del;
  ASSERT_TRUE(waiter.wait_for("event: granted", 10s)) << waiter.data();
  ASSERT_TRUE(waiter.wait_for("\"}\n\n", 10s)) << waiter.data();
  const auto granted = waiter.data().substr(waiter.data().find("event: granted"));
  EXPECT_EQ(capture(granted, R"re("permit":"([^"]+)")re"), ticket) << granted;
  EXPECT_EQ(capture(granted, R"re("ticket":"([^"]+)")re"), ticket) << granted;
  status = http_exchange(s->url(), status_req);
  EXPECT_NE(status.find(R"("permit":")" + ticket + "\""), std::string::npos) << ticket << " in " << status;
  EXPECT_EQ(s->terminate(), 0);
}

/// Issue 12 item 9: renew reads lease_ms as acquire does (a whole number in
/// 100..server.max_lease_ms, else 400 with the reason) and honours it: the
/// lease runs from now for that long, and it is the permit's lease length from
/// then on (a renew without lease_ms keeps the current length).
TEST(ServeMemory, RenewChecksAndHonoursLeaseMs) {
  auto s = memory_server("renew=1", "max_lease_ms = 600000\n");
  const auto post = [&](const std::string& target, const std::string& body = "") {
    return http_exchange(s->url(), "POST " + target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" +
                                       (body.empty() ? "" : "Content-Type: application/json\r\n") +
                                       "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  };
  const auto lp = post("/v1/limiters/renew/acquire?lease_ms=600000");
  ASSERT_EQ(lp.rfind("HTTP/1.1 200", 0), 0u) << lp;
  const std::string token = capture(lp, R"re("permit":"(lp-[0-9a-f]+)")re");
  ASSERT_FALSE(token.empty()) << lp;
  const std::string renew = "/v1/permits/" + token + "/renew";

  const std::vector<std::pair<std::string, std::string>> refused = {
      {renew + "?lease_ms=abc", R"("lease_ms: \"abc\" is not a whole number")"},
      {renew + "?lease_ms=99", R"("lease_ms: 99 not in 100..600000")"},
      {renew + "?lease_ms=600001", R"("lease_ms: 600001 not in 100..600000")"},
      {renew + "?max_wait_ms=5", R"x("unknown parameter \"max_wait_ms\" (use lease_ms)")x"},
  };
  for (const auto& [target, message] : refused) {
    const auto r = post(target);
    EXPECT_EQ(r.rfind("HTTP/1.1 400", 0), 0u) << target << ": " << r;
    EXPECT_NE(r.find(message), std::string::npos) << target << ": " << r;
  }
  auto r = post(renew, R"({"lease_ms":"abc"})");
  EXPECT_EQ(r.rfind("HTTP/1.1 400", 0), 0u) << r;
  EXPECT_NE(r.find(R"("lease_ms: must be a whole number")"), std::string::npos) << r;
  r = post(renew, "{oops");
  EXPECT_EQ(r.rfind("HTTP/1.1 400", 0), 0u) << r;

  r = post(renew);
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  EXPECT_NE(r.find(R"({"lease_ms":600000})"), std::string::npos) << "the lease asked at acquire: " << r;
  r = post(renew, R"({"lease_ms":20000})");
  EXPECT_NE(r.find(R"({"lease_ms":20000})"), std::string::npos) << r;
  r = post(renew);
  EXPECT_NE(r.find(R"({"lease_ms":20000})"), std::string::npos) << "the length renewed last: " << r;

  // A short lease from now: the permit is released when it runs out (the
  // sweep runs every 100 ms), and the next acquire gets it.
  r = post(renew + "?lease_ms=300");
  EXPECT_NE(r.find(R"({"lease_ms":300})"), std::string::npos) << r;
  const auto t0 = Clock::now();
  const auto next = post("/v1/limiters/renew/acquire?max_wait_ms=10000&lease_ms=600000");
  EXPECT_EQ(next.rfind("HTTP/1.1 200", 0), 0u) << "the 300 ms lease ran out: " << next;
  EXPECT_LT(Clock::now() - t0, 5s);
  EXPECT_EQ(post(renew).rfind("HTTP/1.1 404", 0), 0u) << "expired";
  EXPECT_EQ(s->terminate(), 0);
}

/// A keep-alive client that sends its next request while a long-poll acquire
/// still waits (pipelined) gets both answers on that connection: the waiting
/// request's disconnect watch keeps the bytes it reads for the next request
/// (before, it dropped them and closed the connection after the first answer).
TEST(ServeMemory, ARequestSentWhileALongPollWaitsIsServedNext) {
  const auto has = [](const std::string& text, std::string_view what) {
    return text.find(what) != std::string::npos;
  };
  auto s = memory_server("pipe=1", "max_lease_ms = 600000\n");
  const auto exchange = [&](const std::string& head) {
    return http_exchange(s->url(),
                         head + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
  };
  const std::string held = exchange("POST /v1/limiters/pipe/acquire?lease_ms=600000");
  ASSERT_EQ(held.rfind("HTTP/1.1 200", 0), 0u) << held;
  const std::string token = first_capture(held, R"re("permit":"([^"]+)")re");
  ASSERT_FALSE(token.empty()) << held;

  const int fd = connect_loopback(s->url());
  ASSERT_GE(fd, 0);
  const std::string both =
      "POST /v1/limiters/pipe/acquire?max_wait_ms=20000 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
  ASSERT_EQ(::send(fd, both.data(), both.size(), MSG_NOSIGNAL), static_cast<ssize_t>(both.size()));
  // Queued (the one permit is held), then the next request on the same connection.
  const auto queued = [&] { return has(exchange("GET /v1/limiters/pipe"), R"("queued":1,)"); };
  const auto deadline = Clock::now() + 10s;
  while (!queued() && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(queued());
  const std::string next = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(::send(fd, next.data(), next.size(), MSG_NOSIGNAL), static_cast<ssize_t>(next.size()));
  std::this_thread::sleep_for(200ms);  // the bytes reach the server while the acquire still waits
  EXPECT_EQ(exchange("DELETE /v1/permits/" + token).rfind("HTTP/1.1 204", 0), 0u);

  const std::string text = read_until_closed(fd, kSanitized ? 60s : 20s);
  ::close(fd);
  EXPECT_EQ(text.rfind("HTTP/1.1 200", 0), 0u) << text;
  EXPECT_TRUE(has(text, R"("permit":")")) << text;
  const auto second = text.find("HTTP/1.1 200", 1);
  ASSERT_NE(second, std::string::npos) << "the pipelined request got no answer:\n" << text;
  EXPECT_TRUE(has(text.substr(second), R"("status":"ok")")) << text.substr(second);

  // The pipelined acquire holds the permit now. A waiter that sends more than the
  // watch keeps (watch_disconnect, 64 KiB), then leaves, is still seen leaving.
  const int junk = connect_loopback(s->url());
  ASSERT_GE(junk, 0);
  const std::string waits =
      "POST /v1/limiters/pipe/acquire?max_wait_ms=60000 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
  ASSERT_EQ(::send(junk, waits.data(), waits.size(), MSG_NOSIGNAL), static_cast<ssize_t>(waits.size()));
  const auto queue_is = [&](int n) {
    return has(exchange("GET /v1/limiters/pipe"), "\"queued\":" + std::to_string(n) + ",");
  };
  const auto until_queue = [&](int n) {
    const auto limit = Clock::now() + (kSanitized ? 30s : 10s);
    while (!queue_is(n) && Clock::now() < limit) std::this_thread::sleep_for(20ms);
    return queue_is(n);
  };
  ASSERT_TRUE(until_queue(1));
  const std::string filler(200 * 1024, 'x');
  std::size_t sent = 0;
  while (sent < filler.size()) {
    const auto n = ::send(junk, filler.data() + sent, filler.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<std::size_t>(n);
  }
  EXPECT_EQ(sent, filler.size());
  std::this_thread::sleep_for(200ms);
  ::close(junk);
  EXPECT_TRUE(until_queue(0)) << "the waiter that left after 200 KiB is still queued";
  EXPECT_EQ(s->terminate(), 0);
}

/// HEAD (RFC 9110: a general-purpose server supports GET and HEAD): the GET of
/// a route that reads answers with its header, Content-Length the GET's body's,
/// and no body, so the next answer on the connection follows right after it;
/// an error to a HEAD has no body either; a HEAD of the acquire takes no
/// permit (405); /v1/events gives its header and closes. Before, every HEAD
/// was a 405, and its error body would have followed a HEAD's header.
TEST(ServeMemory, HeadIsTheGetsHeaderWithoutItsBody) {
  auto s = memory_server("head=1");
  const auto header_end = [](const std::string& text) {
    const auto end = text.find("\r\n\r\n");
    return end == std::string::npos ? end : end + 4;
  };
  const auto content_length = [](const std::string& header) -> long long {
    const std::string v = first_capture(header, "Content-Length: ([0-9]+)\r\n");
    return v.empty() ? -1 : std::stoll(v);
  };
  const std::string then_get = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  const auto head_then_get = [&](const std::string& path) {
    return http_exchange(s->url(), "HEAD " + path + " HTTP/1.1\r\nHost: x\r\n\r\n" + then_get);
  };
  const auto get_body = [&](const std::string& path) {
    const std::string text =
        http_exchange(s->url(), "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    return text.substr(std::min(text.size(), header_end(text)));
  };
  for (const std::string path : {"/healthz", "/dashboard", "/openapi.yaml", "/openapi.json", "/metrics",
                                 "/v1/limiters", "/v1/limiters/head", "/v1/ratelimit"}) {
    const std::string text = head_then_get(path);
    ASSERT_EQ(text.rfind("HTTP/1.1 200", 0), 0u) << path << ":\n" << text.substr(0, 300);
    const auto end = header_end(text);
    ASSERT_NE(end, std::string::npos) << path;
    EXPECT_EQ(text.compare(end, 12, "HTTP/1.1 200"), 0) << path << ": bytes after the HEAD's header:\n"
                                                        << text.substr(end, 200);
    const long long length = content_length(text.substr(0, end));
    EXPECT_GT(length, 0) << path;
    const bool fixed = path != "/metrics" && !path.starts_with("/v1/");  // the others change call to call
    if (fixed) {
      EXPECT_EQ(length, static_cast<long long>(get_body(path).size())) << path;
    }
  }
  // Errors to a HEAD: no body either.
  for (const auto& [path, status] :
       std::vector<std::pair<std::string, std::string>>{{"/v1/limiters/nope", "404"},
                                                        {"/nothing-here", "404"},
                                                        {"/v1/permits/x", "405"},
                                                        {"/v1/limiters/head/acquire", "405"}}) {
    const std::string text = head_then_get(path);
    ASSERT_EQ(text.rfind("HTTP/1.1 " + status, 0), 0u) << path << ":\n" << text.substr(0, 300);
    const auto end = header_end(text);
    ASSERT_NE(end, std::string::npos) << path;
    EXPECT_EQ(text.compare(end, 12, "HTTP/1.1 200"), 0) << path << ": bytes after the HEAD's header:\n"
                                                        << text.substr(end, 200);
  }
  EXPECT_NE(get_body("/v1/limiters/head").find(R"("in_use":0,)"), std::string::npos)
      << "a HEAD took a permit";
  // A 405 lists HEAD where a GET reads, not on the acquire (where it is the 405 itself).
  const auto allow = [&](const std::string& method, const std::string& path) {
    return first_capture(
        http_exchange(s->url(), method + " " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        "Allow: ([^\r]*)\r\n");
  };
  EXPECT_EQ(allow("PATCH", "/v1/limiters/head"), "GET, PUT, HEAD");
  EXPECT_EQ(allow("DELETE", "/healthz"), "GET, HEAD");
  EXPECT_EQ(allow("HEAD", "/v1/limiters/head/acquire"), "GET, POST");
  EXPECT_EQ(allow("PATCH", "/v1/permits/x"), "DELETE");
  // A target in absolute form (RFC 9112 3.2.2) is its path and query.
  const std::string absolute = http_exchange(
      s->url(), "GET http://x:1/v1/limiters/head?limit=5 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(absolute.rfind("HTTP/1.1 200", 0), 0u) << absolute.substr(0, 300);
  EXPECT_NE(absolute.find(R"("name":"head")"), std::string::npos) << absolute.substr(0, 300);
  const std::string events = http_exchange(s->url(), "HEAD /v1/events HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(events.rfind("HTTP/1.1 200", 0), 0u) << events;
  EXPECT_NE(events.find("text/event-stream"), std::string::npos) << events;
  EXPECT_EQ(header_end(events), events.size()) << "no event after the header: " << events;
  EXPECT_EQ(s->terminate(), 0);
}

/// S3: thousands of queued SSE clients on one instance and two I/O threads.
/// Reports RSS and threads while they wait (5,000; 1,000 under sanitizers).
TEST(ServeMemory, ThousandsOfQueuedSseClientsOnOneInstance) {
  SKIP_WITHOUT_NODE();
  const int clients = kSanitized ? 1000 : 5000;
  // Not base_config: its connection cap (64) is for the hostile test.
  auto s = std::make_unique<Serve>(std::string("admin_token = \"t\"\n[server]\nmax_connections = 20000\n"
                                               "max_waiters_per_client = 100000\n"),
                                   std::vector<std::string>{"--limiter", "chat=1"});
  // One holder first, so everyone else queues.
  RawSse holder(s->url(), "chat");
  ASSERT_TRUE(holder.wait_for("event: granted", 10s));
  std::string rss, threads;
  const auto run = run_client(
      "many", {s.get()},
      {"--limiter", "chat", "--clients", std::to_string(clients), "--holders", "0", "--in_use_after", "1"},
      [&](const std::string& line) {
        if (line.rfind("ready:", 0) != 0) return;
        std::ifstream status("/proc/" + std::to_string(s->pid()) + "/status");
        std::string l;
        while (std::getline(status, l)) {
          if (l.rfind("VmRSS:", 0) == 0) rss = l;
          if (l.rfind("Threads:", 0) == 0) threads = l;
        }
      });
  EXPECT_CLIENT_OK(run);
  std::printf("%d queued SSE clients: %s, %s\n", clients, rss.c_str(), threads.c_str());
  EXPECT_FALSE(rss.empty());
  EXPECT_EQ(s->terminate(), 0);
}

}  // namespace
