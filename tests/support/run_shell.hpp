// Runs a shell command line and keeps what it printed, for tests that start
// a real `fairgate` process and judge its exit code and its output:
//
//   const auto r = fairgate::test::run_shell("timeout 30 fairgate serve ... 2>&1");
//   EXPECT_EQ(r.exit_code, 1) << r.output;
//   fairgate::test::expect_serve_refuses_at_start(url, "Redis at ... refused AUTH as user 'fg': ...");
#pragma once

#include <gtest/gtest.h>

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
/// refusing runs until then: exit 124), stdout and stderr together. `prefix`
/// runs it through something first (a network namespace: "ip netns exec NS ").
inline ShellOutcome run_serve(const std::string& args, int seconds, const std::string& prefix = {}) {
  return run_shell(prefix + "timeout " + std::to_string(seconds) + " " + std::string(FAIRGATE_BIN) +
                   " serve " + args + " 2>&1");
}

/// `fairgate serve --redis URL` exits 1 at start, printing exactly `line` as its error.
inline void expect_serve_refuses_at_start(const std::string& url, const std::string& line,
                                          const std::string& limiter = "chat=3",
                                          const std::string& prefix = {}) {
  const auto r =
      run_serve("--listen 127.0.0.1:0 --limiter " + limiter + " --redis '" + url + "'", 30, prefix);
  EXPECT_EQ(r.exit_code, 1) << url << ": " << r.output;
  EXPECT_EQ(r.output, "fairgate serve: error: " + line + "\n") << url;
}

/// `fairgate serve --redis URL` starts and runs (still running after 3 s:
/// exit 124), with nothing refused in its log.
inline void expect_serve_starts(const std::string& url, const std::string& limiter = "chat=3") {
  const auto r = run_serve("--listen 127.0.0.1:0 --limiter " + limiter + " --redis '" + url + "'", 3);
  EXPECT_EQ(r.exit_code, 124) << "it starts and runs: " << r.output;
  EXPECT_EQ(r.output.find("refused"), std::string::npos) << r.output;
}

}  // namespace fairgate::test
