// tests/support/wait.hpp — waiting for a condition with a deadline, so a
// broken limiter fails a test instead of hanging it.
#pragma once

#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <chrono>
#include <thread>

namespace fairgate::test {

/// Runs `io` (on this thread) until `pred()` holds or `timeout` passes.
/// Returns pred().
template <typename Pred>
bool run_until(boost::asio::io_context& io, Pred pred,
               std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    io.restart();
    if (io.run_one_for(std::chrono::milliseconds(5)) == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  return true;
}

/// Runs `io` for `duration` (handlers that become due meanwhile run).
inline void run_for(boost::asio::io_context& io, std::chrono::milliseconds duration) {
  const auto deadline = std::chrono::steady_clock::now() + duration;
  while (std::chrono::steady_clock::now() < deadline) {
    io.restart();
    if (io.run_one_until(deadline) == 0)
      std::this_thread::sleep_until(
          std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(1)));
  }
  io.restart();
  io.poll();
}

/// Polls `pred()` from this thread (the work runs elsewhere) until it holds
/// or `timeout` passes. Returns pred().
template <typename Pred>
bool wait_until(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

}  // namespace fairgate::test
