// tests/support/redis_server.hpp — a real redis-server for integration tests.
//
// Starts `redis-server` (Debian's package, Redis 7) on a free loopback port in
// a temporary directory, waits until it answers PING, and stops it (by pid)
// on destruction. With FAIRGATE_TEST_REDIS=host:port set, shared() reuses that
// server instead of starting one.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fairgate::test {

class RedisServer {
 public:
  /// Starts a server with these extra arguments (e.g. {"--requirepass", "x"}).
  explicit RedisServer(std::vector<std::string> extra_args = {});
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  /// One server for the whole test binary, started on first use.
  static RedisServer& shared();

  const std::string& host() const { return host_; }
  std::uint16_t port() const { return port_; }
  /// redis://host:port
  std::string url() const;

  /// Runs one command synchronously on a fresh connection (test helper);
  /// returns the reply as text ("(error) ..." for errors).
  std::string command(const std::vector<std::string>& args) const;

 private:
  RedisServer(std::string host, std::uint16_t port)
      : host_(std::move(host)), port_(port) {}  // reuse, not owned
  void start(const std::vector<std::string>& extra_args);
  void stop();

  std::string host_ = "127.0.0.1";
  std::uint16_t port_ = 0;
  pid_t pid_ = -1;
  std::string dir_;
};

}  // namespace fairgate::test
