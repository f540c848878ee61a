// tests/serve/serve_log_test.cpp — the log and the metrics of `fairgate serve`
// end to end (ctest -L serve): real `fairgate serve` and `fairgate mock-llm`
// processes on loopback, their stdout read line by line, HTTP over raw sockets.
//
//  * the log: levels (filtering), text and JSON lines (time, level, msg; one
//    object per line), one access line per request with its status, duration
//    and limiter outcome, the library's messages through the same log, and a
//    warning for an unreachable upstream (502);
//  * /metrics: a client that hangs up mid-stream counts as client gone only
//    (not as an upstream error), responses by code, rejections by reason, the
//    hold-time, time-to-first-token and upstream-latency histograms.
#include "serve/harness.hpp"
#include "support/loopback.hpp"
#include "support/redis_server.hpp"

#include <boost/json.hpp>

#include <signal.h>
#include <unistd.h>

#include <regex>

namespace {

using namespace fairgate::test;
namespace json = boost::json;

const auto kStart = kSanitized ? 60s : 20s;

/// A loopback port nothing listens on (bound, then closed).
int free_port() { return free_loopback_port(); }

/// `fairgate serve` with its stdout (the log) kept for the test to read.
class LoggedServe {
 public:
  /// Starts `fairgate serve ARGS --listen 127.0.0.1:0` and reads up to the "listening on" line.
  explicit LoggedServe(std::vector<std::string> args) {
    start(args, "127.0.0.1:0");
    const std::regex listening("listening on (http://127\\.0\\.0\\.1:[0-9]+)");
    std::string line;
    while (child_->read_line(line, kStart)) {
      lines_.push_back(line);
      std::smatch m;
      if (std::regex_search(line, m, listening)) {
        url_ = m[1];
        return;
      }
    }
    throw std::runtime_error("fairgate serve did not start (no 'listening on' line)");
  }
  /// Starts on a fixed free port and waits until it accepts (for levels that hide "listening on").
  static std::unique_ptr<LoggedServe> on_free_port(std::vector<std::string> args) {
    std::unique_ptr<LoggedServe> s(new LoggedServe());
    const int port = free_port();
    s->start(args, "127.0.0.1:" + std::to_string(port));
    s->url_ = "http://127.0.0.1:" + std::to_string(port);
    const auto deadline = Clock::now() + kStart;
    while (Clock::now() < deadline) {
      const int fd = connect_loopback(s->url_);
      if (fd >= 0) {
        ::close(fd);
        return s;
      }
      std::this_thread::sleep_for(20ms);
    }
    throw std::runtime_error("fairgate serve did not start on " + s->url_);
  }

  const std::string& url() const { return url_; }
  pid_t pid() const { return child_->pid(); }
  /// Every line read so far.
  const std::vector<std::string>& lines() const { return lines_; }

  /// Reads lines until one matches `pred` (true) or `limit` passes or the output ends (false).
  bool wait_for_line(const std::function<bool(const std::string&)>& pred, std::chrono::milliseconds limit,
                     std::string* found = nullptr) {
    for (std::size_t i = checked_; i < lines_.size(); ++i) {
      if (pred(lines_[i])) {
        if (found) *found = lines_[i];
        return true;
      }
    }
    checked_ = lines_.size();
    const auto deadline = Clock::now() + limit;
    std::string line;
    while (Clock::now() < deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (!child_->read_line(line, left)) return false;
      lines_.push_back(line);
      checked_ = lines_.size();
      if (pred(line)) {
        if (found) *found = line;
        return true;
      }
    }
    return false;
  }
  bool wait_for_text(std::string_view text, std::chrono::milliseconds limit, std::string* found = nullptr) {
    return wait_for_line([&](const std::string& l) { return l.find(text) != std::string::npos; }, limit,
                         found);
  }
  /// SIGTERM, then the rest of the output; the exit code.
  int terminate() {
    ::kill(child_->pid(), SIGTERM);
    std::string line;
    while (child_->read_line(line, kStart)) lines_.push_back(line);
    return child_->wait(kStart);
  }
  std::string all() const {
    std::string out;
    for (const auto& l : lines_) out += l + "\n";
    return out;
  }

 private:
  LoggedServe() = default;
  void start(std::vector<std::string> args, const std::string& listen) {
    std::vector<std::string> argv{FAIRGATE_BIN, "serve", "--listen", listen};
    argv.insert(argv.end(), args.begin(), args.end());
    child_ = std::make_unique<Child>(argv, false);
  }

  std::unique_ptr<Child> child_;
  std::string url_;
  std::vector<std::string> lines_;
  std::size_t checked_ = 0;
};

std::string request(const std::string& method, const std::string& target, const std::string& body = "") {
  return method + " " + target +
         " HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::string get(const std::string& url, const std::string& path) {
  return http_exchange(url, request("GET", path));
}

/// The value of the series `name_and_labels` on a /metrics page; -1 when absent.
double metric(const std::string& page, const std::string& name_and_labels) {
  const std::string key = "\n" + name_and_labels + " ";
  const auto at = page.find(key);
  if (at == std::string::npos) return -1;
  return std::stod(page.substr(at + key.size()));
}

/// Polls /metrics until `pred` holds (bounded); the last page.
std::string metrics_when(const std::string& url, const std::function<bool(const std::string&)>& pred) {
  std::string page;
  const auto deadline = Clock::now() + 10s;
  do {
    page = get(url, "/metrics");
    if (pred(page)) break;
    std::this_thread::sleep_for(50ms);
  } while (Clock::now() < deadline);
  return page;
}

bool is_level(const std::string& line, std::string_view level) {
  static const std::regex text(R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (trace|debug|info|warn|error) .+)");
  std::smatch m;
  return std::regex_match(line, m, text) && m[1] == std::string(level);
}

json::object parse_object(const std::string& line) {
  boost::system::error_code ec;
  json::value v = json::parse(line, ec);
  if (ec || !v.is_object()) return {};
  return v.as_object();
}

std::string str(const json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  return v && v->is_string() ? std::string(v->as_string()) : std::string();
}

// --- the log ------------------------------------------------------------------

// Text lines: an ISO 8601 UTC time with milliseconds, the level, the message;
// the banner keeps its text ("fairgate serve: listening on ..."); every HTTP
// request gets one access line with method, path, status and duration, and
// an acquire's limiter, outcome and wait.
TEST(ServeLog, TextLinesCarryTimeAndLevelAndEveryRequestGetsAnAccessLine) {
  LoggedServe serve({"--limiter", "chat=1,max_wait=200ms", "--access-log", "on"});
  ASSERT_FALSE(serve.lines().empty());
  EXPECT_TRUE(is_level(serve.lines().back(), "info")) << serve.lines().back();
  EXPECT_NE(serve.lines().back().find(" info fairgate serve: listening on http://127.0.0.1:"),
            std::string::npos)
      << serve.lines().back();
  EXPECT_NE(serve.lines().back().find("(backend memory, limiters chat=1,"), std::string::npos)
      << "no instance id without Redis: " << serve.lines().back();

  EXPECT_EQ(get(serve.url(), "/healthz").rfind("HTTP/1.1 200", 0), 0u);
  std::string line;
  ASSERT_TRUE(serve.wait_for_text("access: GET /healthz", 5s, &line)) << serve.all();
  EXPECT_TRUE(std::regex_search(line, std::regex(R"( info access: GET /healthz 200 [0-9]+\.[0-9]ms$)")))
      << line;

  const auto granted =
      http_exchange(serve.url(), request("POST", "/v1/limiters/chat/acquire?lease_ms=60000"));
  ASSERT_EQ(granted.rfind("HTTP/1.1 200", 0), 0u) << granted;
  ASSERT_TRUE(serve.wait_for_text("access: POST /v1/limiters/chat/acquire 200", 5s, &line)) << serve.all();
  EXPECT_TRUE(
      std::regex_search(line, std::regex(R"(200 [0-9.]+ms limiter=chat outcome=granted wait_ms=[0-9]+$)")))
      << line;
  // The path is logged without its query string.
  EXPECT_EQ(line.find("lease_ms"), std::string::npos) << line;

  const auto refused = http_exchange(serve.url(), request("POST", "/v1/limiters/chat/acquire"));
  ASSERT_EQ(refused.rfind("HTTP/1.1 429", 0), 0u) << refused;
  ASSERT_TRUE(serve.wait_for_text("access: POST /v1/limiters/chat/acquire 429", 5s, &line)) << serve.all();
  const std::regex timeout(R"(429 ([0-9.]+)ms limiter=chat outcome=timeout wait_ms=([0-9]+)$)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(line, m, timeout)) << line;
  EXPECT_GE(std::stod(m[1]), 150.0) << line;  // the request waited its max_wait
  EXPECT_GE(std::stoi(m[2]), 150) << line;

  EXPECT_EQ(get(serve.url(), "/v1/limiters/nope").rfind("HTTP/1.1 404", 0), 0u);
  ASSERT_TRUE(serve.wait_for_text("access: GET /v1/limiters/nope 404", 5s)) << serve.all();

  // A permit's token is a secret (whoever has it can release the permit): the access log
  // shows its first characters only, on renew and release alike (lines in order).
  const auto at = granted.find("\"permit\":\"");
  ASSERT_NE(at, std::string::npos) << granted;
  const std::string token = granted.substr(at + 10, granted.find('"', at + 10) - at - 10);
  ASSERT_GT(token.size(), 12u) << token;
  EXPECT_EQ(
      http_exchange(serve.url(), request("POST", "/v1/permits/" + token + "/renew")).rfind("HTTP/1.1 200", 0),
      0u);
  EXPECT_EQ(http_exchange(serve.url(), request("DELETE", "/v1/permits/" + token)).rfind("HTTP/1.1 204", 0),
            0u);
  ASSERT_TRUE(serve.wait_for_text("access: POST /v1/permits/" + token.substr(0, 6) + "\u2026/renew 200", 5s))
      << serve.all();
  ASSERT_TRUE(serve.wait_for_text("access: DELETE /v1/permits/" + token.substr(0, 6) + "\u2026 204", 5s))
      << serve.all();
  EXPECT_EQ(serve.all().find(token), std::string::npos) << "the token was logged:\n" << serve.all();
  EXPECT_EQ(serve.terminate(), 0);
  EXPECT_NE(serve.all().find(" info fairgate serve: stopped (SIGTERM)"), std::string::npos) << serve.all();
}

// --log-format json: every line is one JSON object with time, level and msg;
// an access line also has its fields.
TEST(ServeLog, JsonFormatIsOneObjectPerLine) {
  LoggedServe serve({"--limiter", "chat=1,max_wait=100ms", "--log-format", "json", "--access-log", "on"});
  EXPECT_EQ(get(serve.url(), "/v1/limiters").rfind("HTTP/1.1 200", 0), 0u);
  const auto granted = http_exchange(serve.url(), request("POST", "/v1/limiters/chat/acquire"));
  ASSERT_EQ(granted.rfind("HTTP/1.1 200", 0), 0u) << granted;
  const auto refused = http_exchange(serve.url(), request("POST", "/v1/limiters/chat/acquire"));
  ASSERT_EQ(refused.rfind("HTTP/1.1 429", 0), 0u) << refused;
  std::string line;
  ASSERT_TRUE(serve.wait_for_text(R"("status":429)", 5s, &line)) << serve.all();
  EXPECT_EQ(serve.terminate(), 0);

  ASSERT_GE(serve.lines().size(), 5u) << serve.all();
  const std::regex time(R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$)");
  bool listening = false, listed = false;
  for (const auto& l : serve.lines()) {
    const json::object o = parse_object(l);
    ASSERT_FALSE(o.empty()) << "not one JSON object: " << l;
    EXPECT_TRUE(std::regex_match(str(o, "time"), time)) << l;
    EXPECT_FALSE(str(o, "level").empty()) << l;
    EXPECT_FALSE(str(o, "msg").empty()) << l;
    listening = listening || str(o, "msg").find("fairgate serve: listening on http://127.0.0.1:") == 0;
    if (str(o, "path") == "/v1/limiters") {
      listed = true;
      EXPECT_EQ(str(o, "level"), "info") << l;
      EXPECT_EQ(str(o, "method"), "GET") << l;
      EXPECT_EQ(o.at("status").to_number<std::int64_t>(), 200) << l;
      EXPECT_TRUE(o.at("duration_ms").is_double() || o.at("duration_ms").is_int64()) << l;
    }
  }
  EXPECT_TRUE(listening) << serve.all();
  EXPECT_TRUE(listed) << serve.all();
  const json::object rejected = parse_object(line);
  EXPECT_EQ(str(rejected, "path"), "/v1/limiters/chat/acquire") << line;
  EXPECT_EQ(str(rejected, "limiter"), "chat") << line;
  EXPECT_EQ(str(rejected, "outcome"), "timeout") << line;
  ASSERT_TRUE(rejected.contains("wait_ms")) << line;
  EXPECT_GE(rejected.at("wait_ms").to_number<std::int64_t>(), 50) << line;
}

// JSON is UTF-8 (RFC 8259): bytes from the request that are not (a path
// segment %ff%fe, a raw 0xff in the request line, a query value) are echoed in
// error messages and access lines as U+FFFD. Before, the answers and the log
// lines carried them as they came, and strict parsers refused both (a helper).
TEST(ServeLog, ErrorsAndJsonLinesStayUtf8WhateverTheRequestCarries) {
  LoggedServe serve({"--limiter", "chat=1", "--log-format", "json", "--access-log", "on"});
  const std::string replacement = "\xEF\xBF\xBD";
  for (const std::string target :
       {"/v1/limiters/%ff%fe", "/v1/limiters/\xff\xfe", "/v1/ratelimit/%ff",
        "/v1/limiters/chat/acquire?max_wait_ms=%ff", "/v1/limiters/chat?limit=%c0%af"}) {
    const std::string answer = http_exchange(
        serve.url(), request(target.find("acquire") != std::string::npos ? "POST" : "GET", target));
    const auto body_at = answer.find("\r\n\r\n");
    ASSERT_NE(body_at, std::string::npos) << answer;
    const json::object o = parse_object(answer.substr(body_at + 4));
    ASSERT_FALSE(o.empty()) << "not JSON (UTF-8): " << answer;
    const std::string message = std::string(o.at("error").at("message").as_string());
    EXPECT_NE(message.find(replacement), std::string::npos) << message;
  }
  std::string line;
  ASSERT_TRUE(serve.wait_for_text(R"("path":"/v1/limiters/chat")", 5s, &line)) << serve.all();
  EXPECT_EQ(serve.terminate(), 0);
  std::size_t replaced = 0;
  for (const auto& l : serve.lines()) {
    EXPECT_FALSE(parse_object(l).empty()) << "not one JSON object: " << l;
    replaced += l.find(replacement) != std::string::npos ? 1 : 0;
  }
  EXPECT_GE(replaced, 1u) << serve.all();
}

// --log-level warn: nothing below warn (no banner, no access lines), warnings still come.
TEST(ServeLog, LevelFiltersMessagesBelowIt) {
  auto serve = LoggedServe::on_free_port({"--limiter", "chat=1", "--log-level", "warn"});
  EXPECT_EQ(get(serve->url(), "/healthz").rfind("HTTP/1.1 200", 0), 0u);
  ASSERT_EQ(::kill(serve->pid(), SIGHUP), 0);
  std::string line;
  ASSERT_TRUE(serve->wait_for_text("SIGHUP ignored", 10s, &line)) << serve->all();
  EXPECT_TRUE(is_level(line, "warn")) << line;
  EXPECT_EQ(serve->terminate(), 0);
  for (const auto& l : serve->lines()) EXPECT_TRUE(is_level(l, "warn")) << "below warn: " << l;
  EXPECT_EQ(serve->all().find("access:"), std::string::npos) << serve->all();
  EXPECT_EQ(serve->all().find("listening on"), std::string::npos) << serve->all();

  // off: not a line, not even warnings.
  auto quiet = LoggedServe::on_free_port({"--limiter", "chat=1", "--log-level", "off"});
  EXPECT_EQ(get(quiet->url(), "/healthz").rfind("HTTP/1.1 200", 0), 0u);
  ASSERT_EQ(::kill(quiet->pid(), SIGHUP), 0);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(quiet->terminate(), 0);
  EXPECT_TRUE(quiet->lines().empty()) << quiet->all();
}

// The access log is off by default, and with --access-log off or server.access_log = false (the
// other lines stay); server.access_log = true turns it on, a flag wins over the file.
TEST(ServeLog, AccessLogIsOffByDefaultAndSwitchable) {
  TempConfig off(
      "[server]\naccess_log = false\nlog_level = \"debug\"\n[limiters.chat]\nmax_concurrent = 1\n");
  TempConfig on("[server]\naccess_log = true\n[limiters.chat]\nmax_concurrent = 1\n");
  const std::vector<std::pair<std::vector<std::string>, bool>> cases = {
      {{"--limiter", "chat=1"}, false},
      {{"--limiter", "chat=1", "--access-log", "off"}, false},
      {{"--config", off.path()}, false},
      {{"--config", on.path()}, true},
      {{"--config", on.path(), "--access-log", "off"}, false},
  };
  for (const auto& [args, logged] : cases) {
    LoggedServe serve(args);
    EXPECT_EQ(get(serve.url(), "/healthz").rfind("HTTP/1.1 200", 0), 0u);
    EXPECT_EQ(get(serve.url(), "/v1/limiters").rfind("HTTP/1.1 200", 0), 0u);
    if (logged) {
      EXPECT_TRUE(serve.wait_for_text("access: GET /v1/limiters 200", 5s)) << serve.all();
    }
    EXPECT_EQ(serve.terminate(), 0);
    EXPECT_EQ(serve.all().find("access:") != std::string::npos, logged) << serve.all();
    EXPECT_NE(serve.all().find(logged ? "access log on" : "access log off"), std::string::npos)
        << serve.all();
    EXPECT_NE(serve.all().find("fairgate serve: stopped (SIGTERM)"), std::string::npos) << serve.all();
  }
}

// The library's messages (here: the Redis backend going degraded, Redis being
// a closed port) go through the server's log, with their level, as JSON lines.
TEST(ServeLog, LibraryMessagesGoThroughTheServersLog) {
  LoggedServe serve({"--limiter", "chat=1", "--log-format", "json", "--redis",
                     "redis://127.0.0.1:" + std::to_string(free_port())});
  std::string line;
  // The start-up line names the generated instance id (hostname-pid-random): the one Redis knows.
  ASSERT_TRUE(serve.wait_for_text("listening on", 10s, &line)) << serve.all();
  EXPECT_TRUE(std::regex_search(str(parse_object(line), "msg"),
                                std::regex(", instance [A-Za-z0-9._-]+-" + std::to_string(serve.pid()) +
                                           "-[0-9a-f]{8}, limiters chat=1")))
      << line;
  ASSERT_TRUE(serve.wait_for_text("fairgate: limiter chat: degraded", 10s, &line)) << serve.all();
  const json::object o = parse_object(line);
  EXPECT_EQ(str(o, "level"), "warn") << line;
  EXPECT_EQ(str(o, "msg").rfind("fairgate: limiter chat: degraded: Redis unreachable", 0), 0u) << line;
  EXPECT_EQ(serve.terminate(), 0);
}

// --- the gateway ----------------------------------------------------------------

/// `fairgate mock-llm`: `tokens` tokens at `rate`/s.
class Mock : public Listening {
 public:
  Mock(int tokens, int rate)
      : Listening({FAIRGATE_BIN, "mock-llm", "--listen", "127.0.0.1:0", "--tokens-per-second",
                   std::to_string(rate), "--tokens", std::to_string(tokens), "--max-concurrent", "10"},
                  "fairgate mock-llm") {}
};

std::string chat(const std::string& path, bool stream) {
  return request("POST", path,
                 R"({"model":"fairgate-mock","stream":)" + std::string(stream ? "true" : "false") +
                     R"(,"messages":[{"role":"user","content":"hi"}]})");
}

TempConfig gateway_config(const std::string& mock, int down_port) {
  return TempConfig(
      "[limiters.chat]\nmax_concurrent = 1\nmax_wait_ms = 300\n"
      "[[route]]\npath = \"/v1/chat/completions\"\nupstream = \"" +
      mock +
      "\"\nlimiter = \"chat\"\n"
      "[[route]]\npath = \"/down/v1/chat/completions\"\nupstream = \"http://127.0.0.1:" +
      std::to_string(down_port) + "/v1/chat/completions\"\nlimiter = \"chat\"\n");
}

// An unreachable upstream: the client gets 502, the log a warning naming the upstream and the error.
TEST(ServeLog, UnreachableUpstreamLogsAWarning) {
  Mock mock(5, 200);
  const int down = free_port();
  TempConfig config = gateway_config(mock.url(), down);
  LoggedServe serve({"--config", config.path(), "--log-format", "json", "--access-log", "on"});
  const auto reply = http_exchange(serve.url(), chat("/down/v1/chat/completions", false));
  ASSERT_EQ(reply.rfind("HTTP/1.1 502", 0), 0u) << reply;
  std::string line;
  ASSERT_TRUE(serve.wait_for_text("cannot connect to the upstream", 5s, &line)) << serve.all();
  const json::object o = parse_object(line);
  EXPECT_EQ(str(o, "level"), "warn") << line;
  EXPECT_EQ(str(o, "upstream"), "http://127.0.0.1:" + std::to_string(down) + "/v1/chat/completions") << line;
  EXPECT_NE(str(o, "error").find("Connection refused"), std::string::npos) << line;
  EXPECT_EQ(o.at("status").to_number<std::int64_t>(), 502) << line;
  // And the request's access line says 502 on that route.
  ASSERT_TRUE(serve.wait_for_text(R"("status":502)", 5s, &line)) << serve.all();
  EXPECT_EQ(str(parse_object(line), "route"), "/down/v1/chat/completions") << line;
  EXPECT_EQ(serve.terminate(), 0);
  EXPECT_EQ(mock.terminate(), 0);
}

// A client that hangs up in the middle of a streamed answer is counted as
// client gone, and not also as an upstream error; the histograms count the
// stream's hold time, its time to first token and the upstream calls.
TEST(ServeMetrics, HangUpMidStreamCountsOnlyAsClientGoneAndHistogramsCount) {
  Mock mock(100, 20);  // a 5-second answer
  TempConfig config = gateway_config(mock.url(), free_port());
  LoggedServe serve({"--config", config.path(), "--access-log", "on"});
  const std::string route = R"(route="/v1/chat/completions")";
  {
    const int fd = connect_loopback(serve.url());
    ASSERT_GE(fd, 0);
    const std::string req = chat("/v1/chat/completions", true);
    ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    std::string got;
    const auto deadline = Clock::now() + 10s;
    while (got.find("t2 ") == std::string::npos && Clock::now() < deadline) {
      char buf[4096];
      const auto n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<std::size_t>(n));
    }
    ASSERT_NE(got.find("t2 "), std::string::npos) << got;
    ::close(fd);  // hang up mid-stream
  }
  std::string page = metrics_when(serve.url(), [&](const std::string& p) {
    return metric(p, "fairgate_gateway_client_gone_total{" + route + "}") >= 1 &&
           metric(p, "fairgate_hold_seconds_count{limiter=\"chat\"}") >= 1;
  });
  EXPECT_EQ(metric(page, "fairgate_gateway_client_gone_total{" + route + "}"), 1) << page;
  EXPECT_EQ(metric(page, "fairgate_gateway_upstream_errors_total{" + route + "}"), 0) << page;
  EXPECT_EQ(metric(page, "fairgate_hold_seconds_count{limiter=\"chat\"}"), 1) << page;
  EXPECT_EQ(metric(page, "fairgate_gateway_time_to_first_token_seconds_count{" + route + "}"), 1) << page;
  // The cut call never ended its answer: not an upstream latency.
  EXPECT_EQ(metric(page, "fairgate_gateway_upstream_seconds_count{" + route + "}"), 0) << page;
  std::string line;
  ASSERT_TRUE(serve.wait_for_text("access: POST /v1/chat/completions 200", 5s, &line)) << serve.all();
  EXPECT_TRUE(std::regex_search(
      line, std::regex(R"(route=/v1/chat/completions limiter=chat outcome=client_gone wait_ms=[0-9]+$)")))
      << line;
  // Meanwhile a whole answer: latency and time to first token counted, no error.
  const auto whole = http_exchange(serve.url(), chat("/v1/chat/completions", false));
  EXPECT_EQ(whole.rfind("HTTP/1.1 200", 0), 0u) << whole.substr(0, 300);
  page = get(serve.url(), "/metrics");
  EXPECT_EQ(metric(page, "fairgate_gateway_upstream_seconds_count{" + route + "}"), 1) << page;
  EXPECT_EQ(metric(page, "fairgate_gateway_upstream_seconds_bucket{" + route + ",le=\"+Inf\"}"), 1) << page;
  EXPECT_GT(metric(page, "fairgate_gateway_upstream_seconds_sum{" + route + "}"), 1.0) << page;  // ~5 s
  EXPECT_EQ(metric(page, "fairgate_gateway_upstream_errors_total{" + route + "}"), 0) << page;
  EXPECT_EQ(metric(page, "fairgate_gateway_client_gone_total{" + route + "}"), 1) << page;
  EXPECT_EQ(metric(page, "fairgate_hold_seconds_count{limiter=\"chat\"}"), 2) << page;
  EXPECT_GT(metric(page, "fairgate_hold_seconds_sum{limiter=\"chat\"}"), 1.0) << page;
  EXPECT_EQ(serve.terminate(), 0);
  EXPECT_EQ(mock.terminate(), 0);
}

// Responses by code, rejections by reason (the API's and a gateway route's),
// and the hold time of a JSON permit (grant to DELETE).
TEST(ServeMetrics, ResponsesByCodeRejectionsByReasonAndHoldTime) {
  Mock mock(5, 200);
  TempConfig config = gateway_config(mock.url(), free_port());
  LoggedServe serve({"--config", config.path()});
  const std::string route = R"(route="/v1/chat/completions")";
  const auto granted = http_exchange(serve.url(), request("POST", "/v1/limiters/chat/acquire"));
  ASSERT_EQ(granted.rfind("HTTP/1.1 200", 0), 0u) << granted;
  const std::smatch m = [&] {
    std::smatch r;
    std::regex_search(granted, r, std::regex(R"re("permit":"([^"]+)")re"));
    return r;
  }();
  ASSERT_FALSE(m.empty()) << granted;
  const std::string token = m[1];
  // The seat is taken: the API's acquire and the gateway both time out (300 ms).
  EXPECT_EQ(http_exchange(serve.url(), request("POST", "/v1/limiters/chat/acquire")).rfind("HTTP/1.1 429", 0),
            0u);
  EXPECT_EQ(http_exchange(serve.url(), chat("/v1/chat/completions", false)).rfind("HTTP/1.1 429", 0), 0u);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(http_exchange(serve.url(), request("DELETE", "/v1/permits/" + token)).rfind("HTTP/1.1 204", 0),
            0u);
  EXPECT_EQ(get(serve.url(), "/v1/limiters/nope").rfind("HTTP/1.1 404", 0), 0u);

  const std::string page = get(serve.url(), "/metrics");
  EXPECT_EQ(metric(page, R"(fairgate_http_responses_total{code="200"})"), 1) << page;
  EXPECT_EQ(metric(page, R"(fairgate_http_responses_total{code="429"})"), 2) << page;
  EXPECT_EQ(metric(page, R"(fairgate_http_responses_total{code="204"})"), 1) << page;
  EXPECT_EQ(metric(page, R"(fairgate_http_responses_total{code="404"})"), 1) << page;
  EXPECT_EQ(metric(page, R"(fairgate_timeouts_total{limiter="chat"})"), 2) << page;
  EXPECT_EQ(metric(page, R"(fairgate_rejections_total{limiter="chat",reason="queue_full"})"), 0) << page;
  EXPECT_EQ(metric(page, "fairgate_gateway_rejected_total{" + route + R"(,reason="timeout"})"), 1) << page;
  EXPECT_EQ(metric(page, "fairgate_gateway_rejected_total{" + route + R"(,reason="queue_full"})"), 0) << page;
  EXPECT_EQ(metric(page, R"(fairgate_hold_seconds_count{limiter="chat"})"), 1) << page;
  EXPECT_GE(metric(page, R"(fairgate_hold_seconds_sum{limiter="chat"})"), 0.5) << page;
  EXPECT_EQ(metric(page, R"(fairgate_hold_seconds_bucket{limiter="chat",le="0.1"})"), 0) << page;
  EXPECT_EQ(metric(page, R"(fairgate_hold_seconds_bucket{limiter="chat",le="+Inf"})"), 1) << page;
  EXPECT_EQ(serve.terminate(), 0);
  EXPECT_EQ(mock.terminate(), 0);
}

}  // namespace
