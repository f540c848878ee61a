// api/shadow.hpp — shadow mode (F14), the same for every backend.
//
// In shadow mode a limiter lets every request through at once and, for each,
// starts a *shadow*: an ordinary acquire on the same limiter (so on Redis it
// queues cluster-wide, behind every instance's shadows and real holders). The
// shadow's outcome is what enforcing would have done with the request. A
// granted shadow holds its seat as long as the real request held its permit,
// counted from the shadow's own grant: a request that ran from a to a + d
// and whose shadow was granted at g >= a holds the shadow's seat until g + d.
// So the limiter replays the real schedule as an enforcing limiter would have
// served it, and its queue, counters and snapshot are the would-be figures
// (docs/shadow.md says where this model ends).
//
// Invariants: one Lease per request let through, from its grant until its
// real release and, while its shadow still waits, until the shadow ends; a
// shadow's permit is released exactly once (a Permit's destructor), at g + d.
#pragma once

#include <fairgate/detail/limiter_impl.hpp>
#include <fairgate/limiter.hpp>

#include <boost/asio/any_io_executor.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace fairgate::detail {

class ShadowRun : public std::enable_shared_from_this<ShadowRun> {
 public:
  /// Lets the request through (completes it with a granted permit whose id
  /// starts with "shadow-") and starts its shadow on `impl`, with the
  /// request's tenant, weight and max wait. `max_wait` has been checked.
  void start(LimiterImpl& impl, AcquireOptions options, std::unique_ptr<Completion> completion);

  /// The real request `id` ended. False when `id` is not one of ours (then it
  /// is a permit of the backend).
  bool release(const std::string& id) noexcept;

  ShadowStatus status() const;

  /// The shadow of request `id` ended (on the limiter's executor); `queued`: it was told a place.
  void on_ghost(const std::string& id, AcquireResult result, bool queued);

  /// Enforce mode: wraps the completion (and `on_queued`) of a request that may
  /// wait, so that a switch to shadow mode can let it through (let_through).
  std::unique_ptr<Completion> track(AcquireOptions& options, std::unique_ptr<Completion> completion);

  /// The limiter switched to shadow mode: every tracked request still waiting
  /// is let through now (a permit "shadow-N"), and its acquire, which keeps
  /// its place, goes on as its shadow. Before, they waited on (and timed out)
  /// while every newcomer passed at once.
  void let_through(LimiterImpl& impl);

  /// A tracked request (track()): its caller's completion until it is
  /// delivered or let through, then the shadow id its outcome goes to.
  struct Tracked {
    std::mutex mu;
    std::unique_ptr<Completion> caller;
    std::string shadow_id;
    std::chrono::steady_clock::time_point arrived;
  };
  /// The tracked request `key` ended (its completion ran).
  void untrack(std::uint64_t key);
  /// The limiter's executor (set by the first start() or let_through()).
  boost::asio::any_io_executor executor() const;

 private:
  using Clock = std::chrono::steady_clock;
  enum class Ghost : std::uint8_t { waiting, holding, ended };
  struct Lease {
    Clock::time_point arrived;
    std::optional<Clock::time_point> released;  ///< the real request ended
    Ghost ghost = Ghost::waiting;
    Clock::time_point ghost_granted;
    Permit ghost_permit;  ///< while Ghost::holding and the real request runs
  };

  /// Releases `permit` at `when` (at once when it has passed).
  void release_at(Permit permit, Clock::time_point when);

  mutable std::mutex mu_;
  boost::asio::any_io_executor executor_;  ///< the limiter's (set by the first start)
  std::map<std::string, Lease, std::less<>> leases_;
  std::map<std::uint64_t, std::weak_ptr<Tracked>> tracked_;  // enforce mode: requests that may wait
  std::uint64_t next_tracked_ = 1;
  std::uint64_t next_id_ = 1;
  ShadowStatus status_;
};

std::shared_ptr<ShadowRun> make_shadow_run();

}  // namespace fairgate::detail
