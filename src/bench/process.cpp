#include "bench/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <stdexcept>
#include <system_error>

namespace fairgate::bench {

Child::Child(std::vector<std::string> argv, bool quiet_stderr, std::shared_ptr<OutputSignal> signal)
    : signal_(std::move(signal)) {
  if (argv.empty()) throw std::invalid_argument("Child: empty argv");
  // Writing to a child that died must fail with EPIPE, not kill the parent.
  ::signal(SIGPIPE, SIG_IGN);
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    throw std::system_error(errno, std::generic_category(), "pipe");
  }
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) throw std::system_error(errno, std::generic_category(), "fork");
  if (pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(in[0], STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    if (quiet_stderr) {
      const int devnull = ::open("/dev/null", O_WRONLY);
      if (devnull >= 0) ::dup2(devnull, STDERR_FILENO);
    }
    ::close_range(3, ~0U, 0);  // none of the parent's sockets (Asio's have no FD_CLOEXEC)
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  stdin_fd_ = in[1];
  reader_ = std::thread([this, fd = out[0]] { read_loop(fd); });
}

Child::~Child() {
  close_stdin();
  if (!reaped_) {
    kill(SIGKILL);
    wait(std::chrono::seconds(10));
  }
  if (reader_.joinable()) reader_.join();
}

void Child::read_loop(int fd) {
  std::string buffer;
  char chunk[4096];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buffer.append(chunk, static_cast<std::size_t>(n));
    std::size_t start = 0;
    std::vector<std::string> complete;
    for (std::size_t nl; (nl = buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
      complete.emplace_back(buffer, start, nl - start);
    }
    buffer.erase(0, start);
    if (!complete.empty()) {
      {
        std::lock_guard lock(mu_);
        for (auto& line : complete) lines_.push_back(std::move(line));
      }
      cv_.notify_all();
      if (signal_) signal_->notify();
    }
  }
  ::close(fd);
  {
    std::lock_guard lock(mu_);
    if (!buffer.empty()) lines_.push_back(std::move(buffer));
    eof_ = true;
  }
  cv_.notify_all();
  if (signal_) signal_->notify();
}

bool Child::send(const std::string& line) {
  if (stdin_fd_ < 0) return false;
  const std::string data = line + "\n";
  std::size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::write(stdin_fd_, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<std::size_t>(n);
  }
  return true;
}

void Child::close_stdin() {
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
  stdin_fd_ = -1;
}

std::optional<std::string> Child::next_line(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !lines_.empty() || eof_; })) return std::nullopt;
  if (lines_.empty()) return std::nullopt;
  std::string line = std::move(lines_.front());
  lines_.pop_front();
  return line;
}

bool Child::drained() {
  std::lock_guard lock(mu_);
  return eof_ && lines_.empty();
}

void Child::kill(int signal) {
  if (pid_ > 0 && !reaped_) ::kill(pid_, signal);
}

std::optional<int> Child::wait(std::chrono::milliseconds timeout) {
  if (reaped_) return status_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      reaped_ = true;
      status_ = status;
      return status_;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::string self_executable() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) throw std::system_error(errno, std::generic_category(), "readlink /proc/self/exe");
  return std::string(path, static_cast<std::size_t>(n));
}

}  // namespace fairgate::bench
