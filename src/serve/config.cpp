// serve/config.cpp — why it is shaped this way:
//  * One pass per source (file, environment, flags), each writing into the
//    same ServeConfig, so precedence is simply the order of the passes.
//  * Unknown keys are errors (a typo like `max_concurent` must not silently
//    fall back to a default).
//  * Rate-limit rules end in fairgate::validate(const RateRule&), like the
//    limiters, so the messages match the library's and PUT /v1/ratelimit's.
//  * Routes are checked against the limiters once every source is merged
//    (a route may name a limiter given by a flag).
//  * Limiter settings end in fairgate::validate(), the one judge of settings,
//    so the messages match the library's and the admin API's.
#include "serve/config.hpp"

#include "http/address.hpp"

#include "serve/cors.hpp"
#include "tls/client.hpp"

#include "core/settings_table.hpp"
#include "core/text.hpp"

#include <toml++/toml.h>

#include <fmt/format.h>

#include <boost/asio/ip/address.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <variant>

namespace fairgate::serve {
namespace {

using std::chrono::milliseconds;

// What the file, the environment or a flag gave is echoed with its control
// characters escaped: what() stays one line.
[[noreturn]] void fail(std::string_view field, std::string_view problem) {
  throw ConfigError(core::escape_controls(fmt::format("{}: {}", field, problem)));
}

std::string_view type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date/time";
  }
}

std::int64_t get_int(const toml::node& node, const std::string& field, std::int64_t lo, std::int64_t hi) {
  const auto v = node.value_exact<std::int64_t>();
  if (!v) fail(field, fmt::format("expected an integer, got {}", type_name(node)));
  if (*v < lo || *v > hi) fail(field, fmt::format("{} not in {}..{}", *v, lo, hi));
  return *v;
}

std::string get_string(const toml::node& node, const std::string& field) {
  const auto v = node.value_exact<std::string>();
  if (!v) fail(field, fmt::format("expected a string, got {}", type_name(node)));
  return *v;
}

bool get_bool(const toml::node& node, const std::string& field) {
  const auto v = node.value_exact<bool>();
  if (!v) fail(field, fmt::format("expected true or false, got {}", type_name(node)));
  return *v;
}

milliseconds get_ms(const toml::node& node, const std::string& field, std::int64_t lo, std::int64_t hi) {
  return milliseconds(get_int(node, field, lo, hi));
}

const toml::table& get_table(const toml::node& node, const std::string& field) {
  const auto* t = node.as_table();
  if (t == nullptr) fail(field, fmt::format("expected a table, got {}", type_name(node)));
  return *t;
}

void check_token(const std::string& token, std::string_view field) {
  // An empty token would turn the admin routes off without a word (an unset shell variable in
  // --admin-token "$TOKEN"): say so instead. An empty FAIRGATE_ADMIN_TOKEN counts as unset.
  if (token.empty()) fail(field, "empty (leave it out to keep the admin routes off)");
  if (token.size() > 256) fail(field, "longer than 256 characters");
  for (const char c : token) {
    if (c <= ' ' || c > '~') fail(field, "only printable ASCII without spaces is allowed");
  }
}

void check_instance(const std::string& id, std::string_view field) {
  if (id.empty() || id.size() > 128) fail(field, "must be 1..128 characters of [A-Za-z0-9._-]");
  for (const char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) fail(field, "must be 1..128 characters of [A-Za-z0-9._-]");
  }
}

void check_limiter(const LimiterConfig& l, const std::string& prefix) {
  if (auto e = validate_limiter_name(l.name)) fail(prefix, e->problem);
  if (auto e = validate(l.settings)) fail(prefix + "." + e->field, e->problem);
}

LimiterConfig read_limiter(const std::string& name, const toml::table& t) {
  const std::string prefix = "limiters." + name;
  LimiterConfig l;
  l.name = name;
  if (auto e = validate_limiter_name(name)) fail(prefix, e->problem);
  std::vector<std::pair<const core::SettingSpec*, std::string>> given;
  for (auto&& [key, node] : t) {
    const std::string k(key.str());
    const std::string field = prefix + "." + k;
    const core::SettingSpec* spec = core::setting_by_key(k);
    if (spec == nullptr) fail(field, "unknown key");
    // A key and its older alias (early_reject, reject_early) together: which one was meant?
    for (const auto& [other, other_key] : given)
      if (other == spec)
        fail(field, fmt::format("sets what {}.{} sets: keep one of them", prefix, other_key));
    given.emplace_back(spec, k);
    switch (spec->kind) {
      case core::SettingKind::count:
      case core::SettingKind::optional_count:
      case core::SettingKind::duration_ms:
        spec->set(l.settings, get_int(node, field, spec->min, spec->max));
        break;
      case core::SettingKind::flag: spec->set(l.settings, get_bool(node, field) ? 1 : 0); break;
      case core::SettingKind::choice: {
        const auto text = get_string(node, field);
        const auto choice = core::parse_choice(*spec, text);
        if (!choice) fail(field, fmt::format("\"{}\" is not one of {}", text, core::join_choices(*spec)));
        spec->set(l.settings, *choice);
        break;
      }
    }
  }
  // Required, as MAX is in --limiter: an empty table or a commented-out line must not serve
  // every request one at a time (the library's default cap of 1). After the keys: a misspelt
  // one is named as such.
  if (!t.contains("max_concurrent"))
    fail(prefix + ".max_concurrent", "missing (the cap: permits held at once, e.g. max_concurrent = 3)");
  check_limiter(l, prefix);
  return l;
}

void check_header_name(const std::string& name, const std::string& field);

RateKeySpec parse_key_part(const std::string& text, const std::string& field) {
  RateKeySpec k;
  if (text == "tenant") {
    k.part = RateKeyPart::tenant;
  } else if (text == "ip") {
    k.part = RateKeyPart::ip;
  } else if (text == "route") {
    k.part = RateKeyPart::route;
  } else if (text == "global") {
    k.part = RateKeyPart::global;
  } else if (text.rfind("header:", 0) == 0) {
    k.part = RateKeyPart::header;
    k.header = text.substr(7);
    check_header_name(k.header, field);
  } else {
    fail(field,
         fmt::format("\"{}\" is not one of header:NAME, tenant, ip, route, global", text.substr(0, 100)));
  }
  return k;
}

RateRuleConfig read_rate_rule(const std::string& name, const toml::table& t) {
  const std::string prefix = "ratelimit." + name;
  RateRuleConfig r;
  r.name = name;
  if (auto e = validate_rule_name(name)) fail(prefix, e->problem);
  bool has_rate = false;
  bool explicit_default = false;  // default_max_tokens given (the built-in one is not checked)
  for (auto&& [key, node] : t) {
    const std::string k(key.str());
    const std::string field = prefix + "." + k;
    if (k == "algorithm") {
      const auto text = get_string(node, field);
      const auto a = parse_rate_algorithm(text);
      if (!a)
        fail(field,
             fmt::format("\"{}\" is not one of fixed_window, sliding_log, sliding_window, token_bucket, gcra",
                         text.substr(0, 100)));
      r.rule.algorithm = *a;
    } else if (k == "rate") {
      r.rule.rate = get_int(node, field, 1, kMaxRate);
      has_rate = true;
    } else if (k == "period_ms") {
      r.rule.period_ms = get_int(node, field, 1, kMaxPeriodMs);
    } else if (k == "burst") {
      r.rule.burst = get_int(node, field, 0, kMaxRate);
    } else if (k == "on_redis_down") {
      const auto text = get_string(node, field);
      const auto policy = parse_redis_down_policy(text);
      if (!policy) fail(field, fmt::format("\"{}\" is not one of local, open, closed", text));
      r.rule.on_redis_down = *policy;
    } else if (k == "local_divisor") {
      r.rule.local_divisor = get_int(node, field, 1, 1000);
    } else if (k == "mode") {
      const auto text = get_string(node, field);
      const auto mode = parse_limiter_mode(text);
      if (!mode) fail(field, fmt::format("\"{}\" is not one of enforce, shadow", text));
      r.rule.mode = *mode;
    } else if (k == "key") {
      if (const auto* list = node.as_array()) {
        if (list->empty() || list->size() > 8) fail(field, "a composite key has 1..8 parts");
        for (std::size_t i = 0; i < list->size(); ++i) {
          const std::string item = fmt::format("{}[{}]", field, i);
          r.key.push_back(parse_key_part(get_string(*list->get(i), item), item));
        }
      } else if (node.is_string()) {
        r.key.push_back(parse_key_part(get_string(node, field), field));
      } else {
        fail(field,
             fmt::format("expected a string (e.g. \"header:X-User-Id\", \"ip\") or an array of them, got {}",
                         type_name(node)));
      }
    } else if (k == "cost") {
      if (node.is_string()) {
        const auto text = get_string(node, field);
        if (text != "tokens")
          fail(field, fmt::format("\"{}\" is not \"tokens\" or a whole number", text.substr(0, 100)));
        r.cost_mode = RateCostMode::tokens;
      } else if (node.is_integer()) {
        r.cost = get_int(node, field, 1, kMaxCost);
        r.cost_mode = RateCostMode::fixed;
      } else {
        fail(field, fmt::format("expected a whole number or \"tokens\", got {}", type_name(node)));
      }
    } else if (k == "default_max_tokens") {
      r.default_max_tokens = get_int(node, field, 1, 10'000'000);
      explicit_default = true;
    } else if (k == "chars_per_token") {
      r.chars_per_token = get_int(node, field, 1, 100);
    } else {
      fail(field, "unknown key");
    }
  }
  if (!has_rate)
    fail(prefix + ".rate", "missing (units per period_ms, e.g. rate = 60 with period_ms = 60000)");
  if (auto e = validate(r.rule)) fail(prefix + "." + e->field, e->problem);
  if (r.cost_mode == RateCostMode::fixed && r.cost > r.rule.capacity())
    fail(prefix + ".cost", fmt::format("{} exceeds the rule's capacity {}: no request could ever pass",
                                       r.cost, r.rule.capacity()));
  // A request without max_tokens costs the default plus its prompt's estimate (at least 1).
  if (r.cost_mode == RateCostMode::tokens && explicit_default && r.default_max_tokens >= r.rule.capacity())
    fail(prefix + ".default_max_tokens",
         fmt::format("{} leaves no room under the rule's capacity {}: a request without max_tokens costs it "
                     "plus its prompt's estimate, and could never pass",
                     r.default_max_tokens, r.rule.capacity()));
  return r;
}

/// `cors_origins = ["https://app.example.com", ...]` or `["*"]`; normalized as browsers send them.
std::vector<std::string> read_cors_origins(const toml::node& node, const std::string& field) {
  const auto* list = node.as_array();
  if (list == nullptr)
    fail(field, fmt::format("expected an array of origins (e.g. [\"https://app.example.com\"]), got {}",
                            type_name(node)));
  if (list->size() > 256) fail(field, "more than 256 origins");
  std::vector<std::string> out;
  for (std::size_t i = 0; i < list->size(); ++i) {
    const std::string item = fmt::format("{}[{}]", field, i);
    const std::string text = get_string(*list->get(i), item);
    if (text == "*") {
      if (list->size() != 1) fail(item, "\"*\" allows every origin: list it alone");
      out.push_back(text);
      continue;
    }
    std::string problem;
    const auto origin = normalize_origin(text, problem);
    if (!origin) fail(item, fmt::format("\"{}\": {}", text.substr(0, 100), problem));
    if (std::find(out.begin(), out.end(), *origin) == out.end()) out.push_back(*origin);
  }
  return out;
}

/// `trusted_proxies = ["10.0.0.0/8", "127.0.0.1", "::1/128"]`.
std::vector<TrustedProxy> read_trusted_proxies(const toml::node& node, const std::string& field) {
  const auto* list = node.as_array();
  if (list == nullptr)
    fail(field, fmt::format("expected an array of addresses or networks (e.g. [\"10.0.0.0/8\"]), got {}",
                            type_name(node)));
  if (list->size() > 1024) fail(field, "more than 1024 entries");
  std::vector<TrustedProxy> out;
  for (std::size_t i = 0; i < list->size(); ++i) {
    const std::string item = fmt::format("{}[{}]", field, i);
    const std::string text = get_string(*list->get(i), item);
    const auto slash = text.find('/');
    boost::system::error_code ec;
    TrustedProxy p;
    p.address = boost::asio::ip::make_address(text.substr(0, slash), ec);
    if (ec)
      fail(item, fmt::format("\"{}\" is not an IP address or ADDRESS/PREFIX network", text.substr(0, 100)));
    const unsigned max = p.address.is_v4() ? 32 : 128;
    p.prefix = max;
    if (slash != std::string::npos) {
      const std::string bits = text.substr(slash + 1);
      if (bits.empty() || bits.size() > 3 ||
          !std::all_of(bits.begin(), bits.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
          std::stoul(bits) > max)
        fail(item, fmt::format("\"{}\": the prefix length must be 0..{}", text.substr(0, 100), max));
      p.prefix = static_cast<unsigned>(std::stoul(bits));
    }
    out.push_back(p);
  }
  return out;
}

LogLevel log_level_of(const std::string& text, std::string_view field) {
  const auto level = parse_log_level(text);
  if (!level) fail(field, fmt::format("\"{}\" is not one of trace, debug, info, warn, error, off", text));
  return *level;
}

LogFormat log_format_of(const std::string& text, std::string_view field) {
  const auto format = parse_log_format(text);
  if (!format) fail(field, fmt::format("\"{}\" is not one of text, json", text));
  return *format;
}

void read_server(const toml::table& t, ServerLimits& s) {
  for (auto&& [key, node] : t) {
    const std::string k(key.str());
    const std::string field = "server." + k;
    if (k == "threads") {
      s.threads = static_cast<unsigned>(get_int(node, field, 1, 64));
    } else if (k == "max_connections") {
      s.max_connections = static_cast<std::size_t>(get_int(node, field, 1, 1'000'000));
    } else if (k == "max_header_bytes") {
      s.max_header_bytes = static_cast<std::size_t>(get_int(node, field, 1024, 1024 * 1024));
    } else if (k == "max_body_bytes") {
      s.max_body_bytes = static_cast<std::size_t>(get_int(node, field, 0, 16 * 1024 * 1024));
    } else if (k == "header_timeout_ms") {
      s.header_timeout = get_ms(node, field, 100, 600'000);
    } else if (k == "idle_timeout_ms") {
      s.idle_timeout = get_ms(node, field, 100, 3'600'000);
    } else if (k == "write_timeout_ms") {
      s.write_timeout = get_ms(node, field, 100, 600'000);
    } else if (k == "keepalive_ms") {
      s.keepalive_interval = get_ms(node, field, 10, 3'600'000);
    } else if (k == "events_interval_ms") {
      s.events_interval = get_ms(node, field, 10, 3'600'000);
    } else if (k == "max_waiters_per_client") {
      s.max_waiters_per_client = static_cast<std::size_t>(get_int(node, field, 1, 10'000'000));
    } else if (k == "lease_ms") {
      s.lease = get_ms(node, field, 100, 86'400'000);
    } else if (k == "max_lease_ms") {
      s.max_lease = get_ms(node, field, 100, 86'400'000);
    } else if (k == "shutdown_grace_ms") {
      s.shutdown_grace = get_ms(node, field, 0, 600'000);
    } else if (k == "cors_origins") {
      s.cors_origins = read_cors_origins(node, field);
    } else if (k == "trusted_proxies") {
      s.trusted_proxies = read_trusted_proxies(node, field);
    } else if (k == "log_level") {
      s.log.level = log_level_of(get_string(node, field), field);
    } else if (k == "log_format") {
      s.log.format = log_format_of(get_string(node, field), field);
    } else if (k == "access_log") {
      s.log.access_log = get_bool(node, field);
    } else {
      fail(field, "unknown key");
    }
  }
  if (s.lease > s.max_lease)
    fail("server.lease_ms",
         fmt::format("{} ms{} is greater than server.max_lease_ms ({} ms): lower lease_ms too",
                     s.lease.count(), t.contains("lease_ms") ? "" : " (its default)", s.max_lease.count()));
}

/// The [redis] key (or the flag) that sets RedisBackendOptions' `option`, for an error.
std::string redis_key_of(std::string_view option) {
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 8> kKeys{{
      {"url", "redis.url (--redis, FAIRGATE_REDIS)"},
      {"instance_id", "instance (--instance, FAIRGATE_INSTANCE)"},
      {"command_timeout", "redis.timeout_ms"},
      {"heartbeat_interval", "redis.heartbeat_ms"},
      {"liveness_ttl", "redis.liveness_ttl_ms"},
      {"recovery_fence", "redis.recovery_fence_ms"},
      {"degrade_after", "redis.degrade_after_ms"},
      {"recover_after", "redis.recover_after_ms"},
  }};
  for (const auto& [name, key] : kKeys)
    if (name == option) return std::string(key);
  return "redis." + std::string(option);
}

/// A problem of validate(RedisBackendOptions) in the config's words (its keys, their defaults).
std::string redis_problem_of(const SettingsError& e) {
  std::string text = e.problem;
  for (const auto& [name, key] :
       {std::pair<std::string_view, std::string_view>{"liveness_ttl", "liveness_ttl_ms"},
        {"heartbeat_interval", "heartbeat_ms"}}) {
    if (const auto at = text.find(name); at != std::string::npos) text.replace(at, name.size(), key);
  }
  if (e.field == "command_timeout" || e.field == "liveness_ttl")
    text += " (defaults: timeout_ms 200, heartbeat_ms 1000, liveness_ttl_ms 3000)";
  return text;
}

void read_redis(const toml::table& t, RedisBackendOptions& r) {
  for (auto&& [key, node] : t) {
    const std::string k(key.str());
    const std::string field = "redis." + k;
    if (k == "url") {
      r.url = get_string(node, field);
    } else if (k == "key_prefix") {
      r.key_prefix = get_string(node, field);
    } else if (k == "tls_ca_file") {
      r.tls_ca_file = get_string(node, field);
    } else if (k == "tls_cert_file") {
      r.tls_cert_file = get_string(node, field);
    } else if (k == "tls_key_file") {
      r.tls_key_file = get_string(node, field);
    } else if (k == "timeout_ms") {
      r.command_timeout = get_ms(node, field, 1, 60'000);
    } else if (k == "heartbeat_ms") {
      r.heartbeat_interval = get_ms(node, field, 10, 60'000);
    } else if (k == "liveness_ttl_ms") {
      r.liveness_ttl = get_ms(node, field, 20, 600'000);
    } else if (k == "recovery_fence_ms") {
      r.recovery_fence = get_ms(node, field, 0, 3'600'000);
    } else if (k == "degrade_after_ms") {
      r.degrade_after = get_ms(node, field, 1, 600'000);
    } else if (k == "recover_after_ms") {
      r.recover_after = get_ms(node, field, 0, 600'000);
    } else {
      fail(field, "unknown key");
    }
  }
}

void check_route_path(const std::string& path, const std::string& field) {
  if (path.empty() || path.front() != '/') fail(field, "must start with '/'");
  if (path.size() > 256) fail(field, "longer than 256 characters");
  for (const char c : path) {
    if (c <= ' ' || c > '~' || c == '?' || c == '#' || c == '%' || c == '"' || c == '\\')
      fail(field, "only printable ASCII without spaces, '?', '#', '%', '\"' or '\\' is allowed");
  }
  if (path.find("//") != std::string::npos || path.find("/./") != std::string::npos ||
      path.find("/../") != std::string::npos)
    fail(field, "must not contain empty, '.' or '..' segments");
}

void check_header_name(const std::string& name, const std::string& field) {
  if (name.empty() || name.size() > 64) fail(field, "must be 1..64 characters");
  for (const char c : name) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    if (!ok) fail(field, fmt::format("\"{}\" is not an HTTP header name", name));
  }
}

/// A name or an IP address for a certificate to carry: printable ASCII, no spaces, 1..253.
void check_server_name(const std::string& name, const std::string& field) {
  if (name.empty() || name.size() > 253) fail(field, "must be 1..253 characters");
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '-' || c == ':' || c == '_' || c == '*';
    if (!ok) fail(field, fmt::format("\"{}\" is not a host name or IP address", core::escape_controls(name)));
  }
}

RouteConfig read_route(const toml::table& t, const std::string& prefix) {
  RouteConfig r;
  bool has_path = false, has_upstream = false, has_limiter = false, has_wait_keys = false,
       has_tls_keys = false;
  for (auto&& [key, node] : t) {
    const std::string k(key.str());
    const std::string field = prefix + "." + k;
    if (k == "path") {
      r.path = get_string(node, field);
      check_route_path(r.path, field);
      if (r.path.size() > 1 && r.path.back() == '/') r.path.pop_back();
      has_path = true;
    } else if (k == "upstream") {
      parse_upstream(get_string(node, field), field, r);
      has_upstream = true;
    } else if (k == "limiter") {
      r.limiter = get_string(node, field);
      if (auto e = validate_limiter_name(r.limiter)) fail(field, e->problem);
      has_limiter = true;
    } else if (k == "tenant_header") {
      r.tenant_header = get_string(node, field);
      check_header_name(r.tenant_header, field);
    } else if (k == "queue_events") {
      has_wait_keys = true;
      const auto mode = get_string(node, field);
      if (mode == "comment")
        r.queue_events = QueueEvents::comment;
      else if (mode == "named")
        r.queue_events = QueueEvents::named;
      else if (mode == "seed")
        r.queue_events = QueueEvents::seed;
      else if (mode == "none")
        r.queue_events = QueueEvents::none;
      else
        fail(field, fmt::format("\"{}\" is not one of comment, named, seed, none", mode));
    } else if (k == "max_wait_ms") {
      has_wait_keys = true;
      r.max_wait = get_ms(node, field, 0, kMaxWaitLimit.count());
    } else if (k == "connect_timeout_ms") {
      r.connect_timeout = get_ms(node, field, 10, 600'000);
    } else if (k == "upstream_timeout_ms") {
      r.upstream_timeout = get_ms(node, field, 10, 86'400'000);
    } else if (k == "max_body_bytes") {
      r.max_body_bytes = static_cast<std::size_t>(get_int(node, field, 0, 256 * 1024 * 1024));
    } else if (k == "pool_size") {
      r.pool_size = static_cast<std::size_t>(get_int(node, field, 0, 10'000));
    } else if (k == "upstream_ca_file") {
      r.upstream_ca_file = get_string(node, field);
      has_tls_keys = true;
    } else if (k == "upstream_cert_file") {
      r.upstream_cert_file = get_string(node, field);
      has_tls_keys = true;
    } else if (k == "upstream_key_file") {
      r.upstream_key_file = get_string(node, field);
      has_tls_keys = true;
    } else if (k == "upstream_server_name") {
      r.upstream_server_name = get_string(node, field);
      check_server_name(r.upstream_server_name, field);
      has_tls_keys = true;
    } else if (k == "upstream_tls_verify") {
      r.upstream_tls_verify = get_bool(node, field);
      has_tls_keys = true;
    } else if (k == "ratelimit") {
      const auto* list = node.as_array();
      if (list == nullptr)
        fail(field,
             fmt::format("expected an array of rule names (e.g. [\"per-user\"]), got {}", type_name(node)));
      if (list->size() > 32) fail(field, "more than 32 rules");
      for (std::size_t i = 0; i < list->size(); ++i) {
        const std::string item = fmt::format("{}[{}]", field, i);
        std::string name = get_string(*list->get(i), item);
        if (auto e = validate_rule_name(name)) fail(item, e->problem);
        if (std::find(r.ratelimit.begin(), r.ratelimit.end(), name) != r.ratelimit.end())
          fail(item, fmt::format("\"{}\" is listed twice", name));
        r.ratelimit.push_back(std::move(name));
      }
    } else {
      fail(field, "unknown key");
    }
  }
  if (!has_path) fail(prefix + ".path", "missing (the path prefix to route, e.g. \"/v1/chat/completions\")");
  if (!has_upstream) fail(prefix + ".upstream", "missing (e.g. \"http://127.0.0.1:9000\")");
  if (has_tls_keys && !r.upstream_tls)
    fail(prefix + ".upstream",
         "the upstream_ca_file, upstream_cert_file, upstream_key_file, upstream_server_name and "
         "upstream_tls_verify keys need an https:// upstream");
  if (r.upstream_cert_file.empty() != r.upstream_key_file.empty())
    fail(prefix + (r.upstream_cert_file.empty() ? ".upstream_cert_file" : ".upstream_key_file"),
         "upstream_cert_file and upstream_key_file go together (the client certificate and its key)");
  if (r.upstream_tls) {
    // The files are read now, so a wrong path or a bad PEM stops the start, not the first request.
    if (auto made = tls::make_context(upstream_tls_options(r), kUpstreamTlsWords);
        std::holds_alternative<std::string>(made))
      fail(prefix, std::get<std::string>(made));
  }
  // No limiter: proxied at once, without a permit; it never waits, so the wait's keys would do nothing.
  if (!has_limiter && has_wait_keys)
    fail(prefix + (r.max_wait ? ".max_wait_ms" : ".queue_events"),
         "needs a limiter (a route without one is proxied at once and never waits)");
  return r;
}

void read_routes(const toml::node& node, ServeConfig& cfg) {
  const auto* list = node.as_array();
  if (list == nullptr) fail("route", fmt::format("expected [[route]] tables, got {}", type_name(node)));
  for (std::size_t i = 0; i < list->size(); ++i) {
    const std::string prefix = fmt::format("route[{}]", i);
    cfg.routes.push_back(read_route(get_table(*list->get(i), prefix), prefix));
  }
}

void check_routes(const ServeConfig& cfg) {
  for (std::size_t i = 0; i < cfg.routes.size(); ++i) {
    const auto& r = cfg.routes[i];
    const std::string prefix = fmt::format("route[{}]", i);
    const bool known =
        r.limiter.empty() || std::any_of(cfg.limiters.begin(), cfg.limiters.end(),
                                         [&](const LimiterConfig& l) { return l.name == r.limiter; });
    if (!known) fail(prefix + ".limiter", fmt::format("no limiter named \"{}\" is configured", r.limiter));
    for (std::size_t k = 0; k < r.ratelimit.size(); ++k) {
      const std::string item = fmt::format("{}.ratelimit[{}]", prefix, k);
      const auto rule = std::find_if(cfg.rate_rules.begin(), cfg.rate_rules.end(),
                                     [&](const RateRuleConfig& x) { return x.name == r.ratelimit[k]; });
      if (rule == cfg.rate_rules.end())
        fail(item, fmt::format("no rule named \"{}\" is configured ([ratelimit.{}])", r.ratelimit[k],
                               r.ratelimit[k]));
      if (rule->key.empty())
        fail(item,
             fmt::format("rule \"{}\" has no key: set ratelimit.{}.key (e.g. \"header:X-User-Id\", \"ip\")",
                         rule->name, rule->name));
      for (const auto& part : rule->key)
        if (part.part == RateKeyPart::tenant && r.tenant_header.empty())
          fail(item, fmt::format("rule \"{}\" is keyed by the tenant, but this route has no tenant_header",
                                 rule->name));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (cfg.routes[j].path == r.path)
        fail(prefix + ".path", fmt::format("\"{}\" is already the path of route[{}]", r.path, j));
    }
  }
}

/// Opens `path` first, so a missing or unreadable file is named with the OS's
/// reason (toml++ says only "File could not be opened for reading").
void check_readable(const std::string& path, std::string_view field) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail(field, "is a directory, not a file");
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    if (err == ENOENT) fail(field, "no such file");
    fail(field, fmt::format("cannot read it: {}", err != 0 ? std::strerror(err) : "cannot be opened"));
  }
  std::fclose(f);
}

void read_file(const std::string& path, ServeConfig& cfg) {
  const std::string field = fmt::format("config file {}", path);
  check_readable(path, field);
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    std::string what(e.description());
    // toml++ 3.3 garbles the table's name in this one message ('limiters."chchat"' for a
    // [limiters."chat"] after [limiters.chat]): say what is wrong without repeating it.
    if (what.find("cannot redefine existing table") != std::string::npos) {
      what =
          "this table is already defined above (a table may appear once; quoted and bare keys are "
          "the same name: [limiters.\"chat\"] is [limiters.chat])";
    }
    fail(field, fmt::format("line {}, column {}: {}", where.line, where.column, what));
  } catch (const std::exception& e) {
    fail(field, e.what());
  }
  for (auto&& [key, node] : root) {
    const std::string k(key.str());
    if (k == "listen") {
      parse_listen(get_string(node, k), k, cfg);
    } else if (k == "admin_token") {
      cfg.admin_token = get_string(node, k);
      check_token(cfg.admin_token, k);
    } else if (k == "instance") {
      cfg.instance = get_string(node, k);
      check_instance(cfg.instance, k);
    } else if (k == "redis") {
      if (!cfg.redis) cfg.redis.emplace();
      read_redis(get_table(node, k), *cfg.redis);
    } else if (k == "limiters") {
      for (auto&& [name, lim] : get_table(node, k)) {
        const std::string n(name.str());
        cfg.limiters.push_back(read_limiter(n, get_table(lim, "limiters." + n)));
      }
    } else if (k == "server") {
      read_server(get_table(node, k), cfg.server);
    } else if (k == "route") {
      read_routes(node, cfg);
    } else if (k == "ratelimit") {
      for (auto&& [name, rule] : get_table(node, k)) {
        const std::string n(name.str());
        cfg.rate_rules.push_back(read_rate_rule(n, get_table(rule, "ratelimit." + n)));
      }
    } else {
      fail(k, "unknown key");
    }
  }
}

void set_limiter(ServeConfig& cfg, const LimiterConfig& l) {
  const auto it =
      std::find_if(cfg.limiters.begin(), cfg.limiters.end(), [&](const auto& x) { return x.name == l.name; });
  if (it != cfg.limiters.end())
    *it = l;
  else
    cfg.limiters.push_back(l);
}

}  // namespace

std::string_view to_string(QueueEvents mode) noexcept {
  switch (mode) {
    case QueueEvents::comment: return "comment";
    case QueueEvents::named: return "named";
    case QueueEvents::seed: return "seed";
    case QueueEvents::none: return "none";
  }
  return "comment";
}

void parse_upstream(std::string_view url, std::string_view field, RouteConfig& route) {
  const bool tls = url.substr(0, 8) == "https://";
  if (!tls && url.substr(0, 7) != "http://")
    fail(field, fmt::format("\"{}\" is not an http:// or https:// URL (e.g. http://127.0.0.1:9000)", url));
  std::string_view rest = url.substr(tls ? 8 : 7);
  const auto slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string base(slash == std::string_view::npos ? std::string_view() : rest.substr(slash));
  while (!base.empty() && base.back() == '/') base.pop_back();
  if (base.find_first_of("?#") != std::string::npos) fail(field, "must not have a query or fragment");
  for (const char c : base) {
    if (c <= ' ' || c > '~') fail(field, "the path must be printable ASCII without spaces");
    // RFC 3986 path characters only: these would make the request line Beast sends invalid.
    if (c == '"' || c == '\\' || c == '{' || c == '}' || c == '<' || c == '>' || c == '^' || c == '`' ||
        c == '|')
      fail(field, fmt::format("'{}' is not allowed in the path (percent-encode it)", c));
  }
  if (authority.find('@') != std::string_view::npos) fail(field, "user:password@ is not supported");
  std::string host;
  std::string_view port_text;
  bool has_port = false;
  if (!authority.empty() && authority.front() == '[') {
    const auto close = authority.find(']');
    if (close == std::string_view::npos) fail(field, "unclosed '[' in the host");
    host = std::string(authority.substr(1, close - 1));
    const auto after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') fail(field, "expected ':PORT' after the IPv6 address");
      port_text = after.substr(1);
      has_port = true;
    }
  } else {
    const auto colon = authority.rfind(':');
    host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_text = authority.substr(colon + 1);
      has_port = true;
    }
  }
  if (host.empty()) fail(field, fmt::format("\"{}\" has no host", url));
  for (const char c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '-' || c == ':' || c == '_';
    if (!ok) fail(field, fmt::format("\"{}\" is not a host name or IP address", host));
  }
  long port = tls ? 443 : 80;
  if (has_port) {
    if (port_text.empty() || port_text.size() > 5 ||
        !std::all_of(port_text.begin(), port_text.end(), [](char c) { return c >= '0' && c <= '9'; }))
      fail(field, fmt::format("port \"{}\" is not a number in 1..65535", port_text));
    port = std::strtol(std::string(port_text).c_str(), nullptr, 10);
    if (port < 1 || port > 65535) fail(field, fmt::format("port {} not in 1..65535", port));
  }
  route.upstream = std::string(url);
  route.upstream_host = host;
  route.upstream_port = static_cast<std::uint16_t>(port);
  route.upstream_tls = tls;
  route.upstream_base = base;
  route.upstream_has_path = slash != std::string_view::npos;
}

tls::Options upstream_tls_options(const RouteConfig& route) {
  tls::Options o;
  o.enabled = route.upstream_tls;
  o.ca_file = route.upstream_ca_file;
  o.cert_file = route.upstream_cert_file;
  o.key_file = route.upstream_key_file;
  o.server_name = route.upstream_server_name;
  o.verify = route.upstream_tls_verify;
  return o;
}

bool is_trusted_proxy(const boost::asio::ip::address& client, const std::vector<TrustedProxy>& proxies) {
  auto bytes_of = [](const boost::asio::ip::address& a) {
    std::array<unsigned char, 16> out{};
    if (a.is_v4()) {
      const auto b = a.to_v4().to_bytes();
      std::copy(b.begin(), b.end(), out.begin());
    } else {
      const auto b = a.to_v6().to_bytes();
      std::copy(b.begin(), b.end(), out.begin());
    }
    return out;
  };
  // An IPv4 peer on a dual-stack socket arrives as ::ffff:a.b.c.d.
  boost::asio::ip::address c = client;
  if (c.is_v6() && c.to_v6().is_v4_mapped())
    c = boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, c.to_v6());
  const auto cb = bytes_of(c);
  for (const auto& p : proxies) {
    if (p.address.is_v4() != c.is_v4()) continue;
    const auto pb = bytes_of(p.address);
    unsigned bits = p.prefix;
    bool match = true;
    for (std::size_t i = 0; match && bits > 0; ++i) {
      const unsigned take = std::min(bits, 8u);
      const auto mask = static_cast<unsigned char>(0xFFu << (8 - take));
      match = (cb[i] & mask) == (pb[i] & mask);
      bits -= take;
    }
    if (match) return true;
  }
  return false;
}

void parse_listen(std::string_view text, std::string_view field, ServeConfig& out) {
  std::string error;
  auto address = fairgate::http::parse_listen(text, error);
  if (!address) fail(field, error);
  out.listen_host = std::move(address->host);
  out.listen_port = address->port;
}

ServeConfig load_config(const ServeFlags& flags, const EnvLookup& env) {
  ServeConfig cfg;
  const auto getenv = [&](const char* name) -> std::optional<std::string> {
    const char* v = env ? env(name) : nullptr;
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  };

  if (flags.config_file) {
    read_file(*flags.config_file, cfg);
  } else if (auto path = getenv("FAIRGATE_CONFIG")) {
    read_file(*path, cfg);
  }

  if (auto v = getenv("FAIRGATE_LISTEN")) parse_listen(*v, "FAIRGATE_LISTEN", cfg);
  if (auto v = getenv("FAIRGATE_REDIS")) {
    if (!cfg.redis) cfg.redis.emplace();
    cfg.redis->url = *v;
  }
  if (auto v = getenv("FAIRGATE_INSTANCE")) {
    check_instance(*v, "FAIRGATE_INSTANCE");
    cfg.instance = *v;
  }
  if (auto v = getenv("FAIRGATE_ADMIN_TOKEN")) {
    check_token(*v, "FAIRGATE_ADMIN_TOKEN");
    cfg.admin_token = *v;
  }
  if (auto v = getenv("FAIRGATE_THREADS")) {
    char* end = nullptr;
    const long n = std::strtol(v->c_str(), &end, 10);
    if (end == v->c_str() || *end != '\0' || n < 1 || n > 64)
      fail("FAIRGATE_THREADS", fmt::format("\"{}\" not in 1..64", *v));
    cfg.server.threads = static_cast<unsigned>(n);
  }
  if (auto v = getenv("FAIRGATE_LOG_LEVEL")) cfg.server.log.level = log_level_of(*v, "FAIRGATE_LOG_LEVEL");
  if (auto v = getenv("FAIRGATE_LOG_FORMAT"))
    cfg.server.log.format = log_format_of(*v, "FAIRGATE_LOG_FORMAT");

  if (flags.listen) parse_listen(*flags.listen, "--listen", cfg);
  if (flags.redis_url) {
    if (!cfg.redis) cfg.redis.emplace();
    cfg.redis->url = *flags.redis_url;
  }
  if (flags.instance) {
    check_instance(*flags.instance, "--instance");
    cfg.instance = *flags.instance;
  }
  if (flags.admin_token) {
    check_token(*flags.admin_token, "--admin-token");
    cfg.admin_token = *flags.admin_token;
  }
  if (flags.log_level) cfg.server.log.level = log_level_of(*flags.log_level, "--log-level");
  if (flags.log_format) cfg.server.log.format = log_format_of(*flags.log_format, "--log-format");
  if (flags.access_log) {
    if (*flags.access_log != "on" && *flags.access_log != "off")
      fail("--access-log", fmt::format("\"{}\" is not one of on, off", *flags.access_log));
    cfg.server.log.access_log = *flags.access_log == "on";
  }
  for (const auto& l : flags.limiters) {
    check_limiter(l, "--limiter " + l.name);
    set_limiter(cfg, l);
  }

  check_routes(cfg);
  if (cfg.redis) {
    // Generated here, so that the start-up line names it (docs/serve.md).
    cfg.redis->instance_id = cfg.instance.empty() ? default_instance_id() : cfg.instance;
    if (auto e = validate(*cfg.redis)) fail(redis_key_of(e->field), redis_problem_of(*e));
  }
  return cfg;
}

}  // namespace fairgate::serve
