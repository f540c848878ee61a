// http/read.cpp — what a failed read answers (http/read.hpp).
#include "http/read.hpp"

#include <fmt/format.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fairgate::http {

namespace bh = boost::beast::http;

unsigned error_status(ReadError e) noexcept {
  switch (e) {
    case ReadError::timeout: return 408;
    case ReadError::header_too_large: return 431;
    case ReadError::body_too_large: return 413;
    case ReadError::malformed: return 400;
    case ReadError::none:
    case ReadError::closed: return 0;
  }
  return 0;
}

std::string_view error_reason(ReadError e) noexcept {
  switch (e) {
    case ReadError::timeout: return "request_timeout";
    case ReadError::header_too_large: return "header_too_large";
    case ReadError::body_too_large: return "body_too_large";
    case ReadError::malformed: return "bad_request";
    case ReadError::none:
    case ReadError::closed: return "";
  }
  return "";
}

std::string error_message(const ReadResult& r, const ReadLimits& limits) {
  switch (r.error) {
    case ReadError::timeout: return "the request did not arrive in time";
    case ReadError::header_too_large:
      return fmt::format("request headers exceed {} bytes", limits.max_header_bytes);
    case ReadError::body_too_large: return fmt::format("request body exceeds {} bytes", r.body_limit);
    case ReadError::malformed:
      return fmt::format("malformed HTTP request: {}", r.problem.empty() ? r.ec.message() : r.problem);
    case ReadError::none:
    case ReadError::closed: return "";
  }
  return "";
}

ReadError classify(const boost::system::error_code& ec) noexcept {
  if (!ec) return ReadError::none;
  if (ec == bh::error::header_limit) return ReadError::header_too_large;
  if (ec == bh::error::body_limit) return ReadError::body_too_large;
  if (ec == boost::beast::error::timeout) return ReadError::timeout;
  // The client left before a whole request (or between two): nothing to answer.
  if (ec == bh::error::end_of_stream || ec == bh::error::partial_message) return ReadError::closed;
  if (ec.category() == make_error_code(bh::error::bad_target).category()) return ReadError::malformed;
  return ReadError::closed;
}

std::string framing_problem(const bh::request_header<>& header) {
  // Every Transfer-Encoding line, as one list of codings (empty elements skipped, RFC 9110 5.6.1;
  // parameters kept: chunked has none, so "chunked;x=1" is not chunked alone).
  std::vector<std::string_view> codings;
  for (auto [it, end] = header.equal_range(bh::field::transfer_encoding); it != end; ++it) {
    const auto line = list_elements(std::string_view(it->value().data(), it->value().size()));
    codings.insert(codings.end(), line.begin(), line.end());
  }
  if (header.count(bh::field::transfer_encoding) > 0) {
    if (codings.size() != 1 || !boost::beast::iequals(codings.front(), "chunked"))
      return "Transfer-Encoding must be chunked alone (other codings are not supported)";
  }
  const auto hosts = header.count(bh::field::host);
  if (hosts > 1) return "more than one Host header";
  if (hosts == 0 && header.version() >= 11) return "an HTTP/1.1 request needs a Host header";
  return {};
}

std::optional<std::string> origin_form(std::string_view target) {
  std::string_view rest;
  for (const std::string_view scheme : {"http://", "https://"}) {
    if (target.size() >= scheme.size() && boost::beast::iequals(target.substr(0, scheme.size()), scheme)) {
      rest = target.substr(scheme.size());
      break;
    }
  }
  const auto path = rest.find_first_of("/?");
  // Origin form (or asterisk form, or not a target); or no host, which an http URI must have
  // (RFC 9110 4.2.1): left as it is, a 400 for not starting with '/'.
  if (rest.empty() || path == 0) return std::nullopt;
  if (path == std::string_view::npos) return std::string("/");
  if (rest[path] == '?') return "/" + std::string(rest.substr(path));
  return std::string(rest.substr(path));
}

namespace detail {

boost::asio::awaitable<bool> deadline(std::chrono::milliseconds after, std::function<void()> cancel) {
  boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor, after);
  auto [ec] = co_await timer.async_wait(nothrow);
  if (ec) co_return false;  // cancelled: the other side of the race finished first
  if (cancel) cancel();
  co_return true;
}

}  // namespace detail
}  // namespace fairgate::http
