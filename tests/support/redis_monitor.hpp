// tests/support/redis_monitor.hpp — what Redis runs, in Redis' own order.
//
// A MONITOR connection records every command Redis executes, those run inside
// Lua scripts included, in execution order. fifo_in_redis_order() reads from
// it each waiter's enqueue (ZADD <queue> <seq> <member>, the member
// "inst|n|deadline_ms:arrived_ms", or "inst|n|deadline_ms" as written before
// the arrival rode in it) and each hand-off to
// a waiter (SPUBLISH on its instance's wake channel): the scripts must hand
// permits out in increasing sequence. Client-side timestamps of grants made a
// fraction of a millisecond apart on different processes cannot show this
// reliably; Redis' own order can.
#pragma once

#include "redis/connection.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace fairgate::test {

class RedisMonitor {
 public:
  explicit RedisMonitor(std::uint16_t port) {
    thread_ = std::thread([this] { io_.run(); });
    redis::ConnectionOptions o;
    o.endpoint.port = port;
    o.command_timeout = std::chrono::seconds(2);
    conn_ = redis::Connection::create(io_.get_executor(), o);
    conn_->set_push_handler([this](redis::Reply r) {
      std::lock_guard lock(mu_);
      lines_.push_back(std::move(r.str));
    });
    conn_->start();
    std::promise<void> ready;
    conn_->exec({"MONITOR"}, [&](boost::system::error_code, redis::Reply) { ready.set_value(); });
    ready.get_future().wait();
  }
  ~RedisMonitor() {
    conn_->close();
    work_.reset();
    thread_.join();
  }
  RedisMonitor(const RedisMonitor&) = delete;
  RedisMonitor& operator=(const RedisMonitor&) = delete;

  std::vector<std::string> lines() {
    std::lock_guard lock(mu_);
    return lines_;
  }

 private:
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_ =
      boost::asio::make_work_guard(io_);
  std::thread thread_;
  std::shared_ptr<redis::Connection> conn_;
  std::mutex mu_;
  std::vector<std::string> lines_;
};

struct RedisFifo {
  int handoffs = 0;    ///< grants to a waiter (SPUBLISH on a wake channel)
  int inversions = 0;  ///< a hand-off whose sequence was not above the previous one
  int unknown = 0;     ///< hand-offs to a waiter never seen queueing
};

/// FIFO of limiter `name` (keys "<prefix>:{<name>}:...") from MONITOR lines.
inline RedisFifo fifo_in_redis_order(const std::vector<std::string>& lines, const std::string& prefix,
                                     const std::string& name) {
  const auto escape = [](const std::string& s) {
    return std::regex_replace(s, std::regex(R"([{}.\-|])"), "\\$&");
  };
  const std::string base = prefix + ":{" + name + "}:";
  const std::regex enqueue("\\[\\d+ lua\\] \"ZADD\" \"" + escape(base + "queue") +
                           "\" \"(\\d+)\" \"([^\"|]+\\|\\d+)\\|\\d+(:\\d+)?\"");
  const std::regex publish("\\[\\d+ lua\\] \"SPUBLISH\" \"" + escape(base + "wake:") +
                           "[^\"]+\" \"([^\"]+)\"");
  std::map<std::string, long> seq_of;
  long last_seq = 0;
  RedisFifo fifo;
  for (const auto& line : lines) {
    std::smatch m;
    if (std::regex_search(line, m, enqueue)) {
      seq_of[m[2]] = std::stol(m[1]);
    } else if (std::regex_search(line, m, publish)) {
      auto it = seq_of.find(m[1]);
      if (it == seq_of.end()) {
        ++fifo.unknown;
        continue;
      }
      if (it->second <= last_seq) ++fifo.inversions;
      last_seq = it->second;
      ++fifo.handoffs;
    }
  }
  return fifo;
}

}  // namespace fairgate::test
