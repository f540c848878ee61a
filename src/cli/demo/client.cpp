// cli/demo/client.cpp — the users' HTTP clients and what their SSE streams say (see client.hpp).
#include "cli/demo/client.hpp"

#include "http/client.hpp"

#include "cli/duration.hpp"

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>

#include <array>
#include <cstdio>
#include <limits>
#include <string_view>
#include <utility>

namespace fairgate::cli::demo {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace json = boost::json;
using asio::ip::tcp;
using std::chrono::milliseconds;

constexpr std::string_view kBusyText = "The system is busy, please try again later";

}  // namespace

Client::Client(asio::io_context& io, const std::vector<Gateway>& gateways, const Scale& scale,
               const Style& style, ClientOptions options, Story& story)
    : io_(io), gateways_(gateways), scale_(scale), style_(style), options_(options), story_(story) {}

std::string Client::request_body(const User& u) const {
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

asio::awaitable<void> Client::ask(User& u) {
  const Gateway& gw = gateways_[u.gateway];
  u.stream.emplace(io_);
  beast::tcp_stream& stream = *u.stream;
  const tcp::endpoint endpoint = gw.endpoint;
  if (auto error = co_await fairgate::http::connect(stream, endpoint, options_.io_bound); !error.empty()) {
    end_other(u,
              fmt::format("cannot connect to gateway {}: {}", gw.label, error.substr(error.find(": ") + 2)));
    co_return;
  }
  fairgate::http::Request req{http::verb::post, std::string(kRoutePath), 11};
  req.set(http::field::host, gw.url.substr(gw.url.find("//") + 2));
  req.set(http::field::content_type, "application/json");
  req.set(http::field::accept, "text/event-stream");
  req.set(kTenantHeader, u.name);
  req.body() = request_body(u);
  req.prepare_payload();
  fairgate::http::StreamedResponse res;
  if (auto ec = co_await res.start(stream, req, options_.io_bound)) {
    end_other(u, fmt::format("gateway {}: {}", gw.label, ec.message()));
    co_return;
  }
  const auto status = static_cast<http::status>(res.status());
  const bool sse = res.event_stream();

  SseReader reader;
  std::string body;  // a plain answer (an early 429, an error)
  boost::system::error_code read_ec;
  while (!res.done() && !stopping_) {
    std::string_view piece;
    const auto ec = co_await res.next(stream, options_.io_bound, piece);
    if (sse) {
      reader.feed(piece, [&](const SseEvent& e) { on_event(u, e); });
    } else if (body.size() < 64 * 1024) {
      body.append(piece);
    }
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
void Client::on_plain_answer(User& u, http::status status, const std::string& body) {
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

void Client::on_event(User& u, const SseEvent& e) {
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
    story_.first_event(u);
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
  on_answer_chunk(u, v.as_object());
}

/// A data event that is not [DONE]: an error, or a chunk of the answer.
void Client::on_answer_chunk(User& u, const json::object& o) {
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

void Client::on_queued(User& u, std::size_t position, std::size_t queued,
                       std::optional<std::int64_t> estimate_ms) {
  if (u.phase != Phase::waiting || position == u.told_position) return;
  const bool first = u.told_position == 0;
  u.told_position = position;
  if (options_.quiet || (!first && !options_.detail)) return;
  // The estimate comes from the recent service rate; until a first answer
  // has finished and freed a seat there is no service rate to speak of.
  std::string estimate = "no estimate yet";
  if (estimate_ms && released_ > 0) {
    estimate = "est. wait ";
    estimate += seconds_text(scale_.story_seconds(milliseconds(*estimate_ms)));
  }
  if (first) {
    line(u, fmt::format("arrives {} via gateway {}, {} at position {} of {}  ({})", ordinal(u.arrival_rank),
                        gateways_[u.gateway].label, style_.yellow("queued"), position, queued, estimate));
  } else {
    line(u, fmt::format("now at position {} of {}  ({})", position, queued, estimate));
  }
}

void Client::on_seat(User& u) {
  u.phase = Phase::streaming;
  u.seated_at = Clock::now();
  story_.first_event(u);
  ++in_use_;
  seat_order_.push_back(&u);
  if (options_.quiet) return;
  if (u.told_position == 0) {
    line(u, fmt::format("arrives {} via gateway {}, {} (waited {} ms)  {}", ordinal(u.arrival_rank),
                        gateways_[u.gateway].label, style_.green("gets a seat"), scale_.story_ms(u.waited()),
                        seats_text()));
  } else {
    line(u, fmt::format("{} after waiting {}  {}", style_.green("gets a seat"),
                        seconds_text(scale_.story_seconds(u.waited())), seats_text()));
  }
}

void Client::on_token(User& u) {
  const std::uint32_t before = u.streamed++;
  const std::uint32_t per_second = options_.tokens_per_second;
  // About one progress line per story second.
  if (options_.detail && u.streamed < u.tokens && u.streamed / per_second > before / per_second) {
    line(u, fmt::format("{} {} {}/{} tokens", style_.dim("streaming"), bar(style_, u.streamed, u.tokens),
                        u.streamed, u.tokens));
  }
}

// --- the single end of every request

void Client::on_done(User& u) {
  --in_use_;
  ++released_;
  end(u, Phase::done);
  if (!options_.quiet) {
    line(u, fmt::format("done: {} tokens in {}, seat released  {}", u.streamed,
                        seconds_text(scale_.story_seconds(u.ended_at - u.seated_at)), seats_text()));
  }
  story_.finished();
}

void Client::on_error(User& u, const json::object& error) {
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
  if (!options_.quiet) {
    line(u, fmt::format("{}: no seat within {} \u2014 \"{}\" (REJECT)", style_.red("busy"),
                        format_duration(options_.max_wait), kBusyText));
  }
  story_.finished();
}

void Client::end_other(User& u, std::string text) {
  if (ended(u.phase)) {
    ++u.ends;
    return;
  }
  if (u.phase == Phase::streaming) --in_use_;
  u.message = std::move(text);
  end(u, Phase::other);
  if (!options_.quiet && !stopping_) line(u, fmt::format("{}: {}", style_.red("ended"), u.message));
  story_.finished();
}

void Client::end(User& u, Phase phase) {
  ++u.ends;
  u.phase = phase;
  u.ended_at = Clock::now();
  story_.first_event(u);  // the next user may ask
}

// --- output

void Client::line(const User& u, std::string_view text) const {
  const double now = scale_.story_seconds(Clock::now() - scale_.start);
  std::fputs(timeline_line(style_, now, u.number, u.name, text).c_str(), stdout);
  std::fflush(stdout);
}

std::string Client::seats_text() const {
  return style_.dim(fmt::format("[seats {}/{}]", in_use_, options_.seats));
}

}  // namespace fairgate::cli::demo
