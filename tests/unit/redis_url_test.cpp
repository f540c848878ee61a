#include "redis/url.hpp"

#include <gtest/gtest.h>

namespace {

using fairgate::redis::Endpoint;
using fairgate::redis::parse_url;

Endpoint ok(std::string_view url) {
  auto r = parse_url(url);
  if (auto* e = std::get_if<std::string>(&r)) ADD_FAILURE() << url << ": " << *e;
  return std::holds_alternative<Endpoint>(r) ? std::get<Endpoint>(r) : Endpoint{};
}

std::string bad(std::string_view url) {
  auto r = parse_url(url);
  if (std::holds_alternative<Endpoint>(r)) {
    ADD_FAILURE() << url << " was accepted";
    return {};
  }
  return std::get<std::string>(r);
}

TEST(RedisUrl, HostPortDefaults) {
  auto e = ok("redis://localhost");
  EXPECT_EQ(e.host, "localhost");
  EXPECT_EQ(e.port, 6379);
  EXPECT_EQ(e.db, 0);
  EXPECT_TRUE(e.password.empty());
  e = ok("redis://127.0.0.1:7001/");
  EXPECT_EQ(e.port, 7001);
}

TEST(RedisUrl, UserPasswordDatabase) {
  auto e = ok("redis://alice:p%40ss%3Aword@10.0.0.1:6380/5");
  EXPECT_EQ(e.user, "alice");
  EXPECT_EQ(e.password, "p@ss:word");
  EXPECT_EQ(e.host, "10.0.0.1");
  EXPECT_EQ(e.port, 6380);
  EXPECT_EQ(e.db, 5);
  EXPECT_EQ(e.redacted(), "redis://alice:***@10.0.0.1:6380/5") << "never print the password";
  e = ok("redis://:only-pass@h:1");
  EXPECT_EQ(e.user, "");
  EXPECT_EQ(e.password, "only-pass");
}

TEST(RedisUrl, Ipv6) {
  auto e = ok("redis://[::1]:6390");
  EXPECT_EQ(e.host, "::1");
  EXPECT_EQ(e.port, 6390);
}

TEST(RedisUrl, RejectsWithAReason) {
  EXPECT_NE(bad("http://h:1").find("redis://"), std::string::npos);
  EXPECT_NE(bad("redis://h:0").find("port"), std::string::npos);
  EXPECT_NE(bad("redis://h:65536").find("port"), std::string::npos);
  EXPECT_NE(bad("redis://h:12ab").find("port"), std::string::npos);
  EXPECT_NE(bad("redis://h:").find("port"), std::string::npos);
  EXPECT_NE(bad("redis://h:1/x").find("database"), std::string::npos);
  EXPECT_NE(bad("redis://:1").find("host"), std::string::npos);
  EXPECT_NE(bad("redis://u:%zz@h").find("percent"), std::string::npos);
  EXPECT_NE(bad("redis://[::1").find("["), std::string::npos);
}

}  // namespace
