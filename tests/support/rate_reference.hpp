// tests/support/rate_reference.hpp — reference models of the five rate-limit
// algorithms, written from their definitions in docs/ratelimit.md and not
// from src/core/rate_math.cpp: each keeps the full list of admitted
// (time, cost) events and answers by brute force over it.
//
//  fixed_window   allowed iff Σ cost admitted in now's aligned window + c <= rate
//  sliding_log    allowed iff Σ cost admitted in (now − P, now] + c <= rate
//  sliding_window allowed iff prev·(P − e) + (cur + c)·P <= rate·P, with prev /
//                 cur = Σ cost admitted in the previous / current aligned
//                 window and e = now − start of the current window
//  token_bucket,  allowed iff c <= cap and for every admitted time s <= now:
//  gcra           (Σ cost admitted in [s, now] + c)·P <= cap·P + rate·(now − s)
//                 (the bucket as a min-plus filter: a bucket that starts full
//                 never lets more than cap + rate·Δ/P through in any span Δ)
//
// Refunds are negative events (see docs/ratelimit.md, "Refunds").
#pragma once

#include <fairgate/rate_rule.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace fairgate::test {

class RateReference {
 public:
  explicit RateReference(RateRule rule) : r_(rule) {}

  struct Event {
    std::int64_t at;
    std::int64_t scaled;  // cost × P (negative: a refund)
    std::int64_t decision_at;
  };

  bool allowed(std::int64_t now, std::int64_t cost) const {
    const std::int64_t p = r_.period_ms;
    if (cost > r_.capacity()) return false;
    switch (r_.algorithm) {
      case RateAlgorithm::fixed_window:
        return sum_scaled(now / p * p, (now / p + 1) * p - 1) + cost * p <= r_.rate * p;
      case RateAlgorithm::sliding_log: return sum_scaled(now - p + 1, now) + cost * p <= r_.rate * p;
      case RateAlgorithm::sliding_window: {
        const std::int64_t start = now / p * p;
        const std::int64_t prev = sum_scaled(start - p, start - 1) / p;
        const std::int64_t cur = sum_scaled(start, now) / p;
        return prev * (p - (now - start)) + (cur + cost) * p <= r_.rate * p;
      }
      case RateAlgorithm::token_bucket:
      case RateAlgorithm::gcra: return debt_scaled(now) + cost * p <= r_.capacity() * p;
    }
    return false;
  }

  /// max(0, max over s of (Σ scaled in [s, now] − rate·(now − s))), the
  /// bucket's debt in cost×P units (Lindley's recursion unrolled).
  std::int64_t debt_scaled(std::int64_t now) const {
    std::int64_t debt = 0;
    std::int64_t acc = 0;
    for (auto it = events_.rbegin(); it != events_.rend(); ++it) {
      if (it->at > now) continue;
      acc += it->scaled;
      debt = std::max(debt, acc - r_.rate * (now - it->at));
    }
    return debt;
  }

  void admit(std::int64_t now, std::int64_t cost) { events_.push_back({now, cost * r_.period_ms, now}); }

  /// The largest cost allowed at `now` (0 if none).
  std::int64_t remaining(std::int64_t now) const {
    std::int64_t lo = 0, hi = r_.capacity();
    while (lo < hi) {
      const std::int64_t mid = (lo + hi + 1) / 2;
      if (allowed(now, mid))
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }

  /// Refund of `amount` of the decision allowed at `decision_at`, at `now`
  /// (the caller gives back no more than that decision took, once). Returns
  /// the units given back.
  std::int64_t refund(std::int64_t now, std::int64_t decision_at, std::int64_t amount) {
    const std::int64_t p = r_.period_ms;
    switch (r_.algorithm) {
      case RateAlgorithm::fixed_window:
        if (decision_at / p != now / p) return 0;
        break;
      case RateAlgorithm::sliding_log:
        if (decision_at <= now - p) return 0;
        break;
      case RateAlgorithm::sliding_window:
        if (decision_at / p < now / p - 1) return 0;
        break;
      case RateAlgorithm::token_bucket:
      case RateAlgorithm::gcra: {
        if (now - decision_at >= p) return 0;
        const std::int64_t back = std::min(amount * p, debt_scaled(now));
        events_.push_back({now, -back, now});
        return (back + p - 1) / p;
      }
    }
    // Window algorithms: the units leave the window the decision counted in.
    events_.push_back({decision_at, -amount * p, decision_at});
    std::stable_sort(events_.begin(), events_.end(),
                     [](const Event& a, const Event& b) { return a.at < b.at; });
    return amount;
  }

  /// Σ admitted cost (net of refunds) in [from, to].
  std::int64_t admitted(std::int64_t from, std::int64_t to) const {
    return sum_scaled(from, to) / r_.period_ms;
  }
  const std::vector<Event>& events() const { return events_; }
  const RateRule& rule() const { return r_; }

 private:
  std::int64_t sum_scaled(std::int64_t from, std::int64_t to) const {
    std::int64_t s = 0;
    for (const auto& e : events_)
      if (e.at >= from && e.at <= to) s += e.scaled;
    return s;
  }

  RateRule r_;
  std::vector<Event> events_;
};

}  // namespace fairgate::test
