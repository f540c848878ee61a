// serve/leases.cpp
#include "serve/leases.hpp"

#include <fmt/format.h>

#include <vector>

namespace fairgate::serve {

LeaseTable::LeaseTable() {
  std::random_device rd;
  std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
  rng_.seed(seq);
}

std::string LeaseTable::add(Permit permit, std::string limiter, std::chrono::milliseconds lease) {
  std::lock_guard lock(mu_);
  std::string token;
  do {
    token = fmt::format("lp-{:016x}{:016x}", rng_(), rng_());
  } while (entries_.count(token) != 0);
  const auto now = Clock::now();
  entries_.emplace(token, Entry{std::move(permit), std::move(limiter), lease, now + lease, now});
  return token;
}

bool LeaseTable::release(const std::string& token) {
  Permit permit;  // destroyed (released) after the lock is dropped
  std::string limiter;
  Clock::time_point granted;
  {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(token);
    if (it == entries_.end()) return false;
    permit = std::move(it->second.permit);
    limiter = std::move(it->second.limiter);
    granted = it->second.granted;
    entries_.erase(it);
  }
  released(limiter, granted);
  return true;
}

std::optional<std::chrono::milliseconds> LeaseTable::renew(const std::string& token,
                                                           std::optional<std::chrono::milliseconds> lease) {
  std::lock_guard lock(mu_);
  const auto it = entries_.find(token);
  if (it == entries_.end()) return std::nullopt;
  if (lease) it->second.lease = *lease;
  it->second.expires = Clock::now() + it->second.lease;
  return it->second.lease;
}

std::size_t LeaseTable::expire(Clock::time_point now) {
  std::vector<Entry> gone;
  {
    std::lock_guard lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->second.expires <= now) {
        gone.push_back(std::move(it->second));
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& e : gone) released(e.limiter, e.granted);
  return gone.size();
}

void LeaseTable::clear() {
  std::unordered_map<std::string, Entry> all;
  {
    std::lock_guard lock(mu_);
    all.swap(entries_);
  }
  for (const auto& [token, e] : all) released(e.limiter, e.granted);
}

void LeaseTable::released(const std::string& limiter, Clock::time_point granted) const {
  if (on_release_)
    on_release_(limiter, std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - granted));
}

std::size_t LeaseTable::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace fairgate::serve
