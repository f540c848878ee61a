// fairgate/rate_limiter.hpp — rate limiting ("how many per period", R1–R3):
// named rules (fairgate/rate_rule.hpp) checked for a caller's key, in this
// process (memory) or cluster-wide through Redis, with an in-process first
// layer in front of Redis. Semantics: docs/ratelimit.md.
//
// A RateLimiter is a cheap, copyable handle. Every member function may be
// called from any thread. Decisions complete through any Asio completion
// token (a callback, use_future, use_awaitable), never inside the call.
#pragma once

#include <fairgate/detail/completion.hpp>
#include <fairgate/error.hpp>
#include <fairgate/rate_rule.hpp>
#include <fairgate/settings.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/system/result.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fairgate {

/// One rule to check for one key at one cost.
struct RateRequest {
  std::string rule;
  std::string key;  ///< the dimension value (a user id, an IP, "global", ...)
  std::int64_t cost = 1;
};

/// Who answered a decision.
enum class RateSource : std::uint8_t {
  store,        ///< the shared state: Redis, or the memory backend
  local_layer,  ///< refused in process: the key is known to be over its limit (R3)
  degraded,     ///< Redis was unreachable: the rules' on_redis_down policy decided
};
std::string_view to_string(RateSource source) noexcept;

/// One rule's answer.
struct RateDecision {
  std::string rule;
  std::string key;
  std::int64_t cost = 0;
  bool allowed = false;  ///< this rule alone would allow the cost
  /// The rule runs in shadow mode: `allowed` says what it would do, and a
  /// refusal does not refuse the check (docs/shadow.md).
  bool shadow = false;
  std::int64_t limit = 0;  ///< the rule's capacity (rate, or burst for buckets)
  std::int64_t remaining = 0;
  std::chrono::milliseconds reset{0};
  /// Refused: when the same cost would be allowed if nothing else arrived;
  /// -1 ms = never (the cost exceeds the rule's capacity). Allowed: 0.
  std::chrono::milliseconds retry_after{0};
  /// The decision's time in the store's clock (Redis TIME in ms, or the
  /// memory backend's steady clock); refunds name their decision by it.
  std::int64_t at_ms = 0;
  /// The same in microseconds: orders the decisions of every instance as
  /// Redis made them (one script at a time).
  std::int64_t at_us = 0;
  /// The check took this decision's cost from its rule: the check was allowed
  /// (a shadow rule: its own part was). Only such a decision can be refunded;
  /// `allowed` alone is not enough, since in a refused check the other rules'
  /// decisions say they would allow, and took nothing.
  bool taken = false;
};

/// The answer to one check: allowed only if every rule allowed; when one
/// refused, nothing was taken from any of them. Rules in shadow mode are
/// decided apart (their decisions have `shadow` set): they never refuse the
/// check, and what they would allow takes their units whatever the others do.
struct RateResult {
  /// Empty for a decision (allowed or refused). Otherwise the check was not
  /// made: Errc::unknown_rule, RejectReason::invalid_argument (bad key or
  /// cost: see `message`), Errc::shut_down.
  boost::system::error_code error;
  std::string message;  ///< refused or failed: why, one line ("cost 12 exceeds ...")
  bool allowed = false;
  RateSource source = RateSource::store;
  /// On a refusal while degraded under `closed`: RejectReason::unavailable.
  std::optional<RejectReason> reason;
  std::vector<RateDecision> decisions;  ///< one per request, in order

  /// The longest retry_after of the refusing rules (0 when allowed); -1 ms
  /// (never) when one of them can never allow its cost, over its capacity.
  std::chrono::milliseconds retry_after() const;
  explicit operator bool() const noexcept { return !error && allowed; }
};

/// How a refund ended.
struct RefundResult {
  /// As RateResult::error, or Errc::unavailable: Redis unreachable. Its message starts "refund
  /// not applied" (nothing came back; sending it again is safe) or "refund outcome unknown"
  /// (Redis got it and did not answer: it may still run; its units count as given back).
  boost::system::error_code error;
  std::string message;
  std::int64_t refunded = 0;  ///< units given back (0 once the decision's window has passed)
};

/// How a cluster-wide rule change (async_publish_rule) or a pull of the
/// cluster's rules (async_sync_rules) ended.
struct RuleUpdateResult {
  /// Empty: done. Otherwise Errc::unknown_rule, Errc::invalid_settings (see
  /// `message`, "rate: 0 is not in ..."), Errc::unavailable (Redis did not
  /// confirm: nothing changed), Errc::shut_down.
  boost::system::error_code error;
  std::string message;
  /// async_sync_rules: rules of this instance that the cluster's copy changed.
  std::size_t changed = 0;
};

/// Counters of one rule on this instance.
struct RateRuleStats {
  std::uint64_t allowed = 0;
  std::uint64_t refused = 0;
  std::uint64_t local_refusals = 0;  ///< refused by the local layer, no store round trip
  std::uint64_t store_errors = 0;    ///< Redis calls that failed (timeout, disconnect, error reply)
  std::uint64_t degraded = 0;        ///< decisions made under on_redis_down
  std::uint64_t refunded = 0;        ///< units given back
  std::uint64_t store_calls = 0;     ///< round trips to the store
};

/// A rule with its name, as RateLimiter::rules() lists it.
struct NamedRateRule {
  std::string name;
  RateRule rule;
  RateRuleStats stats;
};

/// Options of the Redis store.
struct RateLimiterRedisOptions {
  std::string url = "redis://127.0.0.1:6379";
  /// Keys are "<key_prefix>:rl:{<rule>:<key>}:<algorithm>" (one hash tag per key).
  std::string key_prefix = "fairgate";
  /// One decision's round trip; past it the rules' on_redis_down decides.
  std::chrono::milliseconds command_timeout{200};
};

namespace detail {
class RateLimiterImpl;
using RateCompletion = BasicCompletion<RateResult>;
using RefundCompletion = BasicCompletion<RefundResult>;
using RuleUpdateCompletion = BasicCompletion<RuleUpdateResult>;
boost::asio::any_io_executor executor_of(const RateLimiterImpl& impl);
void start_check(RateLimiterImpl& impl, std::vector<RateRequest> requests,
                 std::unique_ptr<RateCompletion> completion);
void start_refund(RateLimiterImpl& impl, RateDecision decision, std::int64_t amount,
                  std::unique_ptr<RefundCompletion> completion);
void start_publish_rule(RateLimiterImpl& impl, std::string name, RateRule rule,
                        std::unique_ptr<RuleUpdateCompletion> completion);
void start_sync_rules(RateLimiterImpl& impl, std::unique_ptr<RuleUpdateCompletion> completion);
}  // namespace detail

class RateLimiter {
 public:
  using executor_type = boost::asio::any_io_executor;

  /// Rules and state in this process.
  static RateLimiter memory(executor_type executor);
  /// Rules in this process, state in Redis (shared by every instance using
  /// the same Redis and key prefix). Throws std::invalid_argument for a bad
  /// URL or prefix. `local_layer` = false turns the first layer off (for
  /// measurements; it never allows more either way).
  static RateLimiter redis(executor_type executor, RateLimiterRedisOptions options, bool local_layer = true);

  RateLimiter() = default;
  explicit RateLimiter(std::shared_ptr<detail::RateLimiterImpl> impl) noexcept : impl_(std::move(impl)) {}
  bool valid() const noexcept { return impl_ != nullptr; }
  executor_type get_executor() const;

  /// Adds or replaces the rule `name` on this instance (validated first). A
  /// replaced rule keeps its keys' state when the algorithm stays the same.
  boost::system::result<void, SettingsError> set_rule(std::string_view name, const RateRule& rule);
  std::optional<RateRule> rule(std::string_view name) const;
  /// Every rule, sorted by name, with this instance's counters.
  std::vector<NamedRateRule> rules() const;
  /// True while the last store call failed (Redis unreachable).
  bool degraded() const;
  /// (rule, key) pairs the local layer knows to be over their limit now, or
  /// until a sweep finds them expired (it runs whenever their number doubled;
  /// never more than 100,000). A store in this process keeps none.
  std::size_t local_layer_keys() const;

  /// Checks one rule. Signature void(RateResult).
  template <typename Token>
  auto async_check(RateRequest request, Token&& token) {
    std::vector<RateRequest> v;
    v.push_back(std::move(request));
    return async_check(std::move(v), std::forward<Token>(token));
  }
  /// Checks several rules for one request at once, atomically: allowed only
  /// if all allow, and then each takes its cost; otherwise none takes
  /// anything. A (rule, key) pair may appear once.
  template <typename Token>
  auto async_check(std::vector<RateRequest> requests, Token&& token) {
    return boost::asio::async_initiate<Token, void(RateResult)>(
        [impl = checked_impl()](auto handler, std::vector<RateRequest> r) {
          detail::start_check(
              *impl, std::move(r),
              detail::make_completion<RateResult>(std::move(handler), detail::executor_of(*impl)));
        },
        token, std::move(requests));
  }
  /// Gives back `amount` (1..decision.cost) units of a decision that took
  /// them (`taken`; otherwise invalid_argument, nothing changes).
  /// Signature void(RefundResult). See docs/ratelimit.md for what each
  /// algorithm does with a refund, and when it is too late.
  template <typename Token>
  auto async_refund(RateDecision decision, std::int64_t amount, Token&& token) {
    return boost::asio::async_initiate<Token, void(RefundResult)>(
        [impl = checked_impl()](auto handler, RateDecision d, std::int64_t a) {
          detail::start_refund(
              *impl, std::move(d), a,
              detail::make_completion<RefundResult>(std::move(handler), detail::executor_of(*impl)));
        },
        token, std::move(decision), amount);
  }

  /// Changes the existing rule `name` for the whole cluster: on Redis the rule
  /// is stored under "<key_prefix>:rl-rules" first (every instance picks it
  /// up with async_sync_rules), then set here; on memory it is set here.
  /// Signature void(RuleUpdateResult). A rule stored in Redis wins over an
  /// instance's own (its config) from the next sync on.
  template <typename Token>
  auto async_publish_rule(std::string name, RateRule rule, Token&& token) {
    return boost::asio::async_initiate<Token, void(RuleUpdateResult)>(
        [impl = checked_impl()](auto handler, std::string n, RateRule r) {
          detail::start_publish_rule(
              *impl, std::move(n), r,
              detail::make_completion<RuleUpdateResult>(std::move(handler), detail::executor_of(*impl)));
        },
        token, std::move(name), rule);
  }
  /// Pulls the rules stored in Redis and applies those this instance knows
  /// (by name) where they differ. Memory: nothing to pull. Signature
  /// void(RuleUpdateResult); `changed` counts the rules changed here.
  template <typename Token>
  auto async_sync_rules(Token&& token) {
    return boost::asio::async_initiate<Token, void(RuleUpdateResult)>(
        [impl = checked_impl()](auto handler) {
          detail::start_sync_rules(*impl, detail::make_completion<RuleUpdateResult>(
                                              std::move(handler), detail::executor_of(*impl)));
        },
        token);
  }

  /// Fails every later call with Errc::shut_down and closes the Redis connection.
  void shutdown();

 private:
  const std::shared_ptr<detail::RateLimiterImpl>& checked_impl() const;
  std::shared_ptr<detail::RateLimiterImpl> impl_;
};

}  // namespace fairgate

// CompletionBox::complete is defined in limiter.hpp.
#include <fairgate/limiter.hpp>
