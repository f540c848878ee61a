// mockllm/mock_llm.cpp — the mock model server: listener, connections, the
// chat completions generator.
//
// Invariants:
//  * Every connection is one coroutine on its own strand; its socket, buffer
//    and timers are only touched there (stop() posts to it).
//  * in_flight counts generations, from admission (under the stats lock, so
//    the ceiling check and the increment are one step) to the end of the
//    answer or the client's departure; a Generation guard gives the place
//    back on every exit path, and records exactly one outcome: completed or
//    client_aborts (or nothing when the server is stopping).
//  * While a generation waits between tokens, a pending read on the socket
//    watches for the client leaving; bytes it reads (a pipelined request) go
//    into the connection's buffer and are served afterwards.
//  * Nothing a client sends can make the server hold unbounded memory or time:
//    header and body caps, a read timeout per request, an idle timeout between
//    requests and a write timeout per write.
#include "mockllm/mock_llm.hpp"

#include "http/connections.hpp"
#include "http/listener.hpp"
#include "http/message.hpp"
#include "http/read.hpp"
#include "http/sse.hpp"
#include "http/write.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>

#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <ctime>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <variant>

namespace fairgate::mockllm {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace json = boost::json;
using tcp = net::ip::tcp;
using net::awaitable;
using namespace net::experimental::awaitable_operators;

namespace {

constexpr auto nothrow = net::as_tuple(net::use_awaitable);
constexpr std::string_view kServerName = "fairgate-mock-llm";
constexpr std::size_t kMaxHeaderBytes = 8 * 1024;
constexpr std::size_t kMaxBodyBytes = 8 * 1024 * 1024;  // above the gateway default (4 MiB)
constexpr std::int64_t kMaxTokensLimit = 1'000'000;

using Request = fairgate::http::Request;
using Response = fairgate::http::Response;

}  // namespace

std::string token_text(std::uint32_t index) { return fmt::format("t{} ", index); }

/// What the listener and every connection share.
struct detail::ServerState {
  ServerState(net::any_io_executor ex, Options o)
      : options(std::move(o)),
        executor(ex),
        acceptor_strand(net::make_strand(ex)),
        acceptor(acceptor_strand) {}

  struct Session;

  const Options options;
  net::any_io_executor executor;
  net::any_io_executor acceptor_strand;
  tcp::acceptor acceptor;
  tcp::endpoint bound;
  std::atomic<bool> stopping{false};
  std::atomic<bool> started{false};
  std::atomic<std::uint64_t> next_id{1};
  std::int64_t created_at = static_cast<std::int64_t>(std::time(nullptr));

  mutable std::mutex mu;  // guards stats
  Stats stats;
  fairgate::http::Connections<Session> sessions;

  /// Takes a generation place, or counts a 429 and returns false.
  bool admit() {
    std::lock_guard lock(mu);
    if (options.max_concurrent > 0 && stats.in_flight >= options.max_concurrent) {
      ++stats.rejected_429;
      return false;
    }
    ++stats.in_flight;
    stats.peak_in_flight = std::max(stats.peak_in_flight, stats.in_flight);
    return true;
  }
  Stats stats_snapshot() const {
    std::lock_guard lock(mu);
    return stats;
  }
  template <typename F>
  void update(F f) {
    std::lock_guard lock(mu);
    f(stats);
  }
};

/// One client connection.
struct detail::ServerState::Session : fairgate::http::Connection {
  Session(tcp::socket socket, std::shared_ptr<ServerState> s, std::uint64_t session_id)
      : Connection(std::move(socket), session_id, kMaxHeaderBytes + kMaxBodyBytes + 8192),
        state(std::move(s)) {}

  std::shared_ptr<ServerState> state;
  /// The request being answered is a HEAD: answers carry their header and no body.
  bool head_only = false;
};

namespace {

using State = detail::ServerState;
using Session = detail::ServerState::Session;

// --- answers ------------------------------------------------------------------

Response json_response(http::status status, const Request& req, const json::value& v) {
  return fairgate::http::json_response(status, req, v, kServerName);
}

/// An OpenAI error body: {"error":{"message","type","param","code"}}.
json::value error_json(std::string_view message, std::string_view type, std::string_view param,
                       std::string_view code) {
  json::object inner;
  inner["message"] = message;
  inner["type"] = type;
  inner["param"] = param.empty() ? json::value(nullptr) : json::value(param);
  inner["code"] = code.empty() ? json::value(nullptr) : json::value(code);
  json::object o;
  o["error"] = std::move(inner);
  return o;
}

/// Writes `res`; false when the client is gone or too slow.
awaitable<bool> send(Session& s, Response res) {
  s.stream.expires_after(s.state->options.write_timeout);
  const auto ec = co_await fairgate::http::write_response(s.stream, res, s.head_only);
  s.stream.expires_never();
  co_return !ec;
}

/// Answers a refused request with an invalid_request_error (counted in
/// bad_requests); returns whether the connection may carry another request.
awaitable<bool> send_invalid(Session& s, const Request& req, http::status status, std::string_view message,
                             std::string_view param = {}, std::string_view code = {}) {
  s.state->update([](Stats& st) { ++st.bad_requests; });
  Response res = json_response(status, req, error_json(message, "invalid_request_error", param, code));
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

awaitable<bool> method_not_allowed(Session& s, const Request& req, std::string_view allow) {
  s.state->update([](Stats& st) { ++st.bad_requests; });
  const std::string message = fmt::format("{} is not allowed here (allowed: {})", req.method_string(), allow);
  Response res = json_response(http::status::method_not_allowed, req,
                               error_json(message, "invalid_request_error", {}, "method_not_allowed"));
  res.set(http::field::allow, allow);
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

/// Writes raw bytes with the write timeout; false when the client is gone or too slow.
awaitable<bool> send_raw(Session& s, const std::string& bytes) {
  s.stream.expires_after(s.state->options.write_timeout);
  auto [ec, n] = co_await net::async_write(s.stream, net::buffer(bytes), nothrow);
  s.stream.expires_never();
  co_return !ec;
}

// --- the chat completion request ---------------------------------------------------

/// A valid chat completion request, reduced to what the mock needs.
struct Completion {
  std::string id;
  std::int64_t created = 0;
  std::uint32_t tokens = 0;
  bool stream = false;
  bool include_usage = false;
  bool length_cut = false;  // max_tokens set the length: finish_reason "length"
  std::uint64_t prompt_tokens = 0;
  bool chunked = true;  // HTTP/1.1; an HTTP/1.0 stream ends with the connection
};

/// What is wrong with a request body, as OpenAI reports it.
struct Invalid {
  std::string message;
  std::string param;
};

/// Whitespace-separated words of a message's content (a string, or an array
/// of {"type":"text","text":…} parts): the mock's prompt token count.
std::uint64_t count_words(const json::value& content) {
  std::uint64_t n = 0;
  const auto count = [&n](std::string_view text) {
    bool in_word = false;
    for (const char c : text) {
      const bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
      if (!space && !in_word) ++n;
      in_word = !space;
    }
  };
  if (const auto* str = content.if_string()) count(*str);
  if (const auto* parts = content.if_array()) {
    for (const auto& part : *parts) {
      const auto* obj = part.if_object();
      if (obj == nullptr) continue;
      if (const auto* text = obj->if_contains("text"); text != nullptr && text->is_string())
        count(text->get_string());
    }
  }
  return n;
}

/// Reads the body of POST /v1/chat/completions into `out`, or says what is wrong.
std::optional<Invalid> parse_completion(std::string_view body, const Options& options, Completion& out) {
  boost::system::error_code ec;
  const json::value doc = json::parse(body, ec);
  if (ec) return Invalid{fmt::format("the body is not valid JSON: {}", ec.message()), {}};
  const auto* obj = doc.if_object();
  if (obj == nullptr) return Invalid{"the body must be a JSON object", {}};

  const auto* model = obj->if_contains("model");
  if (model == nullptr) return Invalid{"you must provide a model parameter", "model"};
  if (!model->is_string()) return Invalid{"model must be a string", "model"};

  const auto* messages = obj->if_contains("messages");
  if (messages == nullptr) return Invalid{"missing required parameter: 'messages'", "messages"};
  const auto* list = messages->if_array();
  if (list == nullptr) return Invalid{"messages must be an array", "messages"};
  if (list->empty()) return Invalid{"messages must not be empty", "messages"};
  out.prompt_tokens = 0;
  for (std::size_t i = 0; i < list->size(); ++i) {
    const auto* m = (*list)[i].if_object();
    const std::string param = fmt::format("messages[{}]", i);
    if (m == nullptr) return Invalid{fmt::format("{} must be an object", param), param};
    const auto* role = m->if_contains("role");
    if (role == nullptr || !role->is_string())
      return Invalid{fmt::format("{}.role must be a string", param), param + ".role"};
    if (const auto* content = m->if_contains("content")) out.prompt_tokens += count_words(*content);
  }

  out.stream = false;
  if (const auto* stream = obj->if_contains("stream"); stream != nullptr && !stream->is_null()) {
    if (!stream->is_bool()) return Invalid{"stream must be a boolean", "stream"};
    out.stream = stream->get_bool();
  }
  out.include_usage = false;
  if (const auto* so = obj->if_contains("stream_options"); so != nullptr && !so->is_null()) {
    const auto* so_obj = so->if_object();
    if (so_obj == nullptr) return Invalid{"stream_options must be an object", "stream_options"};
    if (const auto* iu = so_obj->if_contains("include_usage"); iu != nullptr && !iu->is_null()) {
      if (!iu->is_bool())
        return Invalid{"stream_options.include_usage must be a boolean", "stream_options.include_usage"};
      out.include_usage = iu->get_bool();
    }
  }

  // max_tokens (or its newer name max_completion_tokens) sets the answer length.
  out.tokens = options.tokens;
  out.length_cut = false;
  for (const std::string_view key : {"max_completion_tokens", "max_tokens"}) {
    const auto* mt = obj->if_contains(key);
    if (mt == nullptr || mt->is_null()) continue;
    const auto* v = mt->if_int64();
    const auto* u = mt->if_uint64();
    const std::int64_t n =
        v != nullptr
            ? *v
            : (u != nullptr ? static_cast<std::int64_t>(std::min<std::uint64_t>(*u, INT64_MAX)) : -1);
    if ((v == nullptr && u == nullptr) || n < 1 || n > kMaxTokensLimit)
      return Invalid{fmt::format("{} must be a whole number in 1..{}", key, kMaxTokensLimit),
                     std::string(key)};
    out.tokens = static_cast<std::uint32_t>(n);
    out.length_cut = true;
    break;
  }
  return std::nullopt;
}

// --- generation -------------------------------------------------------------------

json::object chunk_json(const State& st, const Completion& c) {
  json::object o;
  o["id"] = c.id;
  o["object"] = "chat.completion.chunk";
  o["created"] = c.created;
  o["model"] = st.options.model;
  return o;
}

json::object usage_json(const Completion& c) {
  json::object u;
  u["prompt_tokens"] = c.prompt_tokens;
  u["completion_tokens"] = c.tokens;
  u["total_tokens"] = c.prompt_tokens + c.tokens;
  return u;
}

/// One SSE event carrying a chunk whose only choice has `delta` and `finish_reason`.
std::string delta_event(const State& st, const Completion& c, json::object delta, json::value finish_reason) {
  json::object choice;
  choice["index"] = 0;
  choice["delta"] = std::move(delta);
  choice["finish_reason"] = std::move(finish_reason);
  json::array choices;
  choices.push_back(std::move(choice));
  json::object o = chunk_json(st, c);
  o["choices"] = std::move(choices);
  if (c.include_usage) o["usage"] = nullptr;
  return fairgate::http::sse_event({}, json::serialize(o));
}

std::string_view finish_reason(const Completion& c) { return c.length_cut ? "length" : "stop"; }

/// When token `i` is due: first_token_delay after the start, then one every 1/tokens_per_second.
std::chrono::steady_clock::time_point due(const State& st, std::chrono::steady_clock::time_point start,
                                          std::uint32_t i) {
  const std::chrono::duration<double> gap(static_cast<double>(i) / st.options.tokens_per_second);
  return start + st.options.first_token_delay + std::chrono::duration_cast<std::chrono::nanoseconds>(gap);
}

/// Wraps `data` in one HTTP/1.1 chunk (or leaves it as is for HTTP/1.0).
std::string framed(const Completion& c, std::string_view data) {
  if (!c.chunked) return std::string(data);
  std::string out = fmt::format("{:x}\r\n", data.size());
  out += data;
  out += "\r\n";
  return out;
}

/// Streams the answer: role and first token at first_token_delay, a token per
/// 1/tokens_per_second after that, the finish chunk, the usage chunk when
/// asked, [DONE], and the last chunk. Sets `all_sent` once the last byte is
/// written (the watcher may see the satisfied client hang up before this
/// coroutine resumes, so "who finished first" cannot tell). False when a write
/// failed or it was cancelled.
awaitable<bool> stream_tokens(Session& s, const Completion& c, std::chrono::steady_clock::time_point start,
                              bool& all_sent) {
  const State& st = *s.state;
  net::steady_timer timer(s.stream.get_executor());
  for (std::uint32_t i = 0; i < c.tokens; ++i) {
    timer.expires_at(due(st, start, i));
    auto [ec] = co_await timer.async_wait(nothrow);
    if (ec) co_return false;
    std::string events;
    if (i == 0) {
      json::object role;
      role["role"] = "assistant";
      role["content"] = "";
      events += delta_event(st, c, std::move(role), nullptr);
    }
    json::object delta;
    delta["content"] = token_text(i);
    events += delta_event(st, c, std::move(delta), nullptr);
    if (!co_await send_raw(s, framed(c, events))) co_return false;
  }
  std::string tail = delta_event(st, c, json::object(), json::value(finish_reason(c)));
  if (c.include_usage) {
    json::object o = chunk_json(st, c);
    o["choices"] = json::array();
    o["usage"] = usage_json(c);
    tail += fairgate::http::sse_event({}, json::serialize(o));
  }
  tail += fairgate::http::sse_event({}, "[DONE]");
  std::string bytes = framed(c, tail);
  if (c.chunked) bytes += "0\r\n\r\n";
  all_sent = co_await send_raw(s, bytes);
  co_return all_sent;
}

/// Waits as long as generating the whole answer takes (non-streaming).
awaitable<bool> generate_silently(Session& s, const Completion& c,
                                  std::chrono::steady_clock::time_point start) {
  net::steady_timer timer(s.stream.get_executor());
  timer.expires_at(due(*s.state, start, c.tokens - 1));
  auto [ec] = co_await timer.async_wait(nothrow);
  co_return !ec;
}

/// Completes when the client closes the connection (or it fails). Bytes it
/// sends meanwhile (a pipelined request) are kept in the buffer for later;
/// a client that sends more than the buffer holds is treated as gone.
awaitable<void> watch_disconnect(Session& s) {
  for (;;) {
    if (s.buffer.size() + 4096 > s.buffer.max_size()) co_return;
    auto [ec, n] = co_await s.stream.socket().async_read_some(s.buffer.prepare(4096), nothrow);
    if (ec) co_return;
    s.buffer.commit(n);
  }
}

/// A generation place; gives it back and records the outcome exactly once.
class Generation {
 public:
  explicit Generation(State& st) : st_(st) {}
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;
  ~Generation() {
    const bool stopping = st_.stopping.load();
    st_.update([&](Stats& s) {
      --s.in_flight;
      if (done_)
        ++s.completed;
      else if (!stopping)
        ++s.client_aborts;
    });
  }
  void done() { done_ = true; }

 private:
  State& st_;
  bool done_ = false;
};

awaitable<bool> route_chat(std::shared_ptr<Session> self, const Request& req) {
  Session& s = *self;
  State& st = *s.state;
  if (req.method() != http::verb::post) co_return co_await method_not_allowed(s, req, "POST");
  st.update([](Stats& x) { ++x.requests; });

  Completion c;
  if (auto bad = parse_completion(req.body(), st.options, c))
    co_return co_await send_invalid(s, req, http::status::bad_request, bad->message, bad->param);

  if (!st.admit()) {
    const std::string message = fmt::format(
        "the model is at its concurrency limit ({} in flight), retry later", st.options.max_concurrent);
    Response res = json_response(http::status::too_many_requests, req,
                                 error_json(message, "rate_limit_error", {}, "concurrency_limit"));
    res.set(http::field::retry_after, "1");
    co_return co_await send(s, std::move(res)) && req.keep_alive();
  }
  Generation generation(st);
  const auto start = std::chrono::steady_clock::now();
  c.id = fmt::format("chatcmpl-mock{}", st.next_id.fetch_add(1, std::memory_order_relaxed));
  c.created = static_cast<std::int64_t>(std::time(nullptr));
  c.chunked = req.version() >= 11;

  if (c.stream) {
    http::response<http::empty_body> head{http::status::ok, req.version()};
    head.set(http::field::server, kServerName);
    head.set(http::field::content_type, "text/event-stream");
    head.set(http::field::cache_control, "no-cache");
    head.set("X-Accel-Buffering", "no");
    const bool keep = c.chunked && req.keep_alive();
    head.keep_alive(keep);
    if (c.chunked) head.chunked(true);
    http::response_serializer<http::empty_body> sr{head};
    s.stream.expires_after(st.options.write_timeout);
    auto [ec, n] = co_await http::async_write_header(s.stream, sr, nothrow);
    s.stream.expires_never();
    if (ec) co_return false;
    bool all_sent = false;
    auto outcome = co_await (stream_tokens(s, c, start, all_sent) || watch_disconnect(s));
    if (!all_sent) co_return false;
    generation.done();
    co_return keep&& outcome.index() == 0;  // the watcher ending first means the client left
  }

  auto outcome = co_await (generate_silently(s, c, start) || watch_disconnect(s));
  if (outcome.index() != 0 || !std::get<0>(outcome)) co_return false;
  std::string content;
  for (std::uint32_t i = 0; i < c.tokens; ++i) content += token_text(i);
  json::object message;
  message["role"] = "assistant";
  message["content"] = std::move(content);
  json::object choice;
  choice["index"] = 0;
  choice["message"] = std::move(message);
  choice["finish_reason"] = finish_reason(c);
  json::array choices;
  choices.push_back(std::move(choice));
  json::object o;
  o["id"] = c.id;
  o["object"] = "chat.completion";
  o["created"] = c.created;
  o["model"] = st.options.model;
  o["choices"] = std::move(choices);
  o["usage"] = usage_json(c);
  Response res = json_response(http::status::ok, req, o);
  if (!co_await send(s, std::move(res))) co_return false;
  generation.done();
  co_return req.keep_alive();
}

json::object model_json(const State& st) {
  json::object m;
  m["id"] = st.options.model;
  m["object"] = "model";
  m["created"] = st.created_at;
  m["owned_by"] = "fairgate";
  return m;
}

json::object stats_json(const Stats& x) {
  json::object o;
  o["requests"] = x.requests;
  o["completed"] = x.completed;
  o["rejected_429"] = x.rejected_429;
  o["bad_requests"] = x.bad_requests;
  o["client_aborts"] = x.client_aborts;
  o["in_flight"] = x.in_flight;
  o["peak_in_flight"] = x.peak_in_flight;
  return o;
}

/// Serves one request; returns whether the connection may carry another.
awaitable<bool> handle(std::shared_ptr<Session> self, const Request& req) {
  Session& s = *self;
  const State& st = *s.state;
  const std::string_view full(req.target().data(), req.target().size());
  const std::string_view path = full.substr(0, full.find('?'));
  // A HEAD is a GET without the body (RFC 9110, 9.3.2); on the chat route a 405, without a body too.
  s.head_only = req.method() == http::verb::head;
  const auto method = s.head_only ? http::verb::get : req.method();

  if (path == "/v1/chat/completions") co_return co_await route_chat(self, req);
  if (path == "/v1/models") {
    if (method != http::verb::get) co_return co_await method_not_allowed(s, req, "GET, HEAD");
    json::array data;
    data.push_back(model_json(st));
    json::object o;
    o["object"] = "list";
    o["data"] = std::move(data);
    co_return co_await send(s, json_response(http::status::ok, req, o)) && req.keep_alive();
  }
  if (path.starts_with("/v1/models/")) {
    if (method != http::verb::get) co_return co_await method_not_allowed(s, req, "GET, HEAD");
    if (path.substr(11) != st.options.model)
      co_return co_await send_invalid(s, req, http::status::not_found,
                                      fmt::format("the model '{}' does not exist", path.substr(11, 128)),
                                      "model", "model_not_found");
    co_return co_await send(s, json_response(http::status::ok, req, model_json(st))) && req.keep_alive();
  }
  if (path == "/stats") {
    if (method != http::verb::get) co_return co_await method_not_allowed(s, req, "GET, HEAD");
    const Stats now = s.state->stats_snapshot();
    co_return co_await send(s, json_response(http::status::ok, req, stats_json(now))) && req.keep_alive();
  }
  if (path == "/healthz") {
    if (method != http::verb::get) co_return co_await method_not_allowed(s, req, "GET, HEAD");
    json::object o;
    o["status"] = "ok";
    o["model"] = st.options.model;
    co_return co_await send(s, json_response(http::status::ok, req, o)) && req.keep_alive();
  }
  co_return co_await send_invalid(s, req, http::status::not_found,
                                  fmt::format("no route {} {}", req.method_string(), full.substr(0, 128)), {},
                                  "not_found");
}

// --- connections ------------------------------------------------------------------

/// Reads requests off one connection and answers them, until either side ends it.
awaitable<void> serve_connection(std::shared_ptr<Session> self) {
  Session& s = *self;
  State& st = *s.state;
  const fairgate::http::ReadLimits limits{kMaxHeaderBytes, kMaxBodyBytes, st.options.request_timeout};
  // Not the stream's own timeout: that closes the socket, and the client
  // would get no 408. The deadline cancels the read and leaves the socket open.
  const auto cancel = [&s] {
    boost::system::error_code ignored;
    s.stream.socket().cancel(ignored);
  };
  for (;;) {
    if (st.stopping.load()) co_return;
    // Idle between requests: a connection may sit here for idle_timeout.
    bool idle_timed_out = false;
    if (!co_await fairgate::http::wait_for_request(s.stream, s.buffer, st.options.idle_timeout, cancel,
                                                   idle_timed_out))
      co_return;
    // The request has started: all of it must arrive within request_timeout.
    fairgate::http::ReadResult read =
        co_await fairgate::http::read_request(s.stream, s.buffer, limits, {}, cancel);
    if (read.error == fairgate::http::ReadError::closed) co_return;
    if (read.error != fairgate::http::ReadError::none) {
      Request dummy;
      dummy.version(11);
      dummy.keep_alive(false);
      co_await send_invalid(s, dummy, static_cast<http::status>(fairgate::http::error_status(read.error)),
                            fairgate::http::error_message(read, limits), {},
                            fairgate::http::error_reason(read.error));
      co_return;
    }
    const Request req = std::move(read.request);
    const bool keep = co_await handle(self, req);
    if (!keep || !req.keep_alive()) co_return;
  }
}

awaitable<void> run_session(std::shared_ptr<Session> self) {
  co_await fairgate::http::run_connection(self->stream, serve_connection(self));
  self->state->sessions.remove(self->id);
}

awaitable<void> accept_loop(std::shared_ptr<State> st) {
  fairgate::http::ListenerHooks hooks;
  hooks.stopping = [&st = *st] { return st.stopping.load(); };
  hooks.accepted = [st](tcp::socket socket) {
    auto session = st->sessions.add(
        [&](std::uint64_t id) { return std::make_shared<Session>(std::move(socket), st, id); });
    const auto executor = session->stream.get_executor();
    net::co_spawn(executor, run_session(std::move(session)), net::detached);
  };
  co_await fairgate::http::accept_loop(st->acceptor, st->executor, std::move(hooks));
}

void validate(const Options& o) {
  const auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
  if (!std::isfinite(o.tokens_per_second) || o.tokens_per_second <= 0)
    fail(fmt::format("tokens_per_second: {} must be > 0", o.tokens_per_second));
  if (o.tokens < 1) fail("tokens: 0 must be >= 1");
  if (o.first_token_delay.count() < 0) fail("first_token_delay: must not be negative");
  if (o.model.empty()) fail("model: must not be empty");
  if (o.request_timeout.count() <= 0 || o.idle_timeout.count() <= 0 || o.write_timeout.count() <= 0)
    fail("timeouts must be > 0");
}

}  // namespace

// --- Server -----------------------------------------------------------------------

Server::Server(net::any_io_executor executor, Options options) {
  validate(options);
  boost::system::error_code ec;
  const auto address = net::ip::make_address(options.host, ec);
  if (ec) throw std::invalid_argument(fmt::format("host: \"{}\" is not an IP address", options.host));
  const tcp::endpoint endpoint(address, options.port);
  state_ = std::make_shared<detail::ServerState>(std::move(executor), std::move(options));
  try {
    state_->acceptor.open(endpoint.protocol());
    state_->acceptor.set_option(net::socket_base::reuse_address(true));
    state_->acceptor.bind(endpoint);
    state_->acceptor.listen(net::socket_base::max_listen_connections);
  } catch (const boost::system::system_error& e) {
    throw std::runtime_error(fmt::format("cannot listen on {}:{}: {}", state_->options.host,
                                         state_->options.port, e.code().message()));
  }
  state_->bound = state_->acceptor.local_endpoint();
}

Server::~Server() { stop(); }

tcp::endpoint Server::endpoint() const { return state_->bound; }

void Server::start() {
  if (state_->started.exchange(true)) return;
  net::co_spawn(state_->acceptor_strand, accept_loop(state_), net::detached);
}

void Server::stop() {
  if (state_->stopping.exchange(true)) return;
  auto st = state_;
  net::post(st->acceptor_strand, [st] {
    boost::system::error_code ignored;
    st->acceptor.close(ignored);
  });
  for (auto& s : st->sessions.all()) net::post(s->stream.get_executor(), [s] { s->close(); });
}

Stats Server::stats() const { return state_->stats_snapshot(); }

}  // namespace fairgate::mockllm
