// serve/cors.cpp — Origin checks for browser access.
#include "serve/cors.hpp"

#include <algorithm>
#include <charconv>

namespace fairgate::serve {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c); });
  return out;
}

/// "host[:port]" without the scheme's default port; false when malformed.
bool normalize_authority(std::string& authority, bool https, std::string& problem) {
  if (authority.empty()) {
    problem = "no host";
    return false;
  }
  for (const char c : authority) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f || c == '/' || c == '?' || c == '#' || c == '@' || c == '\\' || c == '*') {
      problem = c == '*' ? "wildcards are not supported (list exact origins, or \"*\" alone for any)"
                         : "an origin is scheme://host[:port], with no path, query or user info";
      return false;
    }
  }
  const auto colon = authority.rfind(':');
  const auto bracket = authority.rfind(']');  // IPv6 literal "[::1]:8080"
  const bool has_port = colon != std::string::npos && (bracket == std::string::npos || colon > bracket);
  // The host: a name or IPv4 address without ':' or brackets, or "[IPv6]".
  const std::string_view host(authority.data(), has_port ? colon : authority.size());
  const bool ipv6 = host.size() > 2 && host.front() == '[' && host.back() == ']' &&
                    host.substr(1, host.size() - 2).find_first_of("[]") == std::string_view::npos;
  if (!ipv6 && host.find_first_of(":[]") != std::string_view::npos) {
    problem = "the host is a name, an IPv4 address or an [IPv6] address in brackets";
    return false;
  }
  if (has_port) {
    const std::string_view port(authority.data() + colon + 1, authority.size() - colon - 1);
    unsigned value = 0;
    const auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (port.empty() || ec != std::errc() || p != port.data() + port.size() || value < 1 || value > 65535) {
      problem = "port not in 1..65535";
      return false;
    }
    if (colon == 0) {
      problem = "no host";
      return false;
    }
    if (value == (https ? 443u : 80u)) authority.erase(colon);
  }
  return true;
}

}  // namespace

std::optional<std::string> normalize_origin(std::string_view text, std::string& problem) {
  const std::string s = lower(text);
  if (s == "null") {
    problem = "\"null\" (sandboxed pages, file://) can only be allowed with \"*\"";
    return std::nullopt;
  }
  bool https = false;
  std::string_view rest;
  if (s.rfind("https://", 0) == 0) {
    https = true;
    rest = std::string_view(s).substr(8);
  } else if (s.rfind("http://", 0) == 0) {
    rest = std::string_view(s).substr(7);
  } else {
    problem = "an origin is http://HOST[:PORT] or https://HOST[:PORT] (or \"*\" alone for any)";
    return std::nullopt;
  }
  if (rest.find('/') != std::string_view::npos) {
    problem = "an origin has no path, not even \"/\" (e.g. \"https://app.example.com\")";
    return std::nullopt;
  }
  std::string authority(rest);
  if (!normalize_authority(authority, https, problem)) return std::nullopt;
  return std::string(https ? "https://" : "http://") + authority;
}

OriginVerdict judge_origin(std::string_view origin, const std::vector<std::string>& allowed) {
  if (origin.empty()) return OriginVerdict::none;
  if (std::find(allowed.begin(), allowed.end(), "*") != allowed.end()) return OriginVerdict::allowed;
  std::string problem;
  const auto normal = normalize_origin(origin, problem);
  if (!normal) return OriginVerdict::refused;  // "null", or not an http(s) origin
  if (std::find(allowed.begin(), allowed.end(), *normal) != allowed.end()) return OriginVerdict::allowed;
  return OriginVerdict::refused;
}

}  // namespace fairgate::serve
