#include "redis/url.hpp"

#include <charconv>

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

template <typename Int>
bool parse_number(std::string_view s, Int& out) {
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && end == s.data() + s.size();
}

}  // namespace

std::string Endpoint::redacted() const {
  // Appends only: g++ 12 at -O3 warns falsely (-Wrestrict) on "literal" + std::string temporaries.
  std::string out = "redis://";
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

std::variant<Endpoint, std::string> parse_url(std::string_view url) {
  constexpr std::string_view scheme = "redis://";
  if (url.substr(0, scheme.size()) != scheme) return std::string("must start with redis://");
  std::string_view rest = url.substr(scheme.size());
  Endpoint ep;

  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
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
  }

  std::string_view hostport = rest;
  if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
    hostport = rest.substr(0, slash);
    const std::string_view db = rest.substr(slash + 1);
    if (!db.empty()) {
      if (!parse_number(db, ep.db) || ep.db < 0 || ep.db > 65535) {
        return "database must be a number 0..65535, got '" + std::string(db) + "'";
      }
    }
  }
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
    unsigned value = 0;
    if (!parse_number(port, value) || value == 0 || value > 65535) {
      return "port must be a number 1..65535, got '" + std::string(port) + "'";
    }
    ep.port = static_cast<std::uint16_t>(value);
  }
  return ep;
}

}  // namespace fairgate::redis
