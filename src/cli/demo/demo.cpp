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
//
// This file: the flags and their checks; the run is cli/demo/story.hpp, the
// users' clients cli/demo/client.hpp, the text cli/demo/render.hpp.
#include "cli/command.hpp"
#include "cli/demo/story.hpp"
#include "cli/duration.hpp"
#include "cli/parse.hpp"
#include "cli/style.hpp"

#include "redis/url.hpp"

#include <fairgate/fairgate.hpp>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace fairgate::cli {
namespace {

using demo::DemoConfig;

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

constexpr std::string_view kDescription =
    "An LLM chat service, live: users ask a chatbot at the same moment, but only --seats answers\n"
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
      "demo",
      "Live: 10 users at once on an LLM chat service whose model streams 3 answers at once, two gateways");
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
                   boost::asio::io_context io(1);
                   demo::Demo demo(io, config);
                   return demo.run();
                 }};
}

}  // namespace fairgate::cli
