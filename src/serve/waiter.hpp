// serve/waiter.hpp — one acquire seen as events on a connection's strand:
// `queued` for each new position, then exactly one completion (granted or
// rejected). The admission API's event stream and the gateway both wait
// through it, so the rules below live in one place.
//
// Invariants:
//  * Handlers run on the strand. `queued` never runs after the completion
//    (the limiter's position updates race it; the completion is the truth)
//    and never twice for the same position.
//  * The per-client waiter slot (WaiterSlot) is held until the completion.
//  * After cancel() no handler runs again: a waiter still queued leaves the
//    queue, and a grant already on its way is released when it arrives.
//  * The handlers are dropped after the completion or cancel(), so what they
//    capture (which may own this Waiter) is freed then.
#pragma once

#include "serve/session.hpp"

#include <fairgate/limiter.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>

#include <cstddef>
#include <functional>
#include <memory>

namespace fairgate::serve {

class Waiter {
 public:
  /// Bytes of a waiting request's events (queued, then its completion) that
  /// may wait to be written before its client counts as too slow and is
  /// dropped (fairgate::http::SseStream): a few events take well under a KiB.
  static constexpr std::size_t kEventBytes = 256 * 1024;

  struct Handlers {
    std::function<void(const QueueStatus&)> queued;  ///< may be empty: no queue events
    std::function<void(AcquireResult)> done;
  };

  /// Asks `limiter` for a permit. (A plain function, not a coroutine: g++ 12
  /// mis-sizes some coroutine locals that never live across a suspension, as
  /// ASan showed for AcquireOptions.)
  static std::shared_ptr<Waiter> start(Limiter& limiter, AcquireOptions options,
                                       const net::any_io_executor& strand, WaiterSlot slot,
                                       Handlers handlers);

  /// On the strand: the client left. Leaves the queue if still waiting; no
  /// handler runs after this.
  void cancel();

  /// The completion arrived (and went to `done`, unless cancelled first).
  bool completed() const noexcept { return completed_; }

 private:
  Handlers handlers_;
  net::cancellation_signal cancel_;
  std::size_t told_position_ = 0;
  bool completed_ = false;
  bool cancelled_ = false;
};

}  // namespace fairgate::serve
