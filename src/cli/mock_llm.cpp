// cli/mock_llm.cpp — `fairgate mock-llm`: flags → mockllm::Options, then the
// embeddable server (src/mockllm) runs on one io_context until SIGINT/SIGTERM.
//
// The flags are bound to plain strings and read here, so every bad value
// becomes a UsageError: exit 2 with one line naming the flag (docs/api.md).
#include "cli/command.hpp"
#include "cli/duration.hpp"
#include "cli/parse.hpp"

#include "http/address.hpp"
#include "mockllm/mock_llm.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include <fmt/format.h>

#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

namespace fairgate::cli {
namespace {

struct MockLlmArgs {
  std::string listen = "127.0.0.1:9000";
  std::string tokens_per_second = "20";
  std::string tokens = "40";
  std::string max_concurrent = "0";
  std::string first_token_delay = "0ms";
  std::string model = "fairgate-mock";
};

mockllm::Options to_options(const MockLlmArgs& a) {
  mockllm::Options o;
  std::string error;
  auto listen = http::parse_listen(a.listen, error);
  if (!listen) throw UsageError("--listen: " + error);
  o.host = std::move(listen->host);
  o.port = listen->port;
  o.tokens_per_second = checked("--tokens-per-second", parse_number(a.tokens_per_second, 0.01, 1'000'000));
  o.tokens = static_cast<std::uint32_t>(checked("--tokens", parse_count(a.tokens, 1, 1'000'000)));
  o.max_concurrent =
      static_cast<std::uint32_t>(checked("--max-concurrent", parse_count(a.max_concurrent, 0, 1'000'000)));
  o.first_token_delay = checked("--first-token-delay", parse_duration(a.first_token_delay));
  if (o.first_token_delay > std::chrono::hours(1))
    throw UsageError(fmt::format("--first-token-delay: {} is longer than 1h", a.first_token_delay));
  if (a.model.empty() || a.model.size() > 256)
    throw UsageError(fmt::format("--model: {} must be 1..256 characters", cli::quoted(a.model)));
  for (const char c : a.model)
    if (static_cast<unsigned char>(c) < 0x21 || c == 0x7f)
      throw UsageError(fmt::format("--model: {} has spaces or control characters", cli::quoted(a.model)));
  o.model = a.model;
  return o;
}

int run_mock_llm(const mockllm::Options& options) {
  boost::asio::io_context io(1);
  mockllm::Server server(io.get_executor(), options);
  server.start();

  // After stop() every socket is closed, so every pending operation ends and
  // io.run() returns on its own.
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  int which = 0;
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    which = sig;
    server.stop();
  });

  const auto ep = server.endpoint();
  const std::string host =
      ep.address().is_v6() ? "[" + ep.address().to_string() + "]" : ep.address().to_string();
  const std::string ceiling =
      options.max_concurrent == 0 ? std::string("none") : std::to_string(options.max_concurrent);
  const std::string line =
      fmt::format("fairgate mock-llm: listening on http://{}:{} ({} tokens at {}/s, ceiling {})\n", host,
                  ep.port(), options.tokens, options.tokens_per_second, ceiling);
  std::fputs(line.c_str(), stdout);
  std::fflush(stdout);

  io.run();

  const auto s = server.stats();
  const std::string bye = fmt::format(
      "fairgate mock-llm: stopped ({}): {} requests, {} completed, {} rejected (429), {} client aborts, peak "
      "{} "
      "in flight\n",
      which == SIGINT    ? "SIGINT"
      : which == SIGTERM ? "SIGTERM"
                         : "stop",
      s.requests, s.completed, s.rejected_429, s.client_aborts, s.peak_in_flight);
  std::fputs(bye.c_str(), stdout);
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace

Command add_mock_llm_command(CLI::App& root) {
  auto args = std::make_shared<MockLlmArgs>();
  CLI::App* app = root.add_subcommand(
      "mock-llm", "An OpenAI-compatible mock model: predictable streamed answers at a set speed");
  app->footer(
      "Endpoints: POST /v1/chat/completions (stream or not), GET /v1/models, GET /stats, GET /healthz.\n"
      "Answers: token i is \"t<i> \" (t0 t1 t2 ...); max_tokens in the request sets the length\n"
      "(finish_reason \"length\"), else --tokens (finish_reason \"stop\").\n"
      "Over --max-concurrent: 429 rate_limit_error, code concurrency_limit, Retry-After: 1.\n"
      "SIGTERM/SIGINT: close every connection, print the counters, exit 0. See docs/mock-llm.md.");
  app->add_option("--listen", args->listen, "Address to listen on (port 0: any free port)")
      ->type_name("HOST:PORT")
      ->default_str("127.0.0.1:9000");
  app->add_option("--tokens-per-second", args->tokens_per_second, "Generation speed after the first token")
      ->type_name("N")
      ->default_str("20");
  app->add_option("--tokens", args->tokens, "Answer length when the request has no max_tokens")
      ->type_name("N")
      ->default_str("40");
  app->add_option("--max-concurrent", args->max_concurrent,
                  "At most N generations at once, more get 429 (0: no ceiling)")
      ->type_name("N")
      ->default_str("0");
  app->add_option("--first-token-delay", args->first_token_delay,
                  "Time to the first token, with a unit: 250ms, 1.5s")
      ->type_name("DURATION")
      ->default_str("0ms");
  app->add_option("--model", args->model, "Model id in answers and /v1/models")
      ->type_name("NAME")
      ->default_str("fairgate-mock");

  return Command{app, [args]() {
                   const mockllm::Options options = to_options(*args);
                   return run_mock_llm(options);
                 }};
}

}  // namespace fairgate::cli
