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
  entries_.emplace(token, Entry{std::move(permit), std::move(limiter), lease, Clock::now() + lease});
  return token;
}

bool LeaseTable::release(const std::string& token) {
  Permit released;  // destroyed (released) after the lock is dropped
  {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(token);
    if (it == entries_.end()) return false;
    released = std::move(it->second.permit);
    entries_.erase(it);
  }
  return true;
}

std::optional<std::chrono::milliseconds> LeaseTable::renew(const std::string& token) {
  std::lock_guard lock(mu_);
  const auto it = entries_.find(token);
  if (it == entries_.end()) return std::nullopt;
  it->second.expires = Clock::now() + it->second.lease;
  return it->second.lease;
}

std::size_t LeaseTable::expire(Clock::time_point now) {
  std::vector<Permit> released;
  {
    std::lock_guard lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->second.expires <= now) {
        released.push_back(std::move(it->second.permit));
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
  }
  return released.size();
}

void LeaseTable::clear() {
  std::unordered_map<std::string, Entry> all;
  {
    std::lock_guard lock(mu_);
    all.swap(entries_);
  }
}

std::size_t LeaseTable::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace fairgate::serve
