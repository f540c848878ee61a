// http/address.hpp — "HOST:PORT" as our servers' --listen reads it (fairgate
// serve and fairgate mock-llm alike).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fairgate::http {

struct ListenAddress {
  std::string host;  ///< an IP address, as make_address reads it
  std::uint16_t port = 0;
};

/// Reads "HOST:PORT". HOST is an IP address (IPv6 in brackets: "[::1]:8080"),
/// `localhost` (127.0.0.1), `*` (0.0.0.0: every interface) or nothing
/// (":8080": loopback, 127.0.0.1 — every interface only when asked for);
/// PORT is 0..65535 (0: any free port). On a problem returns nullopt and sets
/// `error` to one line without the field name ("\"x\" is not HOST:PORT ...").
std::optional<ListenAddress> parse_listen(std::string_view text, std::string& error);

}  // namespace fairgate::http
