// Micro benchmarks of the pure core and the memory backend.
//
//   build/test/bench/fairgate_micro_bench --benchmark_min_time=0.2
//
// Figures to watch: the cost of one hand-off (release → next waiter granted)
// must not grow with the number of waiters (O(log n) in the core).
#include "core/limiter_state.hpp"

#include <fairgate/fairgate.hpp>

#include <benchmark/benchmark.h>
#include <boost/asio/io_context.hpp>

#include <vector>

namespace {

using fairgate::core::LimiterState;
using fairgate::core::RequestId;
using fairgate::core::Time;

struct GrantAll final : fairgate::core::DispatchSink {
  RequestId last = 0;
  bool try_grant(RequestId id) override {
    last = id;
    return true;
  }
  void drop(RequestId, fairgate::RejectReason) override {}
};

// Admit + release with no contention: the fast path.
void BM_CoreAdmitRelease(benchmark::State& state) {
  LimiterState ls(fairgate::Settings{.max_concurrent = 1});
  GrantAll sink;
  const Time now{};
  RequestId id = 0;
  for (auto _ : state) {
    ls.admit(++id, now, now + std::chrono::seconds(10), {});
    ls.release(id, now, sink);
  }
}
BENCHMARK(BM_CoreAdmitRelease);

// One hand-off with `waiters` queued: release the holder, the head is
// granted, a new waiter joins the back so the queue length stays constant.
void BM_CoreHandoff(benchmark::State& state) {
  const auto waiters = static_cast<RequestId>(state.range(0));
  LimiterState ls(fairgate::Settings{.max_concurrent = 1});
  GrantAll sink;
  const Time now{};
  const Time deadline = now + std::chrono::hours(1);
  RequestId next = 0;
  RequestId holder = ++next;
  ls.admit(holder, now, deadline, {});
  for (RequestId i = 0; i < waiters; ++i) ls.admit(++next, now, deadline, {});
  for (auto _ : state) {
    ls.release(holder, now, sink);
    holder = sink.last;
    ls.admit(++next, now, deadline, {});
  }
  state.counters["waiters"] = static_cast<double>(waiters);
}
BENCHMARK(BM_CoreHandoff)->Arg(10)->Arg(100)->Arg(1000)->Arg(10000);

// The whole public path: async_acquire with a callback, handler run by the
// io_context, permit released.
void BM_MemoryAcquireRelease(benchmark::State& state) {
  boost::asio::io_context io;
  auto backend = fairgate::make_memory_backend(io.get_executor());
  auto limiter = backend->open("bench", {.max_concurrent = 1}).value();
  for (auto _ : state) {
    limiter.async_acquire(fairgate::AcquireOptions{},
                          [](fairgate::AcquireResult r) { r.permit().release(); });
    io.restart();
    io.run();
  }
  backend->shutdown();
}
BENCHMARK(BM_MemoryAcquireRelease);

// A hand-off through the public API with `waiters` queued.
void BM_MemoryHandoff(benchmark::State& state) {
  boost::asio::io_context io;
  auto backend = fairgate::make_memory_backend(io.get_executor());
  auto limiter = backend->open("bench", {.max_concurrent = 1}).value();
  fairgate::Permit current;
  std::vector<fairgate::Permit> granted;
  auto enqueue = [&] {
    limiter.async_acquire(fairgate::AcquireOptions{.max_wait = std::chrono::hours(1)},
                          [&](fairgate::AcquireResult r) { granted.push_back(r.take_permit()); });
  };
  // poll(), not run(): the waiters' deadline timer keeps run() busy for an hour.
  enqueue();
  for (int64_t i = 0; i < state.range(0); ++i) enqueue();
  io.poll();
  current = std::move(granted.back());
  granted.clear();
  for (auto _ : state) {
    current.release();  // the head of the queue is granted
    enqueue();          // keep the queue length constant
    io.restart();
    io.poll();
    current = std::move(granted.back());
    granted.clear();
  }
  current.release();
  backend->shutdown();
  io.restart();
  io.poll();
}
BENCHMARK(BM_MemoryHandoff)->Arg(10)->Arg(100)->Arg(1000)->Arg(10000);

}  // namespace

BENCHMARK_MAIN();
