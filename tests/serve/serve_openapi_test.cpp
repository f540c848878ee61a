// tests/serve/serve_openapi_test.cpp — the routes of `fairgate serve` against
// docs/openapi.yaml, and browser access (GET acquire, CORS) over real sockets
// (ctest -L serve).
//
//  * ServeOpenApi: the server's route table (src/serve/routes.hpp, the one the
//    dispatcher matches with) and the document the server serves at
//    /openapi.json agree in both directions: every route and method is
//    documented, every documented path and method answers (never 404
//    not_found, never 405), and /openapi.yaml is docs/openapi.yaml byte for byte.
//  * ServeBrowserAccess: the GET acquire an EventSource opens, and which
//    Origins get CORS headers or a 403 (docs/serve.md, "Browsers and CORS").
// Real `fairgate serve` processes on free loopback ports; raw HTTP/1.1 over
// sockets; every wait is bounded and event-driven (polls with generous limits).
#include "harness.hpp"
#include "serve/routes.hpp"
#include "support/loopback.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/json.hpp>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

namespace {

using namespace fairgate::test;
namespace json = boost::json;

const auto kLimit = kSanitized ? 60s : 15s;

/// One HTTP/1.1 answer.
struct Reply {
  int status = 0;
  std::map<std::string, std::string> headers;  ///< names in lowercase
  std::string body;
  bool has(const std::string& name) const { return headers.count(name) != 0; }
  std::string header(const std::string& name) const {
    const auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
  std::string reason() const {
    boost::system::error_code ec;
    const auto v = json::parse(body, ec);
    if (ec || !v.is_object() || !v.as_object().contains("error")) return {};
    const auto* r = v.at("error").as_object().if_contains("reason");
    return r != nullptr && r->is_string() ? std::string(r->as_string()) : std::string();
  }
};

/// A client connection to `url` (127.0.0.1:PORT).
class Conn {
 public:
  explicit Conn(const std::string& url) { fd_ = fairgate::test::connect_loopback(url); }
  ~Conn() { close(); }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  /// Sends `method target` with `headers` ("Name: value\r\n"...) and `body`.
  bool send(const std::string& method, const std::string& target, const std::string& headers = "",
            const std::string& body = "") {
    std::string req =
        method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + headers;
    if (!body.empty())
      req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    req += "\r\n" + body;
    return fd_ >= 0 && ::send(fd_, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size());
  }

  /// Reads what arrives within `limit` into `data`; sets eof at the end of the stream.
  void read_more(std::chrono::milliseconds limit) {
    if (fd_ < 0 || eof) {
      eof = true;
      return;
    }
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(limit.count())) <= 0) return;
    char buf[4096];
    const auto n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0)
      eof = true;
    else
      data.append(buf, static_cast<std::size_t>(n));
  }

  /// The status line and headers; then, unless it is an event stream (which
  /// stays open), the body up to the end of the connection.
  Reply reply() {
    const auto deadline = Clock::now() + kLimit;
    Reply r;
    while (data.find("\r\n\r\n") == std::string::npos && !eof && Clock::now() < deadline) read_more(100ms);
    const auto end = data.find("\r\n\r\n");
    if (end == std::string::npos) return r;
    std::istringstream head(data.substr(0, end));
    std::string line;
    std::getline(head, line);
    if (line.size() > 12) r.status = std::atoi(line.c_str() + 9);
    while (std::getline(head, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      r.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
    }
    data.erase(0, end + 4);
    if (r.header("content-type").rfind("text/event-stream", 0) == 0) return r;
    while (!eof && Clock::now() < deadline) read_more(100ms);
    r.body = std::exchange(data, {});
    return r;
  }

  /// Reads the event stream until an event named `name` arrived (true) or a
  /// `rejected` one, the end of the stream or `kLimit` (false).
  bool await_event(const std::string& name) {
    const auto deadline = Clock::now() + kLimit;
    for (;;) {
      if (data.find("event: " + name + "\n") != std::string::npos) return true;
      if (name != "rejected" && data.find("event: rejected\n") != std::string::npos) return false;
      if (eof || Clock::now() >= deadline) return false;
      read_more(100ms);
    }
  }

  std::string data;
  bool eof = false;

 private:
  int fd_ = -1;
};

Reply call(const std::string& url, const std::string& method, const std::string& target,
           const std::string& headers = "", const std::string& body = "") {
  Conn c(url);
  if (!c.send(method, target, headers, body)) return {};
  return c.reply();
}

json::object limiter(const std::string& url, const std::string& name) {
  const Reply r = call(url, "GET", "/v1/limiters/" + name);
  EXPECT_EQ(r.status, 200) << r.body;
  boost::system::error_code ec;
  auto v = json::parse(r.body, ec);
  return !ec && v.is_object() ? v.as_object() : json::object{};
}

std::int64_t count(const json::object& o, const char* key) {
  const auto* v = o.if_contains(key);
  return v != nullptr && v->is_int64() ? v->as_int64() : -1;
}

/// Polls the limiter until `in_use` and `queued` are as given (true) or kLimit passed.
bool wait_counts(const std::string& url, const std::string& name, std::int64_t in_use, std::int64_t queued) {
  const auto deadline = Clock::now() + kLimit;
  for (;;) {
    const auto o = limiter(url, name);
    if (count(o, "in_use") == in_use && count(o, "queued") == queued) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
}

std::int64_t acquires(const std::string& url, const std::string& name) {
  const auto o = limiter(url, name);
  const auto* stats = o.if_contains("stats");
  return stats != nullptr && stats->is_object() ? count(stats->as_object(), "acquires") : -1;
}

std::unique_ptr<Serve> server(const std::string& extra) {
  return std::make_unique<Serve>(
      "admin_token = \"t\"\n[limiters.chat]\nmax_concurrent = 1\nmax_wait_ms = 20000\n" + extra,
      std::vector<std::string>{});
}

// --- the route table and the document --------------------------------------------

const std::vector<std::string> kMethods{"get", "put", "post", "delete", "patch", "head", "options"};

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  return s;
}

/// "GET, POST" → {"GET", "POST"}.
std::set<std::string> method_set(std::string_view methods) {
  std::set<std::string> out;
  std::string m;
  std::istringstream in{std::string(methods)};
  while (std::getline(in, m, ',')) out.insert(m.substr(m.find_first_not_of(' ')));
  return out;
}

TEST(ServeOpenApi, RouteTableAndServedDocumentAgreeBothWays) {
  // A [[route]] so that the document's gateway path exists (its upstream is not running).
  auto s = server(
      "[[route]]\npath = \"/v1/chat/completions\"\nupstream = \"http://127.0.0.1:1\"\n"
      "limiter = \"chat\"\n");

  // The YAML served is the file in the repository; the JSON is the same document.
  const Reply yaml = call(s->url(), "GET", "/openapi.yaml");
  ASSERT_EQ(yaml.status, 200);
  EXPECT_EQ(yaml.header("content-type"), "application/yaml");
  std::ifstream file(REPO_DIR "/docs/openapi.yaml", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(text.empty());
  EXPECT_TRUE(yaml.body == text) << "GET /openapi.yaml is not docs/openapi.yaml (stale build?)";
  const Reply js = call(s->url(), "GET", "/openapi.json");
  ASSERT_EQ(js.status, 200);
  EXPECT_EQ(js.header("content-type"), "application/json");
  boost::system::error_code ec;
  const json::value doc = json::parse(js.body, ec);
  ASSERT_FALSE(ec) << "GET /openapi.json is not JSON: " << ec.message();
  ASSERT_TRUE(doc.is_object() && doc.as_object().contains("paths"));
  EXPECT_TRUE(doc.at("openapi").as_string().starts_with("3.1."));
  const json::object& paths = doc.at("paths").as_object();

  // Every route of the server, with exactly its methods, is documented.
  std::set<std::string> table_paths;
  for (const auto& route : fairgate::serve::kRoutes) {
    const std::string pattern(route.pattern);
    table_paths.insert(pattern);
    const auto* item = paths.if_contains(pattern);
    if (item == nullptr || !item->is_object()) {
      ADD_FAILURE() << "route " << pattern << " (" << route.methods << ") is not in docs/openapi.yaml";
      continue;
    }
    std::set<std::string> documented;
    for (const auto& m : kMethods)
      if (item->as_object().contains(m)) documented.insert(upper(m));
    EXPECT_EQ(documented, method_set(route.methods))
        << pattern << ": the server's methods and the document's differ";
  }

  // Every documented path and method is served: in the table (gateway routes
  // come from [[route]]), and a request answers neither 404 not_found nor 405.
  int called = 0;
  for (const auto& [path_key, item] : paths) {
    const std::string path(path_key);
    bool gateway = false;
    for (const auto& m : kMethods) {
      const auto* op = item.as_object().if_contains(m);
      if (op != nullptr && op->as_object().contains("x-fairgate-gateway")) gateway = true;
    }
    if (!gateway) {
      EXPECT_TRUE(table_paths.count(path)) << "documented path " << path << " is not in src/serve/routes.hpp";
    }
    std::string target = path;
    for (const auto& [param, value] :
         {std::pair<std::string, std::string>{"{name}", "chat"}, {"{permit}", "lp-0"}})
      if (const auto at = target.find(param); at != std::string::npos)
        target.replace(at, param.size(), value);
    for (const auto& m : kMethods) {
      if (!item.as_object().contains(m)) continue;
      // Event streams are read up to their header (then closed: a granted permit is released).
      const Reply r = call(s->url(), upper(m), target, "Accept: text/event-stream\r\n",
                           m == "put" || m == "post" ? "{}" : "");
      ++called;
      EXPECT_NE(r.status, 0) << upper(m) << " " << target << ": no answer";
      EXPECT_FALSE(r.status == 404 && r.reason() == "not_found")
          << "documented " << upper(m) << " " << path << " answers 404 not_found: " << r.body;
      EXPECT_NE(r.status, 405) << "documented " << upper(m) << " " << path << " answers 405: " << r.body;
    }
  }
  EXPECT_GE(called, static_cast<int>(fairgate::serve::kRoutes.size()));
  EXPECT_TRUE(wait_counts(s->url(), "chat", 0, 0));
  EXPECT_EQ(s->terminate(), 0);
}

// --- browser access -----------------------------------------------------------------

TEST(ServeBrowserAccess, GetAcquireIsAnEventStreamHeldUntilClosed) {
  auto s = server("");
  Conn holder(s->url());
  // Whatever Accept says, a GET acquire is an event stream.
  ASSERT_TRUE(
      holder.send("GET", "/v1/limiters/chat/acquire?tenant=browser-1", "Accept: application/json\r\n"));
  const Reply head = holder.reply();
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.header("content-type"), "text/event-stream");
  EXPECT_FALSE(head.has("access-control-allow-origin"));  // no Origin: no CORS headers
  ASSERT_TRUE(holder.await_event("granted")) << holder.data;
  EXPECT_NE(holder.data.find("\"permit\""), std::string::npos) << holder.data;
  auto o = limiter(s->url(), "chat");
  EXPECT_EQ(count(o, "in_use"), 1);
  EXPECT_NE(json::serialize(o.at("holders")).find("browser-1"), std::string::npos) << json::serialize(o);

  // Same semantics as the POST: a second one queues, then times out.
  Conn waiter(s->url());
  ASSERT_TRUE(waiter.send("GET", "/v1/limiters/chat/acquire?max_wait_ms=300&tenant=browser-2"));
  EXPECT_EQ(waiter.reply().status, 200);
  ASSERT_TRUE(waiter.await_event("rejected")) << waiter.data;
  EXPECT_NE(waiter.data.find("event: queued"), std::string::npos) << waiter.data;
  EXPECT_NE(waiter.data.find("\"reason\":\"timeout\""), std::string::npos) << waiter.data;

  // Leases are for JSON permits (POST); a GET has no body; bad parameters are 400s as for POST.
  Reply r = call(s->url(), "GET", "/v1/limiters/chat/acquire?lease_ms=5000");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.reason(), "bad_request");
  EXPECT_NE(r.body.find("lease_ms: a GET acquire is an event stream"), std::string::npos) << r.body;
  // So is a POST that asks for an event stream (the media type in any case), not a leased permit.
  r = call(s->url(), "POST", "/v1/limiters/chat/acquire?lease_ms=5000", "Accept: Text/Event-Stream\r\n");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("lease_ms: an acquire with Accept: text/event-stream is an event stream"),
            std::string::npos)
      << r.body;
  r = call(s->url(), "GET", "/v1/limiters/chat/acquire", "", "{\"max_wait_ms\":5}");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("query string"), std::string::npos) << r.body;
  r = call(s->url(), "GET", "/v1/limiters/chat/acquire?max_wait_ms=-1");
  EXPECT_EQ(r.status, 400);
  r = call(s->url(), "GET", "/v1/limiters/nope/acquire");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.reason(), "unknown_limiter");
  // A wrong method: 405 with both methods; OPTIONS without Origin is not a preflight.
  for (const char* method : {"PUT", "DELETE", "OPTIONS"}) {
    r = call(s->url(), method, "/v1/limiters/chat/acquire");
    EXPECT_EQ(r.status, 405) << method;
    EXPECT_EQ(r.header("allow"), "GET, POST") << method;
    EXPECT_EQ(r.reason(), "method_not_allowed") << method;
  }

  // Closing the stream (a page closed) releases the permit.
  EXPECT_EQ(count(limiter(s->url(), "chat"), "in_use"), 1);
  holder.close();
  EXPECT_TRUE(wait_counts(s->url(), "chat", 0, 0)) << json::serialize(limiter(s->url(), "chat"));
  EXPECT_EQ(s->terminate(), 0);
}

TEST(ServeBrowserAccess, CorsHeadersOnlyForListedOriginsAndForeignPagesTakeNoPermit) {
  const std::string app = "http://app.test:8000";
  auto s = server("[server]\ncors_origins = [\"" + app + "\", \"https://other.test\"]\n");
  const std::string listed = "Origin: " + app + "\r\n";
  const std::string foreign = "Origin: http://evil.test\r\n";

  // A listed origin gets the CORS headers on any answer, errors included.
  for (const char* target : {"/v1/limiters", "/healthz", "/v1/limiters/nope", "/openapi.json"}) {
    const Reply r = call(s->url(), "GET", target, listed);
    EXPECT_EQ(r.header("access-control-allow-origin"), app) << target;
    EXPECT_EQ(r.header("vary"), "Origin") << target;
    EXPECT_NE(r.header("access-control-expose-headers").find("Retry-After"), std::string::npos) << target;
  }
  // Others, and requests without Origin, get none (status routes still answer).
  for (const std::string& h : {foreign, std::string()}) {
    const Reply r = call(s->url(), "GET", "/v1/limiters", h);
    EXPECT_EQ(r.status, 200);
    EXPECT_FALSE(r.has("access-control-allow-origin")) << h;
  }

  // Preflight from a listed origin: 204 with the path's methods.
  Reply r = call(
      s->url(), "OPTIONS", "/v1/limiters/chat/acquire",
      listed + "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type\r\n");
  EXPECT_EQ(r.status, 204);
  EXPECT_EQ(r.header("access-control-allow-origin"), app);
  EXPECT_EQ(r.header("access-control-allow-methods"), "GET, POST");
  EXPECT_EQ(r.header("access-control-allow-headers"), "Content-Type, Authorization");
  EXPECT_EQ(r.header("access-control-max-age"), "600");
  r = call(s->url(), "OPTIONS", "/v1/limiters/chat", listed + "Access-Control-Request-Method: PUT\r\n");
  EXPECT_EQ(r.status, 204);
  EXPECT_EQ(r.header("access-control-allow-methods"), "GET, PUT");
  r = call(s->url(), "OPTIONS", "/v1/nothing", listed);
  EXPECT_EQ(r.status, 404);
  // ... and from a foreign one: 403.
  r = call(s->url(), "OPTIONS", "/v1/limiters/chat/acquire",
           foreign + "Access-Control-Request-Method: POST\r\n");
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(r.reason(), "origin_not_allowed");
  EXPECT_FALSE(r.has("access-control-allow-origin"));

  // A foreign page's acquire (GET or POST, SSE or JSON) is refused before it reaches the limiter.
  const auto before = acquires(s->url(), "chat");
  ASSERT_GE(before, 0);
  for (const auto& [method, accept] : {std::pair<std::string, std::string>{"GET", ""},
                                       {"POST", "Accept: text/event-stream\r\n"},
                                       {"POST", ""}}) {
    r = call(s->url(), method, "/v1/limiters/chat/acquire?max_wait_ms=0", foreign + accept);
    EXPECT_EQ(r.status, 403) << method << " " << accept;
    EXPECT_EQ(r.reason(), "origin_not_allowed") << r.body;
    EXPECT_NE(r.body.find("http://evil.test"), std::string::npos) << r.body;
  }
  r = call(s->url(), "GET", "/v1/limiters/chat/acquire", "Origin: null\r\n");
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(acquires(s->url(), "chat"), before) << "a refused origin reached the limiter";
  EXPECT_TRUE(wait_counts(s->url(), "chat", 0, 0));

  // A listed page (default port written or not) acquires, and reads the stream.
  Conn page(s->url());
  ASSERT_TRUE(page.send("GET", "/v1/limiters/chat/acquire?tenant=page", listed));
  const Reply head = page.reply();
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.header("access-control-allow-origin"), app);
  EXPECT_EQ(head.header("vary"), "Origin");
  ASSERT_TRUE(page.await_event("granted")) << page.data;
  // A long poll that cannot be granted: 429, and the page may read Retry-After.
  r = call(s->url(), "POST", "/v1/limiters/chat/acquire?max_wait_ms=0", "Origin: https://other.test:443\r\n");
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(r.header("access-control-allow-origin"), "https://other.test:443");
  EXPECT_TRUE(r.has("retry-after"));
  EXPECT_EQ(r.header("access-control-expose-headers"), "Retry-After");
  page.close();
  EXPECT_TRUE(wait_counts(s->url(), "chat", 0, 0));
  EXPECT_EQ(s->terminate(), 0);
}

TEST(ServeBrowserAccess, WithoutCorsOriginsNoPageMayAcquireAndStarAllowsAny) {
  auto off = server("");
  Reply r = call(off->url(), "GET", "/v1/limiters/chat/acquire", "Origin: http://127.0.0.1:8000\r\n");
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(r.reason(), "origin_not_allowed");
  r = call(off->url(), "GET", "/v1/limiters", "Origin: http://127.0.0.1:8000\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_FALSE(r.has("access-control-allow-origin"));
  EXPECT_FALSE(r.has("vary"));
  EXPECT_EQ(acquires(off->url(), "chat"), 0);
  EXPECT_EQ(off->terminate(), 0);

  auto any = server("[server]\ncors_origins = [\"*\"]\n");
  Conn page(any->url());
  ASSERT_TRUE(page.send("GET", "/v1/limiters/chat/acquire", "Origin: https://anywhere.test\r\n"));
  const Reply head = page.reply();
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.header("access-control-allow-origin"), "https://anywhere.test");
  ASSERT_TRUE(page.await_event("granted")) << page.data;
  page.close();
  EXPECT_TRUE(wait_counts(any->url(), "chat", 0, 0));
  EXPECT_EQ(any->terminate(), 0);
}

}  // namespace
