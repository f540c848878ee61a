#include "support/redis_server.hpp"

#include <hiredis/hiredis.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <thread>

namespace fairgate::test {

namespace {

std::uint16_t free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("bind() to a free loopback port failed");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
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

}  // namespace

RedisServer::RedisServer(std::vector<std::string> extra_args) { start(extra_args); }

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

std::string RedisServer::url() const { return "redis://" + host_ + ":" + std::to_string(port_); }

void RedisServer::start(const std::vector<std::string>& extra_args) {
  char tmpl[] = "/tmp/fairgate-redis-XXXXXX";
  if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  for (int attempt = 0; attempt < 5; ++attempt) {
    port_ = free_loopback_port();
    std::vector<std::string> args{"redis-server",
                                  "--port",
                                  std::to_string(port_),
                                  "--bind",
                                  host_,
                                  "--save",
                                  "",
                                  "--appendonly",
                                  "no",
                                  "--dir",
                                  dir_,
                                  "--logfile",
                                  dir_ + "/redis.log",
                                  "--enable-debug-command",
                                  "local"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
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
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      ::_exit(127);
    }
    // Wait until it answers (a password-protected one answers NOAUTH: still up).
    for (int i = 0; i < 250; ++i) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;  // exited (port taken?): try another port
      }
      timeval tv{0, 200'000};
      redisContext* c = redisConnectWithTimeout(host_.c_str(), port_, tv);
      if (c && !c->err) {
        auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
        const bool up = r != nullptr;
        if (r) freeReplyObject(r);
        redisFree(c);
        if (up) return;
      } else if (c) {
        redisFree(c);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    stop();
  }
  throw std::runtime_error("could not start redis-server (is the redis-server package installed?)");
}

void RedisServer::stop() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }
}

std::string RedisServer::command(const std::vector<std::string>& args) const {
  timeval tv{2, 0};
  redisContext* c = redisConnectWithTimeout(host_.c_str(), port_, tv);
  if (!c || c->err) {
    if (c) redisFree(c);
    throw std::runtime_error("cannot connect to redis at " + url());
  }
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* r =
      static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(args.size()), argv.data(), lens.data()));
  std::string text = reply_text(r);
  if (r) freeReplyObject(r);
  redisFree(c);
  return text;
}

}  // namespace fairgate::test
