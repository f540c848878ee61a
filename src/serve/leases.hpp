// serve/leases.hpp — permits granted to plain JSON (long-poll) clients.
//
// A JSON client holds a permit by its token until DELETE /v1/permits/{token},
// or until the lease runs out without a renew. The table owns the Permit
// objects, so dropping an entry releases the permit (exactly once, RAII).
//
// Thread-safety: all members may be called from any thread. Permits are
// released outside the table's lock.
#pragma once

#include <fairgate/permit.hpp>

#include <chrono>
#include <cstddef>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>

namespace fairgate::serve {

class LeaseTable {
 public:
  using Clock = std::chrono::steady_clock;

  LeaseTable();

  /// Takes `permit` for `lease`; returns its token (unguessable, URL-safe).
  std::string add(Permit permit, std::string limiter, std::chrono::milliseconds lease);
  /// Releases the permit of `token`; false if there is none.
  bool release(const std::string& token);
  /// Extends the lease of `token` by its lease length from now; nullopt if unknown.
  std::optional<std::chrono::milliseconds> renew(const std::string& token);
  /// Releases every lease that ran out before `now`; returns how many.
  std::size_t expire(Clock::time_point now);
  /// Releases everything (shutdown).
  void clear();
  std::size_t size() const;

 private:
  struct Entry {
    Permit permit;
    std::string limiter;
    std::chrono::milliseconds lease{0};
    Clock::time_point expires{};
  };
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::mt19937_64 rng_;
};

}  // namespace fairgate::serve
