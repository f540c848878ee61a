// api/rate_store.hpp — where rate-limit state lives, behind two calls: the
// memory store (this file's make_memory_rate_store) and the Redis store
// (src/redis/redis_rate_store.cpp, the one place that runs the rate-limit
// scripts). RateLimiter (src/api/rate_limiter.cpp) puts validation, the local
// layer and the degraded modes in front of either.
#pragma once

#include "core/rate_math.hpp"

#include <fairgate/rate_limiter.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/system/error_code.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fairgate::detail {

struct RateStoreItem {
  std::string rule_name;
  RateRule rule;
  std::string key;
  std::int64_t cost = 1;
};

struct RateStoreAnswer {
  /// Set: the store could not decide (Redis unreachable, error reply).
  boost::system::error_code error;
  std::string message;
  /// The error is the caller's (bad input), not the store's: no degraded mode.
  bool caller_error = false;
  bool allowed = false;
  std::int64_t at_ms = 0;  ///< the store's time of the decision
  std::int64_t at_us = 0;  ///< the same in microseconds (Redis; ms x 1000 in memory)
  std::vector<core::rate::Decision> decisions;
};

/// A refund's error when the store sent it, got no reply and could not find out whether it
/// ran: it may still run. Any other refund error: it did not run, and never will.
inline boost::system::error_code refund_outcome_unknown() {
  return make_error_code(boost::system::errc::operation_in_progress);
}

class RateStore {
 public:
  virtual ~RateStore() = default;
  using DecideCallback = std::function<void(RateStoreAnswer)>;
  using RefundCallback = std::function<void(boost::system::error_code, std::string, std::int64_t given)>;
  /// All-or-nothing over the items (core::rate::decide_all). The callback runs
  /// once, possibly inside this call (memory) or on the store's strand (Redis).
  virtual void decide(std::vector<RateStoreItem> items, DecideCallback done) = 0;
  virtual void refund(RateStoreItem item, std::int64_t at_ms, std::int64_t amount, RefundCallback done) = 0;
  using StatusCallback = std::function<void(boost::system::error_code, std::string)>;
  using RulesCallback = std::function<void(boost::system::error_code, std::string,
                                           std::vector<std::pair<std::string, std::string>>)>;
  /// The cluster's copy of the rules ("<prefix>:rl-rules", name → encoded
  /// rule). The memory store has none: stores nothing, loads nothing.
  virtual void store_rule(const std::string& name, const std::string& encoded, StatusCallback done) {
    (void)name;
    (void)encoded;
    done({}, {});
  }
  virtual void load_rules(RulesCallback done) { done({}, {}, {}); }
  /// True for Redis: failures follow on_redis_down.
  virtual bool remote() const noexcept = 0;
  virtual void close() {}
};

/// The in-process store; `clock_ms` gives its time (steady clock by default).
std::unique_ptr<RateStore> make_memory_rate_store(std::function<std::int64_t()> clock_ms = {});

/// A RateLimiter over `store`.
std::shared_ptr<RateLimiterImpl> make_rate_limiter_impl(boost::asio::any_io_executor executor,
                                                        std::unique_ptr<RateStore> store, bool local_layer);

}  // namespace fairgate::detail
