// fairgate/settings.hpp — the settings of one limiter, their validation, and
// partial updates (hot config, F9).
//
// Settings are plain values. validate() is the single place that decides what
// is acceptable; every entry point (C++ API, CLI flags, config file, HTTP admin)
// goes through it so the error text is the same everywhere.
#pragma once

#include <boost/assert/source_location.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fairgate {

/// What a disabled limiter (enabled = false) does with new requests (F11).
enum class DisabledMode : std::uint8_t {
  pass_through,  ///< grant at once whatever the cap (counted, never queued)
  reject,        ///< reject with RejectReason::disabled
};

std::string_view to_string(DisabledMode mode) noexcept;

/// Whether a limiter enforces its cap or only reports what it would do (F14;
/// docs/shadow.md).
enum class LimiterMode : std::uint8_t {
  enforce,  ///< queue and reject as the settings say
  /// Let every request through at once, while a shadow of each one acquires
  /// from the limiter as if it were enforcing and holds as long as the real
  /// request did: the limiter's queue, counters and ShadowStatus then say what
  /// enforcing would have done (would-be waits, timeouts, rejections).
  shadow,
};

std::string_view to_string(LimiterMode mode) noexcept;
/// "enforce" | "shadow" → the mode; nullopt for anything else.
std::optional<LimiterMode> parse_limiter_mode(std::string_view text) noexcept;

/// What a limiter of the Redis backend does on this instance while Redis is
/// unreachable (D1; docs/design.md, "Degraded modes"). The memory backend has
/// nothing remote and ignores it.
enum class RedisDownPolicy : std::uint8_t {
  /// Keep serving this instance's own waiters, in order, with the seats this
  /// instance held when Redis went away (a permit released frees a seat for the
  /// next local waiter) — or with `local_share` seats when set. Cap-safe while
  /// Redis is away for every instance; see the docs for a partition of one.
  local,
  open,    ///< grant every request at once (the cap is not enforced meanwhile)
  closed,  ///< reject new requests at once with RejectReason::unavailable
};

std::string_view to_string(RedisDownPolicy policy) noexcept;
/// "local" | "open" | "closed" → the policy; nullopt for anything else.
std::optional<RedisDownPolicy> parse_redis_down_policy(std::string_view text) noexcept;

/// Bounds enforced by validate(); exposed so front ends can print them.
inline constexpr std::uint32_t kMaxConcurrentLimit = 1'000'000;
inline constexpr std::uint32_t kMaxQueueLimit = 10'000'000;
inline constexpr std::chrono::milliseconds kMaxWaitLimit = std::chrono::hours(24);
inline constexpr std::size_t kMaxNameLength = 64;
/// Largest share weight of one acquire (AcquireOptions::weight), F12.
inline constexpr std::uint32_t kMaxTenantWeight = 1'000;
/// Longest tenant key (AcquireOptions::tenant), in characters.
inline constexpr std::size_t kMaxTenantLength = 128;

/// The one tenant rule, everywhere a tenant enters (AcquireOptions::tenant,
/// the HTTP `tenant` parameter, a gateway's tenant header): 1..kMaxTenantLength
/// printable ASCII characters without spaces ('!' .. '~'). The empty tenant
/// (no tenant) is not a tenant name: callers that allow it check for it first.
bool valid_tenant(std::string_view tenant) noexcept;
/// What valid_tenant() asks, for error messages.
inline constexpr std::string_view kTenantRule = "1..128 printable ASCII characters without spaces";

/// The settings of one limiter.
struct Settings {
  /// Permits that may exist at once (F1). 1 .. kMaxConcurrentLimit.
  std::uint32_t max_concurrent = 1;
  /// Default deadline of an acquire that gives none (F3). 0 means "never wait".
  std::chrono::milliseconds max_wait{20'000};
  /// Waiters allowed at once; beyond it reject with queue_full (F8).
  /// std::nullopt = unbounded; 0 = never queue.
  std::optional<std::uint32_t> max_queue;
  /// false = disabled mode (F11), see `when_disabled`.
  bool enabled = true;
  DisabledMode when_disabled = DisabledMode::pass_through;
  /// Reject at once (reason timeout) when the estimated wait already exceeds
  /// the waiter's max_wait (F7). Off by default: estimates can be wrong.
  bool reject_early = false;
  /// enforce (the default) or shadow (F14): see LimiterMode. Applies only
  /// while enabled; a disabled limiter does what `when_disabled` says.
  LimiterMode mode = LimiterMode::enforce;
  /// Tenant fairness (F12): one FIFO queue per tenant (AcquireOptions::tenant)
  /// and a weighted round robin over the tenants that wait, instead of one
  /// global FIFO. Within a tenant, arrival order stays strict. Off = global FIFO.
  bool tenant_fairness = false;
  /// Permits one tenant may hold at once (F12); waiters of a tenant at its cap
  /// are skipped (they keep their place) until one of its permits returns.
  /// Applies with or without tenant_fairness, and only while enabled.
  /// std::nullopt = no per-tenant cap. 1 .. kMaxConcurrentLimit; a value above
  /// max_concurrent is allowed (it never binds), so lowering max_concurrent at
  /// run time never makes the settings invalid.
  std::optional<std::uint32_t> max_per_tenant;
  /// Redis backend (local to this instance, not shared through Redis): what to
  /// do while Redis is unreachable (D1).
  RedisDownPolicy on_redis_down = RedisDownPolicy::local;
  /// Redis backend, policy `local`: permits this instance may hold while Redis
  /// is unreachable, whatever it held before. std::nullopt (the default) = the
  /// seats it held when Redis went away, which never exceeds the cap; a fixed
  /// share can, if other instances still reach Redis and use the whole cap.
  /// 0 .. kMaxConcurrentLimit.
  std::optional<std::uint32_t> local_share;

  /// True when requests are tracked per tenant (tenant_fairness or a
  /// per-tenant cap): dispatch then works on per-tenant queues.
  bool tenant_aware() const noexcept { return tenant_fairness || max_per_tenant.has_value(); }

  friend bool operator==(const Settings&, const Settings&) = default;
};

/// A validation failure: which field, and what is wrong with it.
struct SettingsError {
  std::string field;
  std::string problem;
  /// "field: problem" — one line, suitable for a CLI error or an HTTP 400 body.
  std::string message() const { return field + ": " + problem; }
};

/// Lets boost::system::result<T, SettingsError>::value() throw std::invalid_argument.
[[noreturn]] void throw_exception_from_error(const SettingsError& error, const boost::source_location& loc);

/// std::nullopt if the settings are acceptable, else the first problem found.
std::optional<SettingsError> validate(const Settings& settings);

/// Limiter names: 1..64 characters of [A-Za-z0-9._-], not starting with '.' or '-'.
std::optional<SettingsError> validate_limiter_name(std::string_view name);

/// A partial change of settings: unset fields keep their value.
struct SettingsUpdate {
  std::optional<std::uint32_t> max_concurrent;
  std::optional<std::chrono::milliseconds> max_wait;
  /// Outer optional: change it or not; inner: the new value (nullopt = unbounded).
  std::optional<std::optional<std::uint32_t>> max_queue;
  std::optional<bool> enabled;
  std::optional<DisabledMode> when_disabled;
  std::optional<bool> reject_early;
  std::optional<LimiterMode> mode;
  std::optional<bool> tenant_fairness;
  /// Outer optional: change it or not; inner: the new value (nullopt = no cap).
  std::optional<std::optional<std::uint32_t>> max_per_tenant;
  std::optional<RedisDownPolicy> on_redis_down;
  /// Outer optional: change it or not; inner: the new value (nullopt = the seats held).
  std::optional<std::optional<std::uint32_t>> local_share;
};

/// `base` with the fields of `update` applied (not validated).
Settings apply(Settings base, const SettingsUpdate& update);

}  // namespace fairgate
