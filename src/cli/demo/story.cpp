// cli/demo/story.cpp — the run of `fairgate demo` (see story.hpp).
#include "cli/demo/story.hpp"

#include "http/client.hpp"

#include "cli/command.hpp"

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <utility>

namespace fairgate::cli::demo {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace json = boost::json;
using asio::ip::tcp;
using std::chrono::milliseconds;

/// Completion token that reports errors as values (named: no temporaries inside co_await).
constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

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

}  // namespace

Demo::Demo(asio::io_context& io, DemoConfig config)
    : io_(io),
      config_(std::move(config)),
      style_(config_.color),
      detail_(!config_.quiet && config_.users <= kDetailLimit),
      arrival_timer_(io),
      watchdog_(io),
      stop_timer_(io),
      signals_(io, SIGINT, SIGTERM) {
  scale_.speed = config_.speed;
  // The limiter and the model run in real time; the story is shown at --speed scale.
  const double real_ms = static_cast<double>(config_.max_wait.count()) / config_.speed;
  real_max_wait_ = milliseconds(std::llround(real_ms));
  if (config_.max_wait.count() > 0 && real_max_wait_.count() == 0) real_max_wait_ = milliseconds(1);
  make_users();
  StageOptions o;
  o.seats = config_.seats;
  o.tokens = config_.tokens;
  o.tokens_per_second = static_cast<double>(config_.tokens_per_second) * config_.speed;
  o.max_wait = real_max_wait_;
  o.redis = config_.redis;
  stage_ = std::make_unique<Stage>(io_, o);
  ClientOptions c;
  c.seats = config_.seats;
  c.tokens_per_second = config_.tokens_per_second;
  c.max_wait = config_.max_wait;
  c.quiet = config_.quiet;
  c.detail = detail_;
  // No single socket operation of a user may take longer than this (real time).
  c.io_bound = real_max_wait_ + scale_.real_duration(max_answer_seconds()) + std::chrono::seconds(10);
  client_ = std::make_unique<Client>(io_, stage_->gateways(), scale_, style_, c, static_cast<Story&>(*this));
}

int Demo::run() {
  stage_->start();
  print_header();
  scale_.start = Clock::now();
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

// --- setup

void Demo::make_users() {
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

double Demo::max_answer_seconds() const {
  return 2.0 * config_.tokens / static_cast<double>(config_.tokens_per_second);
}

double Demo::now_story() const { return scale_.story_seconds(Clock::now() - scale_.start); }

// --- arrivals: at the planned time, but never before the previous user got its first event

void Demo::schedule_arrival(std::size_t index) {
  if (index >= planned_.size() || stopping_) return;
  arrival_timer_.expires_at(
      std::max(Clock::now(), scale_.start + scale_.real_duration(planned_[index]->arrive_offset)));
  arrival_timer_.async_wait([this, index](boost::system::error_code ec) {
    if (ec || stopping_) return;
    arrive(*planned_[index]);
  });
}

void Demo::arrive(User& u) {
  u.phase = Phase::waiting;
  u.arrived_at = Clock::now();
  u.arrival_rank = ++arrivals_;
  u.gateway = (u.arrival_rank - 1) % stage_->gateways().size();
  ++stage_->gateways()[u.gateway].users;
  arrival_order_.push_back(&u);
  asio::co_spawn(io_, client_->ask(u), asio::detached);
}

void Demo::first_event(User& u) {
  if (u.first_event) return;
  u.first_event = true;
  schedule_arrival(u.plan_index + 1);
}

void Demo::finished() {
  if (++finished_ < users_.size()) return;
  finished_at_ = Clock::now();
  watchdog_.cancel();
  asio::co_spawn(io_, wrap_up(), asio::detached);
}

// --- the end: the limiter's state, the model's counters, then the tear-down

asio::awaitable<void> Demo::wrap_up() {
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
asio::awaitable<std::optional<json::object>> Demo::get_limiter(const Gateway& gw) {
  beast::tcp_stream stream(io_);
  constexpr auto kTimeout = std::chrono::seconds(2);
  if (!(co_await fairgate::http::connect(stream, gw.endpoint, kTimeout)).empty()) co_return std::nullopt;
  fairgate::http::Request req{http::verb::get, fmt::format("/v1/limiters/{}", kLimiterName), 11};
  req.set(http::field::host, gw.url.substr(gw.url.find("//") + 2));
  const fairgate::http::Fetched res = co_await fairgate::http::fetch(stream, req, 16 * 1024 * 1024, kTimeout);
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  if (res.status != 200) co_return std::nullopt;
  boost::system::error_code ec;
  json::value v = json::parse(res.body, ec);
  if (ec || !v.is_object()) co_return std::nullopt;
  json::object out = std::move(v.as_object());
  co_return out;
}

void Demo::tear_down() {
  if (tearing_down_) return;
  tearing_down_ = true;
  arrival_timer_.cancel();
  watchdog_.cancel();
  signals_.cancel();
  // Bound the whole tear-down: whatever is still open then is abandoned.
  stop_timer_.expires_after(Stage::kStopTimeout);
  stop_timer_.async_wait([this](boost::system::error_code ec) {
    if (!ec) io_.stop();
  });
  stage_->stop([this] {
    stop_timer_.cancel();
    torn_down_ = true;
  });
}

// --- the bound on the whole run, and stopping early

void Demo::arm_watchdog() {
  // Each user ends within max_wait of asking, plus one answer if served;
  // asking waits for the previous user's first event (a few ms of real time).
  const double last_arrival = planned_.empty() ? 0.0 : planned_.back()->arrive_offset;
  watchdog_story_s_ =
      last_arrival + static_cast<double>(config_.max_wait.count()) / 1000.0 + max_answer_seconds() + 2.0;
  const auto asking = milliseconds(20) * users_.size();
  watchdog_.expires_at(scale_.start + scale_.real_duration(watchdog_story_s_) + asking +
                       std::chrono::seconds(5));
  watchdog_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    violations_.push_back(fmt::format("only {} of {} users finished within {} (every request must end)",
                                      finished_, users_.size(), seconds_text(now_story())));
    stop_all();
  });
}

void Demo::stop_all() {
  if (stopping_) return;
  stopping_ = true;
  client_->stop();
  arrival_timer_.cancel();
  for (auto& u : users_) {
    if (u->stream) u->stream->cancel();
  }
  model_stats_ = stage_->model_stats();
  tear_down();
}

// --- output

void Demo::print_header() {
  Header h;
  h.users = config_.users;
  h.seats = config_.seats;
  h.tokens = config_.tokens;
  h.tokens_per_second = config_.tokens_per_second;
  h.max_wait = config_.max_wait;
  h.seed = config_.seed;
  h.speed = config_.speed;
  h.quiet = config_.quiet;
  h.detail = detail_;
  if (!config_.redis.empty()) {
    h.redis = config_.redis_target->redacted();
    h.gateway_pids = stage_->gateway_pids();
  }
  h.model_url = stage_->model_url();
  h.limiter = std::string(kLimiterName);
  for (const Gateway& gw : stage_->gateways()) h.gateway_urls.push_back(gw.url);
  std::fputs(header_text(style_, h).c_str(), stdout);
  std::fflush(stdout);
}

/// Prints the summary, checks the invariants, returns the exit code.
int Demo::summarize() {
  Summary s;
  s.scale = scale_;
  s.table = users_.size() <= kDetailLimit;
  for (const auto& u : users_) s.users.push_back(u.get());
  std::vector<const Seen*> by_arrival;
  for (const User* u : arrival_order_) {
    by_arrival.push_back(u);
    s.by_arrival.push_back(Row{u, stage_->gateways()[u->gateway].label});
  }
  s.by_seat.assign(client_->seat_order().begin(), client_->seat_order().end());
  for (const Gateway& gw : stage_->gateways()) s.fronts.push_back(Front{gw.url, gw.users});
  if (finished_at_ != Clock::time_point{}) s.total = finished_at_ - scale_.start;
  s.facts.real_max_wait = real_max_wait_;
  s.facts.seats = config_.seats;
  s.facts.arrivals = arrivals_;
  s.facts.model_peak_in_flight = model_stats_.peak_in_flight;
  s.facts.model_rejected_429 = model_stats_.rejected_429;
  s.facts.model_completed = model_stats_.completed;
  s.facts.final_in_use = final_in_use_;
  s.facts.final_queued = final_queued_;
  s.model_requests = model_stats_.requests;
  s.verdict = check(s.users, by_arrival, s.facts);
  violations_.insert(violations_.end(), s.verdict.violations.begin(), s.verdict.violations.end());
  s.violations = violations_;

  std::fputs(summary_text(style_, s).c_str(), stdout);
  std::fflush(stdout);
  if (violations_.empty()) return kExitOk;
  std::string first = violations_.front();
  if (violations_.size() > 1) first += fmt::format(" (and {} more)", violations_.size() - 1);
  std::fputs(fmt::format("fairgate demo: invariant violated: {}\n", first).c_str(), stderr);
  return kExitFailure;
}

}  // namespace fairgate::cli::demo
