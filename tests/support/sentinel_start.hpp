// The start check behind Sentinel, plain or TLS (docs/redis-acl.md: ACL users
// are per node), as a test of its own:
//
//   fairgate::test::expect_sentinel_start_check(sentinels, "fg-start");
#pragma once

#include "redis/database_check.hpp"
#include "redis/url.hpp"
#include "support/acl.hpp"
#include "support/redis_cluster.hpp"
#include "support/run_shell.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <variant>

namespace fairgate::test {

/// `user` with another key pattern on both data nodes: the master the
/// sentinels name (asked as the URL says: over TLS for rediss+sentinel://) is
/// found with the data nodes' credentials, and `fairgate serve` exits 1 at
/// start with the line naming it, having written nothing. Made the documented
/// user there, serve starts.
inline void expect_sentinel_start_check(RedisSentinels& sentinels, const std::string& user) {
  for (std::size_t i = 0; i < 2; ++i)
    ASSERT_EQ(sentinels.data(i).command(documented_acl(user, "pw", "other")), "OK");
  std::string url = sentinels.url();
  url.insert(url.find("://") + 3, user + ":pw@");
  const auto target = std::get<redis::Target>(redis::parse_target(url));
  const auto master = redis::sentinel_master(target, std::chrono::seconds(2));
  ASSERT_TRUE(master.has_value()) << "no sentinel named the master: " << url;
  EXPECT_EQ(master->tls.enabled, target.nodes.front().tls.enabled);
  EXPECT_EQ(std::to_string(master->port),
            sentinels.master_address().substr(sentinels.master_address().rfind(':') + 1));
  EXPECT_EQ(master->user, user) << "the data nodes' credentials";
  const std::string line = redis::denied_line(
      *master, "NOPERM this user has no permissions to access one of the keys used as arguments");

  expect_serve_refuses_at_start(url, line);
  EXPECT_EQ(sentinels.data(0).command({"DBSIZE"}), "0") << "nothing written";

  for (std::size_t i = 0; i < 2; ++i) ASSERT_EQ(sentinels.data(i).command(documented_acl(user, "pw")), "OK");
  expect_serve_starts(url);
}

}  // namespace fairgate::test
