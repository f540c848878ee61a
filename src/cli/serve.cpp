// cli/serve.cpp — `fairgate serve`: flags → ServeFlags, then serve/ does the rest.
//
// The flags are bound to plain strings and read here (durations with a unit,
// the --limiter mini-language), so every bad value becomes a UsageError:
// exit 2 with one line naming the flag and the problem (docs/api.md).
#include "cli/command.hpp"
#include "cli/duration.hpp"
#include "cli/parse.hpp"

#include "core/settings_table.hpp"
#include "redis/database_check.hpp"
#include "redis/url.hpp"
#include "serve/config.hpp"
#include "serve/server.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fairgate::cli {
namespace {

struct ServeArgs {
  std::string config, listen, redis, instance, admin_token, log_level, log_format, access_log;
  std::vector<std::string> limiters;
  CLI::Option* config_opt = nullptr;
  CLI::Option* listen_opt = nullptr;
  CLI::Option* redis_opt = nullptr;
  CLI::Option* instance_opt = nullptr;
  CLI::Option* token_opt = nullptr;
  CLI::Option* log_level_opt = nullptr;
  CLI::Option* log_format_opt = nullptr;
  CLI::Option* access_log_opt = nullptr;
};

std::string limiter_help() {
  return fmt::format("A limiter: {}; repeat for more (replaces a config file limiter of the same name)",
                     core::limiter_flag_synopsis());
}

/// "chat=3,max_wait=20s,max_queue=100,enabled=false" → LimiterConfig. Throws UsageError.
serve::LimiterConfig parse_limiter_spec(const std::string& spec) {
  const auto fail = [&](const std::string& problem) -> serve::LimiterConfig {
    throw UsageError(fmt::format("--limiter {}: {}", cli::quoted(spec), problem));
  };
  const auto eq = spec.find('=');
  if (eq == std::string::npos) return fail("expected NAME=MAX, e.g. chat=3");
  serve::LimiterConfig l;
  l.name = spec.substr(0, eq);
  if (auto e = validate_limiter_name(l.name)) return fail(fmt::format("name: {}", e->problem));
  std::string rest = spec.substr(eq + 1);
  std::vector<std::string> parts;
  for (std::size_t start = 0;;) {
    const auto comma = rest.find(',', start);
    parts.push_back(rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  const auto max = parse_count(parts[0], 1, kMaxConcurrentLimit);
  if (!max) return fail(fmt::format("MAX: {}", max.error));
  l.settings.max_concurrent = static_cast<std::uint32_t>(*max.value);
  std::vector<const core::SettingSpec*> given;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const auto& p = parts[i];
    const auto peq = p.find('=');
    if (peq == std::string::npos) return fail(fmt::format("\"{}\" is not key=value", p));
    const std::string key = p.substr(0, peq);
    const std::string value = p.substr(peq + 1);
    const core::SettingSpec* setting = core::setting_by_name(key);
    if (setting == nullptr || !setting->flag_option())
      return fail(fmt::format(
          "unknown option \"{}\" (use {})", key,
          core::join_settings([](const core::SettingSpec& x) { return x.flag_option(); }, false)));
    // Given twice (or under two names): an error, not "the last one wins".
    if (std::find(given.begin(), given.end(), setting) != given.end())
      return fail(fmt::format("{} is given twice", key));
    given.push_back(setting);
    switch (setting->kind) {
      case core::SettingKind::count:
      case core::SettingKind::optional_count: {
        const auto q = parse_count(value, setting->min, setting->max);
        if (!q) return fail(fmt::format("{}: {}", key, q.error));
        setting->set(l.settings, static_cast<std::int64_t>(*q.value));
        break;
      }
      case core::SettingKind::duration_ms: {
        const auto d = parse_duration(value);
        if (!d) return fail(fmt::format("{}: {}", key, d.error));
        if (d.value->count() > setting->max)
          return fail(fmt::format("{}: {} is longer than {}", key, value,
                                  format_duration(std::chrono::milliseconds(setting->max))));
        if (d.value->count() < setting->min)
          return fail(fmt::format("{}: {} is shorter than {}", key, value,
                                  format_duration(std::chrono::milliseconds(setting->min))));
        setting->set(l.settings, d.value->count());
        break;
      }
      case core::SettingKind::flag:
        if (value != "true" && value != "false")
          return fail(fmt::format("{}: \"{}\" is not true or false", key, value));
        setting->set(l.settings, value == "true" ? 1 : 0);
        break;
      case core::SettingKind::choice: {
        const auto choice = core::parse_choice(*setting, value);
        if (!choice)
          return fail(fmt::format("{}: \"{}\" is not one of {}", key, value, core::join_choices(*setting)));
        setting->set(l.settings, *choice);
        break;
      }
    }
  }
  if (auto e = validate(l.settings)) return fail(e->message());
  return l;
}

serve::ServeFlags to_flags(const ServeArgs& a) {
  serve::ServeFlags f;
  if (a.config_opt->count() > 0) f.config_file = a.config;
  if (a.listen_opt->count() > 0) f.listen = a.listen;
  if (a.redis_opt->count() > 0) f.redis_url = a.redis;
  if (a.instance_opt->count() > 0) f.instance = a.instance;
  if (a.token_opt->count() > 0) f.admin_token = a.admin_token;
  if (a.log_level_opt->count() > 0) f.log_level = a.log_level;
  if (a.log_format_opt->count() > 0) f.log_format = a.log_format;
  if (a.access_log_opt->count() > 0) f.access_log = a.access_log;
  for (const auto& spec : a.limiters) {
    serve::LimiterConfig l = parse_limiter_spec(spec);
    for (const auto& earlier : f.limiters)
      if (earlier.name == l.name)
        throw UsageError(fmt::format("--limiter {}: limiter \"{}\" is given twice (once per name)",
                                     cli::quoted(spec), l.name));
    f.limiters.push_back(std::move(l));
  }
  return f;
}

/// redis://[USER:PASSWORD@]HOST:PORT/DB: a refused password, a missing one, or
/// a database the server does not have (/99 on a server with 16) is an error
/// at start, with the server's reason; the connection would otherwise retry
/// for ever. So is a user the ACL does not let do what fairgate does
/// (docs/redis-acl.md), or, over TLS, a certificate the CA does not vouch for.
/// A server, every master of a Cluster (its seeds only over TLS), or the
/// master the sentinels name (not over TLS). An unreachable server is no
/// error here: serve starts degraded, as ever (docs/serve.md).
void check_redis_at_start(const serve::ServeConfig& config) {
  if (!config.redis) return;
  const auto parsed = redis::parse_target(config.redis->url);
  const auto* target = std::get_if<redis::Target>(&parsed);
  if (target == nullptr || target->nodes.empty()) return;
  // Beyond the login: may this user load the scripts, call them on each
  // limiter's and rule's keys and hear its wake channel (docs/redis-acl.md)?
  std::vector<std::string> limiters, rules;
  for (const auto& limiter : config.limiters) limiters.push_back(limiter.name);
  for (const auto& rule : config.rate_rules) rules.push_back(rule.name);
  const auto probe = redis::start_probe(config.redis->key_prefix, limiters, rules);
  constexpr std::chrono::seconds kWithin(2);
  std::optional<std::string> problem;
  switch (target->kind) {
    case redis::Target::Kind::standalone:
      problem = redis::start_problem(target->nodes.front(), kWithin, probe);
      break;
    case redis::Target::Kind::cluster:
      problem = redis::cluster_start_problem(target->nodes, kWithin, probe);
      break;
    case redis::Target::Kind::sentinel:
      // The master the sentinels name now (none answering: serve starts and keeps asking).
      if (const auto master = redis::sentinel_master(*target, kWithin))
        problem = redis::start_problem(*master, kWithin, probe);
      break;
  }
  if (problem) throw std::runtime_error(*problem);
}

}  // namespace

Command add_serve_command(CLI::App& root) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* app = root.add_subcommand("serve", "The HTTP admission API: hold an SSE stream = hold a permit");
  app->footer(fmt::format(
      "--limiter {}:\n{}"
      "Durations: 500ms, 20s, 5m, 1h.\n\n"
      "Precedence: flags > environment > config file > defaults.\n"
      "Environment: {}.\n"
      "Config file: TOML, see docs/serve.md (listen, admin_token, instance, [redis], "
      "[limiters.NAME], [server]).\n"
      "Logs go to stdout (timestamps in UTC); the library's messages are prefixed \"fairgate: \".\n"
      "Without --redis and without [redis] the memory backend serves one instance.\n"
      "SIGTERM/SIGINT: stop accepting, end waiters, release permits, exit 0.",
      core::limiter_flag_synopsis(), core::limiter_options_help(), serve::kEnvHelp));
  args->config_opt = app->add_option("-c,--config", args->config, "TOML config file")->type_name("FILE");
  args->listen_opt = app->add_option("--listen", args->listen, "Address to listen on (port 0: any free port)")
                         ->type_name("HOST:PORT")
                         ->default_str("127.0.0.1:8080");
  args->redis_opt = app->add_option("--redis", args->redis,
                                    "Share limiters through Redis: redis://[user:pass@]HOST:PORT[/DB], "
                                    "redis+cluster://HOST:PORT,..., "
                                    "redis+sentinel://HOST:PORT,.../MASTER[/DB][?sentinel_password=PW]; "
                                    "rediss... for TLS (docs/redis-cluster.md)")
                        ->type_name("URL");
  args->instance_opt = app->add_option("--instance", args->instance,
                                       "This instance's id, [A-Za-z0-9._-]{1,128} (default: generated)")
                           ->type_name("ID");
  args->token_opt =
      app->add_option("--admin-token", args->admin_token,
                      "Bearer token for PUT /v1/limiters/NAME (without one, admin routes answer 401)")
          ->type_name("TOKEN");
  args->log_level_opt =
      app->add_option("--log-level", args->log_level,
                      "Log messages at this level and above: trace, debug, info, warn, error, off")
          ->type_name("LEVEL")
          ->default_str("info");
  args->log_format_opt =
      app->add_option("--log-format", args->log_format,
                      "Log lines as text, or as json (one object per line: time, level, msg, ...)")
          ->type_name("FORMAT")
          ->default_str("text");
  args->access_log_opt =
      app->add_option("--access-log", args->access_log,
                      "One info line per HTTP request (method, path, status, duration, limiter outcome)")
          ->type_name("on|off")
          ->default_str("off");
  app->add_option("--limiter", args->limiters, limiter_help())
      ->type_name("SPEC")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);

  return Command{app, [args]() {
                   serve::ServeConfig config;
                   try {
                     const serve::ServeFlags flags = to_flags(*args);
                     config = serve::load_config(flags, [](const char* name) { return std::getenv(name); });
                   } catch (const serve::ConfigError& e) {
                     throw UsageError(e.what());
                   }
                   check_redis_at_start(config);
                   try {
                     return serve::run_server(config, stdout);
                   } catch (const serve::ConfigError& e) {
                     throw UsageError(e.what());
                   }
                 }};
}

}  // namespace fairgate::cli
