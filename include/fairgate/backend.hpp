// fairgate/backend.hpp — where limiters live: in this process (memory) or,
// later, shared through Redis. Both give the same guarantees.
#pragma once

#include <fairgate/limiter.hpp>
#include <fairgate/settings.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/system/result.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

namespace fairgate {

/// How a backend reaches its shared state (Backend::health).
struct BackendHealth {
  /// False for the memory backend: there is nothing remote to reach.
  bool remote = false;
  /// The connections to Redis are up (always true without a remote).
  bool connected = true;
  /// Redis client errors so far: command timeouts, disconnects, error replies.
  std::uint64_t errors = 0;
  std::uint64_t timeouts = 0;       ///< commands without a reply in time
  std::uint64_t disconnects = 0;    ///< commands lost with a connection, or sent while there was none
  std::uint64_t error_replies = 0;  ///< commands Redis answered with an error, or a reply of the wrong shape
  /// Limiters running on their on_redis_down policy (Redis unreachable).
  std::size_t degraded_limiters = 0;
};

/// A set of named limiters (F10) sharing one executor.
///
/// Thread-safety: all member functions may be called from any thread.
/// Lifetime: destroy (or shutdown()) the backend before the io_context its
/// executor belongs to. Limiter handles and Permits keep their limiter alive.
class Backend {
 public:
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  virtual ~Backend() = default;

  /// "memory" or "redis".
  virtual std::string_view kind() const noexcept = 0;

  /// The limiter `name`, created with `settings` if it does not exist yet (an
  /// existing limiter keeps its settings; change them with Limiter::configure).
  /// Fails with the offending field when the name or the settings are invalid.
  virtual boost::system::result<Limiter, SettingsError> open(std::string_view name,
                                                             const Settings& settings) = 0;

  /// The limiter `name`, if it exists.
  virtual std::optional<Limiter> find(std::string_view name) const = 0;

  /// Every limiter, sorted by name.
  virtual std::vector<Limiter> limiters() const = 0;

  /// Whether the shared state is reachable, for health checks and metrics.
  virtual BackendHealth health() const { return {}; }

  /// Ends every waiting request with RejectReason::shutdown and rejects new
  /// ones. Held permits stay valid until their owners release them.
  /// Idempotent.
  virtual void shutdown() = 0;
};

/// The in-process backend, the embedded default: all guarantees within one
/// process. Timers and on_queued callbacks run on `executor`.
std::shared_ptr<Backend> make_memory_backend(boost::asio::any_io_executor executor);

}  // namespace fairgate
