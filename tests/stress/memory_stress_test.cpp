// Stress tests of the memory backend: many threads, random hold times,
// cancels and short deadlines, and hot config changes under load. They check
// the three promises that matter most — no overshoot (F1), FIFO (F2) and
// exactly one exit per request (F4) — in ways that cannot report a false
// failure (each check is explained where it is made).
//
// Size: FAIRGATE_STRESS_SCALE (a positive number, default 1) multiplies the
// number of requests; FAIRGATE_STRESS_SEED fixes the random seed (printed).
#include <fairgate/fairgate.hpp>

#include "support/wait.hpp"

#include <gtest/gtest.h>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using fairgate::AcquireOptions;
using fairgate::AcquireResult;
using fairgate::Outcome;
using fairgate::Permit;
using fairgate::QueueStatus;
using fairgate::RejectReason;
using fairgate::Settings;
using fairgate::SettingsUpdate;

constexpr int kRequesters = 8;
constexpr auto kLongWait = 60s;  // "never times out" within a test run

double stress_scale() {
  const char* s = std::getenv("FAIRGATE_STRESS_SCALE");
  if (s == nullptr || *s == '\0') return 1.0;
  const double v = std::atof(s);
  return v > 0 ? v : 1.0;
}

std::uint64_t stress_seed() {
  if (const char* s = std::getenv("FAIRGATE_STRESS_SEED"); s != nullptr && *s != '\0') {
    return std::strtoull(s, nullptr, 10);
  }
  return std::random_device{}();
}

std::size_t scaled(std::size_t base) {
  return std::max<std::size_t>(kRequesters,
                               static_cast<std::size_t>(static_cast<double>(base) * stress_scale()));
}

// One request. `seq` is its arrival order (see Harness::acquire).
struct Request {
  std::uint64_t seq = 0;
  bool short_wait = false;
  std::optional<std::chrono::microseconds> cancel_after;

  // Touched only on the completion context, after initiation.
  asio::cancellation_signal signal;
  bool cancel_emitted = false;
  int completions = 0;
  Outcome outcome = Outcome::rejected;
  RejectReason reason = RejectReason::unavailable;

  // Set on C when the outcome arrives; read by on_queued.
  std::atomic<bool> ended{false};

  // Touched only by on_queued, which the limiter runs one position pass at a time.
  int updates_after_end = 0;
  std::size_t last_position = 0;
  int position_updates = 0;
  bool position_went_up = false;
};

// The shared machinery of both tests.
//
// * The limiter's own executor is a 2-thread pool (timers, on_queued).
// * Every completion handler is bound to ONE single-threaded io_context, the
//   completion context C. The limiter decides every outcome under its mutex
//   and posts the handler from inside that critical section, so C runs the
//   handlers in exactly the order the limiter decided them.
// * Cancellation is emitted on C too (asio cancellation slots are not
//   thread-safe; C is where the handler, and so its slot, lives). The emit is
//   posted to C after async_acquire() returned, so the slot assignment made
//   inside async_acquire happens before it.
// * Requests are initiated from kRequesters threads, but each initiation
//   runs under `admit_mu` and takes the next `seq` there. The memory limiter
//   admits a request synchronously inside async_acquire, so seq order is the
//   limiter's admission order.
// * A permit is held on a separate 2-thread pool for a random 0-2 ms.
class Harness {
 public:
  explicit Harness(const Settings& settings, std::size_t total, std::uint64_t seed)
      : backend_(fairgate::make_memory_backend(limiter_pool_.get_executor())),
        limiter_(backend_->open("stress", settings).value()),
        work_(asio::make_work_guard(completions_)),
        rng_(seed ^ 0x9e3779b97f4a7c15ull) {
    requests_.reserve(total);
    for (std::size_t i = 0; i < total; ++i) {
      requests_.push_back(std::make_unique<Request>());
      requests_.back()->seq = i;
    }
    resolved_.assign(total, false);
    completion_thread_ = std::thread([this] { completions_.run(); });
  }

  ~Harness() {
    work_.reset();
    completions_.stop();
    if (completion_thread_.joinable()) completion_thread_.join();
    finish();
  }

  fairgate::Limiter& limiter() { return limiter_; }
  std::size_t total() const { return requests_.size(); }

  /// Starts request number `seq` (arrival order) with the given options.
  /// Call with admit_mu held.
  void acquire_locked(std::uint64_t seq, std::chrono::milliseconds max_wait, bool short_wait,
                      std::optional<std::chrono::microseconds> cancel_after, bool tenant_is_seq) {
    Request* req = requests_[seq].get();
    req->short_wait = short_wait;
    req->cancel_after = cancel_after;
    AcquireOptions options;
    options.max_wait = max_wait;
    if (tenant_is_seq) options.tenant = std::to_string(seq);
    options.on_queued = [req](const QueueStatus& status) {
      if (req->ended.load()) ++req->updates_after_end;
      if (req->position_updates > 0 && status.position > req->last_position) req->position_went_up = true;
      req->last_position = status.position;
      ++req->position_updates;
    };
    limiter_.async_acquire(
        options, asio::bind_cancellation_slot(req->signal.slot(),
                                              asio::bind_executor(completions_, [this, req](AcquireResult r) {
                                                on_complete(*req, std::move(r));
                                              })));
  }

  /// After acquire_locked returned (lock may be released): schedules the cancel, if any.
  void schedule_cancel(std::uint64_t seq) {
    Request* req = requests_[seq].get();
    if (!req->cancel_after) return;
    auto timer = std::make_shared<asio::steady_timer>(completions_, *req->cancel_after);
    timer->async_wait([timer, req](boost::system::error_code) {
      req->cancel_emitted = true;
      req->signal.emit(asio::cancellation_type::terminal);
    });
  }

  std::mutex admit_mu;

  // Results, read after drain().
  std::atomic<std::size_t> done{0};
  std::atomic<std::size_t> granted{0};
  std::atomic<std::size_t> released{0};
  std::atomic<int> holding{0};
  std::atomic<int> max_holding{0};
  std::size_t fifo_violations = 0;         // C only
  std::vector<std::string> fifo_examples;  // C only: the first few
  std::vector<std::uint64_t> suspects;     // C only: unresolved earlier arrivals at a grant

  /// Waits until every request ended and every permit was returned.
  bool drain(std::chrono::seconds timeout) {
    const bool all_done = fairgate::test::wait_until([&] { return done.load() == total(); }, timeout);
    const bool all_released =
        fairgate::test::wait_until([&] { return released.load() == granted.load(); }, timeout);
    // Let C finish what it is doing, then stop it so its state can be read here.
    work_.reset();
    if (!all_done || !all_released) completions_.stop();  // pending handlers would keep it running
    completion_thread_.join();
    return all_done && all_released;
  }

  /// Shuts the backend down and stops its threads, so that what on_queued
  /// recorded can be read. snapshot() still works afterwards.
  void finish() {
    backend_->shutdown();
    hold_pool_.join();
    limiter_pool_.join();
  }

  const Request& request(std::uint64_t seq) const { return *requests_[seq]; }

 private:
  // Runs on C, in the limiter's decision order.
  void on_complete(Request& req, AcquireResult r) {
    req.ended = true;
    ++req.completions;
    req.outcome = r.outcome();
    req.reason = r.reason();
    if (r.granted()) check_fifo(req, r.permit().id());
    resolved_[req.seq] = true;
    while (low_ < resolved_.size() && resolved_[low_]) ++low_;
    if (r.granted()) {
      ++granted;
      // Counted from here to just before release(): a sub-interval of the
      // time the limiter counts the permit as held, so this count can only
      // be lower than the real number of holders, never higher.
      const int now_holding = ++holding;
      int seen = max_holding.load();
      while (now_holding > seen && !max_holding.compare_exchange_weak(seen, now_holding)) {
      }
      const auto hold = std::chrono::microseconds(std::uniform_int_distribution<int>(0, 2000)(rng_));
      auto timer = std::make_shared<asio::steady_timer>(hold_pool_, hold);
      timer->async_wait([this, timer, permit = r.take_permit()](boost::system::error_code) mutable {
        --holding;
        permit.release();
        ++released;
      });
    }
    ++done;
  }

  // FIFO, checked on C when request X is granted. Every request with a
  // smaller seq was admitted before X. If such a request Y has not been
  // resolved on C yet, its outcome was decided after X's grant, so Y was
  // still in the queue when X got its permit — a FIFO violation, with one
  // legitimate exception: Y's caller had already cancelled (the cancel wins
  // Y's ticket at once; the limiter removes Y under its lock a moment later,
  // and a dispatch in between skips Y). That cancel was emitted on C, before
  // X's grant was decided, so C has already seen it: cancel_emitted[Y] must
  // be true, and Y must end up cancelled (checked at the end). A granted Y
  // after X would be resolved later on C, so grants are also strictly
  // increasing in seq and in permit id.
  void violation(std::string what) {
    if (fifo_violations++ < 5) fifo_examples.push_back(std::move(what));
  }

  void check_fifo(const Request& x, const std::string& permit_id) {
    const std::uint64_t id = std::stoull(permit_id);
    if (last_granted_seq_ && x.seq <= *last_granted_seq_) {
      violation("request " + std::to_string(x.seq) + " granted after request " +
                std::to_string(*last_granted_seq_));
    }
    if (last_permit_id_ && id <= *last_permit_id_) {
      violation("permit id " + permit_id + " after " + std::to_string(*last_permit_id_));
    }
    last_granted_seq_ = x.seq;
    last_permit_id_ = id;
    for (std::uint64_t y = low_; y < x.seq; ++y) {
      if (resolved_[y]) continue;
      if (!requests_[y]->cancel_emitted) {
        violation("request " + std::to_string(x.seq) + " granted while earlier request " + std::to_string(y) +
                  " was still waiting");
      } else {
        suspects.push_back(y);
      }
    }
  }

  asio::thread_pool limiter_pool_{2};
  asio::thread_pool hold_pool_{2};
  std::shared_ptr<fairgate::Backend> backend_;
  fairgate::Limiter limiter_;
  asio::io_context completions_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread completion_thread_;
  std::vector<std::unique_ptr<Request>> requests_;
  // C only:
  std::mt19937_64 rng_;
  std::vector<bool> resolved_;
  std::uint64_t low_ = 0;
  std::optional<std::uint64_t> last_granted_seq_;
  std::optional<std::uint64_t> last_permit_id_;
};

// Checks every request ended exactly once, consistently with the counters.
void check_exactly_once(const Harness& h, const fairgate::Snapshot& s) {
  std::size_t missing = 0, duplicated = 0, granted = 0, timeouts = 0, cancels = 0, rejected = 0;
  std::size_t late_updates = 0;
  for (std::uint64_t i = 0; i < h.total(); ++i) {
    const Request& r = h.request(i);
    if (r.completions == 0) ++missing;
    if (r.completions > 1) ++duplicated;
    switch (r.outcome) {
      case Outcome::granted: ++granted; break;
      case Outcome::timed_out: ++timeouts; break;
      case Outcome::cancelled: ++cancels; break;
      case Outcome::rejected: ++rejected; break;
    }
    if (r.outcome == Outcome::cancelled) {
      EXPECT_TRUE(r.cancel_emitted) << "cancelled without a cancel: " << i;
    }
    if (r.outcome == Outcome::timed_out) {
      EXPECT_TRUE(r.short_wait) << "request " << i << " with a " << kLongWait.count()
                                << " s deadline timed out: grants stopped";
    }
    EXPECT_FALSE(r.position_went_up) << "request " << i << " was told a higher position later";
    late_updates += static_cast<std::size_t>(r.updates_after_end);
  }
  std::printf("on_queued calls after the outcome was delivered: %zu\n", late_updates);
  EXPECT_EQ(missing, 0u) << "requests that never completed";
  EXPECT_EQ(duplicated, 0u) << "requests that completed more than once";
  EXPECT_EQ(rejected, 0u) << "no request should be rejected here";
  EXPECT_EQ(s.in_use, 0u);
  EXPECT_EQ(s.queued, 0u);
  EXPECT_EQ(s.stats.acquires, h.total());
  EXPECT_EQ(s.stats.grants, granted);
  EXPECT_EQ(s.stats.timeouts, timeouts);
  EXPECT_EQ(s.stats.cancels, cancels);
  EXPECT_EQ(s.stats.rejections, rejected);
  EXPECT_EQ(s.stats.grants, s.stats.releases);
  EXPECT_EQ(s.stats.grants + s.stats.timeouts + s.stats.cancels + s.stats.rejections, s.stats.acquires);
}

void check_fifo_results(const Harness& h) {
  std::string examples;
  for (const auto& e : h.fifo_examples) examples += "\n  " + e;
  EXPECT_EQ(h.fifo_violations, 0u) << "FIFO violations, first ones:" << examples;
  for (std::uint64_t y : h.suspects) {
    EXPECT_EQ(h.request(y).outcome, Outcome::cancelled)
        << "request " << y << " was passed over but did not end cancelled";
  }
}

// --- F1 + F2 + F4 under load -------------------------------------------------------------

class MemoryStress : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(MemoryStress, CapFifoAndExactlyOneExit) {
  const std::uint32_t cap = GetParam();
  const std::uint64_t seed = stress_seed();
  const std::size_t total = scaled(4000);
  std::printf("cap %u, %zu requests, seed %llu\n", cap, total, static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));

  Settings settings;
  settings.max_concurrent = cap;
  Harness h(settings, total, seed);
  auto lim = h.limiter();

  // A sampler: every snapshot is one consistent instant.
  std::atomic<bool> stop_sampling{false};
  std::atomic<std::size_t> max_in_use{0}, samples{0}, bad_samples{0};
  std::thread sampler([&] {
    while (!stop_sampling.load()) {
      const auto s = lim.snapshot();
      ++samples;
      max_in_use = std::max<std::size_t>(max_in_use.load(), s.in_use);
      bool ok = s.in_use <= cap && s.holders.size() == s.in_use && s.waiters.size() == s.queued;
      for (std::size_t i = 0; i < s.waiters.size(); ++i) ok = ok && s.waiters[i].position == i + 1;
      if (!ok) ++bad_samples;
      std::this_thread::sleep_for(200us);
    }
  });

  std::uint64_t next_seq = 0;
  std::vector<std::thread> requesters;
  for (int t = 0; t < kRequesters; ++t) {
    requesters.emplace_back([&, t] {
      std::mt19937_64 rng(seed + 1000 + static_cast<std::uint64_t>(t));
      auto chance = [&](int percent) { return std::uniform_int_distribution<int>(0, 99)(rng) < percent; };
      const std::size_t mine =
          total / kRequesters + (static_cast<std::size_t>(t) < total % kRequesters ? 1 : 0);
      for (std::size_t k = 0; k < mine; ++k) {
        std::this_thread::sleep_for(
            std::chrono::microseconds(std::uniform_int_distribution<int>(0, 400)(rng)));
        const bool short_wait = chance(15);
        const auto max_wait =
            short_wait ? std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 5)(rng)) : kLongWait;
        std::optional<std::chrono::microseconds> cancel_after;
        if (chance(10))
          cancel_after = std::chrono::microseconds(std::uniform_int_distribution<int>(0, 3000)(rng));
        std::uint64_t seq;
        {
          std::lock_guard lock(h.admit_mu);
          seq = next_seq++;
          h.acquire_locked(seq, max_wait, short_wait, cancel_after, /*tenant_is_seq=*/false);
        }
        h.schedule_cancel(seq);
      }
    });
  }
  for (auto& t : requesters) t.join();
  ASSERT_EQ(next_seq, total);
  const bool drained = h.drain(60s);
  stop_sampling = true;
  sampler.join();
  h.finish();
  ASSERT_TRUE(drained) << "done " << h.done.load() << " of " << total << ", released " << h.released.load()
                       << " of " << h.granted.load();

  EXPECT_LE(h.max_holding.load(), static_cast<int>(cap)) << "F1: more holders than the cap at once";
  EXPECT_LE(max_in_use.load(), cap);
  EXPECT_EQ(bad_samples.load(), 0u) << "of " << samples.load() << " snapshots";
  check_fifo_results(h);
  const auto s = lim.snapshot();
  check_exactly_once(h, s);
  if (total >= 1000) {
    // The load must have reached the paths under test (a tiny scale may not).
    EXPECT_GT(s.stats.timeouts, 0u);
    EXPECT_GT(s.stats.cancels, 0u);
    EXPECT_EQ(max_in_use.load(), cap) << "the load never reached the cap";
  }
  std::printf("grants %llu timeouts %llu cancels %llu, max holders seen %d, passed-over cancelled %zu\n",
              static_cast<unsigned long long>(s.stats.grants),
              static_cast<unsigned long long>(s.stats.timeouts),
              static_cast<unsigned long long>(s.stats.cancels), h.max_holding.load(), h.suspects.size());
}

INSTANTIATE_TEST_SUITE_P(Caps, MemoryStress, ::testing::Values(3u, 8u));

// --- F9 under load -------------------------------------------------------------------------
//
// A configurer thread moves max_concurrent randomly within [1, kMaxCap] while
// requests flow. A held permit may outlive a lowering, so "holders <= cap"
// is not a valid check at any instant; what must hold is that no NEW grant
// happens while in_use >= the cap in force. It is checked from snapshots:
//
//   Every event that matters — an admission (async_acquire), a configure, a
//   snapshot — happens under `admit_mu` and gets the next log position. In a
//   snapshot taken at position P, the holders are listed in grant order
//   h1..hk. When h_i was granted, h1..h_{i-1} (granted earlier, still held at
//   P) were all holding, so i - 1 < cap at that grant, i.e. i <= that cap.
//   That grant happened between h_i's admission A_i and P, so
//     i <= the largest cap in force anywhere in [A_i, P].
//   (h_i's tenant is its seq, which gives A_i.)
TEST(MemoryStressHotConfig, NoGrantBeyondTheCapInForceAndGrantsResumeAfterRaising) {
  constexpr std::uint32_t kMaxCap = 8;
  const std::uint64_t seed = stress_seed();
  const std::size_t total = scaled(3000);
  std::printf("%zu requests, seed %llu\n", total, static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));

  Settings settings;
  settings.max_concurrent = 3;
  Harness h(settings, total, seed);
  auto lim = h.limiter();

  // All guarded by h.admit_mu.
  std::uint64_t log_pos = 0;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> caps = {{0, settings.max_concurrent}};
  std::vector<std::uint64_t> admitted_at(total, 0);
  std::uint64_t next_seq = 0;
  std::size_t window_violations = 0, setting_mismatches = 0, snapshots = 0, configures = 0;
  std::string first_violation;

  // The largest cap in force at any point of [from, to].
  auto max_cap = [&](std::uint64_t from, std::uint64_t to) {
    auto it = std::upper_bound(caps.begin(), caps.end(), from,
                               [](std::uint64_t v, const auto& c) { return v < c.first; });
    std::uint32_t m = std::prev(it)->second;  // in force at `from`
    for (; it != caps.end() && it->first <= to; ++it) m = std::max(m, it->second);
    return m;
  };

  std::atomic<bool> stop{false};
  std::thread configurer([&] {
    std::mt19937_64 rng(seed + 7);
    while (!stop.load()) {
      std::this_thread::sleep_for(
          std::chrono::microseconds(std::uniform_int_distribution<int>(100, 2000)(rng)));
      SettingsUpdate u;
      u.max_concurrent = std::uniform_int_distribution<std::uint32_t>(1, kMaxCap)(rng);
      std::lock_guard lock(h.admit_mu);
      EXPECT_TRUE(lim.configure(u).has_value());
      caps.emplace_back(++log_pos, *u.max_concurrent);
      ++configures;
    }
  });
  std::thread sampler([&] {
    while (!stop.load()) {
      std::this_thread::sleep_for(300us);
      std::lock_guard lock(h.admit_mu);
      const std::uint64_t p = ++log_pos;
      const auto s = lim.snapshot();
      ++snapshots;
      if (s.settings.max_concurrent != caps.back().second) ++setting_mismatches;
      for (std::size_t i = 0; i < s.holders.size(); ++i) {
        const std::uint64_t seq = std::stoull(s.holders[i].tenant);
        const std::uint32_t allowed = max_cap(admitted_at[seq], p);
        if (i + 1 > allowed) {
          if (window_violations++ == 0) {
            first_violation = "holder #" + std::to_string(i + 1) + " (request " + std::to_string(seq) +
                              ") granted while the cap never exceeded " + std::to_string(allowed);
          }
        }
      }
    }
  });

  std::vector<std::thread> requesters;
  for (int t = 0; t < kRequesters; ++t) {
    requesters.emplace_back([&, t] {
      std::mt19937_64 rng(seed + 2000 + static_cast<std::uint64_t>(t));
      auto chance = [&](int percent) { return std::uniform_int_distribution<int>(0, 99)(rng) < percent; };
      const std::size_t mine =
          total / kRequesters + (static_cast<std::size_t>(t) < total % kRequesters ? 1 : 0);
      for (std::size_t k = 0; k < mine; ++k) {
        std::this_thread::sleep_for(
            std::chrono::microseconds(std::uniform_int_distribution<int>(0, 500)(rng)));
        const bool short_wait = chance(10);
        const auto max_wait =
            short_wait ? std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 5)(rng)) : kLongWait;
        std::optional<std::chrono::microseconds> cancel_after;
        if (chance(5))
          cancel_after = std::chrono::microseconds(std::uniform_int_distribution<int>(0, 3000)(rng));
        std::uint64_t seq;
        {
          std::lock_guard lock(h.admit_mu);
          seq = next_seq++;
          admitted_at[seq] = ++log_pos;
          h.acquire_locked(seq, max_wait, short_wait, cancel_after, /*tenant_is_seq=*/true);
        }
        h.schedule_cancel(seq);
      }
    });
  }
  for (auto& t : requesters) t.join();

  // Raise the cap for good: every remaining waiter must now be served
  // (they have 60 s deadlines, so none may time out).
  stop = true;
  configurer.join();
  sampler.join();
  {
    std::lock_guard lock(h.admit_mu);
    SettingsUpdate u;
    u.max_concurrent = kMaxCap;
    ASSERT_TRUE(lim.configure(u).has_value());
    caps.emplace_back(++log_pos, kMaxCap);
  }
  const bool drained = h.drain(60s);
  h.finish();
  ASSERT_TRUE(drained) << "done " << h.done.load() << " of " << total << ", released " << h.released.load()
                       << " of " << h.granted.load();

  EXPECT_EQ(window_violations, 0u) << first_violation;
  EXPECT_EQ(setting_mismatches, 0u) << "snapshot settings differ from the last configure";
  EXPECT_LE(h.max_holding.load(), static_cast<int>(kMaxCap)) << "more holders than any cap ever set";
  check_fifo_results(h);
  const auto s = lim.snapshot();
  check_exactly_once(h, s);
  if (total >= 1000) {
    EXPECT_GT(configures, 20u) << "too few config changes to mean anything";
    EXPECT_GT(snapshots, 20u);
  }
  std::printf("configures %zu, snapshots %zu, grants %llu, timeouts %llu, cancels %llu, max holders %d\n",
              configures, snapshots, static_cast<unsigned long long>(s.stats.grants),
              static_cast<unsigned long long>(s.stats.timeouts),
              static_cast<unsigned long long>(s.stats.cancels), h.max_holding.load());
}

}  // namespace
