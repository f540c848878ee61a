// tests/support/rate_checks.hpp — gtest checks of rate-limit decisions
// against the reference models (rate_reference.hpp): every field of one
// decision, and the bound each algorithm promises over a whole schedule.
#pragma once

#include "core/rate_math.hpp"
#include "support/rate_reference.hpp"

#include <gtest/gtest.h>

namespace fairgate::test {

// Every field of `d` checked against the reference, before `ref` records it.
inline void check_decision(const RateReference& ref, std::int64_t now, std::int64_t cost,
                           const fairgate::core::rate::Decision& d, bool was_allowed) {
  const auto& r = ref.rule();
  ASSERT_EQ(d.allowed, was_allowed) << "t=" << now << " cost=" << cost;
  EXPECT_EQ(d.remaining, ref.remaining(now)) << "t=" << now << " cost=" << cost;
  if (d.reset_ms == 0) {
    EXPECT_EQ(ref.remaining(now), r.capacity()) << "t=" << now;
  } else {
    EXPECT_EQ(ref.remaining(now + d.reset_ms), r.capacity()) << "t=" << now << " reset=" << d.reset_ms;
    EXPECT_LT(ref.remaining(now + d.reset_ms - 1), r.capacity()) << "t=" << now << " reset=" << d.reset_ms;
  }
  if (d.allowed) {
    EXPECT_EQ(d.retry_after_ms, 0);
  } else if (cost > r.capacity()) {
    EXPECT_EQ(d.retry_after_ms, -1);
  } else {
    ASSERT_GE(d.retry_after_ms, 1);
    EXPECT_TRUE(ref.allowed(now + d.retry_after_ms, cost)) << "t=" << now << " retry=" << d.retry_after_ms;
    EXPECT_FALSE(ref.allowed(now + d.retry_after_ms - 1, cost))
        << "t=" << now << " retry=" << d.retry_after_ms;
  }
}

// The bound each algorithm promises, from the admitted events alone.
inline void check_bounds(const RateReference& ref) {
  const auto& r = ref.rule();
  const std::int64_t p = r.period_ms;
  for (const auto& e : ref.events()) {
    const std::int64_t t = e.at;
    switch (r.algorithm) {
      case fairgate::RateAlgorithm::fixed_window:
        EXPECT_LE(ref.admitted(t / p * p, t / p * p + p - 1), r.rate) << "window of t=" << t;
        break;
      case fairgate::RateAlgorithm::sliding_log:
        EXPECT_LE(ref.admitted(t - p + 1, t), r.rate) << "period ending t=" << t;
        break;
      case fairgate::RateAlgorithm::sliding_window: {
        const std::int64_t start = t / p * p;
        EXPECT_LE(ref.admitted(start, start + p - 1), r.rate) << "window of t=" << t;
        // Documented error bound: rate + prev·e/P in any period (t − P, t].
        const std::int64_t prev = ref.admitted(start - p, start - 1);
        EXPECT_LE(ref.admitted(t - p + 1, t), r.rate + prev * (t - start) / p) << "period ending t=" << t;
        break;
      }
      case fairgate::RateAlgorithm::token_bucket:
      case fairgate::RateAlgorithm::gcra:
        for (const auto& s : ref.events()) {
          if (s.at > t) continue;
          EXPECT_LE(ref.admitted(s.at, t) * p, r.capacity() * p + r.rate * (t - s.at))
              << "span [" << s.at << ", " << t << "]";
        }
        break;
    }
  }
}

}  // namespace fairgate::test
