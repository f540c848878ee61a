#include "bench/record.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>

namespace fairgate::bench {

namespace json = boost::json;

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string to_json(const RequestRecord& r) {
  json::object o;
  o["ev"] = "req";
  o["inst"] = r.instance;
  o["i"] = r.index;
  o["arrive"] = r.arrive_ns;
  o["grant"] = r.grant_ns;
  o["release"] = r.release_ns;
  if (r.end_ns != 0) o["end"] = r.end_ns;
  o["queued"] = r.queued;
  if (r.sequence != 0) o["seq"] = r.sequence;
  o["outcome"] = r.outcome;
  if (!r.reason.empty()) o["reason"] = r.reason;
  return json::serialize(o);
}

std::optional<RequestRecord> request_from_json(std::string_view text) {
  boost::system::error_code ec;
  const json::value v = json::parse(text, ec);
  if (ec || !v.is_object()) return std::nullopt;
  const json::object& o = v.get_object();
  const auto* ev = o.if_contains("ev");
  if (!ev || !ev->is_string() || ev->get_string() != "req") return std::nullopt;
  RequestRecord r;
  try {
    r.instance = json::value_to<std::string>(o.at("inst"));
    r.index = json::value_to<std::uint64_t>(o.at("i"));
    r.arrive_ns = json::value_to<std::int64_t>(o.at("arrive"));
    r.grant_ns = json::value_to<std::int64_t>(o.at("grant"));
    r.release_ns = json::value_to<std::int64_t>(o.at("release"));
    r.queued = o.at("queued").as_bool();
    r.outcome = json::value_to<std::string>(o.at("outcome"));
    if (const auto* reason = o.if_contains("reason")) r.reason = json::value_to<std::string>(*reason);
    if (const auto* seq = o.if_contains("seq")) r.sequence = json::value_to<std::uint64_t>(*seq);
    if (const auto* end = o.if_contains("end")) r.end_ns = json::value_to<std::int64_t>(*end);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return r;
}

Distribution distribution_ms(std::vector<std::int64_t> values) {
  Distribution d;
  d.count = values.size();
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  // Nearest rank.
  const auto rank = [&](double p) {
    const auto k = static_cast<std::size_t>(std::ceil(p * static_cast<double>(values.size())));
    return values[std::clamp<std::size_t>(k, 1, values.size()) - 1];
  };
  d.p50 = static_cast<double>(rank(0.50)) / 1e6;
  d.p99 = static_cast<double>(rank(0.99)) / 1e6;
  d.max = static_cast<double>(values.back()) / 1e6;
  for (const double p : kCdfPoints) d.cdf.push_back(static_cast<double>(rank(p)) / 1e6);
  return d;
}

namespace {

std::size_t max_overlap(const std::vector<RequestRecord>& records) {
  // +1 at grant, -1 at release; a release at the same instant as a grant goes first.
  std::vector<std::pair<std::int64_t, int>> events;
  for (const auto& r : records) {
    if (!r.granted()) continue;
    events.emplace_back(r.grant_ns, +1);
    if (r.release_ns != 0) events.emplace_back(r.release_ns, -1);
  }
  std::sort(events.begin(), events.end());
  std::size_t best = 0;
  long current = 0;
  for (const auto& [t, delta] : events) {
    current += delta;
    best = std::max(best, static_cast<std::size_t>(std::max(0L, current)));
  }
  return best;
}

// Pairs (a, b) with arrive_a + arrive_margin < arrive_b and grant_b + grant_margin < grant_a,
// over (arrive, grant) points. O(n log n).
std::uint64_t count_inversions(std::vector<std::pair<std::int64_t, std::int64_t>> points,
                               std::int64_t arrive_margin, std::int64_t grant_margin) {
  std::sort(points.begin(), points.end());
  std::vector<std::int64_t> grants;
  grants.reserve(points.size());
  for (const auto& p : points) grants.push_back(p.second);
  std::sort(grants.begin(), grants.end());
  // Fenwick tree over the rank of grant times: how many added a's have grant > x.
  std::vector<std::uint64_t> tree(grants.size() + 1, 0);
  const auto add = [&](std::size_t rank) {
    for (std::size_t i = rank + 1; i < tree.size(); i += i & (~i + 1)) ++tree[i];
  };
  const auto prefix = [&](std::size_t n) {  // added a's with rank < n
    std::uint64_t s = 0;
    for (std::size_t i = n; i > 0; i -= i & (~i + 1)) s += tree[i];
    return s;
  };
  std::uint64_t inversions = 0, added = 0;
  std::size_t next = 0;
  for (const auto& b : points) {
    while (next < points.size() && points[next].first + arrive_margin < b.first) {
      const auto rank = static_cast<std::size_t>(
          std::lower_bound(grants.begin(), grants.end(), points[next].second) - grants.begin());
      add(rank);
      ++added;
      ++next;
    }
    const auto not_later = static_cast<std::size_t>(
        std::upper_bound(grants.begin(), grants.end(), b.second + grant_margin) - grants.begin());
    inversions += added - prefix(not_later);
  }
  return inversions;
}

}  // namespace

Figures analyze(const std::vector<RequestRecord>& records, std::size_t cap, std::int64_t margin_ns) {
  Figures f;
  f.requests = records.size();
  std::vector<std::int64_t> releases, waits;
  for (const auto& r : records) {
    if (r.granted()) {
      ++f.grants;
      waits.push_back(r.grant_ns - r.arrive_ns);
    } else if (r.outcome == "timed_out") {
      ++f.timeouts;
    } else if (r.outcome == "cancelled") {
      ++f.cancels;
    } else {
      ++f.rejections;
    }
    if (r.release_ns != 0) releases.push_back(r.release_ns);
    if (f.first_arrive_ns == 0 || r.arrive_ns < f.first_arrive_ns) f.first_arrive_ns = r.arrive_ns;
    f.last_end_ns = std::max({f.last_end_ns, r.arrive_ns, r.grant_ns, r.release_ns});
  }
  std::sort(releases.begin(), releases.end());
  std::vector<std::int64_t> handoffs;
  for (const auto& r : records) {
    if (!r.granted() || !r.queued) continue;
    auto it = std::upper_bound(releases.begin(), releases.end(), r.grant_ns);
    if (it == releases.begin()) continue;
    const std::int64_t release = *std::prev(it);
    if (release < r.arrive_ns) continue;
    handoffs.push_back(r.grant_ns - release);
  }
  f.handoff = distribution_ms(std::move(handoffs));
  f.wait = distribution_ms(std::move(waits));
  f.max_holders = max_overlap(records);
  f.overshoot = f.max_holders > cap ? f.max_holders - cap : 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> by_sequence, by_client_time;
  for (const auto& r : records) {
    if (!r.granted()) continue;
    by_client_time.emplace_back(r.arrive_ns, r.grant_ns);
    if (r.sequence != 0) by_sequence.emplace_back(static_cast<std::int64_t>(r.sequence), r.grant_ns);
  }
  f.sequenced = by_sequence.size();
  f.inversions = count_inversions(std::move(by_sequence), 0, margin_ns);
  f.inversions_client_time = count_inversions(std::move(by_client_time), margin_ns, margin_ns);
  return f;
}

}  // namespace fairgate::bench
