#include "bench/worker.hpp"

#include "bench/record.hpp"
#include "redis/redis_limiter.hpp"

#include <fairgate/fairgate.hpp>
#include <fairgate/redis_backend.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

namespace fairgate::bench {
namespace {

namespace asio = boost::asio;
using std::chrono::milliseconds;

class Worker : public std::enable_shared_from_this<Worker> {
 public:
  Worker(asio::io_context& io, WorkerOptions options)
      : io_(io), options_(std::move(options)), rng_(options_.seed) {}

  void start() {
    RedisBackendOptions o;
    o.url = options_.redis_url;
    o.key_prefix = options_.key_prefix;
    o.instance_id = options_.instance_id;
    o.heartbeat_interval = options_.heartbeat_interval;
    o.liveness_ttl = options_.liveness_ttl;
    o.command_timeout = options_.command_timeout;
    o.key_expiry = std::chrono::minutes(10);
    o.recovery_fence = options_.recovery_fence;
    o.degrade_after = options_.degrade_after;
    o.recover_after = options_.recover_after;
    backend_ = make_redis_backend(io_.get_executor(), o);
    Settings settings;
    settings.max_concurrent = options_.max_concurrent;
    settings.max_wait = std::chrono::minutes(10);
    settings.tenant_fairness = options_.tenant_fairness;
    settings.max_per_tenant = options_.max_per_tenant;
    settings.on_redis_down = parse_redis_down_policy(options_.on_redis_down).value_or(RedisDownPolicy::local);
    settings.local_share = options_.local_share;
    auto opened = backend_->open(options_.limiter, settings);
    if (!opened) throw std::runtime_error(opened.error().message());
    limiter_ = *opened;
    impl_ = redis::redis_limiter_of(*backend_, options_.limiter);
    started_ = std::chrono::steady_clock::now();
    poll_ready();
  }

  void command(const std::string& line) {
    if (line == "go") {
      go();
    } else if (line == "hold") {
      hold();
    } else if (line == "release") {
      release_held();
    } else if (line == "mark") {
      event(fmt::format(R"({{"ev":"mark","t":{},"commands":{}}})", now_ns(), commands()));
    } else if (line == "status") {
      status();
    } else if (line == "stop") {
      // Closed loop: no new requests; "done" once the running ones ended.
      if (!stopped_) {
        stopped_ = true;
        if (going_ && outstanding_ == 0) finish();
      }
    } else if (line == "exit") {
      exit();
    } else {
      event(fmt::format(R"({{"ev":"error","message":"unknown command: {}"}})", line.substr(0, 40)));
    }
  }

  void exit() {
    if (exiting_) return;
    exiting_ = true;
    held_.clear();
    for (auto& r : live_) {
      if (r->waiting) r->cancel.emit(asio::cancellation_type::terminal);
    }
    std::fflush(stdout);
    if (backend_) backend_->shutdown();
    // The backend finishes its last commands; the io_context then runs out of work.
    backend_.reset();
    impl_.reset();
    limiter_ = Limiter{};
    guard_.reset();
  }

 private:
  struct Request {
    RequestRecord record;
    asio::cancellation_signal cancel;
    std::optional<asio::steady_timer> timer;
    bool waiting = true;
    bool answered = false;  // queued or ended: Redis has seen it
    std::size_t client = 0;
  };
  using RequestPtr = std::shared_ptr<Request>;

  std::uint64_t commands() const { return impl_ ? impl_->commands_sent() : 0; }

  void event(const std::string& line) {
    std::fputs(line.c_str(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }

  void poll_ready() {
    if (impl_ && impl_->ready()) {
      event(fmt::format(R"({{"ev":"ready","inst":"{}","commands":{}}})", options_.instance_id, commands()));
      return;
    }
    if (std::chrono::steady_clock::now() - started_ > std::chrono::seconds(15)) {
      event(R"({"ev":"error","message":"not ready after 15 s: is Redis reachable?"})");
      exit();
      return;
    }
    auto timer = std::make_shared<asio::steady_timer>(io_, milliseconds(5));
    timer->async_wait([self = shared_from_this(), timer](boost::system::error_code) { self->poll_ready(); });
  }

  milliseconds random_between(milliseconds lo, milliseconds hi) {
    if (hi <= lo) return lo;
    return milliseconds(std::uniform_int_distribution<long>(lo.count(), hi.count())(rng_));
  }
  bool chance(double p) { return p > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  void go() {
    if (going_) return;
    going_ = true;
    go_at_ = std::chrono::steady_clock::now();
    if (options_.closed_loop) {
      for (std::size_t c = 0; c < options_.clients; ++c) launch(next_index_++, c, milliseconds(0));
      if (options_.clients == 0) finish();
      return;
    }
    std::vector<milliseconds> offsets;
    for (std::size_t i = 0; i < options_.requests; ++i)
      offsets.push_back(options_.spread.count() > 0
                            ? random_between(milliseconds(0), options_.spread - milliseconds(1))
                            : milliseconds(0));
    std::sort(offsets.begin(), offsets.end());
    for (std::size_t i = 0; i < offsets.size(); ++i) launch(next_index_++, 0, offsets[i]);
    if (options_.requests == 0) finish();
  }

  void launch(std::uint64_t index, std::size_t client, milliseconds after) {
    auto request = std::make_shared<Request>();
    request->record.instance = options_.instance_id;
    request->record.index = index;
    request->client = client;
    ++outstanding_;
    if (after.count() == 0) {
      acquire(request);
      return;
    }
    request->timer.emplace(io_, after);
    request->timer->async_wait(
        [self = shared_from_this(), request](boost::system::error_code) { self->acquire(request); });
  }

  void acquire(const RequestPtr& request) {
    AcquireOptions o;
    o.max_wait = options_.max_wait;
    o.tenant = options_.tenant;
    const bool short_wait = !options_.closed_loop && chance(options_.timeout_fraction);
    if (short_wait) o.max_wait = random_between(milliseconds(10), milliseconds(100));
    const bool cancel = !options_.closed_loop && !short_wait && chance(options_.cancel_fraction);
    std::weak_ptr<Request> weak = request;
    auto self = shared_from_this();
    o.on_queued = [self, weak](const QueueStatus& status) {
      if (auto r = weak.lock()) {
        if (r->waiting) r->record.queued = true;
        r->record.sequence = status.sequence;
        self->answered(*r);
      }
    };
    live_.push_back(request);
    request->record.arrive_ns = now_ns();
    limiter_.async_acquire(
        o, asio::bind_cancellation_slot(request->cancel.slot(), [self, request](AcquireResult r) {
          self->on_result(request, std::move(r));
        }));
    if (cancel) {
      request->timer.emplace(io_, random_between(milliseconds(5), milliseconds(150)));
      request->timer->async_wait([request](boost::system::error_code ec) {
        if (!ec && request->waiting) request->cancel.emit(asio::cancellation_type::terminal);
      });
    }
  }

  void status() {
    if (!limiter_.valid()) return;
    const Snapshot snap = limiter_.snapshot();
    const auto& e = snap.engine;
    const BackendHealth health = backend_ ? backend_->health() : BackendHealth{};
    // The permit ids held and waiting ("inst|n": [A-Za-z0-9._-] and '|', nothing to escape),
    // so a test can check that Redis has exactly these, not merely as many.
    const auto ids = [](const auto& items, auto id_of) {
      std::string out = "[";
      for (const auto& item : items) {
        if (out.size() > 1) out += ',';
        out += '"' + id_of(item) + '"';
      }
      return out + ']';
    };
    const std::string held = ids(snap.holders, [](const HolderInfo& h) { return h.permit; });
    const std::string waiting = ids(snap.waiters, [](const WaiterInfo& w) { return w.ticket; });
    event(fmt::format(
        R"({{"ev":"status","t":{},"degraded":{},"local_cap":{},"fence_left_ms":{},"restores":{},"recreations":{},"redis_switches":{},)"
        R"("degraded_entries":{},"overshoot_restored":{},"settings_source":"{}","in_use":{},"queued":{},)"
        R"("holders":{},"waiters":{},"max_concurrent":{},"lost_wakes_recovered":{},"orphans_released":{},)"
        R"("error_replies":{},"command_timeouts":{},"disconnects":{},"instance_id_shared":{},"held":{},"waiting":{}}})",
        now_ns(), e.degraded ? "true" : "false", e.local_cap, e.fence_left.count(), e.restores,
        e.state_recreations, e.redis_switches, e.degraded_entries, e.overshoot_restored, e.settings_source,
        snap.in_use, snap.queued, snap.holders.size(), snap.waiters.size(), snap.settings.max_concurrent,
        impl_ ? impl_->lost_wakes_recovered() : 0, impl_ ? impl_->orphans_released() : 0,
        health.error_replies, health.timeouts, health.disconnects, e.instance_id_shared, held, waiting));
  }

  /// With `announce`, the release is on the wire before Redis can hand the
  /// permit on: a parent that kills us never counts it as held too long.
  void announce_release(const RequestRecord& rec) {
    if (options_.announce)
      event(fmt::format(R"({{"ev":"release","i":{},"t":{}}})", rec.index, rec.release_ns));
  }

  void answered(Request& r) {
    if (r.answered) return;
    r.answered = true;
    if (++answered_ == options_.requests && !options_.closed_loop) event(R"({"ev":"queued_all"})");
  }

  void on_result(const RequestPtr& request, AcquireResult result) {
    request->waiting = false;
    if (request->timer) request->timer->cancel();
    answered(*request);
    auto& rec = request->record;
    if (result.granted()) {
      rec.grant_ns = now_ns();
      rec.outcome = "granted";
      if (options_.announce) event(fmt::format(R"({{"ev":"grant","i":{},"t":{}}})", rec.index, rec.grant_ns));
      const milliseconds hold = random_between(options_.hold_min, options_.hold_max);
      if (hold.count() == 0 || exiting_) {
        rec.release_ns = now_ns();
        announce_release(rec);
        result.permit().release();
        ended(request);
        return;
      }
      auto permit = std::make_shared<Permit>(result.take_permit());
      request->timer.emplace(io_, hold);
      request->timer->async_wait([self = shared_from_this(), request, permit](boost::system::error_code) {
        request->record.release_ns = now_ns();
        self->announce_release(request->record);
        permit->release();
        self->ended(request);
      });
      return;
    }
    rec.outcome = std::string(to_string(result.outcome()));
    rec.reason = std::string(to_string(result.reason()));
    rec.end_ns = now_ns();
    ended(request);
  }

  void ended(const RequestPtr& request) {
    const std::string line = to_json(request->record) + "\n";
    std::fputs(line.c_str(), stdout);
    std::erase(live_, request);
    --outstanding_;
    if (options_.closed_loop && !exiting_ && !stopped_ &&
        std::chrono::steady_clock::now() - go_at_ < options_.duration) {
      const bool pause = !request->record.granted() && options_.reject_pause.count() > 0;
      launch(next_index_++, request->client, pause ? options_.reject_pause : milliseconds(0));
      return;
    }
    if (outstanding_ == 0) finish();
  }

  void finish() {
    event(fmt::format(R"({{"ev":"done","t":{},"commands":{},"lost_wakes_recovered":{},"requests":{}}})",
                      now_ns(), commands(), impl_ ? impl_->lost_wakes_recovered() : 0, next_index_));
  }

  void hold() {
    for (std::size_t i = 0; i < options_.holders; ++i) {
      AcquireOptions o;
      o.max_wait = std::chrono::minutes(1);
      o.tenant = options_.tenant;
      limiter_.async_acquire(o, [self = shared_from_this()](AcquireResult r) {
        if (!r.granted()) {
          self->event(fmt::format(R"({{"ev":"error","message":"hold: {}"}})", r.message()));
          return;
        }
        self->held_.push_back(r.take_permit());
        if (self->held_.size() == self->options_.holders)
          self->event(fmt::format(R"({{"ev":"holding","t":{},"n":{}}})", now_ns(), self->held_.size()));
      });
    }
  }

  void release_held() {
    const auto t = now_ns();
    held_.clear();
    event(fmt::format(R"({{"ev":"released","t":{}}})", t));
  }

  asio::io_context& io_;
  WorkerOptions options_;
  std::mt19937_64 rng_;
  std::shared_ptr<Backend> backend_;
  Limiter limiter_;
  std::shared_ptr<redis::RedisLimiter> impl_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard_{io_.get_executor()};
  std::chrono::steady_clock::time_point started_{}, go_at_{};
  bool going_ = false, exiting_ = false, stopped_ = false;
  std::uint64_t next_index_ = 0;
  std::size_t outstanding_ = 0, answered_ = 0;
  std::vector<RequestPtr> live_;
  std::vector<Permit> held_;
};

}  // namespace

int run_worker(const WorkerOptions& options) {
  asio::io_context io;
  auto worker = std::make_shared<Worker>(io, options);
  worker->start();
  // Commands arrive on stdin; a reader thread hands each line to the io_context.
  std::thread reader([&io, worker] {
    std::string line;
    while (std::getline(std::cin, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      asio::post(io, [worker, line] { worker->command(line); });
      if (line == "exit") return;
    }
    asio::post(io, [worker] { worker->exit(); });
  });
  reader.detach();  // it may block in getline after "exit"; the process ends anyway
  io.run();
  std::fflush(stdout);
  return 0;
}

}  // namespace fairgate::bench
