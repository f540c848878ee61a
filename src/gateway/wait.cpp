// gateway/wait.cpp — the wait for a permit (gateway/wait.hpp).
#include "gateway/wait.hpp"

#include "serve/views.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/json.hpp>

#include <fmt/format.h>

namespace fairgate::serve {

namespace json = boost::json;
using net::awaitable;

std::string queue_event(QueueEvents mode, const QueueStatus& q) {
  if (mode == QueueEvents::named) {
    json::object data;
    data["position"] = q.position;
    data["queued"] = q.queued;
    if (q.estimated_wait) data["estimated_wait_ms"] = q.estimated_wait->count();
    return sse_event("queue", data);
  }
  return fmt::format(": queued position={} queued={}\n\n", q.position, q.queued);
}

std::string admitted_event(QueueEvents mode, std::chrono::milliseconds waited) {
  if (mode == QueueEvents::named) {
    json::object data;
    data["waited_ms"] = waited.count();
    return sse_event("admitted", data);
  }
  return fmt::format(": admitted waited_ms={}\n\n", waited.count());
}

awaitable<void> wait_for_permit(Session& s, Wait& st, const Request& req, bool& header_sent,
                                bool& write_failed) {
  const auto keepalive = s.shared->config.server.keepalive_interval;
  for (;;) {
    if (st.result) co_return;
    if (!st.out.empty()) {
      if (!header_sent) {
        if (!co_await send_sse_header(s, req)) {
          write_failed = true;
          co_return;
        }
        header_sent = true;
      }
      while (!st.out.empty()) {
        const std::string bytes = std::move(st.out.front());
        st.out.pop_front();
        if (!co_await send_raw(s, bytes)) {
          write_failed = true;
          co_return;
        }
      }
      continue;
    }
    st.wake.expires_after(header_sent ? keepalive : std::chrono::milliseconds(std::chrono::hours(24)));
    auto [ec] = co_await st.wake.async_wait(nothrow);
    if (!ec && header_sent && !st.result) st.out.push_back(": keepalive\n\n");
  }
}

void start_acquire(Limiter& limiter, std::optional<std::chrono::milliseconds> max_wait, std::string tenant,
                   QueueEvents events, const std::shared_ptr<Wait>& st, const net::any_io_executor& strand,
                   WaiterSlot slot) {
  AcquireOptions options;
  options.max_wait = max_wait;
  options.tenant = std::move(tenant);
  if (events != QueueEvents::none) {
    options.on_queued = [st, strand, events](const QueueStatus& q) {
      net::post(strand, [st, q, events] {
        if (st->result || st->closed || q.position == st->told_position) return;
        st->told_position = q.position;
        st->out.push_back(queue_event(events, q));
        st->wake.cancel();
      });
    };
  }
  auto on_done = [st, slot = std::make_shared<WaiterSlot>(std::move(slot))](AcquireResult r) {
    slot->reset();
    if (st->closed) return;  // the client left while this was on its way: a permit is released here
    st->result.emplace(std::move(r));
    st->wake.cancel();
  };
  limiter.async_acquire(
      std::move(options),
      net::bind_cancellation_slot(st->cancel.slot(), net::bind_executor(strand, std::move(on_done))));
}

}  // namespace fairgate::serve
