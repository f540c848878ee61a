// gateway/wait.cpp — the wait for a permit (gateway/wait.hpp).
#include "gateway/wait.hpp"

#include "serve/views.hpp"

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

awaitable<bool> wait_for_permit(Session& s, Wait& st, const Request& req, bool& header_sent,
                                const http::fields* extra) {
  const auto keepalive = s.shared->config.server.keepalive_interval;
  co_return co_await st.stream.run(
      [&s, &st, &req, &header_sent, keepalive, extra](const std::string& bytes) -> awaitable<bool> {
        if (!header_sent) {
          if (!co_await send_sse_header(s, req, extra)) co_return false;
          header_sent = true;
          st.stream.keepalive(keepalive);
        }
        co_return co_await send_raw(s, bytes);
      });
}

std::shared_ptr<Waiter> start_acquire(Limiter& limiter, std::optional<std::chrono::milliseconds> max_wait,
                                      std::string tenant, QueueEvents events, const std::shared_ptr<Wait>& st,
                                      const net::any_io_executor& strand, WaiterSlot slot) {
  AcquireOptions options;
  options.max_wait = max_wait;
  options.tenant = std::move(tenant);
  Waiter::Handlers handlers;
  if (events != QueueEvents::none)
    handlers.queued = [st, events](const QueueStatus& q) { st->stream.push(queue_event(events, q)); };
  handlers.done = [st](AcquireResult r) {
    st->result.emplace(std::move(r));
    st->stream.finish();
  };
  return Waiter::start(limiter, std::move(options), strand, std::move(slot), std::move(handlers));
}

}  // namespace fairgate::serve
