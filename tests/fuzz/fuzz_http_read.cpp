// tests/fuzz/fuzz_http_read.cpp — reading requests off a connection
// (src/http/read.hpp, on Beast's parser): any bytes give requests within the
// limits, or one of the documented errors (400, 413, 431) with a clear
// message — never a crash, and never a wait once the client has closed.
//
// Input: the bytes a client sends (several requests may be pipelined), then
// it closes. A target starting "/small" has a 16-byte body limit.
#include "fuzz/check.hpp"

#include "http/read.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/_experimental/test/stream.hpp>

#include <chrono>
#include <cstdint>
#include <optional>

namespace net = boost::asio;
namespace beast = boost::beast;
namespace fh = fairgate::http;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  net::io_context io;
  beast::test::stream server{io};
  beast::test::stream client{io};
  server.connect(client);
  net::write(client, net::buffer(data, size));
  client.close();

  const fh::ReadLimits limits{512, 256, std::chrono::seconds(30)};
  const fh::BodyLimitFor limit_for = [](const fh::Request& header) -> std::size_t {
    return header.target().starts_with("/small") ? 16 : 256;
  };
  beast::flat_buffer buffer;
  for (int i = 0; i < 16; ++i) {
    std::optional<fh::ReadResult> out;
    net::co_spawn(io, fh::read_request(server, buffer, limits, limit_for, [&] { server.close(); }),
                  [&](std::exception_ptr e, fh::ReadResult r) {
                    if (e) std::rethrow_exception(e);
                    out = std::move(r);
                  });
    io.run();
    io.restart();
    FUZZ_CHECK(out.has_value(), "read_request completed");
    FUZZ_CHECK(out->error != fh::ReadError::timeout, "no wait for a client that closed");
    if (out->error == fh::ReadError::none) {
      FUZZ_CHECK(out->request.body().size() <= out->body_limit, "the body within its route's limit");
      FUZZ_CHECK(out->body_limit <= limits.max_body_bytes, "no route limit above the widest");
      if (!out->request.keep_alive()) break;
      continue;
    }
    if (out->error == fh::ReadError::closed) break;
    const unsigned status = fh::error_status(out->error);
    FUZZ_CHECK(status == 400 || status == 413 || status == 431, "a documented status");
    FUZZ_CHECK(fairgate::fuzz::is_clear_message(fh::error_message(*out, limits)),
               fh::error_message(*out, limits));
    break;  // the server answers and closes
  }
  return 0;
}
