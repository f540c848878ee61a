// A limiter's holders zset keeps one mark member, "!", beside its permits
// (docs/redis-schema.md, src/redis/scripts/lib.lua HOLDERS_MARK): a holders
// key without it was deleted with the permits in it. Tests that count or list
// the permits Redis has go through these.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fairgate::test {

/// The mark member of a holders key.
inline constexpr std::string_view kHoldersMark = "!";

inline bool is_holders_key(std::string_view key) {
  constexpr std::string_view suffix = ":holders";
  return key.size() >= suffix.size() && key.substr(key.size() - suffix.size()) == suffix;
}

/// The command that counts what a test means by a zset's size: the permits
/// of a holders key (every member but the mark), every member of another.
inline std::vector<std::string> count_command(const std::string& key) {
  if (is_holders_key(key)) return {"ZLEXCOUNT", key, "(" + std::string(kHoldersMark), "+"};
  return {"ZCARD", key};
}

/// The command that lists the permit members of a holders key (not the mark).
inline std::vector<std::string> permits_command(const std::string& key) {
  return {"ZRANGE", key, "(" + std::string(kHoldersMark), "+", "BYLEX"};
}

}  // namespace fairgate::test
