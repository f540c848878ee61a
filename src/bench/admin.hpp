// bench/admin.hpp — a blocking Redis client for a parent process's
// bookkeeping (INFO, checks, clean-up) in `fairgate bench` and
// `fairgate demo --redis`, on every URL the backend takes (one server,
// Cluster, Sentinel, TLS: docs/redis-cluster.md).
#pragma once

#include "redis/client.hpp"
#include "redis/tls.hpp"
#include "redis/url.hpp"

#include <fmt/format.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace fairgate::bench {

/// A blocking Redis client for the parent's bookkeeping (INFO, checks, clean
/// up) on any URL the workers take (one server, Cluster, Sentinel, TLS):
/// every command goes to the node that owns `route_key`'s slot, i.e. the
/// master of the run's limiter (so on a Cluster, INFO counts the commands of
/// the one master the limiter lives on).
class Admin {
 public:
  Admin(const std::string& url, std::string route_key) : route_(std::move(route_key)) {
    auto parsed = redis::parse_target(url);
    if (const auto* problem = std::get_if<std::string>(&parsed))
      throw std::invalid_argument("--redis: " + *problem);
    auto target = std::get<redis::Target>(std::move(parsed));
    if (const auto& tls = target.nodes.front().tls; tls.enabled) {
      auto context = redis::make_tls_context(tls);
      if (const auto* problem = std::get_if<std::string>(&context))
        throw std::invalid_argument("--redis: " + *problem);
    }
    where_ = target.redacted();
    redis::ClientOptions co;
    co.target = std::move(target);
    co.command_timeout = std::chrono::seconds(3);
    co.client_name = "fairgate-bench-admin";
    co.log = [](const std::string& line) { std::fprintf(stderr, "fairgate bench: %s\n", line.c_str()); };
    client_ = redis::make_client(io_.get_executor(), std::move(co));
    client_->start();
    client_->close_subscriber();  // no wake messages needed here
    thread_ = std::thread([this] { io_.run(); });
    try {
      command({"PING"});
    } catch (const std::exception& e) {
      stop();
      throw std::runtime_error(fmt::format("cannot connect to Redis at {}: {}", where_, e.what()));
    }
  }
  ~Admin() { stop(); }
  Admin(const Admin&) = delete;
  Admin& operator=(const Admin&) = delete;

  /// The reply as text (integers as digits); throws on an error reply or none.
  /// The reply; throws when there is none (no connection, timeout).
  redis::Reply call(const std::vector<std::string>& args) {
    auto done = std::make_shared<std::promise<std::pair<boost::system::error_code, redis::Reply>>>();
    client_->exec(route_, args, [done](boost::system::error_code ec, redis::Reply r) {
      done->set_value({ec, std::move(r)});
    });
    auto f = done->get_future();
    // The command's own timeout ends it; this only guards against a bug.
    if (f.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
      throw std::runtime_error(fmt::format("Redis {}: no answer", args.front()));
    auto [ec, reply] = f.get();
    if (ec) throw std::runtime_error(fmt::format("Redis {}: {}", args.front(), ec.message()));
    return std::move(reply);
  }

  /// The reply as text (integers as digits); throws on an error reply or none.
  std::string command(const std::vector<std::string>& args) {
    redis::Reply reply = call(args);
    if (reply.is_error()) throw std::runtime_error(fmt::format("Redis {}: {}", args.front(), reply.str));
    if (reply.type == redis::Reply::Type::integer) return std::to_string(reply.integer);
    return reply.str;
  }

  /// Commands Redis has run so far (INFO commandstats; commands run inside
  /// scripts count, the INFO replication of a grant among them), less the
  /// INFO calls of this admin connection itself.
  std::uint64_t commands_run() {
    const std::uint64_t own_before = own_info_calls_;  // this call is counted only after it ran
    const std::string info = command({"INFO", "commandstats"});
    ++own_info_calls_;
    std::uint64_t total = 0;
    std::size_t pos = 0;
    while ((pos = info.find("cmdstat_", pos)) != std::string::npos) {
      const auto colon = info.find(':', pos);
      const auto calls = info.find("calls=", colon);
      if (colon == std::string::npos || calls == std::string::npos) break;
      const std::string name = info.substr(pos + 8, colon - pos - 8);
      total += std::stoull(info.substr(calls + 6));
      pos = calls;
    }
    return total - std::min(total, own_before);
  }

 private:
  std::uint64_t own_info_calls_ = 0;  // INFO commandstats sent by commands_run()

  void stop() {
    if (!thread_.joinable()) return;
    client_->close_after_pending();
    work_.reset();
    // Everything closes by itself; whatever does not within 2 s is stopped.
    for (int i = 0; i < 200 && !io_.stopped(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    io_.stop();
    thread_.join();
    client_.reset();
  }

  std::string route_;
  std::string where_;
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_{io_.get_executor()};
  std::shared_ptr<redis::Client> client_;
  std::thread thread_;
};

}  // namespace fairgate::bench
