// http/write.hpp — writing an answer, for the servers of fairgate (serve,
// mock-llm): the answer to a HEAD is its header alone (RFC 9110, 9.3.2).
#pragma once

#include "http/message.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/http/serializer.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/system/error_code.hpp>

#include <tuple>

namespace fairgate::http {

/// Writes `res` on `stream`. For the answer to a HEAD (`head_only`), its
/// header alone, with the Content-Length of the body a GET would have had.
template <class Stream>
boost::asio::awaitable<boost::system::error_code> write_response(Stream& stream, Response& res,
                                                                 bool head_only) {
  constexpr auto nothrow = boost::asio::as_tuple(boost::asio::use_awaitable);
  boost::system::error_code ec;
  if (head_only) {
    res.content_length(res.body().size());
    boost::beast::http::response_serializer<boost::beast::http::string_body> sr{res};
    std::tie(ec, std::ignore) = co_await boost::beast::http::async_write_header(stream, sr, nothrow);
  } else {
    std::tie(ec, std::ignore) = co_await boost::beast::http::async_write(stream, res, nothrow);
  }
  co_return ec;
}

}  // namespace fairgate::http
