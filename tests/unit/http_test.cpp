// tests/unit/http_test.cpp — the HTTP layer (src/http) over beast::test::stream:
// request framing, the header/body limits and what they answer (431, 413,
// 408, 400), 100-continue, the idle wait, route patterns, SSE both ways.
#include "core/text.hpp"
#include "http/address.hpp"
#include "http/client.hpp"
#include "http/listener.hpp"
#include "http/message.hpp"
#include "http/pool.hpp"
#include "http/read.hpp"
#include "http/router.hpp"
#include "http/sse.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/_experimental/test/stream.hpp>
#include <boost/json.hpp>

#include <gtest/gtest.h>

#include <array>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace fh = fairgate::http;
using namespace std::chrono_literals;

/// A test stream (what the server reads) connected to the client's end.
struct Pipe {
  net::io_context io;
  beast::test::stream server{io};
  beast::test::stream client{io};
  beast::flat_buffer buffer;
  Pipe() { server.connect(client); }

  /// Runs read_request to its end (the io_context runs until nothing is left).
  fh::ReadResult read(const fh::ReadLimits& limits, fh::BodyLimitFor limit_for = {}) {
    std::optional<fh::ReadResult> out;
    net::co_spawn(io, fh::read_request(server, buffer, limits, limit_for, [this] { server.close(); }),
                  [&](std::exception_ptr e, fh::ReadResult r) {
                    if (e) std::rethrow_exception(e);
                    out = std::move(r);
                  });
    io.run_for(5s);
    io.restart();
    EXPECT_TRUE(out.has_value()) << "read_request did not complete";
    return out.value_or(fh::ReadResult{});
  }
};

fh::ReadLimits limits(std::size_t header = 1024, std::size_t body = 1024,
                      std::chrono::milliseconds timeout = 2000ms) {
  return fh::ReadLimits{header, body, timeout};
}

// --listen HOST:PORT, for fairgate serve and fairgate mock-llm alike.
TEST(HttpListen, ABarePortIsLoopbackAndEveryInterfaceIsAskedFor) {
  std::string error;
  const auto host = [&](std::string_view text) {
    const auto a = fairgate::http::parse_listen(text, error);
    return a ? a->host + " " + std::to_string(a->port) : "error: " + error;
  };
  EXPECT_EQ(host(":9000"), "127.0.0.1 9000");
  EXPECT_EQ(host("localhost:0"), "127.0.0.1 0");
  EXPECT_EQ(host("*:9000"), "0.0.0.0 9000");
  EXPECT_EQ(host("0.0.0.0:9000"), "0.0.0.0 9000");
  EXPECT_EQ(host("[::1]:80"), "::1 80");
  EXPECT_EQ(host("10.1.2.3:65535"), "10.1.2.3 65535");
  EXPECT_EQ(host("nowhere"), "error: \"nowhere\" is not HOST:PORT (e.g. 127.0.0.1:8080)");
  EXPECT_EQ(host("example.com:80"), "error: \"example.com\" is not an IP address (or localhost)");
  EXPECT_EQ(host("127.0.0.1:"), "error: port \"\" is not a number in 0..65535");
  EXPECT_EQ(host("127.0.0.1:70000"), "error: port 70000 not in 0..65535");
}

TEST(HttpRead, ARequestWithItsBodyAndAPipelinedOneAfterIt) {
  Pipe p;
  p.server.append(
      "POST /v1/x HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
      "GET /two HTTP/1.1\r\nHost: h\r\n\r\n");
  auto first = p.read(limits());
  ASSERT_EQ(first.error, fh::ReadError::none) << first.ec.message();
  EXPECT_EQ(first.request.method(), fh::verb::post);
  EXPECT_EQ(first.request.target(), "/v1/x");
  EXPECT_EQ(first.request.body(), "hello");
  auto second = p.read(limits());
  ASSERT_EQ(second.error, fh::ReadError::none) << second.ec.message();
  EXPECT_EQ(second.request.target(), "/two");
  EXPECT_TRUE(second.request.body().empty());
}

TEST(HttpRead, AChunkedBodyIsAssembled) {
  Pipe p;
  p.server.append(
      "POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
  auto r = p.read(limits());
  ASSERT_EQ(r.error, fh::ReadError::none) << r.ec.message();
  EXPECT_EQ(r.request.body(), "abcde");
}

TEST(HttpRead, AHeaderOverTheLimitIs431) {
  Pipe p;
  p.server.append("GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + std::string(2000, 'a') + "\r\n\r\n");
  auto r = p.read(limits(1024));
  EXPECT_EQ(r.error, fh::ReadError::header_too_large);
  EXPECT_EQ(fh::error_status(r.error), 431u);
  EXPECT_EQ(fh::error_reason(r.error), "header_too_large");
  EXPECT_EQ(fh::error_message(r, limits(1024)), "request headers exceed 1024 bytes");
}

TEST(HttpRead, AContentLengthOverTheRoutesLimitIs413BeforeTheBodyIsSent) {
  Pipe p;
  // Only the header arrives: the answer must not wait for a body it will refuse.
  p.server.append("POST /small HTTP/1.1\r\nHost: h\r\nContent-Length: 500\r\n\r\n");
  const auto route_limit = [](const fh::Request& header) -> std::size_t {
    return header.target() == "/small" ? 100 : 4096;
  };
  auto r = p.read(limits(1024, 4096), route_limit);
  EXPECT_EQ(r.error, fh::ReadError::body_too_large);
  EXPECT_EQ(r.body_limit, 100u);
  EXPECT_EQ(fh::error_status(r.error), 413u);
  EXPECT_EQ(fh::error_message(r, limits()), "request body exceeds 100 bytes");
  EXPECT_EQ(r.request.target(), "/small");  // the header is kept for the log
}

TEST(HttpRead, AWiderRouteTakesABodyOverTheDefaultLimit) {
  Pipe p;
  const std::string body(3000, 'x');
  p.server.append("POST /big HTTP/1.1\r\nHost: h\r\nContent-Length: 3000\r\n\r\n" + body);
  const auto route_limit = [](const fh::Request& header) -> std::size_t {
    return header.target() == "/big" ? 4096 : 100;
  };
  auto r = p.read(limits(1024, 4096), route_limit);
  ASSERT_EQ(r.error, fh::ReadError::none) << r.ec.message();
  EXPECT_EQ(r.request.body(), body);
}

TEST(HttpRead, AChunkedBodyOverTheLimitIs413) {
  Pipe p;
  std::string req = "POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 20; ++i) req += "10\r\n" + std::string(16, 'z') + "\r\n";
  req += "0\r\n\r\n";
  p.server.append(req);
  auto r = p.read(limits(1024, 100));
  EXPECT_EQ(r.error, fh::ReadError::body_too_large);
}

TEST(HttpRead, ARequestThatDoesNotArriveInTimeIs408) {
  Pipe p;
  p.server.append("GET / HTTP/1.1\r\nHost: h\r\n");  // never finished
  const auto l = limits(1024, 1024, 50ms);
  auto r = p.read(l);
  EXPECT_EQ(r.error, fh::ReadError::timeout);
  EXPECT_EQ(fh::error_status(r.error), 408u);
  EXPECT_EQ(fh::error_message(r, l), "the request did not arrive in time");
}

TEST(HttpRead, GarbageIs400AndALeavingClientIsNotAnswered) {
  {
    Pipe p;
    p.server.append("THIS IS NOT HTTP\r\n\r\n");
    auto r = p.read(limits());
    EXPECT_EQ(r.error, fh::ReadError::malformed);
    EXPECT_EQ(fh::error_status(r.error), 400u);
  }
  {
    Pipe p;
    p.server.append("GET / HTTP/1.1\r\nHo");
    p.client.close();  // half a request, then gone
    auto r = p.read(limits());
    EXPECT_EQ(r.error, fh::ReadError::closed);
    EXPECT_EQ(fh::error_status(r.error), 0u);
  }
}

// RFC 9112: a body framed by anything but chunked alone has no end the server
// knows (it was read as no body, and its bytes as the next request: a
// smuggling risk behind a proxy that frames it otherwise), and an HTTP/1.1
// request has exactly one Host. Each is a 400 naming the problem, before any
// body is read.
TEST(HttpRead, OnlyChunkedAloneFramesABodyAndHttp11NeedsOneHost) {
  for (const auto& [header, problem] : std::vector<std::pair<std::string, std::string>>{
           {"Host: h\r\nTransfer-Encoding: gzip\r\n", "Transfer-Encoding must be chunked alone"},
           {"Host: h\r\nTransfer-Encoding: identity\r\n", "Transfer-Encoding must be chunked alone"},
           {"Host: h\r\nTransfer-Encoding: xchunked\r\n", "Transfer-Encoding must be chunked alone"},
           {"Host: h\r\nTransfer-Encoding: chunked, identity\r\n", "Transfer-Encoding must be chunked alone"},
           {"Host: h\r\nTransfer-Encoding: gzip, chunked\r\n", "Transfer-Encoding must be chunked alone"},
           {"Host: h\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding must be chunked alone"},
           // chunked has no parameters (RFC 9112 7.1): one given is another coding's framing
           {"Host: h\r\nTransfer-Encoding: chunked;x=1\r\n", "Transfer-Encoding must be chunked alone"},
           {"Host: h\r\nTransfer-Encoding: chunked ; q=0\r\n", "Transfer-Encoding must be chunked alone"},
           {"", "an HTTP/1.1 request needs a Host header"},
           {"Host: a\r\nHost: b\r\n", "more than one Host header"}}) {
    Pipe p;
    p.server.append("POST /v1/x HTTP/1.1\r\n" + header + "\r\nGET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n");
    auto r = p.read(limits());
    EXPECT_EQ(r.error, fh::ReadError::malformed) << header;
    EXPECT_EQ(fh::error_status(r.error), 400u) << header;
    EXPECT_EQ(fh::error_message(r, limits()).rfind("malformed HTTP request: " + problem, 0), 0u)
        << header << fh::error_message(r, limits());
  }
  for (const std::string ok :
       {"GET / HTTP/1.1\r\nHost: h\r\n\r\n", "GET / HTTP/1.0\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\n\r\n0\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: , chunked ,\r\n\r\n0\r\n\r\n"}) {
    Pipe p;
    p.server.append(ok);
    auto r = p.read(limits());
    EXPECT_EQ(r.error, fh::ReadError::none) << ok << r.ec.message();
  }
}

// RFC 9112 3.2.2: a server accepts a target in absolute form (what a client set up for a
// forward proxy sends). The routes see its origin form: the path and the query.
TEST(HttpRead, AnAbsoluteFormTargetIsReadAsItsPathAndQuery) {
  for (const auto& [target, origin] : std::vector<std::pair<std::string, std::string>>{
           {"http://h:8080/v1/limiters/chat?x=1", "/v1/limiters/chat?x=1"},
           {"HTTPS://h/healthz", "/healthz"},
           {"http://h", "/"},
           {"http://h?x=1", "/?x=1"},
           {"http://user@h:1/a/b", "/a/b"},
           {"/already/origin?q", "/already/origin?q"},
           {"*", "*"}}) {
    Pipe p;
    p.server.append("GET " + target + " HTTP/1.1\r\nHost: h\r\n\r\n");
    auto r = p.read(limits());
    ASSERT_EQ(r.error, fh::ReadError::none) << target << r.ec.message();
    EXPECT_EQ(std::string(r.request.target()), origin) << target;
  }
  EXPECT_FALSE(fh::origin_form("/x").has_value());
  EXPECT_FALSE(fh::origin_form("httpx://h/x").has_value());
  EXPECT_FALSE(fh::origin_form("http:///healthz").has_value()) << "no host: not taken";
  EXPECT_FALSE(fh::origin_form("http://?x").has_value());
}

TEST(HttpRead, ExpectContinueGetsA100ThenTheBody) {
  Pipe p;
  p.server.append("PUT /u HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n");
  std::optional<fh::ReadResult> out;
  net::co_spawn(p.io, fh::read_request(p.server, p.buffer, limits(), {}, [&] { p.server.close(); }),
                [&](std::exception_ptr, fh::ReadResult r) { out = std::move(r); });
  p.io.run_for(100ms);  // the read now waits for the body
  EXPECT_FALSE(out.has_value());
  EXPECT_EQ(p.client.str(), "HTTP/1.1 100 Continue\r\n\r\n");
  net::write(p.client, net::buffer(std::string("data")));
  p.io.restart();
  p.io.run_for(2s);
  ASSERT_TRUE(out.has_value());
  ASSERT_EQ(out->error, fh::ReadError::none) << out->ec.message();
  EXPECT_EQ(out->request.body(), "data");
}

TEST(HttpRead, TheIdleWaitEndsOnDataOrAfterItsTime) {
  Pipe p;
  bool timed_out = true;
  std::optional<bool> got;
  const auto wait = [&] {
    got.reset();
    net::co_spawn(p.io,
                  fh::wait_for_request(
                      p.server, p.buffer, 50ms, [&] { p.server.close(); }, timed_out),
                  [&](std::exception_ptr, bool b) { got = b; });
    p.io.run_for(2s);
    p.io.restart();
  };
  p.server.append("G");
  wait();
  EXPECT_EQ(got, true);
  EXPECT_FALSE(timed_out);
  p.buffer.consume(p.buffer.size());
  wait();  // nothing more comes
  EXPECT_EQ(got, false);
  EXPECT_TRUE(timed_out);
}

TEST(HttpListener, AcceptsUntilFullThenAnswersBusyAndStopsWhenClosed) {
  // Real loopback sockets: the loop is about the OS's accept.
  net::io_context io;
  net::ip::tcp::acceptor acceptor(net::make_strand(io), {net::ip::make_address("127.0.0.1"), 0});
  std::vector<net::ip::tcp::socket> kept;
  int refused = 0;
  bool ended = false;
  fh::ListenerHooks hooks;
  hooks.full = [&] { return kept.size() >= 1; };
  hooks.refused = [&] { ++refused; };
  hooks.accepted = [&](net::ip::tcp::socket s) { kept.push_back(std::move(s)); };
  hooks.busy = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  net::co_spawn(acceptor.get_executor(), fh::accept_loop(acceptor, io.get_executor(), hooks),
                [&](std::exception_ptr) { ended = true; });
  const auto endpoint = acceptor.local_endpoint();
  net::ip::tcp::socket first(io), second(io);
  first.connect(endpoint);
  io.run_for(200ms);
  ASSERT_EQ(kept.size(), 1u);
  net::ip::tcp::no_delay nodelay;
  kept[0].get_option(nodelay);
  EXPECT_TRUE(nodelay.value());
  second.connect(endpoint);
  io.restart();
  io.run_for(200ms);
  std::string answer(128, '\0');
  boost::system::error_code ec;
  const std::size_t n = net::read(second, net::buffer(answer), ec);  // until the server closes
  answer.resize(n);
  EXPECT_EQ(answer, hooks.busy);
  EXPECT_EQ(refused, 1);
  EXPECT_EQ(kept.size(), 1u);
  net::post(acceptor.get_executor(), [&] { acceptor.close(); });
  io.restart();
  io.run_for(1s);
  EXPECT_TRUE(ended);
}

/// A one-connection server on loopback: answers one request with `answer`, written in two parts.
net::awaitable<void> answer_once(net::ip::tcp::acceptor& acceptor, std::string first, std::string second) {
  auto socket = co_await acceptor.async_accept(net::use_awaitable);
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  auto read = co_await fh::read_request(stream, buffer, fh::ReadLimits{}, {}, [] {});
  if (read.error != fh::ReadError::none) co_return;
  co_await net::async_write(stream, net::buffer(first), net::use_awaitable);
  net::steady_timer pause(stream.get_executor(), 20ms);
  co_await pause.async_wait(net::use_awaitable);
  co_await net::async_write(stream, net::buffer(second), net::use_awaitable);
  stream.socket().shutdown(net::ip::tcp::socket::shutdown_send);
}

TEST(HttpClient, FetchAWholeAnswerAndStreamAnEventStream) {
  net::io_context io;
  net::ip::tcp::acceptor acceptor(io, {net::ip::make_address("127.0.0.1"), 0});
  const std::string port = std::to_string(acceptor.local_endpoint().port());
  std::string failed = "not run";
  std::vector<fh::SseEvent> events;
  fh::Fetched whole;
  const auto get = [&](std::string target) {
    fh::Request req{fh::verb::get, std::move(target), 11};
    req.set(fh::field::host,
            "127.0.0.1:" + port);  // the test server reads it as fairgate does: HTTP/1.1 needs one
    return req;
  };
  const auto client = [&]() -> net::awaitable<void> {
    {
      beast::tcp_stream stream(io);
      failed = co_await fh::connect(stream, "127.0.0.1", port, 2s, "the test server");
      if (!failed.empty()) co_return;
      whole = co_await fh::fetch(stream, get("/x"), 1024, 2s);
    }
    beast::tcp_stream stream(io);
    failed = co_await fh::connect(stream, acceptor.local_endpoint(), 2s);
    if (!failed.empty()) co_return;
    fh::StreamedResponse res;
    if (auto ec = co_await res.start(stream, get("/events"), 2s)) {
      failed = ec.message();
      co_return;
    }
    EXPECT_EQ(res.status(), 200u);
    EXPECT_TRUE(res.event_stream());
    fh::SseReader reader;
    while (!res.done()) {
      std::string_view piece;
      if (auto ec = co_await res.next(stream, 2s, piece)) {
        failed = ec.message();
        co_return;
      }
      reader.feed(piece, [&](const fh::SseEvent& e) { events.push_back(e); });
    }
  };
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        co_await answer_once(acceptor, "HTTP/1.1 201 Created\r\nContent-Length: 5\r\n\r\nhe", "llo");
        co_await answer_once(acceptor,
                             "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\nevent: a\ndata: 1\n",
                             "\nevent: b\ndata: 2\n\n");
      },
      net::detached);
  net::co_spawn(io, client(), net::detached);
  io.run_for(5s);
  EXPECT_EQ(failed, "");
  EXPECT_EQ(whole.status, 201u);
  EXPECT_EQ(whole.body, "hello");
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].name, "a");
  EXPECT_EQ(events[1].data, "2");

  // Nobody listens there now: the error names what the caller called it.
  acceptor.close();
  std::string refused;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        beast::tcp_stream stream(io);
        refused = co_await fh::connect(stream, "127.0.0.1", port, 2s, "http://127.0.0.1:" + port);
      },
      net::detached);
  io.restart();
  io.run_for(5s);
  EXPECT_EQ(refused, "cannot reach http://127.0.0.1:" + port + ": Connection refused");
}

TEST(HttpPool, KeepsLiveConnectionsUpToItsCapacityAndDropsClosedOnes) {
  net::io_context io;
  net::ip::tcp::acceptor acceptor(io, {net::ip::make_address("127.0.0.1"), 0});
  // Pairs of connected sockets: the pool holds the client ends.
  const auto pair = [&] {
    net::ip::tcp::socket client(io);
    client.connect(acceptor.local_endpoint());
    net::ip::tcp::socket server = acceptor.accept();
    return std::make_pair(std::move(client), std::move(server));
  };
  fh::ConnectionPool pool(2);
  auto [c1, s1] = pair();
  auto [c2, s2] = pair();
  auto [c3, s3] = pair();
  const auto port_of = [](const net::ip::tcp::socket& c) { return c.local_endpoint().port(); };
  const auto p2 = port_of(c2), p3 = port_of(c3);
  pool.put(std::move(c1));
  pool.put(std::move(c2));
  pool.put(std::move(c3));  // over capacity: the oldest (c1) is closed
  EXPECT_EQ(pool.idle(), 2u);
  s3.close();  // the server closed c3's connection meanwhile
  io.run_for(50ms);
  auto taken = pool.take(io.get_executor());  // c3 (most recent) is dead: dropped, c2 comes back
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(port_of(*taken), p2);
  EXPECT_NE(port_of(*taken), p3);
  EXPECT_EQ(pool.idle(), 0u);
  EXPECT_FALSE(pool.take(io.get_executor()).has_value());
  // The one given back still talks to its server.
  net::write(*taken, net::buffer(std::string("ping")));
  std::array<char, 4> got{};
  net::read(s2, net::buffer(got));
  EXPECT_EQ(std::string(got.data(), 4), "ping");
  // c1 was closed by the pool: its server sees the end.
  boost::system::error_code ec;
  s1.read_some(net::buffer(got), ec);
  EXPECT_EQ(ec, net::error::eof);

  fh::ConnectionPool none(0);
  auto [c4, s4] = pair();
  none.put(std::move(c4));
  EXPECT_EQ(none.idle(), 0u);

  // The count is of live connections: one the server closed is dropped (and
  // closed) by idle() itself, before any take().
  fh::ConnectionPool counted(4);
  auto [c5, s5] = pair();
  auto [c6, s6] = pair();
  counted.put(std::move(c5));
  counted.put(std::move(c6));
  EXPECT_EQ(counted.idle(), 2u);
  s5.close();
  io.run_for(50ms);
  EXPECT_EQ(counted.idle(), 1u);
}

TEST(HttpRouter, PatternsMatchWholeSegmentsAndCollectParams) {
  std::vector<std::string> params;
  EXPECT_TRUE(
      fh::match_pattern("/v1/limiters/{name}/acquire", {"v1", "limiters", "chat", "acquire"}, params));
  EXPECT_EQ(params, std::vector<std::string>{"chat"});
  EXPECT_FALSE(fh::match_pattern("/v1/limiters/{name}", {"v1", "limiters", "chat", "acquire"}, params));
  EXPECT_TRUE(params.empty());
  EXPECT_FALSE(fh::match_pattern("/v1/limiters/{name}", {"v1", "limiters"}, params));
  EXPECT_FALSE(fh::match_pattern("/healthz", {"healthy"}, params));
  EXPECT_TRUE(fh::match_pattern("/", {}, params));

  struct Spec {
    int id;
    std::string_view pattern;
  };
  const std::array<Spec, 3> table{{{1, "/a/{x}"}, {2, "/a/{x}/b"}, {3, "/a/fixed"}}};
  const Spec* hit = fh::match_route(table, {"a", "q", "b"}, params);
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->id, 2);
  EXPECT_EQ(params, std::vector<std::string>{"q"});
  hit = fh::match_route(table, {"a", "fixed"}, params);
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->id, 1);  // the first match wins
  EXPECT_EQ(fh::match_route(table, {"b"}, params), nullptr);

  EXPECT_TRUE(fh::method_listed("GET, PUT", "PUT"));
  EXPECT_TRUE(fh::method_listed("GET", "GET"));
  EXPECT_FALSE(fh::method_listed("GET, PUT", "POST"));
  EXPECT_FALSE(fh::method_listed("GET, PUT", "GE"));
}

TEST(HttpMessage, AFieldOnSeveralLinesIsOneList) {
  fh::Request req{fh::verb::get, "/", 11};
  EXPECT_EQ(fh::field_list(req, "X-Forwarded-For"), "");
  req.insert("X-Forwarded-For", "198.51.100.9");
  req.insert("Accept", "*/*");
  req.insert("x-forwarded-for", "203.0.113.7, 10.0.0.1");
  EXPECT_EQ(fh::field_list(req, "X-Forwarded-For"), "198.51.100.9, 203.0.113.7, 10.0.0.1");
}

// Outside bytes echoed in JSON: each byte that is not part of well-formed
// UTF-8 becomes U+FFFD; well-formed text (1 to 4 bytes) is kept as it is.
TEST(HttpMessage, TextIsMadeValidUtf8ByteByByte) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(fairgate::core::valid_utf8("plain ascii"), "plain ascii");
  EXPECT_EQ(fairgate::core::valid_utf8("\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  EXPECT_EQ(fairgate::core::valid_utf8("a\xFF\xFE"
                                       "b"),
            "a" + r + r + "b");
  EXPECT_EQ(fairgate::core::valid_utf8("\xC0\xAF"), r + r);                  // overlong '/'
  EXPECT_EQ(fairgate::core::valid_utf8("\xE0\x80\xAF"), r + r + r);          // overlong, 3 bytes
  EXPECT_EQ(fairgate::core::valid_utf8("\xED\xA0\x80"), r + r + r);          // a surrogate
  EXPECT_EQ(fairgate::core::valid_utf8("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(fairgate::core::valid_utf8("x\xE2\x82"), "x" + r + r);           // cut short
}

TEST(HttpMessage, AnswersKeepTheRequestsVersionAndKeepAlive) {
  fh::Request req{fh::verb::get, "/", 10};
  req.keep_alive(false);
  boost::json::object o;
  o["a"] = 1;
  const fh::Response res = fh::json_response(fh::status::created, req, o, "srv");
  EXPECT_EQ(res.version(), 10u);
  EXPECT_FALSE(res.keep_alive());
  EXPECT_EQ(res.body(), "{\"a\":1}\n");
  EXPECT_EQ(res[fh::field::content_type], "application/json");
  EXPECT_EQ(res[fh::field::server], "srv");
  EXPECT_EQ(res[fh::field::content_length], "8");
}

TEST(HttpSse, EventsAreFramedLineByLineAndReadBack) {
  EXPECT_EQ(fh::sse_event("queued", "{\"p\":1}"), "event: queued\ndata: {\"p\":1}\n\n");
  EXPECT_EQ(fh::sse_event("", "a\nb"), "data: a\ndata: b\n\n");
  EXPECT_EQ(fh::sse_comment("keepalive"), ": keepalive\n\n");

  const std::string stream = fh::sse_event("one", "x\ny") + fh::sse_comment("ping") +
                             "event: two\r\ndata: z\r\n\r\n" + fh::sse_event("", "plain");
  fh::SseReader reader;
  std::vector<fh::SseEvent> got;
  for (char ch : stream)  // one byte at a time: events cut anywhere
    reader.feed(std::string_view(&ch, 1), [&](const fh::SseEvent& e) { got.push_back(e); });
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].name, "one");
  EXPECT_EQ(got[0].data, "x\ny");
  EXPECT_EQ(got[1].name, "two");
  EXPECT_EQ(got[1].data, "z");
  EXPECT_EQ(got[2].name, "");
  EXPECT_EQ(got[2].data, "plain");
}

TEST(HttpSse, AnEventOverTheLimitStopsTheReader) {
  fh::SseReader reader(64);
  int events = 0;
  reader.feed("data: " + std::string(100, 'a'), [&](const fh::SseEvent&) { ++events; });
  EXPECT_TRUE(reader.overflowed());
  reader.feed("\n\ndata: b\n\n", [&](const fh::SseEvent&) { ++events; });
  EXPECT_EQ(events, 0);

  const fh::Request req{fh::verb::get, "/v1/events", 11};
  const auto header = fh::sse_header(req, "srv");
  EXPECT_EQ(header[fh::field::content_type], "text/event-stream");
  EXPECT_FALSE(header.keep_alive());
}

}  // namespace
