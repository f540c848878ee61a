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
#include <functional>
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

  /// Called (outside the lock) for every permit the table lets go of, with
  /// how long it was held. Set before the table is used.
  using OnRelease = std::function<void(const std::string& limiter, std::chrono::milliseconds held)>;
  void set_on_release(OnRelease f) { on_release_ = std::move(f); }

  /// Takes `permit` for `lease`; returns its token (unguessable, URL-safe).
  std::string add(Permit permit, std::string limiter, std::chrono::milliseconds lease);
  /// Releases the permit of `token`; false if there is none.
  bool release(const std::string& token);
  /// Extends the lease of `token` from now by `lease`, which becomes its lease
  /// length, or (nullopt) by its current lease length; returns the lease
  /// applied, nullopt if the token is unknown.
  std::optional<std::chrono::milliseconds> renew(const std::string& token,
                                                 std::optional<std::chrono::milliseconds> lease);
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
    Clock::time_point granted{};
  };
  void released(const std::string& limiter, Clock::time_point granted) const;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::mt19937_64 rng_;
  OnRelease on_release_;
};

}  // namespace fairgate::serve
