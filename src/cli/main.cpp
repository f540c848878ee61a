// fairgate — the command line (docs/api.md, "Command line").
//
// Parsing, --help/--version, and the error contract: a bad flag or value ends
// with exit code 2 and exactly one line on stderr naming the flag and the
// problem; an unexpected failure ends with exit code 1 and one line. No
// exception leaves main().
#include "cli/command.hpp"

#include <fairgate/version.hpp>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <array>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

namespace fairgate::cli {
namespace {

/// `s` on one line: newlines and tabs become spaces, trailing blanks go.
std::string one_line(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) out += (c == '\n' || c == '\r' || c == '\t') ? ' ' : c;
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

void print_error_line(std::string_view line) {
  const std::string text = one_line(line) + "\n";
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
}

std::string command_list(const std::vector<Command>& commands) {
  std::string out;
  for (const auto& c : commands) {
    if (c.app->get_group().empty()) continue;  // hidden (internal) commands
    if (!out.empty()) out += ", ";
    out += c.app->get_name();
  }
  return out;
}

/// The deepest subcommand the parser entered, or `root`.
const CLI::App& context_of(const CLI::App& root) {
  const CLI::App* app = &root;
  for (;;) {
    const auto subs = app->get_subcommands();
    if (subs.empty()) return *app;
    app = subs.front();
  }
}

std::string prefix_of(const CLI::App& root, const CLI::App& ctx) {
  return &ctx == &root ? std::string("fairgate") : "fairgate " + ctx.get_name();
}

/// One line for a parse error, "fairgate demo: --bogus: unknown option (see 'fairgate demo --help')".
std::string describe(const CLI::App& root, const std::vector<Command>& commands, const CLI::ParseError& e) {
  const CLI::App& ctx = context_of(root);
  const std::string prefix = prefix_of(root, ctx);
  const std::string see = fmt::format("see '{} --help'", prefix);
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    std::vector<std::string> extras = ctx.remaining(false);
    if (extras.empty()) extras = root.remaining(true);
    if (!extras.empty()) {
      const std::string& first = extras.front();
      if (!first.empty() && first.front() == '-')
        return fmt::format("{}: {}: unknown option ({})", prefix, first, see);
      if (&ctx == &root) {
        return fmt::format("fairgate: {}: unknown command (commands: {}; {})", first, command_list(commands),
                           see);
      }
      return fmt::format("{}: {}: unexpected argument ({})", prefix, first, see);
    }
  }
  const std::string what = one_line(e.what());
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
    // CLI11: "--users: 1 required TEXT missing" and similar.
    const auto colon = what.find(':');
    if (!what.empty() && what.front() == '-' && colon != std::string::npos) {
      return fmt::format("{}: {}: missing value ({})", prefix, what.substr(0, colon), see);
    }
  }
  return fmt::format("{}: {} ({})", prefix, what, see);
}

int run(int argc, char** argv) {
  CLI::App app{
      "fairgate " + std::string(kVersion) +
          ": a fair FIFO, cluster-wide concurrency limiter for long-running requests\n"
          "(LLM streaming answers, exports, uploads): at most N in flight, the rest wait in one fair queue.",
      "fairgate"};
  app.set_help_flag("-h,--help", "Print this help and exit");
  app.set_version_flag("--version", "fairgate " + std::string(kVersion), "Print the version and exit");
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.require_subcommand(0, 1);
  app.get_formatter()->column_width(30);

  std::vector<Command> commands;
  commands.push_back(add_demo_command(app));
  commands.push_back(add_serve_command(app));
  commands.push_back(add_mock_llm_command(app));
  commands.push_back(add_top_command(app));
  commands.push_back(add_bench_command(app));
  commands.push_back(add_bench_worker_command(app));
  app.footer("Run 'fairgate <command> --help' for the options of a command.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e, std::cout, std::cerr);
  } catch (const CLI::ParseError& e) {
    print_error_line(describe(app, commands, e));
    return kExitUsage;
  }

  for (const auto& command : commands) {
    if (!command.app->parsed()) continue;
    try {
      return command.run();
    } catch (const UsageError& e) {
      print_error_line(fmt::format("fairgate {}: {}", command.app->get_name(), e.what()));
      return kExitUsage;
    } catch (const std::exception& e) {
      print_error_line(fmt::format("fairgate {}: error: {}", command.app->get_name(), e.what()));
      return kExitFailure;
    }
  }
  print_error_line(fmt::format("usage: fairgate <command> [options]  (commands: {}; see 'fairgate --help')",
                               command_list(commands)));
  return kExitUsage;
}

}  // namespace
}  // namespace fairgate::cli

int main(int argc, char** argv) {
  try {
    return fairgate::cli::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fairgate: error: %s\n", e.what());
  } catch (...) {
    std::fputs("fairgate: error: unknown exception\n", stderr);
  }
  return fairgate::cli::kExitFailure;
}
