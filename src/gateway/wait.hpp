// gateway/wait.hpp — a gateway request waiting for its permit: the acquire
// (through serve::Waiter, as the admission API's event stream) with its queue
// feedback, and the wait that writes that feedback (queue events, keep-alive
// comments) to a streaming client until the acquire ends.
#pragma once

#include "serve/config.hpp"
#include "serve/session.hpp"
#include "serve/waiter.hpp"

#include "http/sse_stream.hpp"

#include <fairgate/limiter.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace fairgate::serve {

/// A waiting request: its queue feedback, written as an event stream once
/// there is something to say, and the acquire's result (on the session strand).
struct Wait {
  Wait(const net::any_io_executor& strand, std::function<void()> on_drop)
      : stream(strand, Waiter::kEventBytes, std::move(on_drop)) {}
  fairgate::http::SseStream stream;
  std::optional<AcquireResult> result;  ///< set (and the stream finished) by the completion
};

/// A queue event in `mode`: a comment, or a named event.
std::string queue_event(QueueEvents mode, const QueueStatus& q);

/// Sent once a stream that queued is admitted: a comment, or a named event in `named` mode.
std::string admitted_event(QueueEvents mode, std::chrono::milliseconds waited);

/// Waits until the acquire completed (st.result set), writing its queue
/// events as they come: the SSE header before the first, keep-alive comments
/// after it. False when the client could not be written to (or was dropped).
net::awaitable<bool> wait_for_permit(Session& s, Wait& st, const Request& req, bool& header_sent,
                                     const http::fields* extra = nullptr);

/// Asks for the permit through serve::Waiter; the queue events (in `events`'
/// form, none for QueueEvents::none) and the completion land in `st`.
std::shared_ptr<Waiter> start_acquire(Limiter& limiter, std::optional<std::chrono::milliseconds> max_wait,
                                      std::string tenant, QueueEvents events, const std::shared_ptr<Wait>& st,
                                      const net::any_io_executor& strand, WaiterSlot slot);

}  // namespace fairgate::serve
