// Instances of a service inside one test process, and the outcome of their
// acquires:
//
//   fairgate::test::Instance a(options), b(options);  // two instances, one Redis
//   Limiter la = a.open("llm", settings);
//   auto held = acquire(la);                          // a Probe, filled in on a's io thread
//   wait_until([&] { return held->done(); });
//   a.freeze();                                       // like kill -STOP: no heartbeat, no reply read
//
// Each Instance is a backend with its own io_context and io thread(s): its
// own instance id, connections and heartbeats, as a separate process would
// have. Header-only: the tests that use it link fairgate_redis.
#pragma once

#include "redis/redis_limiter.hpp"
#include "support/wait.hpp"

#include <fairgate/backend.hpp>
#include <fairgate/redis_backend.hpp>

#include <gtest/gtest.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace fairgate::test {

class Instance {
 public:
  /// A Redis backend with `options`, or the memory backend without.
  explicit Instance(std::optional<RedisBackendOptions> options, int threads = 1) : threads_(threads) {
    backend = options ? make_redis_backend(io.get_executor(), std::move(*options))
                      : make_memory_backend(io.get_executor());
    start();
  }
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;
  ~Instance() {
    if (frozen_) thaw();
    backend.reset();
    work_.reset();
    // Everything closes by itself; a broken close must not hang the test.
    wait_until([&] { return io.stopped(); }, std::chrono::seconds(3));
    io.stop();
    for (auto& t : threads_v_) t.join();
  }

  /// The instance stops dead (no heartbeat, no reply handled), like kill -STOP.
  void freeze() {
    frozen_ = true;
    io.stop();
    for (auto& t : threads_v_) t.join();
    threads_v_.clear();
  }
  void thaw() {
    frozen_ = false;
    io.restart();
    start();
  }

  Limiter open(const std::string& name, const Settings& settings) {
    return backend->open(name, settings).value();
  }
  /// The Redis limiter behind `name` (null on the memory backend).
  std::shared_ptr<redis::RedisLimiter> impl(const std::string& name) {
    return redis::redis_limiter_of(*backend, name);
  }

  boost::asio::io_context io;
  std::shared_ptr<Backend> backend;

 private:
  void start() {
    for (int i = 0; i < threads_; ++i) threads_v_.emplace_back([this] { io.run(); });
  }
  int threads_;
  bool frozen_ = false;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_ =
      boost::asio::make_work_guard(io);
  std::vector<std::thread> threads_v_;
};

/// Whether `limiter`, opened on `instance` as `name`, has its state in Redis
/// and is past its recovery fence (grants come at once).
inline bool ready_past_fence(Instance& instance, const std::string& name, Limiter& limiter) {
  return instance.impl(name)->ready() && !limiter.snapshot().engine.fence_left.count();
}

/// The outcome of one acquire, filled in by its handler (on an io thread).
class Probe {
 public:
  using Clock = std::chrono::steady_clock;

  void set(AcquireResult r) {
    std::lock_guard lock(mu_);
    ++ends_;
    result_ = std::move(r);
    at_ = Clock::now();
  }
  int ends() const {
    std::lock_guard lock(mu_);
    return ends_;
  }
  bool done() const { return ends() > 0; }
  Outcome outcome() const {
    std::lock_guard lock(mu_);
    return result_.outcome();
  }
  RejectReason reason() const {
    std::lock_guard lock(mu_);
    return result_.reason();
  }
  std::string message() const {
    std::lock_guard lock(mu_);
    return result_.message();
  }
  /// When it ended (this process' clock).
  Clock::time_point at() const {
    std::lock_guard lock(mu_);
    return at_;
  }
  /// Releases the permit (if granted), on the caller's thread.
  void release() {
    Permit p;
    {
      std::lock_guard lock(mu_);
      p = result_.take_permit();
    }
    p.release();
  }

 private:
  mutable std::mutex mu_;
  int ends_ = 0;
  AcquireResult result_;
  Clock::time_point at_{};
};

inline std::shared_ptr<Probe> acquire(Limiter& limiter, AcquireOptions options = {}) {
  auto probe = std::make_shared<Probe>();
  limiter.async_acquire(std::move(options), [probe](AcquireResult r) { probe->set(std::move(r)); });
  return probe;
}

/// Acquires and waits until the request is queued (a test failure if it ends first).
inline std::shared_ptr<Probe> acquire_queued(Limiter& limiter,
                                             std::chrono::milliseconds max_wait = std::chrono::seconds(20)) {
  auto queued = std::make_shared<std::atomic<bool>>(false);
  AcquireOptions o;
  o.max_wait = max_wait;
  o.on_queued = [queued](const QueueStatus&) { queued->store(true); };
  auto probe = acquire(limiter, std::move(o));
  EXPECT_TRUE(wait_until([&] { return queued->load() || probe->done(); }, std::chrono::seconds(5)));
  EXPECT_FALSE(probe->done()) << "expected to wait";
  return probe;
}

}  // namespace fairgate::test
