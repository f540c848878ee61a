// gateway/gateway.cpp — the routes (Gateway: matching, /metrics) and the
// pure helpers of gateway/gateway.hpp.
#include "gateway/gateway.hpp"

#include "serve/views.hpp"
#include "tls/client.hpp"

#include <boost/json.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <stdexcept>
#include <variant>

namespace fairgate::serve {

namespace json = boost::json;

// --- Gateway -------------------------------------------------------------------

Gateway::Route::Route(RouteConfig c)
    : config(std::move(c)), pool(config.pool_size), tls_pool(config.pool_size) {
  if (!config.upstream_tls) return;
  auto made = fairgate::tls::make_context(upstream_tls_options(config), kUpstreamTlsWords);
  if (auto* problem = std::get_if<std::string>(&made))
    throw std::runtime_error(fmt::format("route {}: {}", config.path, *problem));
  tls = std::get<std::shared_ptr<boost::asio::ssl::context>>(std::move(made));
}

Gateway::Gateway(const std::vector<RouteConfig>& routes) {
  for (const auto& r : routes) routes_.push_back(std::make_unique<Route>(r));
}

Gateway::Route* Gateway::match(std::string_view path) {
  Route* best = nullptr;
  for (const auto& r : routes_) {
    const std::string& prefix = r->config.path;
    const bool hit = prefix == "/" || path == prefix ||
                     (path.size() > prefix.size() && path.substr(0, prefix.size()) == prefix &&
                      path[prefix.size()] == '/');
    if (hit && (best == nullptr || prefix.size() > best->config.path.size())) best = r.get();
  }
  return best;
}

void Gateway::render_metrics(std::string& out) const {
  using Counter = std::atomic<std::uint64_t> RouteStats::*;
  const auto series = [&](std::string_view name, std::string_view help, Counter counter) {
    out += fmt::format("# HELP {} {}\n# TYPE {} counter\n", name, help, name);
    for (const auto& r : routes_)
      out += fmt::format("{}{{route=\"{}\"}} {}\n", name, r->config.path,
                         (r->stats.*counter).load(std::memory_order_relaxed));
  };
  series("fairgate_gateway_requests_total", "Requests on a gateway route.", &RouteStats::requests);
  series("fairgate_gateway_admitted_total", "Requests that got a permit and went upstream.",
         &RouteStats::admitted);
  out +=
      "# HELP fairgate_gateway_rejected_total Requests that got no permit, by reason (timeout, queue_full, "
      "...).\n"
      "# TYPE fairgate_gateway_rejected_total counter\n";
  for (const auto& r : routes_) {
    const auto line = [&](RejectReason reason) {
      out += fmt::format(
          "fairgate_gateway_rejected_total{{route=\"{}\",reason=\"{}\"}} {}\n", r->config.path,
          to_string(reason),
          r->stats.rejected_by_reason[static_cast<std::size_t>(reason)].load(std::memory_order_relaxed));
    };
    line(RejectReason::timeout);  // a queue timeout is a rejection of the gateway's request
    for (const auto reason : kRejectionReasons) line(reason);
  }
  series("fairgate_gateway_rate_limited_total",
         "Requests refused by the route's rate limits (before the queue).", &RouteStats::rate_limited);
  series("fairgate_gateway_client_gone_total", "Clients that left while waiting or while streaming.",
         &RouteStats::client_gone);
  series("fairgate_gateway_upstream_errors_total", "Upstream connect failures, timeouts and resets.",
         &RouteStats::upstream_errors);
  series("fairgate_gateway_upstream_connections_opened_total", "New connections to the upstream.",
         &RouteStats::connections_opened);
  series("fairgate_gateway_upstream_connections_reused_total", "Upstream calls on a pooled connection.",
         &RouteStats::connections_reused);
  series("fairgate_gateway_upstream_tls_resumed_total",
         "New https:// upstream connections that resumed a kept TLS session (an abbreviated handshake).",
         &RouteStats::connections_resumed);
  series("fairgate_gateway_tokens_over_reservation_total",
         "Token budgets: tokens answers used beyond what their request reserved, charged after the answer.",
         &RouteStats::tokens_over_reservation);
  out +=
      "# HELP fairgate_gateway_upstream_connections_idle Idle keep-alive connections held open to the "
      "upstream "
      "(its pool).\n"
      "# TYPE fairgate_gateway_upstream_connections_idle gauge\n";
  for (const auto& r : routes_)
    out += fmt::format("fairgate_gateway_upstream_connections_idle{{route=\"{}\"}} {}\n", r->config.path,
                       r->config.upstream_tls ? r->tls_pool.idle() : r->pool.idle());
  out +=
      "# HELP fairgate_gateway_upstream_responses_total Upstream answers by status class.\n"
      "# TYPE fairgate_gateway_upstream_responses_total counter\n";
  for (const auto& r : routes_) {
    const auto& s = r->stats;
    for (const auto& [cls, v] : {std::pair{"2xx", &s.upstream_2xx}, std::pair{"4xx", &s.upstream_4xx},
                                 std::pair{"5xx", &s.upstream_5xx}, std::pair{"other", &s.upstream_other}}) {
      out += fmt::format("fairgate_gateway_upstream_responses_total{{route=\"{}\",class=\"{}\"}} {}\n",
                         r->config.path, cls, v->load(std::memory_order_relaxed));
    }
  }
  const auto histogram = [&](std::string_view name, std::string_view help, Histogram RouteStats::*h) {
    out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    for (const auto& r : routes_)
      (r->stats.*h).render(name, fmt::format("route=\"{}\"", r->config.path), out);
  };
  histogram("fairgate_gateway_time_to_first_token_seconds",
            "Streamed answers: request arrival (queue wait included) to the first byte of the upstream's "
            "answer relayed.",
            &RouteStats::time_to_first_token);
  histogram("fairgate_gateway_upstream_seconds",
            "Upstream calls: from connecting (or taking a pooled connection) to the end of the upstream's "
            "answer.",
            &RouteStats::upstream_latency);
}

// --- pure helpers ----------------------------------------------------------------

std::string_view target_path(std::string_view target) noexcept { return target.substr(0, target.find('?')); }

bool wants_stream(std::string_view body) {
  boost::system::error_code ec;
  const json::value v = json::parse(body, ec);
  if (ec || !v.is_object()) return false;
  const auto* stream = v.as_object().if_contains("stream");
  return stream != nullptr && stream->is_bool() && stream->as_bool();
}

namespace {

bool iequals(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

bool is_hop_by_hop(std::string_view name, std::string_view connection) noexcept {
  static constexpr std::array<std::string_view, 9> kHop = {"connection",
                                                           "keep-alive",
                                                           "proxy-authenticate",
                                                           "proxy-authorization",
                                                           "proxy-connection",
                                                           "te",
                                                           "trailer",
                                                           "transfer-encoding",
                                                           "upgrade"};
  for (const auto h : kHop)
    if (iequals(name, h)) return true;
  while (!connection.empty()) {
    const auto comma = connection.find(',');
    if (iequals(trim(connection.substr(0, comma)), name)) return true;
    if (comma == std::string_view::npos) break;
    connection.remove_prefix(comma + 1);
  }
  return false;
}

}  // namespace fairgate::serve
