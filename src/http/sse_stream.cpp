// http/sse_stream.cpp — one SSE stream's queue and writer (http/sse_stream.hpp).
#include "http/sse_stream.hpp"

#include "http/sse.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace fairgate::http {

namespace net = boost::asio;

SseStream::SseStream(const net::any_io_executor& strand, std::size_t max_queued_bytes,
                     std::function<void()> on_drop)
    : wake_(strand), max_queued_bytes_(max_queued_bytes), on_drop_(std::move(on_drop)) {}

bool SseStream::push(std::string bytes) {
  return push(std::make_shared<const std::string>(std::move(bytes)));
}

bool SseStream::push(std::shared_ptr<const std::string> bytes) {
  if (dropped_ || finished_) return false;
  if (!out_.empty() && queued_bytes_ + bytes->size() > max_queued_bytes_) {
    dropped_ = true;
    out_.clear();
    queued_bytes_ = 0;
    wake_.cancel();
    if (auto drop = std::move(on_drop_)) drop();
    return false;
  }
  queued_bytes_ += bytes->size();
  out_.push_back(std::move(bytes));
  wake_.cancel();
  return true;
}

void SseStream::finish() {
  finished_ = true;
  wake_.cancel();
}

void SseStream::keepalive(std::optional<std::chrono::milliseconds> interval) {
  keepalive_ = interval;
  wake_.cancel();
}

net::awaitable<bool> SseStream::run(Write write) {
  for (;;) {
    while (!out_.empty() && !dropped_) {
      const std::shared_ptr<const std::string> bytes = std::move(out_.front());
      out_.pop_front();
      queued_bytes_ -= bytes->size();
      if (!co_await write(*bytes)) co_return false;
    }
    if (dropped_) co_return false;
    if (finished_) co_return true;
    wake_.expires_after(keepalive_.value_or(std::chrono::hours(24)));
    auto [ec] = co_await wake_.async_wait(net::as_tuple(net::use_awaitable));
    if (!ec && keepalive_ && out_.empty() && !finished_) push(sse_comment("keepalive"));
  }
}

}  // namespace fairgate::http
