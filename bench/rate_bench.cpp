// bench/rate_bench.cpp — the fairgate side of bench/ratelimit.sh: 4
// RateLimiter instances (one Redis connection each) in this process on one
// event-loop thread, each with `inflight` concurrent request loops, for
// `seconds`; prints one JSON line (the same fields as bench/ratelimit/rlf.js).
//
// Usage: fairgate_rate_bench PORT PHASE SECONDS INFLIGHT RATE PERIOD_MS KEYS LOCAL(0|1) PREFIX [ALGORITHM]
#include <fairgate/rate_limiter.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Stats {
  std::vector<double> latencies_us;
  std::uint64_t allowed = 0, refused = 0, errors = 0, local = 0;
  std::map<std::int64_t, std::int64_t> windows;  // aligned window -> admitted
  std::int64_t first_at = -1, last_at = 0;       // Redis time of the first and last store decisions
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 10) {
    std::fprintf(stderr,
                 "usage: fairgate_rate_bench PORT PHASE SECONDS INFLIGHT RATE PERIOD_MS KEYS LOCAL PREFIX "
                 "[ALGORITHM]\n");
    return 2;
  }
  const std::string port = argv[1], phase = argv[2];
  const double seconds = std::stod(argv[3]);
  const int inflight = std::stoi(argv[4]);
  const std::int64_t rate = std::stoll(argv[5]), period = std::stoll(argv[6]), keys = std::stoll(argv[7]);
  const bool local = std::string(argv[8]) == "1";
  const std::string prefix = argv[9];
  const auto algorithm = fairgate::parse_rate_algorithm(argc > 10 ? argv[10] : "fixed_window");
  if (!algorithm) {
    std::fprintf(stderr, "fairgate_rate_bench: unknown algorithm\n");
    return 2;
  }
  boost::asio::io_context io;
  fairgate::RateRule rule;
  rule.algorithm = *algorithm;
  rule.rate = rate;
  rule.period_ms = period;
  std::vector<fairgate::RateLimiter> fleet;
  for (int i = 0; i < 4; ++i) {
    fairgate::RateLimiterRedisOptions o;
    o.url = "redis://127.0.0.1:" + port;
    o.key_prefix = prefix;
    o.command_timeout = std::chrono::milliseconds(2000);
    fleet.push_back(fairgate::RateLimiter::redis(io.get_executor(), o, local));
    if (auto r = fleet.back().set_rule("bench", rule); !r) {
      std::fprintf(stderr, "fairgate_rate_bench: %s\n", r.error().message().c_str());
      return 2;
    }
  }
  // Connect and load the scripts before the clock starts.
  for (auto& l : fleet) {
    bool done = false;
    l.async_check(fairgate::RateRequest{"bench", "warmup", 1}, [&](fairgate::RateResult) { done = true; });
    while (!done) io.run_one();
  }
  std::uint64_t calls_before = 0;
  for (auto& l : fleet) calls_before += l.rules()[0].stats.store_calls;

  Stats st;
  const auto start = Clock::now();
  const auto end =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::uint64_t seq = 0;
  int running = 0;  // loops still going
  std::function<void(fairgate::RateLimiter&)> loop = [&](fairgate::RateLimiter& l) {
    if (Clock::now() >= end) {
      --running;
      return;
    }
    std::string key = "flood";
    if (keys > 1) {
      key = "k";
      key += std::to_string(seq++ % keys);
    }
    const auto t0 = Clock::now();
    l.async_check(fairgate::RateRequest{"bench", key, 1}, [&, t0](fairgate::RateResult r) {
      st.latencies_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      if (!r.error && r.source == fairgate::RateSource::store) {
        if (st.first_at < 0) st.first_at = r.decisions[0].at_ms;
        st.last_at = std::max(st.last_at, r.decisions[0].at_ms);
      }
      if (r.error || r.source == fairgate::RateSource::degraded) {
        ++st.errors;
      } else if (r.allowed) {
        ++st.allowed;
        ++st.windows[r.decisions[0].at_ms / period];
      } else {
        ++st.refused;
        if (r.source == fairgate::RateSource::local_layer) ++st.local;
      }
      loop(l);
    });
  };
  for (auto& l : fleet)
    for (int j = 0; j < inflight; ++j) {
      ++running;
      loop(l);
    }
  while (running > 0) io.run_one();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  std::uint64_t calls = 0;
  for (auto& l : fleet) calls += l.rules()[0].stats.store_calls;
  calls -= calls_before;
  std::sort(st.latencies_us.begin(), st.latencies_us.end());
  auto pct = [&](double p) {
    if (st.latencies_us.empty()) return 0.0;
    return st.latencies_us[std::min(st.latencies_us.size() - 1,
                                    static_cast<std::size_t>(p / 100 * st.latencies_us.size()))];
  };
  std::int64_t max_window = 0;
  for (const auto& [w, n] : st.windows) max_window = std::max(max_window, n);
  // An exact fixed window admits `rate` in every aligned window the run
  // spanned (Redis time) under a flood.
  const std::int64_t exact =
      keys > 1 || st.first_at < 0 ? 0 : rate * (st.last_at / period - st.first_at / period + 1);
  const std::uint64_t decisions = st.allowed + st.refused;
  std::printf(
      "{\"system\":\"%s\",\"phase\":\"%s\",\"decisions\":%llu,\"allowed\":%llu,\"refused\":%llu,\"errors\":%"
      "llu,"
      "\"local_refusals\":%llu,\"seconds\":%.3f,\"per_second\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f,"
      "\"client_commands\":%llu,\"windows\":%zu,\"max_window\":%lld,\"exact\":%lld}\n",
      local ? "fairgate + local layer" : "fairgate", phase.c_str(),
      static_cast<unsigned long long>(decisions), static_cast<unsigned long long>(st.allowed),
      static_cast<unsigned long long>(st.refused), static_cast<unsigned long long>(st.errors),
      static_cast<unsigned long long>(st.local), elapsed, decisions / elapsed, pct(50), pct(99),
      static_cast<unsigned long long>(calls), keys > 1 ? std::size_t{0} : st.windows.size(),
      static_cast<long long>(max_window), static_cast<long long>(exact));
  for (auto& l : fleet) l.shutdown();
  return 0;
}
