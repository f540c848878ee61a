// serve/waiter.cpp — one acquire as events (serve/waiter.hpp).
#include "serve/waiter.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>

namespace fairgate::serve {

std::shared_ptr<Waiter> Waiter::start(Limiter& limiter, AcquireOptions options,
                                      const net::any_io_executor& strand, WaiterSlot slot,
                                      Handlers handlers) {
  auto w = std::make_shared<Waiter>();
  const bool tell_queue = static_cast<bool>(handlers.queued);
  w->handlers_ = std::move(handlers);
  if (tell_queue) {
    options.on_queued = [w, strand](const QueueStatus& q) {
      net::post(strand, [w, q] {
        if (w->completed_ || w->cancelled_ || q.position == w->told_position_) return;
        w->told_position_ = q.position;
        w->handlers_.queued(q);
      });
    };
  }
  auto on_done = [w, slot = std::make_shared<WaiterSlot>(std::move(slot))](AcquireResult r) {
    w->completed_ = true;
    slot->reset();
    Handlers h = std::move(w->handlers_);
    w->handlers_ = {};
    if (w->cancelled_) return;  // the client left while this was on its way: a permit is released here
    h.done(std::move(r));
  };
  limiter.async_acquire(
      std::move(options),
      net::bind_cancellation_slot(w->cancel_.slot(), net::bind_executor(strand, std::move(on_done))));
  return w;
}

void Waiter::cancel() {
  if (cancelled_) return;
  cancelled_ = true;
  handlers_ = {};
  if (!completed_) cancel_.emit(net::cancellation_type::terminal);
}

}  // namespace fairgate::serve
