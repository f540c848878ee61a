// cli/demo/stage.cpp — the model and the two gateways of `fairgate demo` (stage.hpp).
#include "cli/demo/stage.hpp"

#include "bench/admin.hpp"
#include "serve/config.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <system_error>

namespace fairgate::cli::demo {

namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// A TOML basic string.
std::string toml_string(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  out += '"';
  return out;
}

std::string route_key(const std::string& prefix) {
  return prefix + ":{" + std::string(kLimiterName) + "}:cfg";
}

/// Reads the child's "fairgate serve: listening on http://HOST:PORT (...)" line.
std::optional<std::string> listening_url(bench::Child& child) {
  const auto deadline = Clock::now() + Stage::kStartTimeout;
  constexpr std::string_view kMarker = "listening on ";
  while (Clock::now() < deadline) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    auto line = child.next_line(std::max(left, milliseconds(1)));
    if (!line) {
      if (child.drained()) return std::nullopt;  // it exited (its error is on stderr)
      continue;
    }
    const auto at = line->find(kMarker);
    if (at == std::string::npos) continue;
    std::string url = line->substr(at + kMarker.size());
    url = url.substr(0, url.find(' '));
    return url;
  }
  return std::nullopt;
}

tcp::endpoint endpoint_of(const std::string& url) {
  serve::RouteConfig parsed;
  serve::parse_upstream(url, "listen", parsed);
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(parsed.upstream_host, ec);
  if (ec) throw std::runtime_error(fmt::format("gateway address {}: {}", url, ec.message()));
  return {address, parsed.upstream_port};
}

}  // namespace

Stage::Stage(asio::io_context& io, StageOptions options) : io_(io), options_(std::move(options)) {}

Stage::~Stage() {
  if (!config_file_.empty()) {
    std::error_code ec;
    std::filesystem::remove(config_file_, ec);
  }
}

void Stage::start() {
  start_model();
  if (options_.redis.empty()) {
    start_gateways_here();
  } else {
    start_gateway_processes();
  }
}

void Stage::start_model() {
  mockllm::Options o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.tokens_per_second = options_.tokens_per_second;
  o.tokens = options_.tokens;
  o.max_concurrent = options_.seats;  // the model's own ceiling: above it, 429
  mock_ = std::make_unique<mockllm::Server>(io_.get_executor(), o);
  mock_->start();
  const auto ep = mock_->endpoint();
  model_url_ = fmt::format("http://{}:{}", ep.address().to_string(), ep.port());
}

/// Memory backend: two gateway front ends in this process on one backend.
void Stage::start_gateways_here() {
  backend_ = make_memory_backend(io_.get_executor());
  serve::ServeConfig sc;
  sc.listen_host = "127.0.0.1";
  sc.listen_port = 0;
  serve::LimiterConfig lc;
  lc.name = std::string(kLimiterName);
  lc.settings.max_concurrent = options_.seats;
  lc.settings.max_wait = options_.max_wait;
  sc.limiters.push_back(lc);
  sc.server.shutdown_grace = std::chrono::seconds(1);
  serve::RouteConfig rc;
  rc.path = std::string(kRoutePath);
  serve::parse_upstream(model_url_, "upstream", rc);
  rc.limiter = std::string(kLimiterName);
  rc.tenant_header = std::string(kTenantHeader);
  rc.queue_events = serve::QueueEvents::named;
  sc.routes.push_back(rc);
  for (const char* label : {"A", "B"}) {
    sc.instance = fmt::format("demo-{}", label[0] == 'A' ? 'a' : 'b');
    auto server = std::make_unique<serve::Server>(io_, sc, backend_);
    server->start();
    gateways_.push_back(Gateway{label, server->url(), server->endpoint(), 0});
    servers_.push_back(std::move(server));
  }
}

/// Redis: two `fairgate serve` processes (this binary) on the given Redis.
void Stage::start_gateway_processes() {
  // Fails fast, in one line, when Redis does not answer at all (or the TLS
  // settings are wrong).
  { bench::Admin admin(options_.redis, route_key("fairgate-demo")); }
  const std::string prefix = fmt::format("fairgate-demo-{}", ::getpid());
  key_prefix_ = prefix;
  config_file_ = (std::filesystem::temp_directory_path() / (prefix + ".toml")).string();
  {
    std::ofstream f(config_file_);
    f << "# fairgate demo --redis: written by the demo, removed when it ends\n";
    f << "listen = \"127.0.0.1:0\"\n\n[redis]\n";
    f << "url = " << toml_string(options_.redis) << "\n";
    // Keys of this run alone (the prefix names its pid): no instance from
    // before can hold permits under them, so no recovery fence.
    f << "key_prefix = " << toml_string(prefix) << "\nrecovery_fence_ms = 0\n\n";
    f << "[limiters." << kLimiterName << "]\nmax_concurrent = " << options_.seats
      << "\nmax_wait_ms = " << options_.max_wait.count() << "\n\n";
    f << "[server]\nshutdown_grace_ms = 1000\n\n";
    f << "[[route]]\npath = " << toml_string(kRoutePath) << "\nupstream = " << toml_string(model_url_)
      << "\nlimiter = " << toml_string(kLimiterName) << "\ntenant_header = " << toml_string(kTenantHeader)
      << "\nqueue_events = \"named\"\n";
    if (!f) throw std::runtime_error(fmt::format("cannot write {}", config_file_));
  }
  for (const char* label : {"A", "B"}) {
    const std::string instance = fmt::format("demo-{}", label[0] == 'A' ? 'a' : 'b');
    std::vector<std::string> argv = {"/proc/self/exe", "serve",    "--config",    config_file_, "--redis",
                                     options_.redis,   "--listen", "127.0.0.1:0", "--instance", instance};
    auto child = std::make_unique<bench::Child>(std::move(argv));
    const auto url = listening_url(*child);
    if (!url) {
      throw std::runtime_error(
          fmt::format("gateway {} (fairgate serve, pid {}) did not start listening within {}s", label,
                      child->pid(), kStartTimeout.count()));
    }
    children_.push_back(std::move(child));
    gateways_.push_back(Gateway{label, *url, endpoint_of(*url), 0});
  }
}

std::vector<int> Stage::gateway_pids() const {
  std::vector<int> out;
  for (const auto& c : children_) out.push_back(static_cast<int>(c->pid()));
  return out;
}

void Stage::stop(std::function<void()> done) {
  auto finish = [this, done = std::move(done)] {
    mock_->stop();
    if (backend_) backend_->shutdown();
    done();
  };
  if (servers_.empty()) {
    finish();
    return;
  }
  servers_pending_ = servers_.size();
  auto shared = std::make_shared<decltype(finish)>(std::move(finish));
  for (auto& s : servers_) {
    s->stop([this, shared] {
      if (--servers_pending_ == 0) (*shared)();
    });
  }
}

void Stage::stop_processes() {
  for (auto& child : children_) child->kill(SIGTERM);
  for (auto& child : children_) {
    if (!child->wait(kStopTimeout)) {
      child->kill(SIGKILL);
      child->wait(std::chrono::seconds(1));
    }
  }
  if (!children_.empty()) remove_redis_keys();
  children_.clear();
}

/// Deletes this run's keys (its own key prefix) once the gateways are gone:
/// some of them (the ticket sequence) have no TTL. Best effort, bounded.
/// They all carry the limiter's hash tag: on a Cluster they are on the
/// master that owns its slot, where the SCAN runs.
void Stage::remove_redis_keys() const {
  if (key_prefix_.empty()) return;
  try {
    bench::Admin admin(options_.redis, route_key(key_prefix_));
    std::string cursor = "0";
    // DEL of several keys must stay in one slot on a Cluster: only the keys of its hash tag.
    const std::string tag = fmt::format("{{{}}}", kLimiterName);
    for (int round = 0; round < 1000; ++round) {
      const redis::Reply r = admin.call({"SCAN", cursor, "MATCH", key_prefix_ + ":*", "COUNT", "1000"});
      if (r.type != redis::Reply::Type::array || r.elements.size() != 2) break;
      cursor = r.elements[0].str;
      std::vector<std::string> del = {"DEL"};
      for (const auto& k : r.elements[1].elements) {
        if (k.str.find(tag) != std::string::npos) del.push_back(k.str);
      }
      if (del.size() > 1) admin.call(del);
      if (cursor == "0") break;
    }
  } catch (const std::exception&) {
    // Best effort: the keys of a limiter nobody heartbeats expire anyway.
  }
}

}  // namespace fairgate::cli::demo
