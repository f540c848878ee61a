// bench/process.hpp — a child process with a line protocol on stdin/stdout.
//
// The benchmark and the multi-process tests run each instance as a separate
// process (the hidden `fairgate bench-worker` command): the parent writes
// command lines to its stdin and reads its JSON lines from its stdout on a
// reader thread. A child dies with its parent (PR_SET_PDEATHSIG). Starting a
// child makes the parent ignore SIGPIPE (a write to a dead child fails instead).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace fairgate::bench {

/// Lets one thread sleep until any of several children has output.
class OutputSignal {
 public:
  /// A number that changes whenever some child produced a line or closed its output.
  std::uint64_t epoch() const {
    std::lock_guard lock(mu_);
    return epoch_;
  }
  /// Waits until epoch() != `seen` or `timeout` passed.
  void wait(std::uint64_t seen, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return epoch_ != seen; });
  }
  void notify() {
    {
      std::lock_guard lock(mu_);
      ++epoch_;
    }
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t epoch_ = 0;
};

class Child {
 public:
  /// Starts `argv[0]` with `argv`; stderr is inherited unless `quiet_stderr`.
  /// `signal` (optional, must outlive the child) is notified on every output.
  explicit Child(std::vector<std::string> argv, bool quiet_stderr = false,
                 std::shared_ptr<OutputSignal> signal = nullptr);
  ~Child();  // kills (SIGKILL) and reaps the child if still running
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const noexcept { return pid_; }
  /// Writes `line` + "\n" to the child's stdin; false if the pipe is closed.
  bool send(const std::string& line);
  /// Closes the child's stdin (EOF).
  void close_stdin();
  /// The next line from the child's stdout, or nullopt at EOF or timeout.
  std::optional<std::string> next_line(std::chrono::milliseconds timeout);
  /// Its stdout reached EOF and every line was read.
  bool drained();
  /// Sends `signal` to the child (only this child's pid).
  void kill(int signal);
  /// Waits for the child to exit; returns its wait status, or nullopt on timeout.
  std::optional<int> wait(std::chrono::milliseconds timeout);

 private:
  void read_loop(int fd);

  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> lines_;
  bool eof_ = false;
  std::shared_ptr<OutputSignal> signal_;
};

/// The path of the running executable (/proc/self/exe).
std::string self_executable();

}  // namespace fairgate::bench
