// tests/fuzz/fuzz_values.cpp — the small value readers behind flags, the
// config file and the environment: durations and numbers (src/cli), listen
// addresses (src/http/address.cpp), Redis URLs (src/redis/url.cpp), browser
// origins (src/serve/cors.cpp) and upstream URLs (src/serve/config.cpp).
// Each gives a value within its documented range or one clear line, and
// round-trips where the docs promise it.
//
// Input: byte 0 picks the reader; bytes 1-2 give a range where one is
// needed; the rest is the text.
#include "fuzz/check.hpp"

#include "cli/duration.hpp"
#include "cli/parse.hpp"
#include "http/address.hpp"
#include "redis/url.hpp"
#include "serve/config.hpp"
#include "serve/cors.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <variant>

using namespace fairgate;
using fairgate::fuzz::is_clear_message;

namespace {

void check_redis_endpoint(const redis::Endpoint& e) {
  FUZZ_CHECK(!e.host.empty(), "a host");
  FUZZ_CHECK(e.db >= 0, "db >= 0");
  const std::string r = e.redacted();
  if (!e.password.empty()) FUZZ_CHECK(r.find("***") != std::string::npos, r);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  const unsigned op = in.byte() % 8;
  const std::uint64_t a = in.byte();
  const std::uint64_t b = in.byte();
  const std::string_view text = in.rest();
  switch (op) {
    case 0: {
      const auto d = cli::parse_duration(text);
      if (!fuzz::ok_or_clear(d.value.has_value(), d.error)) break;
      FUZZ_CHECK(d.value->count() >= 0 && *d.value <= cli::kMaxDuration, "0..kMaxDuration");
      // format_duration: "the shortest text parse_duration reads back as d".
      const std::string again = cli::format_duration(*d.value);
      const auto back = cli::parse_duration(again);
      FUZZ_CHECK(back && *back.value == *d.value, again);
      break;
    }
    case 1: {
      const std::uint64_t lo = std::min(a, b) * 1000, hi = std::max(a, b) * 1000 + b;
      const auto n = cli::parse_count(text, lo, hi);
      if (!fuzz::ok_or_clear(n.value.has_value(), n.error)) break;
      FUZZ_CHECK(*n.value >= lo && *n.value <= hi, "in lo..hi");
      break;
    }
    case 2: {
      const double lo = -static_cast<double>(a), hi = static_cast<double>(b) / 4;
      const auto n = cli::parse_number(text, lo, hi);
      if (!fuzz::ok_or_clear(n.value.has_value(), n.error)) break;
      FUZZ_CHECK(std::isfinite(*n.value) && *n.value >= lo && *n.value <= hi, "finite, in lo..hi");
      break;
    }
    case 3: {
      std::string error;
      const auto l = http::parse_listen(text, error);
      if (!fuzz::ok_or_clear(l.has_value(), error)) break;
      FUZZ_CHECK(!l->host.empty(), "a host");
      serve::ServeConfig cfg;
      serve::parse_listen(text, "listen", cfg);  // the config's reading agrees: no throw
      FUZZ_CHECK(cfg.listen_host == l->host && cfg.listen_port == l->port, "same address");
      break;
    }
    case 4: {
      const auto t = redis::parse_target(text);
      if (const auto* e = std::get_if<std::string>(&t)) {
        FUZZ_CHECK(is_clear_message(*e), *e);
      } else {
        const auto& target = std::get<redis::Target>(t);
        FUZZ_CHECK(!target.nodes.empty(), "a node");
        for (const auto& n : target.nodes) check_redis_endpoint(n);
        const std::string r = target.redacted();
        // The sentinels' credentials: only on Sentinel URLs, a user only with a password, masked.
        if (target.kind != redis::Target::Kind::sentinel)
          FUZZ_CHECK(target.sentinel_user.empty() && target.sentinel_password.empty(), r);
        if (!target.sentinel_user.empty()) FUZZ_CHECK(!target.sentinel_password.empty(), r);
        if (!target.sentinel_password.empty())
          FUZZ_CHECK(r.find("sentinel_password=***") != std::string::npos, r);
      }
      const auto u = redis::parse_url(text);
      if (const auto* e = std::get_if<std::string>(&u)) {
        FUZZ_CHECK(is_clear_message(*e), *e);
      } else {
        check_redis_endpoint(std::get<redis::Endpoint>(u));
      }
      break;
    }
    case 5: {
      std::string problem;
      const auto o = serve::normalize_origin(text, problem);
      if (!fuzz::ok_or_clear(o.has_value(), problem)) break;
      // The normal form is its own normal form, and is allowed by a list of itself.
      std::string again_problem;
      const auto again = serve::normalize_origin(*o, again_problem);
      FUZZ_CHECK(again && *again == *o, *o);
      FUZZ_CHECK(serve::judge_origin(*o, {*o}) == serve::OriginVerdict::allowed, *o);
      break;
    }
    case 6: {
      const std::string_view origin = text.substr(0, a % (text.size() + 1));
      (void)serve::judge_origin(origin, {"https://app.example.com", "http://127.0.0.1:8080"});
      (void)serve::judge_origin(origin, {"*"});
      break;
    }
    default: {
      serve::RouteConfig route;
      try {
        serve::parse_upstream(text, "upstream", route);
        FUZZ_CHECK(!route.upstream_host.empty(), "a host");
        FUZZ_CHECK(route.upstream_port != 0, "a port");
      } catch (const serve::ConfigError& e) {
        FUZZ_CHECK(is_clear_message(e.what()), e.what());
      }
      break;
    }
  }
  return 0;
}
