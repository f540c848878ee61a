// tests/support/gate_executor.hpp — freezing a thread at a chosen point.
//
// The limiter posts every completion while it holds its lock. A handler bound
// to a GateExecutor stops the posting thread at an armed Gate, so a test can
// freeze the limiter in the middle of a dispatch and act on another thread.
#pragma once

#include <boost/asio/execution.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <utility>

namespace fairgate::test {

/// A gate a thread stops at, once, until the test opens it.
class Gate {
 public:
  void arm() {
    std::lock_guard l(m_);
    armed_ = true;
  }
  void pass() {
    std::unique_lock l(m_);
    if (!armed_) return;
    armed_ = false;
    entered_ = true;
    cv_.notify_all();
    cv_.wait(l, [&] { return open_; });
  }
  bool wait_entered(std::chrono::milliseconds timeout) {
    std::unique_lock l(m_);
    return cv_.wait_for(l, timeout, [&] { return entered_; });
  }
  void open() {
    std::lock_guard l(m_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool armed_ = false, entered_ = false, open_ = false;
};

/// An executor that stops at `gate` (when armed) before posting to an io_context.
struct GateExecutor {
  boost::asio::io_context::executor_type inner;
  Gate* gate;

  template <typename F>
  void execute(F&& f) const {
    gate->pass();
    boost::asio::post(inner, std::forward<F>(f));
  }
  GateExecutor require(boost::asio::execution::blocking_t::never_t) const noexcept { return *this; }
  boost::asio::io_context& query(boost::asio::execution::context_t) const noexcept {
    return boost::asio::query(inner, boost::asio::execution::context);
  }
  static constexpr boost::asio::execution::blocking_t query(boost::asio::execution::blocking_t) noexcept {
    return boost::asio::execution::blocking.never;
  }
  friend bool operator==(const GateExecutor&, const GateExecutor&) noexcept = default;
};

}  // namespace fairgate::test
