#include "support/netns.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace fairgate::test {

namespace {

std::string command_line(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

// The full path of a tool, from PATH or the sbin directories (a test run by a
// non-login shell may not have them on PATH); empty if not found.
std::string find_tool(const std::string& name) {
  std::string dirs = std::getenv("PATH") ? std::getenv("PATH") : "";
  dirs += ":/usr/sbin:/sbin:/usr/bin:/bin";
  std::istringstream in(dirs);
  for (std::string dir; std::getline(in, dir, ':');) {
    if (dir.empty()) continue;
    const std::string path = dir + "/" + name;
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return {};
}

const std::string& ip_tool() {
  static const std::string path = find_tool("ip");
  return path;
}

const std::string& nft_tool() {
  static const std::string path = find_tool("nft");
  return path;
}

// The table partition() adds inside the namespace (nothing else uses nftables there).
constexpr const char* kTable = "fairgate_partition";

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv) {
  if (argv.empty()) throw std::invalid_argument("run_process: empty argv");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  // O_CLOEXEC: a process another thread starts meanwhile must not inherit
  // them (it would hold our pipes open). dup2 in the child clears the flag.
  std::array<int, 2> out{-1, -1}, err{-1, -1};
  if (::pipe2(out.data(), O_CLOEXEC) != 0 || ::pipe2(err.data(), O_CLOEXEC) != 0) {
    for (int fd : {out[0], out[1], err[0], err[1]})
      if (fd >= 0) ::close(fd);
    throw std::runtime_error("run_process: pipe2 failed");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    throw std::runtime_error("cannot run `" + command_line(argv) + "`: " + std::strerror(rc));
  }

  // Both pipes at once, so a child that fills one while we block on the
  // other cannot deadlock.
  ProcessResult result;
  std::array<pollfd, 2> fds{pollfd{out[0], POLLIN, 0}, pollfd{err[0], POLLIN, 0}};
  std::array<std::string*, 2> sinks{&result.out, &result.err};
  int open_fds = 2;
  while (open_fds > 0) {
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;  // poll() ignores negative fds
        --open_fds;
      }
    }
  }
  for (const auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::string run_checked(const std::vector<std::string>& argv) {
  ProcessResult r = run_process(argv);
  if (r.exit_code != 0)
    throw std::runtime_error("`" + command_line(argv) + "` failed (exit " + std::to_string(r.exit_code) +
                             "): " + (r.err.empty() ? r.out : r.err));
  return std::move(r.out);
}

std::optional<std::string> NetNamespace::unavailable_reason() {
  static const std::optional<std::string> reason = []() -> std::optional<std::string> {
    if (::geteuid() != 0) return "not root (`ip netns` and `nft` need root)";
    if (ip_tool().empty()) return "`ip` not found (apt-get install iproute2)";
    if (nft_tool().empty()) return "`nft` not found (apt-get install nftables)";
    // Root may still lack the capabilities (a container): try the real thing.
    try {
      NetNamespace trial;
      trial.partition();
      trial.heal();
    } catch (const std::exception& e) {
      return std::string("a trial namespace failed: ") + e.what();
    }
    return std::nullopt;
  }();
  return reason;
}

NetNamespace::NetNamespace() {
  if (ip_tool().empty()) throw std::runtime_error("NetNamespace: `ip` not found");
  static std::atomic<unsigned> counter{0};
  const unsigned k = counter++;
  const auto pid = static_cast<std::uint32_t>(::getpid());
  name_ = "fg" + std::to_string(pid) + "n" + std::to_string(k);
  host_veth_ = "fg" + std::to_string(pid) + "h" + std::to_string(k);
  ns_veth_ = "fg" + std::to_string(pid) + "p" + std::to_string(k);
  if (host_veth_.size() > 15)
    throw std::runtime_error("NetNamespace: interface name too long: " + host_veth_);
  const std::string& ip = ip_tool();
  try {
    run_checked({ip, "netns", "add", name_});
    ns_created_ = true;
    run_checked({ip, "link", "add", host_veth_, "type", "veth", "peer", "name", ns_veth_, "netns", name_});
    veth_created_ = true;

    // A /30 of 10.213.0.0/16 (16384 of them), from the pid and the counter so
    // that parallel test processes start far apart; one that any interface
    // already has an address in is skipped. Checking again after adding ours
    // catches another process that picked the same one at the same moment
    // (each then moves on by its own pid-derived step).
    const std::uint32_t start = (pid * 2654435761u) >> 18;  // 14 bits
    const std::uint32_t step = 1 + pid % 1021;
    for (std::uint32_t attempt = 0;; ++attempt) {
      if (attempt == 32) throw std::runtime_error("NetNamespace: no free /30 in 10.213.0.0/16");
      const std::uint32_t base = ((start + k + attempt * step) % 16384) * 4;
      const std::string net = "10.213." + std::to_string(base / 256) + ".";
      const std::string prefix = net + std::to_string(base % 256) + "/30";
      const auto in_use = [&] { return run_checked({ip, "-o", "-4", "addr", "show", "to", prefix}); };
      if (!in_use().empty()) continue;
      host_address_ = net + std::to_string(base % 256 + 1);
      run_checked({ip, "addr", "add", host_address_ + "/30", "dev", host_veth_});
      const std::string users = in_use();
      if (std::count(users.begin(), users.end(), '\n') == 1) {  // one line: ours only
        ns_address_ = net + std::to_string(base % 256 + 2);
        break;
      }
      run_checked({ip, "addr", "del", host_address_ + "/30", "dev", host_veth_});
      host_address_.clear();
    }
    run_checked({ip, "link", "set", host_veth_, "up"});
    run_checked({ip, "-n", name_, "addr", "add", ns_address_ + "/30", "dev", ns_veth_});
    run_checked({ip, "-n", name_, "link", "set", ns_veth_, "up"});
    run_checked({ip, "-n", name_, "link", "set", "lo", "up"});
  } catch (...) {
    tear_down();
    throw;
  }
}

NetNamespace::~NetNamespace() { tear_down(); }

void NetNamespace::tear_down() noexcept {
  // The veth first: deleting it (either end deletes both) is synchronous,
  // while the kernel dismantles a deleted namespace, and the veth end in it,
  // a little later. So the address is gone when the destructor returns.
  try {
    if (veth_created_) run_process({ip_tool(), "link", "del", host_veth_});
    veth_created_ = false;
    if (ns_created_) run_process({ip_tool(), "netns", "del", name_});
    ns_created_ = false;
  } catch (...) {
    // Nothing left to do: a destructor must not throw.
  }
  partitioned_ = false;
}

std::vector<std::string> NetNamespace::exec_prefix() const { return {ip_tool(), "netns", "exec", name_}; }

void NetNamespace::run_inside(const std::function<void()>& fn) const {
  std::exception_ptr error;
  std::thread t([&] {
    try {
      // A thread of its own: setns(CLONE_NEWNET) changes only the calling
      // thread's namespace, and that thread then ends.
      const std::string path = "/run/netns/" + name_;
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
      const int rc = ::setns(fd, CLONE_NEWNET);
      const int saved = errno;
      ::close(fd);
      if (rc != 0) throw std::runtime_error("setns(" + path + "): " + std::strerror(saved));
      fn();
    } catch (...) {
      error = std::current_exception();
    }
  });
  t.join();
  if (error) std::rethrow_exception(error);
}

void NetNamespace::partition() {
  if (partitioned_) return;
  // One nft invocation is one transaction: the table, a chain on each hook and
  // a drop rule each way, or nothing.
  const std::string t = std::string("inet ") + kTable;
  const std::vector<std::string> commands{
      "add table " + t,
      "add chain " + t + " input { type filter hook input priority 0; }",
      "add chain " + t + " output { type filter hook output priority 0; }",
      "add rule " + t + " input ip saddr " + host_address_ + " meta l4proto tcp drop",
      "add rule " + t + " output ip daddr " + host_address_ + " meta l4proto tcp drop",
  };
  std::string script;
  for (const auto& c : commands) script += (script.empty() ? "" : "; ") + c;
  std::vector<std::string> argv = exec_prefix();
  argv.insert(argv.end(), {nft_tool(), script});
  run_checked(argv);
  partitioned_ = true;
}

void NetNamespace::heal() {
  if (!partitioned_) return;
  std::vector<std::string> argv = exec_prefix();
  argv.insert(argv.end(), {nft_tool(), "delete", "table", std::string("inet ") + kTable});
  run_checked(argv);
  partitioned_ = false;
}

}  // namespace fairgate::test
