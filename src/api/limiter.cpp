#include "api/outcome.hpp"
#include "api/shadow.hpp"
#include "core/acquire_rules.hpp"

#include <fairgate/detail/limiter_impl.hpp>
#include <fairgate/limiter.hpp>

#include <boost/asio/post.hpp>

#include <algorithm>
#include <cassert>
#include <stdexcept>

namespace fairgate {

std::string_view to_string(Outcome outcome) noexcept {
  switch (outcome) {
    case Outcome::granted: return "granted";
    case Outcome::timed_out: return "timed_out";
    case Outcome::cancelled: return "cancelled";
    case Outcome::rejected: return "rejected";
  }
  return "?";
}

AcquireResult AcquireResult::granted(Permit permit) {
  AcquireResult r;
  r.outcome_ = Outcome::granted;
  r.waited_ = permit.waited();
  r.permit_ = std::move(permit);
  return r;
}

AcquireResult AcquireResult::ended(RejectReason reason, std::string message,
                                   std::chrono::milliseconds waited) {
  AcquireResult r;
  switch (reason) {
    case RejectReason::timeout: r.outcome_ = Outcome::timed_out; break;
    case RejectReason::cancelled: r.outcome_ = Outcome::cancelled; break;
    default: r.outcome_ = Outcome::rejected; break;
  }
  r.reason_ = reason;
  r.message_ = std::move(message);
  r.waited_ = waited;
  return r;
}

boost::system::error_code AcquireResult::error() const noexcept {
  if (granted()) return {};
  return make_error_code(reason_);
}

const std::shared_ptr<detail::LimiterImpl>& Limiter::checked_impl() const {
  if (!impl_) throw std::logic_error("fairgate::Limiter: use of an empty handle");
  return impl_;
}

const std::string& Limiter::name() const { return checked_impl()->name(); }

Limiter::executor_type Limiter::get_executor() const { return checked_impl()->get_executor(); }

Snapshot Limiter::snapshot() const {
  const auto& impl = checked_impl();
  Snapshot s = impl->snapshot();
  s.shadow = impl->shadow_run().status();
  return s;
}

Settings Limiter::settings() const { return checked_impl()->settings(); }

boost::system::result<Settings, SettingsError> Limiter::configure(const SettingsUpdate& update) {
  return checked_impl()->configure(update);
}

namespace detail {

LimiterImpl::LimiterImpl() : shadow_(make_shadow_run()) {}

void LimiterImpl::settings_changed(const Settings& before, const Settings& after) {
  const auto shadowing = [](const Settings& s) { return s.enabled && s.mode == LimiterMode::shadow; };
  if (shadowing(before) || !shadowing(after)) return;
  boost::asio::post(get_executor(), [self = std::weak_ptr<LimiterImpl>(weak_from_this()), shadowing] {
    // Still in shadow mode: back on enforce meanwhile, the waiters wait for their seats.
    if (auto s = self.lock(); s && shadowing(s->settings())) s->shadow_run().let_through(*s);
  });
}

void LimiterImpl::start_configure(const SettingsUpdate& update,
                                  std::unique_ptr<ConfigureCompletion> completion) {
  ConfigureResult r;
  auto applied = configure(update);
  if (applied) {
    r.settings = *applied;
  } else {
    r.error = make_error_code(Errc::invalid_settings);
    r.message = applied.error().message();
    r.settings = settings();
  }
  completion->complete(std::move(r));
}

void LimiterImpl::start_status(const StatusQuery& query, std::unique_ptr<StatusCompletion> completion) {
  StatusResult r;
  r.snapshot = snapshot();
  r.snapshot.shadow = shadow_run().status();
  r.offset = query.offset;
  r.limit = query.limit;
  const auto page = [&](auto& list) {
    const std::size_t from = std::min(query.offset, list.size());
    const std::size_t to = from + std::min(query.limit, list.size() - from);
    list.erase(list.begin() + static_cast<std::ptrdiff_t>(to), list.end());
    list.erase(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(from));
  };
  page(r.snapshot.holders);
  page(r.snapshot.waiters);
  completion->complete(std::move(r));
}

void start_status(LimiterImpl& impl, StatusQuery query, std::unique_ptr<StatusCompletion> completion) {
  query.limit = std::min(query.limit, kMaxStatusLimit);
  impl.start_status(query, std::move(completion));
}

void start_configure(LimiterImpl& impl, const SettingsUpdate& update,
                     std::unique_ptr<ConfigureCompletion> completion) {
  impl.start_configure(update, std::move(completion));
}

boost::asio::any_io_executor executor_of(const LimiterImpl& impl) { return impl.get_executor(); }

AcquireResult end_request(LimiterStats& stats, RejectReason reason, std::chrono::milliseconds waited,
                          std::chrono::milliseconds max_wait, std::string message, const Settings& settings) {
  switch (reason) {
    case RejectReason::timeout: ++stats.timeouts; break;
    case RejectReason::cancelled: ++stats.cancels; break;
    default: ++stats.rejections; break;
  }
  ++stats.by_reason[static_cast<std::size_t>(reason)];
  if (message.empty()) message = core::ended_message(reason, waited, max_wait, settings);
  return AcquireResult::ended(reason, std::move(message), waited);
}

void start_acquire(LimiterImpl& impl, AcquireOptions options, std::unique_ptr<Completion> completion,
                   boost::asio::cancellation_slot slot) {
  // Shadow mode (F14; api/shadow.hpp): let it through, acquire a shadow. What
  // the limiter would refuse whatever the load (bad options, shut down) it
  // refuses as in enforce mode.
  const Settings settings = impl.settings();
  if (settings.enabled && settings.mode == LimiterMode::shadow && !impl.shut_down() &&
      core::effective_max_wait(options.max_wait, settings, options.tenant, options.weight)) {
    impl.shadow_run().start(impl, std::move(options), std::move(completion));
    return;
  }
  // Tracked, so that a switch to shadow mode while it waits lets it through.
  completion = impl.shadow_run().track(options, std::move(completion));
  impl.start_acquire(std::move(options), std::move(completion), slot);
}

void release_permit(LimiterImpl& impl, const std::string& id) noexcept {
  if (!impl.shadow_run().release(id)) impl.release(id);
}

}  // namespace detail
}  // namespace fairgate
