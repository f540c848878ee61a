// cli/demo.cpp — `fairgate demo`: the seeds' "10 users, 3 seats" story, live,
// on the embedded memory backend in this one process (product.md S5).
//
// Every user asks a chatbot a question at about the same moment (in a
// shuffled, seeded order, a few ms apart). A user with a seat streams its
// answer token by token (asio timers stand in for the model) and then gives
// the seat back; the others wait in the limiter's FIFO queue and see their
// position; whoever is still waiting after --max-wait hears "busy" (the seed's
// META / REJECT / FINISH / DONE rejection). The summary then checks, from the
// demo's own accounting, that the limiter kept its promises: never more than
// --seats answers at once (F1), seats handed out in arrival order (F2), the
// max wait kept (F3), and every request ended exactly once (F4).
#include "cli/command.hpp"
#include "cli/duration.hpp"
#include "cli/parse.hpp"
#include "cli/style.hpp"

#include <fairgate/fairgate.hpp>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace fairgate::cli {
namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::string_view kLimiterName = "chat";
constexpr std::string_view kBusyText = "The system is busy, please try again later";
/// Above this many users the timeline leaves out position changes and
/// streaming progress, and the summary leaves out the per-user table.
constexpr std::size_t kDetailLimit = 30;
/// Streaming timers never tick faster than this (real time).
constexpr auto kMinTick = std::chrono::milliseconds(1);
/// Tolerance when checking that granted users waited at most max_wait (real time).
constexpr auto kGrantStampSlack = std::chrono::milliseconds(50);

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

std::string ordinal(std::size_t n) {
  const char* suffix = "th";
  if (n % 100 < 11 || n % 100 > 13) {
    if (n % 10 == 1) suffix = "st";
    if (n % 10 == 2) suffix = "nd";
    if (n % 10 == 3) suffix = "rd";
  }
  return fmt::format("{}{}", n, suffix);
}

// ---------------------------------------------------------------- the demo

enum class Phase : std::uint8_t { not_arrived, waiting, streaming, done, busy, other };

struct User {
  std::string name;
  std::size_t number = 0;        ///< the n of user-n
  std::size_t arrival_rank = 0;  ///< 1 = first to ask (order of async_acquire calls)
  double arrive_offset = 0;      ///< planned arrival, story seconds after the start
  std::uint32_t tokens = 0;      ///< answer length
  Phase phase = Phase::not_arrived;
  Clock::time_point arrived_at{};
  Clock::time_point granted_at{};
  Clock::time_point ended_at{};    ///< rejected, or seat released
  std::size_t completion_seq = 0;  ///< order in which acquires completed (granted or not)
  int completions = 0;             ///< times the acquire handler ran: must be 1
  int releases = 0;                ///< times the demo released the permit: must be 1 if granted
  std::size_t told_position = 0;   ///< last queue position printed
  milliseconds waited{0};          ///< as reported by the limiter (real time)
  std::uint32_t streamed = 0;
  std::optional<RejectReason> reason;
  std::string message;
  Permit permit;
  std::optional<asio::steady_timer> timer;  ///< streaming ticks
};

class Demo {
 public:
  Demo(asio::io_context& io, DemoConfig config)
      : io_(io),
        config_(config),
        style_(config.color),
        detail_(!config.quiet && config.users <= kDetailLimit),
        backend_(make_memory_backend(io.get_executor())),
        arrival_timer_(io),
        watchdog_(io),
        signals_(io, SIGINT, SIGTERM) {
    // The limiter runs in real time; the story is shown at --speed scale.
    const double real_ms = static_cast<double>(config_.max_wait.count()) / config_.speed;
    real_max_wait_ = milliseconds(std::llround(real_ms));
    if (config_.max_wait.count() > 0 && real_max_wait_.count() == 0) real_max_wait_ = milliseconds(1);
    make_users();
  }

  int run() {
    Settings settings;
    settings.max_concurrent = config_.seats;
    settings.max_wait = real_max_wait_;
    auto opened = backend_->open(kLimiterName, settings);
    if (!opened) throw std::runtime_error(opened.error().message());
    limiter_ = *opened;

    print_header();
    start_ = Clock::now();
    schedule_arrival(0);
    arm_watchdog();
    signals_.async_wait([this](boost::system::error_code ec, int signo) {
      if (ec) return;
      interrupted_ = signo;
      stop_all();
    });
    io_.run();

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
  double story_seconds(milliseconds real) const {
    return static_cast<double>(real.count()) / 1000.0 * config_.speed;
  }
  double now_story() const { return story_seconds(Clock::now() - start_); }
  double max_answer_seconds() const {
    return 2.0 * config_.tokens / static_cast<double>(config_.tokens_per_second);
  }

  // --- arrivals

  void schedule_arrival(std::size_t index) {
    if (index >= planned_.size()) return;
    arrival_timer_.expires_at(start_ + real_duration(planned_[index]->arrive_offset));
    arrival_timer_.async_wait([this, index](boost::system::error_code ec) {
      if (ec || stopping_) return;
      arrive(*planned_[index]);
      schedule_arrival(index + 1);
    });
  }

  void arrive(User& u) {
    u.phase = Phase::waiting;
    u.arrived_at = Clock::now();
    u.arrival_rank = ++arrivals_;
    arrival_order_.push_back(&u);
    AcquireOptions options;
    options.max_wait = real_max_wait_;
    options.tenant = u.name;
    options.on_queued = [this, &u](const QueueStatus& status) { on_queued(u, status); };
    limiter_.async_acquire(std::move(options),
                           [this, &u](AcquireResult result) { on_result(u, std::move(result)); });
  }

  void on_queued(User& u, const QueueStatus& status) {
    if (u.phase != Phase::waiting || stopping_ || status.position == u.told_position) return;
    const bool first = u.told_position == 0;
    u.told_position = status.position;
    if (config_.quiet || (!first && !detail_)) return;
    // The estimate comes from the recent service rate; until a first answer
    // has finished and freed a seat there is no service rate to speak of
    // (only the grants of the initially free seats).
    std::string estimate = "no estimate yet";
    if (status.estimated_wait && released_ > 0) {
      estimate = "est. wait " + seconds_text(story_seconds(*status.estimated_wait));
    }
    if (first) {
      line(u, fmt::format("arrives {}, {} at position {} of {}  ({})", ordinal(u.arrival_rank),
                          style_.yellow("queued"), status.position, status.queued, estimate));
    } else {
      line(u, fmt::format("now at position {} of {}  ({})", status.position, status.queued, estimate));
    }
  }

  // --- the single end of every acquire

  void on_result(User& u, AcquireResult result) {
    ++u.completions;
    u.completion_seq = ++completions_;
    u.waited = result.waited();
    if (u.completions > 1) {
      violations_.push_back(fmt::format("{}: its acquire completed {} times", u.name, u.completions));
      return;
    }
    if (result.granted()) {
      u.permit = result.take_permit();
      u.phase = Phase::streaming;
      u.granted_at = Clock::now();
      ++in_use_;
      max_in_use_ = std::max(max_in_use_, in_use_);
      sample_limiter();
      grant_order_.push_back(&u);
      if (stopping_) {
        release(u, /*print=*/false);
        return;
      }
      const std::string seats = style_.dim(fmt::format("[seats {}/{}]", in_use_, config_.seats));
      if (!config_.quiet) {
        if (u.told_position == 0) {
          line(u, fmt::format("arrives {}, {} (waited {} ms)  {}", ordinal(u.arrival_rank),
                              style_.green("gets a seat"), story_ms(u.waited), seats));
        } else {
          line(u, fmt::format("{} after waiting {}  {}", style_.green("gets a seat"),
                              seconds_text(story_seconds(u.waited)), seats));
        }
      }
      u.timer.emplace(io_);
      schedule_tick(u);
      return;
    }
    u.reason = result.reason();
    u.message = result.message();
    u.ended_at = Clock::now();
    u.phase = u.reason == RejectReason::timeout ? Phase::busy : Phase::other;
    if (!config_.quiet && !stopping_) {
      if (u.phase == Phase::busy) {
        line(u, fmt::format("{}: no seat within {} \u2014 \"{}\" (REJECT)", style_.red("busy"),
                            format_duration(config_.max_wait), kBusyText));
      } else {
        line(u, fmt::format("{}: {} ({})", style_.red("ended"), to_string(*u.reason), u.message));
      }
    }
    user_finished();
  }

  long long story_ms(milliseconds real) const { return std::llround(story_seconds(real) * 1000.0); }

  // --- streaming the answer while holding the seat

  void schedule_tick(User& u) {
    const double token_s = 1.0 / config_.tokens_per_second;
    const auto next_token = u.granted_at + real_duration(token_s * (u.streamed + 1));
    const auto last_token = u.granted_at + real_duration(token_s * u.tokens);
    // At high speed several tokens share a tick; the last one is never late.
    u.timer->expires_at(std::min(std::max(next_token, Clock::now() + kMinTick), last_token));
    u.timer->async_wait([this, &u](boost::system::error_code ec) {
      if (ec || stopping_) return;
      on_tick(u);
    });
  }

  void on_tick(User& u) {
    const double elapsed = story_seconds(Clock::now() - u.granted_at);
    const double due = std::floor(elapsed * config_.tokens_per_second + 1e-6);
    const std::uint32_t before = u.streamed;
    u.streamed = std::max(before, static_cast<std::uint32_t>(std::min<double>(due, u.tokens)));
    if (u.streamed >= u.tokens) {
      release(u, !config_.quiet);
      return;
    }
    // About one progress line per story second.
    if (detail_ && u.streamed / config_.tokens_per_second > before / config_.tokens_per_second) {
      line(u, fmt::format("{} {} {}/{} tokens", style_.dim("streaming"), bar(u.streamed, u.tokens),
                          u.streamed, u.tokens));
    }
    schedule_tick(u);
  }

  std::string bar(std::uint32_t done, std::uint32_t total) const {
    constexpr std::uint32_t kWidth = 20;
    const std::uint32_t filled = total == 0 ? kWidth : done * kWidth / total;
    return "[" + style_.cyan(std::string(filled, '#')) + std::string(kWidth - filled, '-') + "]";
  }

  void release(User& u, bool print) {
    --in_use_;
    ++u.releases;
    u.ended_at = Clock::now();
    u.phase = Phase::done;
    ++released_;
    u.permit.release();  // the limiter may hand the seat to the next waiter right here
    sample_limiter();
    if (print) {
      line(u, fmt::format("done: {} tokens in {}, seat released  {}", u.streamed,
                          seconds_text(story_seconds(u.ended_at - u.granted_at)),
                          style_.dim(fmt::format("[seats {}/{}]", in_use_, config_.seats))));
    }
    user_finished();
  }

  void sample_limiter() { max_limiter_in_use_ = std::max(max_limiter_in_use_, limiter_.snapshot().in_use); }

  void user_finished() {
    if (++finished_ < users_.size()) return;
    // Everyone is done: take the limiter's final picture, then let io.run() end.
    finished_at_ = Clock::now();
    final_ = limiter_.snapshot();
    backend_->shutdown();
    watchdog_.cancel();
    signals_.cancel();
  }

  // --- the bound on the whole run, and stopping early

  void arm_watchdog() {
    // Each user ends within max_wait of arriving, plus one answer if served.
    const double last_arrival = planned_.empty() ? 0.0 : planned_.back()->arrive_offset;
    watchdog_story_s_ =
        last_arrival + static_cast<double>(config_.max_wait.count()) / 1000.0 + max_answer_seconds() + 2.0;
    watchdog_.expires_at(start_ + real_duration(watchdog_story_s_) + std::chrono::seconds(2));
    watchdog_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      violations_.push_back(fmt::format("only {} of {} users finished within {} (every request must end)",
                                        finished_, users_.size(), seconds_text(watchdog_story_s_)));
      stop_all();
    });
  }

  void stop_all() {
    if (stopping_) return;
    stopping_ = true;
    arrival_timer_.cancel();
    for (auto& u : users_) {
      if (u->timer) u->timer->cancel();
      if (u->phase == Phase::streaming) release(*u, false);
    }
    backend_->shutdown();  // ends whoever still waits (reason: shutdown)
    if (!final_) final_ = limiter_.snapshot();
    watchdog_.cancel();
    signals_.cancel();
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
    std::string out =
        fmt::format("{} \u2014 {} users, {} seats, max wait {}  (memory backend, one process, seed {})\n",
                    style_.bold("fairgate demo"), c.users, c.seats, format_duration(c.max_wait), c.seed);
    out += fmt::format(
        "Each user asks a chatbot a question at about the same moment; each answer streams\n"
        "{}-{} tokens at {} tokens/s. Only {} answer{} may stream at once: the others wait in one\n"
        "fair FIFO queue, and whoever still waits after {} is told the system is busy.\n",
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
    std::size_t granted = 0, busy = 0, other = 0;
    std::vector<double> granted_waits, busy_waits;
    for (const auto& u : users_) {
      if (u->completions != 1) {
        violations_.push_back(
            fmt::format("{} ended {} times (must be exactly once)", u->name, u->completions));
      }
      if (u->phase == Phase::done) {
        ++granted;
        granted_waits.push_back(story_seconds(u->waited));
        if (u->releases != 1)
          violations_.push_back(fmt::format("{} released its seat {} times", u->name, u->releases));
        // The limiter decides a grant before the deadline but stamps the
        // permit's wait a moment later, so allow for that gap.
        if (u->waited > real_max_wait_ + kGrantStampSlack) {
          violations_.push_back(
              fmt::format("{} got a seat after {} ms (real time), past the max wait of {} ms", u->name,
                          u->waited.count(), real_max_wait_.count()));
        }
      } else if (u->phase == Phase::busy) {
        ++busy;
        busy_waits.push_back(story_seconds(u->waited));
        if (u->waited < real_max_wait_) {
          violations_.push_back(
              fmt::format("{} was told busy after {} ms, before the max wait", u->name, u->waited.count()));
        }
      } else if (u->phase == Phase::other) {
        ++other;
      }
    }

    // F2: a user gets a seat only after everyone who arrived before has ended
    // its wait (got a seat, or was told busy). Completions are delivered in the
    // order the limiter decided them, so compare completion order.
    std::optional<std::string> fifo_problem;
    const User* latest = nullptr;  // among earlier arrivals, the one that completed last
    for (const User* u : arrival_order_) {
      if (latest != nullptr && u->phase == Phase::done && u->completion_seq < latest->completion_seq &&
          !fifo_problem) {
        fifo_problem =
            fmt::format("{} (arrived {}) got a seat while {} (arrived {}) was still waiting", u->name,
                        ordinal(u->arrival_rank), latest->name, ordinal(latest->arrival_rank));
      }
      if (latest == nullptr || u->completion_seq > latest->completion_seq) latest = u;
    }
    if (fifo_problem) violations_.push_back("FIFO: " + *fifo_problem);

    // F1: the demo's own count and the limiter's, sampled at every grant and release.
    if (max_in_use_ > config_.seats) {
      violations_.push_back(
          fmt::format("{} answers streamed at once with {} seats", max_in_use_, config_.seats));
    }
    if (max_limiter_in_use_ > config_.seats) {
      violations_.push_back(
          fmt::format("the limiter had {} permits out with {} seats", max_limiter_in_use_, config_.seats));
    }

    // The limiter's counters must tell the same story.
    const LimiterStats stats = final_ ? final_->stats : LimiterStats{};
    const std::size_t limiter_in_use = final_ ? final_->in_use : 0;
    const std::size_t limiter_queued = final_ ? final_->queued : 0;
    const bool stats_match = final_ && stats.acquires == arrivals_ && stats.grants == granted &&
                             stats.timeouts == busy && stats.rejections + stats.cancels == other &&
                             stats.releases == granted && limiter_in_use == 0 && limiter_queued == 0;
    if (!stats_match) violations_.push_back("the limiter's counters do not match the demo's count");
    if (arrivals_ != n) violations_.push_back(fmt::format("only {} of {} users arrived", arrivals_, n));

    std::string out = "\n" + style_.bold("Summary") + "\n";
    if (n <= kDetailLimit) {
      out += style_.dim("  arrived  user      outcome   waited   tokens   held") + "\n";
      for (const User* u : arrival_order_) {
        std::string outcome = "waiting?", tokens = "-", held = "-";
        switch (u->phase) {
          case Phase::done:
            outcome = style_.green("seat   ");
            tokens = fmt::format("{}", u->streamed);
            held = seconds_text(story_seconds(u->ended_at - u->granted_at));
            break;
          case Phase::busy: outcome = style_.red("busy   "); break;
          case Phase::other: outcome = style_.red(fmt::format("{:<7}", to_string(*u->reason))); break;
          default: break;
        }
        out += fmt::format("  {:>7}  {:<8}  {}   {:>6}   {:>6}   {}\n", ordinal(u->arrival_rank), u->name,
                           outcome, seconds_text(story_seconds(u->waited)), tokens, held);
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

    std::vector<const User*> service_order(grant_order_.begin(), grant_order_.end());
    out += fmt::format("  users:             {} arrived, {} got a seat, {} busy{}\n", arrivals_, granted,
                       busy, other > 0 ? fmt::format(", {} other", other) : "");
    if (finished_at_ != Clock::time_point{}) {
      out += fmt::format("  total time:        {}\n", seconds_text(story_seconds(finished_at_ - start_)));
    }
    out += fmt::format("  arrival order:     {}\n", names(arrival_order_));
    out += fmt::format("  service order:     {}\n", names(service_order));
    out += fmt::format("  FIFO held:         {} \u2014 {}\n", yes_no(!fifo_problem),
                       fifo_problem ? *fifo_problem : "every seat went to the user waiting longest");
    out += fmt::format(
        "  max concurrent:    {} of {} seats (the limiter's own count peaked at {}) \u2014 {}\n", max_in_use_,
        config_.seats, max_limiter_in_use_,
        std::max(max_in_use_, max_limiter_in_use_) <= config_.seats ? "never above the cap"
                                                                    : style_.red("ABOVE THE CAP"));
    out += fmt::format("  waited for a seat: {}\n", range(granted_waits));
    if (!busy_waits.empty()) out += fmt::format("  told busy after:   {}\n", range(busy_waits));
    out += fmt::format("  ended once each:   {}\n",
                       yes_no(std::all_of(users_.begin(), users_.end(), [](const auto& u) {
                         return u->completions == 1 && (u->phase != Phase::done || u->releases == 1);
                       })));
    out += fmt::format(
        "  limiter stats:     acquires {}, grants {}, timeouts {}, rejections {}, cancels {}, releases {}; "
        "in use {}, queued {} \u2014 {}\n",
        stats.acquires, stats.grants, stats.timeouts, stats.rejections, stats.cancels, stats.releases,
        limiter_in_use, limiter_queued,
        stats_match ? "matches the demo's count" : style_.red("DOES NOT MATCH"));
    out += "\n";
    if (violations_.empty()) {
      out += style_.green("All invariants held") +
             fmt::format(
                 ": at most {} of {} seats in use, seats in arrival order, max wait kept, "
                 "every request ended exactly once.\n",
                 std::max(max_in_use_, max_limiter_in_use_), config_.seats);
    } else {
      out += style_.red("INVARIANTS VIOLATED") + ":\n";
      for (const auto& v : violations_) out += "  - " + v + "\n";
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
  std::shared_ptr<Backend> backend_;
  Limiter limiter_;
  milliseconds real_max_wait_{0};
  Clock::time_point start_{};

  std::vector<std::unique_ptr<User>> users_;
  std::vector<User*> planned_;              ///< planned arrival order
  std::vector<const User*> arrival_order_;  ///< actual order of acquire calls
  std::vector<const User*> grant_order_;    ///< order the seats were handed out

  std::size_t arrivals_ = 0;
  std::size_t completions_ = 0;
  std::size_t finished_ = 0;
  std::size_t released_ = 0;
  Clock::time_point finished_at_{};
  std::size_t in_use_ = 0;
  std::size_t max_in_use_ = 0;
  std::size_t max_limiter_in_use_ = 0;
  std::optional<Snapshot> final_;
  std::vector<std::string> violations_;

  asio::steady_timer arrival_timer_;
  asio::steady_timer watchdog_;
  double watchdog_story_s_ = 0;
  asio::signal_set signals_;
  int interrupted_ = 0;
  bool stopping_ = false;
};

constexpr std::string_view kDescription =
    "Show the seeds' story live: users ask a chatbot at the same moment, but only --seats answers\n"
    "may stream at once. The others wait in one fair FIFO queue and see their position; whoever\n"
    "still waits after --max-wait is told \"The system is busy, please try again later\".\n"
    "Runs the real limiter on the embedded memory backend in this process (a mock model streams\n"
    "the tokens), then checks the guarantees: never more than --seats in use, seats handed out\n"
    "in arrival order, the max wait kept, every request ended exactly once.\n"
    "Exit code 0 when they held, 1 when not, 2 for bad flags.";

}  // namespace

Command add_demo_command(CLI::App& root) {
  auto flags = std::make_shared<DemoFlags>();
  CLI::App* app =
      root.add_subcommand("demo", "The seeds' \"10 users, 3 seats\" story, live, on the memory backend");
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
