// A limiter's holders zset keeps one mark member beside its permits
// (fairgate::redis::kHoldersMark, docs/redis-schema.md), and its tholders hash
// one mark field beside the tenants' counts (kTenantsMark): tests that count
// or list the permits or tenants Redis has go through these.
#pragma once

#include "redis/scripts.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace fairgate::test {

inline bool is_holders_key(std::string_view key) {
  constexpr std::string_view suffix = ":holders";
  return key.size() >= suffix.size() && key.substr(key.size() - suffix.size()) == suffix;
}

/// The command that counts what a test means by a zset's size: the permits
/// of a holders key (every member but the mark), every member of another.
inline std::vector<std::string> count_command(const std::string& key) {
  if (is_holders_key(key)) return redis::count_permits(key);
  return {"ZCARD", key};
}

/// The command that lists the permit members of a holders key (not the mark).
inline std::vector<std::string> permits_command(const std::string& key) {
  return {"ZRANGE", key, "(" + std::string(redis::kHoldersMark), "+", "BYLEX"};
}

/// The command that counts the tenants a tholders hash has a count for: every
/// field but the mark (fairgate::redis::kTenantsMark) it keeps while marked.
inline std::vector<std::string> tenant_count_command(const std::string& key) {
  return {
      "EVAL",
      "local n = 0 for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do if f ~= ARGV[1] then n = n + 1 end "
      "end return n",
      "1", key, std::string(redis::kTenantsMark)};
}

}  // namespace fairgate::test
