// redis/redis_rate_store.cpp — the rate-limit state in Redis: the one place
// that runs the rate-limit scripts (one EVALSHA, one round trip per
// decision), through the client seam (redis/client.hpp: standalone,
// Sentinel, Cluster), and RateLimiter::redis.
//
// Keys: "<prefix>:rl:{<rule>:<key>}:<algorithm>" — each under its own hash
// tag. A multi-rule check touches one key per rule in one script, which on a
// Redis Cluster needs the keys in one slot: otherwise it is refused as bad
// input before it is sent (see docs/ratelimit.md).
#include "api/rate_store.hpp"
#include "redis/client.hpp"
#include "redis/rate_scripts.hpp"
#include "redis/url.hpp"

#include <fairgate/rate_limiter.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdint>
#include <random>
#include <stdexcept>

namespace fairgate {

namespace {

// Each element of a decision is a number, each of the rules hash a string: a
// reply with anything else is a bad reply, never read as 0 or "".
bool is_integer(const redis::Reply& r) { return redis::element_has_shape(r, "i"); }
bool is_string(const redis::Reply& r) { return redis::element_has_shape(r, "s"); }

// 16 hex digits, random: one store's refund markers apart from every other's.
std::string random_token() {
  std::random_device rd;
  const std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  char out[17];
  const auto [end, ec] = std::to_chars(out, out + 16, v, 16);
  return std::string(out, end);
}

class RedisRateStore final : public detail::RateStore {
 public:
  RedisRateStore(boost::asio::any_io_executor executor, const RateLimiterRedisOptions& o,
                 redis::Target target)
      : prefix_(o.key_prefix) {
    redis::ClientOptions co;
    co.target = std::move(target);
    co.command_timeout = o.command_timeout;
    co.client_name = "fairgate-ratelimit";
    co.retry_refusals = false;  // OOM and the like: on_redis_down at once (docs/ratelimit.md)
    client_ = redis::make_client(std::move(executor), std::move(co));
    client_->start();
    client_->close_subscriber();  // no wake messages here
  }

  std::string key_of(const detail::RateStoreItem& item) const {
    std::string k = prefix_;
    k += ":rl:{";
    k += item.rule_name;
    k += ':';
    k += item.key;
    k += "}:";
    k += to_string(item.rule.algorithm);
    return k;
  }

  static void push_rule(std::vector<std::string>& args, const RateRule& r) {
    args.push_back(std::to_string(static_cast<int>(r.algorithm) + 1));
    args.push_back(std::to_string(r.rate));
    args.push_back(std::to_string(r.period_ms));
    args.push_back(std::to_string(r.capacity()));
  }

  void decide(std::vector<detail::RateStoreItem> items, DecideCallback done) override {
    std::vector<std::string> keys;
    std::vector<std::string> args{std::to_string(items.size())};
    for (const auto& item : items) {
      keys.push_back(key_of(item));
      push_rule(args, item.rule);
      args.push_back(std::to_string(item.cost));
    }
    const std::size_t n = items.size();
    if (client_->kind() == "redis-cluster") {
      for (const auto& k : keys) {
        if (redis::key_slot(k) == redis::key_slot(keys.front())) continue;
        detail::RateStoreAnswer a;
        a.error = make_error_code(RejectReason::invalid_argument);
        a.caller_error = true;
        a.message = "rules: on a Redis Cluster the rules of one check must hash to one slot (\"" +
                    keys.front() + "\" and \"" + k + "\" do not); check them one by one";
        return done(std::move(a));
      }
    }
    client_->call_script(
        redis::scripts::kRlDecide, keys, args,
        [n, done = std::move(done)](boost::system::error_code ec, redis::Reply reply) {
          detail::RateStoreAnswer a;
          if (ec) {
            a.error = ec;
            // Refused by the ACL: Redis' own words say which command or key.
            a.message = reply.is_error() ? "Redis: " + reply.excerpt() : ec.message();
          } else if (reply.is_error()) {
            a.error = make_error_code(Errc::unavailable);
            a.message = "Redis: " + reply.excerpt();
          } else if (reply.type != redis::Reply::Type::array || reply.elements.size() != 3 + 4 * n ||
                     !std::all_of(reply.elements.begin(), reply.elements.end(), is_integer)) {
            a.error = make_error_code(Errc::unavailable);
            a.message = "unexpected reply " + reply.excerpt();
          } else {
            const auto& e = reply.elements;
            a.allowed = redis::integer_of(e[0]) == 1;
            a.at_ms = redis::integer_of(e[1]);
            a.at_us = redis::integer_of(e[2]);
            for (std::size_t i = 0; i < n; ++i) {
              core::rate::Decision d;
              d.allowed = redis::integer_of(e[3 + 4 * i]) == 1;
              d.remaining = redis::integer_of(e[4 + 4 * i]);
              d.reset_ms = redis::integer_of(e[5 + 4 * i]);
              d.retry_after_ms = redis::integer_of(e[6 + 4 * i]);
              a.decisions.push_back(d);
            }
          }
          done(std::move(a));
        },
        {});
  }

  // A refund runs at most once, and the instance learns whether it ran (docs/ratelimit.md,
  // "Refunds"): the script marks it done under a key of its own (rl_refund.lua). A call that got
  // no reply (timed out, connection lost: it may still run) is settled by claiming that marker
  // first (SET NX GET): claimed, the refund can no longer run (not applied); found, it ran
  // (its units). Before, such a refund was answered "not applied" while Redis often ran it
  // late, and a caller that sent it again got the units back twice.
  void refund(detail::RateStoreItem item, std::int64_t at_ms, std::int64_t amount,
              RefundCallback done) override {
    std::vector<std::string> args;
    push_rule(args, item.rule);
    args.push_back(std::to_string(at_ms));
    args.push_back(std::to_string(amount));
    args.push_back(std::to_string(kMarkerTtlMs));
    std::string marker = key_of(item) + ":refund:" + token_ + ':' + std::to_string(++refunds_);
    client_->call_script(
        redis::scripts::kRlRefund, {key_of(item), marker}, args,
        [client = client_, marker, done = std::move(done)](boost::system::error_code ec,
                                                           redis::Reply reply) mutable {
          if (ec == redis::Error::timeout || ec == redis::Error::disconnected)
            return settle(std::move(client), std::move(marker), ec.message(), kSettleTries, std::move(done));
          if (ec) return done(ec, ec.message(), 0);
          if (reply.is_error()) return done(make_error_code(Errc::unavailable), reply.excerpt(), 0);
          if (!redis::has_shape(reply, "ii"))
            return done(make_error_code(Errc::unavailable), "unexpected reply " + reply.excerpt(), 0);
          done({}, {}, redis::integer_of(reply.elements[0]));
        },
        {});
  }

  void store_rule(const std::string& name, const std::string& encoded, StatusCallback done) override {
    const std::string key = prefix_ + ":rl-rules";
    client_->exec(key, {"HSET", key, name, encoded},
                  [done = std::move(done)](boost::system::error_code ec, redis::Reply reply) {
                    if (ec) return done(ec, ec.message());
                    if (reply.is_error())
                      return done(make_error_code(Errc::unavailable), "Redis: " + reply.excerpt());
                    done({}, {});
                  });
  }

  void load_rules(RulesCallback done) override {
    const std::string key = prefix_ + ":rl-rules";
    client_->exec(
        key, {"HGETALL", key}, [done = std::move(done)](boost::system::error_code ec, redis::Reply reply) {
          std::vector<std::pair<std::string, std::string>> out;
          if (ec) return done(ec, ec.message(), out);
          if (reply.is_error())
            return done(make_error_code(Errc::unavailable), "Redis: " + reply.excerpt(), out);
          if (reply.type != redis::Reply::Type::array || reply.elements.size() % 2 != 0 ||
              !std::all_of(reply.elements.begin(), reply.elements.end(), is_string))
            return done(make_error_code(Errc::unavailable), "unexpected reply " + reply.excerpt(), out);
          for (std::size_t i = 0; i + 1 < reply.elements.size(); i += 2)
            out.emplace_back(reply.elements[i].str, reply.elements[i + 1].str);
          done({}, {}, std::move(out));
        });
  }

  bool remote() const noexcept override { return true; }

  void close() override { client_->close_after_pending(); }

 private:
  /// How long a refund's marker stays (from when Redis ran the refund or the claim): the
  /// claim that settles a call follows it within the same stall of Redis.
  static constexpr std::int64_t kMarkerTtlMs = 60'000;
  /// Claims a marker may take (one command timeout each) before the outcome stays unknown.
  static constexpr int kSettleTries = 3;

  /// Settles a refund call that got no reply: see refund().
  static void settle(std::shared_ptr<redis::Client> client, std::string marker, std::string why, int tries,
                     RefundCallback done) {
    auto& c = *client;
    c.exec(
        marker, {"SET", marker, "x", "NX", "PX", std::to_string(kMarkerTtlMs), "GET"},
        [client, marker, why, tries, done = std::move(done)](boost::system::error_code ec,
                                                             redis::Reply reply) mutable {
          if (ec && tries > 1 && ec != redis::Error::closed && ec != redis::Error::denied)
            return settle(std::move(client), std::move(marker), std::move(why), tries - 1, std::move(done));
          if (ec || reply.is_error() || (!reply.is_nil() && reply.type != redis::Reply::Type::string))
            return done(detail::refund_outcome_unknown(),
                        why + ", and so did asking whether it ran" +
                            (ec ? std::string() : " (unexpected reply " + reply.excerpt() + ")"),
                        0);
          if (reply.is_nil() || reply.str == "x")
            return done(make_error_code(Errc::unavailable), why, 0);  // called off: it never runs
          std::int64_t given = 0;
          const auto [end, bad] =
              std::from_chars(reply.str.data(), reply.str.data() + reply.str.size(), given);
          if (bad != std::errc{} || end != reply.str.data() + reply.str.size())
            return done(detail::refund_outcome_unknown(), why + "; unexpected marker " + reply.excerpt(), 0);
          done({}, {}, given);  // it ran: late, but once
        });
  }

  std::string prefix_;
  std::shared_ptr<redis::Client> client_;
  /// Names this store's refunds apart from every other instance's (random per store).
  std::string token_ = random_token();
  std::atomic<std::uint64_t> refunds_{0};  // refunds may start on several threads
};

}  // namespace

RateLimiter RateLimiter::redis(executor_type executor, RateLimiterRedisOptions options, bool local_layer) {
  auto target = redis::parse_target(options.url);
  if (auto* problem = std::get_if<std::string>(&target)) throw std::invalid_argument("url: " + *problem);
  if (options.key_prefix.empty() || options.key_prefix.find_first_of("{}") != std::string::npos)
    throw std::invalid_argument("key_prefix: must be non-empty, without '{' or '}'");
  if (options.command_timeout < std::chrono::milliseconds(1))
    throw std::invalid_argument("command_timeout: must be at least 1 ms");
  auto store =
      std::make_unique<RedisRateStore>(executor, options, std::get<redis::Target>(std::move(target)));
  return RateLimiter(detail::make_rate_limiter_impl(std::move(executor), std::move(store), local_layer));
}

}  // namespace fairgate
