// cli/command.hpp — how subcommands plug into `fairgate`.
//
// Each subcommand lives in its own file and exposes one add_<name>_command()
// that registers a CLI::App subcommand (its flags bound to plain strings) and
// returns a Command whose run() validates the values and does the work.
// main.cpp owns parsing and turns errors into the one-line messages and exit
// codes of docs/api.md.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <stdexcept>
#include <string>

namespace fairgate::cli {

/// Exit codes of the fairgate command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  ///< the command ran and failed
inline constexpr int kExitUsage = 2;    ///< bad flags or values; nothing was done

/// Thrown by Command::run before it starts any work when a flag value is bad.
/// what() is one line naming the flag and the problem, e.g.
/// "--users: 0 not in 1..1000"; main prints "fairgate <command>: " + what().
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A registered subcommand.
struct Command {
  CLI::App* app = nullptr;
  /// Runs the command after a successful parse; returns the exit code.
  std::function<int()> run;
};

/// `fairgate demo` (demo.cpp).
Command add_demo_command(CLI::App& root);

/// `fairgate serve`, the HTTP admission API (serve.cpp).
Command add_serve_command(CLI::App& root);

/// `fairgate mock-llm`, the OpenAI-compatible mock model (mock_llm.cpp).
Command add_mock_llm_command(CLI::App& root);

/// `fairgate top`, a live terminal view of a server (top.cpp).
Command add_top_command(CLI::App& root);

/// `fairgate bench` and the hidden `fairgate bench-worker` it starts (bench.cpp).
Command add_bench_command(CLI::App& root);
Command add_bench_worker_command(CLI::App& root);

}  // namespace fairgate::cli
