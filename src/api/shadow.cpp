#include "api/shadow.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <utility>

namespace fairgate::detail {

namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

/// The completion of a shadow's acquire: hands the outcome to the ShadowRun
/// on the limiter's executor (backends may complete under their own lock).
class GhostCompletion final : public Completion {
 public:
  GhostCompletion(std::weak_ptr<ShadowRun> run, std::string id, boost::asio::any_io_executor executor)
      : run_(std::move(run)), id_(std::move(id)), executor_(std::move(executor)) {}

  void complete(AcquireResult result) override {
    boost::asio::post(executor_, [run = run_, id = std::move(id_), result = std::move(result)]() mutable {
      // The limiter is gone: the permit in `result` (if any) goes back on its own.
      if (auto r = run.lock()) r->on_ghost(id, std::move(result));
    });
  }

 private:
  std::weak_ptr<ShadowRun> run_;
  std::string id_;
  boost::asio::any_io_executor executor_;
};

}  // namespace

std::shared_ptr<ShadowRun> make_shadow_run() { return std::make_shared<ShadowRun>(); }

void ShadowRun::start(LimiterImpl& impl, AcquireOptions options, std::unique_ptr<Completion> completion) {
  std::string id;
  {
    std::lock_guard lock(mu_);
    if (!executor_) executor_ = impl.get_executor();
    id = "shadow-" + std::to_string(next_id_++);
    leases_.emplace(id, Lease{.arrived = Clock::now()});
    ++status_.passed;
    ++status_.in_flight;
    ++status_.waiting;
  }
  completion->complete(AcquireResult::granted(Permit(impl.shared_from_this(), id, milliseconds(0))));

  AcquireOptions ghost;
  ghost.max_wait = options.max_wait;
  ghost.tenant = std::move(options.tenant);
  ghost.weight = options.weight;
  impl.start_acquire(std::move(ghost),
                     std::make_unique<GhostCompletion>(weak_from_this(), std::move(id), impl.get_executor()),
                     boost::asio::cancellation_slot());
}

void ShadowRun::on_ghost(const std::string& id, AcquireResult result) {
  std::unique_lock lock(mu_);
  auto it = leases_.find(id);
  if (it == leases_.end()) return;  // cannot happen: a lease lives until its shadow ended
  Lease& lease = it->second;
  --status_.waiting;
  const auto now = Clock::now();
  if (!result.granted()) {
    ++status_.would_end_by_reason[static_cast<std::size_t>(result.reason())];
    lease.ghost = Ghost::ended;
    if (lease.released) leases_.erase(it);
    return;
  }
  const milliseconds waited = result.waited();
  ++status_.would_grant;
  if (waited.count() > 0) ++status_.would_queue;
  status_.would_wait_ms_sum += static_cast<std::uint64_t>(waited.count());
  if (waited > status_.would_wait_max) status_.would_wait_max = waited;
  const double seconds = static_cast<double>(waited.count()) / 1000.0;
  std::size_t bucket = 0;
  while (bucket < kShadowWaitBounds.size() && seconds > kShadowWaitBounds[bucket]) ++bucket;
  ++status_.would_wait_buckets[bucket];

  if (lease.released) {
    // The real request is over already: its shadow holds as long as it held.
    const auto held = *lease.released - lease.arrived;
    Permit permit = result.take_permit();
    leases_.erase(it);
    lock.unlock();
    release_at(std::move(permit), now + held);
    return;
  }
  lease.ghost = Ghost::holding;
  lease.ghost_granted = now;
  lease.ghost_permit = result.take_permit();
}

bool ShadowRun::release(const std::string& id) noexcept {
  Permit permit;
  Clock::time_point when;
  {
    std::lock_guard lock(mu_);
    auto it = leases_.find(id);
    if (it == leases_.end() || it->second.released) return it != leases_.end();
    Lease& lease = it->second;
    const auto now = Clock::now();
    lease.released = now;
    --status_.in_flight;
    switch (lease.ghost) {
      case Ghost::waiting: return true;  // ended by on_ghost
      case Ghost::ended: leases_.erase(it); return true;
      case Ghost::holding:
        when = lease.ghost_granted + (now - lease.arrived);
        permit = std::move(lease.ghost_permit);
        leases_.erase(it);
        break;
    }
  }
  try {
    release_at(std::move(permit), when);
  } catch (...) {
    // Out of memory for the timer: give the seat back now rather than never.
  }
  return true;
}

void ShadowRun::release_at(Permit permit, Clock::time_point when) {
  if (when <= Clock::now() || !executor_) return;  // `permit` goes back as it leaves scope
  auto timer = std::make_shared<boost::asio::steady_timer>(executor_, when);
  timer->async_wait(
      [timer, permit = std::move(permit)](const boost::system::error_code&) mutable { permit.release(); });
}

ShadowStatus ShadowRun::status() const {
  std::lock_guard lock(mu_);
  return status_;
}

}  // namespace fairgate::detail
