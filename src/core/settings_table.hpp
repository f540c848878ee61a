// core/settings_table.hpp — every limiter setting (fairgate::Settings), declared
// once: its names (C++/--limiter, config/JSON/PUT, Redis hash), kind, range,
// where it may be set, whether it is shared cluster-wide, and one doc line.
//
// The front ends read and print settings through this table: the [limiters.NAME]
// reader (serve/config.cpp), the `--limiter` flag and its help (cli/serve.cpp),
// the PUT /v1/limiters/{name} body (serve/params.cpp), the JSON view
// (serve/views.cpp: its key order is the documented one, the values come from
// here), the start-up banner (serve/server.cpp) and the Redis cfg hash
// (redis/redis_limiter.cpp). Each front end keeps its own error wording, per
// kind. validate() (core/settings.cpp) keeps its own prose too; a unit test
// holds it to the ranges below. Adding a setting: a member in Settings and
// SettingsUpdate, a row here, and the code that acts on it.
#pragma once

#include <fairgate/settings.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace fairgate::core {

enum class SettingKind : std::uint8_t {
  count,           ///< a whole number in min..max
  optional_count,  ///< a whole number in min..max, or unset (std::nullopt)
  duration_ms,     ///< milliseconds in min..max
  flag,            ///< true or false
  choice,          ///< one of `choices` (an enum; the value is its index there)
};

/// Where the start-up banner shows a setting (serve/server.cpp).
enum class BannerShow : std::uint8_t {
  always,
  changed,   ///< only when it differs from the default
  disabled,  ///< only while the limiter is disabled (enabled = false)
};

/// One setting's value, whatever its kind: the number, the duration in ms, 1/0
/// for a flag, the index in `choices` for a choice; std::nullopt = unset
/// (optional_count only).
using SettingValue = std::optional<std::int64_t>;

struct SettingSpec {
  std::string_view name;  ///< the Settings member; the `--limiter` key; the banner
  std::string_view key;   ///< [limiters.NAME] key, JSON view key, PUT body key
  std::string_view wire;  ///< field of the Redis cfg hash; empty: local to each instance
  SettingKind kind;
  std::int64_t min = 0;  ///< count kinds and durations (ms): the accepted range
  std::int64_t max = 0;
  std::span<const std::string_view> choices{};       ///< choice: names in enum order
  std::span<const std::string_view> wire_choices{};  ///< choice: in the Redis hash (empty: `choices`)
  std::string_view alias{};                          ///< an older config key still read
  std::string_view flag_example{};  ///< `--limiter` help: NAME=<this>; empty: not a `--limiter` option
  bool http = false;                ///< accepted by PUT /v1/limiters/{name}
  BannerShow banner = BannerShow::changed;
  std::string_view doc{};

  SettingValue (*get)(const Settings&) = nullptr;
  void (*set)(Settings&, SettingValue) = nullptr;
  bool (*in_update)(const SettingsUpdate&) = nullptr;           ///< does the update change it?
  SettingValue (*get_update)(const SettingsUpdate&) = nullptr;  ///< its new value (when in_update)
  void (*set_update)(SettingsUpdate&, SettingValue) = nullptr;

  /// Stored in Redis and shared by every instance (else local to each one).
  constexpr bool shared() const noexcept { return !wire.empty(); }
  constexpr bool flag_option() const noexcept { return !flag_example.empty(); }
};

namespace detail {

inline SettingValue to_value(std::uint32_t v) { return v; }
inline SettingValue to_value(std::chrono::milliseconds v) { return v.count(); }
inline SettingValue to_value(bool v) { return v ? 1 : 0; }
inline SettingValue to_value(const std::optional<std::uint32_t>& v) {
  return v ? SettingValue(*v) : std::nullopt;
}
template <class E>
requires std::is_enum_v<E> SettingValue to_value(E v) { return static_cast<std::int64_t>(v); }

inline void from_value(SettingValue v, std::uint32_t& out) {
  out = static_cast<std::uint32_t>(v.value_or(0));
}
inline void from_value(SettingValue v, std::chrono::milliseconds& out) {
  out = std::chrono::milliseconds(v.value_or(0));
}
inline void from_value(SettingValue v, bool& out) { out = v.value_or(0) != 0; }
inline void from_value(SettingValue v, std::optional<std::uint32_t>& out) {
  if (v)
    out = static_cast<std::uint32_t>(*v);
  else
    out.reset();
}
template <class E>
requires std::is_enum_v<E>
void from_value(SettingValue v, E& out) { out = static_cast<E>(v.value_or(0)); }

/// The accessors of one setting: member S of Settings, member U of SettingsUpdate.
template <auto S, auto U>
struct Member {
  static SettingValue get(const Settings& s) { return to_value(s.*S); }
  static void set(Settings& s, SettingValue v) { from_value(v, s.*S); }
  static bool in_update(const SettingsUpdate& u) { return (u.*U).has_value(); }
  static SettingValue get_update(const SettingsUpdate& u) { return to_value(*(u.*U)); }
  static void set_update(SettingsUpdate& u, SettingValue v) { from_value(v, (u.*U).emplace()); }
};

template <auto S, auto U>
constexpr SettingSpec bind(SettingSpec spec) {
  using M = Member<S, U>;
  spec.get = &M::get;
  spec.set = &M::set;
  spec.in_update = &M::in_update;
  spec.get_update = &M::get_update;
  spec.set_update = &M::set_update;
  return spec;
}

inline constexpr std::array<std::string_view, 2> kDisabledModes{"pass_through", "reject"};
inline constexpr std::array<std::string_view, 2> kDisabledModesWire{"pass", "reject"};
inline constexpr std::array<std::string_view, 2> kLimiterModes{"enforce", "shadow"};
inline constexpr std::array<std::string_view, 3> kRedisDownPolicies{"local", "open", "closed"};

}  // namespace detail

/// Every setting, in the order of fairgate::Settings (the order of lists in
/// help and error texts, of the banner and of the fields sent to Redis).
inline constexpr std::array kSettings{
    detail::bind<&Settings::max_concurrent, &SettingsUpdate::max_concurrent>({
        .name = "max_concurrent",
        .key = "max_concurrent",
        .wire = "max_concurrent",
        .kind = SettingKind::count,
        .min = 1,
        .max = kMaxConcurrentLimit,
        .http = true,
        .banner = BannerShow::always,
        .doc = "permits held at once, cluster-wide (the cap)",
    }),
    detail::bind<&Settings::max_wait, &SettingsUpdate::max_wait>({
        .name = "max_wait",
        .key = "max_wait_ms",
        .wire = "max_wait_ms",
        .kind = SettingKind::duration_ms,
        .min = 0,
        .max = kMaxWaitLimit.count(),
        .flag_example = "20s",
        .http = true,
        .banner = BannerShow::always,
        .doc = "how long a request may wait for a permit (default 20s); 0 = never wait",
    }),
    detail::bind<&Settings::max_queue, &SettingsUpdate::max_queue>({
        .name = "max_queue",
        .key = "max_queue",
        .wire = "max_queue",
        .kind = SettingKind::optional_count,
        .min = 0,
        .max = kMaxQueueLimit,
        // unset: unbounded
        .flag_example = "K",
        .http = true,
        .banner = BannerShow::always,
        .doc = "requests that may wait at once, beyond it 429 queue_full (default: no bound)",
    }),
    detail::bind<&Settings::enabled, &SettingsUpdate::enabled>({
        .name = "enabled",
        .key = "enabled",
        .wire = "enabled",
        .kind = SettingKind::flag,
        .flag_example = "false",
        .http = true,
        .banner = BannerShow::always,
        .doc = "false: disabled, requests pass through (or see when_disabled in a config file)",
    }),
    detail::bind<&Settings::when_disabled, &SettingsUpdate::when_disabled>({
        .name = "when_disabled",
        .key = "when_disabled",
        .wire = "when_disabled",
        .kind = SettingKind::choice,
        .choices = detail::kDisabledModes,
        .wire_choices = detail::kDisabledModesWire,
        .banner = BannerShow::disabled,
        .doc = "what a disabled limiter does with new requests: pass_through or reject",
    }),
    detail::bind<&Settings::reject_early, &SettingsUpdate::reject_early>({
        .name = "reject_early",
        .key = "reject_early",
        .wire = "reject_early",
        .kind = SettingKind::flag,
        .alias = "early_reject",
        .flag_example = "true",
        .http = true,
        .doc = "reject at once (429 would_time_out) when the wait estimate exceeds max_wait",
    }),
    detail::bind<&Settings::mode, &SettingsUpdate::mode>({
        .name = "mode",
        .key = "mode",
        .wire = "mode",
        .kind = SettingKind::choice,
        .choices = detail::kLimiterModes,
        .flag_example = "shadow",
        .http = true,
        .doc = "shadow: let everything through, report what enforcing would do (default enforce)",
    }),
    detail::bind<&Settings::tenant_fairness, &SettingsUpdate::tenant_fairness>({
        .name = "tenant_fairness",
        .key = "tenant_fairness",
        .wire = "tenant_fairness",
        .kind = SettingKind::flag,
        .flag_example = "true",
        .http = true,
        .doc = "serve tenants in turn (weighted round robin) instead of one FIFO",
    }),
    detail::bind<&Settings::max_per_tenant, &SettingsUpdate::max_per_tenant>({
        .name = "max_per_tenant",
        .key = "max_per_tenant",
        .wire = "max_per_tenant",
        .kind = SettingKind::optional_count,
        .min = 1,
        .max = kMaxConcurrentLimit,
        // unset: no per-tenant cap
        .flag_example = "K",
        .http = true,
        .doc = "permits one tenant may hold at once (default: no cap)",
    }),
    detail::bind<&Settings::on_redis_down, &SettingsUpdate::on_redis_down>({
        .name = "on_redis_down",
        .key = "on_redis_down",
        .kind = SettingKind::choice,
        .choices = detail::kRedisDownPolicies,
        .flag_example = "local|open|closed",
        .banner = BannerShow::always,
        .doc = "while Redis is unreachable: local (own seats), open (let all in) or closed (reject)",
    }),
    detail::bind<&Settings::local_share, &SettingsUpdate::local_share>({
        .name = "local_share",
        .key = "local_share",
        .kind = SettingKind::optional_count,
        .min = 0,
        .max = kMaxConcurrentLimit,
        // unset: the seats held
        .flag_example = "K",
        .doc = "on_redis_down=local: permits this instance may hold while Redis is unreachable",
    }),
};

/// The setting of that Settings member name, at compile time: setting("max_wait").
consteval const SettingSpec& setting(std::string_view name) {
  for (const auto& spec : kSettings)
    if (spec.name == name) return spec;
  throw "no setting of that name in kSettings";
}

/// The setting of that Settings member name (`max_wait`); nullptr if none.
const SettingSpec* setting_by_name(std::string_view name) noexcept;
/// The setting of that config/JSON key (`max_wait_ms`) or alias; nullptr if none.
const SettingSpec* setting_by_key(std::string_view key) noexcept;
/// The setting stored under that Redis cfg hash field; nullptr if none.
const SettingSpec* setting_by_wire(std::string_view field) noexcept;

/// The index of `text` in spec.choices, or nullopt.
std::optional<std::int64_t> parse_choice(const SettingSpec& spec, std::string_view text) noexcept;
/// "a, b, c" or, with `quote` and `last` = " or ": "\"a\", \"b\" or \"c\"".
std::string join_choices(const SettingSpec& spec, bool quote = false, std::string_view last = ", ");
/// The keys (`key` or `name`) of the settings `pick` selects, "a, b, c" or, with `last` = " or ", "a, b or
/// c".
std::string join_settings(bool (*pick)(const SettingSpec&), bool use_key, std::string_view last = ", ");

/// A value as text, in config/flag terms: "3", "20000", "true", "shadow"; unset: "none".
std::string format_value(const SettingSpec& spec, SettingValue value);

/// One value as the Redis cfg hash stores it (counts in decimal, unset = "",
/// flags "1"/"0", choices by their wire name).
std::string wire_value(const SettingSpec& spec, SettingValue value);
/// The shared settings as the Redis cfg hash stores them: field, value, field, value, ...
/// (counts in decimal, unset = "", flags "1"/"0", choices by their wire name).
std::vector<std::string> wire_fields(const Settings& settings);
/// One field of the Redis cfg hash into `settings`; false if it is not a
/// setting. A value no build writes keeps the count in force, or gives a
/// flag or choice its default (the reading of the Lua scripts).
bool read_wire_field(std::string_view field, std::string_view value, Settings& settings);

/// Copies the settings local to each instance (not shared through Redis) from `from`.
void copy_local_settings(const Settings& from, Settings& to);

/// The `--limiter` mini-language: "NAME=MAX[,max_wait=20s][,max_queue=K]..." (every flag option).
std::string limiter_flag_synopsis();

/// `fairgate serve --help`'s list of the `--limiter` options, one line each with its doc:
/// "  max_wait=20s  how long ...".
std::string limiter_options_help();

/// The start-up banner's line: "max_concurrent=3, max_wait=20000ms, max_queue=none, enabled=true, ...".
std::string describe_settings(const Settings& settings);

}  // namespace fairgate::core
