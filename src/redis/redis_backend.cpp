// redis/redis_backend.cpp — the set of named limiters of one instance, shared
// cluster-wide through Redis: one command connection, one Pub/Sub connection
// (wake messages are routed to the limiter they name), and the limiters.
#include "api/limiter_registry.hpp"
#include "redis/redis_limiter.hpp"
#include "redis/tls.hpp"
#include "redis/url.hpp"

#include <fairgate/redis_backend.hpp>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <unistd.h>

#include <cstdio>
#include <random>
#include <stdexcept>
#include <variant>

namespace fairgate {

namespace {

bool valid_id_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
}

class RedisBackend final : public Backend, public std::enable_shared_from_this<RedisBackend> {
 public:
  explicit RedisBackend(std::shared_ptr<redis::BackendContext> context) : context_(std::move(context)) {}
  ~RedisBackend() override { shutdown(); }

  void start() {
    std::weak_ptr<RedisBackend> weak = weak_from_this();
    context_->client->set_push_handler([weak](redis::Reply message) {
      if (auto self = weak.lock()) self->on_message(message);
    });
    context_->client->set_resubscribe_handler([weak] {
      // After every (re)connect of a wake connection, a moved slot or master:
      // SSUBSCRIBE each open limiter's channel again.
      if (auto self = weak.lock()) {
        for (auto& limiter : self->registry_.all()) limiter->subscribe();
      }
    });
    context_->client->start();
  }

  std::string_view kind() const noexcept override { return "redis"; }

  BackendHealth health() const override {
    BackendHealth h;
    h.remote = true;
    h.connected = context_->client->all_connected();
    const auto& f = context_->failures;
    h.timeouts = f.timeouts.load(std::memory_order_relaxed);
    h.disconnects = f.disconnects.load(std::memory_order_relaxed);
    h.error_replies = f.error_replies.load(std::memory_order_relaxed);
    h.errors = h.timeouts + h.disconnects + h.error_replies;
    for (auto& limiter : registry_.all()) h.degraded_limiters += limiter->degraded() ? 1 : 0;
    return h;
  }

  boost::system::result<Limiter, SettingsError> open(std::string_view name,
                                                     const Settings& settings) override {
    auto opened = registry_.open(name, settings, [this](std::string n, const Settings& s) {
      return std::make_shared<redis::RedisLimiter>(context_, std::move(n), s);
    });
    if (!opened) return opened.error();
    if (opened->created) opened->limiter->start();  // outside the registry's lock
    return Limiter(opened->limiter);
  }

  std::optional<Limiter> find(std::string_view name) const override { return registry_.find(name); }

  std::vector<Limiter> limiters() const override { return registry_.handles(); }

  void shutdown() override {
    auto all = registry_.close();
    if (!all) return;
    for (auto& limiter : *all) limiter->shutdown();
    // No more waiters here: no more wake messages to hear. Grants that still
    // reach this instance are found by the heartbeats (which go on while
    // permits are held) and released as orphans.
    context_->client->close_subscriber();
  }

 private:
  // ["smessage", "<prefix>:{<limiter>}:wake:<inst>", "<inst>|<n>"]
  void on_message(const redis::Reply& message) {
    if (message.elements.size() < 3) return;
    const std::string& channel = message.elements[1].str;
    const std::string head = context_->options.key_prefix + ":{";
    if (channel.compare(0, head.size(), head) != 0) return;
    const auto close = channel.find("}:wake:", head.size());
    if (close == std::string::npos) return;
    const std::string_view name(channel.data() + head.size(), close - head.size());
    if (auto limiter = registry_.get(name)) limiter->on_wake(message.elements[2].str);
  }

  friend std::shared_ptr<redis::RedisLimiter> redis::redis_limiter_of(const Backend&, std::string_view);

  const std::shared_ptr<redis::BackendContext> context_;
  detail::LimiterRegistry<redis::RedisLimiter> registry_;
};

}  // namespace

namespace redis {
std::shared_ptr<RedisLimiter> redis_limiter_of(const Backend& backend, std::string_view name) {
  const auto* b = dynamic_cast<const RedisBackend*>(&backend);
  if (!b) return nullptr;
  return b->registry_.get(name);
}
}  // namespace redis

namespace {

/// The URL's target with the tls_* options applied to every node, or the
/// problem. With TLS, the CA file, client certificate and key must load now,
/// not fail every connect later.
std::variant<redis::Target, SettingsError> resolve_target(const RedisBackendOptions& o) {
  auto parsed = redis::parse_target(o.url);
  if (const auto* problem = std::get_if<std::string>(&parsed)) return SettingsError{"url", *problem};
  auto target = std::get<redis::Target>(std::move(parsed));
  const bool tls = target.nodes.front().tls.enabled;
  const std::pair<const char*, const std::string*> files[] = {{"tls_ca_file", &o.tls_ca_file},
                                                              {"tls_cert_file", &o.tls_cert_file},
                                                              {"tls_key_file", &o.tls_key_file}};
  for (const auto& [field, value] : files) {
    if (!value->empty() && !tls)
      return SettingsError{field, "needs TLS: use a rediss:// (rediss+cluster://, rediss+sentinel://) url"};
  }
  if (!tls) return target;
  for (auto& node : target.nodes) {
    if (node.tls.ca_file.empty()) node.tls.ca_file = o.tls_ca_file;
    if (node.tls.cert_file.empty() && node.tls.key_file.empty()) {
      node.tls.cert_file = o.tls_cert_file;
      node.tls.key_file = o.tls_key_file;
    }
  }
  const auto& t = target.nodes.front().tls;
  if (t.cert_file.empty() != t.key_file.empty())
    return SettingsError{"tls_cert_file", "tls_cert_file and tls_key_file go together (mutual TLS)"};
  auto context = redis::make_tls_context(t);
  if (const auto* problem = std::get_if<std::string>(&context)) {
    // Name the setting the file came from: a URL parameter, or the option.
    const std::string key = problem->substr(0, problem->find(' '));
    if (key.rfind("tls_", 0) != 0 || o.url.find(key + "=") != std::string::npos)
      return SettingsError{"url", *problem};
    return SettingsError{key, problem->substr(key.size() + 1)};
  }
  return target;
}

}  // namespace

std::string default_instance_id() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::string id;
  for (const char* p = host; *p && id.size() < 64; ++p) id += valid_id_char(*p) ? *p : '_';
  if (id.empty()) id = "host";
  std::random_device rd;
  char suffix[9];
  std::snprintf(suffix, sizeof suffix, "%08x", static_cast<unsigned>(rd()));
  return id + "-" + std::to_string(::getpid()) + "-" + suffix;
}

std::optional<SettingsError> validate(const RedisBackendOptions& o) {
  const auto target = resolve_target(o);
  if (const auto* problem = std::get_if<SettingsError>(&target)) return *problem;
  if (o.key_prefix.empty() || o.key_prefix.size() > 128)
    return SettingsError{"key_prefix", "must be 1..128 characters"};
  for (const char c : o.key_prefix) {
    if (c == '{' || c == '}' || static_cast<unsigned char>(c) <= ' ' || c == 0x7f) {
      return SettingsError{"key_prefix", "must not contain braces, spaces or control characters"};
    }
  }
  if (!o.instance_id.empty()) {
    if (o.instance_id.size() > 128) return SettingsError{"instance_id", "must be at most 128 characters"};
    for (const char c : o.instance_id) {
      if (!valid_id_char(c)) return SettingsError{"instance_id", "may contain only A-Z a-z 0-9 . _ -"};
    }
  }
  if (o.heartbeat_interval.count() <= 0) return SettingsError{"heartbeat_interval", "must be positive"};
  if (o.liveness_ttl <= o.heartbeat_interval) {
    return SettingsError{"liveness_ttl", "must be greater than heartbeat_interval"};
  }
  if (o.command_timeout.count() <= 0) return SettingsError{"command_timeout", "must be positive"};
  if (o.command_timeout >= o.liveness_ttl) {
    return SettingsError{"command_timeout", "must be less than liveness_ttl"};
  }
  if (o.recovery_fence && (o.recovery_fence->count() < 0 || *o.recovery_fence > std::chrono::hours(1)))
    return SettingsError{"recovery_fence", "must be between 0 and 1 hour"};
  if (o.degrade_after.count() <= 0) return SettingsError{"degrade_after", "must be positive"};
  if (o.recover_after.count() < 0) return SettingsError{"recover_after", "must not be negative"};
  const auto min_expiry = o.heartbeat_interval * redis::RedisLimiter::kExpiryEvery + o.liveness_ttl;
  if (o.key_expiry.count() < 0 || (o.key_expiry.count() > 0 && o.key_expiry <= min_expiry)) {
    return SettingsError{"key_expiry", "must be 0 (never) or more than " +
                                           std::to_string(min_expiry.count()) +
                                           " ms (10 heartbeat intervals + liveness_ttl)"};
  }
  return std::nullopt;
}

std::shared_ptr<Backend> make_redis_backend(boost::asio::any_io_executor executor,
                                            RedisBackendOptions options) {
  if (auto error = validate(options)) throw std::invalid_argument(error->message());
  if (options.instance_id.empty()) options.instance_id = default_instance_id();
  auto context = std::make_shared<redis::BackendContext>();
  context->executor = executor;
  redis::ClientOptions client;
  client.target = std::get<redis::Target>(resolve_target(options));
  client.command_timeout = options.command_timeout;
  client.client_name = "fairgate:" + options.instance_id;
  client.log = options.log ? std::function<void(const std::string&)>(
                                 [log = options.log](const std::string& line) { log(line); })
                           : std::function<void(const std::string&)>();
  context->options = std::move(options);
  context->client = redis::make_client(executor, std::move(client));
  auto backend = std::make_shared<RedisBackend>(std::move(context));
  backend->start();
  return backend;
}

}  // namespace fairgate
