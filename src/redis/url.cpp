#include "redis/url.hpp"

#include "core/number.hpp"
#include "core/text.hpp"

#include <optional>

namespace fairgate::redis {

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool percent_decode(std::string_view in, std::string& out) {
  out.clear();
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out.push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) return false;
    const int hi = hex_value(in[i + 1]);
    const int lo = hex_value(in[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

}  // namespace

std::string Endpoint::redacted() const {
  // Appends only: g++ 12 at -O3 warns falsely (-Wrestrict) on "literal" + std::string temporaries.
  std::string out = tls.enabled ? "rediss://" : "redis://";
  if (!user.empty() || !password.empty()) {
    out.append(user);
    if (!password.empty()) out.append(":***");
    out.push_back('@');
  }
  const bool ipv6 = host.find(':') != std::string::npos;
  if (ipv6) out.push_back('[');
  out.append(host);
  if (ipv6) out.push_back(']');
  out.push_back(':');
  out.append(std::to_string(port));
  if (db != 0) {
    out.push_back('/');
    out.append(std::to_string(db));
  }
  return out;
}

namespace {

/// "[user:password@]" at the start of `rest` into `ep`; `rest` keeps what follows.
std::optional<std::string> parse_userinfo(std::string_view& rest, Endpoint& ep) {
  const auto at = rest.rfind('@');
  if (at == std::string_view::npos) return std::nullopt;
  const std::string_view userinfo = rest.substr(0, at);
  rest = rest.substr(at + 1);
  const auto colon = userinfo.find(':');
  const std::string_view user = userinfo.substr(0, colon);
  const std::string_view password =
      colon == std::string_view::npos ? std::string_view{} : userinfo.substr(colon + 1);
  if (colon == std::string_view::npos) {
    // redis://password@host is a common shorthand for a password only.
    if (!percent_decode(user, ep.password)) return std::string("bad percent-escape in the password");
  } else {
    if (!percent_decode(user, ep.user)) return std::string("bad percent-escape in the user");
    if (!percent_decode(password, ep.password)) return std::string("bad percent-escape in the password");
  }
  return std::nullopt;
}

/// "host[:port]" (IPv6 in brackets) into `ep`.
std::optional<std::string> parse_hostport(std::string_view hostport, Endpoint& ep) {
  std::string_view host = hostport;
  std::string_view port;
  if (!hostport.empty() && hostport.front() == '[') {
    const auto close = hostport.find(']');
    if (close == std::string_view::npos) return std::string("unclosed '[' in the host");
    host = hostport.substr(1, close - 1);
    const std::string_view after = hostport.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return std::string("expected ':' after ']'");
      port = after.substr(1);
      if (port.empty()) return std::string("empty port");
    }
  } else if (const auto colon = hostport.rfind(':'); colon != std::string_view::npos) {
    host = hostport.substr(0, colon);
    port = hostport.substr(colon + 1);
    if (port.empty()) return std::string("empty port");
  }
  if (host.empty()) return std::string("missing host");
  ep.host = std::string(host);
  if (!port.empty()) {
    const auto value = core::parse_number<unsigned>(port);
    if (!value || *value == 0 || *value > 65535) {
      return "port must be a number 1..65535, got '" + core::escape_controls(port) + "'";
    }
    ep.port = static_cast<std::uint16_t>(*value);
  }
  return std::nullopt;
}

std::optional<std::string> parse_db(std::string_view db, Endpoint& ep) {
  if (db.empty()) return std::nullopt;
  const auto value = core::parse_number<decltype(ep.db)>(db);
  if (!value || *value < 0 || *value > 65535)
    return "database must be a number 0..65535, got '" + core::escape_controls(db) + "'";
  ep.db = *value;
  return std::nullopt;
}

/// "h:p,h:p,..." into nodes sharing `proto`'s credentials.
std::optional<std::string> parse_hosts(std::string_view list, const Endpoint& proto,
                                       std::uint16_t default_port, std::vector<Endpoint>& out) {
  if (list.empty()) return std::string("missing host");
  while (true) {
    const auto comma = list.find(',');
    Endpoint ep = proto;
    ep.port = default_port;
    if (auto problem = parse_hostport(list.substr(0, comma), ep)) return problem;
    out.push_back(std::move(ep));
    if (comma == std::string_view::npos) break;
    list = list.substr(comma + 1);
  }
  if (out.size() > 64) return std::string("at most 64 hosts");
  return std::nullopt;
}

/// What a URL's query may set: TLS settings, and for Sentinel the sentinels' own credentials.
struct Query {
  TlsOptions& tls;
  Target* sentinel = nullptr;  ///< null: not a Sentinel URL (its parameters are refused)
};

/// Splits "?k=v&k=v" off the end of `rest` (after the userinfo, so a '?' in a
/// password is not mistaken for it) into `q`.
std::optional<std::string> parse_query(std::string_view& rest, Query q) {
  TlsOptions& tls = q.tls;
  const auto at = rest.rfind('@');
  const auto qm = rest.find('?', at == std::string_view::npos ? 0 : at);
  if (qm == std::string_view::npos) return std::nullopt;
  std::string_view query = rest.substr(qm + 1);
  rest = rest.substr(0, qm);
  bool any_tls = false;
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (pair.empty()) continue;
    const auto eq = pair.find('=');
    const std::string key = core::escape_controls(pair.substr(0, eq));  // (echoed in the problems below)
    std::string value;
    if (eq == std::string_view::npos || !percent_decode(pair.substr(eq + 1), value))
      return "query parameter '" + key + "': expected " + key + "=VALUE (percent-escaped)";
    if (key == "sentinel_user" || key == "sentinel_password") {
      if (!q.sentinel)
        return "query parameter '" + key + "' is for redis+sentinel:// URLs (the sentinels' own credentials)";
      (key == "sentinel_user" ? q.sentinel->sentinel_user : q.sentinel->sentinel_password) = value;
      if (value.empty()) return "query parameter '" + key + "' is empty";
      continue;
    }
    any_tls = true;
    if (key == "tls_ca_file") {
      tls.ca_file = value;
    } else if (key == "tls_cert_file") {
      tls.cert_file = value;
    } else if (key == "tls_key_file") {
      tls.key_file = value;
    } else if (key == "tls_server_name") {
      tls.server_name = value;
    } else if (key == "tls_verify") {
      if (value != "full" && value != "none") return std::string("tls_verify must be 'full' or 'none'");
      tls.verify = value == "full";
    } else {
      return "unknown query parameter '" + key +
             "' (known: tls_ca_file, tls_cert_file, tls_key_file, tls_server_name, tls_verify" +
             (q.sentinel ? ", sentinel_user, sentinel_password)" : ")");
    }
    if (value.empty() && key != "tls_verify") return "query parameter '" + key + "' is empty";
  }
  if (any_tls && !tls.enabled)
    return std::string("tls_* parameters need TLS: use rediss:// (or rediss+cluster://, rediss+sentinel://)");
  if (tls.cert_file.empty() != tls.key_file.empty())
    return std::string("tls_cert_file and tls_key_file go together (mutual TLS)");
  if (q.sentinel && !q.sentinel->sentinel_user.empty() && q.sentinel->sentinel_password.empty())
    return std::string("sentinel_user needs sentinel_password");
  return std::nullopt;
}

/// Removes "<base>://" or "<base>s://"-style prefixes: `plain` or `secure`.
bool strip_scheme(std::string_view& url, std::string_view plain, std::string_view secure, bool& tls) {
  if (url.substr(0, plain.size()) == plain) {
    url.remove_prefix(plain.size());
    tls = false;
    return true;
  }
  if (url.substr(0, secure.size()) == secure) {
    url.remove_prefix(secure.size());
    tls = true;
    return true;
  }
  return false;
}

}  // namespace

std::variant<Endpoint, std::string> parse_url(std::string_view url) {
  std::string_view rest = url;
  Endpoint ep;
  if (!strip_scheme(rest, "redis://", "rediss://", ep.tls.enabled)) {
    if (url.substr(0, 14) == "redis+cluster:" || url.substr(0, 15) == "redis+sentinel:" ||
        url.substr(0, 15) == "rediss+cluster:" || url.substr(0, 16) == "rediss+sentinel:")
      return std::string("a single server is needed here (redis://host:port), not a Cluster or Sentinel URL");
    return std::string(
        "must start with redis://, rediss://, redis+cluster:// or redis+sentinel:// (rediss+... for TLS)");
  }
  if (auto problem = parse_query(rest, {ep.tls})) return *problem;

  if (auto problem = parse_userinfo(rest, ep)) return *problem;
  std::string_view hostport = rest;
  if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
    hostport = rest.substr(0, slash);
    if (auto problem = parse_db(rest.substr(slash + 1), ep)) return *problem;
  }
  if (hostport.find(',') != std::string_view::npos)
    return std::string("several hosts: use redis+cluster:// or redis+sentinel://");
  if (auto problem = parse_hostport(hostport, ep)) return *problem;
  return ep;
}

std::variant<Target, std::string> parse_target(std::string_view url) {
  Target t;
  std::string_view rest = url;
  Endpoint proto;
  if (strip_scheme(rest, "redis+cluster://", "rediss+cluster://", proto.tls.enabled)) {
    t.kind = Target::Kind::cluster;
    if (auto problem = parse_query(rest, {proto.tls})) return *problem;
    if (auto problem = parse_userinfo(rest, proto)) return *problem;
    if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
      if (rest.substr(slash + 1).empty()) {
        rest = rest.substr(0, slash);
      } else {
        return std::string("a Cluster has only database 0: no '/db' in redis+cluster:// URLs");
      }
    }
    if (auto problem = parse_hosts(rest, proto, 6379, t.nodes)) return *problem;
    return t;
  }
  if (strip_scheme(rest, "redis+sentinel://", "rediss+sentinel://", proto.tls.enabled)) {
    t.kind = Target::Kind::sentinel;
    if (auto problem = parse_query(rest, {proto.tls, &t})) return *problem;
    if (auto problem = parse_userinfo(rest, proto)) return *problem;
    const auto slash = rest.find('/');
    if (slash == std::string_view::npos || slash + 1 >= rest.size())
      return std::string("missing the master's name: redis+sentinel://HOST:PORT[,...]/MASTER_NAME[/DB]");
    std::string_view path = rest.substr(slash + 1);
    const auto slash2 = path.find('/');
    t.master_name = std::string(path.substr(0, slash2));
    if (t.master_name.empty()) return std::string("missing the master's name");
    for (const char c : t.master_name) {
      if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f)
        return std::string("bad character in the master's name");
    }
    if (slash2 != std::string_view::npos) {
      if (auto problem = parse_db(path.substr(slash2 + 1), proto)) return *problem;
    }
    if (auto problem = parse_hosts(rest.substr(0, slash), proto, 26379, t.nodes)) return *problem;
    return t;
  }
  auto one = parse_url(url);
  if (auto* problem = std::get_if<std::string>(&one)) return *problem;
  t.nodes.push_back(std::get<Endpoint>(std::move(one)));
  return t;
}

Endpoint Target::sentinel(std::size_t i) const {
  Endpoint ep = nodes.at(i);
  ep.user = sentinel_user;
  ep.password = sentinel_password;
  ep.db = 0;
  return ep;
}

std::string Target::redacted() const {
  if (kind == Kind::standalone) return nodes.empty() ? std::string("redis://?") : nodes.front().redacted();
  const bool tls = !nodes.empty() && nodes.front().tls.enabled;
  std::string out = tls ? "rediss" : "redis";
  out.append(kind == Kind::cluster ? "+cluster://" : "+sentinel://");
  if (!nodes.empty() && (!nodes.front().user.empty() || !nodes.front().password.empty())) {
    out.append(nodes.front().user);
    if (!nodes.front().password.empty()) out.append(":***");
    out.push_back('@');
  }
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (i) out.push_back(',');
    const bool ipv6 = nodes[i].host.find(':') != std::string::npos;
    if (ipv6) out.push_back('[');
    out.append(nodes[i].host);
    if (ipv6) out.push_back(']');
    out.push_back(':');
    out.append(std::to_string(nodes[i].port));
  }
  if (kind == Kind::sentinel) {
    out.push_back('/');
    out.append(master_name);
    if (!nodes.empty() && nodes.front().db != 0) {
      out.push_back('/');
      out.append(std::to_string(nodes.front().db));
    }
    if (!sentinel_user.empty()) out.append("?sentinel_user=").append(sentinel_user);
    if (!sentinel_password.empty())
      out.append(sentinel_user.empty() ? "?" : "&").append("sentinel_password=***");
  }
  return out;
}

}  // namespace fairgate::redis
