// gateway/proxy.cpp — one gateway request, as a sequence of steps: refused
// while the server stops, the route's limiter found, the tenant read, the
// route's rate limits checked, the permit waited for (admission; a route
// without a limiter skips it), then the upstream call and the relay.
//
// Why it is shaped this way:
//  * One coroutine per request, on the client's strand, in two phases, each
//    raced against the client's disconnect: wait for a permit, then call the
//    upstream and relay its answer. Losing the race cancels the other side:
//    a waiting request leaves the queue, an upstream call is aborted (its
//    socket is closed, not pooled). The permit is a local, so every exit
//    releases it.
//  * A streaming request that has to wait gets its 200 and SSE header early,
//    so it can see queue feedback; from then on failures are SSE error events
//    (what OpenAI's SDKs read from a stream). A request that never waited
//    gets the upstream's status and headers as they are.
#include "gateway/gateway.hpp"

#include "gateway/openai.hpp"
#include "gateway/rates.hpp"
#include "gateway/upstream.hpp"
#include "gateway/usage.hpp"
#include "gateway/wait.hpp"
#include "serve/views.hpp"

#include <fairgate/limiter.hpp>

#include <boost/asio/experimental/awaitable_operators.hpp>

#include <fmt/format.h>

#include <algorithm>

namespace fairgate::serve {

using net::awaitable;
using namespace net::experimental::awaitable_operators;
using Clock = std::chrono::steady_clock;

namespace {

/// A tenant key from a header, under the one tenant rule (fairgate::valid_tenant).
std::optional<std::string> tenant_of(const Request& req, const RouteConfig& rc, std::string& problem) {
  if (rc.tenant_header.empty()) return std::string();
  const auto it = req.find(rc.tenant_header);
  if (it == req.end()) return std::string();
  if (req.count(rc.tenant_header) > 1) {
    // Which line would count is a guess (a client's own, or its proxy's): none does.
    problem = fmt::format("header {} is given more than once: a request has one tenant", rc.tenant_header);
    return std::nullopt;
  }
  const std::string_view v(it->value().data(), it->value().size());
  if (v.empty()) return std::string();  // an empty header: no tenant, as without it
  if (!fairgate::valid_tenant(v)) {
    problem = fmt::format("header {}: a tenant must be {}", rc.tenant_header, fairgate::kTenantRule);
    return std::nullopt;
  }
  return std::string(v);
}

/// Every exit from the admission on gives back the unused part of a token budget.
struct RefundOnExit {
  Shared& sh;
  const RouteRates& rates;
  const UsageTap& tap;
  RouteStats& stats;
  ~RefundOnExit() { refund_token_budgets(sh, rates, tap, stats); }
};

/// The hold time: from the grant until the permit goes (declared after it, destroyed before it).
struct HoldTimer {
  Histogram* histogram;
  Clock::time_point since = Clock::now();
  ~HoldTimer() {
    if (histogram)
      histogram->observe(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since));
  }
};

/// What the admission of one request learned.
struct Admission {
  bool stream = false;                    ///< the body asks for a stream
  std::string ticket;                     ///< its id in the seeds' events
  std::chrono::milliseconds max_wait{0};  ///< the max wait it was given
  bool header_sent = false;               ///< our 200 and SSE header went out while it waited
  bool dropped = false;                   ///< the client sent more than watch_disconnect keeps
  Permit permit;                          ///< held once admitted
  const http::fields* headers = nullptr;  ///< the rate limits' headers, for our own 200 (or none)
};

/// Counts the client that left, and ends the request.
bool client_gone(Session& s, RouteStats& stats) {
  stats.client_gone.fetch_add(1, std::memory_order_relaxed);
  s.record.outcome = "client_gone";
  return false;
}

/// Answers a request that got no permit: 429/503/400 in OpenAI's shape or,
/// in an event stream (started while it waited, or on a `seed` route), an
/// error event or the seeds' rejection.
awaitable<bool> answer_rejection(Session& s, const Request& req, Gateway::Route& route, Limiter& limiter,
                                 const AcquireResult& result, const Admission& a) {
  const RouteConfig& rc = route.config;
  RouteStats& stats = route.stats;
  stats.rejected.fetch_add(1, std::memory_order_relaxed);
  const auto reason = static_cast<std::size_t>(result.reason());
  if (reason < stats.rejected_by_reason.size())
    stats.rejected_by_reason[reason].fetch_add(1, std::memory_order_relaxed);
  s.record.outcome = wire_reason(result.reason());
  const OpenAiReject r = openai_reject(result.reason());
  const std::string error = openai_error(rejection_message(result, a.max_wait), r.type, r.code);
  const QueueEvents mode = rc.queue_events;
  if (a.stream && (a.header_sent || mode == QueueEvents::seed)) {
    if (!a.header_sent && !co_await send_sse_header(s, req, a.headers)) co_return false;
    const std::string events =
        mode == QueueEvents::seed ? seed_rejection(a.ticket, req.body()) : stream_error(error);
    co_await send_raw(s, events);
    co_return false;
  }
  Response res = openai_response(r.status, req, error);
  if (result.reason() != RejectReason::invalid_argument)
    res.set(http::field::retry_after, retry_after_seconds(limiter, rc.max_wait));
  const bool keep = req.keep_alive() && !a.dropped;
  res.keep_alive(keep);
  co_return co_await send(s, std::move(res)) && keep;
}

/// Waits for a permit of `limiter` (with queue feedback on streams), raced
/// against the client's disconnect. nullopt: admitted (`a.permit` held);
/// else the request was answered (or the client left), and whether the
/// connection may carry another request.
awaitable<std::optional<bool>> admit(Session& s, const Request& req, Gateway::Route& route, Limiter& limiter,
                                     std::string& tenant, Admission& a) {
  Shared& sh = *s.shared;
  const RouteConfig& rc = route.config;
  WaiterSlot slot = WaiterSlot::take(s.shared, s.client);
  if (!slot.held()) {
    sh.metrics.client_cap_refusals.fetch_add(1, std::memory_order_relaxed);
    Response res = openai_error_response(
        http::status::too_many_requests, req,
        fmt::format("this client already has {} waiting requests", sh.config.server.max_waiters_per_client),
        "rate_limit_error", "too_many_waiters");
    res.set(http::field::retry_after, "1");
    co_return co_await send(s, std::move(res)) && req.keep_alive();
  }
  a.stream = wants_stream(req.body());
  a.ticket = fmt::format("t-{}", sh.next_ticket.fetch_add(1, std::memory_order_relaxed));
  a.max_wait = rc.max_wait.value_or(limiter.settings().max_wait);
  const auto strand = s.stream.get_executor();
  auto st = std::make_shared<Wait>(strand, [&s] { s.close(); });
  auto waiter = start_acquire(limiter, rc.max_wait, std::move(tenant),
                              a.stream ? rc.queue_events : QueueEvents::none, st, strand, std::move(slot));

  auto waited =
      co_await (wait_for_permit(s, *st, req, a.header_sent, a.headers) || watch_disconnect(s, a.dropped));
  if (waited.index() != 0 || !std::get<0>(waited) || !st->result) {
    // The client is gone: leave the queue (a grant racing this is released by the Waiter).
    waiter->cancel();
    st->result.reset();
    co_return client_gone(s, route.stats);
  }
  AcquireResult result = std::move(*st->result);
  st->result.reset();
  s.record.wait_ms = result.waited().count();
  if (!result.granted()) co_return co_await answer_rejection(s, req, route, limiter, result, a);

  a.permit = result.take_permit();
  route.stats.admitted.fetch_add(1, std::memory_order_relaxed);
  s.record.outcome = "granted";
  if (auto* h = sh.metrics.wait_histogram(rc.limiter)) h->observe(a.permit.waited());
  co_return std::nullopt;
}

/// Calls the upstream and relays its answer, raced against the client's disconnect.
awaitable<bool> relay(Session& s, const Request& req, Gateway::Route& route, Admission& a,
                      const RouteRates& rates, UsageTap& tap, CallState& cs) {
  if (a.header_sent) {
    // Queued streams learn when they got their seat (the model's first token comes later).
    const std::string admitted = admitted_event(route.config.queue_events, a.permit.waited());
    if (!co_await send_raw(s, admitted)) co_return client_gone(s, route.stats);
  }
  // The tap reads the usage a token budget refunds from (docs/ratelimit.md, "Token budgets").
  const bool reads_usage =
      std::any_of(rates.configs.begin(), rates.configs.end(),
                  [](const RateRuleConfig* r) { return r->cost_mode == RateCostMode::tokens; });
  auto relayed =
      co_await (call_upstream(s, req, route, a.header_sent, reads_usage ? &tap : nullptr,
                              rates.headers.begin() == rates.headers.end() ? nullptr : &rates.headers, cs) ||
                watch_disconnect(s, a.dropped));
  // The client left mid-call (the upstream call was cancelled, its connection
  // closed) or could not be written to: counted once, as client gone. One that
  // closed as soon as it had the whole answer did not leave early.
  if (cs.client_gone || (relayed.index() != 0 && !cs.delivered)) co_return client_gone(s, route.stats);
  if (relayed.index() != 0) co_return false;
  co_return std::get<0>(relayed) && !a.dropped;  // call_upstream already asks req.keep_alive()
}

}  // namespace

awaitable<bool> proxy(std::shared_ptr<Session> self, const Request& req, Gateway::Route& route) {
  Session& s = *self;
  Shared& sh = *s.shared;
  const RouteConfig& rc = route.config;
  route.stats.requests.fetch_add(1, std::memory_order_relaxed);
  CallState cs;
  cs.arrived = Clock::now();
  s.record.route = rc.path;
  s.record.limiter = rc.limiter;

  if (sh.stopping.load()) {
    Response res = openai_error_response(http::status::service_unavailable, req,
                                         "the gateway is shutting down", "server_error", "unavailable");
    res.set(http::field::retry_after, "1");
    co_return co_await send(s, std::move(res)) && req.keep_alive();
  }
  std::optional<Limiter> limiter;  // none: the route proxies at once, without a permit
  if (!rc.limiter.empty()) limiter = sh.backend->find(rc.limiter);
  if (!rc.limiter.empty() && !limiter) {
    Response res = openai_error_response(http::status::service_unavailable, req,
                                         fmt::format("limiter \"{}\" is not open", rc.limiter),
                                         "server_error", "unavailable");
    co_return co_await send(s, std::move(res)) && req.keep_alive();
  }
  std::string problem;
  auto tenant = tenant_of(req, rc, problem);
  if (!tenant) {
    sh.metrics.http_bad_requests.fetch_add(1, std::memory_order_relaxed);
    Response res = openai_error_response(http::status::bad_request, req, problem, "invalid_request_error",
                                         "invalid_tenant");
    co_return co_await send(s, std::move(res)) && req.keep_alive();
  }
  // Rate limits (docs/ratelimit.md, "Gateway rules"): all must allow, before the queue.
  RouteRates rates;
  if (!rc.ratelimit.empty()) {
    const std::optional<bool> answered = co_await check_rates(s, req, route, *tenant, rates);
    if (answered) co_return *answered;
  }
  UsageTap tap;
  const RefundOnExit refund_on_exit{sh, rates, tap, route.stats};
  Admission a;
  if (rates.headers.begin() != rates.headers.end()) a.headers = &rates.headers;
  if (limiter) {
    const std::optional<bool> answered = co_await admit(s, req, route, *limiter, *tenant, a);
    if (answered) co_return *answered;
  }
  const HoldTimer hold{limiter ? sh.metrics.hold_histogram(rc.limiter) : nullptr};
  co_return co_await relay(s, req, route, a, rates, tap, cs);
}

}  // namespace fairgate::serve
