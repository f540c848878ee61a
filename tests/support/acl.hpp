// The Redis user docs/redis-acl.md documents, as the ACL SETUSER command a
// test runs on a real server (FAIRGATE_SOURCE_DIR: the source tree):
//
//   server.command(fairgate::test::documented_acl("fg-acl-1", "pw"));
//   o.url = "redis://fg-acl-1:pw@127.0.0.1:" + port;
//
// Empty when the doc has no such line (the caller fails the test). And the
// sentinels' user (documented_sentinel_acl), for password-protected sentinels.
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fairgate::test {

/// The words of the doc's line that starts with `start` (empty: no such line).
inline std::vector<std::string> acl_line(const std::string& start) {
  std::ifstream doc(std::string(FAIRGATE_SOURCE_DIR) + "/docs/redis-acl.md");
  for (std::string line; std::getline(doc, line);) {
    if (line.rfind(start, 0) != 0) continue;
    std::vector<std::string> acl;
    std::istringstream words(line);
    for (std::string w; words >> w;) acl.push_back(w);
    return acl;
  }
  return {};
}

/// With another key prefix than the doc's "fairgate", its keys and channels.
inline std::vector<std::string> documented_acl(const std::string& user, const std::string& password,
                                               const std::string& prefix = "fairgate") {
  auto acl = acl_line("ACL SETUSER fairgate on >CHANGE-ME ");
  if (acl.empty()) return acl;
  for (auto& w : acl)
    if (w == "~fairgate:*" || w == "&fairgate:*") w = w.substr(0, 1) + prefix + ":*";
  acl.at(2) = user;
  acl.at(4) = ">" + password;
  return acl;
}

/// The sentinels' user docs/redis-acl.md documents (for ?sentinel_user=), as
/// the ACL SETUSER command to run on each sentinel. Empty when the doc has none.
inline std::vector<std::string> documented_sentinel_acl(const std::string& user,
                                                        const std::string& password) {
  auto acl = acl_line("ACL SETUSER fairgate-sentinel on >CHANGE-ME ");
  if (acl.empty()) return acl;
  acl.at(2) = user;
  acl.at(4) = ">" + password;
  return acl;
}

}  // namespace fairgate::test
