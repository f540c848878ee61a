// tests/mockllm/mock_llm_test.cpp — the mock model server (src/mockllm) over
// real loopback sockets: a Server on port 0 runs on its own io_context
// threads; the tests are Beast clients on another io_context.
#include "mockllm/mock_llm.hpp"

#include "support/wait.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace fairgate::mockllm {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace json = boost::json;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;

using Response = http::response<http::string_body>;

constexpr auto kClientTimeout = 10s;

#ifdef FAIRGATE_MOCKLLM_TEST_SANITIZED
constexpr auto kStatsWait = 20s;
#else
constexpr auto kStatsWait = 5s;
#endif

/// The body of a chat completion request.
std::string chat_body(bool stream, std::optional<int> max_tokens = std::nullopt, bool include_usage = false) {
  json::object o;
  o["model"] = "fairgate-mock";
  json::array messages;
  json::object m;
  m["role"] = "user";
  m["content"] = "tell me a story please";
  messages.push_back(std::move(m));
  o["messages"] = std::move(messages);
  o["stream"] = stream;
  if (max_tokens) o["max_tokens"] = *max_tokens;
  if (include_usage) {
    json::object so;
    so["include_usage"] = true;
    o["stream_options"] = std::move(so);
  }
  return json::serialize(o);
}

/// "t0 t1 … t<n-1> ", written out here rather than taken from token_text().
std::string expected_text(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += "t" + std::to_string(i) + " ";
  return out;
}

/// A JSON string's text, or a marker that makes a comparison fail.
std::string text_of(const json::value& v) {
  return v.is_string() ? std::string(v.get_string()) : "<not a string: " + json::serialize(v) + ">";
}

/// The `data:` payloads of an SSE body, in order.
std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos < body.size()) {
    const auto end = body.find("\n\n", pos);
    const std::string event = body.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
    if (end == std::string::npos) break;
    pos = end + 2;
  }
  return out;
}

class MockLlmTest : public ::testing::Test {
 protected:
  void start(Options options) {
    options.host = "127.0.0.1";
    options.port = 0;
    server_ = std::make_unique<Server>(server_io_.get_executor(), options);
    server_->start();
    for (int i = 0; i < 2; ++i) threads_.emplace_back([this] { server_io_.run(); });
    endpoint_ = server_->endpoint();
  }

  void TearDown() override {
    if (server_) server_->stop();
    // Let the closes run, then stop whatever is left.
    std::this_thread::sleep_for(20ms);
    server_io_.stop();
    for (auto& t : threads_) t.join();
    server_.reset();
  }

  /// Runs a client coroutine to completion on the client io_context.
  template <typename T>
  T await(net::awaitable<T> op) {
    auto future = net::co_spawn(client_io_, std::move(op), net::use_future);
    const auto deadline = std::chrono::steady_clock::now() + kClientTimeout + 5s;
    client_io_.restart();
    while (future.wait_for(0s) != std::future_status::ready) {
      if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("client operation hung");
      client_io_.run_one_for(10ms);
    }
    return future.get();
  }

  beast::tcp_stream connect() {
    beast::tcp_stream stream(client_io_);
    stream.expires_after(kClientTimeout);
    await(stream.async_connect(endpoint_, net::use_awaitable));
    return stream;
  }

  static http::request<http::string_body> make_request(http::verb verb, std::string_view target,
                                                       std::string body = {}) {
    http::request<http::string_body> req{verb, target, 11};
    req.set(http::field::host, "127.0.0.1");
    if (!body.empty()) req.set(http::field::content_type, "application/json");
    req.body() = std::move(body);
    req.prepare_payload();
    return req;
  }

  /// One request and its whole answer (a chunked body is read to its end).
  Response exchange(beast::tcp_stream& stream, http::request<http::string_body> req) {
    return await([&]() -> net::awaitable<Response> {
      stream.expires_after(kClientTimeout);
      co_await http::async_write(stream, req, net::use_awaitable);
      Response res;
      co_await http::async_read(stream, buffer_, res, net::use_awaitable);
      co_return res;
    }());
  }

  /// A HEAD's answer: its header alone (the parser is told no body follows).
  Response exchange_head(beast::tcp_stream& stream, const std::string& target) {
    return await([&]() -> net::awaitable<Response> {
      stream.expires_after(kClientTimeout);
      co_await http::async_write(stream, make_request(http::verb::head, target), net::use_awaitable);
      http::response_parser<http::string_body> parser;
      parser.skip(true);
      co_await http::async_read(stream, buffer_, parser, net::use_awaitable);
      co_return parser.release();
    }());
  }

  Response post_chat(const std::string& body) {
    auto stream = connect();
    return exchange(stream, make_request(http::verb::post, "/v1/chat/completions", body));
  }

  Stats stats() const { return server_->stats(); }

  net::io_context server_io_{2};
  net::io_context client_io_;
  std::unique_ptr<Server> server_;
  std::vector<std::thread> threads_;
  tcp::endpoint endpoint_;
  beast::flat_buffer buffer_;
};

Options fast(std::uint32_t tokens = 5) {
  Options o;
  o.tokens = tokens;
  o.tokens_per_second = 500;
  return o;
}

TEST_F(MockLlmTest, StreamingSendsRoleEveryTokenFinishAndDone) {
  start(fast(7));
  const Response res = post_chat(chat_body(true));
  ASSERT_EQ(res.result(), http::status::ok);
  EXPECT_EQ(res[http::field::content_type], "text/event-stream");
  EXPECT_TRUE(res.chunked());

  const auto events = sse_data(res.body());
  // role, 7 content deltas, finish, [DONE]
  ASSERT_EQ(events.size(), 10u) << res.body();
  EXPECT_EQ(events.back(), "[DONE]");
  const json::value role = json::parse(events[0]);
  EXPECT_EQ(role.at("object"), "chat.completion.chunk");
  EXPECT_EQ(role.at("model"), "fairgate-mock");
  EXPECT_EQ(role.at("choices").at(0).at("delta").at("role"), "assistant");
  EXPECT_TRUE(role.at("choices").at(0).at("finish_reason").is_null());
  const std::string id(role.at("id").as_string());
  EXPECT_EQ(id.rfind("chatcmpl-", 0), 0u);

  std::string text;
  int deltas = 0;
  for (std::size_t i = 1; i + 2 < events.size(); ++i) {
    const json::value chunk = json::parse(events[i]);
    EXPECT_EQ(text_of(chunk.at("id")), id);
    const auto& choice = chunk.at("choices").at(0);
    EXPECT_TRUE(choice.at("finish_reason").is_null());
    const std::string piece(choice.at("delta").at("content").as_string());
    EXPECT_FALSE(piece.empty());
    text += piece;
    ++deltas;
  }
  EXPECT_EQ(deltas, 7);
  EXPECT_EQ(text, expected_text(7));
  const json::value finish = json::parse(events[events.size() - 2]);
  EXPECT_EQ(finish.at("choices").at(0).at("finish_reason"), "stop");
  EXPECT_TRUE(finish.at("choices").at(0).at("delta").as_object().empty());

  EXPECT_TRUE(test::wait_until([&] { return stats().completed == 1; }, kStatsWait));
  const Stats s = stats();
  EXPECT_EQ(s.requests, 1u);
  EXPECT_EQ(s.in_flight, 0u);
  EXPECT_EQ(s.client_aborts, 0u);
}

TEST_F(MockLlmTest, MaxTokensSetsTheLengthAndFinishReasonLength) {
  start(fast(5));
  const Response res = post_chat(chat_body(true, 3, true));
  ASSERT_EQ(res.result(), http::status::ok);
  const auto events = sse_data(res.body());
  // role, 3 deltas, finish, usage, [DONE]
  ASSERT_EQ(events.size(), 7u) << res.body();
  std::string text;
  for (std::size_t i = 1; i <= 3; ++i)
    text += json::value_to<std::string>(json::parse(events[i]).at("choices").at(0).at("delta").at("content"));
  EXPECT_EQ(text, expected_text(3));
  EXPECT_EQ(json::parse(events[4]).at("choices").at(0).at("finish_reason"), "length");
  const json::value usage = json::parse(events[5]);
  EXPECT_TRUE(usage.at("choices").as_array().empty());
  EXPECT_EQ(usage.at("usage").at("completion_tokens"), 3);
  EXPECT_EQ(usage.at("usage").at("prompt_tokens"), 5);
}

TEST_F(MockLlmTest, NonStreamingContentIsTheConcatenationWithUsage) {
  start(fast(6));
  const Response res = post_chat(chat_body(false));
  ASSERT_EQ(res.result(), http::status::ok) << res.body();
  EXPECT_EQ(res[http::field::content_type], "application/json");
  const json::value v = json::parse(res.body());
  EXPECT_EQ(v.at("object"), "chat.completion");
  EXPECT_EQ(v.at("model"), "fairgate-mock");
  const auto& choice = v.at("choices").at(0);
  EXPECT_EQ(choice.at("message").at("role"), "assistant");
  EXPECT_EQ(text_of(choice.at("message").at("content")), expected_text(6));
  EXPECT_EQ(choice.at("finish_reason"), "stop");
  EXPECT_EQ(v.at("usage").at("prompt_tokens"), 5);  // "tell me a story please"
  EXPECT_EQ(v.at("usage").at("completion_tokens"), 6);
  EXPECT_EQ(v.at("usage").at("total_tokens"), 11);
}

TEST_F(MockLlmTest, CeilingAnswers429ToTheOneRequestOverIt) {
  Options o;
  o.tokens = 30;
  o.tokens_per_second = 100;  // 300 ms each: both are still generating when the third arrives
  o.max_concurrent = 2;
  start(o);

  // Two streams admitted: their headers arrived, so they hold their places.
  auto a = connect();
  auto b = connect();
  http::response_parser<http::string_body> pa, pb;
  pa.body_limit(1 << 20);
  pb.body_limit(1 << 20);
  beast::flat_buffer ba, bb;
  for (auto* pair : {&a, &b}) {
    auto req = make_request(http::verb::post, "/v1/chat/completions", chat_body(true));
    await(http::async_write(*pair, req, net::use_awaitable));
  }
  await(http::async_read_header(a, ba, pa, net::use_awaitable));
  await(http::async_read_header(b, bb, pb, net::use_awaitable));
  ASSERT_EQ(pa.get().result(), http::status::ok);
  ASSERT_EQ(pb.get().result(), http::status::ok);

  const Response c = post_chat(chat_body(true));
  ASSERT_EQ(c.result(), http::status::too_many_requests);
  EXPECT_EQ(c[http::field::retry_after], "1");
  const json::value err = json::parse(c.body());
  EXPECT_EQ(err.at("error").at("type"), "rate_limit_error");
  EXPECT_EQ(err.at("error").at("code"), "concurrency_limit");
  EXPECT_TRUE(err.at("error").at("message").is_string());

  // The two admitted streams still finish whole.
  await(http::async_read(a, ba, pa, net::use_awaitable));
  await(http::async_read(b, bb, pb, net::use_awaitable));
  for (auto* p : {&pa, &pb}) {
    const auto events = sse_data(p->get().body());
    ASSERT_EQ(events.size(), 33u);
    EXPECT_EQ(events.back(), "[DONE]");
  }

  EXPECT_TRUE(test::wait_until([&] { return stats().completed == 2; }, kStatsWait));
  const Stats s = stats();
  EXPECT_EQ(s.rejected_429, 1u);
  EXPECT_EQ(s.peak_in_flight, 2u);
  EXPECT_EQ(s.in_flight, 0u);
  EXPECT_EQ(s.requests, 3u);

  // The place is free again.
  EXPECT_EQ(post_chat(chat_body(false, 2)).result(), http::status::ok);
}

TEST_F(MockLlmTest, ClientLeavingMidStreamEndsTheGeneration) {
  Options o;
  o.tokens = 1000;
  o.tokens_per_second = 50;  // 20 s if nobody stopped it
  start(o);
  {
    auto stream = connect();
    auto req = make_request(http::verb::post, "/v1/chat/completions", chat_body(true));
    await(http::async_write(stream, req, net::use_awaitable));
    http::response_parser<http::string_body> parser;
    beast::flat_buffer buffer;
    await(http::async_read_header(stream, buffer, parser, net::use_awaitable));
    ASSERT_EQ(parser.get().result(), http::status::ok);
    // Wait for the first tokens, then hang up.
    await(http::async_read_some(stream, buffer, parser, net::use_awaitable));
    ASSERT_TRUE(test::wait_until([&] { return stats().in_flight == 1; }, kStatsWait));
    stream.socket().shutdown(tcp::socket::shutdown_both);
    stream.close();
  }
  EXPECT_TRUE(
      test::wait_until([&] { return stats().client_aborts == 1 && stats().in_flight == 0; }, kStatsWait))
      << "client_aborts " << stats().client_aborts << ", in_flight " << stats().in_flight;
  EXPECT_EQ(stats().completed, 0u);
}

TEST_F(MockLlmTest, ClientLeavingBeforeANonStreamingAnswerEndsTheGeneration) {
  Options o;
  o.tokens = 1000;
  o.tokens_per_second = 50;
  start(o);
  {
    auto stream = connect();
    auto req = make_request(http::verb::post, "/v1/chat/completions", chat_body(false));
    await(http::async_write(stream, req, net::use_awaitable));
    ASSERT_TRUE(test::wait_until([&] { return stats().in_flight == 1; }, kStatsWait));
    stream.close();
  }
  EXPECT_TRUE(
      test::wait_until([&] { return stats().client_aborts == 1 && stats().in_flight == 0; }, kStatsWait));
}

TEST_F(MockLlmTest, TokensComeNoFasterThanTheRate) {
  Options o;
  o.tokens = 10;
  o.tokens_per_second = 100;  // first token at once, the 10th after 9 gaps of 10 ms
  start(o);
  const auto begin = std::chrono::steady_clock::now();
  const Response res = post_chat(chat_body(true));
  const auto elapsed = std::chrono::steady_clock::now() - begin;
  ASSERT_EQ(res.result(), http::status::ok);
  EXPECT_EQ(sse_data(res.body()).size(), 13u);
  EXPECT_GE(elapsed, 90ms);
}

TEST_F(MockLlmTest, FirstTokenDelayHoldsTheFirstToken) {
  Options o = fast(2);
  o.first_token_delay = 150ms;
  start(o);
  const auto begin = std::chrono::steady_clock::now();
  EXPECT_EQ(post_chat(chat_body(false)).result(), http::status::ok);
  EXPECT_GE(std::chrono::steady_clock::now() - begin, 150ms);
}

TEST_F(MockLlmTest, BadRequestsAnswerOpenAiErrors) {
  start(fast());
  struct Case {
    std::string body;
    std::string param;  // empty: null
  };
  const std::vector<Case> cases = {
      {"{not json", ""},
      {"[1,2]", ""},
      {R"({"messages":[{"role":"user","content":"hi"}]})", "model"},
      {R"({"model":"m"})", "messages"},
      {R"({"model":"m","messages":"hi"})", "messages"},
      {R"({"model":"m","messages":[]})", "messages"},
      {R"({"model":"m","messages":[{"content":"hi"}]})", "messages[0].role"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stream":"yes"})", "stream"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":0})", "max_tokens"},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":"5"})", "max_tokens"},
  };
  for (const auto& c : cases) {
    const Response res = post_chat(c.body);
    EXPECT_EQ(res.result(), http::status::bad_request) << c.body;
    const json::value v = json::parse(res.body());
    EXPECT_EQ(v.at("error").at("type"), "invalid_request_error") << c.body;
    EXPECT_TRUE(v.at("error").at("message").is_string());
    EXPECT_TRUE(v.at("error").as_object().contains("code"));
    if (c.param.empty()) {
      EXPECT_TRUE(v.at("error").at("param").is_null()) << c.body;
    } else {
      EXPECT_EQ(text_of(v.at("error").at("param")), c.param) << c.body;
    }
  }
  const Stats s = stats();
  EXPECT_EQ(s.bad_requests, cases.size());
  EXPECT_EQ(s.requests, cases.size());
  EXPECT_EQ(s.in_flight, 0u);
  EXPECT_EQ(s.peak_in_flight, 0u);
}

TEST_F(MockLlmTest, RoutesMethodsAndKeepAlive) {
  Options o = fast(2);
  o.model = "my-model";
  start(o);
  auto stream = connect();  // every request below on one connection

  Response res = exchange(stream, make_request(http::verb::get, "/v1/models"));
  ASSERT_EQ(res.result(), http::status::ok);
  const json::value models = json::parse(res.body());
  EXPECT_EQ(models.at("object"), "list");
  EXPECT_EQ(models.at("data").at(0).at("id"), "my-model");

  res = exchange(stream, make_request(http::verb::post, "/v1/chat/completions", chat_body(true)));
  ASSERT_EQ(res.result(), http::status::ok);
  EXPECT_EQ(sse_data(res.body()).back(), "[DONE]");
  EXPECT_EQ(json::parse(sse_data(res.body())[0]).at("model"), "my-model");

  res = exchange(stream, make_request(http::verb::get, "/v1/chat/completions"));
  EXPECT_EQ(res.result(), http::status::method_not_allowed);
  EXPECT_EQ(res[http::field::allow], "POST");
  EXPECT_EQ(json::parse(res.body()).at("error").at("type"), "invalid_request_error");

  res = exchange(stream, make_request(http::verb::get, "/v2/nothing"));
  EXPECT_EQ(res.result(), http::status::not_found);
  EXPECT_EQ(json::parse(res.body()).at("error").at("type"), "invalid_request_error");

  res = exchange(stream, make_request(http::verb::get, "/healthz"));
  EXPECT_EQ(res.result(), http::status::ok);

  res = exchange(stream, make_request(http::verb::get, "/stats"));
  ASSERT_EQ(res.result(), http::status::ok);
  const json::value st = json::parse(res.body());
  EXPECT_EQ(st.at("requests"), 1);  // the POST; the GET on the chat route is a bad request
  EXPECT_EQ(st.at("completed"), 1);
  EXPECT_EQ(st.at("bad_requests"), 2);
  EXPECT_EQ(st.at("rejected_429"), 0);
  EXPECT_EQ(st.at("client_aborts"), 0);
  EXPECT_EQ(st.at("in_flight"), 0);
  EXPECT_EQ(st.at("peak_in_flight"), 1);

  // HEAD: a GET's header, Content-Length included, and no body; on the chat route a 405 without
  // one. Each answer on the connection then starts where the header ended: the GET after them
  // is read whole.
  for (const auto& [path, status] : std::vector<std::pair<std::string, http::status>>{
           {"/v1/models", http::status::ok},
           {"/healthz", http::status::ok},
           {"/v1/chat/completions", http::status::method_not_allowed},
           {"/v2/nothing", http::status::not_found}}) {
    res = exchange_head(stream, path);
    EXPECT_EQ(res.result(), status) << path;
    EXPECT_GT(std::stoull(std::string(res[http::field::content_length])), 0u) << path;
  }
  res = exchange(stream, make_request(http::verb::get, "/healthz"));
  ASSERT_EQ(res.result(), http::status::ok);
  EXPECT_EQ(json::parse(res.body()).at("status"), "ok");
}

TEST_F(MockLlmTest, GarbageGetsA400OrACloseAndTheServerGoesOn) {
  start(fast(2));
  const std::vector<std::string> garbage = {
      "GARBAGE\r\n\r\n",
      std::string("\x00\x01\x02\xff\xfe\r\n\r\n", 8),
      "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n",
      "GET / HTTP/1.1\r\nX: " + std::string(10'000, 'a') + "\r\n\r\n",
  };
  for (const auto& bytes : garbage) {
    auto stream = connect();
    const std::string answer = await([&]() -> net::awaitable<std::string> {
      std::string got;
      auto [wec, wn] =
          co_await net::async_write(stream, net::buffer(bytes), net::as_tuple(net::use_awaitable));
      if (wec) co_return got;  // the server hung up first
      std::array<char, 4096> chunk{};
      for (;;) {
        auto [ec, n] = co_await stream.async_read_some(net::buffer(chunk), net::as_tuple(net::use_awaitable));
        got.append(chunk.data(), n);
        if (ec) break;
      }
      co_return got;
    }());
    // Either a 4xx answer (then the connection closes) or a plain close.
    if (!answer.empty()) {
      EXPECT_EQ(answer.substr(0, 10), "HTTP/1.1 4") << answer.substr(0, 200);
    }
  }
  const Response ok = post_chat(chat_body(false));
  EXPECT_EQ(ok.result(), http::status::ok);
  EXPECT_EQ(text_of(json::parse(ok.body()).at("choices").at(0).at("message").at("content")),
            expected_text(2));
  EXPECT_GE(stats().bad_requests, 3u);
}

TEST_F(MockLlmTest, ATooLargeBodyIs413) {
  start(fast());
  auto stream = connect();
  const std::string head =
      // Over the 8 MiB limit (above the gateway's 4 MiB default).
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 8388609\r\n\r\n{\"model\":";
  await(net::async_write(stream, net::buffer(head), net::use_awaitable));
  Response res;
  await(http::async_read(stream, buffer_, res, net::use_awaitable));
  EXPECT_EQ(res.result(), http::status::payload_too_large);
  EXPECT_EQ(json::parse(res.body()).at("error").at("type"), "invalid_request_error");
}

TEST_F(MockLlmTest, SlowRequestsAre408AndIdleConnectionsClose) {
  Options o = fast();
  o.request_timeout = 200ms;
  o.idle_timeout = 200ms;
  start(o);

  auto slow = connect();  // starts a request and never finishes it
  const std::string head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n";
  await(net::async_write(slow, net::buffer(head), net::use_awaitable));
  Response res;
  await(http::async_read(slow, buffer_, res, net::use_awaitable));
  EXPECT_EQ(res.result(), http::status::request_timeout);
  EXPECT_EQ(json::parse(res.body()).at("error").at("code"), "request_timeout");

  auto idle = connect();  // says nothing: closed after idle_timeout, before the client's own timeout
  const auto ec = await([&]() -> net::awaitable<boost::system::error_code> {
    std::array<char, 16> byte{};
    auto [read_ec, n] = co_await idle.async_read_some(net::buffer(byte), net::as_tuple(net::use_awaitable));
    co_return read_ec;
  }());
  EXPECT_EQ(ec, net::error::eof) << ec.message();
  EXPECT_EQ(stats().bad_requests, 1u);  // the 408
}

TEST(MockLlmOptions, BadOptionsAndBusyPortThrow) {
  net::io_context io;
  Options o;
  o.port = 0;
  o.tokens_per_second = 0;
  EXPECT_THROW(Server(io.get_executor(), o), std::invalid_argument);
  o.tokens_per_second = 10;
  o.host = "nowhere";
  EXPECT_THROW(Server(io.get_executor(), o), std::invalid_argument);
  o.host = "127.0.0.1";
  Server first(io.get_executor(), o);
  o.port = first.endpoint().port();
  try {
    Server second(io.get_executor(), o);
    ADD_FAILURE() << "a second server bound the same port";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen on 127.0.0.1:"), std::string::npos) << e.what();
  }
}

TEST(MockLlmTokens, TokenTextIsTIndexSpace) {
  EXPECT_EQ(token_text(0), "t0 ");
  EXPECT_EQ(token_text(41), "t41 ");
}

}  // namespace
}  // namespace fairgate::mockllm
