// Settings: validate() bounds with the field named in the error, limiter
// names, and partial updates (hot config, F9).
#include <fairgate/settings.hpp>

#include <gtest/gtest.h>
#include <boost/system/result.hpp>

#include <stdexcept>
#include <string>

namespace {

using namespace std::chrono_literals;
using fairgate::DisabledMode;
using fairgate::Settings;
using fairgate::SettingsError;
using fairgate::SettingsUpdate;
using fairgate::validate;
using fairgate::validate_limiter_name;

TEST(SettingsValidate, DefaultsAreValid) {
  EXPECT_EQ(validate(Settings{}), std::nullopt);
  const Settings s;
  EXPECT_EQ(s.max_concurrent, 1u);
  EXPECT_EQ(s.max_wait, 20s);
  EXPECT_EQ(s.max_queue, std::nullopt);
  EXPECT_TRUE(s.enabled);
  EXPECT_EQ(s.when_disabled, DisabledMode::pass_through);
  EXPECT_FALSE(s.reject_early);
}

TEST(SettingsValidate, MaxConcurrentBounds) {
  Settings s;
  s.max_concurrent = 0;
  auto e = validate(s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->field, "max_concurrent");
  EXPECT_NE(e->problem.find("got 0"), std::string::npos) << e->problem;
  EXPECT_EQ(e->message().rfind("max_concurrent: ", 0), 0u) << e->message();

  s.max_concurrent = 1;
  EXPECT_EQ(validate(s), std::nullopt);
  s.max_concurrent = fairgate::kMaxConcurrentLimit;
  EXPECT_EQ(validate(s), std::nullopt);
  s.max_concurrent = fairgate::kMaxConcurrentLimit + 1;
  e = validate(s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->field, "max_concurrent");
  EXPECT_NE(e->problem.find(std::to_string(fairgate::kMaxConcurrentLimit + 1)), std::string::npos);
}

TEST(SettingsValidate, MaxWaitBounds) {
  Settings s;
  s.max_wait = 0ms;
  EXPECT_EQ(validate(s), std::nullopt) << "0 = never wait";
  s.max_wait = fairgate::kMaxWaitLimit;
  EXPECT_EQ(validate(s), std::nullopt);
  s.max_wait = -1ms;
  auto e = validate(s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->field, "max_wait");
  EXPECT_NE(e->problem.find("-1 ms"), std::string::npos) << e->problem;
  s.max_wait = fairgate::kMaxWaitLimit + 1ms;
  e = validate(s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->field, "max_wait");
}

TEST(SettingsValidate, MaxQueueBounds) {
  Settings s;
  s.max_queue = 0;
  EXPECT_EQ(validate(s), std::nullopt) << "0 = never queue";
  s.max_queue = fairgate::kMaxQueueLimit;
  EXPECT_EQ(validate(s), std::nullopt);
  s.max_queue = fairgate::kMaxQueueLimit + 1;
  auto e = validate(s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->field, "max_queue");
  EXPECT_NE(e->problem.find(std::to_string(fairgate::kMaxQueueLimit + 1)), std::string::npos);
}

TEST(SettingsValidate, ReportsTheFirstProblem) {
  Settings s;
  s.max_concurrent = 0;
  s.max_wait = -5ms;
  ASSERT_TRUE(validate(s));
  EXPECT_EQ(validate(s)->field, "max_concurrent");
}

TEST(SettingsError, ThrowsInvalidArgumentFromResultValue) {
  boost::system::result<Settings, SettingsError> r = SettingsError{"max_wait", "must be positive"};
  try {
    (void)r.value();
    FAIL() << "value() of an error must throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "max_wait: must be positive");
  }
}

TEST(LimiterName, AcceptsTheAllowedAlphabet) {
  for (const char* name : {"chat", "document-upload", "a", "A.b_c-9", "0", "x.", "_lead"}) {
    EXPECT_EQ(validate_limiter_name(name), std::nullopt) << name;
  }
  EXPECT_EQ(validate_limiter_name(std::string(fairgate::kMaxNameLength, 'n')), std::nullopt);
}

TEST(LimiterName, RejectsBadNamesNamingTheField) {
  for (const std::string& name :
       {std::string(), std::string(fairgate::kMaxNameLength + 1, 'n'), std::string(".hidden"),
        std::string("-x"), std::string("a b"), std::string("a/b"), std::string("a:b"),
        std::string("caf\xc3\xa9"), std::string("a\nb"), std::string("a\0b", 3), std::string("{tag}")}) {
    const auto e = validate_limiter_name(name);
    ASSERT_TRUE(e) << "accepted: " << name;
    EXPECT_EQ(e->field, "name");
    EXPECT_FALSE(e->problem.empty());
  }
  EXPECT_NE(validate_limiter_name("")->problem.find("empty"), std::string::npos);
  EXPECT_NE(validate_limiter_name(std::string(65, 'n'))->problem.find("65"), std::string::npos);
}

TEST(SettingsApply, EmptyUpdateChangesNothing) {
  Settings base;
  base.max_concurrent = 7;
  base.max_queue = 3;
  EXPECT_EQ(fairgate::apply(base, SettingsUpdate{}), base);
}

TEST(SettingsApply, OnlySetFieldsChange) {
  Settings base;
  base.max_concurrent = 3;
  base.max_wait = 20s;
  base.max_queue = 10;
  base.enabled = true;
  base.when_disabled = DisabledMode::pass_through;
  base.reject_early = false;

  SettingsUpdate u;
  u.max_concurrent = 5;
  Settings out = fairgate::apply(base, u);
  Settings want = base;
  want.max_concurrent = 5;
  EXPECT_EQ(out, want);

  SettingsUpdate v;
  v.max_wait = 1s;
  v.enabled = false;
  v.when_disabled = DisabledMode::reject;
  v.reject_early = true;
  out = fairgate::apply(base, v);
  want = base;
  want.max_wait = 1s;
  want.enabled = false;
  want.when_disabled = DisabledMode::reject;
  want.reject_early = true;
  EXPECT_EQ(out, want);
}

TEST(SettingsApply, MaxQueueCanBeSetClearedOrLeftAlone) {
  Settings base;
  base.max_queue = 10;
  SettingsUpdate leave;
  EXPECT_EQ(fairgate::apply(base, leave).max_queue, 10u);
  SettingsUpdate clear;
  clear.max_queue = std::optional<std::uint32_t>{};  // change it, to unbounded
  EXPECT_EQ(fairgate::apply(base, clear).max_queue, std::nullopt);
  SettingsUpdate set;
  set.max_queue = std::optional<std::uint32_t>{0};
  EXPECT_EQ(fairgate::apply(base, set).max_queue, 0u);
}

TEST(SettingsApply, DoesNotValidate) {
  SettingsUpdate u;
  u.max_concurrent = 0;
  const Settings out = fairgate::apply(Settings{}, u);
  EXPECT_EQ(out.max_concurrent, 0u);
  EXPECT_TRUE(validate(out));
}

TEST(DisabledModeNames, AreStable) {
  EXPECT_EQ(fairgate::to_string(DisabledMode::pass_through), "pass_through");
  EXPECT_EQ(fairgate::to_string(DisabledMode::reject), "reject");
}

}  // namespace
