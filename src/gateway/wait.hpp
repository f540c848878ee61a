// gateway/wait.hpp — a gateway request waiting for its permit: the acquire
// with its queue feedback, and the wait that writes that feedback (queue
// events, keep-alive comments) to a streaming client until the acquire ends.
#pragma once

#include "serve/config.hpp"
#include "serve/session.hpp"

#include <fairgate/limiter.hpp>

#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>
#include <optional>
#include <string>

namespace fairgate::serve {

/// A waiting request: shared by the coroutine, on_queued and the completion, all on the session strand.
struct Wait {
  explicit Wait(const net::any_io_executor& strand) : wake(strand) {}
  net::steady_timer wake;  // cancelled when there is news
  net::cancellation_signal cancel;
  std::deque<std::string> out;  // queue events not yet written
  std::optional<AcquireResult> result;
  std::size_t told_position = 0;
  bool closed = false;  // the coroutine left: a late grant is released at once
};

/// A queue event in `mode`: a comment, or a named event.
std::string queue_event(QueueEvents mode, const QueueStatus& q);

/// Sent once a stream that queued is admitted: a comment, or a named event in `named` mode.
std::string admitted_event(QueueEvents mode, std::chrono::milliseconds waited);

/// Waits until the acquire completed (st.result set) or a write to the client failed,
/// writing queue events (and keep-alive comments) as they come.
net::awaitable<void> wait_for_permit(Session& s, Wait& st, const Request& req, bool& header_sent,
                                     bool& write_failed);

/// Asks for the permit; the completion and queue events land in `st`, on `strand`.
/// (A plain function, not part of the coroutine: g++ 12 mis-sizes some coroutine
/// locals that never live across a suspension, as ASan showed for AcquireOptions.)
void start_acquire(Limiter& limiter, std::optional<std::chrono::milliseconds> max_wait, std::string tenant,
                   QueueEvents events, const std::shared_ptr<Wait>& st, const net::any_io_executor& strand,
                   WaiterSlot slot);

}  // namespace fairgate::serve
