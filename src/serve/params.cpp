// serve/params.cpp — strict on purpose: a request the server does not fully
// understand is answered 400 with the reason, never half-applied.
#include "serve/params.hpp"

#include "core/number.hpp"
#include "core/settings_table.hpp"
#include "core/text.hpp"

#include <fmt/format.h>
#include <boost/beast/core/string.hpp>
#include <boost/json.hpp>

#include <limits>
#include <span>
#include <variant>

namespace fairgate::serve {
namespace {

namespace json = boost::json;

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/// Percent-decodes `in`; '+' means space in a query. False on a bad escape or
/// a control character (after decoding).
bool decode(std::string_view in, bool query, std::string& out) {
  out.clear();
  out.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;
      const int hi = hex_value(in[i + 1]);
      const int lo = hex_value(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      c = static_cast<char>(hi * 16 + lo);
      i += 2;
    } else if (c == '+' && query) {
      c = ' ';
    }
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return false;
    out += c;
  }
  return true;
}

/// An integer from a JSON value (integers only, no floats or strings).
std::optional<std::int64_t> json_int(const json::value& v) {
  if (v.is_int64()) return v.as_int64();
  if (v.is_uint64() && v.as_uint64() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    return static_cast<std::int64_t>(v.as_uint64());
  return std::nullopt;
}

std::optional<json::object> parse_object(std::string_view body, BadRequest& error) {
  boost::system::error_code ec;
  json::parse_options opts;
  opts.max_depth = 8;
  json::value v = json::parse(body, ec, {}, opts);
  if (ec) {
    error.message = fmt::format("body is not valid JSON: {}", ec.message());
    return std::nullopt;
  }
  if (!v.is_object()) {
    error.message = "body must be a JSON object";
    return std::nullopt;
  }
  return std::move(v.as_object());
}

/// lease_ms of a JSON permit (acquire and renew alike): 100..max_lease.
bool check_lease(std::int64_t v, std::chrono::milliseconds max_lease, BadRequest& error) {
  if (v < 100 || v > max_lease.count()) {
    error.message = fmt::format("lease_ms: {} not in 100..{}", v, max_lease.count());
    return false;
  }
  return true;
}

/// Whether the query's parameter `i` was given before it (`?limit=1&limit=2`: which one was
/// meant is not known, so neither is taken).
bool given_before(const Target& target, std::size_t i) {
  for (std::size_t j = 0; j < i; ++j)
    if (target.query[j].first == target.query[i].first) return true;
  return false;
}

/// One parameter a request may give: a whole number or a string.
struct Param {
  std::string_view name;
  bool integer;
};
using ParamValue = std::variant<std::int64_t, std::string_view>;

/// Hands each parameter of `target`'s query string, then of `body` (a JSON
/// object, when not empty), to `set(name, value)`, each checked for its kind
/// the same way from either source; the body comes second, so it wins where
/// both give a value, and a JSON null leaves a parameter as it is. False, with
/// `error` set, on a parameter not in `known`, a value of the wrong kind, or
/// when `set` says no (it sets `error` itself).
template <class Set>
bool read_params(const Target& target, std::string_view body, std::span<const Param> known, const Set& set,
                 BadRequest& error) {
  const auto find = [&](std::string_view key) -> const Param* {
    for (const auto& param : known)
      if (param.name == key) return &param;
    std::string names;
    for (const auto& param : known) names += fmt::format("{}{}", names.empty() ? "" : ", ", param.name);
    error.message = fmt::format("unknown parameter {} (use {})", core::quoted(key, 32), names);
    return nullptr;
  };
  for (std::size_t i = 0; i < target.query.size(); ++i) {
    const auto& [key, value] = target.query[i];
    const Param* param = find(key);
    if (!param) return false;
    if (given_before(target, i)) {
      error.message = fmt::format("{}: given more than once in the query string", param->name);
      return false;
    }
    if (!param->integer) {
      if (!set(param->name, ParamValue(std::string_view(value)))) return false;
      continue;
    }
    const auto v = core::parse_number<std::int64_t>(value);
    if (!v) {
      error.message = fmt::format("{}: {} is not a whole number", key, core::quoted(value, 32));
      return false;
    }
    if (!set(param->name, ParamValue(*v))) return false;
  }
  if (body.empty()) return true;
  const auto obj = parse_object(body, error);
  if (!obj) return false;
  for (const auto& [k, v] : *obj) {
    const Param* param = find(std::string_view(k.data(), k.size()));
    if (!param) return false;
    if (v.is_null()) continue;
    if (param->integer) {
      const auto i = json_int(v);
      if (!i) {
        error.message = fmt::format("{}: must be a whole number", param->name);
        return false;
      }
      if (!set(param->name, ParamValue(*i))) return false;
    } else {
      if (!v.is_string()) {
        error.message = fmt::format("{}: must be a string", param->name);
        return false;
      }
      const auto& text = v.as_string();
      if (!set(param->name, ParamValue(std::string_view(text.data(), text.size())))) return false;
    }
  }
  return true;
}

}  // namespace

std::optional<Target> parse_target(std::string_view target, BadRequest& error) {
  if (target.empty() || target.front() != '/') {
    error.message = "request target must start with '/'";
    return std::nullopt;
  }
  Target t;
  const auto q = target.find('?');
  const std::string_view path = target.substr(0, q);
  std::string decoded;
  if (path.size() > 1) {
    std::string_view rest = path.substr(1);
    for (;;) {
      const auto slash = rest.find('/');
      const std::string_view seg = rest.substr(0, slash);
      if (!decode(seg, false, decoded)) {
        error.message = "bad percent-escape or control character in the path";
        return std::nullopt;
      }
      if (decoded.empty() || decoded == "." || decoded == ".." || decoded.find('/') != std::string::npos) {
        error.message = "empty or dot segments and encoded slashes are not allowed in the path";
        return std::nullopt;
      }
      t.segments.push_back(decoded);
      if (slash == std::string_view::npos) break;
      rest = rest.substr(slash + 1);
    }
  }
  if (q != std::string_view::npos) {
    std::string_view query = target.substr(q + 1);
    while (!query.empty()) {
      const auto amp = query.find('&');
      const std::string_view pair = query.substr(0, amp);
      query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
      if (pair.empty()) continue;
      const auto eq = pair.find('=');
      std::string key, value;
      if (!decode(pair.substr(0, eq), true, key) ||
          (eq != std::string_view::npos && !decode(pair.substr(eq + 1), true, value))) {
        error.message = "bad percent-escape or control character in the query string";
        return std::nullopt;
      }
      if (t.query.size() >= 32) {
        error.message = "too many query parameters (at most 32)";
        return std::nullopt;
      }
      t.query.emplace_back(std::move(key), std::move(value));
    }
  }
  return t;
}

std::optional<AcquireParams> parse_acquire_params(const Target& target, std::string_view body,
                                                  std::chrono::milliseconds max_lease, BadRequest& error) {
  static constexpr Param kKnown[] = {
      {"max_wait_ms", true}, {"tenant", false}, {"weight", true}, {"lease_ms", true}};
  AcquireParams p;
  const auto set = [&](std::string_view key, const ParamValue& value) -> bool {
    if (key == "tenant") {
      const auto tenant = std::get<std::string_view>(value);
      if (!fairgate::valid_tenant(tenant)) {
        error.message = fmt::format("tenant: must be {}", fairgate::kTenantRule);
        return false;
      }
      p.tenant = std::string(tenant);
      return true;
    }
    const auto v = std::get<std::int64_t>(value);
    if (key == "max_wait_ms") {
      if (v < 0 || v > kMaxWaitLimit.count()) {
        error.message = fmt::format("max_wait_ms: {} not in 0..{}", v, kMaxWaitLimit.count());
        return false;
      }
      p.max_wait = std::chrono::milliseconds(v);
    } else if (key == "weight") {
      if (v < 1 || v > 1000) {
        error.message = fmt::format("weight: {} not in 1..1000", v);
        return false;
      }
      p.weight = static_cast<std::uint32_t>(v);
    } else {  // lease_ms
      if (!check_lease(v, max_lease, error)) return false;
      p.lease = std::chrono::milliseconds(v);
    }
    return true;
  };
  if (!read_params(target, body, kKnown, set, error)) return std::nullopt;
  return p;
}

std::optional<RenewParams> parse_renew_params(const Target& target, std::string_view body,
                                              std::chrono::milliseconds max_lease, BadRequest& error) {
  static constexpr Param kKnown[] = {{"lease_ms", true}};
  RenewParams p;
  const auto set = [&](std::string_view, const ParamValue& value) -> bool {
    const auto v = std::get<std::int64_t>(value);
    if (!check_lease(v, max_lease, error)) return false;
    p.lease = std::chrono::milliseconds(v);
    return true;
  };
  if (!read_params(target, body, kKnown, set, error)) return std::nullopt;
  return p;
}

std::optional<StatusQuery> parse_status_query(const Target& target, BadRequest& error) {
  StatusQuery q;
  for (std::size_t i = 0; i < target.query.size(); ++i) {
    const auto& [key, value] = target.query[i];
    if (key != "offset" && key != "limit") {
      error.message = fmt::format("unknown parameter {} (use offset, limit)", core::quoted(key, 32));
      return std::nullopt;
    }
    if (given_before(target, i)) {
      error.message = fmt::format("{}: given more than once in the query string", key);
      return std::nullopt;
    }
    const auto v = core::parse_number<std::int64_t>(value);
    if (!v) {
      error.message = fmt::format("{}: {} is not a whole number", key, core::quoted(value, 32));
      return std::nullopt;
    }
    const std::int64_t max = key == "limit" ? static_cast<std::int64_t>(kMaxStatusLimit) : 1'000'000'000;
    if (*v < 0 || *v > max) {
      error.message = fmt::format("{}: {} not in 0..{}", key, *v, max);
      return std::nullopt;
    }
    (key == "limit" ? q.limit : q.offset) = static_cast<std::size_t>(*v);
  }
  return q;
}

std::optional<SettingsUpdate> parse_settings_update(std::string_view body, BadRequest& error) {
  const auto settable = [](const core::SettingSpec& spec) { return spec.http; };
  if (body.empty()) {
    error.message = "body must be a JSON object with " + core::join_settings(settable, true, " or ");
    return std::nullopt;
  }
  auto obj = parse_object(body, error);
  if (!obj) return std::nullopt;
  SettingsUpdate u;
  const auto bad = [&](std::string message) {
    error.message = std::move(message);
    return std::nullopt;
  };
  for (const auto& [k, v] : *obj) {
    const std::string_view key(k.data(), k.size());
    const core::SettingSpec* spec = core::setting_by_key(key);
    if (spec == nullptr || spec->key != key || !spec->http)
      return bad(fmt::format("unknown field {} (use {})", core::quoted(key, 32),
                             core::join_settings(settable, true)));
    switch (spec->kind) {
      case core::SettingKind::count:
      case core::SettingKind::duration_ms: {
        const auto i = json_int(v);
        if (!i || *i < spec->min || *i > spec->max)
          return bad(fmt::format("{}: must be a whole number in {}..{}", key, spec->min, spec->max));
        spec->set_update(u, *i);
        break;
      }
      case core::SettingKind::optional_count: {
        const auto i = v.is_null() ? std::nullopt : json_int(v);
        if (!v.is_null() && (!i || *i < spec->min || *i > spec->max))
          return bad(fmt::format("{}: must be null or a whole number in {}..{}", key, spec->min, spec->max));
        spec->set_update(u, i);
        break;
      }
      case core::SettingKind::flag:
        if (!v.is_bool()) return bad(fmt::format("{}: must be true or false", key));
        spec->set_update(u, v.as_bool() ? 1 : 0);
        break;
      case core::SettingKind::choice: {
        const auto choice = v.is_string() ? core::parse_choice(*spec, v.as_string()) : std::nullopt;
        if (!choice) return bad(fmt::format("{}: must be {}", key, core::join_choices(*spec, true, " or ")));
        spec->set_update(u, *choice);
        break;
      }
    }
  }
  return u;
}

namespace {

/// A cost or amount from JSON: any number (so 1.5, -1, 1e300 get their own message), validated.
std::optional<std::int64_t> json_cost(const json::value& v, std::string_view field, BadRequest& error) {
  std::optional<SettingsError> problem;
  std::int64_t out = 0;
  if (v.is_int64()) {
    out = v.as_int64();
    problem = validate_cost(out);
  } else if (v.is_uint64()) {
    problem = SettingsError{"cost", fmt::format("{} is not in 1..{}", v.as_uint64(), kMaxCost)};
  } else if (v.is_double()) {
    problem = validate_cost(v.as_double());
    if (!problem) out = static_cast<std::int64_t>(v.as_double());
  } else {
    problem = SettingsError{"cost", "must be a whole number"};
  }
  if (problem) {
    error.message = fmt::format("{}: {}", field, problem->problem);
    return std::nullopt;
  }
  return out;
}

bool read_key(const json::value& v, std::string& out, BadRequest& error) {
  if (!v.is_string()) {
    error.message = "key: must be a string (the caller's key: a user id, an IP, ...)";
    return false;
  }
  out = std::string(v.as_string().data(), v.as_string().size());
  if (auto e = validate_rate_key(out)) {
    error.message = e->message();
    return false;
  }
  return true;
}

}  // namespace

std::optional<RateCheckParams> parse_rate_check(std::string_view body, BadRequest& error) {
  if (body.empty()) {
    error.message = "body must be a JSON object {\"key\": \"...\", \"cost\": 1}";
    return std::nullopt;
  }
  auto obj = parse_object(body, error);
  if (!obj) return std::nullopt;
  RateCheckParams p;
  bool has_key = false;
  for (const auto& [k, v] : *obj) {
    const std::string_view key(k.data(), k.size());
    if (key == "key") {
      if (!read_key(v, p.key, error)) return std::nullopt;
      has_key = true;
    } else if (key == "cost") {
      const auto c = json_cost(v, "cost", error);
      if (!c) return std::nullopt;
      p.cost = *c;
    } else {
      error.message = fmt::format("unknown field {} (use key, cost)", core::quoted(key, 32));
      return std::nullopt;
    }
  }
  if (!has_key) {
    error.message = "key: missing (the caller's key: a user id, an IP, \"global\", ...)";
    return std::nullopt;
  }
  return p;
}

std::string decision_id(std::int64_t at_ms, std::int64_t at_us, std::int64_t cost) {
  return fmt::format("{}.{}.{}", at_ms, at_us, cost);
}

std::optional<RateRefundParams> parse_rate_refund(std::string_view body, BadRequest& error) {
  if (body.empty()) {
    error.message = "body must be a JSON object {\"key\", \"decision\", \"amount\"}";
    return std::nullopt;
  }
  auto obj = parse_object(body, error);
  if (!obj) return std::nullopt;
  RateRefundParams p;
  bool has_key = false, has_decision = false, has_amount = false;
  for (const auto& [k, v] : *obj) {
    const std::string_view key(k.data(), k.size());
    if (key == "key") {
      if (!read_key(v, p.key, error)) return std::nullopt;
      has_key = true;
    } else if (key == "amount") {
      const auto c = json_cost(v, "amount", error);
      if (!c) return std::nullopt;
      p.amount = *c;
      has_amount = true;
    } else if (key == "decision") {
      const bool ok = v.is_string() && [&p](const json::string& s) {
        const std::string text(s.data(), s.size());
        std::int64_t* out[] = {&p.at_ms, &p.at_us, &p.cost};
        std::size_t start = 0;
        for (int i = 0; i < 3; ++i) {
          const auto dot = text.find('.', start);
          if ((i < 2) == (dot == std::string::npos)) return false;
          const std::string part = text.substr(start, i < 2 ? dot - start : std::string::npos);
          const auto n = core::parse_number<std::int64_t>(part);
          // at_us < 0: a decision of an instance's fallback while Redis was unreachable.
          if (!n || (*n < 0 && i != 1)) return false;
          *out[i] = *n;
          start = dot + 1;
        }
        return p.cost >= 1;
      }(v.as_string());
      if (!ok) {
        error.message = "decision: must be the \"decision\" of an allowed answer (\"AT_MS.AT_US.COST\")";
        return std::nullopt;
      }
      has_decision = true;
    } else {
      error.message = fmt::format("unknown field {} (use key, decision, amount)", core::quoted(key, 32));
      return std::nullopt;
    }
  }
  if (!has_key)
    error.message = "key: missing";
  else if (!has_decision)
    error.message = "decision: missing (the \"decision\" of the allowed answer)";
  else if (!has_amount)
    error.message = "amount: missing (the units to give back)";
  if (!error.message.empty()) return std::nullopt;
  return p;
}

std::optional<RateRule> parse_rate_rule_update(std::string_view body, RateRule current, BadRequest& error) {
  if (body.empty()) {
    error.message =
        "body must be a JSON object with algorithm, rate, period_ms, burst, on_redis_down, local_divisor or "
        "mode";
    return std::nullopt;
  }
  auto obj = parse_object(body, error);
  if (!obj) return std::nullopt;
  RateRule r = current;
  const auto bad = [&](std::string message) {
    error.message = std::move(message);
    return std::nullopt;
  };
  for (const auto& [k, v] : *obj) {
    const std::string_view key(k.data(), k.size());
    if (key == "mode") {
      const auto mode = v.is_string() ? parse_limiter_mode(v.as_string()) : std::nullopt;
      if (!mode) return bad("mode: must be \"enforce\" or \"shadow\"");
      r.mode = *mode;
    } else if (key == "algorithm" || key == "on_redis_down") {
      if (!v.is_string()) return bad(fmt::format("{}: must be a string", key));
      const std::string_view text(v.as_string().data(), v.as_string().size());
      if (key == "algorithm") {
        const auto a = parse_rate_algorithm(text);
        if (!a)
          return bad(fmt::format(
              "algorithm: {} is not one of fixed_window, sliding_log, sliding_window, token_bucket, gcra",
              core::quoted(text, 32)));
        r.algorithm = *a;
      } else {
        const auto p = parse_redis_down_policy(text);
        if (!p)
          return bad(
              fmt::format("on_redis_down: {} is not one of local, open, closed", core::quoted(text, 32)));
        r.on_redis_down = *p;
      }
    } else if (key == "rate" || key == "period_ms" || key == "burst" || key == "local_divisor") {
      const auto i = json_int(v);
      if (!i) return bad(fmt::format("{}: must be a whole number", key));
      if (key == "rate")
        r.rate = *i;
      else if (key == "period_ms")
        r.period_ms = *i;
      else if (key == "burst")
        r.burst = *i;
      else
        r.local_divisor = *i;
    } else {
      return bad(fmt::format(
          "unknown field {} (use algorithm, rate, period_ms, burst, on_redis_down, local_divisor, mode)",
          core::quoted(key, 32)));
    }
  }
  return r;
}

bool bearer_matches(std::string_view header, std::string_view token) noexcept {
  constexpr std::string_view kScheme = "Bearer ";
  if (token.empty() || header.size() != kScheme.size() + token.size()) return false;
  // The scheme is case-insensitive (RFC 9110, 11.1); the token is compared in constant time.
  if (!boost::beast::iequals(header.substr(0, kScheme.size()), kScheme)) return false;
  unsigned diff = 0;
  for (std::size_t i = 0; i < token.size(); ++i)
    diff |= static_cast<unsigned char>(header[kScheme.size() + i]) ^ static_cast<unsigned char>(token[i]);
  return diff == 0;
}

namespace {

std::string_view trimmed(std::string_view v) noexcept {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return v;
}

}  // namespace

bool accepts_event_stream(std::string_view accept) noexcept {
  while (!accept.empty()) {
    const auto comma = accept.find(',');
    std::string_view range = accept.substr(0, comma);
    accept = comma == std::string_view::npos ? std::string_view() : accept.substr(comma + 1);
    const auto semi = range.find(';');
    if (!boost::beast::iequals(trimmed(range.substr(0, semi)), "text/event-stream")) continue;
    bool refused = false;  // q=0, q=0.0, ...: "not acceptable"
    for (auto params = semi == std::string_view::npos ? std::string_view() : range.substr(semi + 1);
         !params.empty();) {
      const auto next = params.find(';');
      const std::string_view p = trimmed(params.substr(0, next));
      params = next == std::string_view::npos ? std::string_view() : params.substr(next + 1);
      if (p.size() < 2 || (p[0] != 'q' && p[0] != 'Q') || p[1] != '=') continue;
      const std::string_view q = trimmed(p.substr(2));
      refused = !q.empty() && q.find_first_not_of("0.") == std::string_view::npos;
    }
    if (!refused) return true;
  }
  return false;
}

}  // namespace fairgate::serve
