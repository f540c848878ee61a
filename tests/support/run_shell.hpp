// Runs a shell command line and keeps what it printed, for tests that start
// a real `fairgate` process and judge its exit code and its output:
//
//   const auto r = fairgate::test::run_shell("timeout 30 fairgate serve ... 2>&1");
//   EXPECT_EQ(r.exit_code, 1) << r.output;
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace fairgate::test {

struct ShellOutcome {
  int exit_code = -1;  ///< -1: not started, or ended by a signal
  std::string output;  ///< stdout (add 2>&1 to the command for stderr)
};

inline ShellOutcome run_shell(const std::string& command) {
  ShellOutcome r;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), p) != nullptr) r.output += buf.data();
  const int status = ::pclose(p);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

/// `fairgate serve ARGS` for at most `seconds` (a server that starts instead of
/// refusing runs until then: exit 124), stdout and stderr together.
inline ShellOutcome run_serve(const std::string& args, int seconds) {
  return run_shell("timeout " + std::to_string(seconds) + " " + std::string(FAIRGATE_BIN) + " serve " + args +
                   " 2>&1");
}

}  // namespace fairgate::test
