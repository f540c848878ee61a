// tests/serve/harness.hpp — processes for the end-to-end tests of `fairgate
// serve` and its gateway: a child process with its stdout on a pipe, a
// server that prints "listening on http://…", and Node client scripts.
// Every wait is bounded; only pids these objects started are signalled.
#pragma once

#include "support/loopback.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <regex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace fairgate::test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

/// Sanitizer builds are several times slower: scale the bounds, not the checks.
#ifdef FAIRGATE_SERVE_TEST_SANITIZED
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

/// A child process with its stdout on a pipe.
class Child {
 public:
  Child(const std::vector<std::string>& argv, bool merge_stderr) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    if (merge_stderr) posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    fd_ = fds[0];
    if (rc != 0) {
      pid_ = -1;
      throw std::runtime_error("cannot start " + argv[0]);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }

  pid_t pid() const { return pid_; }
  bool eof() const { return fd_ < 0; }

  /// Reads one line of the child's stdout within `limit`; false at EOF or
  /// timeout (eof() tells which).
  bool read_line(std::string& line, std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    for (;;) {
      const auto nl = pending_.find('\n');
      if (nl != std::string::npos) {
        line = pending_.substr(0, nl);
        pending_.erase(0, nl + 1);
        return true;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0 || fd_ < 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const auto n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) {
        ::close(fd_);
        fd_ = -1;
        if (!pending_.empty()) {
          line = std::exchange(pending_, {});
          return true;
        }
        return false;
      }
      pending_.append(buf, static_cast<std::size_t>(n));
    }
  }

  /// Sends `sig` and waits up to `limit` for the exit; returns the exit code,
  /// 128 + signal when killed by a signal, or -1 when it did not end in time
  /// (then it is killed).
  int stop(int sig, std::chrono::milliseconds limit) {
    if (pid_ <= 0) return -1;
    if (sig != 0) ::kill(pid_, sig);
    return wait(limit);
  }
  int wait(std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    int status = 0;
    while (Clock::now() < deadline) {
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(10ms);
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string pending_;
};

inline std::string temp_config(const std::string& text) {
  char path[] = "/tmp/fairgate-serve-test-XXXXXX.toml";
  const int fd = ::mkstemps(path, 5);
  if (fd < 0) throw std::runtime_error("mkstemps failed");
  ::close(fd);
  std::ofstream(path) << text;
  return path;
}

/// A process that prints "listening on http://127.0.0.1:PORT" once ready.
class Listening {
 public:
  explicit Listening(const std::vector<std::string>& argv, const std::string& what) {
    child_ = std::make_unique<Child>(argv, false);
    std::string line;
    const std::regex listening("listening on (http://127\\.0\\.0\\.1:[0-9]+)");
    while (child_->read_line(line, kSanitized ? 60s : 20s)) {
      std::smatch m;
      if (std::regex_search(line, m, listening)) {
        url_ = m[1];
        break;
      }
    }
    if (url_.empty()) throw std::runtime_error(what + " did not start (no 'listening on' line)");
  }

  const std::string& url() const { return url_; }
  pid_t pid() const { return child_->pid(); }
  /// Reads the output past the "listening on" line up to one containing `text` (its line in
  /// `*line`); false when none came within `limit`.
  bool wait_for_line(const std::string& text, std::chrono::milliseconds limit, std::string* line = nullptr) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    std::string l;
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !child_->read_line(l, left)) return false;
      if (l.find(text) != std::string::npos) {
        if (line) *line = l;
        return true;
      }
    }
  }
  /// SIGTERM; the exit code (0 = clean shutdown).
  int terminate() { return child_->stop(SIGTERM, kSanitized ? 60s : 20s); }
  /// Waits (without a signal) up to `limit` for the exit; the exit code, -1 when it did not end.
  int wait_exit(std::chrono::milliseconds limit) { return child_->wait(limit); }

 private:
  std::unique_ptr<Child> child_;
  std::string url_;
};

/// A temporary config file, removed on destruction.
class TempConfig {
 public:
  explicit TempConfig(const std::string& text) : path_(temp_config(text)) {}
  ~TempConfig() { std::remove(path_.c_str()); }
  TempConfig(const TempConfig&) = delete;
  TempConfig& operator=(const TempConfig&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// One `fairgate serve` process on a free port, with a config file.
class Serve : private TempConfig, public Listening {
 public:
  Serve(const std::string& config_text, std::vector<std::string> args)
      : TempConfig(config_text), Listening(argv_for(path(), std::move(args)), "fairgate serve") {}

 private:
  static std::vector<std::string> argv_for(const std::string& config, std::vector<std::string> args) {
    std::vector<std::string> argv{FAIRGATE_BIN, "serve", "--config", config, "--listen", "127.0.0.1:0"};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
};

struct ClientRun {
  int exit_code = -1;
  std::string output;
};

/// Runs a Node script; `on_line` sees each output line as it comes.
inline ClientRun run_node(const std::vector<std::string>& args,
                          const std::function<void(const std::string&)>& on_line = {}) {
  std::vector<std::string> argv{NODE_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  Child node(argv, true);
  ClientRun run;
  std::string line;
  const auto deadline = Clock::now() + (kSanitized ? 240s : 150s);
  while (Clock::now() < deadline && !node.eof()) {
    if (!node.read_line(line, 1s)) continue;
    run.output += line + "\n";
    if (on_line) on_line(line);
  }
  if (!node.eof()) run.output += "(the client did not finish in time)\n";
  run.exit_code = node.wait(5s);
  return run;
}

/// The HTTP clients are Node scripts: without node (see CMakeLists.txt) skip.
#define SKIP_WITHOUT_NODE() \
  if (std::string_view(NODE_BIN).empty()) GTEST_SKIP() << "node not found at configure time"

#define EXPECT_CLIENT_OK(run)                      \
  do {                                             \
    EXPECT_EQ((run).exit_code, 0) << (run).output; \
    std::printf("%s", (run).output.c_str());       \
  } while (0)

/// A blocking SSE acquire over a raw socket (tests that must act on a server
/// between two steps: signal it, look at it).
class RawSse {
 public:
  /// `query`: "" or "?tenant=…" and the like.
  RawSse(const std::string& url, const std::string& limiter, const std::string& query = "")
      : RawSse(url,
               "POST /v1/limiters/" + limiter + "/acquire" + query +
                   " HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\nContent-Length: 0\r\n\r\n",
               Raw{}) {}
  /// GET /v1/events: the snapshots' stream.
  static RawSse events(const std::string& url) {
    return RawSse(url, "GET /v1/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n", Raw{});
  }
  RawSse(RawSse&& o) noexcept : fd_(std::exchange(o.fd_, -1)), data_(std::move(o.data_)), eof_(o.eof_) {}
  ~RawSse() {
    if (fd_ >= 0) ::close(fd_);
  }
  /// Waits up to `limit` until the stream contains `text`; false otherwise (or at EOF).
  bool wait_for(const std::string& text, std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    while (data_.find(text) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[2048];
      const auto n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        eof_ = true;
        return data_.find(text) != std::string::npos;
      }
      data_.append(buf, static_cast<std::size_t>(n));
    }
    return true;
  }
  /// Waits up to `limit` for the server to close the stream.
  bool wait_closed(std::chrono::milliseconds limit) {
    wait_for("\x01never\x01", limit);
    return eof_;
  }
  const std::string& data() const { return data_; }

 private:
  struct Raw {};
  RawSse(const std::string& url, const std::string& request, Raw) {
    fd_ = connect_loopback(url);
    if (fd_ < 0) throw std::runtime_error("connect");
    if (::send(fd_, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size()))
      throw std::runtime_error("send");
  }

  int fd_ = -1;
  std::string data_;
  bool eof_ = false;
};

/// What the server sends on `fd` until it closes the connection, or `limit` passes.
inline std::string read_until_closed(int fd, std::chrono::milliseconds limit) {
  std::string text;
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[8192];
    const auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  return text;
}

/// One HTTP exchange over a raw socket ("Connection: close"); the whole reply.
inline std::string http_exchange(const std::string& url, const std::string& request) {
  const int fd = connect_loopback(url);
  std::string reply;
  if (fd >= 0 &&
      ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size()))
    reply = read_until_closed(fd, 10s);
  if (fd >= 0) ::close(fd);
  return reply;
}

}  // namespace fairgate::test
