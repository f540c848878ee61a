// api/rate_limiter.cpp — RateLimiter: validation, the local first layer (R3),
// the degraded modes (D1) and counters, in front of a RateStore; and the
// memory store.
#include "api/rate_store.hpp"

#include <fairgate/log.hpp>
#include <fairgate/rate_limiter.hpp>

#include <boost/asio/post.hpp>

#include <algorithm>
#include <chrono>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <unordered_map>

namespace fairgate {

namespace rate = core::rate;

std::string_view to_string(RateSource source) noexcept {
  switch (source) {
    case RateSource::store: return "store";
    case RateSource::local_layer: return "local_layer";
    case RateSource::degraded: return "degraded";
  }
  return "?";
}

std::chrono::milliseconds RateResult::retry_after() const {
  std::chrono::milliseconds out{0};
  for (const auto& d : decisions) {
    if (d.allowed || d.shadow) continue;
    if (d.retry_after.count() < 0) return d.retry_after;  // never: no wait helps
    out = std::max(out, d.retry_after);
  }
  return out;
}

namespace detail {

namespace {

/// at_us of a decision made under on_redis_down = open: nothing was counted, nothing is refunded.
/// (Decisions of the local fallback have at_us < 0 as well, numbered from -1.)
constexpr std::int64_t kOpenDecision = std::numeric_limits<std::int64_t>::min();

std::int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string state_key(const RateStoreItem& item) {
  std::string k = item.rule_name;
  k += '\0';
  k += item.key;
  k += '\0';
  k += to_string(item.rule.algorithm);
  return k;
}

/// A completion that calls a function (in the calling context: the
/// function must not block or take the limiter's lock).
template <typename R>
class FunctionCompletion final : public BasicCompletion<R> {
 public:
  explicit FunctionCompletion(std::function<void(R)> f) : f_(std::move(f)) {}
  void complete(R result) override { f_(std::move(result)); }

 private:
  std::function<void(R)> f_;
};

// The cluster's copy of a rule: "algorithm rate period_ms burst on_redis_down local_divisor
// [mode]" (mode since shadow mode; absent = enforce).
std::string encode_rule(const RateRule& r) {
  std::string out(to_string(r.algorithm));
  for (const auto v : {r.rate, r.period_ms, r.burst}) {
    out += ' ';
    out += std::to_string(v);
  }
  out += ' ';
  out += to_string(r.on_redis_down);
  out += ' ';
  out += std::to_string(r.local_divisor);
  if (r.mode != LimiterMode::enforce) {
    out += ' ';
    out += to_string(r.mode);
  }
  return out;
}

std::optional<RateRule> decode_rule(const std::string& text) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= text.size()) {
    const auto sp = text.find(' ', start);
    parts.push_back(text.substr(start, sp == std::string::npos ? std::string::npos : sp - start));
    if (sp == std::string::npos) break;
    start = sp + 1;
  }
  if (parts.size() == 7) {
    const auto m = parse_limiter_mode(parts[6]);
    auto rest = m ? decode_rule(text.substr(0, text.rfind(' '))) : std::nullopt;
    if (!rest) return std::nullopt;
    rest->mode = *m;
    return rest;
  }
  if (parts.size() != 6) return std::nullopt;
  RateRule r;
  const auto a = parse_rate_algorithm(parts[0]);
  const auto p = parse_redis_down_policy(parts[4]);
  if (!a || !p) return std::nullopt;
  r.algorithm = *a;
  r.on_redis_down = *p;
  try {
    std::size_t used = 0;
    std::int64_t* fields[] = {&r.rate, &r.period_ms, &r.burst, nullptr, &r.local_divisor};
    for (std::size_t i = 1; i < 6; ++i) {
      if (i == 4) continue;
      *fields[i - 1] = std::stoll(parts[i], &used);
      if (used != parts[i].size()) return std::nullopt;
    }
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (validate(r)) return std::nullopt;
  return r;
}

// --- the memory store --------------------------------------------------------
class MemoryRateStore final : public RateStore {
 public:
  explicit MemoryRateStore(std::function<std::int64_t()> clock) : clock_(std::move(clock)) {
    if (!clock_) clock_ = steady_ms;
  }

  void decide(std::vector<RateStoreItem> items, DecideCallback done) override {
    RateStoreAnswer answer;
    {
      std::lock_guard lock(mutex_);
      const std::int64_t now = clock_();
      std::vector<rate::Check> checks;
      checks.reserve(items.size());
      for (const auto& item : items) {
        auto [it, fresh] = slots_.try_emplace(state_key(item));
        if (fresh || it->second.rule.algorithm != item.rule.algorithm)
          it->second.state = rate::initial_state(item.rule.algorithm);
        it->second.rule = item.rule;
        checks.push_back({&it->second.rule, &it->second.state, item.cost});
      }
      answer.allowed = rate::decide_all(checks, now, answer.decisions);
      answer.at_ms = now;
      // Unique per decision (refunds name their decision by it), in order.
      last_us_ = std::max(now * 1000, last_us_ + 1);
      answer.at_us = last_us_;
      if (++decisions_ % 4096 == 0) sweep(now);
    }
    done(std::move(answer));
  }

  void refund(RateStoreItem item, std::int64_t at_ms, std::int64_t amount, RefundCallback done) override {
    std::int64_t given = 0;
    {
      std::lock_guard lock(mutex_);
      auto it = slots_.find(state_key(item));
      if (it != slots_.end() && it->second.rule.algorithm == item.rule.algorithm)
        given = rate::refund(item.rule, it->second.state, clock_(), at_ms, amount);
    }
    done({}, {}, given);
  }

  bool remote() const noexcept override { return false; }

 private:
  struct Slot {
    RateRule rule;
    rate::State state;
  };

  // Forgets the states that are initial again (what a Redis TTL does).
  void sweep(std::int64_t now) {
    for (auto it = slots_.begin(); it != slots_.end();)
      it = rate::ttl_ms(it->second.rule, it->second.state, now) == 0 ? slots_.erase(it) : std::next(it);
  }

  std::function<std::int64_t()> clock_;
  std::mutex mutex_;
  std::unordered_map<std::string, Slot> slots_;
  std::uint64_t decisions_ = 0;
  std::int64_t last_us_ = 0;
};

}  // namespace

std::unique_ptr<RateStore> make_memory_rate_store(std::function<std::int64_t()> clock_ms) {
  return std::make_unique<MemoryRateStore>(std::move(clock_ms));
}

// --- RateLimiterImpl -------------------------------------------------------------
class RateLimiterImpl : public std::enable_shared_from_this<RateLimiterImpl> {
 public:
  RateLimiterImpl(boost::asio::any_io_executor executor, std::unique_ptr<RateStore> store, bool local_layer)
      : executor_(std::move(executor)),
        store_(std::move(store)),
        local_layer_(local_layer),
        fallback_(make_memory_rate_store()) {}

  ~RateLimiterImpl() { store_->close(); }

  const boost::asio::any_io_executor& executor() const { return executor_; }

  boost::system::result<void, SettingsError> set_rule(std::string_view name, const RateRule& rule) {
    if (auto e = validate_rule_name(name)) return *e;
    if (auto e = validate(rule)) return *e;
    std::lock_guard lock(mutex_);
    auto& entry = rules_[std::string(name)];
    entry.rule = rule;
    // A changed rule invalidates what the local layer learnt under the old one.
    for (auto it = blocks_.begin(); it != blocks_.end();)
      it = it->first.rule == name ? blocks_.erase(it) : std::next(it);
    return {};
  }

  std::optional<RateRule> rule(std::string_view name) const {
    std::lock_guard lock(mutex_);
    auto it = rules_.find(name);
    if (it == rules_.end()) return std::nullopt;
    return it->second.rule;
  }

  std::vector<NamedRateRule> rules() const {
    std::lock_guard lock(mutex_);
    std::vector<NamedRateRule> out;
    for (const auto& [name, entry] : rules_) out.push_back({name, entry.rule, entry.stats});
    return out;
  }

  bool degraded() const { return degraded_.load(); }
  std::size_t local_layer_keys() const {
    std::lock_guard lock(mutex_);
    return blocks_.size();
  }

  void publish_rule(std::string name, RateRule rule, std::unique_ptr<RuleUpdateCompletion> completion) {
    std::shared_ptr<RuleUpdateCompletion> done(std::move(completion));
    auto fail_with = [&](boost::system::error_code ec, std::string message) {
      done->complete(RuleUpdateResult{ec, std::move(message), 0});
    };
    if (shut_) return fail_with(Errc::shut_down, "the rate limiter has been shut down");
    {
      std::lock_guard lock(mutex_);
      if (rules_.find(name) == rules_.end())
        return fail_with(Errc::unknown_rule, "rule \"" + name + "\": unknown");
    }
    if (auto e = validate(rule)) return fail_with(Errc::invalid_settings, e->message());
    store_->store_rule(
        name, encode_rule(rule),
        [self = shared_from_this(), done, name, rule](boost::system::error_code ec, std::string m) {
          if (ec) {
            done->complete(RuleUpdateResult{make_error_code(Errc::unavailable),
                                            "rule not changed: Redis did not confirm (" + m + ")", 0});
            return;
          }
          (void)self->set_rule(name, rule);
          {
            std::lock_guard lock(self->mutex_);
            self->stored_.insert(name);
          }
          done->complete(RuleUpdateResult{{}, {}, 1});
        });
  }

  void sync_rules(std::unique_ptr<RuleUpdateCompletion> completion) {
    std::shared_ptr<RuleUpdateCompletion> done(std::move(completion));
    if (shut_) return done->complete(RuleUpdateResult{make_error_code(Errc::shut_down), "shut down", 0});
    store_->load_rules(
        [self = shared_from_this(), done](boost::system::error_code ec, std::string m,
                                          std::vector<std::pair<std::string, std::string>> stored) {
          if (ec) return done->complete(RuleUpdateResult{make_error_code(Errc::unavailable), m, 0});
          std::size_t changed = 0;
          std::set<std::string> listed;
          for (const auto& [name, text] : stored) {
            listed.insert(name);
            const auto rule = decode_rule(text);
            if (!rule) continue;  // written by a newer version, or garbage: keep ours
            const auto current = self->rule(name);
            if (!current) continue;  // only rules this instance has
            {
              std::lock_guard lock(self->mutex_);
              self->stored_.insert(name);
            }
            if (*current == *rule) continue;
            if (self->set_rule(name, *rule)) ++changed;
          }
          // A rule in force from the store that the store no longer has (Redis lost its data:
          // FLUSHALL, a restart without persistence) is written back, so that an instance
          // started now takes it rather than its config file's.
          std::vector<std::pair<std::string, RateRule>> lost;
          {
            std::lock_guard lock(self->mutex_);
            for (const auto& name : self->stored_) {
              auto it = self->rules_.find(name);
              if (it != self->rules_.end() && !listed.count(name)) lost.emplace_back(name, it->second.rule);
            }
          }
          if (lost.empty()) return done->complete(RuleUpdateResult{{}, {}, changed});
          // Done once every write-back is answered (an instance that syncs next finds them).
          auto pending = std::make_shared<std::atomic<std::size_t>>(lost.size());
          for (const auto& [name, rule] : lost)
            self->store_->store_rule(name, encode_rule(rule),
                                     [done, pending, changed](boost::system::error_code, std::string) {
                                       if (pending->fetch_sub(1) == 1)
                                         done->complete(RuleUpdateResult{{}, {}, changed});
                                     });
        });
  }

  void shutdown() {
    shut_ = true;
    store_->close();
  }

  /// `split` = false: the requests are all enforced or all shadowed (a part
  /// of check_with_shadows).
  void check(std::vector<RateRequest> requests, std::unique_ptr<RateCompletion> completion,
             bool split = true) {
    std::shared_ptr<RateCompletion> done(std::move(completion));
    auto finish = [done](RateResult r) {
      // One store decision: every rule's cost was taken, or none (a part of check_with_shadows
      // is one such decision; merge_shadows keeps each part's flags).
      for (auto& d : r.decisions) d.taken = !r.error && r.allowed && d.at_us != kOpenDecision;
      done->complete(std::move(r));
    };
    RateResult result;
    if (shut_) return fail(finish, Errc::shut_down, "the rate limiter has been shut down");
    if (requests.empty())
      return fail(finish, RejectReason::invalid_argument, "rules: at least one rule to check");
    if (requests.size() > 32)
      return fail(finish, RejectReason::invalid_argument, "rules: at most 32 per check");
    std::vector<RateStoreItem> items;
    {
      std::unique_lock lock(mutex_);
      // Every request is checked before any part is sent, shadowed or not: a check that fails
      // takes nothing from any rule.
      std::set<std::pair<std::string_view, std::string_view>> seen;
      std::vector<bool> shadow;
      for (const auto& rq : requests) {
        auto it = rules_.find(rq.rule);
        if (it == rules_.end()) return fail(finish, Errc::unknown_rule, "rule \"" + rq.rule + "\": unknown");
        if (auto e = validate_rate_key(rq.key))
          return fail(finish, RejectReason::invalid_argument, e->message());
        if (auto e = validate_cost(rq.cost))
          return fail(finish, RejectReason::invalid_argument, e->message());
        if (!seen.insert({rq.rule, rq.key}).second)
          return fail(finish, RejectReason::invalid_argument,
                      "rules: rule \"" + rq.rule + "\" with key \"" + rq.key + "\" appears twice");
        items.push_back({rq.rule, it->second.rule, rq.key, rq.cost});
        shadow.push_back(it->second.rule.mode == LimiterMode::shadow);
      }
      if (split && std::find(shadow.begin(), shadow.end(), true) != shadow.end()) {
        lock.unlock();  // the parts come back here (split = false)
        return check_with_shadows(std::move(requests), std::move(shadow), std::move(done));
      }
      // A cost above a rule's capacity can never be allowed: refused here.
      for (const auto& item : items) {
        if (item.cost <= item.rule.capacity()) continue;
        result.message = "cost " + std::to_string(item.cost) + " exceeds the capacity " +
                         std::to_string(item.rule.capacity()) + " of rule \"" + item.rule_name +
                         "\": it can never be allowed";
        return finish(local_answer(items, item, -1, std::move(result.message), false));
      }
      // The local layer: a key known to be over its limit until a time.
      if (local_layer_ && store_->remote()) {
        const std::int64_t now = steady_ms();
        for (const auto& item : items) {
          auto b = blocks_.find(BlockKey{item.rule_name, item.key});
          if (b == blocks_.end()) continue;
          if (now >= b->second.until) {
            blocks_.erase(b);
            continue;
          }
          if (item.cost < b->second.min_cost) continue;
          return finish(local_answer(items, item, b->second.until - now,
                                     "rule \"" + item.rule_name + "\": over its limit (local layer)", true));
        }
      }
      for (const auto& item : items) ++rules_[item.rule_name].stats.store_calls;
    }
    const std::int64_t sent = steady_ms();
    store_->decide(items, [self = shared_from_this(), items, sent, finish](RateStoreAnswer answer) mutable {
      self->on_answer(std::move(items), sent, std::move(answer), finish);
    });
  }

  /// Shadow mode (docs/shadow.md): the enforced rules are checked together
  /// (atomic among themselves), the shadowed ones apart; the answer is the
  /// enforced rules' (allowed when there are none), with every decision in
  /// the order asked and the shadowed ones marked.
  void check_with_shadows(std::vector<RateRequest> requests, std::vector<bool> shadow,
                          std::shared_ptr<RateCompletion> done) {
    struct Join {
      std::mutex mu;
      int pending = 0;
      std::vector<bool> shadow;
      RateResult enforced, shadowed;
      bool has_enforced = false;
      std::shared_ptr<RateCompletion> done;
    };
    auto join = std::make_shared<Join>();
    join->shadow = std::move(shadow);
    join->done = std::move(done);
    std::vector<RateRequest> enforced, shadowed;
    for (std::size_t i = 0; i < requests.size(); ++i)
      (join->shadow[i] ? shadowed : enforced).push_back(std::move(requests[i]));
    join->has_enforced = !enforced.empty();
    join->pending = join->has_enforced ? 2 : 1;
    const auto part = [join](bool is_shadow) {
      return std::make_unique<FunctionCompletion<RateResult>>([join, is_shadow](RateResult r) {
        {
          std::lock_guard lock(join->mu);
          (is_shadow ? join->shadowed : join->enforced) = std::move(r);
          if (--join->pending > 0) return;
        }
        join->done->complete(merge_shadows(*join));
      });
    };
    if (join->has_enforced) check(std::move(enforced), part(false), false);
    check(std::move(shadowed), part(true), false);
  }

  template <class Join>
  static RateResult merge_shadows(Join& j) {
    const RateResult& failed = j.has_enforced && j.enforced.error ? j.enforced : j.shadowed;
    if (failed.error) {
      RateResult r;
      r.error = failed.error;
      r.message = failed.message;
      return r;
    }
    RateResult r = j.has_enforced ? std::move(j.enforced) : RateResult{};
    if (!j.has_enforced) {
      r.allowed = true;
      r.source = j.shadowed.source;
    }
    std::vector<RateDecision> mine = std::move(r.decisions);
    r.decisions.clear();
    std::size_t e = 0, s = 0;
    for (const bool is_shadow : j.shadow) {
      if (is_shadow) {
        if (s >= j.shadowed.decisions.size()) continue;
        RateDecision d = std::move(j.shadowed.decisions[s++]);
        d.shadow = true;
        r.decisions.push_back(std::move(d));
      } else if (e < mine.size()) {
        r.decisions.push_back(std::move(mine[e++]));
      }
    }
    return r;
  }

  void refund(RateDecision decision, std::int64_t amount, std::unique_ptr<RefundCompletion> completion) {
    std::shared_ptr<RefundCompletion> done(std::move(completion));
    auto fail_refund = [&](boost::system::error_code ec, std::string message) {
      done->complete(RefundResult{ec, std::move(message), 0});
    };
    if (shut_) return fail_refund(Errc::shut_down, "the rate limiter has been shut down");
    RateStoreItem item;
    {
      std::lock_guard lock(mutex_);
      auto it = rules_.find(decision.rule);
      if (it == rules_.end())
        return fail_refund(Errc::unknown_rule, "rule \"" + decision.rule + "\": unknown");
      if (auto e = validate_rate_key(decision.key))
        return fail_refund(RejectReason::invalid_argument, e->message());
      if (!decision.taken)
        return fail_refund(RejectReason::invalid_argument,
                           decision.allowed ? "decision: it took nothing (another rule refused its check)"
                                            : "decision: it took nothing (refused)");
      if (amount < 1 || amount > decision.cost)
        return fail_refund(RejectReason::invalid_argument,
                           "amount: " + std::to_string(amount) + " is not in 1.." +
                               std::to_string(decision.cost) + " (what the decision took)");
      // No more back than the decision took, over all its refunds (on this instance).
      const std::int64_t now = steady_ms();
      while (!refund_expiry_.empty() && refund_expiry_.front().first <= now) {
        refunds_.erase(refund_expiry_.front().second);
        refund_expiry_.pop_front();
      }
      RefundKey rk{decision.rule + '\0' + decision.key, decision.at_us};
      auto [left, fresh] = refunds_.try_emplace(rk, decision.cost);
      if (fresh) refund_expiry_.emplace_back(now + 2 * it->second.rule.period_ms + 1000, rk);
      if (amount > left->second)
        return fail_refund(RejectReason::invalid_argument,
                           "amount: " + std::to_string(amount) + " exceeds the " +
                               std::to_string(left->second) + " units of this decision not refunded yet");
      left->second -= amount;
      item = {decision.rule, it->second.rule, decision.key, decision.cost};
      blocks_.erase(BlockKey{decision.rule, decision.key});  // it may fit again now
    }
    // A decision of the fallback (Redis was unreachable) is refunded where it was counted.
    RateStore& store = decision.at_us < 0 ? *fallback_ : *store_;
    if (decision.at_us < 0) item.rule = rate::local_share(item.rule);
    store.refund(
        item, decision.at_ms, amount,
        [self = shared_from_this(), done, name = decision.rule,
         rk = RefundKey{decision.rule + '\0' + decision.key, decision.at_us},
         amount](boost::system::error_code ec, std::string message, std::int64_t given) {
          std::lock_guard lock(self->mutex_);
          auto& st = self->rules_[name].stats;
          if (ec) {
            ++st.store_errors;
            // Unknown: it may run yet, so its units stay counted as given back (no more than the
            // decision took, even if it is sent again). Else it did not run (and never will): the
            // decision may still give these units back.
            const bool unknown = ec == detail::refund_outcome_unknown();
            if (auto left = self->refunds_.find(rk); !unknown && left != self->refunds_.end())
              left->second += amount;
            done->complete(RefundResult{
                make_error_code(Errc::unavailable),
                unknown ? "refund outcome unknown: " + message +
                              "; Redis may still apply it (sent again, it may give the units back twice)"
                        : "refund not applied: " + message,
                0});
            return;
          }
          st.refunded += static_cast<std::uint64_t>(given);
          done->complete(RefundResult{{}, {}, given});
        });
  }

 private:
  struct BlockKey {
    std::string rule;
    std::string key;
    friend bool operator<(const BlockKey& a, const BlockKey& b) {
      return a.rule != b.rule ? a.rule < b.rule : a.key < b.key;
    }
  };
  struct Block {
    std::int64_t until = 0;     // steady ms
    std::int64_t min_cost = 1;  // costs below this may still fit
  };
  struct Entry {
    RateRule rule;
    RateRuleStats stats;
  };
  using RefundKey = std::pair<std::string, std::int64_t>;  // (rule \0 key, at_us)

  template <class Finish, class Code>
  static void fail(Finish& finish, Code code, std::string message) {
    RateResult r;
    r.error = make_error_code(code);
    r.message = std::move(message);
    finish(std::move(r));
  }

  static RateDecision base_decision(const RateStoreItem& item) {
    RateDecision d;
    d.rule = item.rule_name;
    d.key = item.key;
    d.cost = item.cost;
    d.limit = item.rule.capacity();
    return d;
  }

  // A refusal made here without the store (mutex_ held). Other rules are
  // reported allowed with remaining -1: not known, the store was not asked.
  RateResult local_answer(const std::vector<RateStoreItem>& items, const RateStoreItem& refusing,
                          std::int64_t retry_ms, std::string message, bool counts_as_local) {
    RateResult r;
    r.allowed = false;
    r.source = RateSource::local_layer;
    r.message = std::move(message);
    for (const auto& item : items) {
      RateDecision d = base_decision(item);
      if (&item == &refusing) {
        d.allowed = false;
        d.retry_after = std::chrono::milliseconds(retry_ms);
        d.reset = std::chrono::milliseconds(std::max<std::int64_t>(0, retry_ms));
      } else {
        d.allowed = true;
        d.remaining = -1;
      }
      r.decisions.push_back(std::move(d));
    }
    auto& st = rules_[refusing.rule_name].stats;
    ++st.refused;
    if (counts_as_local) ++st.local_refusals;
    return r;
  }

  template <class Finish>
  void on_answer(std::vector<RateStoreItem> items, std::int64_t sent, RateStoreAnswer answer,
                 Finish& finish) {
    if (answer.error && answer.caller_error) {
      RateResult failed;
      failed.error = answer.error;
      failed.message = std::move(answer.message);
      return finish(std::move(failed));
    }
    if (answer.error) return degrade(std::move(items), std::move(answer), finish);
    if (degraded_.exchange(false))
      log(LogLevel::info, "rate limits: Redis answers again: it decides the rules again");
    RateResult r;
    r.allowed = answer.allowed;
    r.source = RateSource::store;
    {
      std::lock_guard lock(mutex_);
      for (std::size_t i = 0; i < items.size(); ++i) {
        const auto& item = items[i];
        const auto& sd = answer.decisions[i];
        RateDecision d = base_decision(item);
        d.allowed = sd.allowed;
        d.remaining = sd.remaining;
        d.reset = std::chrono::milliseconds(sd.reset_ms);
        d.retry_after = std::chrono::milliseconds(sd.retry_after_ms);
        d.at_ms = answer.at_ms;
        d.at_us = answer.at_us;
        r.decisions.push_back(std::move(d));
        auto& st = rules_[item.rule_name].stats;
        if (answer.allowed) ++st.allowed;
        if (!sd.allowed) {
          ++st.refused;
          if (r.message.empty()) r.message = "rule \"" + item.rule_name + "\": over its limit";
        }
        if (!local_layer_ || !store_->remote()) continue;
        // Measured from before the call: the store decided later, so this
        // block ends no later than the store's own refusal would; less 2 ms
        // for the truncation of both clocks to whole milliseconds.
        if (!sd.allowed && sd.retry_after_ms > 2)
          remember_block_locked(BlockKey{item.rule_name, item.key},
                                {sent + sd.retry_after_ms - 2, item.cost});
        else if (sd.allowed)
          blocks_.erase(BlockKey{item.rule_name, item.key});
      }
    }
    finish(std::move(r));
  }

  // The store failed: each rule's on_redis_down decides (closed wins, then the
  // local share, then open).
  template <class Finish>
  void degrade(std::vector<RateStoreItem> items, RateStoreAnswer failed, Finish& finish) {
    // Said once per outage (a rate decision cannot wait: every failed call degrades).
    if (!degraded_.exchange(true))
      log(LogLevel::warn, "rate limits: Redis did not decide (" + failed.message +
                              "): each rule's on_redis_down decides until it answers (docs/ratelimit.md, "
                              "\"Redis unreachable\")");
    RateResult r;
    r.source = RateSource::degraded;
    std::vector<RateStoreItem> local;
    const RateStoreItem* closed = nullptr;
    {
      std::lock_guard lock(mutex_);
      for (const auto& item : items) {
        auto& st = rules_[item.rule_name].stats;
        ++st.store_errors;
        ++st.degraded;
        if (item.rule.on_redis_down == RedisDownPolicy::closed && !closed) closed = &item;
        if (item.rule.on_redis_down == RedisDownPolicy::local) {
          local.push_back(item);
          local.back().rule = rate::local_share(item.rule);
          local.back().cost = std::min(item.cost, local.back().rule.capacity() + 1);
        }
      }
    }
    if (closed) {
      r.allowed = false;
      r.reason = RejectReason::unavailable;
      r.message = "rule \"" + closed->rule_name + "\": Redis unreachable (" + failed.message +
                  ") and on_redis_down = closed";
      for (const auto& item : items) {
        RateDecision d = base_decision(item);
        d.allowed = &item != closed;
        d.remaining = -1;
        r.decisions.push_back(std::move(d));
      }
      count(r, items);
      return finish(std::move(r));
    }
    RateStoreAnswer answer;
    answer.allowed = true;
    if (!local.empty()) fallback_->decide(local, [&answer](RateStoreAnswer a) { answer = std::move(a); });
    r.allowed = answer.allowed;
    std::size_t j = 0;
    for (const auto& item : items) {
      RateDecision d = base_decision(item);
      if (item.rule.on_redis_down == RedisDownPolicy::local) {
        const auto& sd = answer.decisions[j++];
        d.allowed = sd.allowed;
        d.limit = rate::local_share(item.rule).capacity();
        d.remaining = sd.remaining;
        d.reset = std::chrono::milliseconds(sd.reset_ms);
        d.retry_after = std::chrono::milliseconds(sd.retry_after_ms);
        d.at_ms = answer.at_ms;
        // Decided by this instance's fallback: a refund goes there (RateLimiterImpl::refund).
        // Below 0, and one of its own, so that the refund tracker tells such decisions apart.
        d.at_us = -local_decisions_.fetch_add(1, std::memory_order_relaxed) - 1;
      } else {
        d.allowed = true;  // open: nothing counted anywhere, nothing to refund
        d.remaining = -1;
        d.at_us = kOpenDecision;
      }
      r.decisions.push_back(std::move(d));
    }
    r.message = r.allowed ? "Redis unreachable (" + failed.message + "): decided by on_redis_down"
                          : "Redis unreachable (" + failed.message + "): over this instance's local share";
    count(r, items);
    finish(std::move(r));
  }

  // A key refused once and never asked about again would keep its block for ever: expired
  // blocks go whenever the map doubled since the last sweep (amortized O(1) a block), and the
  // map never holds more than kMaxBlocks (a block only saves a store call: dropping one costs one).
  static constexpr std::size_t kMaxBlocks = 100'000;
  void remember_block_locked(BlockKey key, Block block) {
    blocks_[std::move(key)] = block;
    if (blocks_.size() < std::max<std::size_t>(1024, 2 * blocks_after_sweep_)) return;
    const std::int64_t now = steady_ms();
    std::erase_if(blocks_, [now](const auto& b) { return b.second.until <= now; });
    if (blocks_.size() > kMaxBlocks) blocks_.clear();
    blocks_after_sweep_ = blocks_.size();
  }

  void count(const RateResult& r, const std::vector<RateStoreItem>& items) {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < items.size(); ++i) {
      auto& st = rules_[items[i].rule_name].stats;
      if (r.allowed) ++st.allowed;
      if (!r.decisions[i].allowed) ++st.refused;
    }
  }

  boost::asio::any_io_executor executor_;
  std::unique_ptr<RateStore> store_;
  const bool local_layer_;
  std::unique_ptr<RateStore> fallback_;
  mutable std::mutex mutex_;
  std::map<std::string, Entry, std::less<>> rules_;
  std::map<BlockKey, Block> blocks_;
  std::size_t blocks_after_sweep_ = 0;         // blocks_.size() after the last sweep (remember_block_locked)
  std::map<RefundKey, std::int64_t> refunds_;  // units of a decision not refunded yet
  std::deque<std::pair<std::int64_t, RefundKey>> refund_expiry_;
  std::atomic<bool> degraded_{false};
  std::atomic<std::int64_t> local_decisions_{0};  // the fallback's decisions, numbered (at_us < 0)
  std::set<std::string> stored_;                  // rules in force from the store (a PUT here, or adopted)
  std::atomic<bool> shut_{false};
};

std::shared_ptr<RateLimiterImpl> make_rate_limiter_impl(boost::asio::any_io_executor executor,
                                                        std::unique_ptr<RateStore> store, bool local_layer) {
  return std::make_shared<RateLimiterImpl>(std::move(executor), std::move(store), local_layer);
}

boost::asio::any_io_executor executor_of(const RateLimiterImpl& impl) { return impl.executor(); }

void start_check(RateLimiterImpl& impl, std::vector<RateRequest> requests,
                 std::unique_ptr<RateCompletion> completion) {
  impl.check(std::move(requests), std::move(completion));
}

void start_publish_rule(RateLimiterImpl& impl, std::string name, RateRule rule,
                        std::unique_ptr<RuleUpdateCompletion> completion) {
  impl.publish_rule(std::move(name), rule, std::move(completion));
}

void start_sync_rules(RateLimiterImpl& impl, std::unique_ptr<RuleUpdateCompletion> completion) {
  impl.sync_rules(std::move(completion));
}

void start_refund(RateLimiterImpl& impl, RateDecision decision, std::int64_t amount,
                  std::unique_ptr<RefundCompletion> completion) {
  impl.refund(std::move(decision), amount, std::move(completion));
}

}  // namespace detail

RateLimiter RateLimiter::memory(executor_type executor) {
  return RateLimiter(
      detail::make_rate_limiter_impl(std::move(executor), detail::make_memory_rate_store(), false));
}

const std::shared_ptr<detail::RateLimiterImpl>& RateLimiter::checked_impl() const {
  if (!impl_) throw std::logic_error("fairgate::RateLimiter: use of an empty handle");
  return impl_;
}

RateLimiter::executor_type RateLimiter::get_executor() const { return checked_impl()->executor(); }

boost::system::result<void, SettingsError> RateLimiter::set_rule(std::string_view name,
                                                                 const RateRule& rule) {
  return checked_impl()->set_rule(name, rule);
}

std::optional<RateRule> RateLimiter::rule(std::string_view name) const { return checked_impl()->rule(name); }

std::vector<NamedRateRule> RateLimiter::rules() const { return checked_impl()->rules(); }

bool RateLimiter::degraded() const { return checked_impl()->degraded(); }

std::size_t RateLimiter::local_layer_keys() const { return checked_impl()->local_layer_keys(); }

void RateLimiter::shutdown() { checked_impl()->shutdown(); }

}  // namespace fairgate
