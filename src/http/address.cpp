#include "http/address.hpp"

#include "core/text.hpp"

#include <fmt/format.h>
#include <boost/asio/ip/address.hpp>

#include <algorithm>
#include <cstdlib>

namespace fairgate::http {

std::optional<ListenAddress> parse_listen(std::string_view text, std::string& error) {
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos) {
    error = fmt::format("{} is not HOST:PORT (e.g. 127.0.0.1:8080)", core::quoted(text, 100));
    return std::nullopt;
  }
  std::string host(text.substr(0, colon));
  const std::string_view port_text = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty() || host == "localhost") host = "127.0.0.1";
  if (host == "*") host = "0.0.0.0";
  boost::system::error_code ec;
  boost::asio::ip::make_address(host, ec);
  if (ec) {
    error = fmt::format("{} is not an IP address (or localhost)", core::quoted(host, 100));
    return std::nullopt;
  }
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    error = fmt::format("port {} is not a number in 0..65535", core::quoted(port_text, 100));
    return std::nullopt;
  }
  const long port = std::strtol(std::string(port_text).c_str(), nullptr, 10);
  if (port > 65535) {
    error = fmt::format("port {} not in 0..65535", port);
    return std::nullopt;
  }
  return ListenAddress{std::move(host), static_cast<std::uint16_t>(port)};
}

}  // namespace fairgate::http
