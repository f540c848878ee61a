// serve/event_hub.cpp — one snapshot per tick, fanned out (serve/event_hub.hpp).
#include "serve/event_hub.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>

namespace fairgate::serve {

namespace net = boost::asio;

EventHub::EventHub(net::io_context& io, std::chrono::milliseconds interval, Snapshot snapshot)
    : strand_(net::make_strand(io)), timer_(strand_), interval_(interval), snapshot_(std::move(snapshot)) {}

void EventHub::subscribe(const net::any_io_executor& strand,
                         std::weak_ptr<fairgate::http::SseStream> stream) {
  Subscriber sub{strand, std::move(stream)};
  std::shared_ptr<const std::string> latest;
  bool start = false;
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    subscribers_.push_back(sub);
    latest = latest_;
    start = !running_;
    running_ = true;
  }
  if (start) {
    net::co_spawn(
        strand_, [self = shared_from_this()] { return self->run(); }, net::detached);
  } else if (latest) {
    deliver(sub, std::move(latest));
  }
}

void EventHub::stop() {
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
    subscribers_.clear();
  }
  net::post(strand_, [self = shared_from_this()] { self->timer_.cancel(); });
}

bool EventHub::anyone_watching() {
  std::lock_guard lock(mu_);
  std::erase_if(subscribers_, [](const Subscriber& s) {
    const auto stream = s.stream.lock();
    return !stream || stream->dropped() || stream->finished();
  });
  if (subscribers_.empty() || stopped_) {
    running_ = false;
    latest_.reset();  // a later subscriber starts the ticks afresh, with a fresh snapshot
  }
  return running_;
}

void EventHub::deliver(const Subscriber& to, std::shared_ptr<const std::string> event) {
  net::post(to.strand, [stream = to.stream, event = std::move(event)] {
    if (auto s = stream.lock()) s->push(event);
  });
}

net::awaitable<void> EventHub::run() {
  for (;;) {
    if (!anyone_watching()) co_return;
    auto event = std::make_shared<const std::string>(snapshot_());
    std::vector<Subscriber> to;
    {
      std::lock_guard lock(mu_);
      latest_ = event;
      to = subscribers_;  // including any that came during the snapshot
    }
    for (const auto& sub : to) deliver(sub, event);
    timer_.expires_after(interval_);
    // stop() cancels the wait; the next anyone_watching() then ends the loop.
    co_await timer_.async_wait(net::as_tuple(net::use_awaitable));
  }
}

}  // namespace fairgate::serve
