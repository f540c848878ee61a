// The public API with each completion token style, on the memory backend.
#include <fairgate/fairgate.hpp>

#include <gtest/gtest.h>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

#include <optional>

namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

TEST(Api, CallbackGrantsAndReleasesOnDestruction) {
  asio::io_context io;
  auto backend = fairgate::make_memory_backend(io.get_executor());
  auto lim = backend->open("chat", {.max_concurrent = 1}).value();
  std::optional<fairgate::AcquireResult> first, second;
  lim.async_acquire({}, [&](fairgate::AcquireResult r) { first = std::move(r); });
  EXPECT_FALSE(first) << "the handler must never run inside async_acquire";
  lim.async_acquire({.max_wait = 5s}, [&](fairgate::AcquireResult r) { second = std::move(r); });
  io.run_for(50ms);
  ASSERT_TRUE(first && first->granted());
  EXPECT_FALSE(second);
  EXPECT_EQ(lim.snapshot().in_use, 1u);
  EXPECT_EQ(lim.snapshot().queued, 1u);
  first.reset();  // destroys the permit: the waiter gets it
  io.restart();
  io.run_for(50ms);
  ASSERT_TRUE(second && second->granted());
  EXPECT_EQ(lim.snapshot().queued, 0u);
  second->permit().release();
  second->permit().release();  // idempotent
  EXPECT_EQ(lim.snapshot().in_use, 0u);
  EXPECT_EQ(lim.snapshot().stats.releases, 2u);
}

TEST(Api, FutureFromAnotherThread) {
  asio::thread_pool pool(2);
  auto backend = fairgate::make_memory_backend(pool.get_executor());
  auto lim = backend->open("f", {.max_concurrent = 1}).value();
  auto a = lim.async_acquire({}, asio::use_future).get();
  ASSERT_TRUE(a.granted());
  auto fut = lim.async_acquire({.max_wait = 100ms}, asio::use_future);
  auto b = fut.get();
  EXPECT_EQ(b.outcome(), fairgate::Outcome::timed_out);
  EXPECT_EQ(b.reason(), fairgate::RejectReason::timeout);
  EXPECT_GE(b.waited(), 100ms);
  EXPECT_EQ(b.error(), fairgate::RejectReason::timeout);
  backend->shutdown();
  pool.join();
}

TEST(Api, AwaitableWithCancellationByTimerRace) {
  using namespace asio::experimental::awaitable_operators;
  asio::io_context io;
  auto backend = fairgate::make_memory_backend(io.get_executor());
  auto lim = backend->open("c", {.max_concurrent = 1}).value();
  fairgate::Permit held;
  bool cancelled = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        fairgate::AcquireOptions first_options;
        auto first = co_await lim.async_acquire(first_options, asio::use_awaitable);
        held = first.take_permit();
        asio::steady_timer timer(co_await asio::this_coro::executor, 30ms);
        fairgate::AcquireOptions opts;
        auto which =
            co_await (lim.async_acquire(opts, asio::use_awaitable) || timer.async_wait(asio::use_awaitable));
        cancelled = which.index() == 1;
      },
      asio::detached);
  io.run_for(500ms);
  EXPECT_TRUE(cancelled);
  auto s = lim.snapshot();
  EXPECT_EQ(s.queued, 0u) << "a cancelled waiter must leave the queue";
  EXPECT_EQ(s.stats.cancels, 1u);
  EXPECT_EQ(s.in_use, 1u);
}

TEST(Api, CancellationSignalWhileQueued) {
  asio::io_context io;
  auto backend = fairgate::make_memory_backend(io.get_executor());
  auto lim = backend->open("s", {.max_concurrent = 1}).value();
  auto held = lim.async_acquire({}, asio::use_future);
  asio::cancellation_signal signal;
  std::optional<fairgate::AcquireResult> r;
  lim.async_acquire(
      {}, asio::bind_cancellation_slot(signal.slot(), [&](fairgate::AcquireResult x) { r = std::move(x); }));
  io.poll();
  signal.emit(asio::cancellation_type::terminal);
  io.poll();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->outcome(), fairgate::Outcome::cancelled);
  EXPECT_EQ(lim.snapshot().queued, 0u);
}

TEST(Api, RunHelperReleasesAfterWork) {
  asio::thread_pool pool(1);
  auto backend = fairgate::make_memory_backend(pool.get_executor());
  auto lim = backend->open("r", {.max_concurrent = 1}).value();
  auto r = fairgate::run(lim, [&] { return lim.snapshot().in_use; });
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, 1u);
  EXPECT_EQ(lim.snapshot().in_use, 0u);
  backend->shutdown();
  pool.join();
}

}  // namespace
