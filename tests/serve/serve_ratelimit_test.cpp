// tests/serve/serve_ratelimit_test.cpp — rate limits in `fairgate serve` end
// to end (ctest -L ratelimit): `[ratelimit.NAME]` rules, POST
// /v1/ratelimit/{rule} and its refund, GET/PUT of rules, /metrics and
// /healthz, and gateway routes with `ratelimit = [...]` (several rules, keys
// from headers, token budgets refunded from the upstream's usage) in front of
// a real `fairgate mock-llm`.
//
// Real `fairgate serve` processes on free loopback ports, on the memory
// backend and on a real redis-server (tests/support), spoken to over raw
// sockets. The rules refill slowly (one unit per minutes) so that what is
// allowed is exactly what the math says, whatever the machine's load: no
// assertion depends on timing, and every wait is bounded.
#include "harness.hpp"
#include "support/loopback.hpp"
#include "support/redis_server.hpp"

#include <boost/json.hpp>

#include <gtest/gtest.h>

#include <poll.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <vector>

namespace {

using namespace fairgate::test;
namespace json = boost::json;

constexpr const char* kToken = "rl-token";

struct Reply {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  json::value json() const {
    boost::system::error_code ec;
    auto v = json::parse(body, ec);
    return ec ? json::value() : v;
  }
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

std::string dechunk(const std::string& in) {
  std::string out;
  std::size_t pos = 0;
  while (pos < in.size()) {
    const auto eol = in.find("\r\n", pos);
    if (eol == std::string::npos) break;
    const std::size_t n = std::stoul(in.substr(pos, eol - pos), nullptr, 16);
    if (n == 0) break;
    out += in.substr(eol + 2, n);
    pos = eol + 2 + n + 2;
  }
  return out;
}

/// One HTTP/1.1 exchange ("Connection: close") over a raw socket.
Reply http(const std::string& url, const std::string& method, const std::string& path,
           const std::string& body = "", const std::vector<std::string>& headers = {}) {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n";
  for (const auto& h : headers) req += h + "\r\n";
  if (!body.empty() || method == "POST" || method == "PUT")
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  Reply r;
  const int fd = connect_loopback(url);
  if (fd < 0) return r;
  std::string raw;
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size()))
    raw = read_until_closed(fd, kSanitized ? 60s : 20s);
  ::close(fd);
  const auto end = raw.find("\r\n\r\n");
  if (raw.size() < 12 || end == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  std::size_t pos = raw.find("\r\n") + 2;
  while (pos < end) {
    const auto eol = raw.find("\r\n", pos);
    const std::string line = raw.substr(pos, eol - pos);
    const auto colon = line.find(':');
    std::string name = line.substr(0, colon);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    std::string value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.erase(0, 1);
    r.headers[name] = value;
    pos = eol + 2;
  }
  r.body = raw.substr(end + 4);
  if (r.header("transfer-encoding") == "chunked") r.body = dechunk(r.body);
  return r;
}

Reply check(const std::string& url, const std::string& rule, const std::string& body) {
  return http(url, "POST", "/v1/ratelimit/" + rule, body);
}

std::int64_t num(const json::value& v, const char* field) {
  const auto* p = v.is_object() ? v.as_object().if_contains(field) : nullptr;
  if (p == nullptr) return -999'999;
  if (p->is_int64()) return p->as_int64();
  if (p->is_uint64()) return static_cast<std::int64_t>(p->as_uint64());
  return -999'999;
}

std::string str(const json::value& v, const char* field) {
  const auto* p = v.is_object() ? v.as_object().if_contains(field) : nullptr;
  return p != nullptr && p->is_string() ? std::string(p->as_string()) : std::string();
}

/// The headers of a decision agree with its JSON body (docs/ratelimit.md, "In fairgate serve").
void expect_headers_match(const Reply& r, const std::string& rule, std::int64_t period_s) {
  const auto j = r.json();
  const std::int64_t remaining = num(j, "remaining");
  const std::int64_t reset_s = (num(j, "reset_ms") + 999) / 1000;
  EXPECT_EQ(r.header("x-ratelimit-limit"), std::to_string(num(j, "limit"))) << r.body;
  EXPECT_EQ(r.header("x-ratelimit-remaining"), std::to_string(remaining)) << r.body;
  EXPECT_EQ(r.header("x-ratelimit-reset"), std::to_string(reset_s)) << r.body;
  EXPECT_EQ(r.header("ratelimit"),
            "\"" + rule + "\";r=" + std::to_string(remaining) + ";t=" + std::to_string(reset_s));
  EXPECT_EQ(r.header("ratelimit-policy"),
            "\"" + rule + "\";q=" + std::to_string(num(j, "limit")) + ";w=" + std::to_string(period_s));
  if (r.status == 429 && num(j, "retry_after_ms") > 0) {
    EXPECT_EQ(r.header("retry-after"),
              std::to_string(std::max<std::int64_t>(1, (num(j, "retry_after_ms") + 999) / 1000)));
  }
  if (r.status == 200) {
    EXPECT_EQ(r.header("retry-after"), "");
  }
}

// A bucket of 5 that refills one unit every 2 minutes: nothing refills during a test.
const std::string kRules =
    "[ratelimit.five]\n"
    "algorithm = \"gcra\"\n"
    "rate = 5\n"
    "period_ms = 600000\n"
    "[ratelimit.window]\n"
    "algorithm = \"sliding_log\"\n"
    "rate = 3\n"
    "period_ms = 600000\n"
    "on_redis_down = \"closed\"\n";

std::string config(const std::string& extra = "") {
  return std::string("admin_token = \"") + kToken + "\"\n" + kRules + extra;
}

/// Exactly `rate` allowed, then 429 with consistent headers; a refund gives units back.
void exercise_bucket(const std::vector<std::string>& urls) {
  std::string first_decision;
  for (int i = 0; i < 5; ++i) {
    const Reply r = check(urls[i % urls.size()], "five", R"({"key":"u1"})");
    ASSERT_EQ(r.status, 200) << i << " " << r.body;
    const auto j = r.json();
    EXPECT_EQ(num(j, "remaining"), 4 - i) << r.body;
    EXPECT_EQ(num(j, "limit"), 5);
    EXPECT_EQ(num(j, "retry_after_ms"), 0);
    expect_headers_match(r, "five", 600);
    if (i == 0) first_decision = str(j, "decision");
  }
  for (std::size_t i = 0; i < urls.size() * 2; ++i) {
    const Reply r = check(urls[i % urls.size()], "five", R"({"key":"u1"})");
    ASSERT_EQ(r.status, 429) << r.body;
    const auto j = r.json();
    EXPECT_EQ(str(j, "reason"), "rate_limited");
    // One unit takes 120 s; at most a few seconds of it have passed.
    EXPECT_GT(num(j, "retry_after_ms"), 100'000) << r.body;
    EXPECT_LE(num(j, "retry_after_ms"), 120'000) << r.body;
    expect_headers_match(r, "five", 600);
  }
  // Another key is not affected.
  EXPECT_EQ(check(urls.back(), "five", R"({"key":"u2","cost":5})").status, 200);
  // The first decision took 1: refund it (on any instance) and exactly one more passes.
  ASSERT_FALSE(first_decision.empty());
  const Reply refund = http(urls.back(), "POST", "/v1/ratelimit/five/refund",
                            R"({"key":"u1","decision":")" + first_decision + R"(","amount":1})");
  ASSERT_EQ(refund.status, 200) << refund.body;
  EXPECT_EQ(num(refund.json(), "refunded"), 1) << refund.body;
  // No more back than it took.
  const Reply twice = http(urls.back(), "POST", "/v1/ratelimit/five/refund",
                           R"({"key":"u1","decision":")" + first_decision + R"(","amount":1})");
  EXPECT_EQ(twice.status, 400) << twice.body;
  // (On the instance that refunded: another instance's local layer may still
  // refuse the key until its block ends — docs/ratelimit.md, "Two layers".)
  EXPECT_EQ(check(urls.back(), "five", R"({"key":"u1"})").status, 200);
  EXPECT_EQ(check(urls.back(), "five", R"({"key":"u1"})").status, 429);
  EXPECT_EQ(check(urls.front(), "five", R"({"key":"u1"})").status, 429);
}

void exercise_bad_input(const std::string& url) {
  const auto bad = [&](const std::string& body, const std::string& message) {
    const Reply r = check(url, "five", body);
    EXPECT_EQ(r.status, 400) << body << " -> " << r.body;
    EXPECT_NE(r.body.find("\"reason\":\"bad_request\""), std::string::npos) << r.body;
    EXPECT_NE(r.body.find(message), std::string::npos) << body << " -> " << r.body;
  };
  bad("", "body must be a JSON object");
  bad("not json", "not valid JSON");
  bad(R"({"cost":1})", "key: missing");
  bad(R"({"key":""})", "key");
  bad(R"({"key":")" + std::string(513, 'k') + R"("})", "key");
  bad(R"({"key":"k","cost":-1})", "cost");
  bad(R"({"key":"k","cost":0})", "cost");
  bad(R"({"key":"k","cost":1.5})", "cost");
  bad(R"({"key":"k","cost":"NaN"})", "cost");
  bad(R"({"key":"k","cost":1e300})", "cost");
  bad(R"({"key":"k","cost":18446744073709551615})", "cost");
  bad(R"({"key":"k","cost":10000000000000})", "cost");
  bad(R"({"key":"k","costs":1})", "unknown field");
  const Reply unknown = check(url, "nope", R"({"key":"k"})");
  EXPECT_EQ(unknown.status, 404) << unknown.body;
  EXPECT_NE(unknown.body.find("\"reason\":\"unknown_rule\""), std::string::npos) << unknown.body;
  // Above the capacity: refused at once with the reason, never "retry later".
  const Reply never = check(url, "five", R"({"key":"big","cost":6})");
  EXPECT_EQ(never.status, 429) << never.body;
  EXPECT_EQ(str(never.json(), "reason"), "cost_exceeds_capacity") << never.body;
  EXPECT_EQ(num(never.json(), "retry_after_ms"), -1) << never.body;
  EXPECT_EQ(never.header("retry-after"), "") << "no Retry-After for what can never pass";
  // ...and it took nothing: the whole capacity is still there.
  EXPECT_EQ(check(url, "five", R"({"key":"big","cost":5})").status, 200);
  const Reply badrefund =
      http(url, "POST", "/v1/ratelimit/five/refund", R"({"key":"k","decision":"x","amount":1})");
  EXPECT_EQ(badrefund.status, 400) << badrefund.body;
}

void exercise_admin(const std::vector<std::string>& urls) {
  const Reply list = http(urls.front(), "GET", "/v1/ratelimit");
  ASSERT_EQ(list.status, 200) << list.body;
  EXPECT_NE(
      list.body.find(R"("name":"five","algorithm":"gcra","rate":5,"period_ms":600000,"burst":0,"limit":5)"),
      std::string::npos)
      << list.body;
  EXPECT_NE(list.body.find(R"("name":"window","algorithm":"sliding_log","rate":3)"), std::string::npos)
      << list.body;
  EXPECT_EQ(http(urls.front(), "GET", "/v1/ratelimit/nope").status, 404);
  EXPECT_EQ(http(urls.front(), "PUT", "/v1/ratelimit/window", R"({"rate":4})").status, 401);
  const std::string auth = std::string("Authorization: Bearer ") + kToken;
  EXPECT_EQ(http(urls.front(), "PUT", "/v1/ratelimit/window", R"({"rate":0})", {auth}).status, 400);
  EXPECT_EQ(http(urls.front(), "PUT", "/v1/ratelimit/window", R"({"burst":2})", {auth}).status, 400)
      << "a window algorithm has no burst";
  EXPECT_EQ(http(urls.front(), "PUT", "/v1/ratelimit/window", R"({"rates":2})", {auth}).status, 400);
  EXPECT_EQ(http(urls.front(), "PUT", "/v1/ratelimit/nope", R"({"rate":2})", {auth}).status, 404);
  // Three pass, the fourth does not; raised to 4 (on the first instance), one more passes on every instance.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(check(urls[i % urls.size()], "window", R"({"key":"w"})").status, 200);
  EXPECT_EQ(check(urls.back(), "window", R"({"key":"w"})").status, 429);
  const Reply put = http(urls.front(), "PUT", "/v1/ratelimit/window", R"({"rate":4})", {auth});
  ASSERT_EQ(put.status, 200) << put.body;
  EXPECT_EQ(num(put.json(), "rate"), 4);
  for (const auto& url : urls) {
    // Every instance follows within about a second (it pulls the rules from Redis).
    const auto deadline = Clock::now() + (kSanitized ? 30s : 10s);
    std::string body;
    while (Clock::now() < deadline) {
      body = http(url, "GET", "/v1/ratelimit/window").body;
      if (body.find(R"("rate":4)") != std::string::npos) break;
      std::this_thread::sleep_for(50ms);
    }
    EXPECT_NE(body.find(R"("rate":4)"), std::string::npos) << url << ": " << body;
  }
  EXPECT_EQ(check(urls.back(), "window", R"({"key":"w"})").status, 200);
  EXPECT_EQ(check(urls.front(), "window", R"({"key":"w"})").status, 429);
}

void expect_metrics(const std::string& url, int allowed_at_least, int refused_at_least) {
  const Reply m = http(url, "GET", "/metrics");
  ASSERT_EQ(m.status, 200);
  const auto value = [&](const std::string& series) {
    const auto at = m.body.find(series + " ");
    return at == std::string::npos ? -1 : std::stoi(m.body.substr(at + series.size() + 1));
  };
  EXPECT_GE(value("fairgate_ratelimit_allowed_total{rule=\"five\"}"), allowed_at_least) << m.body;
  EXPECT_GE(value("fairgate_ratelimit_refused_total{rule=\"five\"}"), refused_at_least) << m.body;
  EXPECT_GE(value("fairgate_ratelimit_local_refusals_total{rule=\"five\"}"), 0) << m.body;
  EXPECT_GE(value("fairgate_ratelimit_store_errors_total{rule=\"five\"}"), 0) << m.body;
  EXPECT_EQ(value("fairgate_ratelimit_limit{rule=\"five\"}"), 5) << m.body;
}

TEST(ServeRateLimitMemory, BucketHeadersRefundBadInputAdminMetrics) {
  Serve server(config(), {});
  exercise_bucket({server.url()});
  exercise_bad_input(server.url());
  exercise_admin({server.url()});
  // 5 + 1 (u2) + 1 (after the refund) + 1 (big) allowed; 2 + 1 + 1 refused at least.
  expect_metrics(server.url(), 8, 4);
  const Reply health = http(server.url(), "GET", "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_NE(health.body.find(R"("ratelimit":"ok")"), std::string::npos) << health.body;
  EXPECT_EQ(server.terminate(), 0);
}

TEST(ServeRateLimitMemory, ShadowRuleLetsThroughSaysWhatItWouldHaveDoneAndSwitches) {
  Serve server(config("[ratelimit.trial]\nalgorithm = \"fixed_window\"\nrate = 1\nperiod_ms = 600000\n"
                      "mode = \"shadow\"\n"),
               {});
  const Reply first = check(server.url(), "trial", R"({"key":"u"})");
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_NE(first.body.find(R"("shadow":true,"would_allow":true)"), std::string::npos) << first.body;
  const Reply second = check(server.url(), "trial", R"({"key":"u"})");
  ASSERT_EQ(second.status, 200) << "shadow: let through: " << second.body;
  EXPECT_NE(second.body.find(R"("shadow":true,"would_allow":false)"), std::string::npos) << second.body;
  EXPECT_EQ(str(second.json(), "decision"), "") << "it took nothing: nothing to refund";
  EXPECT_EQ(second.header("retry-after"), "");
  const Reply m = http(server.url(), "GET", "/metrics");
  EXPECT_NE(m.body.find("fairgate_ratelimit_shadow{rule=\"trial\"} 1\n"), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("fairgate_ratelimit_refused_total{rule=\"trial\"} 1\n"), std::string::npos) << m.body;
  // Enforced from now on (admin): the same key is refused.
  const Reply put = http(server.url(), "PUT", "/v1/ratelimit/trial", R"({"mode":"enforce"})",
                         {std::string("Authorization: Bearer ") + kToken});
  ASSERT_EQ(put.status, 200) << put.body;
  EXPECT_NE(put.body.find(R"("mode":"enforce")"), std::string::npos) << put.body;
  EXPECT_EQ(check(server.url(), "trial", R"({"key":"u"})").status, 429);
  const Reply bad = http(server.url(), "PUT", "/v1/ratelimit/trial", R"({"mode":"maybe"})",
                         {std::string("Authorization: Bearer ") + kToken});
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(server.terminate(), 0);
}

TEST(ServeRateLimitRedis, TwoInstancesShareRulesStateAndChanges) {
  auto& redis = RedisServer::shared();
  const std::string prefix = "rlhttp-" + std::to_string(::getpid());
  const std::string extra = "[redis]\nurl = \"" + redis.url() + "\"\nkey_prefix = \"" + prefix + "\"\n";
  Serve a(config(extra), {"--instance", "rl-a"});
  Serve b(config(extra), {"--instance", "rl-b"});
  exercise_bucket({a.url(), b.url()});
  exercise_bad_input(b.url());
  exercise_admin({a.url(), b.url()});
  // Every key the rules wrote has a TTL.
  const std::string keys = redis.command({"KEYS", prefix + ":rl:*"});
  EXPECT_NE(keys.find(prefix + ":rl:{five:u1}:gcra"), std::string::npos) << keys;
  std::size_t pos = 0;
  int checked = 0;
  while ((pos = keys.find(prefix + ":rl:", pos)) != std::string::npos) {
    const auto end = keys.find_first_of("\n\"", pos);
    const std::string key = keys.substr(pos, end - pos);
    const std::string ttl = redis.command({"PTTL", key});
    EXPECT_GT(std::atoll(ttl.c_str()), 0) << key << " PTTL " << ttl;
    ++checked;
    pos = end;
  }
  EXPECT_GE(checked, 3) << keys;
  expect_metrics(a.url(), 3, 1);
  const Reply health = http(a.url(), "GET", "/healthz");
  EXPECT_NE(health.body.find(R"("ratelimit":"ok")"), std::string::npos) << health.body;
  EXPECT_EQ(a.terminate(), 0);
  EXPECT_EQ(b.terminate(), 0);
}

// A rule stored in Redis by a PUT wins over the config file of an instance started later. That
// instance says so (the start-up line shows the file's rule), and warns when a fixed cost of its
// config can no longer pass the capacity in force.
TEST(ServeRateLimitRedis, ARuleStoredByAPutIsSaidToWinAndACostItBlocksIsWarned) {
  auto& redis = RedisServer::shared();
  const std::string prefix = "rlwins-" + std::to_string(::getpid());
  const std::string common = std::string("admin_token = \"") + kToken + "\"\n[redis]\nurl = \"" +
                             redis.url() + "\"\nkey_prefix = \"" + prefix +
                             "\"\n[ratelimit.q]\nrate = 10\nperiod_ms = 60000\n";
  Serve a(common, {"--instance", "rlwins-a"});
  const Reply put = http(a.url(), "PUT", "/v1/ratelimit/q", R"({"rate":2})",
                         {std::string("Authorization: Bearer ") + kToken});
  ASSERT_EQ(put.status, 200) << put.body;
  Serve b(common + "key = \"ip\"\ncost = 5\n", {"--instance", "rlwins-b"});
  std::string line;
  ASSERT_TRUE(b.wait_for_line("rate limit q: token_bucket 2 per 60000 ms", kSanitized ? 30s : 10s, &line));
  EXPECT_NE(line.find("stored in Redis by a PUT, in force cluster-wide (was token_bucket 10 per 60000 ms"),
            std::string::npos)
      << line;
  ASSERT_TRUE(b.wait_for_line("the cost 5 of the config exceeds the capacity 2 in force", 5s, &line));
  EXPECT_NE(line.find(" warn "), std::string::npos) << line;
  EXPECT_EQ(a.terminate(), 0);
  EXPECT_EQ(b.terminate(), 0);
}

TEST(ServeRateLimitRedis, RedisDownClosedRuleAnswers503AndHealthSaysDegraded) {
  // A closed port: every decision fails at once; "window" is closed, "five" local.
  Serve server(config("[redis]\nurl = \"redis://127.0.0.1:1\"\ntimeout_ms = 100\n"), {});
  const Reply closed = check(server.url(), "window", R"({"key":"k"})");
  EXPECT_EQ(closed.status, 503) << closed.body;
  EXPECT_EQ(str(closed.json(), "reason"), "unavailable") << closed.body;
  EXPECT_EQ(closed.header("retry-after"), "1");
  const Reply local = check(server.url(), "five", R"({"key":"k"})");
  EXPECT_EQ(local.status, 200) << local.body;
  EXPECT_EQ(str(local.json(), "source"), "degraded") << local.body;
  const Reply health = http(server.url(), "GET", "/healthz");
  EXPECT_NE(health.body.find(R"("ratelimit":"degraded")"), std::string::npos) << health.body;
  const Reply m = http(server.url(), "GET", "/metrics");
  EXPECT_NE(m.body.find("fairgate_ratelimit_store_errors_total{rule=\"window\"} 1"), std::string::npos)
      << m.body;
  EXPECT_EQ(server.terminate(), 0);
}

// --- gateway routes ------------------------------------------------------------------

class MockLlm : public Listening {
 public:
  MockLlm()
      : Listening({FAIRGATE_BIN, "mock-llm", "--listen", "127.0.0.1:0", "--tokens-per-second", "2000",
                   "--tokens", "40"},
                  "fairgate mock-llm") {}
};

std::string gateway_config(const std::string& mock, const std::string& extra = "") {
  return "[limiters.chat]\nmax_concurrent = 4\nmax_wait_ms = 10000\n"
         "[ratelimit.per-user]\nalgorithm = \"token_bucket\"\nrate = 2\nperiod_ms = 600000\n"
         "key = \"header:X-User-Id\"\n"
         "[ratelimit.global]\nalgorithm = \"sliding_log\"\nrate = 3\nperiod_ms = 86400000\nkey = \"global\"\n"
         "[ratelimit.tokens]\nalgorithm = \"gcra\"\nrate = 1\nperiod_ms = 600000\nburst = 1000\n"
         "key = [\"header:X-User-Id\", \"route\"]\ncost = \"tokens\"\ndefault_max_tokens = 500\n"
         "[ratelimit.by-ip]\nalgorithm = \"gcra\"\nrate = 1\nperiod_ms = 600000\nkey = \"ip\"\n"
         "[server]\ntrusted_proxies = [\"127.0.0.1\"]\n"
         "[[route]]\npath = \"/v1/chat/completions\"\nupstream = \"" +
         mock +
         "\"\nlimiter = \"chat\"\nratelimit = [\"per-user\", \"global\"]\n"
         "[[route]]\npath = \"/tok/v1/chat/completions\"\nupstream = \"" +
         mock +
         "/v1/chat/completions\"\nlimiter = \"chat\"\nratelimit = [\"tokens\"]\n"
         "[[route]]\npath = \"/ip/v1/chat/completions\"\nupstream = \"" +
         mock + "/v1/chat/completions\"\nlimiter = \"chat\"\nratelimit = [\"by-ip\"]\n" + extra;
}

const std::string kChat = R"({"model":"m","messages":[{"role":"user","content":"hello there world"}]})";

Reply chat(const std::string& url, const std::string& path, const std::string& user,
           const std::string& body = kChat, std::vector<std::string> headers = {}) {
  if (!user.empty()) headers.push_back("X-User-Id: " + user);
  return http(url, "POST", path, body, headers);
}

void expect_openai_429(const Reply& r, const std::string& rule) {
  EXPECT_EQ(r.status, 429) << r.body;
  const auto j = r.json();
  const auto* e = j.is_object() ? j.as_object().if_contains("error") : nullptr;
  ASSERT_TRUE(e != nullptr && e->is_object()) << r.body;
  EXPECT_EQ(str(*e, "code"), "rate_limit_exceeded") << r.body;
  EXPECT_NE(str(*e, "message").find("\"" + rule + "\""), std::string::npos) << r.body;
  EXPECT_FALSE(r.header("retry-after").empty()) << r.body;
  EXPECT_NE(r.header("ratelimit").find("\"" + rule + "\""), std::string::npos) << r.header("ratelimit");
}

/// Polls GET /v1/ratelimit/{rule} until its `refunded` counter reaches `want` (bounded).
std::int64_t wait_refunded(const std::string& url, const std::string& rule, std::int64_t want) {
  const auto deadline = Clock::now() + (kSanitized ? 30s : 10s);
  std::int64_t got = -1;
  while (Clock::now() < deadline) {
    const auto j = http(url, "GET", "/v1/ratelimit/" + rule).json();
    const auto* stats = j.is_object() ? j.as_object().if_contains("stats") : nullptr;
    got = stats ? num(*stats, "refunded") : -1;
    if (got >= want) return got;
    std::this_thread::sleep_for(20ms);
  }
  return got;
}

void exercise_gateway(const std::string& url) {
  const std::string path = "/v1/chat/completions";
  // per-user: 2 per user; global: 3 in all.
  EXPECT_EQ(chat(url, path, "alice").status, 200);
  const Reply second = chat(url, path, "alice");
  EXPECT_EQ(second.status, 200) << second.body;
  // The answer carries the headers of the rule with the least left (per-user: 0 left).
  EXPECT_EQ(second.header("ratelimit").substr(0, 15), "\"per-user\";r=0;") << second.header("ratelimit");
  // alice's third: refused by per-user — and it takes nothing from global.
  expect_openai_429(chat(url, path, "alice"), "per-user");
  expect_openai_429(chat(url, path, "alice"), "per-user");
  // So global still has exactly one: bob gets it, then global refuses bob.
  EXPECT_EQ(chat(url, path, "bob").status, 200);
  expect_openai_429(chat(url, path, "bob"), "global");
  // No key: 400, not a shared bucket.
  const Reply nokey = chat(url, path, "");
  EXPECT_EQ(nokey.status, 400) << nokey.body;
  EXPECT_NE(nokey.body.find("rate_limit_key_missing"), std::string::npos) << nokey.body;

  // Client IP behind a trusted proxy (127.0.0.1 is trusted here): X-Forwarded-For names the client.
  const std::string ip = "/ip/v1/chat/completions";
  EXPECT_EQ(chat(url, ip, "", kChat, {"X-Forwarded-For: 203.0.113.7"}).status, 200);
  expect_openai_429(chat(url, ip, "", kChat, {"X-Forwarded-For: 203.0.113.7"}), "by-ip");
  EXPECT_EQ(chat(url, ip, "", kChat, {"X-Forwarded-For: 203.0.113.8, 127.0.0.1"}).status, 200);
  // A proxy that adds a line of its own: the lines are one list (RFC 9110 5.3), so the client's
  // own first line cannot choose the key (read alone, it made 198.51.100.9 a fresh bucket).
  expect_openai_429(
      chat(url, ip, "", kChat, {"X-Forwarded-For: 198.51.100.9", "X-Forwarded-For: 203.0.113.7"}), "by-ip");

  // Token budgets: burst 1000, nothing refills. A request reserves 500 (default_max_tokens)
  // + 1 + ceil(17 / 4) = 506 for its prompt; the mock answers 40 tokens.
  const std::string tok = "/tok/v1/chat/completions";
  const Reply first = chat(url, tok, "carol");
  ASSERT_EQ(first.status, 200) << first.body;
  const json::value answer = first.json();
  const auto* usage = answer.is_object() ? answer.as_object().if_contains("usage") : nullptr;
  ASSERT_TRUE(usage != nullptr) << first.body;
  const std::int64_t used = num(*usage, "total_tokens");
  ASSERT_GT(used, 0);
  // The unused part comes back once the answer is relayed.
  EXPECT_EQ(wait_refunded(url, "tokens", 506 - used), 506 - used);
  // Without that refund 1000 - 506 < 506: the second would be refused.
  const Reply again = chat(url, tok, "carol");
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(wait_refunded(url, "tokens", 2 * (506 - used)), 2 * (506 - used));
  // Streaming without usage: the refund counts the streamed chunks (40) plus the prompt's estimate (6).
  const std::string stream =
      R"({"model":"m","stream":true,"messages":[{"role":"user","content":"hello there world"}]})";
  const Reply s = chat(url, tok, "carol", stream);
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_NE(s.body.find("[DONE]"), std::string::npos);
  EXPECT_EQ(wait_refunded(url, "tokens", 2 * (506 - used) + 460), 2 * (506 - used) + 460);
  // Streaming with usage in the final chunk: refunded from it.
  const std::string with_usage =
      R"({"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello there world"}]})";
  const Reply su = chat(url, tok, "carol", with_usage);
  ASSERT_EQ(su.status, 200) << su.body;
  EXPECT_EQ(wait_refunded(url, "tokens", 3 * (506 - used) + 460), 3 * (506 - used) + 460);
  // A max_tokens above the budget can never pass: 429 at once, no Retry-After.
  const Reply huge = chat(url, tok, "dave", R"({"model":"m","max_tokens":5000,"messages":[]})");
  EXPECT_EQ(huge.status, 429) << huge.body;
  EXPECT_NE(huge.body.find("rate_limit_exceeded"), std::string::npos) << huge.body;
  EXPECT_EQ(huge.header("retry-after"), "");
  // Refused without asking the store: no remaining to tell (it said r=0;t=0 of a full budget).
  EXPECT_EQ(huge.header("ratelimit"), "") << huge.header("ratelimit");
  EXPECT_EQ(huge.header("x-ratelimit-remaining"), "");
  EXPECT_NE(huge.header("ratelimit-policy").find("\"tokens\";q="), std::string::npos);
  // Per route metrics.
  const Reply m = http(url, "GET", "/metrics");
  EXPECT_NE(m.body.find("fairgate_gateway_rate_limited_total{route=\"/v1/chat/completions\"} 3"),
            std::string::npos)
      << m.body;
}

TEST(ServeRateLimitGateway, MemoryRulesAllMustAllowKeysAndTokenBudgets) {
  MockLlm mock;
  Serve server(gateway_config(mock.url()), {});
  exercise_gateway(server.url());
  EXPECT_EQ(server.terminate(), 0);
  EXPECT_EQ(mock.terminate(), 0);
}

// A shadow rule only watches (docs/shadow.md): its headers are not the
// answer's, or a client that heeds RateLimit / X-RateLimit-Remaining slows
// down for a rule that refuses nobody (a helper saw "r=0" on every answer).
// With an enforced rule beside it, the headers are the enforced rule's; with
// shadow rules alone, there are none.
TEST(ServeRateLimitGateway, AShadowRulesHeadersAreNotTheAnswers) {
  MockLlm mock;
  const std::string config =
      "[limiters.chat]\nmax_concurrent = 4\n"
      "[ratelimit.watch]\nalgorithm = \"fixed_window\"\nrate = 1\nperiod_ms = 600000\nkey = \"global\"\n"
      "mode = \"shadow\"\n"
      "[ratelimit.enforced]\nalgorithm = \"token_bucket\"\nrate = 5\nperiod_ms = 600000\nkey = \"global\"\n"
      "[[route]]\npath = \"/v1/chat/completions\"\nupstream = \"" +
      mock.url() +
      "\"\nlimiter = \"chat\"\nratelimit = [\"watch\", \"enforced\"]\n"
      "[[route]]\npath = \"/w/v1/chat/completions\"\nupstream = \"" +
      mock.url() + "/v1/chat/completions\"\nlimiter = \"chat\"\nratelimit = [\"watch\"]\n";
  Serve server(config, {});
  for (int i = 1; i <= 3; ++i) {
    const Reply r = chat(server.url(), "/v1/chat/completions", "");
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.header("ratelimit"), "\"enforced\";r=" + std::to_string(5 - i) + ";t=" +
                                         r.header("ratelimit").substr(r.header("ratelimit").rfind('=') + 1))
        << i;
    EXPECT_EQ(r.header("x-ratelimit-remaining"), std::to_string(5 - i)) << i;
  }
  const Reply watched = chat(server.url(), "/w/v1/chat/completions", "");
  ASSERT_EQ(watched.status, 200) << "shadow: let through: " << watched.body;
  EXPECT_EQ(watched.header("ratelimit"), "") << "a shadow rule's headers";
  EXPECT_EQ(watched.header("x-ratelimit-remaining"), "");
  EXPECT_EQ(server.terminate(), 0);
  EXPECT_EQ(mock.terminate(), 0);
}

TEST(ServeRateLimitGateway, RedisRulesAllMustAllowKeysAndTokenBudgets) {
  MockLlm mock;
  const std::string prefix = "rlgw-" + std::to_string(::getpid());
  Serve server(gateway_config(mock.url(), "[redis]\nurl = \"" + RedisServer::shared().url() +
                                              "\"\nkey_prefix = \"" + prefix + "\"\n"),
               {});
  exercise_gateway(server.url());
  EXPECT_EQ(server.terminate(), 0);
  EXPECT_EQ(mock.terminate(), 0);
}

}  // namespace
