// fairgate/detail/limiter_impl.hpp — the interface every backend implements
// for one limiter. Users see it only through Limiter and Permit.
#pragma once

#include <fairgate/limiter.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>

#include <memory>
#include <string>

namespace fairgate::detail {

/// Shadow mode's bookkeeping of one limiter (src/api/shadow.hpp).
class ShadowRun;

class LimiterImpl : public std::enable_shared_from_this<LimiterImpl> {
 public:
  LimiterImpl();
  LimiterImpl(const LimiterImpl&) = delete;
  LimiterImpl& operator=(const LimiterImpl&) = delete;
  virtual ~LimiterImpl() = default;

  virtual const std::string& name() const noexcept = 0;
  virtual boost::asio::any_io_executor get_executor() const = 0;

  /// Starts one acquire. The backend must call completion->complete() exactly
  /// once, and must install a handler on `slot` (when connected) that cancels
  /// the request while it waits.
  virtual void start_acquire(AcquireOptions options, std::unique_ptr<Completion> completion,
                             boost::asio::cancellation_slot slot) = 0;

  /// Returns permit `id`. Idempotent: unknown or already returned ids are ignored.
  virtual void release(const std::string& id) noexcept = 0;

  virtual Snapshot snapshot() const = 0;
  virtual Settings settings() const = 0;
  virtual boost::system::result<Settings, SettingsError> configure(const SettingsUpdate& update) = 0;

  /// Applies `update` and completes once it is in force (see
  /// Limiter::async_configure). Default: configure(), which is synchronous.
  virtual void start_configure(const SettingsUpdate& update, std::unique_ptr<ConfigureCompletion> completion);

  /// The limiter's status, paged (see Limiter::async_status; `query.limit`
  /// already capped). Default: snapshot() sliced, with shadow_run()'s figures.
  virtual void start_status(const StatusQuery& query, std::unique_ptr<StatusCompletion> completion);

  /// True once the backend was shut down (new requests are rejected).
  virtual bool shut_down() const noexcept = 0;

  /// Shadow mode (LimiterMode::shadow), the same for every backend: the
  /// requests it let through and their shadows on this limiter.
  ShadowRun& shadow_run() const noexcept { return *shadow_; }

 protected:
  /// Backends call this whenever their settings change (any thread, any lock
  /// held: it only posts): a switch to shadow mode lets the waiting requests
  /// through (ShadowRun::let_through).
  void settings_changed(const Settings& before, const Settings& after);

 private:
  std::shared_ptr<ShadowRun> shadow_;
};

/// Returns permit `id` of `impl`: a request shadow mode let through, or one of
/// the backend's permits.
void release_permit(LimiterImpl& impl, const std::string& id) noexcept;

}  // namespace fairgate::detail
