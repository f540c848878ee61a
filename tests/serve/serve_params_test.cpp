// tests/serve/serve_params_test.cpp — the strict reading of requests (S7) and
// the config loader, without a network.
#include "gateway/gateway.hpp"
#include "serve/config.hpp"
#include "serve/cors.hpp"
#include "serve/params.hpp"
#include "serve/ratelimit.hpp"
#include "serve/routes.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>

namespace fairgate::serve {
namespace {

using std::chrono::milliseconds;

Target target(std::string_view t) {
  BadRequest bad;
  auto r = parse_target(t, bad);
  EXPECT_TRUE(r.has_value()) << t << ": " << bad.message;
  return r.value_or(Target{});
}

std::string target_error(std::string_view t) {
  BadRequest bad;
  EXPECT_FALSE(parse_target(t, bad).has_value()) << t;
  return bad.message;
}

TEST(ServeParams, TargetSplitsAndDecodes) {
  EXPECT_EQ(target("/").segments.size(), 0u);
  const auto t = target("/v1/limiters/chat%2Dx/acquire?max_wait_ms=5&tenant=a%40b+c");
  EXPECT_EQ(t.segments, (std::vector<std::string>{"v1", "limiters", "chat-x", "acquire"}));
  ASSERT_EQ(t.query.size(), 2u);
  EXPECT_EQ(t.query[1].second, "a@b c");
}

TEST(ServeParams, TargetRejectsHostileShapes) {
  EXPECT_FALSE(target_error("v1/limiters").empty());
  EXPECT_FALSE(target_error("/v1/../etc").empty());
  EXPECT_FALSE(target_error("/v1//limiters").empty());
  EXPECT_FALSE(target_error("/v1/limiters/a%2Fb").empty());
  EXPECT_FALSE(target_error("/v1/%zz").empty());
  EXPECT_FALSE(target_error("/v1/%0").empty());
  EXPECT_FALSE(target_error("/v1/%00x").empty());
  EXPECT_FALSE(target_error("/v1?a=%0a").empty());
  std::string many = "/x?";
  for (int i = 0; i < 40; ++i) many += "a=1&";
  EXPECT_FALSE(target_error(many).empty());
}

std::optional<AcquireParams> acquire(std::string_view t, std::string_view body,
                                     std::string* error = nullptr) {
  BadRequest bad;
  auto r = parse_acquire_params(target(t), body, milliseconds(3'600'000), bad);
  if (error) *error = bad.message;
  return r;
}

TEST(ServeParams, AcquireParamsFromQueryAndBody) {
  auto p = acquire("/a?max_wait_ms=250&tenant=user-42", "");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->max_wait, milliseconds(250));
  EXPECT_EQ(p->tenant, "user-42");
  p = acquire("/a?max_wait_ms=250", R"({"max_wait_ms":900,"tenant":"t","weight":2,"lease_ms":5000})");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->max_wait, milliseconds(900));  // the body wins
  EXPECT_EQ(p->weight, 2u);
  EXPECT_EQ(p->lease, milliseconds(5000));
  p = acquire("/a", R"({"max_wait_ms":null})");
  ASSERT_TRUE(p);
  EXPECT_FALSE(p->max_wait);
  // The one tenant rule: printable ASCII without spaces, 1..128.
  p = acquire("/a?tenant=org%2Facme%2B1", "");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->tenant, "org/acme+1");
  p = acquire("/a", R"({"tenant":"user@example.com|\"x\""})");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->tenant, "user@example.com|\"x\"");
  EXPECT_TRUE(acquire("/a?tenant=" + std::string(128, 't'), ""));
  std::string e;
  EXPECT_FALSE(acquire("/a?tenant=" + std::string(129, 't'), "", &e));
  EXPECT_EQ(e, "tenant: must be 1..128 printable ASCII characters without spaces");
  EXPECT_FALSE(acquire("/a", R"({"tenant":"caf\u00e9"})", &e));
  EXPECT_FALSE(acquire("/a", R"({"tenant":"tab\there"})", &e));
}

TEST(ServeParams, AcquireParamsRejectWhatTheyDoNotUnderstand) {
  std::string e;
  EXPECT_FALSE(acquire("/a?max_wait_ms=-1", "", &e));
  EXPECT_NE(e.find("max_wait_ms: -1 not in 0..86400000"), std::string::npos) << e;
  EXPECT_FALSE(acquire("/a?max_wait_ms=1e3", "", &e));
  EXPECT_FALSE(acquire("/a?max_wait_ms=", "", &e));
  EXPECT_FALSE(acquire("/a?max_wait_ms=99999999999999999999999", "", &e));
  EXPECT_FALSE(acquire("/a?maxwait=1", "", &e));
  EXPECT_NE(e.find("unknown parameter \"maxwait\""), std::string::npos) << e;
  EXPECT_FALSE(acquire("/a?tenant=", "", &e));
  EXPECT_FALSE(acquire("/a?tenant=a%20b", "", &e));
  EXPECT_FALSE(acquire("/a?lease_ms=10", "", &e));
  EXPECT_FALSE(acquire("/a?weight=0", "", &e));
  EXPECT_FALSE(acquire("/a", "{", &e));
  EXPECT_FALSE(acquire("/a", "[]", &e));
  EXPECT_FALSE(acquire("/a", R"({"max_wait_ms":"5"})", &e));
  EXPECT_FALSE(acquire("/a", R"({"max_wait_ms":1.5})", &e));
  EXPECT_FALSE(acquire("/a", R"({"tenant":5})", &e));
  EXPECT_FALSE(acquire("/a", R"({"x":1})", &e));
  EXPECT_FALSE(acquire("/a", std::string(100, '['), &e));
  // Given twice: which one was meant is not known (the last used to win silently).
  EXPECT_FALSE(acquire("/a?max_wait_ms=100&max_wait_ms=1500", "", &e));
  EXPECT_EQ(e, "max_wait_ms: given more than once in the query string");
  EXPECT_FALSE(acquire("/a?tenant=a&weight=2&tenant=b", "", &e));
  EXPECT_EQ(e, "tenant: given more than once in the query string");
  BadRequest bad;
  EXPECT_FALSE(parse_status_query(target("/l?limit=1&offset=0&limit=2"), bad));
  EXPECT_EQ(bad.message, "limit: given more than once in the query string");
  EXPECT_TRUE(parse_status_query(target("/l?limit=1&offset=0"), bad));
}

std::optional<RenewParams> renew(std::string_view t, std::string_view body, std::string* error = nullptr) {
  BadRequest bad;
  auto r = parse_renew_params(target(t), body, milliseconds(600'000), bad);
  if (error) *error = bad.message;
  return r;
}

// lease_ms of a renew is read as acquire reads it (the same bounds and words).
TEST(ServeParams, RenewParamsAreLeaseMsReadLikeAcquire) {
  auto p = renew("/r", "");
  ASSERT_TRUE(p);
  EXPECT_FALSE(p->lease) << "absent: the permit's current lease length";
  p = renew("/r?lease_ms=5000", "");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->lease, milliseconds(5000));
  p = renew("/r?lease_ms=5000", R"({"lease_ms":700})");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->lease, milliseconds(700)) << "the body wins";
  p = renew("/r", R"({"lease_ms":null})");
  ASSERT_TRUE(p);
  EXPECT_FALSE(p->lease);
  std::string e;
  EXPECT_FALSE(renew("/r?lease_ms=abc", "", &e));
  EXPECT_EQ(e, "lease_ms: \"abc\" is not a whole number");
  EXPECT_FALSE(renew("/r?lease_ms=99", "", &e));
  EXPECT_EQ(e, "lease_ms: 99 not in 100..600000");
  EXPECT_FALSE(renew("/r", R"({"lease_ms":600001})", &e));
  EXPECT_EQ(e, "lease_ms: 600001 not in 100..600000");
  BadRequest bad;
  EXPECT_FALSE(parse_acquire_params(target("/a?lease_ms=99"), "", milliseconds(600'000), bad));
  EXPECT_EQ(bad.message, "lease_ms: 99 not in 100..600000") << "the same words as acquire";
  EXPECT_FALSE(renew("/r", R"({"lease_ms":"5000"})", &e));
  EXPECT_EQ(e, "lease_ms: must be a whole number");
  EXPECT_FALSE(renew("/r?max_wait_ms=5", "", &e));
  EXPECT_EQ(e, "unknown parameter \"max_wait_ms\" (use lease_ms)");
  EXPECT_FALSE(renew("/r", R"({"tenant":"x"})", &e));
  EXPECT_EQ(e, "unknown parameter \"tenant\" (use lease_ms)");
  EXPECT_FALSE(renew("/r", "{", &e));
  EXPECT_FALSE(renew("/r", "[]", &e));
}

TEST(ServeParams, SettingsUpdateIsPartialAndStrict) {
  BadRequest bad;
  auto u = parse_settings_update(R"({"max_concurrent":5,"max_queue":null,"enabled":false})", bad);
  ASSERT_TRUE(u) << bad.message;
  EXPECT_EQ(u->max_concurrent, 5u);
  ASSERT_TRUE(u->max_queue.has_value());
  EXPECT_FALSE(u->max_queue->has_value());
  EXPECT_EQ(u->enabled, false);
  EXPECT_FALSE(u->max_wait);
  EXPECT_FALSE(parse_settings_update("", bad));
  EXPECT_FALSE(parse_settings_update(R"({"max_concurrent":0})", bad));
  EXPECT_FALSE(parse_settings_update(R"({"max_concurrent":-3})", bad));
  EXPECT_FALSE(parse_settings_update(R"({"enabled":"yes"})", bad));
  EXPECT_FALSE(parse_settings_update(R"({"max_concurency":3})", bad));
  EXPECT_NE(bad.message.find("unknown field"), std::string::npos);
}

TEST(ServeParams, SettingsUpdateTenantFairness) {
  BadRequest bad;
  auto u = parse_settings_update(R"({"tenant_fairness":true,"max_per_tenant":2})", bad);
  ASSERT_TRUE(u) << bad.message;
  EXPECT_EQ(u->tenant_fairness, true);
  ASSERT_TRUE(u->max_per_tenant.has_value());
  EXPECT_EQ(u->max_per_tenant->value_or(0), 2u);
  u = parse_settings_update(R"({"max_per_tenant":null})", bad);
  ASSERT_TRUE(u) << bad.message;
  ASSERT_TRUE(u->max_per_tenant.has_value());
  EXPECT_FALSE(u->max_per_tenant->has_value());
  EXPECT_FALSE(u->tenant_fairness);
  EXPECT_FALSE(parse_settings_update(R"({"max_per_tenant":0})", bad));
  EXPECT_NE(bad.message.find("max_per_tenant"), std::string::npos);
  EXPECT_FALSE(parse_settings_update(R"({"tenant_fairness":"yes"})", bad));
  EXPECT_NE(bad.message.find("tenant_fairness"), std::string::npos);
}

// The token matches exactly; the scheme's case does not matter (RFC 9110, 11.1).
TEST(ServeParams, BearerTokenMustMatchExactly) {
  EXPECT_TRUE(bearer_matches("Bearer s3cret", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer s3cre", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer s3cretX", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer S3cret", "s3cret"));
  EXPECT_TRUE(bearer_matches("bearer s3cret", "s3cret"));
  EXPECT_TRUE(bearer_matches("BEARER s3cret", "s3cret"));
  EXPECT_FALSE(bearer_matches("Basic_ s3cret", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer-s3cret", "s3cret"));
  EXPECT_FALSE(bearer_matches("", ""));
  EXPECT_FALSE(bearer_matches("Bearer ", ""));  // no token configured: admin is off
}

// Whether an acquire is an event stream: the media type in any case, not with q=0.
TEST(ServeParams, AcceptAsksForAnEventStreamInAnyCaseUnlessRefused) {
  EXPECT_TRUE(accepts_event_stream("text/event-stream"));
  EXPECT_TRUE(accepts_event_stream("Text/Event-Stream"));
  EXPECT_TRUE(accepts_event_stream("application/json, text/event-stream;q=0.5"));
  EXPECT_TRUE(accepts_event_stream(" text/event-stream ; charset=utf-8"));
  EXPECT_TRUE(accepts_event_stream("text/event-stream;q=0.001"));
  EXPECT_FALSE(accepts_event_stream("application/json, text/event-stream;q=0"));
  EXPECT_FALSE(accepts_event_stream("text/event-stream; Q=0.000"));
  EXPECT_FALSE(accepts_event_stream("*/*"));
  EXPECT_FALSE(accepts_event_stream("text/*"));
  EXPECT_FALSE(accepts_event_stream("text/event-streams"));
  EXPECT_FALSE(accepts_event_stream("application/json"));
  EXPECT_FALSE(accepts_event_stream(""));
}

TEST(ServeConfig, PrecedenceFlagsOverEnvironmentOverDefaults) {
  std::map<std::string, std::string> env{{"FAIRGATE_LISTEN", "0.0.0.0:9000"},
                                         {"FAIRGATE_ADMIN_TOKEN", "from-env"},
                                         {"FAIRGATE_REDIS", "redis://127.0.0.1:6380"}};
  const EnvLookup lookup = [&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  ServeFlags flags;
  flags.listen = "127.0.0.1:0";
  LimiterConfig l;
  l.name = "chat";
  l.settings.max_concurrent = 3;
  flags.limiters.push_back(l);
  const auto cfg = load_config(flags, lookup);
  EXPECT_EQ(cfg.listen_host, "127.0.0.1");
  EXPECT_EQ(cfg.listen_port, 0);
  EXPECT_EQ(cfg.admin_token, "from-env");
  ASSERT_TRUE(cfg.redis);
  EXPECT_EQ(cfg.redis->url, "redis://127.0.0.1:6380");
  ASSERT_EQ(cfg.limiters.size(), 1u);
  EXPECT_EQ(cfg.limiters[0].settings.max_concurrent, 3u);

  const auto plain = load_config(ServeFlags{}, [](const char*) -> const char* { return nullptr; });
  EXPECT_FALSE(plain.redis);  // no Redis anywhere: the memory backend
  EXPECT_EQ(plain.listen_port, 8080);
}

TEST(ServeConfig, BadEnvironmentNamesTheVariable) {
  const EnvLookup lookup = [](const char* name) -> const char* {
    return std::string_view(name) == "FAIRGATE_THREADS" ? "lots" : nullptr;
  };
  try {
    load_config(ServeFlags{}, lookup);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "FAIRGATE_THREADS: \"lots\" not in 1..64");
  }
}

TEST(ServeConfig, ListenForms) {
  ServeConfig c;
  parse_listen("[::1]:80", "x", c);
  EXPECT_EQ(c.listen_host, "::1");
  parse_listen(":8081", "x", c);
  EXPECT_EQ(c.listen_host, "127.0.0.1") << "a bare port is loopback";
  EXPECT_EQ(c.listen_port, 8081);
  parse_listen("*:8082", "x", c);
  EXPECT_EQ(c.listen_host, "0.0.0.0") << "every interface when asked";
  parse_listen("0.0.0.0:8083", "x", c);
  EXPECT_EQ(c.listen_host, "0.0.0.0");
  parse_listen("localhost:0", "x", c);
  EXPECT_EQ(c.listen_host, "127.0.0.1");
  EXPECT_THROW(parse_listen("example.com:80", "x", c), ConfigError);
  EXPECT_THROW(parse_listen("127.0.0.1:", "x", c), ConfigError);
  EXPECT_THROW(parse_listen("127.0.0.1:-1", "x", c), ConfigError);
}

// --- routes and browser access ---------------------------------------------------

TEST(ServeRoutes, TheTableMatchesWholePathsAndNamesParameters) {
  std::vector<std::string> params;
  const auto* r = match_route({"v1", "limiters", "chat", "acquire"}, params);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->id, RouteId::acquire);
  EXPECT_EQ(params, (std::vector<std::string>{"chat"}));
  r = match_route({"v1", "permits", "lp-7", "renew"}, params);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->id, RouteId::renew);
  EXPECT_EQ(params, (std::vector<std::string>{"lp-7"}));
  r = match_route({"openapi.json"}, params);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->id, RouteId::openapi_json);
  EXPECT_TRUE(params.empty());
  // A literal segment is never taken for a parameter, and lengths must match.
  EXPECT_EQ(match_route({}, params), nullptr);
  EXPECT_EQ(match_route({"v1", "limiters", "chat", "acquire", "x"}, params), nullptr);
  EXPECT_EQ(match_route({"v1", "limiters", "chat", "release"}, params), nullptr);
  EXPECT_EQ(match_route({"v1", "chat", "completions"}, params), nullptr);
  EXPECT_TRUE(params.empty());
  // Every pattern is matched by itself (each row is reachable, none shadows another).
  for (const auto& route : kRoutes) {
    std::vector<std::string> segments;
    std::string_view rest = route.pattern.substr(1);
    while (!rest.empty()) {
      const auto slash = rest.find('/');
      segments.emplace_back(rest.substr(0, slash));
      rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
    }
    EXPECT_EQ(match_route(segments, params), &route) << route.pattern;
  }
}

TEST(ServeRoutes, MethodsAreWholeNames) {
  const auto& acquire = *std::find_if(kRoutes.begin(), kRoutes.end(),
                                      [](const RouteSpec& r) { return r.id == RouteId::acquire; });
  EXPECT_TRUE(route_allows(acquire, "GET"));
  EXPECT_TRUE(route_allows(acquire, "POST"));
  EXPECT_FALSE(route_allows(acquire, "PUT"));
  EXPECT_FALSE(route_allows(acquire, "OPTIONS"));
  EXPECT_FALSE(route_allows(acquire, "GE"));
  EXPECT_FALSE(route_allows(acquire, "POS"));
}

std::string origin_of(std::string_view text) {
  std::string problem;
  auto o = normalize_origin(text, problem);
  EXPECT_TRUE(o.has_value()) << text << ": " << problem;
  return o.value_or("");
}

std::string origin_problem(std::string_view text) {
  std::string problem;
  EXPECT_FALSE(normalize_origin(text, problem).has_value()) << text;
  return problem;
}

TEST(ServeCors, OriginsAreNormalizedAsBrowsersSendThem) {
  EXPECT_EQ(origin_of("https://App.Example.com"), "https://app.example.com");
  EXPECT_EQ(origin_of("HTTPS://app.example.com:443"), "https://app.example.com");
  EXPECT_EQ(origin_of("http://127.0.0.1:80"), "http://127.0.0.1");
  EXPECT_EQ(origin_of("http://127.0.0.1:8000"), "http://127.0.0.1:8000");
  EXPECT_EQ(origin_of("https://app.example.com:80"), "https://app.example.com:80");
  EXPECT_EQ(origin_of("http://[::1]:3000"), "http://[::1]:3000");
  EXPECT_NE(origin_problem("app.example.com").find("http://HOST"), std::string::npos);
  EXPECT_NE(origin_problem("ftp://x").find("http://HOST"), std::string::npos);
  EXPECT_NE(origin_problem("https://app.example.com/").find("no path"), std::string::npos);
  EXPECT_NE(origin_problem("https://app.example.com/x").find("no path"), std::string::npos);
  EXPECT_NE(origin_problem("https://*.example.com").find("wildcards"), std::string::npos);
  EXPECT_NE(origin_problem("https://u@example.com").find("user info"), std::string::npos);
  EXPECT_NE(origin_problem("https://example.com:0").find("port"), std::string::npos);
  EXPECT_NE(origin_problem("https://example.com:99999").find("port"), std::string::npos);
  EXPECT_NE(origin_problem("https://example.com:8x").find("port"), std::string::npos);
  EXPECT_NE(origin_problem("https://").find("no host"), std::string::npos);
  EXPECT_NE(origin_problem("null").find("\"*\""), std::string::npos);
  // A colon belongs to the port, or inside an [IPv6] literal (found by tests/fuzz/fuzz_values).
  EXPECT_NE(origin_problem("https://app.s:example.com:443").find("[IPv6]"), std::string::npos);
  EXPECT_NE(origin_problem("http://::1").find("[IPv6]"), std::string::npos);
  EXPECT_NE(origin_problem("http://[::1]x:8080").find("[IPv6]"), std::string::npos);
  EXPECT_NE(origin_problem("http://a]b").find("[IPv6]"), std::string::npos);
  EXPECT_EQ(origin_of("http://[::1]"), "http://[::1]");
}

TEST(ServeCors, OnlyListedOriginsAreAllowed) {
  const std::vector<std::string> listed{"https://app.example.com", "http://127.0.0.1:8000"};
  EXPECT_EQ(judge_origin("", listed), OriginVerdict::none);
  EXPECT_EQ(judge_origin("", {}), OriginVerdict::none);
  EXPECT_EQ(judge_origin("https://app.example.com", listed), OriginVerdict::allowed);
  EXPECT_EQ(judge_origin("https://app.example.com:443", listed), OriginVerdict::allowed);
  EXPECT_EQ(judge_origin("http://127.0.0.1:8000", listed), OriginVerdict::allowed);
  EXPECT_EQ(judge_origin("http://127.0.0.1:8001", listed), OriginVerdict::refused);
  EXPECT_EQ(judge_origin("http://app.example.com", listed), OriginVerdict::refused);  // scheme matters
  EXPECT_EQ(judge_origin("https://app.example.com.evil.test", listed), OriginVerdict::refused);
  EXPECT_EQ(judge_origin("null", listed), OriginVerdict::refused);
  EXPECT_EQ(judge_origin("https://app.example.com", {}), OriginVerdict::refused);  // off: no page is allowed
  EXPECT_EQ(judge_origin("https://anything.test", {"*"}), OriginVerdict::allowed);
  EXPECT_EQ(judge_origin("null", {"*"}), OriginVerdict::allowed);
}

/// load_config() of a config file with `text`; the ConfigError's message, or "" when it loaded.
std::string config_error(const std::string& text, ServeConfig* out = nullptr) {
  char path[] = "/tmp/fairgate-params-test-XXXXXX.toml";
  const int fd = ::mkstemps(path, 5);
  if (fd < 0) return "mkstemps failed";
  ::close(fd);
  std::ofstream(path) << text;
  ServeFlags flags;
  flags.config_file = path;
  std::string message;
  try {
    auto cfg = load_config(flags, [](const char*) -> const char* { return nullptr; });
    if (out != nullptr) *out = cfg;
  } catch (const ConfigError& e) {
    message = e.what();
  }
  std::remove(path);
  return message;
}

TEST(ServeConfig, CorsOrigins) {
  ServeConfig cfg;
  EXPECT_EQ(config_error("", &cfg), "");
  EXPECT_TRUE(cfg.server.cors_origins.empty());  // off by default
  EXPECT_EQ(
      config_error("[server]\ncors_origins = [\"https://App.example.com:443\", \"http://127.0.0.1:8000\", "
                   "\"https://app.example.com\"]\n",
                   &cfg),
      "");
  EXPECT_EQ(cfg.server.cors_origins,
            (std::vector<std::string>{"https://app.example.com", "http://127.0.0.1:8000"}));
  EXPECT_EQ(config_error("[server]\ncors_origins = [\"*\"]\n", &cfg), "");
  EXPECT_EQ(cfg.server.cors_origins, (std::vector<std::string>{"*"}));
  EXPECT_EQ(config_error("[server]\ncors_origins = []\n", &cfg), "");
  EXPECT_TRUE(cfg.server.cors_origins.empty());

  EXPECT_EQ(
      config_error("[server]\ncors_origins = \"https://app.example.com\"\n"),
      "server.cors_origins: expected an array of origins (e.g. [\"https://app.example.com\"]), got a string");
  EXPECT_EQ(config_error("[server]\ncors_origins = [\"*\", \"https://a.test\"]\n"),
            "server.cors_origins[0]: \"*\" allows every origin: list it alone");
  EXPECT_EQ(config_error("[server]\ncors_origins = [\"https://a.test\", 3]\n"),
            "server.cors_origins[1]: expected a string, got an integer");
  EXPECT_EQ(config_error("[server]\ncors_origins = [\"https://a.test/app\"]\n"),
            "server.cors_origins[0]: \"https://a.test/app\": an origin has no path, not even \"/\" (e.g. "
            "\"https://app.example.com\")");
  EXPECT_EQ(
      config_error("[server]\ncors_origins = [\"https://*.a.test\"]\n"),
      "server.cors_origins[0]: \"https://*.a.test\": wildcards are not supported (list exact origins, or "
      "\"*\" alone for any)");
  EXPECT_EQ(
      config_error("[server]\ncors_origins = [\"a.test\"]\n"),
      "server.cors_origins[0]: \"a.test\": an origin is http://HOST[:PORT] or https://HOST[:PORT] (or \"*\" "
      "alone for any)");
}

// --- gateway ------------------------------------------------------------------

RouteConfig route_for(std::string_view path, std::string_view upstream) {
  RouteConfig r;
  r.path = std::string(path);
  parse_upstream(upstream, "upstream", r);
  r.limiter = "chat";
  return r;
}

TEST(GatewayRules, UpstreamUrlForms) {
  const auto plain = route_for("/v1", "http://127.0.0.1:9000");
  EXPECT_EQ(plain.upstream_host, "127.0.0.1");
  EXPECT_EQ(plain.upstream_port, 9000);
  EXPECT_FALSE(plain.upstream_has_path);
  const auto named = route_for("/v1", "http://model.internal/openai/");
  EXPECT_EQ(named.upstream_host, "model.internal");
  EXPECT_EQ(named.upstream_port, 80);
  EXPECT_TRUE(named.upstream_has_path);
  EXPECT_EQ(named.upstream_base, "/openai");
  const auto v6 = route_for("/v1", "http://[::1]:8000");
  EXPECT_EQ(v6.upstream_host, "::1");
  EXPECT_EQ(v6.upstream_port, 8000);
  const auto v6_default = route_for("/v1", "http://[::1]");
  EXPECT_EQ(v6_default.upstream_port, 80);
  const auto tls = route_for("/v1", "https://api.openai.com");
  EXPECT_TRUE(tls.upstream_tls);
  EXPECT_EQ(tls.upstream_host, "api.openai.com");
  EXPECT_EQ(tls.upstream_port, 443) << "https:// defaults to 443";
  EXPECT_FALSE(plain.upstream_tls);
  const auto tls_port = route_for("/v1", "https://model.internal:8443/openai");
  EXPECT_EQ(tls_port.upstream_port, 8443);
  EXPECT_EQ(tls_port.upstream_base, "/openai");
  for (const char* bad : {"ftp://x", "http://", "https://", "http://:9000", "http://h:0", "https://h:0",
                          "http://h:99999", "http://h:x", "http://u:p@h", "https://u:p@h", "http://h/a?b",
                          "http://h o", "HTTPS://h", "https:/h"}) {
    RouteConfig r;
    EXPECT_THROW(parse_upstream(bad, "upstream", r), ConfigError) << bad;
  }
}

TEST(GatewayRules, LongestPrefixOnSegmentBoundaries) {
  Gateway gw({route_for("/v1/chat", "http://127.0.0.1:1"),
              route_for("/v1/chat/completions", "http://127.0.0.1:2"),
              route_for("/raw", "http://127.0.0.1:3/")});
  const auto port_of = [&](std::string_view path) -> int {
    const auto* r = gw.match(path);
    return r == nullptr ? 0 : r->config.upstream_port;
  };
  EXPECT_EQ(port_of("/v1/chat/completions"), 2);
  EXPECT_EQ(port_of("/v1/chat/completions/x"), 2);
  EXPECT_EQ(port_of("/v1/chat"), 1);
  EXPECT_EQ(port_of("/v1/chat/other"), 1);
  EXPECT_EQ(port_of("/v1/chats"), 0);
  EXPECT_EQ(port_of("/v1"), 0);
  EXPECT_EQ(port_of("/rawness"), 0);
  EXPECT_EQ(port_of("/raw/v1/models"), 3);
  EXPECT_EQ(target_path("/raw/v1/models?x=/raw"), "/raw/v1/models");
}

TEST(GatewayRules, HopByHopHeadersAreNotForwarded) {
  for (const char* h : {"Connection", "keep-alive", "Proxy-Authorization", "TE", "Trailer",
                        "Transfer-Encoding", "Upgrade", "proxy-connection"})
    EXPECT_TRUE(is_hop_by_hop(h, "")) << h;
  for (const char* h : {"Content-Type", "Authorization", "Content-Length", "X-Request-Id", "Accept"})
    EXPECT_FALSE(is_hop_by_hop(h, "")) << h;
  // Whatever Connection lists is hop-by-hop too, case-insensitively, with spaces.
  EXPECT_TRUE(is_hop_by_hop("X-Secret", "keep-alive, x-secret"));
  EXPECT_TRUE(is_hop_by_hop("x-other", "X-Secret ,\tX-Other"));
  EXPECT_FALSE(is_hop_by_hop("X-Secret2", "keep-alive, x-secret"));
}

TEST(GatewayRules, StreamingIsReadFromTheJsonBody) {
  EXPECT_TRUE(wants_stream(R"({"model":"m","stream":true})"));
  EXPECT_FALSE(wants_stream(R"({"model":"m","stream":false})"));
  EXPECT_FALSE(wants_stream(R"({"model":"m"})"));
  EXPECT_FALSE(wants_stream(R"({"stream":"true"})"));
  EXPECT_FALSE(wants_stream(R"([{"stream":true}])"));
  EXPECT_FALSE(wants_stream("not json"));
  EXPECT_FALSE(wants_stream(""));
}

TEST(GatewayRules, OpenAiErrorShape) {
  const auto e = openai_error("busy \"now\"", "rate_limit_error", "queue_timeout");
  EXPECT_EQ(
      e,
      R"({"error":{"message":"busy \"now\"","type":"rate_limit_error","param":null,"code":"queue_timeout"}})");
}

// A gateway timeout names the max wait the request was given, not the time
// the limiter measured (which runs a little over).
TEST(GatewayRules, ATimeoutNamesTheMaxWaitGivenNotTheTimeMeasured) {
  const auto timeout = AcquireResult::ended(RejectReason::timeout, "no permit", milliseconds(251));
  EXPECT_EQ(rejection_message(timeout, milliseconds(250)),
            "no capacity within 250 ms; The system is busy, please try again later");
  const auto full =
      AcquireResult::ended(RejectReason::queue_full, "queue is full (3 waiting)", milliseconds(0));
  EXPECT_EQ(rejection_message(full, milliseconds(250)), "queue is full (3 waiting)");
}

// --- rate limits (docs/ratelimit.md, "In fairgate serve") ---------------------------

TEST(RateParams, CheckBodiesAreStrict) {
  BadRequest bad;
  auto ok = parse_rate_check(R"({"key":"u1","cost":7})", bad);
  ASSERT_TRUE(ok) << bad.message;
  EXPECT_EQ(ok->key, "u1");
  EXPECT_EQ(ok->cost, 7);
  EXPECT_EQ(parse_rate_check(R"({"key":"u1"})", bad)->cost, 1);
  EXPECT_EQ(parse_rate_check(R"({"key":"u1","cost":3.0})", bad)->cost,
            3);  // a whole number written as a float
  for (const char* body :
       {R"({"key":"u1","cost":-1})", R"({"key":"u1","cost":0})", R"({"key":"u1","cost":2.5})",
        R"({"key":"u1","cost":"1"})", R"({"key":"u1","cost":null})", R"({"key":"u1","cost":1e300})",
        R"({"key":"u1","cost":1000000000001})", R"({"key":"u1","cost":18446744073709551615})"}) {
    bad = {};
    EXPECT_FALSE(parse_rate_check(body, bad)) << body;
    EXPECT_EQ(bad.message.rfind("cost: ", 0), 0u) << body << ": " << bad.message;
  }
  for (const char* body : {"", "[]", "{", R"({"cost":1})", R"({"key":""})", R"({"key":"ab"})",
                           R"({"key":5})", R"({"key":"u","extra":1})"}) {
    bad = {};
    EXPECT_FALSE(parse_rate_check(body, bad)) << body;
    EXPECT_FALSE(bad.message.empty()) << body;
  }
  EXPECT_FALSE(parse_rate_check(R"({"key":")" + std::string(513, 'k') + R"("})", bad));
  EXPECT_TRUE(parse_rate_check(R"({"key":")" + std::string(512, 'k') + R"("})", bad));
}

TEST(RateParams, RefundNamesItsDecision) {
  BadRequest bad;
  const std::string id = decision_id(1733150000123, 1733150000123456, 40);
  auto r = parse_rate_refund(R"({"key":"k","decision":")" + id + R"(","amount":12})", bad);
  ASSERT_TRUE(r) << bad.message;
  EXPECT_EQ(r->at_ms, 1733150000123);
  EXPECT_EQ(r->at_us, 1733150000123456);
  EXPECT_EQ(r->cost, 40);
  EXPECT_EQ(r->amount, 12);
  for (const char* d : {"x", "1.2", "1.2.3.4", "1..3", "-1.2.3", "1.2.0", ""}) {
    bad = {};
    EXPECT_FALSE(parse_rate_refund(std::string(R"({"key":"k","amount":1,"decision":")") + d + R"("})", bad))
        << d;
  }
  EXPECT_FALSE(parse_rate_refund(R"({"key":"k","decision":"1.2.3"})", bad));
  EXPECT_NE(bad.message.find("amount"), std::string::npos) << bad.message;
}

TEST(RateParams, RuleUpdatesApplyOverTheCurrentRule) {
  RateRule current;
  current.algorithm = RateAlgorithm::gcra;
  current.rate = 10;
  current.burst = 20;
  BadRequest bad;
  auto r = parse_rate_rule_update(R"({"rate":5,"on_redis_down":"closed"})", current, bad);
  ASSERT_TRUE(r) << bad.message;
  EXPECT_EQ(r->rate, 5);
  EXPECT_EQ(r->burst, 20);
  EXPECT_EQ(r->algorithm, RateAlgorithm::gcra);
  EXPECT_EQ(r->on_redis_down, RedisDownPolicy::closed);
  EXPECT_FALSE(parse_rate_rule_update(R"({"algorithm":"leaky"})", current, bad));
  EXPECT_FALSE(parse_rate_rule_update(R"({"rate":"5"})", current, bad));
  EXPECT_FALSE(parse_rate_rule_update(R"({"rat":5})", current, bad));
  EXPECT_FALSE(parse_rate_rule_update("", current, bad));
}

TEST(RateKeys, ClientIpTrustsOnlyTheConfiguredProxies) {
  const auto net = [](const char* a, unsigned p) {
    return TrustedProxy{boost::asio::ip::make_address(a), p};
  };
  const std::vector<TrustedProxy> trusted{net("10.0.0.0", 8), net("127.0.0.1", 32), net("fd00::", 64)};
  // No trusted proxies, or an untrusted peer: the peer, whatever the header says.
  EXPECT_EQ(client_ip("127.0.0.1", "1.2.3.4", {}), "127.0.0.1");
  EXPECT_EQ(client_ip("192.0.2.1", "1.2.3.4", trusted), "192.0.2.1");
  // A trusted peer: the right-most address that is not a trusted proxy.
  EXPECT_EQ(client_ip("127.0.0.1", "1.2.3.4", trusted), "1.2.3.4");
  EXPECT_EQ(client_ip("10.1.2.3", "6.6.6.6, 1.2.3.4, 10.9.9.9", trusted), "1.2.3.4");  // 6.6.6.6 is spoofable
  EXPECT_EQ(client_ip("fd00::1", "2001:db8::7", trusted), "2001:db8::7");
  EXPECT_EQ(client_ip("::ffff:127.0.0.1", "1.2.3.4", trusted), "1.2.3.4");  // v4-mapped peer
  // Garbage stops the walk at the last address we could trust.
  EXPECT_EQ(client_ip("127.0.0.1", "1.2.3.4, garbage", trusted), "127.0.0.1");
  // Every hop trusted: the left-most.
  EXPECT_EQ(client_ip("127.0.0.1", "10.0.0.1, 10.0.0.2", trusted), "10.0.0.1");
  EXPECT_FALSE(is_trusted_proxy(boost::asio::ip::make_address("11.0.0.1"), trusted));
  EXPECT_TRUE(is_trusted_proxy(boost::asio::ip::make_address("10.255.0.1"), trusted));
  EXPECT_FALSE(is_trusted_proxy(boost::asio::ip::make_address("fd00:0:0:1::1"), trusted));
}

TEST(RateKeys, DerivedKeysAndTokenEstimates) {
  RateRuleConfig rule;
  rule.name = "r";
  rule.key = {{RateKeyPart::header, "X-User-Id"}, {RateKeyPart::route, ""}};
  boost::beast::http::fields h;
  h.set("X-User-Id", "alice");
  std::string problem;
  EXPECT_EQ(derive_rate_key(rule, {&h, "", "1.2.3.4", "/v1/chat"}, problem), "alice|/v1/chat");
  boost::beast::http::fields none;
  EXPECT_FALSE(derive_rate_key(rule, {&none, "", "1.2.3.4", "/v1/chat"}, problem));
  EXPECT_NE(problem.find("X-User-Id"), std::string::npos) << problem;
  // Given twice, the header names no bucket (a client's line could choose one).
  boost::beast::http::fields twice;
  twice.insert("X-User-Id", "mallory-1");
  twice.insert("x-user-id", "alice");
  problem.clear();
  EXPECT_FALSE(derive_rate_key(rule, {&twice, "", "1.2.3.4", "/v1/chat"}, problem));
  EXPECT_NE(problem.find("more than once"), std::string::npos) << problem;
  rule.key = {{RateKeyPart::tenant, ""}, {RateKeyPart::ip, ""}, {RateKeyPart::global, ""}};
  EXPECT_EQ(derive_rate_key(rule, {&h, "acme", "1.2.3.4", "/"}, problem), "acme|1.2.3.4|global");
  EXPECT_FALSE(derive_rate_key(rule, {&h, "", "1.2.3.4", "/"}, problem));

  rule.default_max_tokens = 500;
  rule.chars_per_token = 4;
  std::int64_t prompt = 0;
  // 500 + (1 + ceil(17 / 4)) for one message of 17 characters.
  EXPECT_EQ(
      estimate_token_cost(R"({"messages":[{"role":"user","content":"hello there world"}]})", rule, &prompt),
      506);
  EXPECT_EQ(prompt, 6);
  EXPECT_EQ(estimate_token_cost(R"({"max_tokens":50,"messages":[{"content":"abcd"},{"content":"e"}]})", rule),
            50 + 2 + 1 + 1);
  EXPECT_EQ(estimate_token_cost(R"({"max_completion_tokens":7,"max_tokens":50,"prompt":"abcdefgh"})", rule),
            7 + 2);
  EXPECT_EQ(estimate_token_cost("not json!", rule), 500 + 3);
  // Content parts (arrays of {type,text}) count their text.
  EXPECT_EQ(estimate_token_cost(R"({"messages":[{"content":[{"type":"text","text":"abcdefgh"}]}]})", rule),
            500 + 1 + (4 + 8 + 3) / 4);
}

}  // namespace
}  // namespace fairgate::serve
