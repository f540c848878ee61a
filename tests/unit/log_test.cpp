// tests/unit/log_test.cpp — the library's log sink (fairgate/log.hpp): the
// application's sink receives the library's messages with their level; the
// default is back after set_log_sink({}); swapping the sink while other
// threads log is safe, and a replaced sink is destroyed (nothing keeps it).
#include <fairgate/log.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using fairgate::LogLevel;

struct Recorded {
  std::mutex mu;
  std::vector<std::pair<LogLevel, std::string>> lines;
};

TEST(LogSink, TheApplicationsSinkReceivesTheLibrarysMessagesWithTheirLevel) {
  auto rec = std::make_shared<Recorded>();
  fairgate::set_log_sink([rec](LogLevel level, std::string_view line) {
    std::lock_guard lock(rec->mu);
    rec->lines.emplace_back(level, std::string(line));
  });
  fairgate::log(LogLevel::warn, "limiter chat: degraded: Redis unreachable for 1.0 s");
  fairgate::log(LogLevel::info, "limiter chat: restored");
  fairgate::set_log_sink({});
  fairgate::log(LogLevel::info, "after the reset: to stderr, not to the sink");
  ASSERT_EQ(rec->lines.size(), 2u);
  EXPECT_EQ(rec->lines[0].first, LogLevel::warn);
  EXPECT_EQ(rec->lines[0].second, "limiter chat: degraded: Redis unreachable for 1.0 s");
  EXPECT_EQ(rec->lines[1].first, LogLevel::info);
  // The reset dropped the sink: only this test still holds what it captured.
  EXPECT_EQ(rec.use_count(), 1);
}

TEST(LogSink, DefaultWritesToStderrWithThePrefixAndDiscardDropsEverything) {
  testing::internal::CaptureStderr();
  fairgate::log(LogLevel::warn, "a warning");
  fairgate::log(LogLevel::debug, "below info: not written by the default sink");
  fairgate::set_log_sink(fairgate::discard_log_sink());
  fairgate::log(LogLevel::error, "discarded");
  fairgate::set_log_sink({});
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "fairgate: a warning\n");
}

TEST(LogSink, SwappingTheSinkWhileThreadsLogIsSafe) {
  std::atomic<bool> stop{false};
  std::atomic<long> received{0};
  const auto swap = [&received](int i) {
    auto alive = std::make_shared<int>(i);
    fairgate::set_log_sink([alive, &received](LogLevel, std::string_view line) {
      // A sink in use is never destroyed under its caller.
      if (*alive >= 0 && line == "x") received.fetch_add(1);
    });
  };
  swap(0);
  std::vector<std::thread> loggers;
  for (int i = 0; i < 4; ++i)
    loggers.emplace_back([&] {
      while (!stop.load()) fairgate::log(LogLevel::info, "x");
    });
  // Swap while the threads log (at least 2000 times, and until they have logged a while).
  for (int i = 1; i <= 2000 || (received.load() < 10000 && i < 10'000'000); ++i) swap(i);
  stop.store(true);
  for (auto& t : loggers) t.join();
  fairgate::set_log_sink({});
  EXPECT_GT(received.load(), 0);
  EXPECT_EQ(fairgate::to_string(LogLevel::warn), "warn");
  EXPECT_EQ(fairgate::to_string(LogLevel::off), "off");
}

}  // namespace
