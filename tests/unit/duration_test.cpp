// The command-line value parsers: durations with units (docs/api.md "Durations on
// the command line take a unit") and bounded numbers.
#include "cli/duration.hpp"
#include "cli/parse.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace {

using fairgate::cli::format_duration;
using fairgate::cli::kMaxDuration;
using fairgate::cli::parse_count;
using fairgate::cli::parse_duration;
using fairgate::cli::parse_number;
using std::chrono::milliseconds;
using namespace std::chrono_literals;

milliseconds ok(std::string_view text) {
  auto parsed = parse_duration(text);
  EXPECT_TRUE(parsed) << text << ": " << parsed.error;
  EXPECT_TRUE(parsed.error.empty());
  return parsed.value.value_or(milliseconds(-1));
}

std::string error_of(std::string_view text) {
  auto parsed = parse_duration(text);
  EXPECT_FALSE(parsed) << text << " parsed as " << parsed.value.value_or(0ms).count() << " ms";
  EXPECT_FALSE(parsed.error.empty());
  return parsed.error;
}

TEST(Duration, TheUnitsOfTheSpec) {
  EXPECT_EQ(ok("250ms"), 250ms);
  EXPECT_EQ(ok("20s"), 20s);
  EXPECT_EQ(ok("5m"), 5min);
  EXPECT_EQ(ok("1h"), 1h);
  EXPECT_EQ(ok("0ms"), 0ms);
  EXPECT_EQ(ok("0s"), 0ms);
  EXPECT_EQ(ok("0"), 0ms);
  EXPECT_EQ(ok("007s"), 7s);
}

TEST(Duration, DecimalsAndSums) {
  EXPECT_EQ(ok("1.5s"), 1500ms);
  EXPECT_EQ(ok("0.25m"), 15s);
  EXPECT_EQ(ok(".5s"), 500ms);
  EXPECT_EQ(ok("2.000s"), 2s);
  EXPECT_EQ(ok("0.001s"), 1ms);
  EXPECT_EQ(ok("1m30s"), 90s);
  EXPECT_EQ(ok("1h15m"), 75min);
  EXPECT_EQ(ok("1h0m0.5s"), 3'600'500ms);
  EXPECT_EQ(ok("1s500ms"), 1500ms);
}

TEST(Duration, RejectsBadUnitsWithAClearMessage) {
  const std::string e = error_of("5parsecs");
  EXPECT_NE(e.find("unknown unit \"parsecs\""), std::string::npos) << e;
  EXPECT_NE(e.find("ms, s, m or h"), std::string::npos) << e;
  EXPECT_NE(error_of("20S").find("unknown unit \"S\""), std::string::npos);
  EXPECT_NE(error_of("3d").find("unknown unit"), std::string::npos);
  EXPECT_NE(error_of("10us").find("unknown unit"), std::string::npos);
}

TEST(Duration, RejectsNumbersWithoutUnit) {
  EXPECT_NE(error_of("20").find("has no unit"), std::string::npos);
  EXPECT_NE(error_of("1.5").find("has no unit"), std::string::npos);
  EXPECT_NE(error_of("20s5").find("has no unit"), std::string::npos);
}

TEST(Duration, RejectsMalformedText) {
  for (const char* text : {"", "s", "ms", " 20s", "20s ", "20 s", "+5s", "1,5s", "..5s", "1..5s", "5s-",
                           "abc", "1e3ms", "\t", "0x10s"}) {
    error_of(text);
  }
  EXPECT_NE(error_of("").find("empty"), std::string::npos);
  EXPECT_NE(error_of("-5s").find("negative"), std::string::npos);
}

TEST(Duration, RejectsSubMillisecondPrecision) {
  EXPECT_NE(error_of("1.5ms").find("finer than 1 ms"), std::string::npos);
  EXPECT_NE(error_of("0.0001s").find("finer than 1 ms"), std::string::npos);
  EXPECT_EQ(ok("0.0010000000000s"), 1ms);  // trailing zeros are fine
  EXPECT_NE(error_of("0.0010000000001s").find("finer than 1 ms"), std::string::npos);
}

TEST(Duration, RejectsHugeValuesWithoutOverflow) {
  EXPECT_EQ(ok("8760h"), kMaxDuration);
  EXPECT_NE(error_of("8761h").find("too long"), std::string::npos);
  EXPECT_NE(error_of("99999999999999999999999999s").find("too long"), std::string::npos);
  EXPECT_NE(error_of("8760h1ms").find("too long"), std::string::npos);
  EXPECT_NE(error_of("18446744073709551616ms").find("too long"), std::string::npos);
}

TEST(Duration, ErrorsAreOneLineEvenForHostileInput) {
  const std::string e = error_of("5\nparsecs");
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  const std::string long_text(500, 'x');
  EXPECT_LT(error_of(long_text).size(), 200u);
}

TEST(Duration, FormatIsShortAndReadsBack) {
  EXPECT_EQ(format_duration(0ms), "0ms");
  EXPECT_EQ(format_duration(250ms), "250ms");
  EXPECT_EQ(format_duration(4s), "4s");
  EXPECT_EQ(format_duration(1500ms), "1.5s");
  EXPECT_EQ(format_duration(1001ms), "1.001s");
  EXPECT_EQ(format_duration(2min), "2m");
  EXPECT_EQ(format_duration(90s), "1m30s");
  EXPECT_EQ(format_duration(1h), "1h");
  EXPECT_EQ(format_duration(24h), "24h");
  EXPECT_EQ(format_duration(3'600'500ms), "1h0m0.5s");
  EXPECT_EQ(format_duration(-250ms), "-250ms");
  for (const milliseconds d : {0ms, 1ms, 999ms, 1000ms, 1001ms, 59'999ms, 60'000ms, 61'000ms, 3'599'999ms,
                               3'600'000ms, 3'600'001ms, 86'400'000ms, 90'061'001ms}) {
    EXPECT_EQ(ok(format_duration(d)), d) << format_duration(d);
  }
}

TEST(Count, AcceptsWholeNumbersInRange) {
  EXPECT_EQ(parse_count("1", 1, 1000).value, 1u);
  EXPECT_EQ(parse_count("1000", 1, 1000).value, 1000u);
  EXPECT_EQ(parse_count("0010", 1, 1000).value, 10u);
  EXPECT_EQ(parse_count("18446744073709551615", 0, UINT64_MAX).value, UINT64_MAX);
}

TEST(Count, NamesTheProblem) {
  EXPECT_EQ(parse_count("0", 1, 1000).error, "0 not in 1..1000");
  EXPECT_EQ(parse_count("1001", 1, 1000).error, "1001 not in 1..1000");
  EXPECT_EQ(parse_count("-5", 1, 1000).error, "-5 not in 1..1000");
  EXPECT_EQ(parse_count("18446744073709551616", 1, 1000).error, "18446744073709551616 not in 1..1000");
  EXPECT_EQ(parse_count("ten", 1, 1000).error, "\"ten\" is not a whole number");
  EXPECT_EQ(parse_count("1.5", 1, 1000).error, "\"1.5\" is not a whole number");
  EXPECT_EQ(parse_count("+5", 1, 1000).error, "\"+5\" is not a whole number");
  EXPECT_EQ(parse_count(" 5", 1, 1000).error, "\" 5\" is not a whole number");
  EXPECT_NE(parse_count("", 1, 1000).error.find("empty value"), std::string::npos);
  EXPECT_EQ(parse_count("a\nb", 1, 1000).error, "\"a\\x0ab\" is not a whole number");
}

TEST(Number, AcceptsDecimalsInRange) {
  EXPECT_DOUBLE_EQ(*parse_number("10", 0.01, 1000).value, 10.0);
  EXPECT_DOUBLE_EQ(*parse_number("2.5", 0.01, 1000).value, 2.5);
  EXPECT_DOUBLE_EQ(*parse_number("0.01", 0.01, 1000).value, 0.01);
  EXPECT_DOUBLE_EQ(*parse_number(".5", 0.01, 1000).value, 0.5);
}

TEST(Number, NamesTheProblem) {
  EXPECT_EQ(parse_number("0", 0.01, 1000).error, "0 not in 0.01..1000");
  EXPECT_EQ(parse_number("-1", 0.01, 1000).error, "-1 not in 0.01..1000");
  EXPECT_EQ(parse_number("1001", 0.01, 1000).error, "1001 not in 0.01..1000");
  for (const char* text : {"fast", "nan", "inf", "1e3", "1.2.3", ".", "-", "0x10", "1,5"}) {
    EXPECT_NE(parse_number(text, 0.01, 1000).error.find("is not a number"), std::string::npos) << text;
  }
}

}  // namespace
