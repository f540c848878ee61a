#include "support/redis_server.hpp"

#include <hiredis/hiredis.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string_view>
#include <thread>

namespace fairgate::test {

namespace {

/// Binds a loopback socket to `port` (0: any free one) and returns the port
/// it got, or 0 when that port is taken.
std::uint16_t bind_loopback(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  return ok ? ntohs(addr.sin_port) : 0;
}

}  // namespace

std::uint16_t free_loopback_port() {
  const std::uint16_t port = bind_loopback(0);
  if (port == 0) throw std::runtime_error("bind() to a free loopback port failed");
  return port;
}

std::uint16_t free_loopback_cluster_port() {
  constexpr std::uint16_t bus_offset = 10000;  // Redis's fixed cluster bus offset
  for (int attempt = 0; attempt < 200; ++attempt) {
    const std::uint16_t port = free_loopback_port();
    if (port <= 65535 - bus_offset && bind_loopback(static_cast<std::uint16_t>(port + bus_offset)) != 0)
      return port;
  }
  throw std::runtime_error("no free loopback port with a free cluster bus port (port + 10000)");
}

namespace {

timeval to_timeval(std::chrono::milliseconds d) {
  const auto ms = std::max<std::int64_t>(d.count(), 1);
  return timeval{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>(ms % 1000 * 1000)};
}

std::string reply_text(const redisReply* r) {
  if (!r) return "(null)";
  switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS: return std::string(r->str, r->len);
    case REDIS_REPLY_ERROR: return "(error) " + std::string(r->str, r->len);
    case REDIS_REPLY_INTEGER: return std::to_string(r->integer);
    case REDIS_REPLY_NIL: return "(nil)";
    case REDIS_REPLY_ARRAY: {
      std::string s;
      for (std::size_t i = 0; i < r->elements; ++i) s += (i ? "\n" : "") + reply_text(r->element[i]);
      return s;
    }
  }
  return "?";
}

// One command over TLS (no verification: the helper trusts the server it
// started), blocking, within about `timeout` for the connect and again for
// the reply. The reply as reply_text(), or "(error) ..." text.
std::string tls_command(const std::string& host, std::uint16_t port, const RedisServer::Tls& tls,
                        const std::vector<std::string>& args, std::chrono::milliseconds timeout) {
  const std::string where = "rediss://" + host + ":" + std::to_string(port);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "(error) socket() failed";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  const timeval tv = to_timeval(timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);  // also bounds connect()
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const std::string text = "(error) cannot connect to redis at " + where + ": " + std::strerror(errno);
    ::close(fd);
    return text;
  }
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
  if (!tls.client_cert.empty()) {
    SSL_CTX_use_certificate_chain_file(ctx, tls.client_cert.c_str());
    SSL_CTX_use_PrivateKey_file(ctx, tls.client_key.c_str(), SSL_FILETYPE_PEM);
  }
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  std::string text;
  redisReader* reader = redisReaderCreate();
  if (SSL_connect(ssl) != 1) {
    text = "(error) TLS handshake with " + where + " failed";
  } else {
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    char* cmd = nullptr;
    const int len = redisFormatCommandArgv(&cmd, static_cast<int>(args.size()), argv.data(), lens.data());
    if (len < 0 || SSL_write(ssl, cmd, len) != len) {
      text = "(error) write failed (" + where + ")";
    } else {
      for (;;) {
        void* reply = nullptr;
        if (redisReaderGetReply(reader, &reply) != REDIS_OK) {
          text = "(error) protocol error (" + where + ")";
          break;
        }
        if (reply) {
          text = reply_text(static_cast<redisReply*>(reply));
          freeReplyObject(reply);
          break;
        }
        char buf[16384];
        const int n = SSL_read(ssl, buf, sizeof buf);
        if (n <= 0) {
          text = "(error) no reply (timed out or closed) (" + where + ")";
          break;
        }
        redisReaderFeed(reader, buf, static_cast<std::size_t>(n));
      }
    }
    if (cmd) redisFreeCommand(cmd);
  }
  redisReaderFree(reader);
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  ::close(fd);
  ERR_clear_error();
  return text;
}

// PING answered (NOAUTH counts: a password-protected server is up), and not
// "LOADING" (a restarted server still reading its AOF).
bool answers_ping(const std::string& host, std::uint16_t port, const std::optional<RedisServer::Tls>& tls) {
  if (tls) {
    const std::string r = tls_command(host, port, *tls, {"PING"}, std::chrono::milliseconds(200));
    return r.rfind("(error) TLS", 0) != 0 && r.rfind("(error) cannot", 0) != 0 &&
           r.rfind("(error) no reply", 0) != 0 && r.rfind("(error) LOADING", 0) != 0 &&
           r.rfind("(error) write", 0) != 0;
  }
  timeval tv{0, 200'000};
  redisContext* c = redisConnectWithTimeout(host.c_str(), port, tv);
  bool up = false;
  if (c && !c->err) {
    redisSetTimeout(c, tv);
    auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
    up = r != nullptr &&
         !(r->type == REDIS_REPLY_ERROR && std::string_view(r->str, r->len).starts_with("LOADING"));
    if (r) freeReplyObject(r);
  }
  if (c) redisFree(c);
  return up;
}

}  // namespace

RedisServer::RedisServer(std::vector<std::string> extra_args) : debug_mode_("local") {
  options_.extra_args = std::move(extra_args);
  start();
}

RedisServer::RedisServer(Options options) : options_(std::move(options)) {
  if (options_.bind.empty()) throw std::invalid_argument("RedisServer::Options::bind is empty");
  debug_mode_ = options_.debug_command ? "yes" : "no";
  start();
}

RedisServer::~RedisServer() { stop(); }

RedisServer& RedisServer::shared() {
  static std::unique_ptr<RedisServer> server = [] {
    if (const char* env = std::getenv("FAIRGATE_TEST_REDIS"); env && *env) {
      const std::string hostport = env;
      const auto colon = hostport.rfind(':');
      if (colon == std::string::npos) throw std::runtime_error("FAIRGATE_TEST_REDIS must be host:port");
      return std::unique_ptr<RedisServer>(new RedisServer(
          hostport.substr(0, colon), static_cast<std::uint16_t>(std::stoi(hostport.substr(colon + 1)))));
    }
    return std::make_unique<RedisServer>();
  }();
  return *server;
}

std::string RedisServer::url() const {
  if (options_.tls)
    return "rediss://" + host_ + ":" + std::to_string(port_) + "?tls_ca_file=" + options_.tls->ca_file;
  return "redis://" + host_ + ":" + std::to_string(port_);
}

void RedisServer::start() {
  owned_ = true;
  host_ = options_.bind.front();
  char tmpl[] = "/tmp/fairgate-redis-XXXXXX";
  if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  for (int attempt = 0; attempt < 5; ++attempt) {
    port_ = options_.cluster ? free_loopback_cluster_port() : free_loopback_port();
    if (spawn_and_wait()) return;
  }
  // The last lines of its log say why (port taken, bad option, ...).
  std::string why;
  if (std::ifstream log(dir_ + "/redis.log"); log) {
    std::deque<std::string> tail;
    for (std::string line; std::getline(log, line);) {
      tail.push_back(line);
      if (tail.size() > 3) tail.pop_front();
    }
    for (const auto& line : tail) why += "\n  " + line;
  }
  stop();
  throw std::runtime_error(
      "could not start redis-server (is the redis-server package installed?); its log ends:" +
      (why.empty() ? std::string(" (no log)") : why));
}

bool RedisServer::spawn_and_wait() {
  std::vector<std::string> args{"redis-server"};
  if (!options_.config_file.empty()) args.push_back(options_.config_file);
  if (options_.tls) {
    const auto& t = *options_.tls;
    args.insert(args.end(), {"--port", "0", "--tls-port", std::to_string(port_), "--tls-cert-file",
                             t.cert_file, "--tls-key-file", t.key_file, "--tls-ca-cert-file", t.ca_file,
                             "--tls-auth-clients", t.auth_clients});
    if (t.cluster) args.insert(args.end(), {"--tls-cluster", "yes"});
    if (t.replication) args.insert(args.end(), {"--tls-replication", "yes"});
  } else {
    args.insert(args.end(), {"--port", std::to_string(port_)});
  }
  args.push_back("--bind");
  args.insert(args.end(), options_.bind.begin(), options_.bind.end());
  const std::vector<std::string> rest{"--save",
                                      "",
                                      "--appendonly",
                                      options_.appendonly ? "yes" : "no",
                                      "--appendfsync",
                                      "always",
                                      "--dir",
                                      dir_,
                                      "--logfile",
                                      dir_ + "/redis.log",
                                      "--enable-debug-command",
                                      debug_mode_};
  args.insert(args.end(), rest.begin(), rest.end());
  // Protected mode answers every client not on loopback with DENIED while no
  // password is set; a test that binds another address means to be reached there.
  if (std::any_of(options_.bind.begin(), options_.bind.end(), [](const std::string& a) {
        return a.rfind("127.", 0) != 0 && a != "::1" && a != "-::1";
      })) {
    args.insert(args.end(), {"--protected-mode", "no"});
  }
  if (!options_.password.empty()) args.insert(args.end(), {"--requirepass", options_.password});
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
  // Built before fork(): the child of a multi-threaded process may only make
  // async-signal-safe calls.
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    // Dies with the test process (a killed test must not leave a server
    // behind), and keeps no pipe of ctest's open.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int devnull = ::open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      ::dup2(devnull, 0);
      ::dup2(devnull, 1);
      ::dup2(devnull, 2);
    }
    // Nor any socket of the test's: a connection the test closes must close
    // (Asio opens sockets without FD_CLOEXEC; a server started meanwhile
    // kept them open, and the peer saw a client long gone).
    ::close_range(3, ~0U, 0);
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
  stopped_ = false;
  // Wait until it answers (a password-protected one answers NOAUTH: still up).
  for (int i = 0; i < 250; ++i) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return false;  // exited (port taken?)
    }
    if (answers_ping(host_, port_, options_.tls)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  reap_hard();
  return false;
}

void RedisServer::require_owned(const char* what) const {
  if (!owned_)
    throw std::logic_error(std::string("RedisServer::") + what + ": not a server this object started");
}

bool RedisServer::running() const {
  if (pid_ <= 0) return false;
  // WNOWAIT: look without reaping (kill_hard() and the destructor reap).
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return false;
  return info.si_pid == 0;  // 0: no state change, so still there
}

void RedisServer::wait_state(int options) {
  int status = 0;
  pid_t r;
  while ((r = ::waitpid(pid_, &status, options)) < 0 && errno == EINTR) {
  }
  // Reaped (it ended, whatever we waited for): forget the pid, which the
  // system may now give to another process.
  if (r < 0 || WIFEXITED(status) || WIFSIGNALED(status)) {
    pid_ = -1;
    stopped_ = false;
  }
}

void RedisServer::reap_hard() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);  // also ends a stopped process
  wait_state(0);
}

void RedisServer::kill_hard() {
  require_owned("kill_hard");
  reap_hard();
}

void RedisServer::start_again() {
  require_owned("start_again");
  if (running()) throw std::logic_error("RedisServer::start_again: still running (kill_hard() first)");
  reap_hard();  // it may have exited by itself
  // The old process is gone, so the port is normally free at once; a client's
  // connection in TIME_WAIT does not block it (Redis binds with SO_REUSEADDR).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!spawn_and_wait()) {
    if (std::chrono::steady_clock::now() >= deadline)
      throw std::runtime_error("could not start redis-server again on port " + std::to_string(port_) +
                               " (see " + dir_ + "/redis.log)");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void RedisServer::restart() {
  require_owned("restart");
  reap_hard();
  start_again();
}

void RedisServer::stop_process() {
  require_owned("stop_process");
  if (pid_ <= 0) throw std::logic_error("RedisServer::stop_process: not running");
  if (stopped_) return;
  ::kill(pid_, SIGSTOP);
  wait_state(WUNTRACED);  // returns once it is stopped (or gone)
  if (pid_ > 0) stopped_ = true;
}

void RedisServer::continue_process() {
  require_owned("continue_process");
  if (pid_ <= 0) throw std::logic_error("RedisServer::continue_process: not running");
  if (!stopped_) return;
  ::kill(pid_, SIGCONT);
  wait_state(WCONTINUED);
  stopped_ = false;
}

void RedisServer::stop() {
  if (pid_ > 0) {
    if (stopped_) {
      ::kill(pid_, SIGCONT);  // a stopped process would not act on SIGTERM
      stopped_ = false;
    }
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    reap_hard();
  }
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }
}

std::string RedisServer::command(const std::vector<std::string>& args,
                                 std::chrono::milliseconds timeout) const {
  if (options_.tls) {
    if (!options_.password.empty()) throw std::logic_error("RedisServer: password with TLS is not supported");
    return tls_command(host_, port_, *options_.tls, args, timeout);
  }
  const timeval tv = to_timeval(timeout);
  redisContext* c = redisConnectWithTimeout(host_.c_str(), port_, tv);
  if (!c || c->err) {
    std::string text =
        "(error) cannot connect to redis at " + url() + (c ? std::string(": ") + c->errstr : "");
    if (c) redisFree(c);
    return text;
  }
  redisSetTimeout(c, tv);
  if (!options_.password.empty()) {
    auto* a = static_cast<redisReply*>(redisCommand(c, "AUTH %s", options_.password.c_str()));
    if (a) freeReplyObject(a);
  }
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* r =
      static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(args.size()), argv.data(), lens.data()));
  // No reply: timed out, or the connection closed (hiredis says which).
  std::string text = r ? reply_text(r) : "(error) " + std::string(c->errstr) + " (" + url() + ")";
  if (r) freeReplyObject(r);
  redisFree(c);
  return text;
}

}  // namespace fairgate::test
