// http/client.hpp — the client side: connecting, one request with its whole
// answer, and an answer read piece by piece (event streams, token streams).
// Used by the commands that talk to a fairgate server (`fairgate top`,
// `fairgate demo`). Every step has a deadline; a failure is a sentence
// naming what failed, never an exception.
#pragma once

#include "http/message.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

namespace fairgate::http {

/// Resolves `host` and connects `stream` to it on `port` within `timeout`:
/// empty on success, else why not ("cannot reach NAME: Connection refused",
/// NAME being `name`, e.g. the URL the user gave).
boost::asio::awaitable<std::string> connect(boost::beast::tcp_stream& stream, std::string_view host,
                                            std::string_view port,
                                            std::chrono::steady_clock::duration timeout,
                                            std::string_view name);

/// Connects `stream` to `endpoint` within `timeout`: empty on success, else why not.
boost::asio::awaitable<std::string> connect(boost::beast::tcp_stream& stream,
                                            const boost::asio::ip::tcp::endpoint& endpoint,
                                            std::chrono::steady_clock::duration timeout);

struct Fetched {
  unsigned status = 0;  ///< 0: no answer (see error)
  std::string body;
  std::string error;
};

/// Writes `req` on the connected `stream` and reads the whole answer (a body
/// over `body_limit` is an error), each within `timeout`.
boost::asio::awaitable<Fetched> fetch(boost::beast::tcp_stream& stream, const Request& req,
                                      std::size_t body_limit, std::chrono::steady_clock::duration timeout);

/// An answer whose body is read as it arrives.
class StreamedResponse {
 public:
  /// Writes `req` on the connected `stream` and reads the answer's header,
  /// each within `timeout`; an error code when either failed.
  boost::asio::awaitable<boost::system::error_code> start(boost::beast::tcp_stream& stream,
                                                          const Request& req,
                                                          std::chrono::steady_clock::duration timeout);
  unsigned status() const { return parser_.get().result_int(); }
  std::string_view header(field f) const;
  bool event_stream() const { return header(field::content_type).starts_with("text/event-stream"); }
  bool done() const { return parser_.is_done(); }

  /// Reads what arrives next (waiting up to `silence`) into `piece` (empty at
  /// the end of the body); an error code when the read failed or timed out.
  boost::asio::awaitable<boost::system::error_code> next(boost::beast::tcp_stream& stream,
                                                         std::chrono::steady_clock::duration silence,
                                                         std::string_view& piece);

 private:
  boost::beast::flat_buffer buffer_;
  boost::beast::http::response_parser<boost::beast::http::buffer_body> parser_;
  std::array<char, 8192> chunk_{};
};

}  // namespace fairgate::http
