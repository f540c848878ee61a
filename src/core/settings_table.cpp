#include "core/settings_table.hpp"

#include "core/number.hpp"

#include <algorithm>
#include <limits>

namespace fairgate::core {
namespace {

std::span<const std::string_view> wire_names(const SettingSpec& spec) noexcept {
  return spec.wire_choices.empty() ? spec.choices : spec.wire_choices;
}

std::string_view choice_name(std::span<const std::string_view> names, SettingValue v) noexcept {
  if (!v || *v < 0 || static_cast<std::size_t>(*v) >= names.size()) return "?";
  return names[static_cast<std::size_t>(*v)];
}

}  // namespace

const SettingSpec* setting_by_name(std::string_view name) noexcept {
  for (const auto& spec : kSettings)
    if (spec.name == name) return &spec;
  return nullptr;
}

const SettingSpec* setting_by_key(std::string_view key) noexcept {
  for (const auto& spec : kSettings)
    if (spec.key == key || (!spec.alias.empty() && spec.alias == key)) return &spec;
  return nullptr;
}

const SettingSpec* setting_by_wire(std::string_view field) noexcept {
  for (const auto& spec : kSettings)
    if (spec.shared() && spec.wire == field) return &spec;
  return nullptr;
}

std::optional<std::int64_t> parse_choice(const SettingSpec& spec, std::string_view text) noexcept {
  for (std::size_t i = 0; i < spec.choices.size(); ++i)
    if (spec.choices[i] == text) return static_cast<std::int64_t>(i);
  return std::nullopt;
}

namespace {
template <class Items>
std::string join(const Items& items, bool quote, std::string_view last) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += i + 1 == items.size() ? last : std::string_view(", ");
    if (quote) out += '"';
    out += items[i];
    if (quote) out += '"';
  }
  return out;
}
}  // namespace

std::string join_choices(const SettingSpec& spec, bool quote, std::string_view last) {
  return join(spec.choices, quote, last);
}

std::string join_settings(bool (*pick)(const SettingSpec&), bool use_key, std::string_view last) {
  std::vector<std::string_view> names;
  for (const auto& spec : kSettings)
    if (pick(spec)) names.push_back(use_key ? spec.key : spec.name);
  return join(names, false, last);
}

std::string format_value(const SettingSpec& spec, SettingValue value) {
  switch (spec.kind) {
    case SettingKind::count:
    case SettingKind::optional_count: return value ? std::to_string(*value) : "none";
    case SettingKind::duration_ms: return std::to_string(value.value_or(0)) + "ms";
    case SettingKind::flag: return value.value_or(0) != 0 ? "true" : "false";
    case SettingKind::choice: return std::string(choice_name(spec.choices, value));
  }
  return "?";
}

std::string wire_value(const SettingSpec& spec, SettingValue v) {
  switch (spec.kind) {
    case SettingKind::count:
    case SettingKind::optional_count:
    case SettingKind::duration_ms: return v ? std::to_string(*v) : "";
    case SettingKind::flag: return v.value_or(0) != 0 ? "1" : "0";
    case SettingKind::choice: return std::string(choice_name(wire_names(spec), v));
  }
  return "";
}

std::vector<std::string> wire_fields(const Settings& settings) {
  std::vector<std::string> out;
  for (const auto& spec : kSettings) {
    if (!spec.shared()) continue;
    out.emplace_back(spec.wire);
    out.push_back(wire_value(spec, spec.get(settings)));
  }
  return out;
}

bool read_wire_field(std::string_view field, std::string_view value, Settings& settings) {
  const SettingSpec* spec = setting_by_wire(field);
  if (spec == nullptr) return false;
  constexpr auto kMaxStored = static_cast<std::int64_t>(std::numeric_limits<std::uint32_t>::max());
  switch (spec->kind) {
    case SettingKind::optional_count:
      if (value.empty()) {
        spec->set(settings, std::nullopt);
        break;
      }
      [[fallthrough]];
    case SettingKind::count:
      if (const auto v = parse_number<std::int64_t>(value); v && *v >= spec->min && *v <= kMaxStored)
        spec->set(settings, *v);
      break;
    case SettingKind::duration_ms:
      if (const auto v = parse_number<std::int64_t>(value); v && *v >= spec->min) spec->set(settings, *v);
      break;
    case SettingKind::flag:
      spec->set(settings, value == "1" ? 1 : value == "0" ? 0 : spec->get(Settings{}).value_or(0));
      break;
    case SettingKind::choice: {
      const auto names = wire_names(*spec);
      SettingValue v = spec->get(Settings{});
      for (std::size_t i = 0; i < names.size(); ++i)
        if (names[i] == value) v = static_cast<std::int64_t>(i);
      spec->set(settings, v);
      break;
    }
  }
  return true;
}

void copy_local_settings(const Settings& from, Settings& to) {
  for (const auto& spec : kSettings)
    if (!spec.shared()) spec.set(to, spec.get(from));
}

std::string limiter_flag_synopsis() {
  std::string out = "NAME=MAX";
  for (const auto& spec : kSettings)
    if (spec.flag_option())
      out.append("[,").append(spec.name).append("=").append(spec.flag_example).append("]");
  return out;
}

std::string limiter_options_help() {
  const auto listed = [](const SettingSpec& spec) {
    return spec.flag_option() || spec.name == "max_concurrent";
  };
  const auto label = [](const SettingSpec& spec) {
    if (spec.name == "max_concurrent") return std::string("MAX");
    std::string l(spec.name);
    return l.append("=").append(spec.flag_example);
  };
  std::size_t width = 0;
  for (const auto& spec : kSettings)
    if (listed(spec)) width = std::max(width, label(spec).size());
  std::string out;
  for (const auto& spec : kSettings) {
    if (!listed(spec)) continue;
    const std::string l = label(spec);
    out.append("  ").append(l).append(width - l.size() + 2, ' ').append(spec.doc).append("\n");
  }
  return out;
}

std::string describe_settings(const Settings& settings) {
  static const Settings defaults{};
  std::string line;
  for (const auto& spec : kSettings) {
    const SettingValue v = spec.get(settings);
    if (spec.banner == BannerShow::changed && v == spec.get(defaults)) continue;
    if (spec.banner == BannerShow::disabled && settings.enabled) continue;
    if (!line.empty()) line += ", ";
    line.append(spec.name).append("=").append(format_value(spec, v));
  }
  return line;
}

}  // namespace fairgate::core
