// http/sse_stream.hpp — the writing side of one server-sent event stream: a
// bounded queue of events written to the client as they come, a keep-alive
// comment while nothing else is written, and a client too slow to keep up
// dropped instead of buffered without bound.
//
// Invariants: everything runs on the connection's strand (push() from
// handlers posted or bound to it, run() as the connection's coroutine); an
// empty queue always takes one event, however large, so a stream never
// stalls on its own first event; on_drop is called at most once.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace fairgate::http {

class SseStream {
 public:
  /// Writes bytes to the client; false when it is gone (the stream ends).
  using Write = std::function<boost::asio::awaitable<bool>(const std::string&)>;

  /// `max_queued_bytes`: what may wait to be written before the client counts
  /// as too slow. `on_drop` (optional) is called when that happens: it should
  /// close the connection, which also ends a write under way.
  SseStream(const boost::asio::any_io_executor& strand, std::size_t max_queued_bytes,
            std::function<void()> on_drop = {});

  /// Queues bytes (one or more framed events). False, and the stream is
  /// dropped, when they would take the queue past its limit; false too once
  /// the stream is dropped or finished.
  bool push(std::string bytes);
  bool push(std::shared_ptr<const std::string> bytes);
  /// Ends the stream once what is queued is written.
  void finish();
  /// Writes a keep-alive comment after `interval` without other writes;
  /// nullopt: none (the default).
  void keepalive(std::optional<std::chrono::milliseconds> interval);

  bool dropped() const noexcept { return dropped_; }
  bool finished() const noexcept { return finished_; }
  std::size_t queued_bytes() const noexcept { return queued_bytes_; }

  /// Writes what is pushed until finish() and an empty queue (true), a failed
  /// write or a drop (false). One run() at a time.
  boost::asio::awaitable<bool> run(Write write);

 private:
  boost::asio::steady_timer wake_;
  std::deque<std::shared_ptr<const std::string>> out_;
  std::size_t queued_bytes_ = 0;
  std::size_t max_queued_bytes_;
  std::function<void()> on_drop_;
  std::optional<std::chrono::milliseconds> keepalive_;
  bool finished_ = false;
  bool dropped_ = false;
};

}  // namespace fairgate::http
