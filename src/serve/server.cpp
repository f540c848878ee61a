// serve/server.cpp — listener, sessions, routes, SSE.
//
// Invariants:
//  * Every connection is one coroutine on its own strand; everything that
//    touches a connection (its socket, its SSE state, its cancellation
//    signal) runs on that strand. Library callbacks (on_queued) are posted to
//    it; acquire completions are bound to it.
//  * A permit is always owned by exactly one RAII object: an AcquireResult,
//    an SSE stream's state, or the LeaseTable. Dropping the owner releases it,
//    so every exit path (client gone, write error, shutdown, exception)
//    releases without a special case.
//  * A request that waits is always watched for disconnect (a pending read on
//    the socket); the watcher's completion cancels the acquire through its
//    per-operation cancellation slot (F4: cancel before grant removes the
//    waiter; a grant that races the cancel is released by RAII).
//  * Nothing a client sends can make the server hold unbounded memory or time:
//    header and body caps, a read timeout per request, an idle timeout between
//    requests, a write timeout per write, a connection cap and a per-client
//    cap on waiting requests (S7).
#include "serve/server.hpp"

#include "core/settings_table.hpp"
#include "gateway/gateway.hpp"
#include "http/listener.hpp"
#include "http/read.hpp"

#include "http/sse_stream.hpp"
#include "redis/url.hpp"
#include "serve/cors.hpp"
#include "serve/dashboard.hpp"
#include "serve/event_hub.hpp"
#include "serve/openapi.hpp"
#include "serve/params.hpp"
#include "serve/ratelimit.hpp"
#include "serve/routes.hpp"
#include "serve/session.hpp"
#include "serve/views.hpp"
#include "serve/waiter.hpp"

#include <fairgate/backend.hpp>
#include <fairgate/redis_backend.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <csignal>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <variant>

namespace fairgate::serve {
namespace {

namespace json = boost::json;
using net::awaitable;
using net::use_awaitable;
using namespace net::experimental::awaitable_operators;
using namespace std::chrono_literals;
using std::chrono::milliseconds;

// --- responses --------------------------------------------------------------

http::status status_of(RejectReason reason) {
  switch (reason) {
    case RejectReason::timeout:
    case RejectReason::would_time_out:
    case RejectReason::queue_full: return http::status::too_many_requests;
    case RejectReason::invalid_argument: return http::status::bad_request;
    default: return http::status::service_unavailable;
  }
}

void record_grant(Shared& sh, const std::string& limiter, milliseconds waited) {
  if (auto* h = sh.metrics.wait_histogram(limiter)) h->observe(waited);
}

// --- SSE acquire --------------------------------------------------------------

/// What one SSE acquire learns, for its stream and the access log (on the session strand).
struct SseAcquire {
  SseAcquire(const net::any_io_executor& strand, std::function<void()> on_drop)
      : stream(strand, Waiter::kEventBytes, std::move(on_drop)) {}

  fairgate::http::SseStream stream;
  std::string ticket;
  Permit permit;
  std::string_view outcome;  // "granted" or the rejection's reason, for the access log
  long long waited_ms = -1;
  std::chrono::steady_clock::time_point granted_at{};
};

/// The `queued` event: position, queue length, ticket, the estimate when there is one.
std::string queued_event(const QueueStatus& q) {
  json::object data;
  data["position"] = q.position;
  data["queued"] = q.queued;
  data["ticket"] = q.ticket;
  if (q.estimated_wait) data["estimated_wait_ms"] = q.estimated_wait->count();
  return sse_event("queued", data);
}

/// The acquire's completion, as the stream's `granted` or `rejected` event.
void sse_completed(SseAcquire& st, Shared& sh, const std::string& name, AcquireResult r,
                   std::optional<milliseconds> keepalive) {
  if (r.granted()) {
    Permit permit = r.take_permit();
    record_grant(sh, name, permit.waited());
    json::object data;
    data["permit"] = permit.id();
    data["waited_ms"] = permit.waited().count();
    data["ticket"] = permit.id();
    st.permit = std::move(permit);
    st.outcome = "granted";
    st.waited_ms = st.permit.waited().count();
    st.granted_at = std::chrono::steady_clock::now();
    st.stream.push(sse_event("granted", data));
    st.stream.keepalive(keepalive);  // the holder's stream stays open: keep proxies from closing it
    return;
  }
  json::object data;
  data["reason"] = wire_reason(r.reason());
  data["message"] = r.message();
  data["waited_ms"] = r.waited().count();
  if (!st.ticket.empty()) data["ticket"] = st.ticket;  // absent when rejected at arrival
  st.outcome = wire_reason(r.reason());
  st.waited_ms = r.waited().count();
  st.stream.push(sse_event("rejected", data));
  st.stream.finish();
}

awaitable<bool> acquire_sse(std::shared_ptr<Session> self, Limiter limiter, AcquireParams params,
                            const Request& req, WaiterSlot slot) {
  Session& s = *self;
  Shared& sh = *s.shared;
  s.record.limiter = limiter.name();
  if (!co_await send_sse_header(s, req)) co_return false;
  sh.metrics.sse_streams.fetch_add(1, std::memory_order_relaxed);

  const auto strand = s.stream.get_executor();
  auto st = std::make_shared<SseAcquire>(strand, [&s] { s.close(); });
  // The ticket is the limiter's id for the request (what GET /v1/limiters/{name}
  // lists, and the permit id once granted): known from the first queued event.
  AcquireOptions options;
  options.max_wait = params.max_wait;
  options.tenant = params.tenant;
  options.weight = params.weight;
  const std::string name = limiter.name();
  Waiter::Handlers handlers;
  handlers.queued = [st](const QueueStatus& q) {
    st->ticket = q.ticket;
    st->stream.push(queued_event(q));
  };
  handlers.done = [st, &s, name, keepalive = sh.config.server.keepalive_interval](AcquireResult r) {
    const bool granted = r.granted();
    sse_completed(*st, *s.shared, name, std::move(r), keepalive);
    // A holder hears of a shutdown (Shared::say_farewell). (No handler runs once
    // this coroutine has ended: it cancels the waiter first.)
    if (granted) s.farewell = std::shared_ptr<fairgate::http::SseStream>(st, &st->stream);
  };
  auto waiter = Waiter::start(limiter, std::move(options), strand, std::move(slot), std::move(handlers));

  bool dropped = false;  // an event stream ends with the connection anyway
  co_await (st->stream.run([&s](const std::string& bytes) { return send_raw(s, bytes); }) ||
            watch_disconnect(s, dropped));

  // Still waiting: leave the queue (a grant that races this is released when it arrives).
  waiter->cancel();
  if (st->permit.held()) {
    if (auto* h = sh.metrics.hold_histogram(name))
      h->observe(std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - st->granted_at));
  }
  st->permit.release();
  sh.metrics.sse_streams.fetch_sub(1, std::memory_order_relaxed);
  s.record.outcome = st->outcome.empty() ? std::string_view("client_gone") : st->outcome;
  if (st->waited_ms >= 0) s.record.wait_ms = st->waited_ms;
  co_return false;  // an event stream ends with the connection
}

// --- JSON (long-poll) acquire -------------------------------------------------

awaitable<bool> acquire_json(std::shared_ptr<Session> self, Limiter limiter, AcquireParams params,
                             const Request& req, WaiterSlot slot) {
  Session& s = *self;
  Shared& sh = *s.shared;
  AcquireOptions options;
  options.max_wait = params.max_wait;
  options.tenant = params.tenant;
  options.weight = params.weight;
  s.record.limiter = limiter.name();
  bool dropped = false;
  auto outcome = co_await (limiter.async_acquire(options, use_awaitable) || watch_disconnect(s, dropped));
  slot.reset();
  if (outcome.index() != 0) {  // the client left; the acquire was cancelled
    s.record.outcome = "client_gone";
    co_return false;
  }
  AcquireResult result = std::move(std::get<0>(outcome));
  const bool keep = req.keep_alive() && !dropped;
  s.record.outcome = result.granted() ? std::string_view("granted") : wire_reason(result.reason());
  s.record.wait_ms = result.waited().count();

  if (result.granted()) {
    Permit permit = result.take_permit();
    const auto waited = permit.waited();
    record_grant(sh, limiter.name(), waited);
    const auto lease = params.lease.value_or(sh.config.server.lease);
    const std::string id = permit.id();  // as GET /v1/limiters/{name} lists its holder
    const std::string token = sh.leases.add(std::move(permit), limiter.name(), lease);
    json::object body;
    body["permit"] = token;
    body["ticket"] = id;
    body["waited_ms"] = waited.count();
    body["lease_ms"] = lease.count();
    body["limiter"] = limiter.name();
    Response res = json_response(http::status::ok, req, body);
    res.keep_alive(keep);
    if (!co_await send(s, std::move(res))) {
      sh.leases.release(token);  // nobody will ever learn the token
      co_return false;
    }
    co_return keep;
  }
  Response res =
      error_response(status_of(result.reason()), req, wire_reason(result.reason()), result.message());
  if (result.reason() != RejectReason::invalid_argument)
    res.set(http::field::retry_after, retry_after_seconds(limiter, params.max_wait));
  res.keep_alive(keep);
  co_return co_await send(s, std::move(res)) && keep;
}

// --- routes -----------------------------------------------------------------

bool wants_event_stream(const Request& req) {
  const auto accept = req[http::field::accept];
  return accepts_event_stream(std::string_view(accept.data(), accept.size()));
}

awaitable<bool> route_acquire(std::shared_ptr<Session> self, const Request& req, const std::string& name,
                              const Target& target) {
  Shared& sh = *self->shared;
  if (auto e = validate_limiter_name(name))
    co_return co_await send_error(*self, req, http::status::bad_request, "bad_request",
                                  "limiter name: " + e->problem);
  auto limiter = sh.backend->find(name);
  if (!limiter)
    co_return co_await send_error(*self, req, http::status::not_found, "unknown_limiter",
                                  fmt::format("no limiter named \"{}\"", name));
  // GET is the acquire an EventSource can open: always an event stream,
  // parameters in the query string only.
  const bool get = req.method() == http::verb::get;
  if (get && !req.body().empty())
    co_return co_await send_error(*self, req, http::status::bad_request, "bad_request",
                                  "a GET acquire takes its parameters in the query string, not a body");
  BadRequest bad;
  auto params = parse_acquire_params(target, req.body(), sh.config.server.max_lease, bad);
  if (!params)
    co_return co_await send_error(*self, req, http::status::bad_request, "bad_request", bad.message);
  const bool stream = get || wants_event_stream(req);
  if (stream && params->lease)
    co_return co_await send_error(
        *self, req, http::status::bad_request, "bad_request",
        get ? "lease_ms: a GET acquire is an event stream (the permit is held while it is "
              "open); ask for a leased JSON permit with POST"
            : "lease_ms: an acquire with Accept: text/event-stream is an event stream (the permit is "
              "held while it is open); ask for a leased JSON permit without it");
  if (sh.stopping.load()) {
    co_return co_await send_error(*self, req, http::status::service_unavailable, "unavailable",
                                  "the server is shutting down");
  }
  WaiterSlot slot = WaiterSlot::take(self->shared, self->client);
  if (!slot.held()) {
    sh.metrics.client_cap_refusals.fetch_add(1, std::memory_order_relaxed);
    Response res = error_response(
        http::status::too_many_requests, req, "too_many_waiters",
        fmt::format("this client already has {} waiting requests", sh.config.server.max_waiters_per_client));
    res.set(http::field::retry_after, "1");
    sh.metrics.http_bad_requests.fetch_add(1, std::memory_order_relaxed);
    co_return co_await send(*self, std::move(res)) && req.keep_alive();
  }
  if (stream)
    co_return co_await acquire_sse(self, std::move(*limiter), std::move(*params), req, std::move(slot));
  co_return co_await acquire_json(self, std::move(*limiter), std::move(*params), req, std::move(slot));
}

json::value limiters_json(const Backend& backend) {
  json::array list;
  for (const auto& l : backend.limiters()) list.push_back(limiter_json(l.snapshot(), backend.kind(), false));
  json::object o;
  o["limiters"] = std::move(list);
  return o;
}

/// Bytes of snapshots a /v1/events client may fall behind by before it is
/// dropped (a snapshot of a busy limiter is some KiB; ticks are a second apart).
constexpr std::size_t kEventsQueueBytes = 4 * 1024 * 1024;

awaitable<bool> route_events(std::shared_ptr<Session> self, const Request& req) {
  Session& s = *self;
  if (!co_await send_sse_header(s, req)) co_return false;
  // Every subscriber gets the hub's one snapshot per tick (serve/event_hub.hpp).
  auto stream = std::make_shared<fairgate::http::SseStream>(s.stream.get_executor(), kEventsQueueBytes,
                                                            [&s] { s.close(); });
  s.shared->events->subscribe(s.stream.get_executor(), stream);
  s.farewell = stream;
  bool dropped = false;  // an event stream ends with the connection anyway
  co_await (stream->run([&s](const std::string& bytes) { return send_raw(s, bytes); }) ||
            watch_disconnect(s, dropped));
  co_return false;
}

awaitable<bool> route_put_limiter(std::shared_ptr<Session> self, const Request& req,
                                  const std::string& name) {
  Shared& sh = *self->shared;
  if (!bearer_matches(req[http::field::authorization], sh.config.admin_token)) {
    Response res = error_response(http::status::unauthorized, req, "unauthorized",
                                  sh.config.admin_token.empty()
                                      ? "admin routes are off: start the server with --admin-token"
                                      : "a valid 'Authorization: Bearer TOKEN' header is required");
    res.set(http::field::www_authenticate, "Bearer");
    sh.metrics.http_bad_requests.fetch_add(1, std::memory_order_relaxed);
    co_return co_await send(*self, std::move(res)) && req.keep_alive();
  }
  auto limiter = sh.backend->find(name);
  if (!limiter)
    co_return co_await send_error(*self, req, http::status::not_found, "unknown_limiter",
                                  fmt::format("no limiter named \"{}\"", name));
  BadRequest bad;
  auto update = parse_settings_update(req.body(), bad);
  if (!update)
    co_return co_await send_error(*self, req, http::status::bad_request, "bad_request", bad.message);
  // 200 only once the change is in force cluster-wide (on Redis: Redis
  // confirmed it); 503 with the reason when it could not be applied.
  const SettingsUpdate change = *update;
  ConfigureResult applied = co_await limiter->async_configure(change, use_awaitable);
  if (applied.error == make_error_code(Errc::invalid_settings)) {
    co_return co_await send_error(*self, req, http::status::bad_request, "bad_request", applied.message);
  }
  if (applied.error) {
    Response res = error_response(http::status::service_unavailable, req, "unavailable", applied.message);
    res.set(http::field::retry_after, "1");
    co_return co_await send(*self, std::move(res)) && req.keep_alive();
  }
  Snapshot snap = limiter->snapshot();
  snap.settings = applied.settings;
  Response res = json_response(http::status::ok, req, limiter_json(snap, sh.backend->kind(), false));
  co_return co_await send(*self, std::move(res)) && req.keep_alive();
}

// --- rate limits (docs/ratelimit.md, "In fairgate serve") -----------------------

awaitable<bool> send_unauthorized(Session& s, const Request& req) {
  Shared& sh = *s.shared;
  Response res = error_response(http::status::unauthorized, req, "unauthorized",
                                sh.config.admin_token.empty()
                                    ? "admin routes are off: start the server with --admin-token"
                                    : "a valid 'Authorization: Bearer TOKEN' header is required");
  res.set(http::field::www_authenticate, "Bearer");
  sh.metrics.http_bad_requests.fetch_add(1, std::memory_order_relaxed);
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

awaitable<bool> send_unknown_rule(Session& s, const Request& req, const std::string& name) {
  co_return co_await send_error(s, req, http::status::not_found, "unknown_rule",
                                fmt::format("no rate-limit rule named \"{}\"", name.substr(0, 64)));
}

json::value rate_rules_json(const RateLimiter& rates) {
  json::array list;
  for (const auto& r : rates.rules()) list.push_back(rate_rule_json(r.name, r.rule, &r.stats));
  json::object o;
  o["rules"] = std::move(list);
  o["degraded"] = rates.degraded();
  return o;
}

awaitable<bool> route_rate_check(std::shared_ptr<Session> self, const Request& req, const std::string& name) {
  Session& s = *self;
  Shared& sh = *s.shared;
  const auto rule = sh.rates.rule(name);
  if (!rule) co_return co_await send_unknown_rule(s, req, name);
  BadRequest bad;
  const auto params = parse_rate_check(req.body(), bad);
  if (!params) co_return co_await send_error(s, req, http::status::bad_request, "bad_request", bad.message);
  std::vector<RateRequest> requests{RateRequest{name, params->key, params->cost}};
  RateResult r = co_await rate_check(sh.rates, requests);
  if (r.error == make_error_code(Errc::unknown_rule)) co_return co_await send_unknown_rule(s, req, name);
  if (r.error == make_error_code(RejectReason::invalid_argument))
    co_return co_await send_error(s, req, http::status::bad_request, "bad_request", r.message);
  if (r.error || r.decisions.empty()) {
    const std::string why = r.message.empty() ? std::string("the rate limiter is shutting down") : r.message;
    co_return co_await send_error(s, req, http::status::service_unavailable, "unavailable", why);
  }
  const RateDecision& d = r.decisions.front();
  const auto status = r.allowed  ? http::status::ok
                      : r.reason ? http::status::service_unavailable
                                 : http::status::too_many_requests;
  Response res = json_response(status, req, rate_decision_json(r, d));
  set_rate_headers(res.base(), d, *rule);
  if (r.reason) res.set(http::field::retry_after, "1");
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

awaitable<bool> route_rate_refund(std::shared_ptr<Session> self, const Request& req,
                                  const std::string& name) {
  Session& s = *self;
  Shared& sh = *s.shared;
  const auto rule = sh.rates.rule(name);
  if (!rule) co_return co_await send_unknown_rule(s, req, name);
  BadRequest bad;
  const auto params = parse_rate_refund(req.body(), bad);
  if (!params) co_return co_await send_error(s, req, http::status::bad_request, "bad_request", bad.message);
  RateDecision d;
  d.rule = name;
  d.key = params->key;
  d.cost = params->cost;
  d.allowed = true;
  d.taken = true;  // a decision token is handed out only for a decision that took its cost
  d.at_ms = params->at_ms;
  d.at_us = params->at_us;
  RefundResult r = co_await rate_refund(sh.rates, d, params->amount);
  if (r.error == make_error_code(Errc::unknown_rule)) co_return co_await send_unknown_rule(s, req, name);
  if (r.error == make_error_code(RejectReason::invalid_argument))
    co_return co_await send_error(s, req, http::status::bad_request, "bad_request", r.message);
  if (r.error) {
    Response res = error_response(http::status::service_unavailable, req, "unavailable", r.message);
    res.set(http::field::retry_after, "1");
    co_return co_await send(s, std::move(res)) && req.keep_alive();
  }
  json::object o;
  o["rule"] = name;
  o["key"] = params->key;
  o["refunded"] = r.refunded;
  if (r.refunded < params->amount)
    o["note"] =
        "less came back than asked: too late (the decision's window or period has passed), or the algorithm "
        "gives back no more than it can hold (a full token bucket, a GCRA already at now, a key with no "
        "state "
        "left); docs/ratelimit.md, Refunds";
  Response res = json_response(http::status::ok, req, o);
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

awaitable<bool> route_put_rate_rule(std::shared_ptr<Session> self, const Request& req,
                                    const std::string& name) {
  Session& s = *self;
  Shared& sh = *s.shared;
  if (!bearer_matches(req[http::field::authorization], sh.config.admin_token))
    co_return co_await send_unauthorized(s, req);
  const auto current = sh.rates.rule(name);
  if (!current) co_return co_await send_unknown_rule(s, req, name);
  BadRequest bad;
  const auto rule = parse_rate_rule_update(req.body(), *current, bad);
  if (!rule) co_return co_await send_error(s, req, http::status::bad_request, "bad_request", bad.message);
  if (auto e = validate(*rule))
    co_return co_await send_error(s, req, http::status::bad_request, "bad_request", e->message());
  if (const auto cfg = sh.rate_configs.find(name); cfg != sh.rate_configs.end() &&
                                                   cfg->second.cost_mode == RateCostMode::fixed &&
                                                   cfg->second.cost > rule->capacity()) {
    const std::string why = fmt::format("the gateway cost {} of this rule exceeds the new capacity {}",
                                        cfg->second.cost, rule->capacity());
    co_return co_await send_error(s, req, http::status::bad_request, "bad_request", why);
  }
  const RateRule wanted = *rule;
  RuleUpdateResult applied = co_await rate_publish(sh.rates, name, wanted);
  if (applied.error == make_error_code(Errc::unknown_rule))
    co_return co_await send_unknown_rule(s, req, name);
  if (applied.error == make_error_code(Errc::invalid_settings))
    co_return co_await send_error(s, req, http::status::bad_request, "bad_request", applied.message);
  if (applied.error) {
    Response res = error_response(http::status::service_unavailable, req, "unavailable", applied.message);
    res.set(http::field::retry_after, "1");
    co_return co_await send(s, std::move(res)) && req.keep_alive();
  }
  Response res = json_response(http::status::ok, req, rate_rule_json(name, *rule, nullptr));
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

awaitable<bool> method_not_allowed(Session& s, const Request& req, std::string_view allow) {
  s.shared->metrics.http_bad_requests.fetch_add(1, std::memory_order_relaxed);
  Response res =
      error_response(http::status::method_not_allowed, req, "method_not_allowed",
                     fmt::format("{} is not allowed here (allowed: {})", req.method_string(), allow));
  res.set(http::field::allow, allow);
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

/// OPTIONS from a listed origin: the CORS preflight of a request with
/// non-simple headers or methods (Authorization, PUT, DELETE, JSON bodies).
awaitable<bool> preflight(Session& s, const Request& req, const RouteSpec& route) {
  Response res{http::status::no_content, req.version()};
  res.set(http::field::server, kServerName);
  res.set(http::field::access_control_allow_methods, route.methods);
  res.set(http::field::access_control_allow_headers, "Content-Type, Authorization");
  res.set(http::field::access_control_max_age, "600");
  res.keep_alive(req.keep_alive());
  co_return co_await send(s, std::move(res)) && req.keep_alive();  // send() adds the origin headers
}

awaitable<bool> send_openapi(Session& s, const Request& req, std::string_view text, std::string_view type) {
  Response res = make_response(http::status::ok, req, std::string(text), type);
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

awaitable<bool> route_healthz(Session& s, const Request& req) {
  Shared& sh = *s.shared;
  json::object o;
  const BackendHealth health = sh.backend->health();
  const bool redis_down = health.remote && (!health.connected || health.degraded_limiters > 0);
  // 503 only when this instance can admit nothing: shutting down, or every
  // limiter degraded with on_redis_down = closed (docs/serve.md).
  bool can_admit = true;
  if (health.degraded_limiters > 0) {
    can_admit = false;
    for (const auto& l : sh.backend->limiters()) {
      const Snapshot snap = l.snapshot();
      if (!snap.engine.degraded || snap.settings.on_redis_down != RedisDownPolicy::closed) can_admit = true;
    }
  }
  const bool stopping = sh.stopping.load();
  o["status"] = stopping ? "stopping" : redis_down ? "degraded" : "ok";
  o["redis"] = !health.remote ? "none" : redis_down ? "down" : "up";
  o["backend"] = sh.backend->kind();
  if (health.remote) o["degraded_limiters"] = health.degraded_limiters;
  // The rate limiter's own Redis connection (docs/ratelimit.md): degraded
  // while its last call failed; the rules then follow on_redis_down.
  if (!sh.rates.rules().empty()) {
    const bool rl_down = sh.rates.degraded();
    o["ratelimit"] = rl_down ? "degraded" : "ok";
    if (rl_down && !stopping) o["status"] = "degraded";
  }
  Response res =
      json_response(stopping || !can_admit ? http::status::service_unavailable : http::status::ok, req, o);
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

awaitable<bool> route_metrics(Session& s, const Request& req) {
  Shared& sh = *s.shared;
  std::string page = render_metrics(*sh.backend, sh.metrics, sh.leases.size());
  if (sh.gateway) sh.gateway->render_metrics(page);
  render_rate_metrics(sh.rates, page);
  Response res =
      make_response(http::status::ok, req, std::move(page), "text/plain; version=0.0.4; charset=utf-8");
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

awaitable<bool> route_dashboard(Session& s, const Request& req) {
  // Same-origin only: the page reads this server's API with relative URLs; it may not be framed.
  Response res =
      make_response(http::status::ok, req, std::string(dashboard::kHtml), "text/html; charset=utf-8");
  res.set(http::field::cache_control, "no-store");
  res.set("Content-Security-Policy",
          "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; frame-ancestors "
          "'none'");
  res.set("X-Content-Type-Options", "nosniff");
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

awaitable<bool> route_limiters(Session& s, const Request& req) {
  Response res = json_response(http::status::ok, req, limiters_json(*s.shared->backend));
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

awaitable<bool> route_limiter_status(Session& s, const Request& req, const std::string& name,
                                     const Target& target) {
  Shared& sh = *s.shared;
  auto limiter = sh.backend->find(name);
  if (!limiter)
    co_return co_await send_error(s, req, http::status::not_found, "unknown_limiter",
                                  fmt::format("no limiter named \"{}\"", name));
  BadRequest bad;
  const auto query = parse_status_query(target, bad);
  if (!query) co_return co_await send_error(s, req, http::status::bad_request, "bad_request", bad.message);
  // Every instance's holders and queue (on Redis: one script call); 503
  // with the reason when Redis cannot answer.
  const StatusQuery page = *query;
  const StatusResult status = co_await limiter->async_status(page, use_awaitable);
  if (status.error) {
    Response res = error_response(http::status::service_unavailable, req, "unavailable", status.message);
    res.set(http::field::retry_after, "1");
    co_return co_await send(s, std::move(res)) && req.keep_alive();
  }
  Response res = json_response(http::status::ok, req, limiter_status_json(status, sh.backend->kind()));
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

awaitable<bool> route_limiter(std::shared_ptr<Session> self, const Request& req, const std::string& name,
                              const Target& target) {
  if (req.method() == http::verb::put) co_return co_await route_put_limiter(self, req, name);
  co_return co_await route_limiter_status(*self, req, name, target);
}

awaitable<bool> route_release_permit(Session& s, const Request& req, const std::string& id) {
  if (!s.shared->leases.release(id))
    co_return co_await send_error(s, req, http::status::not_found, "unknown_permit",
                                  "no such permit (released, expired or never granted here)");
  Response res{http::status::no_content, req.version()};
  res.set(http::field::server, kServerName);
  res.keep_alive(req.keep_alive());
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

awaitable<bool> route_renew(Session& s, const Request& req, const std::string& id, const Target& target) {
  BadRequest bad;
  const auto params = parse_renew_params(target, req.body(), s.shared->config.server.max_lease, bad);
  if (!params) co_return co_await send_error(s, req, http::status::bad_request, "bad_request", bad.message);
  const auto lease = s.shared->leases.renew(id, params->lease);
  if (!lease)
    co_return co_await send_error(s, req, http::status::not_found, "unknown_permit",
                                  "no such permit (released, expired or never granted here)");
  json::object o;
  o["lease_ms"] = lease->count();
  Response res = json_response(http::status::ok, req, o);
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

awaitable<bool> route_rate_rules(Session& s, const Request& req) {
  Response res = json_response(http::status::ok, req, rate_rules_json(s.shared->rates));
  co_return co_await send(s, std::move(res)) && req.keep_alive();
}

awaitable<bool> route_rate_rule(std::shared_ptr<Session> self, const Request& req, const std::string& name) {
  Session& s = *self;
  const auto method = req.method();
  if (method == http::verb::post) co_return co_await route_rate_check(self, req, name);
  if (method == http::verb::put) co_return co_await route_put_rate_rule(self, req, name);
  for (const auto& r : s.shared->rates.rules()) {
    if (r.name != name) continue;
    Response res = json_response(http::status::ok, req, rate_rule_json(r.name, r.rule, &r.stats));
    co_return co_await send(s, std::move(res)) && req.keep_alive();
  }
  co_return co_await send_unknown_rule(s, req, name);
}

/// No API route: a gateway route (docs/gateway.md) when one matches, else 404.
awaitable<bool> route_gateway_or_not_found(std::shared_ptr<Session> self, const Request& req) {
  Session& s = *self;
  Shared& sh = *s.shared;
  if (sh.gateway) {
    if (auto* gw =
            sh.gateway->match(target_path(std::string_view(req.target().data(), req.target().size())))) {
      // Marked for the drain (docs/serve.md, "Shutdown"): it lets this request finish.
      s.in_gateway = true;
      s.head_only = false;  // the upstream answers a HEAD as it does
      struct Unmark {
        Session& s;
        ~Unmark() { s.in_gateway = false; }
      } unmark{s};
      co_return co_await proxy(self, req, *gw);
    }
  }
  co_return co_await send_error(
      s, req, http::status::not_found, "not_found",
      fmt::format("no route {} {}", req.method_string(),
                  std::string_view(req.target().data(), std::min<std::size_t>(req.target().size(), 128))));
}

/// Browser access (docs/serve.md, "Browsers and CORS"): a listed Origin gets
/// the CORS headers on every answer (send() adds them); any other Origin may
/// not take a permit, and its preflights fail.
struct OriginCheck {
  OriginVerdict verdict = OriginVerdict::none;
  std::string refusal;  ///< the 403 message when verdict is refused
  bool refused() const { return verdict == OriginVerdict::refused; }
};

OriginCheck check_origin(Session& s, const Request& req) {
  const auto origin = req[http::field::origin];
  OriginCheck check;
  check.verdict =
      judge_origin(std::string_view(origin.data(), origin.size()), s.shared->config.server.cors_origins);
  if (check.verdict == OriginVerdict::allowed) s.cors_origin = std::string(origin.data(), origin.size());
  if (check.refused())
    check.refusal =
        fmt::format("web pages from {} may not use this server (it is not in server.cors_origins)",
                    std::string_view(origin.data(), std::min<std::size_t>(origin.size(), 100)));
  return check;
}

/// Serves `req` on its `route`, its method allowed there.
awaitable<bool> dispatch(std::shared_ptr<Session> self, const Request& req, const RouteSpec& route,
                         const std::vector<std::string>& params, const Target& target,
                         const OriginCheck& origin) {
  Session& s = *self;
  switch (route.id) {
    case RouteId::healthz: co_return co_await route_healthz(s, req);
    case RouteId::metrics: co_return co_await route_metrics(s, req);
    case RouteId::openapi_yaml: co_return co_await send_openapi(s, req, openapi::kYaml, "application/yaml");
    case RouteId::openapi_json: co_return co_await send_openapi(s, req, openapi::kJson, "application/json");
    case RouteId::dashboard: co_return co_await route_dashboard(s, req);
    case RouteId::limiters: co_return co_await route_limiters(s, req);
    case RouteId::limiter: co_return co_await route_limiter(self, req, params[0], target);
    case RouteId::acquire:
      // A foreign page must not make its visitors wait in, or hold, the queue.
      if (origin.refused())
        co_return co_await send_error(s, req, http::status::forbidden, "origin_not_allowed", origin.refusal);
      co_return co_await route_acquire(self, req, params[0], target);
    case RouteId::permit: co_return co_await route_release_permit(s, req, params[0]);
    case RouteId::renew: co_return co_await route_renew(s, req, params[0], target);
    case RouteId::events: co_return co_await route_events(self, req);
    case RouteId::ratelimits: co_return co_await route_rate_rules(s, req);
    case RouteId::ratelimit_rule: co_return co_await route_rate_rule(self, req, params[0]);
    case RouteId::ratelimit_refund: co_return co_await route_rate_refund(self, req, params[0]);
  }
  co_return false;  // unreachable: every RouteId is handled above
}

/// Serves one request; returns whether the connection may carry another.
awaitable<bool> handle(std::shared_ptr<Session> self, const Request& req) {
  Session& s = *self;
  s.cors_origin.clear();
  // A HEAD is answered without a body, whatever the answer (RFC 9110, 9.3.2).
  s.head_only = req.method() == http::verb::head;
  struct Unmark {
    Session& s;
    ~Unmark() { s.head_only = false; }
  } unmark{s};
  BadRequest bad;
  const auto target = parse_target(std::string_view(req.target().data(), req.target().size()), bad);
  if (!target) co_return co_await send_error(s, req, http::status::bad_request, "bad_request", bad.message);
  const auto method = req.method();
  const std::string_view method_name(req.method_string().data(), req.method_string().size());

  std::vector<std::string> params;
  const RouteSpec* route = match_route(target->segments, params);
  if (route == nullptr) co_return co_await route_gateway_or_not_found(self, req);

  const OriginCheck origin = check_origin(s, req);
  if (method == http::verb::options && origin.verdict != OriginVerdict::none) {
    if (origin.refused())
      co_return co_await send_error(s, req, http::status::forbidden, "origin_not_allowed", origin.refusal);
    co_return co_await preflight(s, req, *route);
  }
  // HEAD (RFC 9110, 9.3.2): the GET of a route that reads, its header and no
  // body; an event stream's header alone. Not on the acquire: its GET takes a permit.
  if (method == http::verb::head && answers_head(*route)) {
    Request get = req;
    get.method(http::verb::get);
    if (route->id == RouteId::events) {
      co_await send_sse_header(s, get);
      co_return false;  // an event stream's header: its body would run until the connection closes
    }
    co_return co_await dispatch(self, get, *route, params, *target, origin);
  }
  if (!route_allows(*route, method_name)) {
    // Allow lists HEAD where it is answered (above; RFC 9110, 10.2.1). A named string: with g++
    // 12, a std::string made by a ?: among a co_await's arguments was freed twice.
    std::string allow(route->methods);
    if (answers_head(*route)) allow += ", HEAD";
    co_return co_await method_not_allowed(s, req, allow);
  }
  co_return co_await dispatch(self, req, *route, params, *target, origin);
}

// --- connections ------------------------------------------------------------

/// The body limit of a request from its header: a gateway route takes bigger
/// bodies (prompts with documents) than the admission API.
std::size_t body_limit_of(const Shared& sh, const Request& header) {
  if (sh.gateway) {
    const auto& target = header.target();
    if (const auto* route = sh.gateway->match(target_path(std::string_view(target.data(), target.size()))))
      return route->config.max_body_bytes;
  }
  return sh.config.server.max_body_bytes;
}

/// After a request: counts its response by code and writes its access log line.
void finish_request(Session& s, beast::string_view method, beast::string_view target,
                    std::chrono::steady_clock::time_point started) {
  Shared& sh = *s.shared;
  if (s.record.status != 0) sh.metrics.count_response(s.record.status);
  if (sh.log->access_enabled()) {
    const std::string_view path = target_path(std::string_view(target.data(), target.size()));
    AccessEntry e;
    e.method = method.empty() ? std::string_view("-") : std::string_view(method.data(), method.size());
    e.path = path.substr(0, 256);
    // A permit's token is a secret (it releases the permit): only its first characters are shown.
    std::string shown;
    constexpr std::string_view kPermits = "/v1/permits/";
    constexpr std::size_t kShown = 6;
    if (e.path.starts_with(kPermits)) {
      const auto end = std::min(e.path.find('/', kPermits.size()), e.path.size());
      if (end - kPermits.size() > kShown) {
        shown = std::string(e.path.substr(0, kPermits.size() + kShown)) + "\u2026" +
                std::string(e.path.substr(end));
        e.path = shown;
      }
    }
    e.status = s.record.status;
    e.duration_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    e.limiter = s.record.limiter;
    e.outcome = s.record.outcome;
    e.wait_ms = s.record.wait_ms;
    e.route = s.record.route;
    sh.log->access(e);
  }
  s.record = {};
}

/// Answers a request that could not be read (431, 413, 408, 400; nothing when
/// the client left). A gateway route answers in OpenAI's error shape, as for
/// every other error there — when its header was read (a header too large or
/// not parsed names no route).
awaitable<void> answer_read_error(Session& s, const fairgate::http::ReadResult& r,
                                  const fairgate::http::ReadLimits& limits) {
  using fairgate::http::ReadError;
  if (r.error == ReadError::closed) co_return;
  Request dummy;
  dummy.version(11);
  dummy.keep_alive(false);
  const auto status = static_cast<http::status>(fairgate::http::error_status(r.error));
  const std::string message = fairgate::http::error_message(r, limits);
  if (r.error == ReadError::timeout) s.shared->metrics.connections_timed_out.fetch_add(1);
  if (s.shared->gateway && !r.request.target().empty() &&
      s.shared->gateway->match(
          target_path(std::string_view(r.request.target().data(), r.request.target().size())))) {
    // Built before the co_await: g++ 12 destroys a conditional's temporary twice inside one.
    std::string text = message;
    if (r.error == ReadError::body_too_large) text += " (this route's max_body_bytes)";
    Response res = make_response(
        status, dummy, openai_error(text, "invalid_request_error", fairgate::http::error_reason(r.error)),
        "application/json");
    co_await send(s, std::move(res));
  } else if (r.error == ReadError::timeout) {
    co_await send(s, error_response(status, dummy, fairgate::http::error_reason(r.error), message));
  } else {
    co_await send_error(s, dummy, status, fairgate::http::error_reason(r.error), message);
  }
}

/// Reads requests off one connection and answers them, until either side ends it.
awaitable<void> serve_connection(std::shared_ptr<Session> self) {
  Session& s = *self;
  Shared& sh = *s.shared;
  const ServerLimits& server = sh.config.server;
  // Beast checks Content-Length while it parses the header, before the route
  // is known: the header goes through with the widest limit of any route.
  fairgate::http::ReadLimits limits{server.max_header_bytes, server.max_body_bytes, server.header_timeout};
  if (sh.gateway)
    for (const auto& r : sh.gateway->routes())
      limits.max_body_bytes = std::max(limits.max_body_bytes, r->config.max_body_bytes);
  const auto body_limit = [&sh](const Request& header) { return body_limit_of(sh, header); };
  // A deadline cancels the read (instead of the stream's timeout, which would
  // close the socket) so a slow client still gets its 408.
  const auto cancel = [&s] {
    boost::system::error_code ignored;
    s.stream.socket().cancel(ignored);
  };
  for (;;) {
    if (s.closing || sh.stopping.load()) co_return;
    // Idle between requests: a connection may sit here for idle_timeout.
    bool idle_timed_out = false;
    if (!co_await fairgate::http::wait_for_request(s.stream, s.buffer, server.idle_timeout, cancel,
                                                   idle_timed_out)) {
      if (idle_timed_out) sh.metrics.connections_timed_out.fetch_add(1);
      co_return;
    }
    const auto started = std::chrono::steady_clock::now();
    // The request has started: all of it must arrive within header_timeout (slowloris).
    fairgate::http::ReadResult read =
        co_await fairgate::http::read_request(s.stream, s.buffer, limits, body_limit, cancel);
    if (read.error != fairgate::http::ReadError::none) {
      co_await answer_read_error(s, read, limits);
      if (s.record.status != 0)
        finish_request(s, read.request.method_string(), read.request.target(), started);
      co_return;
    }
    sh.metrics.http_requests.fetch_add(1, std::memory_order_relaxed);
    const Request req = std::move(read.request);
    // Most connections then wait (SSE, long poll) with nothing buffered: give
    // the read buffer back, it is much of a waiting connection's memory.
    if (s.buffer.size() == 0) s.buffer.shrink_to_fit();
    const bool keep = co_await handle(self, req);
    finish_request(s, req.method_string(), req.target(), started);
    // Draining: every answer since it began said Connection: close (send, relay_plain).
    if (!keep || !req.keep_alive() || sh.stopping.load()) co_return;
  }
}

awaitable<void> run_session(std::shared_ptr<Session> self) {
  Shared& sh = *self->shared;
  co_await fairgate::http::run_connection(self->stream, serve_connection(self));
  sh.sessions.remove(self->id);
  sh.metrics.connections_open.fetch_sub(1, std::memory_order_relaxed);
}

awaitable<void> accept_loop(std::shared_ptr<Shared> sh) {
  fairgate::http::ListenerHooks hooks;
  hooks.stopping = [&sh = *sh] { return sh.stopping.load(); };
  hooks.full = [&sh = *sh] { return sh.metrics.connections_open.load() >= sh.config.server.max_connections; };
  hooks.refused = [&sh = *sh] {
    sh.metrics.connections_refused.fetch_add(1, std::memory_order_relaxed);
    sh.metrics.count_response(503);
  };
  hooks.busy =
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
      "Content-Length: 81\r\n\r\n"
      "{\"error\":{\"reason\":\"too_many_connections\",\"message\":\"connection limit reached\"}}\n";
  hooks.accepted = [sh](tcp::socket socket) {
    sh->metrics.connections_open.fetch_add(1, std::memory_order_relaxed);
    const auto& limits = sh->config.server;
    auto session = sh->sessions.add([&](std::uint64_t id) {
      return std::make_shared<Session>(std::move(socket), sh, id,
                                       limits.max_header_bytes + limits.max_body_bytes + 8192);
    });
    const auto executor = session->stream.get_executor();
    net::co_spawn(executor, run_session(std::move(session)), net::detached);
  };
  co_await fairgate::http::accept_loop(sh->acceptor, sh->io.get_executor(), std::move(hooks));
}

/// Releases JSON permits whose lease ran out.
awaitable<void> lease_sweeper(std::shared_ptr<Shared> sh) {
  net::steady_timer timer(co_await net::this_coro::executor);
  while (!sh->stopping.load()) {
    timer.expires_after(100ms);
    co_await timer.async_wait(nothrow);
    const auto n = sh->leases.expire(LeaseTable::Clock::now());
    sh->metrics.leases_expired.fetch_add(n, std::memory_order_relaxed);
  }
}

/// Redis: pulls the rules stored by PUT /v1/ratelimit/{rule} (on any
/// instance) at start and then every second, so a change reaches every
/// instance within about a second (docs/ratelimit.md, "In fairgate serve").
/// One line for a rate rule in force, as the start-up lines say it.
std::string describe_rate_rule(const RateRule& r) {
  return fmt::format("{} {} per {} ms, limit {}, on_redis_down={}{}", to_string(r.algorithm), r.rate,
                     r.period_ms, r.capacity(), to_string(r.on_redis_down),
                     r.mode == LimiterMode::shadow ? ", mode=shadow" : "");
}

/// Says which rules a sync took from Redis (stored there by a PUT, they win over the config
/// file), and warns when a fixed cost of the config can no longer pass the capacity in force.
void log_adopted_rules(Shared& sh, const std::vector<NamedRateRule>& before) {
  for (const auto& now : sh.rates.rules()) {
    const auto was =
        std::find_if(before.begin(), before.end(), [&](const auto& b) { return b.name == now.name; });
    if (was == before.end() || was->rule == now.rule) continue;
    sh.log->write(LogLevel::info,
                  fmt::format("fairgate serve: rate limit {}: {} — stored in Redis by a PUT, in "
                              "force cluster-wide (was {})",
                              now.name, describe_rate_rule(now.rule), describe_rate_rule(was->rule)));
    for (const auto& c : sh.config.rate_rules) {
      if (c.name == now.name && c.cost_mode == RateCostMode::fixed && c.cost > now.rule.capacity())
        sh.log->write(
            LogLevel::warn,
            fmt::format("fairgate serve: rate limit {}: the cost {} of the config exceeds the capacity {} "
                        "in force: no request on its routes can pass (change the rule with PUT "
                        "/v1/ratelimit/{}, or the cost)",
                        now.name, c.cost, now.rule.capacity(), now.name));
    }
  }
}

awaitable<void> rate_rule_sync(std::shared_ptr<Shared> sh) {
  net::steady_timer timer(co_await net::this_coro::executor);
  while (!sh->stopping.load()) {
    const auto before = sh->rates.rules();
    const RuleUpdateResult r = co_await rate_sync(sh->rates);
    if (!r.error && r.changed > 0) log_adopted_rules(*sh, before);
    timer.expires_after(1s);
    co_await timer.async_wait(nothrow);
  }
}

/// Stops accepting, releases the JSON permits, closes the admission API's
/// connections (after letting them say goodbye) and lets gateway requests in
/// flight finish, within the shutdown grace period; then closes what is left.
awaitable<void> drain(std::shared_ptr<Shared> sh) {
  sh->stopping.store(true);
  if (sh->events) sh->events->stop();
  net::post(sh->acceptor_strand, [sh] {
    boost::system::error_code ignored;
    sh->acceptor.close(ignored);
  });
  sh->leases.clear();
  json::object bye;
  bye["reason"] = "shutdown";
  bye["message"] = "the server is shutting down";
  sh->say_farewell(std::make_shared<const std::string>(sse_event("closing", bye)));
  net::steady_timer timer(co_await net::this_coro::executor);
  // Waiters that were just ended (reason shutdown), holders and watchers told
  // `closing` let their streams say so before the connections close.
  timer.expires_after(100ms);
  co_await timer.async_wait(nothrow);
  const auto deadline = std::chrono::steady_clock::now() + sh->config.server.shutdown_grace;
  while (sh->session_count() > 0) {
    const bool force = sh->force_stop.load() || std::chrono::steady_clock::now() >= deadline;
    sh->close_sessions(force);
    if (force) break;
    timer.expires_after(20ms);
    co_await timer.async_wait(nothrow);
  }
  // Forced: give the closes (and the releases of the permits they held) a moment to run.
  for (int i = 0; i < 10 && sh->session_count() > 0; ++i) {
    timer.expires_after(10ms);
    co_await timer.async_wait(nothrow);
  }
}

/// A second SIGTERM/SIGINT while draining: stop at once.
awaitable<void> force_on_second_signal(std::shared_ptr<Shared> sh, net::signal_set& signals) {
  auto [ec, sig] = co_await signals.async_wait(nothrow);
  if (ec) co_return;
  sh->force_stop.store(true);
  sh->log->write(LogLevel::warn, fmt::format("fairgate serve: second {}: closing every connection now",
                                             sig == SIGINT ? "SIGINT" : "SIGTERM"));
}

/// SIGTERM/SIGINT: end waiters, drain, let the last Redis commands go out, then stop the loop.
awaitable<void> shutdown_on_signal(std::shared_ptr<Shared> sh, net::signal_set& signals, int& which) {
  auto [ec, sig] = co_await signals.async_wait(nothrow);
  if (ec) co_return;
  which = sig;
  sh->log->write(LogLevel::info,
                 fmt::format("fairgate serve: {}: draining (gateway requests in flight may "
                             "finish within {} ms; a second signal stops at once)",
                             sig == SIGINT ? "SIGINT" : "SIGTERM", sh->config.server.shutdown_grace.count()));
  net::co_spawn(co_await net::this_coro::executor, force_on_second_signal(sh, signals), net::detached);
  sh->backend->shutdown();
  co_await drain(sh);
  // Releases and cancels are sent asynchronously: give them a moment on the wire.
  if (sh->config.redis) {
    net::steady_timer timer(co_await net::this_coro::executor);
    timer.expires_after(300ms);
    co_await timer.async_wait(nothrow);
  }
  sh->io.stop();
}

/// SIGHUP: ignored (the config is read once, at start), never fatal.
awaitable<void> ignore_hangups(std::shared_ptr<Shared> sh, net::signal_set& hangups) {
  for (;;) {
    auto [ec, sig] = co_await hangups.async_wait(nothrow);
    if (ec) co_return;
    sh->log->write(
        LogLevel::warn,
        "fairgate serve: SIGHUP ignored (the config file is read at start only; restart to change it)");
  }
}

/// Redis: once each limiter has heard from Redis (or after a few seconds),
/// one line per limiter with the settings in force and their source.
awaitable<void> report_effective_settings(std::shared_ptr<Shared> sh) {
  net::steady_timer timer(co_await net::this_coro::executor);
  const auto deadline = std::chrono::steady_clock::now() + 3s;
  for (;;) {
    bool all = true;
    for (const auto& l : sh->backend->limiters()) all = all && l.snapshot().engine.settings_source == "redis";
    if (all || std::chrono::steady_clock::now() >= deadline || sh->stopping.load()) break;
    timer.expires_after(20ms);
    co_await timer.async_wait(nothrow);
  }
  for (const auto& l : sh->backend->limiters()) {
    const Snapshot snap = l.snapshot();
    const bool confirmed = snap.engine.settings_source == "redis";
    const char* source = confirmed
                             ? "in force cluster-wide (stored in Redis, where they win over this config)"
                             : "this instance's own: not confirmed by Redis yet (unreachable?)";
    sh->log->write(confirmed ? LogLevel::info : LogLevel::warn,
                   fmt::format("fairgate serve: limiter {}: {} — {}", snap.name,
                               core::describe_settings(snap.settings), source));
  }
}

std::string describe_limiters(const ServeConfig& cfg) {
  std::string out;
  for (const auto& l : cfg.limiters) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{}={}", l.name, l.settings.max_concurrent);
  }
  return out.empty() ? std::string("none") : out;
}

}  // namespace

Server::Server(net::io_context& io, const ServeConfig& config, std::shared_ptr<Backend> backend,
               std::shared_ptr<const Log> logger) {
  std::vector<std::string> names;
  for (const auto& l : config.limiters) names.push_back(l.name);
  sh_ = std::make_shared<Shared>(config, io, names);
  if (logger) sh_->log = std::move(logger);
  // Leases live in Shared next to the metrics they feed (the table goes first).
  sh_->leases.set_on_release([metrics = &sh_->metrics](const std::string& limiter, milliseconds held) {
    if (auto* h = metrics->hold_histogram(limiter)) h->observe(held);
  });
  sh_->backend = std::move(backend);
  for (const auto& l : config.limiters) {
    auto opened = sh_->backend->open(l.name, l.settings);
    if (!opened)
      throw ConfigError(
          fmt::format("limiters.{}.{}: {}", l.name, opened.error().field, opened.error().problem));
  }
  // No rules: an in-process limiter (no Redis connection) keeps the routes answering.
  if (config.redis && !config.rate_rules.empty()) {
    RateLimiterRedisOptions ro;
    ro.url = config.redis->url;
    ro.key_prefix = config.redis->key_prefix;
    ro.command_timeout = config.redis->command_timeout;
    try {
      sh_->rates = RateLimiter::redis(io.get_executor(), ro);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(fmt::format("redis.{}", e.what()));
    }
  } else {
    sh_->rates = RateLimiter::memory(io.get_executor());
  }
  for (const auto& r : config.rate_rules) {
    auto set = sh_->rates.set_rule(r.name, r.rule);
    if (!set)
      throw ConfigError(fmt::format("ratelimit.{}.{}: {}", r.name, set.error().field, set.error().problem));
    sh_->rate_configs.emplace(r.name, r);
  }
  if (!config.routes.empty()) sh_->gateway = std::make_shared<Gateway>(config.routes);
  sh_->events = std::make_shared<EventHub>(io, config.server.events_interval, [backend = sh_->backend] {
    return sse_event("snapshot", limiters_json(*backend));
  });

  const auto address = net::ip::make_address(config.listen_host);
  const tcp::endpoint endpoint(address, config.listen_port);
  try {
    sh_->acceptor.open(endpoint.protocol());
    sh_->acceptor.set_option(net::socket_base::reuse_address(true));
    sh_->acceptor.bind(endpoint);
    sh_->acceptor.listen(net::socket_base::max_listen_connections);
  } catch (const boost::system::system_error& e) {
    throw std::runtime_error(fmt::format("cannot listen on {}:{}: {}", config.listen_host, config.listen_port,
                                         e.code().message()));
  }
  endpoint_ = sh_->acceptor.local_endpoint();
}

Server::~Server() = default;

void Server::start() {
  net::co_spawn(sh_->acceptor_strand, accept_loop(sh_), net::detached);
  net::co_spawn(sh_->io, lease_sweeper(sh_), net::detached);
  if (sh_->config.redis && !sh_->config.rate_rules.empty())
    net::co_spawn(sh_->io, rate_rule_sync(sh_), net::detached);
}

void Server::stop(std::function<void()> done) {
  net::co_spawn(sh_->io, drain(sh_), [done = std::move(done)](const std::exception_ptr&) {
    if (done) done();
  });
}

std::string Server::url() const {
  const auto a = endpoint_.address();
  std::string host = a.to_string();
  if (a.is_v6()) {  // appends, not "[" + host + "]": g++ 12 -O3 -Wrestrict false positive
    host.insert(0, 1, '[');
    host.push_back(']');
  }
  return fmt::format("http://{}:{}", host, endpoint_.port());
}

int run_server(const ServeConfig& config, std::FILE* out) {
  const auto logger = std::make_shared<const Log>(config.server.log, out);
  // The library's messages (Redis state changes, ...) go into the same log
  // while the server runs; the default sink (stderr) is back on every return.
  fairgate::set_log_sink(logger->library_sink());
  struct RestoreSink {
    ~RestoreSink() { fairgate::set_log_sink({}); }
  } restore_sink;
  net::io_context io(static_cast<int>(config.server.threads));
  std::shared_ptr<Backend> backend;
  std::string backend_text = "memory";
  if (config.redis) {
    backend = make_redis_backend(io.get_executor(), *config.redis);
    backend_text = "redis " + std::get<redis::Target>(redis::parse_target(config.redis->url)).redacted();
  } else {
    backend = make_memory_backend(io.get_executor());
  }
  Server server(io, config, backend, logger);
  auto sh = server.shared();

  net::signal_set signals(io, SIGINT, SIGTERM);
  int which = 0;
  net::co_spawn(io, shutdown_on_signal(sh, signals, which), net::detached);
  net::signal_set hangups(io, SIGHUP);
  net::co_spawn(io, ignore_hangups(sh, hangups), net::detached);
  server.start();

  std::string routes;
  for (const auto& r : config.routes)
    routes += r.limiter.empty() ? fmt::format(", route {} -> {} (no limiter)", r.path, r.upstream)
                                : fmt::format(", route {} -> {} via {}", r.path, r.upstream, r.limiter);
  logger->write(
      LogLevel::info,
      fmt::format("fairgate serve: listening on {} (backend {}{}, limiters {}{}, {} threads)", server.url(),
                  backend_text, config.redis ? ", instance " + config.redis->instance_id : std::string(),
                  describe_limiters(config), routes, config.server.threads));
  const LogConfig& lc = config.server.log;
  logger->write(LogLevel::info,
                fmt::format("fairgate serve: log level {}, format {}, access log {}", to_string(lc.level),
                            to_string(lc.format), lc.access_log ? "on" : "off"));
  for (const auto& r : config.rate_rules) {
    logger->write(LogLevel::info,
                  fmt::format("fairgate serve: rate limit {}: {}{}", r.name, describe_rate_rule(r.rule),
                              config.redis ? " (a rule stored in Redis by PUT wins: said below)" : ""));
  }
  if (config.redis) net::co_spawn(io, report_effective_settings(sh), net::detached);

  std::vector<std::thread> threads;
  for (unsigned i = 1; i < config.server.threads; ++i) threads.emplace_back([&io] { io.run(); });
  io.run();
  for (auto& t : threads) t.join();

  logger->write(LogLevel::info, fmt::format("fairgate serve: stopped ({})", which == SIGINT    ? "SIGINT"
                                                                            : which == SIGTERM ? "SIGTERM"
                                                                                               : "stop"));
  // The backend goes before the io_context (backend.hpp); connections that
  // outlived the grace period are destroyed with the io_context.
  backend->shutdown();
  sh->rates.shutdown();
  return 0;
}

}  // namespace fairgate::serve
