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

/// With another key prefix than the doc's "fairgate", its keys and channels.
inline std::vector<std::string> documented_acl(const std::string& user, const std::string& password,
                                               const std::string& prefix = "fairgate") {
  std::ifstream doc(std::string(FAIRGATE_SOURCE_DIR) + "/docs/redis-acl.md");
  const std::string start = "ACL SETUSER fairgate on >CHANGE-ME ";
  for (std::string line; std::getline(doc, line);) {
    if (line.rfind(start, 0) != 0) continue;
    std::vector<std::string> acl;
    std::istringstream words(line);
    for (std::string w; words >> w;) {
      if (w == "~fairgate:*" || w == "&fairgate:*") w = w.substr(0, 1) + prefix + ":*";
      acl.push_back(w);
    }
    acl.at(2) = user;
    acl.at(4) = ">" + password;
    return acl;
  }
  return {};
}

/// The sentinels' user docs/redis-acl.md documents (for ?sentinel_user=), as
/// the ACL SETUSER command to run on each sentinel. Empty when the doc has none.
inline std::vector<std::string> documented_sentinel_acl(const std::string& user,
                                                        const std::string& password) {
  std::ifstream doc(std::string(FAIRGATE_SOURCE_DIR) + "/docs/redis-acl.md");
  const std::string start = "ACL SETUSER fairgate-sentinel on >CHANGE-ME ";
  for (std::string line; std::getline(doc, line);) {
    if (line.rfind(start, 0) != 0) continue;
    std::vector<std::string> acl;
    std::istringstream words(line);
    for (std::string w; words >> w;) acl.push_back(w);
    acl.at(2) = user;
    acl.at(4) = ">" + password;
    return acl;
  }
  return {};
}

}  // namespace fairgate::test
