// redis/url.hpp — redis://[user:password@]host:port[/db]
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

namespace fairgate::redis {

struct Endpoint {
  std::string host = "127.0.0.1";
  std::uint16_t port = 6379;
  std::string user;      ///< empty: AUTH with the password only (or no AUTH)
  std::string password;  ///< empty: no AUTH
  int db = 0;

  /// The URL again, with the password masked ("redis://user:***@host:port/db").
  std::string redacted() const;
};

/// The endpoint, or one line saying what is wrong with the URL.
/// Accepts: redis://host, redis://host:port, redis://:password@host:port,
/// redis://user:password@host:port/db, and IPv6 hosts in brackets.
/// Percent-escapes in user and password are decoded.
std::variant<Endpoint, std::string> parse_url(std::string_view url);

}  // namespace fairgate::redis
