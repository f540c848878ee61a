#include "core/service_pace.hpp"

#include <algorithm>
#include <cmath>

namespace fairgate::core {

namespace {
double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

std::optional<std::chrono::milliseconds> estimate_wait(const PaceFigures& f, std::size_t position) noexcept {
  if (f.samples < kPaceMinSamples || position == 0 || !(f.gap_ms >= 0.0)) return std::nullopt;
  if (f.age_ms > static_cast<double>(kPaceStale.count())) return std::nullopt;
  const double e = std::max(0.0, f.since_full_ms.value_or(0.0));
  const double next = std::max(f.gap_ms - e, f.gap_ms / 2.0);
  const double ms = static_cast<double>(position - 1) * f.gap_ms + next;
  if (!std::isfinite(ms) || ms > 1e12) return std::nullopt;
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(ms)));
}

double next_gap_mean(double mean, std::uint32_t samples, double gap_ms) noexcept {
  if (samples == 0) return gap_ms;
  const double w = samples < kPaceWarmSamples ? 1.0 / static_cast<double>(samples + 1) : kPaceWeight;
  return mean + w * (gap_ms - mean);
}

void ServicePace::on_release(Time now, bool full_after) noexcept {
  if (last_full_) {
    gap_ms_ = next_gap_mean(gap_ms_, samples_, std::max(0.0, ms_between(*last_full_, now)));
    samples_ = std::min(samples_ + 1, kPaceMaxSamples);
    sampled_at_ = now;
  }
  if (full_after) {
    last_full_ = now;
  } else {
    last_full_.reset();
  }
}

void ServicePace::on_departure(Time now) noexcept {
  if (!last_full_) return;
  gap_ms_ = next_gap_mean(gap_ms_, samples_, std::max(0.0, ms_between(*last_full_, now)));
  samples_ = std::min(samples_ + 1, kPaceMaxSamples);
  sampled_at_ = now;
  last_full_ = now;
}

PaceFigures ServicePace::figures(Time now) const noexcept {
  PaceFigures f;
  f.gap_ms = gap_ms_;
  f.samples = samples_;
  if (last_full_) f.since_full_ms = std::max(0.0, ms_between(*last_full_, now));
  f.age_ms = samples_ == 0 ? 0.0 : std::max(0.0, ms_between(sampled_at_, now));
  return f;
}

}  // namespace fairgate::core
