// tests/unit/sse_stream_test.cpp — the writing side of an SSE stream
// (src/http/sse_stream.hpp) and the snapshot hub of GET /v1/events
// (src/serve/event_hub.hpp), on a real io_context with the writes captured.
#include "http/sse_stream.hpp"
#include "serve/event_hub.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace net = boost::asio;
using fairgate::http::SseStream;
using fairgate::serve::EventHub;
using namespace std::chrono_literals;

/// Runs `stream.run()` with a write that records what it is given; the result lands in `result`.
void run_recording(const net::any_io_executor& strand, SseStream& stream, std::vector<std::string>& written,
                   std::optional<bool>& result, std::function<void()> after_write = {}) {
  net::co_spawn(
      strand,
      [&stream, &written, &result, after_write = std::move(after_write)]() -> net::awaitable<void> {
        result =
            co_await stream.run([&written, &after_write](const std::string& bytes) -> net::awaitable<bool> {
              written.push_back(bytes);
              if (after_write) after_write();
              co_return true;
            });
      },
      net::detached);
}

TEST(SseStream, WritesWhatIsPushedInOrderAndEndsOnceFinished) {
  net::io_context io;
  const net::any_io_executor strand = net::make_strand(io);
  SseStream stream(strand, 1024);
  std::vector<std::string> written;
  std::optional<bool> result;
  EXPECT_TRUE(stream.push("a"));
  EXPECT_TRUE(stream.push("b"));
  run_recording(strand, stream, written, result);
  io.run_for(50ms);  // nothing to write after "b": the stream waits
  ASSERT_FALSE(result.has_value());
  EXPECT_TRUE(stream.push("c"));
  stream.finish();
  io.restart();
  io.run();
  ASSERT_TRUE(result.has_value());
  EXPECT_TRUE(*result);
  EXPECT_EQ(written, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_FALSE(stream.push("d")) << "a finished stream takes nothing more";
}

TEST(SseStream, KeepAliveCommentsOnlyWhenAskedAndOnlyWhileQuiet) {
  net::io_context io;
  const net::any_io_executor strand = net::make_strand(io);
  SseStream stream(strand, 1024);
  std::vector<std::string> written;
  std::optional<bool> result;
  stream.push("event");
  run_recording(strand, stream, written, result, [&] {
    if (std::count(written.begin(), written.end(), ": keepalive\n\n") == 2) stream.finish();
  });
  io.run_for(100ms);  // no keep-alive asked: only the event
  ASSERT_EQ(written, (std::vector<std::string>{"event"}));
  net::post(strand, [&] { stream.keepalive(10ms); });
  io.restart();
  io.run();
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(written, (std::vector<std::string>{"event", ": keepalive\n\n", ": keepalive\n\n"}));
}

TEST(SseStream, AClientTooSlowToKeepUpIsDroppedNotBuffered) {
  net::io_context io;
  const net::any_io_executor strand = net::make_strand(io);
  net::steady_timer stalled(strand);  // the client's socket: a write never completes until closed
  int drops = 0;
  SseStream stream(strand, 100, [&] {
    ++drops;
    stalled.cancel();  // what closing the connection does to the write under way
  });
  std::optional<bool> result;
  std::size_t writes = 0;
  net::co_spawn(
      strand,
      [&]() -> net::awaitable<void> {
        result = co_await stream.run([&](const std::string&) -> net::awaitable<bool> {
          ++writes;
          stalled.expires_after(1h);
          auto [ec] = co_await stalled.async_wait(net::as_tuple(net::use_awaitable));
          co_return !ec;
        });
      },
      net::detached);
  net::post(strand, [&] {
    EXPECT_TRUE(stream.push(std::string(60, 'a')));  // taken by the stalled write
  });
  io.run_for(20ms);
  net::post(strand, [&] {
    EXPECT_TRUE(stream.push(std::string(60, 'b')));   // waits: 60 of 100 bytes
    EXPECT_FALSE(stream.push(std::string(60, 'c')));  // 120 > 100: too slow, dropped
    EXPECT_FALSE(stream.push("d"));
  });
  io.restart();
  io.run_for(5s);
  ASSERT_TRUE(result.has_value()) << "a dropped stream must end";
  EXPECT_FALSE(*result);
  EXPECT_TRUE(stream.dropped());
  EXPECT_EQ(drops, 1);
  EXPECT_EQ(writes, 1u) << "nothing queued is written once the client is dropped";
  EXPECT_EQ(stream.queued_bytes(), 0u) << "a dropped client's events are freed";
}

TEST(SseStream, AnEmptyQueueTakesOneEventLargerThanTheLimit) {
  net::io_context io;
  const net::any_io_executor strand = net::make_strand(io);
  SseStream stream(strand, 10);
  EXPECT_TRUE(stream.push(std::string(1000, 'x')));
  EXPECT_FALSE(stream.dropped());
  EXPECT_FALSE(stream.push("y"));
  EXPECT_TRUE(stream.dropped());
}

/// One subscriber of a hub: its stream, what it was sent, and its run's end.
struct Watcher {
  explicit Watcher(net::io_context& io) : strand(net::make_strand(io)) {}
  net::any_io_executor strand;
  std::shared_ptr<SseStream> stream;
  std::vector<std::string> written;
  std::optional<bool> result;
};

TEST(EventHub, EverySubscriberGetsTheSameSnapshotOfEachTick) {
  net::io_context io;
  std::atomic<int> taken{0};
  auto hub = std::make_shared<EventHub>(io, 20ms, [&] { return "snapshot " + std::to_string(++taken); });
  std::vector<std::unique_ptr<Watcher>> watchers;
  for (int i = 0; i < 5; ++i) {
    auto w = std::make_unique<Watcher>(io);
    w->stream = std::make_shared<SseStream>(w->strand, 1 << 20);
    Watcher& ref = *w;
    run_recording(w->strand, *w->stream, w->written, w->result, [&ref] {
      if (ref.written.size() == 4) ref.stream->finish();
    });
    hub->subscribe(w->strand, w->stream);
    watchers.push_back(std::move(w));
  }
  io.run_for(10s);  // ends when every watcher had 4 events and the hub stopped ticking
  std::size_t most = 0;
  for (const auto& w : watchers) {
    ASSERT_TRUE(w->result.has_value());
    ASSERT_EQ(w->written.size(), 4u);
    most = std::max(most, w->written.size());
    // The same events, in tick order (a watcher that joined during a tick may start one later).
    for (std::size_t i = 1; i < w->written.size(); ++i)
      EXPECT_LT(std::stoi(w->written[i - 1].substr(9)), std::stoi(w->written[i].substr(9)));
  }
  // Each tick's one snapshot went to all five: at most a tick or two more
  // than a watcher's four events (one per subscriber would be 20 or more).
  EXPECT_LE(taken.load(), static_cast<int>(most) + 2) << "one snapshot per tick, not one per subscriber";
}

TEST(EventHub, StopsTickingWhenNobodyWatchesAndStartsAgainForANewcomer) {
  net::io_context io;
  std::atomic<int> taken{0};
  auto hub = std::make_shared<EventHub>(io, 10ms, [&] { return "snapshot " + std::to_string(++taken); });
  Watcher first(io);
  first.stream = std::make_shared<SseStream>(first.strand, 1 << 20);
  run_recording(first.strand, *first.stream, first.written, first.result, [&] { first.stream->finish(); });
  hub->subscribe(first.strand, first.stream);
  io.run_for(2s);  // one event, then the watcher is done and the hub idles: run_for returns early
  ASSERT_EQ(first.written.size(), 1u);
  const int after_first = taken.load();
  EXPECT_LE(after_first, 2);
  io.restart();
  io.run_for(200ms);  // nobody watches: no snapshot (20 ticks' worth of time)
  EXPECT_EQ(taken.load(), after_first);

  Watcher second(io);
  second.stream = std::make_shared<SseStream>(second.strand, 1 << 20);
  run_recording(second.strand, *second.stream, second.written, second.result,
                [&] { second.stream->finish(); });
  hub->subscribe(second.strand, second.stream);
  io.restart();
  io.run_for(2s);
  ASSERT_EQ(second.written.size(), 1u);
  EXPECT_EQ(second.written[0], "snapshot " + std::to_string(after_first + 1))
      << "a fresh snapshot, not a stale one";
}

}  // namespace
