#include "api/shadow.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <utility>
#include <vector>

namespace fairgate::detail {

namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

/// The completion of a shadow's acquire: hands the outcome to the ShadowRun
/// on the limiter's executor (backends may complete under their own lock).
class GhostCompletion final : public Completion {
 public:
  /// `queued`: set when the shadow was told a place in the queue (null: it waited, surely).
  GhostCompletion(std::weak_ptr<ShadowRun> run, std::string id, boost::asio::any_io_executor executor,
                  std::shared_ptr<std::atomic<bool>> queued = nullptr)
      : run_(std::move(run)),
        id_(std::move(id)),
        executor_(std::move(executor)),
        queued_(std::move(queued)) {}

  void complete(AcquireResult result) override {
    boost::asio::post(executor_, [run = run_, id = std::move(id_), result = std::move(result),
                                  queued = std::move(queued_)]() mutable {
      // The limiter is gone: the permit in `result` (if any) goes back on its own.
      if (auto r = run.lock()) r->on_ghost(id, std::move(result), !queued || queued->load());
    });
  }

 private:
  std::weak_ptr<ShadowRun> run_;
  std::string id_;
  boost::asio::any_io_executor executor_;
  std::shared_ptr<std::atomic<bool>> queued_;
};

/// The completion of an enforced request (ShadowRun::track): its caller's, or,
/// once the request was let through, its shadow's.
class TrackedCompletion final : public Completion {
 public:
  TrackedCompletion(std::weak_ptr<ShadowRun> run, std::shared_ptr<ShadowRun::Tracked> tracked,
                    std::uint64_t key)
      : run_(std::move(run)), tracked_(std::move(tracked)), key_(key) {}

  void complete(AcquireResult result) override {
    std::unique_ptr<Completion> caller;
    std::string shadow_id;
    {
      std::lock_guard lock(tracked_->mu);
      caller = std::move(tracked_->caller);
      shadow_id = tracked_->shadow_id;
    }
    auto run = run_.lock();
    if (run) run->untrack(key_);
    if (caller) {
      caller->complete(std::move(result));
    } else if (run && !shadow_id.empty()) {
      // Let through: the outcome is its shadow's (posted: this may run under the backend's lock).
      GhostCompletion(run_, std::move(shadow_id), run->executor()).complete(std::move(result));
    }
  }

 private:
  std::weak_ptr<ShadowRun> run_;
  std::shared_ptr<ShadowRun::Tracked> tracked_;
  std::uint64_t key_;
};

}  // namespace

std::shared_ptr<ShadowRun> make_shadow_run() { return std::make_shared<ShadowRun>(); }

std::unique_ptr<Completion> ShadowRun::track(AcquireOptions& options,
                                             std::unique_ptr<Completion> completion) {
  auto tracked = std::make_shared<Tracked>();
  tracked->caller = std::move(completion);
  tracked->arrived = Clock::now();
  if (options.on_queued) {
    // No position reaches a request let through.
    options.on_queued = [tracked, on_queued = std::move(options.on_queued)](const QueueStatus& status) {
      {
        std::lock_guard lock(tracked->mu);
        if (!tracked->caller) return;
      }
      on_queued(status);
    };
  }
  std::uint64_t key = 0;
  {
    std::lock_guard lock(mu_);
    key = next_tracked_++;
    tracked_.emplace(key, tracked);
  }
  return std::make_unique<TrackedCompletion>(weak_from_this(), std::move(tracked), key);
}

boost::asio::any_io_executor ShadowRun::executor() const {
  std::lock_guard lock(mu_);
  return executor_;
}

void ShadowRun::untrack(std::uint64_t key) {
  std::lock_guard lock(mu_);
  tracked_.erase(key);
}

void ShadowRun::let_through(LimiterImpl& impl) {
  std::vector<std::shared_ptr<Tracked>> waiting;
  {
    std::lock_guard lock(mu_);
    if (!executor_) executor_ = impl.get_executor();
    for (const auto& [key, weak] : tracked_) {
      if (auto t = weak.lock()) waiting.push_back(std::move(t));
    }
  }
  for (const auto& t : waiting) {
    std::unique_ptr<Completion> caller;
    std::string id;
    const auto now = Clock::now();
    {
      std::lock_guard tracked_lock(t->mu);
      if (!t->caller) continue;  // delivered meanwhile
      caller = std::move(t->caller);
      std::lock_guard lock(mu_);
      id = "shadow-" + std::to_string(next_id_++);
      leases_.emplace(id, Lease{.arrived = now});  // it runs from now: its shadow replays that
      ++status_.passed;
      ++status_.in_flight;
      ++status_.waiting;
      t->shadow_id = id;
    }
    caller->complete(AcquireResult::granted(
        Permit(impl.shared_from_this(), id, duration_cast<milliseconds>(now - t->arrived))));
  }
}

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
  // Would it have queued? Not "waited more than 0 ms": on Redis a grant at once takes a round
  // trip, and a burst made every one of them look queued (a helper: 12 of 12, enforcing 9 of 12).
  auto queued = std::make_shared<std::atomic<bool>>(false);
  ghost.on_queued = [queued](const QueueStatus&) { queued->store(true); };
  impl.start_acquire(std::move(ghost),
                     std::make_unique<GhostCompletion>(weak_from_this(), std::move(id), impl.get_executor(),
                                                       std::move(queued)),
                     boost::asio::cancellation_slot());
}

void ShadowRun::on_ghost(const std::string& id, AcquireResult result, bool queued) {
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
  if (queued) ++status_.would_queue;
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
