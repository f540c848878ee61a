// serve/event_hub.hpp — the snapshots of GET /v1/events (what the dashboard
// and `fairgate top` read): one snapshot per tick, fanned out to every
// subscriber, so N watchers cost one snapshot per tick, not N (on Redis a
// cluster-wide snapshot is a script call).
//
// Invariants: the hub ticks only while someone subscribes; a new subscriber
// gets the latest event at once (at most one tick old) or the next tick, which
// then starts at once; each subscriber's events go through its own bounded
// SseStream on its own strand, so a slow one is dropped without holding up
// the others; snapshot() runs on the hub's strand, one at a time.
#pragma once

#include "http/sse_stream.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace fairgate::serve {

class EventHub : public std::enable_shared_from_this<EventHub> {
 public:
  /// Takes one snapshot, framed as the event to send.
  using Snapshot = std::function<std::string()>;

  EventHub(boost::asio::io_context& io, std::chrono::milliseconds interval, Snapshot snapshot);

  /// Sends every tick's event to `stream` (pushed on `strand`, the stream's)
  /// until the stream is gone (the hub holds it weakly), dropped or finished.
  void subscribe(const boost::asio::any_io_executor& strand, std::weak_ptr<fairgate::http::SseStream> stream);

  /// Stops ticking (shutdown); subscribers get no more events.
  void stop();

 private:
  struct Subscriber {
    boost::asio::any_io_executor strand;
    std::weak_ptr<fairgate::http::SseStream> stream;
  };

  boost::asio::awaitable<void> run();
  /// Prunes the subscribers that are gone; false (and the hub stops ticking)
  /// when none is left or the hub is stopped.
  bool anyone_watching();
  static void deliver(const Subscriber& to, std::shared_ptr<const std::string> event);

  boost::asio::strand<boost::asio::io_context::executor_type> strand_;
  boost::asio::steady_timer timer_;
  std::chrono::milliseconds interval_;
  Snapshot snapshot_;

  std::mutex mu_;  ///< guards what follows
  std::vector<Subscriber> subscribers_;
  std::shared_ptr<const std::string> latest_;  ///< the last tick's event (null before the first)
  bool running_ = false;
  bool stopped_ = false;
};

}  // namespace fairgate::serve
