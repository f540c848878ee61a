// cli/demo/client.hpp — the users of `fairgate demo` as HTTP clients: each
// asks the chatbot through its gateway (a streaming chat completion) and
// learns everything from its own SSE stream: `event: queue` (its position),
// `event: admitted`, the first answer chunk (it has a seat), the tokens,
// `data: [DONE]`, or an error ("queue_timeout": the system is busy). Every
// request ends exactly once (Seen::ends counts any further end), and the
// story hears of it (Story::finished); the timeline lines are printed here.
#pragma once

#include "cli/demo/checks.hpp"
#include "cli/demo/render.hpp"
#include "cli/demo/stage.hpp"
#include "cli/sse.hpp"
#include "cli/style.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/json/object.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fairgate::cli::demo {

/// One user: what it saw (Seen, what the checks read) and its client.
struct User : Seen {
  std::size_t number = 0;         ///< the n of user-n
  std::size_t plan_index = 0;     ///< place in the planned arrival order
  double arrive_offset = 0;       ///< planned arrival, story seconds after the start
  std::size_t gateway = 0;        ///< 0 = A, 1 = B
  bool first_event = false;       ///< a queue event, the first chunk or an end arrived
  std::size_t told_position = 0;  ///< last queue position shown
  std::optional<boost::beast::tcp_stream> stream;
};

/// What the clients tell the story.
class Story {
 public:
  /// A queue event, the first chunk or an end: the next user may ask.
  virtual void first_event(User& u) = 0;
  /// The user's request ended (once per user).
  virtual void finished() = 0;

 protected:
  ~Story() = default;
};

struct ClientOptions {
  std::uint32_t seats = 0;
  std::uint32_t tokens_per_second = 0;    ///< at story scale
  std::chrono::milliseconds max_wait{0};  ///< at story scale, for the "busy" line
  bool quiet = false;                     ///< no timeline
  bool detail = false;                    ///< queue moves and streaming progress too
  Clock::duration io_bound{};             ///< bound on any one socket operation (real time)
};

class Client {
 public:
  /// `gateways` and `scale` must outlive the client (scale.start is read as it runs).
  Client(boost::asio::io_context& io, const std::vector<Gateway>& gateways, const Scale& scale,
         const Style& style, ClientOptions options, Story& story);
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// Sends u's question to its gateway and reads the answer to its end.
  boost::asio::awaitable<void> ask(User& u);
  /// From now on events are ignored and reads stop (streams are cancelled by the caller).
  void stop() { stopping_ = true; }
  /// Users in the order their first answer chunks arrived.
  const std::vector<const User*>& seat_order() const { return seat_order_; }

 private:
  std::string request_body(const User& u) const;
  void on_plain_answer(User& u, boost::beast::http::status status, const std::string& body);
  void on_event(User& u, const SseEvent& e);
  void on_answer_chunk(User& u, const boost::json::object& o);
  void on_queued(User& u, std::size_t position, std::size_t queued, std::optional<std::int64_t> estimate_ms);
  void on_seat(User& u);
  void on_token(User& u);
  void on_done(User& u);
  void on_error(User& u, const boost::json::object& error);
  void end_other(User& u, std::string text);
  void end(User& u, Phase phase);
  void line(const User& u, std::string_view text) const;
  std::string seats_text() const;

  boost::asio::io_context& io_;
  const std::vector<Gateway>& gateways_;
  const Scale& scale_;
  const Style& style_;
  const ClientOptions options_;
  Story& story_;
  std::vector<const User*> seat_order_;
  std::size_t in_use_ = 0;    ///< live count for the timeline
  std::size_t released_ = 0;  ///< answers done: the limiter's estimate means something from then on
  bool stopping_ = false;
};

}  // namespace fairgate::cli::demo
