// http/client.cpp — connecting and reading answers (http/client.hpp).
#include "http/client.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <fmt/format.h>

namespace fairgate::http {

namespace net = boost::asio;
namespace bh = boost::beast::http;
using tcp = net::ip::tcp;

namespace {
constexpr auto nothrow = net::as_tuple(net::use_awaitable);
}  // namespace

net::awaitable<std::string> connect(boost::beast::tcp_stream& stream, std::string_view host,
                                    std::string_view port, std::chrono::steady_clock::duration timeout,
                                    std::string_view name) {
  tcp::resolver resolver(stream.get_executor());
  auto [rec, endpoints] = co_await resolver.async_resolve(host, port, nothrow);
  if (rec) co_return fmt::format("cannot resolve {}: {}", host, rec.message());
  stream.expires_after(timeout);
  auto [cec, ep] = co_await stream.async_connect(endpoints, nothrow);
  stream.expires_never();
  if (cec) co_return fmt::format("cannot reach {}: {}", name, cec.message());
  co_return std::string();
}

net::awaitable<std::string> connect(boost::beast::tcp_stream& stream, const tcp::endpoint& endpoint,
                                    std::chrono::steady_clock::duration timeout) {
  stream.expires_after(timeout);
  auto [ec] = co_await stream.async_connect(endpoint, nothrow);
  stream.expires_never();
  if (ec) co_return fmt::format("cannot reach {}: {}", endpoint.address().to_string(), ec.message());
  co_return std::string();
}

net::awaitable<Fetched> fetch(boost::beast::tcp_stream& stream, const Request& req, std::size_t body_limit,
                              std::chrono::steady_clock::duration timeout) {
  Fetched out;
  stream.expires_after(timeout);
  auto [wec, w] = co_await bh::async_write(stream, req, nothrow);
  if (wec) {
    out.error = wec.message();
    co_return out;
  }
  boost::beast::flat_buffer buffer;
  bh::response_parser<bh::string_body> parser;
  parser.body_limit(body_limit);
  stream.expires_after(timeout);
  auto [rec, r] = co_await bh::async_read(stream, buffer, parser, nothrow);
  stream.expires_never();
  if (rec) {
    out.error = rec.message();
    co_return out;
  }
  out.status = parser.get().result_int();
  out.body = std::move(parser.get().body());
  co_return out;
}

net::awaitable<boost::system::error_code> StreamedResponse::start(
    boost::beast::tcp_stream& stream, const Request& req, std::chrono::steady_clock::duration timeout) {
  parser_.body_limit(boost::none);
  stream.expires_after(timeout);
  auto [wec, w] = co_await bh::async_write(stream, req, nothrow);
  if (wec) co_return wec;
  stream.expires_after(timeout);
  auto [hec, hn] = co_await bh::async_read_header(stream, buffer_, parser_, nothrow);
  stream.expires_never();
  co_return hec;
}

std::string_view StreamedResponse::header(field f) const {
  const auto v = parser_.get()[f];
  return std::string_view(v.data(), v.size());
}

net::awaitable<boost::system::error_code> StreamedResponse::next(boost::beast::tcp_stream& stream,
                                                                 std::chrono::steady_clock::duration silence,
                                                                 std::string_view& piece) {
  piece = {};
  if (parser_.is_done()) co_return boost::system::error_code();
  parser_.get().body().data = chunk_.data();
  parser_.get().body().size = chunk_.size();
  stream.expires_after(silence);
  auto [ec, n] = co_await bh::async_read_some(stream, buffer_, parser_, nothrow);
  stream.expires_never();
  piece = std::string_view(chunk_.data(), chunk_.size() - parser_.get().body().size);
  if (ec == bh::error::need_buffer) ec = {};
  co_return ec;
}

}  // namespace fairgate::http
