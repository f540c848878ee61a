#include "redis/database_check.hpp"

#include "redis/reply.hpp"

#include <hiredis/hiredis.h>

#include <sys/time.h>
#include <memory>
#include <vector>

namespace fairgate::redis {
namespace {

struct ContextFree {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
struct ReplyFree {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using ContextPtr = std::unique_ptr<redisContext, ContextFree>;
using ReplyPtr = std::unique_ptr<redisReply, ReplyFree>;

/// One blocking command; null when it could not be sent or read (timeout, connection closed).
ReplyPtr command(redisContext& c, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  return ReplyPtr(static_cast<redisReply*>(
      redisCommandArgv(&c, static_cast<int>(argv.size()), argv.data(), lens.data())));
}

bool is_error(const ReplyPtr& r) { return r && r->type == REDIS_REPLY_ERROR; }

}  // namespace

std::vector<std::string> auth_command(const Endpoint& endpoint) {
  std::vector<std::string> auth{"AUTH"};
  if (!endpoint.user.empty()) auth.push_back(endpoint.user);
  auth.push_back(endpoint.password);
  return auth;
}

std::string database_refused(const Endpoint& endpoint, std::string_view reason) {
  return "Redis at " + endpoint.host + ":" + std::to_string(endpoint.port) + ": database " +
         std::to_string(endpoint.db) + " cannot be selected: " + std::string(reason);
}

std::optional<std::string> database_problem(const Endpoint& endpoint, std::chrono::milliseconds timeout) {
  if (endpoint.db == 0 || endpoint.tls.enabled) return std::nullopt;
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(timeout).count();
  const timeval tv{static_cast<time_t>(us / 1'000'000), static_cast<suseconds_t>(us % 1'000'000)};
  ContextPtr c(redisConnectWithTimeout(endpoint.host.c_str(), endpoint.port, tv));
  if (!c || c->err != 0) return std::nullopt;  // no server there (yet): serve starts degraded
  bound_arrays(c->reader);
  if (redisSetTimeout(c.get(), tv) != REDIS_OK) return std::nullopt;
  if (!endpoint.password.empty()) {
    const ReplyPtr r = command(*c, auth_command(endpoint));
    if (!r || is_error(r)) return std::nullopt;
  }
  const ReplyPtr r = command(*c, {"SELECT", std::to_string(endpoint.db)});
  if (!is_error(r)) return std::nullopt;
  const std::string_view reason(r->str, r->len);
  if (reason.starts_with("NOAUTH")) return std::nullopt;  // a password is missing, not the database
  return database_refused(endpoint, reason);
}

}  // namespace fairgate::redis
