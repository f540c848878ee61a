// cli/demo/demo.cpp — `fairgate demo`: the seeds' "10 users, 3 seats, 2 instances"
// story, live, through the real gateway (docs/product.md S5).
//
// The set-up (cli/demo/stage.hpp): a mock model (mockllm::Server, at most --seats answers at once,
// it answers 429 above that) behind two gateway front ends, A and B
// (serve::Server with one OpenAI-compatible [[route]]), which share one
// limiter "chat" of --seats seats. By default everything runs in this process
// on the memory backend; with --redis the gateways are two `fairgate serve`
// child processes on that Redis, and the mock stays in this process.
//
// Every user is an HTTP client asking the chatbot a question (a streaming chat
// completion) at about the same moment, in a shuffled, seeded order, through
// gateway A or B in turn. What a user sees comes only from its SSE stream:
// `event: queue` (position while waiting), the first answer chunk (it has a
// seat), the tokens, `data: [DONE]` (the seat is given back), or an error with
// code "queue_timeout" after --max-wait (the seed's "system busy" rejection).
// A user asks only after the previous one got its first event, so the
// arrival order at the limiter is exactly the demo's.
//
// The summary then checks, from the clients' view and the mock's counters:
// never more than --seats answers at once and the model never refused one
// (F1), seats handed out in arrival order (F2), the max wait kept (F3), every
// request ended exactly once (F4), and the limiter empty at the end
// (cli/demo/checks.hpp, pure and unit-tested).
#include "cli/command.hpp"
#include "cli/demo/checks.hpp"
#include "cli/demo/stage.hpp"
#include "cli/duration.hpp"
#include "cli/parse.hpp"
#include "cli/sse.hpp"
#include "cli/style.hpp"

#include "mockllm/mock_llm.hpp"
#include "redis/url.hpp"

#include <fairgate/fairgate.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace fairgate::cli {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace json = boost::json;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

using demo::kLimiterName;
using demo::kRoutePath;
using demo::kTenantHeader;
constexpr std::string_view kBusyText = "The system is busy, please try again later";
/// Above this many users the timeline leaves out position changes and
/// streaming progress, and the summary leaves out the per-user table.
constexpr std::size_t kDetailLimit = 30;
/// Completion token that reports errors as values (named: no temporaries inside co_await).
constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

// ---------------------------------------------------------------- options

/// The flags as typed; validated by make_config().
struct DemoFlags {
  std::string users = "10";
  std::string seats = "3";
  std::string max_wait = "4s";
  std::string tokens = "20";
  std::string tokens_per_second = "15";
  std::string seed = "148";
  std::string speed = "1";
  std::string redis;
  bool no_color = false;
  bool quiet = false;
};

struct DemoConfig {
  std::uint32_t users = 10;
  std::uint32_t seats = 3;
  milliseconds max_wait{4000};
  std::uint32_t tokens = 20;  ///< shortest answer; the longest is twice this
  std::uint32_t tokens_per_second = 15;
  std::uint64_t seed = 148;
  double speed = 1.0;
  std::string redis;  ///< empty: the memory backend in this process
  std::optional<redis::Target> redis_target;
  bool color = false;
  bool quiet = false;
};

DemoConfig make_config(const DemoFlags& flags) {
  DemoConfig c;
  c.users = static_cast<std::uint32_t>(checked("--users", parse_count(flags.users, 1, 1000)));
  c.seats = static_cast<std::uint32_t>(checked("--seats", parse_count(flags.seats, 1, 1000)));
  c.max_wait = checked("--max-wait", parse_duration(flags.max_wait));
  if (c.max_wait > kMaxWaitLimit) {
    throw UsageError(fmt::format("--max-wait: {} is above {}", format_duration(c.max_wait),
                                 format_duration(kMaxWaitLimit)));
  }
  c.tokens = static_cast<std::uint32_t>(checked("--tokens", parse_count(flags.tokens, 1, 10'000)));
  c.tokens_per_second = static_cast<std::uint32_t>(
      checked("--tokens-per-second", parse_count(flags.tokens_per_second, 1, 10'000)));
  c.seed = checked("--seed", parse_count(flags.seed, 0, UINT64_MAX));
  c.speed = checked("--speed", parse_number(flags.speed, 0.01, 1000));
  // The limiter waits max_wait / speed of real time; that too has the limiter's bound.
  if (static_cast<double>(c.max_wait.count()) / c.speed > static_cast<double>(kMaxWaitLimit.count())) {
    throw UsageError(fmt::format("--max-wait: {} at --speed {} is more than {} of real time",
                                 format_duration(c.max_wait), c.speed, format_duration(kMaxWaitLimit)));
  }
  if (!flags.redis.empty()) {
    auto parsed = redis::parse_target(flags.redis);
    if (const auto* problem = std::get_if<std::string>(&parsed)) throw UsageError("--redis: " + *problem);
    c.redis = flags.redis;
    c.redis_target = std::get<redis::Target>(std::move(parsed));
  }
  c.color = !flags.no_color && Style::wanted_for(stdout);
  c.quiet = flags.quiet;
  return c;
}
// ---------------------------------------------------------------- helpers

/// SplitMix64: small, fast, and the same sequence on every platform (unlike
/// the std distributions), so a seed tells the same story everywhere.
class Random {
 public:
  explicit Random(std::uint64_t seed) noexcept : state_(seed) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform in lo..hi (inclusive); the modulo bias is irrelevant here.
  std::uint64_t between(std::uint64_t lo, std::uint64_t hi) noexcept { return lo + next() % (hi - lo + 1); }

 private:
  std::uint64_t state_;
};

std::string seconds_text(double s) { return fmt::format("{:.2f}s", s); }

// ---------------------------------------------------------------- the demo

using demo::ended;
using demo::ordinal;
using demo::Phase;

/// One user: what it saw (demo::Seen, what the checks read) and its client.
struct User : demo::Seen {
  std::size_t number = 0;         ///< the n of user-n
  std::size_t plan_index = 0;     ///< place in the planned arrival order
  double arrive_offset = 0;       ///< planned arrival, story seconds after the start
  std::size_t gateway = 0;        ///< 0 = A, 1 = B
  bool first_event = false;       ///< a queue event, the first chunk or an end arrived
  std::size_t told_position = 0;  ///< last queue position shown
  std::optional<beast::tcp_stream> stream;
};

using demo::Gateway;

class Demo {
 public:
  Demo(asio::io_context& io, DemoConfig config)
      : io_(io),
        config_(std::move(config)),
        style_(config_.color),
        detail_(!config_.quiet && config_.users <= kDetailLimit),
        arrival_timer_(io),
        watchdog_(io),
        stop_timer_(io),
        signals_(io, SIGINT, SIGTERM) {
    // The limiter and the model run in real time; the story is shown at --speed scale.
    const double real_ms = static_cast<double>(config_.max_wait.count()) / config_.speed;
    real_max_wait_ = milliseconds(std::llround(real_ms));
    if (config_.max_wait.count() > 0 && real_max_wait_.count() == 0) real_max_wait_ = milliseconds(1);
    make_users();
    demo::StageOptions o;
    o.seats = config_.seats;
    o.tokens = config_.tokens;
    o.tokens_per_second = static_cast<double>(config_.tokens_per_second) * config_.speed;
    o.max_wait = real_max_wait_;
    o.redis = config_.redis;
    stage_ = std::make_unique<demo::Stage>(io_, o);
  }

  Demo(const Demo&) = delete;
  Demo& operator=(const Demo&) = delete;

  int run() {
    stage_->start();
    print_header();
    start_ = Clock::now();
    schedule_arrival(0);
    arm_watchdog();
    signals_.async_wait([this](boost::system::error_code ec, int signo) {
      if (ec) return;
      interrupted_ = signo;
      stop_all();
    });
    // Until the tear-down is done (bounded by stop_timer_), then what it posted.
    while (!torn_down_ && !io_.stopped()) io_.run_one();
    for (int i = 0; i < 100 && !io_.stopped() && io_.run_one_for(milliseconds(20)) > 0; ++i) {
    }
    stage_->stop_processes();

    if (interrupted_ != 0) {
      std::fflush(stdout);
      std::fputs(fmt::format("fairgate demo: interrupted by signal {}\n", interrupted_).c_str(), stderr);
      return 128 + interrupted_;
    }
    return summarize();
  }

 private:
  // --- setup

  void make_users() {
    Random random(config_.seed);
    const std::size_t n = config_.users;
    const int width = std::max(2, static_cast<int>(fmt::format("{}", n).size()));
    users_.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      auto u = std::make_unique<User>();
      u->number = i + 1;
      u->name = fmt::format("user-{:0{}}", i + 1, width);
      u->tokens = static_cast<std::uint32_t>(random.between(config_.tokens, 2ULL * config_.tokens));
      users_.push_back(std::move(u));
    }
    // Arrival order: a seeded shuffle (Fisher-Yates), a few ms apart.
    planned_.clear();
    for (auto& u : users_) planned_.push_back(u.get());
    for (std::size_t i = n; i > 1; --i) std::swap(planned_[i - 1], planned_[random.between(0, i - 1)]);
    double t = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (i > 0) t += static_cast<double>(random.between(1, 5)) / 1000.0;
      planned_[i]->arrive_offset = t;
      planned_[i]->plan_index = i;
    }
  }

  // --- time: the limiter works in real time, the story is shown at --speed scale

  double story_seconds(Clock::duration real) const {
    return std::chrono::duration<double>(real).count() * config_.speed;
  }
  Clock::duration real_duration(double story_s) const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(story_s / config_.speed));
  }
  double now_story() const { return story_seconds(Clock::now() - start_); }
  long long story_ms(Clock::duration real) const { return std::llround(story_seconds(real) * 1000.0); }
  double max_answer_seconds() const {
    return 2.0 * config_.tokens / static_cast<double>(config_.tokens_per_second);
  }
  /// No single socket operation of a user may take longer than this (real time).
  Clock::duration io_bound() const {
    return real_max_wait_ + real_duration(max_answer_seconds()) + std::chrono::seconds(10);
  }

  // --- arrivals: at the planned time, but never before the previous user got its first event

  void schedule_arrival(std::size_t index) {
    if (index >= planned_.size() || stopping_) return;
    arrival_timer_.expires_at(std::max(Clock::now(), start_ + real_duration(planned_[index]->arrive_offset)));
    arrival_timer_.async_wait([this, index](boost::system::error_code ec) {
      if (ec || stopping_) return;
      arrive(*planned_[index]);
    });
  }

  void arrive(User& u) {
    u.phase = Phase::waiting;
    u.arrived_at = Clock::now();
    u.arrival_rank = ++arrivals_;
    u.gateway = (u.arrival_rank - 1) % stage_->gateways().size();
    ++stage_->gateways()[u.gateway].users;
    arrival_order_.push_back(&u);
    asio::co_spawn(io_, ask(u), asio::detached);
  }

  void got_first_event(User& u) {
    if (u.first_event) return;
    u.first_event = true;
    schedule_arrival(u.plan_index + 1);
  }

  std::string request_body(const User& u) const {
    json::object message;
    message["role"] = "user";
    message["content"] = fmt::format("Hi, I am {}. What can fairgate do for me?", u.name);
    json::array messages;
    messages.push_back(std::move(message));
    json::object body;
    body["model"] = "fairgate-mock";
    body["messages"] = std::move(messages);
    body["stream"] = true;
    body["max_tokens"] = u.tokens;
    return json::serialize(body);
  }

  // --- one user: an HTTP client reading its SSE stream

  asio::awaitable<void> ask(User& u) {
    const Gateway& gw = stage_->gateways()[u.gateway];
    u.stream.emplace(io_);
    beast::tcp_stream& stream = *u.stream;
    const tcp::endpoint endpoint = gw.endpoint;
    stream.expires_after(io_bound());
    auto [connect_ec] = co_await stream.async_connect(endpoint, kTuple);
    if (connect_ec) {
      end_other(u, fmt::format("cannot connect to gateway {}: {}", gw.label, connect_ec.message()));
      co_return;
    }
    http::request<http::string_body> req{http::verb::post, std::string(kRoutePath), 11};
    req.set(http::field::host, gw.url.substr(gw.url.find("//") + 2));
    req.set(http::field::content_type, "application/json");
    req.set(http::field::accept, "text/event-stream");
    req.set(kTenantHeader, u.name);
    req.body() = request_body(u);
    req.prepare_payload();
    stream.expires_after(io_bound());
    auto [write_ec, written] = co_await http::async_write(stream, req, kTuple);
    if (write_ec) {
      end_other(u, fmt::format("gateway {}: {}", gw.label, write_ec.message()));
      co_return;
    }

    beast::flat_buffer buffer;
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    stream.expires_after(io_bound());
    auto [header_ec, header_bytes] = co_await http::async_read_header(stream, buffer, parser, kTuple);
    if (header_ec) {
      end_other(u, fmt::format("gateway {}: {}", gw.label, header_ec.message()));
      co_return;
    }
    const auto status = parser.get().result();
    const auto type = parser.get()[http::field::content_type];
    const bool sse = std::string_view(type.data(), type.size()).starts_with("text/event-stream");

    SseReader reader;
    std::string body;  // a plain answer (an early 429, an error)
    std::array<char, 4096> chunk{};
    boost::system::error_code read_ec;
    while (!parser.is_done() && !stopping_) {
      parser.get().body().data = chunk.data();
      parser.get().body().size = chunk.size();
      stream.expires_after(io_bound());
      auto [ec, n] = co_await http::async_read_some(stream, buffer, parser, kTuple);
      const std::size_t got = chunk.size() - parser.get().body().size;
      if (sse) {
        reader.feed(std::string_view(chunk.data(), got), [&](const SseEvent& e) { on_event(u, e); });
      } else if (body.size() < 64 * 1024) {
        body.append(chunk.data(), got);
      }
      if (ec == http::error::need_buffer) ec = {};
      if (ec) {
        read_ec = ec;
        break;
      }
    }
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.close();
    if (ended(u.phase) || stopping_) co_return;
    if (!sse) {
      on_plain_answer(u, status, body);
    } else if (read_ec) {
      end_other(u, fmt::format("gateway {}: {}", gw.label, read_ec.message()));
    } else {
      end_other(u, "the stream ended without [DONE]");
    }
  }

  /// A response that is not an event stream: the gateway turned the request down at once.
  void on_plain_answer(User& u, http::status status, const std::string& body) {
    boost::system::error_code ec;
    const json::value v = json::parse(body, ec);
    const json::object* error = nullptr;
    if (!ec && v.is_object()) {
      if (const auto* e = v.as_object().if_contains("error"); e != nullptr && e->is_object())
        error = &e->as_object();
    }
    if (error != nullptr) {
      on_error(u, *error);
      return;
    }
    end_other(u, fmt::format("HTTP {}", static_cast<unsigned>(status)));
  }

  void on_event(User& u, const SseEvent& e) {
    if (stopping_) return;
    if (e.name == "queue") {
      if (ended(u.phase)) return;
      boost::system::error_code ec;
      const json::value v = json::parse(e.data, ec);
      if (ec || !v.is_object()) return;
      const auto position = int_field(v.as_object(), "position");
      const auto queued = int_field(v.as_object(), "queued");
      const auto estimate = int_field(v.as_object(), "estimated_wait_ms");
      if (!position || !queued) return;
      got_first_event(u);
      on_queued(u, static_cast<std::size_t>(*position), static_cast<std::size_t>(*queued), estimate);
      return;
    }
    if (e.name == "admitted") {
      u.admitted_at = Clock::now();
      boost::system::error_code ec;
      const json::value v = json::parse(e.data, ec);
      if (ec || !v.is_object()) return;
      if (const auto waited = int_field(v.as_object(), "waited_ms")) u.admitted_after = milliseconds(*waited);
      return;
    }
    if (e.data == "[DONE]") {
      if (ended(u.phase)) {
        ++u.ends;
      } else if (u.phase == Phase::streaming) {
        on_done(u);
      } else {
        end_other(u, "[DONE] before any answer");
      }
      return;
    }
    boost::system::error_code ec;
    const json::value v = json::parse(e.data, ec);
    if (ec || !v.is_object()) return;
    const json::object& o = v.as_object();
    if (const auto* error = o.if_contains("error"); error != nullptr && error->is_object()) {
      if (ended(u.phase)) {
        ++u.ends;
        return;
      }
      on_error(u, error->as_object());
      return;
    }
    const auto* choices = o.if_contains("choices");
    if (choices == nullptr || !choices->is_array() || choices->as_array().empty() || ended(u.phase)) return;
    if (u.phase == Phase::waiting) on_seat(u);
    const auto* choice = choices->as_array().front().if_object();
    const auto* delta = choice != nullptr ? choice->if_contains("delta") : nullptr;
    if (delta != nullptr && delta->is_object() && !string_field(delta->as_object(), "content").empty())
      on_token(u);
  }

  void on_queued(User& u, std::size_t position, std::size_t queued, std::optional<std::int64_t> estimate_ms) {
    if (u.phase != Phase::waiting || position == u.told_position) return;
    const bool first = u.told_position == 0;
    u.told_position = position;
    if (config_.quiet || (!first && !detail_)) return;
    // The estimate comes from the recent service rate; until a first answer
    // has finished and freed a seat there is no service rate to speak of.
    std::string estimate = "no estimate yet";
    if (estimate_ms && released_ > 0) {
      estimate = "est. wait ";
      estimate += seconds_text(story_seconds(milliseconds(*estimate_ms)));
    }
    if (first) {
      line(u, fmt::format("arrives {} via gateway {}, {} at position {} of {}  ({})", ordinal(u.arrival_rank),
                          stage_->gateways()[u.gateway].label, style_.yellow("queued"), position, queued,
                          estimate));
    } else {
      line(u, fmt::format("now at position {} of {}  ({})", position, queued, estimate));
    }
  }

  void on_seat(User& u) {
    u.phase = Phase::streaming;
    u.seated_at = Clock::now();
    got_first_event(u);
    ++in_use_;
    seat_order_.push_back(&u);
    if (config_.quiet) return;
    const std::string seats = style_.dim(fmt::format("[seats {}/{}]", in_use_, config_.seats));
    if (u.told_position == 0) {
      line(u, fmt::format("arrives {} via gateway {}, {} (waited {} ms)  {}", ordinal(u.arrival_rank),
                          stage_->gateways()[u.gateway].label, style_.green("gets a seat"),
                          story_ms(u.waited()), seats));
    } else {
      line(u, fmt::format("{} after waiting {}  {}", style_.green("gets a seat"),
                          seconds_text(story_seconds(u.waited())), seats));
    }
  }

  void on_token(User& u) {
    const std::uint32_t before = u.streamed++;
    // About one progress line per story second.
    if (detail_ && u.streamed < u.tokens &&
        u.streamed / config_.tokens_per_second > before / config_.tokens_per_second) {
      line(u, fmt::format("{} {} {}/{} tokens", style_.dim("streaming"), bar(u.streamed, u.tokens),
                          u.streamed, u.tokens));
    }
  }

  std::string bar(std::uint32_t done, std::uint32_t total) const {
    constexpr std::uint32_t kWidth = 20;
    const std::uint32_t filled = total == 0 ? kWidth : std::min(done, total) * kWidth / total;
    std::string out = "[";
    out += style_.cyan(std::string(filled, '#'));
    out += std::string(kWidth - filled, '-');
    out += ']';
    return out;
  }

  // --- the single end of every request

  void on_done(User& u) {
    --in_use_;
    ++released_;
    end(u, Phase::done);
    if (!config_.quiet) {
      line(u, fmt::format("done: {} tokens in {}, seat released  {}", u.streamed,
                          seconds_text(story_seconds(u.ended_at - u.seated_at)),
                          style_.dim(fmt::format("[seats {}/{}]", in_use_, config_.seats))));
    }
    user_finished();
  }

  void on_error(User& u, const json::object& error) {
    const std::string code = string_field(error, "code");
    if (code != "queue_timeout") {
      std::string text = code.empty() ? std::string("error") : code;
      text += ": ";
      text += string_field(error, "message");
      end_other(u, text);
      return;
    }
    if (u.phase == Phase::streaming) --in_use_;
    u.message = string_field(error, "message");
    end(u, Phase::busy);
    if (!config_.quiet) {
      line(u, fmt::format("{}: no seat within {} \u2014 \"{}\" (REJECT)", style_.red("busy"),
                          format_duration(config_.max_wait), kBusyText));
    }
    user_finished();
  }

  void end_other(User& u, std::string text) {
    if (ended(u.phase)) {
      ++u.ends;
      return;
    }
    if (u.phase == Phase::streaming) --in_use_;
    u.message = std::move(text);
    end(u, Phase::other);
    if (!config_.quiet && !stopping_) line(u, fmt::format("{}: {}", style_.red("ended"), u.message));
    user_finished();
  }

  void end(User& u, Phase phase) {
    ++u.ends;
    u.phase = phase;
    u.ended_at = Clock::now();
    got_first_event(u);  // the next user may ask
  }

  void user_finished() {
    if (++finished_ < users_.size()) return;
    finished_at_ = Clock::now();
    watchdog_.cancel();
    asio::co_spawn(io_, wrap_up(), asio::detached);
  }

  // --- the end: the limiter's state, the model's counters, then the tear-down

  asio::awaitable<void> wrap_up() {
    // The gateway releases a permit just after the answer's last bytes went
    // out, so the limiter may need a moment to show the last seat free.
    asio::steady_timer pause(io_);
    for (int attempt = 0; attempt < 100 && !stopping_; ++attempt) {
      auto snapshot = co_await get_limiter(stage_->gateways().front());
      if (snapshot) {
        final_in_use_ = int_field(*snapshot, "in_use");
        final_queued_ = int_field(*snapshot, "queued");
        if (final_in_use_ == 0 && final_queued_ == 0) break;
      }
      pause.expires_after(milliseconds(20));
      auto [ec] = co_await pause.async_wait(kTuple);
      if (ec) break;
    }
    model_stats_ = stage_->model_stats();
    tear_down();
  }

  /// GET /v1/limiters/chat from one gateway.
  asio::awaitable<std::optional<json::object>> get_limiter(const Gateway& gw) {
    beast::tcp_stream stream(io_);
    stream.expires_after(std::chrono::seconds(2));
    const tcp::endpoint endpoint = gw.endpoint;
    auto [connect_ec] = co_await stream.async_connect(endpoint, kTuple);
    if (connect_ec) co_return std::nullopt;
    const std::string target = fmt::format("/v1/limiters/{}", kLimiterName);
    http::request<http::empty_body> req{http::verb::get, target, 11};
    req.set(http::field::host, gw.url.substr(gw.url.find("//") + 2));
    auto [write_ec, written] = co_await http::async_write(stream, req, kTuple);
    if (write_ec) co_return std::nullopt;
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    auto [read_ec, read] = co_await http::async_read(stream, buffer, res, kTuple);
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    if (read_ec || res.result() != http::status::ok) co_return std::nullopt;
    boost::system::error_code ec;
    json::value v = json::parse(res.body(), ec);
    if (ec || !v.is_object()) co_return std::nullopt;
    json::object out = std::move(v.as_object());
    co_return out;
  }

  void tear_down() {
    if (tearing_down_) return;
    tearing_down_ = true;
    arrival_timer_.cancel();
    watchdog_.cancel();
    signals_.cancel();
    // Bound the whole tear-down: whatever is still open then is abandoned.
    stop_timer_.expires_after(demo::Stage::kStopTimeout);
    stop_timer_.async_wait([this](boost::system::error_code ec) {
      if (!ec) io_.stop();
    });
    stage_->stop([this] {
      stop_timer_.cancel();
      torn_down_ = true;
    });
  }

  // --- the bound on the whole run, and stopping early

  void arm_watchdog() {
    // Each user ends within max_wait of asking, plus one answer if served;
    // asking waits for the previous user's first event (a few ms of real time).
    const double last_arrival = planned_.empty() ? 0.0 : planned_.back()->arrive_offset;
    watchdog_story_s_ =
        last_arrival + static_cast<double>(config_.max_wait.count()) / 1000.0 + max_answer_seconds() + 2.0;
    const auto asking = milliseconds(20) * users_.size();
    watchdog_.expires_at(start_ + real_duration(watchdog_story_s_) + asking + std::chrono::seconds(5));
    watchdog_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      violations_.push_back(fmt::format("only {} of {} users finished within {} (every request must end)",
                                        finished_, users_.size(), seconds_text(now_story())));
      stop_all();
    });
  }

  void stop_all() {
    if (stopping_) return;
    stopping_ = true;
    arrival_timer_.cancel();
    for (auto& u : users_) {
      if (u->stream) u->stream->cancel();
    }
    model_stats_ = stage_->model_stats();
    tear_down();
  }

  // --- output

  void line(const User& u, std::string_view text) {
    const std::string stamp = fmt::format("{:8.3f}s", now_story());
    const std::string out =
        fmt::format("{}  {}  {}\n", style_.dim(stamp), style_.pick(u.number - 1, u.name), text);
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
  }

  void print_header() {
    const auto& c = config_;
    const std::string where = c.redis.empty() ? std::string("memory backend, one process")
                                              : fmt::format("Redis {}", c.redis_target->redacted());
    std::string out = fmt::format("{} \u2014 {} users, {} seats, max wait {}  ({}, seed {})\n",
                                  style_.bold("fairgate demo"), c.users, c.seats, format_duration(c.max_wait),
                                  where, c.seed);
    out += fmt::format("A mock model ({}) streams answers and refuses more than {} at once.\n",
                       stage_->model_url(), c.seats);
    if (c.redis.empty()) {
      out += fmt::format(
          "In front of it, two gateways in this process, A ({}) and B ({}),\n"
          "share one limiter \"{}\" of {} seats; users ask A and B in turn.\n",
          stage_->gateways()[0].url, stage_->gateways()[1].url, kLimiterName, c.seats);
    } else {
      out += fmt::format(
          "In front of it, two `fairgate serve` processes, A ({}, pid {})\n"
          "and B ({}, pid {}), share one limiter \"{}\" of {} seats through Redis;\n"
          "users ask A and B in turn.\n",
          stage_->gateways()[0].url, stage_->gateway_pids().at(0), stage_->gateways()[1].url,
          stage_->gateway_pids().at(1), kLimiterName, c.seats);
    }
    out += fmt::format(
        "Each user asks a question at about the same moment; each answer streams {}-{} tokens\n"
        "at {} tokens/s. Only {} answer{} may stream at once: the others wait in one fair FIFO\n"
        "queue, and whoever still waits after {} is told the system is busy.\n",
        c.tokens, 2 * c.tokens, c.tokens_per_second, c.seats, c.seats == 1 ? "" : "s",
        format_duration(c.max_wait));
    if (c.speed != 1.0)
      out += fmt::format("Running {}x faster; all times are shown at story scale.\n", c.speed);
    if (!c.quiet && !detail_) {
      out += fmt::format("More than {} users: queue moves and streaming progress are not shown.\n",
                         kDetailLimit);
    }
    out += "\n";
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
  }

  std::string names(const std::vector<const User*>& list) const {
    constexpr std::size_t kShown = 20;
    std::string out;
    for (std::size_t i = 0; i < list.size() && i < kShown; ++i) {
      if (i > 0) out += ' ';
      out += list[i]->name;
    }
    if (list.size() > kShown) out += fmt::format(" ... ({} more)", list.size() - kShown);
    if (list.empty()) out = "(none)";
    return out;
  }

  /// Prints the summary, checks the invariants, returns the exit code.
  int summarize() {
    const std::size_t n = users_.size();
    std::vector<const demo::Seen*> users, by_arrival(arrival_order_.begin(), arrival_order_.end());
    std::vector<double> granted_waits, busy_waits;
    for (const auto& u : users_) {
      users.push_back(u.get());
      if (u->phase == Phase::done) granted_waits.push_back(story_seconds(u->waited()));
      if (u->phase == Phase::busy) busy_waits.push_back(story_seconds(u->waited()));
    }
    const auto& m = model_stats_;
    demo::Facts facts;
    facts.real_max_wait = real_max_wait_;
    facts.seats = config_.seats;
    facts.arrivals = arrivals_;
    facts.model_peak_in_flight = m.peak_in_flight;
    facts.model_rejected_429 = m.rejected_429;
    facts.model_completed = m.completed;
    facts.final_in_use = final_in_use_;
    facts.final_queued = final_queued_;
    const demo::Verdict verdict = demo::check(users, by_arrival, facts);
    violations_.insert(violations_.end(), verdict.violations.begin(), verdict.violations.end());
    const std::size_t granted = verdict.granted, busy = verdict.busy, other = verdict.other;
    const auto& fifo_problem = verdict.fifo_problem;
    const bool limiter_empty = verdict.limiter_empty;

    std::string out = "\n";
    out += style_.bold("Summary");
    out += "\n";
    if (n <= kDetailLimit) {
      out += style_.dim("  asked  user      via  outcome   waited   tokens   held");
      out += "\n";
      for (const User* u : arrival_order_) {
        std::string outcome = "waiting?", tokens = "-", held = "-";
        switch (u->phase) {
          case Phase::done:
            outcome = style_.green("seat   ");
            tokens = fmt::format("{}", u->streamed);
            held = seconds_text(story_seconds(u->ended_at - u->seated_at));
            break;
          case Phase::busy: outcome = style_.red("busy   "); break;
          case Phase::other: outcome = style_.red("error  "); break;
          default: break;
        }
        out += fmt::format("  {:>5}  {:<8}  {:>3}  {}   {:>6}   {:>6}   {}\n", ordinal(u->arrival_rank),
                           u->name, stage_->gateways()[u->gateway].label, outcome,
                           seconds_text(story_seconds(u->waited())), tokens, held);
      }
      out += "\n";
    }
    const auto range = [&](std::vector<double> v) {
      if (v.empty()) return std::string("-");
      std::sort(v.begin(), v.end());
      if (seconds_text(v.front()) == seconds_text(v.back())) return seconds_text(v.front());
      return fmt::format("{} .. {} (median {})", seconds_text(v.front()), seconds_text(v.back()),
                         seconds_text(v[v.size() / 2]));
    };
    const auto yes_no = [&](bool ok) { return ok ? style_.green("yes") : style_.red("NO"); };

    out += fmt::format("  users:             {} arrived, {} got a seat, {} busy{}\n", arrivals_, granted,
                       busy, other > 0 ? fmt::format(", {} other", other) : "");
    if (finished_at_ != Clock::time_point{}) {
      out += fmt::format("  total time:        {}\n", seconds_text(story_seconds(finished_at_ - start_)));
    }
    out += fmt::format("  gateways:          A {} asked by {}, B {} asked by {}\n", stage_->gateways()[0].url,
                       stage_->gateways()[0].users, stage_->gateways()[1].url, stage_->gateways()[1].users);
    out += fmt::format("  arrival order:     {}\n", names(arrival_order_));
    out += fmt::format("  service order:     {}\n", names(seat_order_));
    out += fmt::format("  FIFO held:         {} \u2014 {}\n", yes_no(!fifo_problem),
                       fifo_problem ? *fifo_problem : "every seat went to the user waiting longest");
    out += fmt::format(
        "  max concurrent:    {} of {} seats (answers in flight at the model, {} refused) \u2014 {}\n",
        m.peak_in_flight, config_.seats, m.rejected_429,
        verdict.under_cap ? "never above the cap" : style_.red("ABOVE THE CAP"));
    out += fmt::format("  waited for a seat: {}\n", range(granted_waits));
    if (!busy_waits.empty()) out += fmt::format("  told busy after:   {}\n", range(busy_waits));
    out += fmt::format("  ended once each:   {}\n",
                       yes_no(std::all_of(users_.begin(), users_.end(), [](const auto& u) {
                         return u->ends == 1 && (u->phase != Phase::done || u->streamed == u->tokens);
                       })));
    out += fmt::format("  model:             {} requests, {} answers completed, {} refused (429)\n",
                       m.requests, m.completed, m.rejected_429);
    out += fmt::format("  limiter at end:    in use {}, queued {} \u2014 {}\n",
                       final_in_use_ ? fmt::format("{}", *final_in_use_) : "?",
                       final_queued_ ? fmt::format("{}", *final_queued_) : "?",
                       limiter_empty ? "every seat given back" : style_.red("NOT EMPTY"));
    out += "\n";
    if (violations_.empty()) {
      out += style_.green("All invariants held");
      out += fmt::format(
          ": at most {} of {} seats in use, seats in arrival order, max wait kept, "
          "every request ended exactly once.\n",
          m.peak_in_flight, config_.seats);
    } else {
      out += style_.red("INVARIANTS VIOLATED");
      out += ":\n";
      for (const auto& v : violations_) {
        out += "  - ";
        out += v;
        out += "\n";
      }
    }
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
    if (violations_.empty()) return kExitOk;
    std::string first = violations_.front();
    if (violations_.size() > 1) first += fmt::format(" (and {} more)", violations_.size() - 1);
    std::fputs(fmt::format("fairgate demo: invariant violated: {}\n", first).c_str(), stderr);
    return kExitFailure;
  }

  asio::io_context& io_;
  const DemoConfig config_;
  const Style style_;
  const bool detail_;
  milliseconds real_max_wait_{0};
  Clock::time_point start_{};

  std::unique_ptr<demo::Stage> stage_;  ///< the model and the two gateways

  std::vector<std::unique_ptr<User>> users_;
  std::vector<User*> planned_;              ///< planned arrival order
  std::vector<const User*> arrival_order_;  ///< order the requests were sent
  std::vector<const User*> seat_order_;     ///< order the first answer chunks arrived

  std::size_t arrivals_ = 0;
  std::size_t finished_ = 0;
  std::size_t released_ = 0;
  Clock::time_point finished_at_{};
  std::size_t in_use_ = 0;  ///< live count for the timeline
  mockllm::Stats model_stats_;
  std::optional<std::int64_t> final_in_use_;
  std::optional<std::int64_t> final_queued_;
  std::vector<std::string> violations_;

  asio::steady_timer arrival_timer_;
  asio::steady_timer watchdog_;
  asio::steady_timer stop_timer_;
  double watchdog_story_s_ = 0;
  asio::signal_set signals_;
  int interrupted_ = 0;
  bool stopping_ = false;
  bool tearing_down_ = false;
  bool torn_down_ = false;
};

constexpr std::string_view kDescription =
    "Show the seeds' story live: users ask a chatbot at the same moment, but only --seats answers\n"
    "may stream at once. The others wait in one fair FIFO queue and see their position; whoever\n"
    "still waits after --max-wait is told \"The system is busy, please try again later\".\n"
    "Everything is real: a mock model (at most --seats answers at once) behind two gateways,\n"
    "A and B, sharing one limiter; the users are HTTP clients streaming chat completions\n"
    "through A and B in turn. By default all of it runs in this process on the memory backend;\n"
    "with --redis the gateways are two `fairgate serve` processes on that Redis.\n"
    "Then it checks the guarantees: never more than --seats in use (the model never refused\n"
    "one), seats handed out in arrival order, the max wait kept, every request ended once.\n"
    "Exit code 0 when they held, 1 when not (or when Redis cannot be reached), 2 for bad flags.";

}  // namespace

Command add_demo_command(CLI::App& root) {
  auto flags = std::make_shared<DemoFlags>();
  CLI::App* app = root.add_subcommand(
      "demo", "The seeds' \"10 users, 3 seats, 2 instances\" story, live, through two gateways");
  app->footer(std::string(kDescription));
  app->add_option("--users", flags->users, "Users asking at once, 1..1000")
      ->type_name("N")
      ->default_str(flags->users);
  app->add_option("--seats", flags->seats, "Answers allowed to stream at once (max_concurrent), 1..1000")
      ->type_name("N")
      ->default_str(flags->seats);
  app->add_option("--max-wait", flags->max_wait, "How long a user waits before \"busy\", e.g. 250ms, 20s, 5m")
      ->type_name("DURATION")
      ->default_str(flags->max_wait);
  app->add_option("--tokens", flags->tokens,
                  "Shortest answer in tokens (the longest is twice as long), 1..10000")
      ->type_name("N")
      ->default_str(flags->tokens);
  app->add_option("--tokens-per-second", flags->tokens_per_second,
                  "Streaming speed of the mock model, 1..10000")
      ->type_name("N")
      ->default_str(flags->tokens_per_second);
  app->add_option("--seed", flags->seed, "Seed for arrival order and answer lengths")
      ->type_name("N")
      ->default_str(flags->seed);
  app->add_option("--speed", flags->speed,
                  "Run FACTOR times faster (times are shown at story scale), 0.01..1000")
      ->type_name("FACTOR")
      ->default_str(flags->speed);
  app->add_option("--redis", flags->redis,
                  "Run the gateways as two `fairgate serve` processes on this Redis: redis://host:port[/db], "
                  "redis+cluster://..., redis+sentinel://..., rediss... for TLS")
      ->type_name("URL");
  app->add_flag("--no-color", flags->no_color, "No colors (they are off anyway unless stdout is a terminal)");
  app->add_flag("-q,--quiet", flags->quiet, "Only the header and the summary, no live timeline");

  return Command{app, [flags]() {
                   const DemoConfig config = make_config(*flags);
                   asio::io_context io(1);
                   Demo demo(io, config);
                   return demo.run();
                 }};
}

}  // namespace fairgate::cli
