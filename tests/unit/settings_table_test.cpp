// The settings table (src/core/settings_table.hpp): it covers every member of
// Settings and SettingsUpdate, and each front end that reads or prints settings
// through it sees every setting — the [limiters.NAME] reader, PUT's body, the
// JSON view, the banner, the Redis cfg hash (whose format older builds share),
// the Lua scripts' field list and the docs.
#include "core/settings_table.hpp"
#include "redis/scripts.hpp"
#include "serve/config.hpp"
#include "serve/openapi.hpp"
#include "serve/params.hpp"
#include "serve/views.hpp"

#include <gtest/gtest.h>
#include <boost/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include <unistd.h>

namespace {

using fairgate::Settings;
using fairgate::SettingsUpdate;
using fairgate::core::kSettings;
using fairgate::core::SettingKind;
using fairgate::core::SettingSpec;
using fairgate::core::SettingValue;
namespace json = boost::json;

// --- the number of members of an aggregate (what the table must cover) ---
struct Any {
  template <class T>
  operator T() const;
};
template <class T, std::size_t... I>
constexpr bool init_with(std::index_sequence<I...>) {
  return requires { T{(void(I), Any{})...}; };
}
template <class T, std::size_t N = 0>
constexpr std::size_t member_count() {
  if constexpr (N > 64)
    return 0;
  else if constexpr (!init_with<T>(std::make_index_sequence<N + 1>{}))
    return N;
  else
    return member_count<T, N + 1>();
}

/// A valid value of `spec` other than its default.
SettingValue other_value(const SettingSpec& spec) {
  const SettingValue d = spec.get(Settings{});
  switch (spec.kind) {
    case SettingKind::count:
    case SettingKind::optional_count:
    case SettingKind::duration_ms: return d == spec.min + 1 ? spec.min + 2 : spec.min + 1;
    case SettingKind::flag: return d.value_or(0) != 0 ? 0 : 1;
    case SettingKind::choice: return d == 0 ? static_cast<std::int64_t>(spec.choices.size()) - 1 : 0;
  }
  return std::nullopt;
}

/// Settings with every setting at other_value().
Settings all_changed() {
  Settings s;
  for (const auto& spec : kSettings) spec.set(s, other_value(spec));
  return s;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

TEST(SettingsTable, CoversEveryMemberOfSettingsAndSettingsUpdateOnce) {
  EXPECT_EQ(member_count<Settings>(), kSettings.size()) << "a Settings member without a row in kSettings?";
  EXPECT_EQ(member_count<SettingsUpdate>(), kSettings.size());
  // Each row reaches its own member: changing one changes no other.
  for (const auto& spec : kSettings) {
    Settings s;
    spec.set(s, other_value(spec));
    EXPECT_NE(s, Settings{}) << spec.name;
    EXPECT_EQ(spec.get(s), other_value(spec)) << spec.name;
    for (const auto& other : kSettings)
      if (&other != &spec) {
        EXPECT_EQ(other.get(s), other.get(Settings{})) << spec.name << " also sets " << other.name;
      }
    SettingsUpdate u;
    spec.set_update(u, other_value(spec));
    for (const auto& other : kSettings) EXPECT_EQ(other.in_update(u), &other == &spec) << spec.name;
    EXPECT_EQ(fairgate::apply(Settings{}, u), s) << spec.name;
  }
  std::set<std::string_view> names, keys, wires;
  for (const auto& spec : kSettings) {
    EXPECT_TRUE(names.insert(spec.name).second) << spec.name;
    EXPECT_TRUE(keys.insert(spec.key).second) << spec.key;
    if (spec.shared()) {
      EXPECT_TRUE(wires.insert(spec.wire).second) << spec.wire;
    }
    EXPECT_FALSE(spec.doc.empty()) << spec.name;
    if (spec.kind == SettingKind::choice) {
      EXPECT_GE(spec.choices.size(), 2u) << spec.name;
      EXPECT_TRUE(spec.wire_choices.empty() || spec.wire_choices.size() == spec.choices.size()) << spec.name;
    }
  }
}

TEST(SettingsTable, ChoicesAreInTheOrderOfTheirEnums) {
  using namespace fairgate;
  const auto names = [](std::string_view name) { return fairgate::core::setting_by_name(name)->choices; };
  for (const auto m : {DisabledMode::pass_through, DisabledMode::reject})
    EXPECT_EQ(names("when_disabled")[static_cast<std::size_t>(m)], to_string(m));
  for (const auto m : {LimiterMode::enforce, LimiterMode::shadow})
    EXPECT_EQ(names("mode")[static_cast<std::size_t>(m)], to_string(m));
  for (const auto p : {RedisDownPolicy::local, RedisDownPolicy::open, RedisDownPolicy::closed})
    EXPECT_EQ(names("on_redis_down")[static_cast<std::size_t>(p)], to_string(p));
}

/// validate() words its own messages; it must judge by the table's ranges.
TEST(SettingsTable, ValidateAcceptsExactlyTheTableRanges) {
  for (const auto& spec : kSettings) {
    if (spec.kind == SettingKind::flag || spec.kind == SettingKind::choice) continue;
    for (const auto v : {spec.min, spec.max}) {
      Settings s;
      spec.set(s, v);
      EXPECT_EQ(fairgate::validate(s), std::nullopt) << spec.name << "=" << v;
    }
    std::vector<std::int64_t> outside{spec.max + 1};
    if (spec.min > 0 || spec.kind == SettingKind::duration_ms) outside.push_back(spec.min - 1);
    for (const auto v : outside) {
      Settings s;
      spec.set(s, v);
      const auto e = fairgate::validate(s);
      ASSERT_TRUE(e) << spec.name << "=" << v;
      EXPECT_EQ(e->field, spec.name);
    }
  }
}

// --- Redis: the cfg hash, as running instances of older builds read and write it ---

std::map<std::string, std::string> as_map(const std::vector<std::string>& flat) {
  std::map<std::string, std::string> out;
  for (std::size_t i = 0; i + 1 < flat.size(); i += 2) EXPECT_TRUE(out.emplace(flat[i], flat[i + 1]).second);
  return out;
}

TEST(SettingsTable, TheRedisWireFormatIsUnchanged) {
  const std::map<std::string, std::string> defaults{
      {"max_concurrent", "1"},   {"max_queue", ""},        {"enabled", "1"},
      {"when_disabled", "pass"}, {"max_wait_ms", "20000"}, {"tenant_fairness", "0"},
      {"max_per_tenant", ""},    {"reject_early", "0"},    {"mode", "enforce"}};
  EXPECT_EQ(as_map(fairgate::core::wire_fields(Settings{})), defaults);

  Settings s;
  s.max_concurrent = 7;
  s.max_wait = std::chrono::milliseconds(1500);
  s.max_queue = 0;
  s.enabled = false;
  s.when_disabled = fairgate::DisabledMode::reject;
  s.reject_early = true;
  s.mode = fairgate::LimiterMode::shadow;
  // tenant_fairness stays false: with reject_early true, the two flags' fields
  // pin which member each is bound to (a crosswise binding swaps "1" and "0").
  s.max_per_tenant = 2;
  s.on_redis_down = fairgate::RedisDownPolicy::closed;
  s.local_share = 3;
  const std::map<std::string, std::string> changed{
      {"max_concurrent", "7"},     {"max_queue", "0"},      {"enabled", "0"},
      {"when_disabled", "reject"}, {"max_wait_ms", "1500"}, {"tenant_fairness", "0"},
      {"max_per_tenant", "2"},     {"reject_early", "1"},   {"mode", "shadow"}};
  EXPECT_EQ(as_map(fairgate::core::wire_fields(s)), changed) << "on_redis_down and local_share stay local";
}

TEST(SettingsTable, SettingsRoundTripThroughTheRedisHashLocalOnesStayLocal) {
  for (const auto& spec : kSettings) {
    Settings s;
    spec.set(s, other_value(spec));
    const auto flat = fairgate::core::wire_fields(s);
    Settings back;
    for (std::size_t i = 0; i + 1 < flat.size(); i += 2)
      EXPECT_TRUE(fairgate::core::read_wire_field(flat[i], flat[i + 1], back)) << flat[i];
    if (spec.shared())
      EXPECT_EQ(back, s) << spec.name;
    else
      EXPECT_EQ(back, Settings{}) << spec.name << " is local: never sent to Redis";
  }
  // Local settings survive an adoption of the cluster-wide ones.
  Settings mine = all_changed();
  Settings theirs;
  fairgate::core::copy_local_settings(mine, theirs);
  for (const auto& spec : kSettings)
    EXPECT_EQ(spec.get(theirs), spec.shared() ? spec.get(Settings{}) : spec.get(mine)) << spec.name;
}

TEST(SettingsTable, UnreadableWireValuesKeepCountsAndGiveFlagsTheLuaReading) {
  Settings s = all_changed();
  const Settings before = s;
  for (const auto& spec : kSettings) {
    if (!spec.shared()) continue;
    fairgate::core::read_wire_field(spec.wire, "bogus", s);
    if (spec.kind == SettingKind::flag || spec.kind == SettingKind::choice)
      EXPECT_EQ(spec.get(s), spec.get(Settings{})) << spec.name;  // lib.lua: enabled ~= '0', x == '1', ...
    else
      EXPECT_EQ(spec.get(s), spec.get(before)) << spec.name;
  }
  EXPECT_FALSE(fairgate::core::read_wire_field("epoch", "3", s)) << "an engine field, not a setting";
  EXPECT_FALSE(fairgate::core::read_wire_field("on_redis_down", "open", s)) << "local: never read from Redis";
}

/// The Lua scripts read the cfg hash by field name: CFG_FIELDS (what load_cfg
/// fetches) holds settings of the table and engine fields only, every field
/// make_cfg reads is fetched, and lib.lua's description of the hash names
/// every setting of the table.
TEST(SettingsTable, TheLuaScriptsReadTheTablesWireFields) {
  const std::string text(fairgate::redis::scripts::kAcquire.text());
  const auto between = [&](std::string_view from, std::string_view to) {
    const auto a = text.find(from);
    EXPECT_NE(a, std::string::npos) << from;
    const auto b = text.find(to, a);
    EXPECT_NE(b, std::string::npos) << to;
    return text.substr(a, b - a);
  };
  std::set<std::string> cfg_fields;
  {
    const std::string list = between("local CFG_FIELDS = {", "}");
    for (std::size_t q = list.find('\''); q != std::string::npos;
         q = list.find('\'', list.find('\'', q + 1) + 1))
      cfg_fields.insert(list.substr(q + 1, list.find('\'', q + 1) - q - 1));
  }
  ASSERT_GT(cfg_fields.size(), 5u);
  const std::set<std::string> engine{"epoch",        "fence_until", "fence_credit", "pace_gap", "pace_n",
                                     "pace_last",    "pace_at",     "seat_gap",     "seat_n",   "seat_last",
                                     "seat_at",      "source",      "fence_ms",  // source, fence_ms: rule 14
                                     "holders_mark", "tenants_mark"};            // rule 15
  for (const auto& f : cfg_fields)
    EXPECT_TRUE(engine.contains(f) || fairgate::core::setting_by_wire(f) != nullptr)
        << "CFG_FIELDS has " << f << ": neither an engine field nor a setting of the table";
  const std::string make_cfg = between("local function make_cfg(h)", "\nend\n");
  for (std::size_t h = make_cfg.find("h."); h != std::string::npos; h = make_cfg.find("h.", h + 2)) {
    if (h > 0 && (std::isalnum(static_cast<unsigned char>(make_cfg[h - 1])) || make_cfg[h - 1] == '_'))
      continue;
    std::size_t end = h + 2;
    while (end < make_cfg.size() &&
           (std::isalnum(static_cast<unsigned char>(make_cfg[end])) || make_cfg[end] == '_'))
      ++end;
    const std::string field = make_cfg.substr(h + 2, end - h - 2);
    EXPECT_TRUE(cfg_fields.contains(field))
        << "make_cfg reads h." << field << ", which load_cfg never fetches";
    EXPECT_TRUE(engine.contains(field) || fairgate::core::setting_by_wire(field) != nullptr) << field;
  }
  const std::string described = between("KEYS[1] cfg", "KEYS[2]");
  for (const auto& spec : kSettings) {
    if (!spec.shared()) continue;
    EXPECT_NE(described.find(std::string(spec.wire)), std::string::npos)
        << "lib.lua's description of the cfg hash does not name " << spec.wire;
  }
}

// --- the front ends ---

TEST(SettingsTable, TheConfigFileReadsEverySetting) {
  std::string toml = "[limiters.chat]\n";
  for (const auto& spec : kSettings) {
    const SettingValue v = other_value(spec);
    toml += std::string(spec.key) + " = ";
    if (spec.kind == SettingKind::flag)
      toml += *v != 0 ? "true" : "false";
    else if (spec.kind == SettingKind::choice)
      toml += "\"" + std::string(spec.choices[static_cast<std::size_t>(*v)]) + "\"";
    else
      toml += std::to_string(*v);
    toml += "\n";
  }
  const auto path = std::filesystem::temp_directory_path() /
                    ("settings_table_test_" + std::to_string(::getpid()) + ".toml");
  std::ofstream(path) << toml;
  fairgate::serve::ServeFlags flags;
  flags.config_file = path.string();
  const auto cfg = fairgate::serve::load_config(flags, [](const char*) -> const char* { return nullptr; });
  std::filesystem::remove(path);
  ASSERT_EQ(cfg.limiters.size(), 1u) << toml;
  EXPECT_EQ(cfg.limiters[0].settings, all_changed()) << toml;
}

TEST(SettingsTable, PutAcceptsEveryHttpSettingAndNamesTheOthersUnknown) {
  json::object body;
  for (const auto& spec : kSettings) {
    if (!spec.http) continue;
    const SettingValue v = other_value(spec);
    if (spec.kind == SettingKind::flag)
      body[spec.key] = *v != 0;
    else if (spec.kind == SettingKind::choice)
      body[spec.key] = spec.choices[static_cast<std::size_t>(*v)];
    else
      body[spec.key] = *v;
  }
  fairgate::serve::BadRequest bad;
  const auto u = fairgate::serve::parse_settings_update(json::serialize(body), bad);
  ASSERT_TRUE(u) << bad.message;
  const Settings s = fairgate::apply(Settings{}, *u);
  for (const auto& spec : kSettings)
    EXPECT_EQ(spec.get(s), spec.http ? other_value(spec) : spec.get(Settings{})) << spec.name;

  for (const auto& spec : kSettings) {
    if (spec.kind == SettingKind::optional_count && spec.http) {  // null: unset
      fairgate::serve::BadRequest e;
      const auto n = fairgate::serve::parse_settings_update("{\"" + std::string(spec.key) + "\":null}", e);
      ASSERT_TRUE(n) << e.message;
      EXPECT_TRUE(spec.in_update(*n));
      EXPECT_EQ(spec.get_update(*n), std::nullopt);
    }
    if (spec.http && (spec.kind == SettingKind::count || spec.kind == SettingKind::optional_count ||
                      spec.kind == SettingKind::duration_ms)) {
      fairgate::serve::BadRequest e;
      EXPECT_FALSE(fairgate::serve::parse_settings_update(
          "{\"" + std::string(spec.key) + "\":" + std::to_string(spec.max + 1) + "}", e));
      EXPECT_EQ(e.message.rfind(std::string(spec.key) + ": must be ", 0), 0u) << e.message;
    }
    if (!spec.http) {
      fairgate::serve::BadRequest e;
      EXPECT_FALSE(fairgate::serve::parse_settings_update("{\"" + std::string(spec.key) + "\":1}", e));
      EXPECT_EQ(e.message.rfind("unknown field", 0), 0u) << e.message;
    }
  }
}

TEST(SettingsTable, TheJsonViewShowsEverySetting) {
  fairgate::Snapshot snap;
  snap.name = "chat";
  snap.settings = all_changed();
  for (const std::string_view backend : {"redis", "memory"}) {
    const json::object o = fairgate::serve::limiter_json(snap, backend, false);
    for (const auto& spec : kSettings) {
      if (!spec.shared() && backend == "memory") {
        EXPECT_FALSE(o.contains(spec.key)) << spec.key << ": local to a Redis instance";
        continue;
      }
      ASSERT_TRUE(o.contains(spec.key)) << backend << " view lacks " << spec.key;
      const json::value& v = o.at(spec.key);
      const SettingValue want = other_value(spec);
      if (!want)
        EXPECT_TRUE(v.is_null()) << spec.key;
      else if (spec.kind == SettingKind::flag)
        EXPECT_EQ(v, json::value(*want != 0)) << spec.key;
      else if (spec.kind == SettingKind::choice)
        EXPECT_EQ(v, json::value(spec.choices[static_cast<std::size_t>(*want)])) << spec.key;
      else
        EXPECT_EQ(v.to_number<std::int64_t>(), *want) << spec.key;
    }
  }
}

TEST(SettingsTable, TheBannerShowsWhatIsInForce) {
  EXPECT_EQ(fairgate::core::describe_settings(Settings{}),
            "max_concurrent=1, max_wait=20000ms, max_queue=none, enabled=true, on_redis_down=local");
  EXPECT_EQ(
      fairgate::core::describe_settings(all_changed()),
      "max_concurrent=2, max_wait=1ms, max_queue=1, enabled=false, when_disabled=reject, reject_early=true, "
      "mode=shadow, tenant_fairness=true, max_per_tenant=2, on_redis_down=closed, local_share=1");
}

// `fairgate serve --help` lists every --limiter option, one line each, with its doc.
TEST(SettingsTable, LimiterOptionsHelpListsEveryFlagOptionWithItsDoc) {
  const std::string help = fairgate::core::limiter_options_help();
  std::size_t lines = 0;
  for (const auto& spec : kSettings) {
    if (!spec.flag_option()) continue;
    ++lines;
    const std::string label = std::string(spec.name) + "=" + std::string(spec.flag_example);
    const auto at = help.find("\n  " + label + " ");
    ASSERT_NE(at, std::string::npos) << label << " in:\n" << help;
    const auto end = help.find('\n', at + 1);
    EXPECT_NE(help.substr(at, end - at).find(spec.doc), std::string::npos) << label;
  }
  EXPECT_TRUE(help.starts_with("  MAX ")) << help;
  EXPECT_EQ(static_cast<std::size_t>(std::count(help.begin(), help.end(), '\n')), lines + 1) << help;
}

// --- the docs ---

TEST(SettingsTable, TheDocsListEverySettingAndTheLimiterFlag) {
  const std::string doc = read_text(FAIRGATE_SOURCE_DIR "/docs/serve.md");
  ASSERT_FALSE(doc.empty());
  EXPECT_NE(doc.find("`--limiter " + fairgate::core::limiter_flag_synopsis() + "`"), std::string::npos)
      << "docs/serve.md should show --limiter " << fairgate::core::limiter_flag_synopsis();
  const auto a = doc.find("[limiters.chat]");
  ASSERT_NE(a, std::string::npos);
  const std::string example = doc.substr(a, doc.find("\n[", a + 1) - a);
  for (const auto& spec : kSettings)
    EXPECT_TRUE(example.find("\n" + std::string(spec.key) + " = ") != std::string::npos ||
                example.find("\n# " + std::string(spec.key) + " = ") != std::string::npos)
        << "docs/serve.md's [limiters.chat] example lacks " << spec.key;
  const std::string api = read_text(FAIRGATE_SOURCE_DIR "/docs/api.md");
  const auto put = api.find("- `PUT /v1/limiters/{name}`");
  ASSERT_NE(put, std::string::npos);
  const std::string put_text = api.substr(put, api.find("\n- ", put + 1) - put);
  for (const auto& spec : kSettings)
    if (spec.http) {
      EXPECT_NE(put_text.find("`" + std::string(spec.key) + "`"), std::string::npos) << spec.key;
    }
  const std::string schema = read_text(FAIRGATE_SOURCE_DIR "/docs/redis-schema.md");
  for (const auto& spec : kSettings)
    if (spec.shared()) {
      EXPECT_NE(schema.find("`" + std::string(spec.wire) + "`"), std::string::npos) << spec.wire;
    }
}

/// docs/openapi.yaml (as served): PUT's body has exactly the table's HTTP
/// settings with their ranges; the limiter view has every setting.
TEST(SettingsTable, OpenApiHasEverySettingWithItsRange) {
  const json::value doc = json::parse(fairgate::serve::openapi::kJson);
  const auto& schemas = doc.at("components").at("schemas").as_object();
  const auto& update = schemas.at("SettingsUpdate").at("properties").as_object();
  const auto& view = schemas.at("LimiterFields").at("properties").as_object();
  std::size_t http = 0;
  for (const auto& spec : kSettings) {
    EXPECT_TRUE(view.contains(spec.key)) << spec.key;
    if (!spec.http) {
      EXPECT_FALSE(update.contains(spec.key)) << spec.key;
      continue;
    }
    ++http;
    ASSERT_TRUE(update.contains(spec.key)) << spec.key;
    const auto& p = update.at(spec.key).as_object();
    if (spec.kind == SettingKind::flag || spec.kind == SettingKind::choice) continue;
    EXPECT_EQ(p.at("minimum").to_number<std::int64_t>(), spec.min) << spec.key;
    if (p.contains("maximum")) {
      EXPECT_EQ(p.at("maximum").to_number<std::int64_t>(), spec.max) << spec.key;
    }
  }
  EXPECT_EQ(update.size(), http);
}

}  // namespace
