// http/read.hpp — reading one request off a connection, within limits: the
// idle wait before it, a deadline for all of it (slowloris), caps on the
// header and the body (the body's may depend on the route), and
// `Expect: 100-continue`. What went wrong maps to one status (408, 413, 431,
// 400) so every server answers it the same way.
//
// Generic over the stream (beast::tcp_stream in the servers,
// beast::test::stream in tests/http). A deadline does not close the stream:
// it calls the `cancel` given (which must end the pending read), so the
// caller can still answer 408 on it.
#pragma once

#include "http/message.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace fairgate::http {

struct ReadLimits {
  std::size_t max_header_bytes = 8 * 1024;
  /// The widest body any route takes (a route may take less: BodyLimitFor).
  std::size_t max_body_bytes = 1024 * 1024;
  /// From the request's first byte to the end of its body.
  std::chrono::milliseconds request_timeout{10'000};
};

/// The body limit of a request, given its header (its route's limit).
using BodyLimitFor = std::function<std::size_t(const Request& header)>;

enum class ReadError {
  none,
  closed,            ///< the client went away (or the connection failed): nothing to answer
  timeout,           ///< 408: the request did not arrive within request_timeout
  header_too_large,  ///< 431
  body_too_large,    ///< 413 (Content-Length or the body read)
  malformed,         ///< 400: not HTTP
};

struct ReadResult {
  ReadError error = ReadError::none;
  /// The request; on an error, as much of its header as was parsed (the
  /// access log shows its method and target).
  Request request;
  /// The body limit that applied to it.
  std::size_t body_limit = 0;
  /// Beast's reason (the 400's detail).
  boost::system::error_code ec;
  /// What was wrong with a header that parsed (a 400's message in place of ec's): its framing
  /// or its Host (framing_problem).
  std::string problem;
};

/// Why a request whose header parsed cannot be served, or "" (RFC 9112): a
/// Transfer-Encoding other than chunked alone (its body's end is unknown: read
/// as no body, what follows would be taken for the next request, a smuggling
/// risk behind a proxy that frames it otherwise); no Host in HTTP/1.1, or more
/// than one. The connection closes after the 400.
std::string framing_problem(const boost::beast::http::request_header<>& header);

/// The origin form ("/path?query") of an absolute-form request target
/// ("http://host:port/path?query", RFC 9112 3.2.2: a server must accept it; "/" when it has no
/// path), which the routes match; nullopt for any other target (used as it is).
std::optional<std::string> origin_form(std::string_view target);

/// The status that answers `e` (0 for none and closed).
unsigned error_status(ReadError e) noexcept;
/// A short machine-readable reason: "request_timeout", "header_too_large", ...
std::string_view error_reason(ReadError e) noexcept;
/// A sentence for the client: "request body exceeds 65536 bytes", ...
std::string error_message(const ReadResult& r, const ReadLimits& limits);
/// How Beast's error `ec` (of a read that was not cut by the deadline) is classified.
ReadError classify(const boost::system::error_code& ec) noexcept;

namespace detail {

inline constexpr auto nothrow = boost::asio::as_tuple(boost::asio::use_awaitable);
using Parser = boost::beast::http::request_parser<boost::beast::http::string_body>;

template <class Stream>
boost::asio::awaitable<boost::system::error_code> read_parts(Stream& stream,
                                                             boost::beast::flat_buffer& buffer,
                                                             Parser& parser, const BodyLimitFor& limit_for,
                                                             std::size_t& limit, std::string& problem) {
  namespace bh = boost::beast::http;
  // Beast checks Content-Length against the body limit while it parses the
  // header, before the route is known: the header goes through with the
  // widest limit, then the request's own applies.
  parser.body_limit(limit);
  auto [hec, hn] = co_await bh::async_read_header(stream, buffer, parser, nothrow);
  // (A body over even the widest limit fails the header read, the header parsed.)
  if (const auto origin =
          origin_form(std::string_view(parser.get().target().data(), parser.get().target().size())))
    parser.get().target(*origin);
  if (limit_for && !parser.get().target().empty()) limit = limit_for(parser.get());
  if (hec) co_return hec;
  problem = framing_problem(parser.get().base());
  if (!problem.empty()) co_return bh::error::bad_transfer_encoding;  // answered with `problem`
  if (const auto length = parser.content_length(); length && *length > limit) co_return bh::error::body_limit;
  if (parser.is_done()) co_return hec;
  parser.body_limit(limit);
  // A client that waits for permission to send its body (curl does, for big ones) gets it at once.
  if (parser.get().version() >= 11 && boost::beast::iequals(parser.get()[field::expect], "100-continue")) {
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    auto [cec, cn] = co_await boost::asio::async_write(stream, boost::asio::buffer(kContinue), nothrow);
    if (cec) co_return cec;
  }
  auto [bec, bn] = co_await bh::async_read(stream, buffer, parser, nothrow);
  co_return bec;
}

/// Reads what is there (up to 4 KiB) into `buffer`. (A named coroutine, not a
/// lambda: g++ 12 may keep a lambda coroutine's closure in a stack slot that
/// does not outlive the co_await.)
template <class Stream>
boost::asio::awaitable<boost::system::error_code> read_some(Stream& stream,
                                                            boost::beast::flat_buffer& buffer) {
  auto [ec, n] = co_await stream.async_read_some(buffer.prepare(4096), nothrow);
  buffer.commit(n);
  co_return ec;
}

/// Completes after `after` (true), having called `cancel`; or early when cancelled itself (false).
boost::asio::awaitable<bool> deadline(std::chrono::milliseconds after, std::function<void()> cancel);

}  // namespace detail

/// Waits until the next request's first byte is in `buffer` (at once when
/// something is buffered already): false when the client closed the
/// connection, or sent nothing for `idle` (then `timed_out`).
template <class Stream>
boost::asio::awaitable<bool> wait_for_request(Stream& stream, boost::beast::flat_buffer& buffer,
                                              std::chrono::milliseconds idle, std::function<void()> cancel,
                                              bool& timed_out) {
  using namespace boost::asio::experimental::awaitable_operators;
  timed_out = false;
  if (buffer.size() > 0) co_return true;
  auto raced = co_await (detail::read_some(stream, buffer) || detail::deadline(idle, std::move(cancel)));
  if (raced.index() == 1) {
    timed_out = true;
    co_return false;
  }
  co_return !std::get<0>(raced) && buffer.size() > 0;
}

/// Reads one request (header, then body) from `stream` through `buffer`,
/// within `limits`; `cancel` must end a pending read on `stream`.
template <class Stream>
boost::asio::awaitable<ReadResult> read_request(Stream& stream, boost::beast::flat_buffer& buffer,
                                                const ReadLimits& limits, const BodyLimitFor& limit_for,
                                                std::function<void()> cancel) {
  using namespace boost::asio::experimental::awaitable_operators;
  detail::Parser parser;
  parser.header_limit(static_cast<std::uint32_t>(limits.max_header_bytes));
  ReadResult r;
  r.body_limit = limits.max_body_bytes;
  auto raced = co_await (detail::read_parts(stream, buffer, parser, limit_for, r.body_limit, r.problem) ||
                         detail::deadline(limits.request_timeout, std::move(cancel)));
  if (raced.index() == 1) {
    r.error = ReadError::timeout;
    r.ec = boost::beast::error::timeout;
  } else {
    r.ec = std::get<0>(raced);
    r.error = classify(r.ec);
  }
  if (r.error == ReadError::none) {
    r.request = parser.release();
  } else {
    r.request.base() = parser.get().base();
  }
  co_return r;
}

}  // namespace fairgate::http
