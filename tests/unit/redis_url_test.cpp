#include "redis/client.hpp"
#include "redis/log_level.hpp"
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

namespace {

using fairgate::redis::parse_target;
using fairgate::redis::Target;

Target target_ok(std::string_view url) {
  auto r = parse_target(url);
  if (auto* e = std::get_if<std::string>(&r)) ADD_FAILURE() << url << ": " << *e;
  return std::holds_alternative<Target>(r) ? std::get<Target>(r) : Target{};
}

std::string target_bad(std::string_view url) {
  auto r = parse_target(url);
  if (std::holds_alternative<Target>(r)) {
    ADD_FAILURE() << url << " was accepted";
    return {};
  }
  return std::get<std::string>(r);
}

TEST(RedisTarget, StandaloneFormsStillWork) {
  auto t = target_ok("redis://alice:pw@10.0.0.1:6380/5");
  EXPECT_EQ(t.kind, Target::Kind::standalone);
  ASSERT_EQ(t.nodes.size(), 1u);
  EXPECT_EQ(t.nodes[0].db, 5);
  EXPECT_EQ(t.redacted(), "redis://alice:***@10.0.0.1:6380/5");
}

TEST(RedisTarget, ClusterSeeds) {
  auto t = target_ok("redis+cluster://u:p%40ss@h1:7000,[::1]:7001,h3");
  EXPECT_EQ(t.kind, Target::Kind::cluster);
  ASSERT_EQ(t.nodes.size(), 3u);
  EXPECT_EQ(t.nodes[0].host, "h1");
  EXPECT_EQ(t.nodes[0].port, 7000);
  EXPECT_EQ(t.nodes[1].host, "::1");
  EXPECT_EQ(t.nodes[2].port, 6379) << "default port";
  for (const auto& n : t.nodes) {
    EXPECT_EQ(n.user, "u") << "the credentials go to every node";
    EXPECT_EQ(n.password, "p@ss");
  }
  EXPECT_EQ(t.redacted(), "redis+cluster://u:***@h1:7000,[::1]:7001,h3:6379");
  EXPECT_EQ(target_ok("redis+cluster://h:1/").nodes.size(), 1u);
}

TEST(RedisTarget, SentinelMasterAndDb) {
  auto t = target_ok("redis+sentinel://:pw@s1:26380,s2/mymaster/2");
  EXPECT_EQ(t.kind, Target::Kind::sentinel);
  EXPECT_EQ(t.master_name, "mymaster");
  ASSERT_EQ(t.nodes.size(), 2u);
  EXPECT_EQ(t.nodes[1].port, 26379) << "the sentinel default port";
  EXPECT_EQ(t.nodes[0].db, 2);
  EXPECT_EQ(t.nodes[0].password, "pw");
  EXPECT_EQ(t.redacted(), "redis+sentinel://:***@s1:26380,s2:26379/mymaster/2");
}

// The sentinels' own credentials (requirepass or an ACL user in
// sentinel.conf): query parameters, percent-decoded, masked when shown; the
// data node's user and password stay the data node's.
TEST(RedisTarget, SentinelsOwnCredentials) {
  auto t = target_ok(
      "redis+sentinel://app:pw@s1,s2:26380/mymaster/1?sentinel_user=watch&sentinel_password=s%40nt%3F");
  EXPECT_EQ(t.sentinel_user, "watch");
  EXPECT_EQ(t.sentinel_password, "s@nt?");
  EXPECT_EQ(t.nodes[0].user, "app");
  EXPECT_EQ(t.nodes[0].password, "pw");
  EXPECT_EQ(t.nodes[1].db, 1);
  EXPECT_EQ(
      t.redacted(),
      "redis+sentinel://app:***@s1:26379,s2:26380/mymaster/1?sentinel_user=watch&sentinel_password=***");
  EXPECT_EQ(target_ok("redis+sentinel://s1/m?sentinel_password=x").redacted(),
            "redis+sentinel://s1:26379/m?sentinel_password=***");
  auto tls = target_ok("rediss+sentinel://s1/m?tls_ca_file=%2Fca.pem&sentinel_password=x");
  EXPECT_EQ(tls.sentinel_password, "x");
  EXPECT_EQ(tls.nodes[0].tls.ca_file, "/ca.pem");
  EXPECT_TRUE(target_ok("redis+sentinel://s1/m").sentinel_password.empty()) << "none: asked without AUTH";

  EXPECT_NE(target_bad("redis+sentinel://s1/m?sentinel_user=watch").find("needs sentinel_password"),
            std::string::npos);
  EXPECT_NE(target_bad("redis+sentinel://s1/m?sentinel_password=").find("empty"), std::string::npos);
  EXPECT_NE(target_bad("redis+sentinel://s1/m?sentinel_password=%zz").find("percent"), std::string::npos);
  EXPECT_NE(target_bad("redis+sentinel://s1/m?sentinel_pass=x").find("sentinel_password"), std::string::npos)
      << "the unknown-parameter line lists them";
  // Only Sentinel URLs have sentinels.
  EXPECT_NE(target_bad("redis://h:1?sentinel_password=x").find("redis+sentinel://"), std::string::npos);
  EXPECT_NE(target_bad("redis+cluster://h:1?sentinel_password=x").find("redis+sentinel://"),
            std::string::npos);
  EXPECT_NE(bad("redis://h:1?sentinel_user=u").find("redis+sentinel://"), std::string::npos);
}

TEST(RedisTarget, RejectsWithAReason) {
  EXPECT_NE(target_bad("redis+cluster://").find("host"), std::string::npos);
  EXPECT_NE(target_bad("redis+cluster://h:1,,h:2").find("host"), std::string::npos);
  EXPECT_NE(target_bad("redis+cluster://h:1,h:0").find("port"), std::string::npos);
  EXPECT_NE(target_bad("redis+cluster://h:1/3").find("database 0"), std::string::npos);
  EXPECT_NE(target_bad("redis+sentinel://s1:26379").find("master"), std::string::npos);
  EXPECT_NE(target_bad("redis+sentinel://s1:26379/").find("master"), std::string::npos);
  EXPECT_NE(target_bad("redis+sentinel://s1/m/x").find("database"), std::string::npos);
  EXPECT_NE(target_bad("http://h:1").find("rediss://"), std::string::npos);
  EXPECT_NE(target_bad("redis://h1:1,h2:2").find("redis+cluster://"), std::string::npos);
  // parse_url (one server) says why a Cluster URL does not fit there.
  EXPECT_NE(bad("redis+cluster://h:1").find("single server"), std::string::npos);
}

// --- TLS (rediss://): the scheme turns TLS on for every node; the tls_*
// query parameters set the CA file, client certificate, name and mode.

TEST(RedisTls, SchemesTurnTlsOnWithVerificationByDefault) {
  auto e = ok("rediss://:pw@db.example.com:6380/2");
  EXPECT_TRUE(e.tls.enabled);
  EXPECT_TRUE(e.tls.verify) << "verification is on unless tls_verify=none";
  EXPECT_TRUE(e.tls.ca_file.empty()) << "no CA file: the system's CA store";
  EXPECT_EQ(e.host, "db.example.com");
  EXPECT_EQ(e.db, 2);
  EXPECT_EQ(e.redacted(), "rediss://:***@db.example.com:6380/2");
  EXPECT_FALSE(ok("redis://h:1").tls.enabled);

  auto c = target_ok("rediss+cluster://u:p@h1:7000,h2:7001?tls_ca_file=/etc/ca.pem");
  EXPECT_EQ(c.kind, Target::Kind::cluster);
  ASSERT_EQ(c.nodes.size(), 2u);
  for (const auto& n : c.nodes) {
    EXPECT_TRUE(n.tls.enabled);
    EXPECT_EQ(n.tls.ca_file, "/etc/ca.pem") << "every seed carries the TLS settings";
  }
  EXPECT_EQ(c.nodes[1].port, 7001);
  EXPECT_EQ(c.redacted(), "rediss+cluster://u:***@h1:7000,h2:7001");

  auto s =
      target_ok("rediss+sentinel://s1:26380,s2/mymaster/3?tls_ca_file=%2Ftmp%2Fca%20x.pem&tls_verify=full");
  EXPECT_EQ(s.kind, Target::Kind::sentinel);
  EXPECT_EQ(s.master_name, "mymaster");
  EXPECT_EQ(s.nodes.front().db, 3);
  EXPECT_EQ(s.nodes.front().tls.ca_file, "/tmp/ca x.pem") << "values are percent-decoded";
  EXPECT_EQ(s.nodes[1].port, 26379);
  EXPECT_EQ(s.redacted(), "rediss+sentinel://s1:26380,s2:26379/mymaster/3");
}

TEST(RedisTls, QueryParameters) {
  auto e =
      ok("rediss://a:p%3Fw@h:6380/1?tls_ca_file=/ca.pem&tls_cert_file=/c.pem&tls_key_file=/k.pem"
         "&tls_server_name=redis.internal");
  EXPECT_EQ(e.password, "p?w") << "a '?' in the password is not the query";
  EXPECT_EQ(e.db, 1);
  EXPECT_EQ(e.tls.ca_file, "/ca.pem");
  EXPECT_EQ(e.tls.cert_file, "/c.pem");
  EXPECT_EQ(e.tls.key_file, "/k.pem");
  EXPECT_EQ(e.tls.server_name, "redis.internal");
  EXPECT_FALSE(ok("rediss://h?tls_verify=none").tls.verify);
  EXPECT_EQ(ok("rediss://h?tls_verify=none").port, 6379);
}

TEST(RedisTls, RejectsWithAReason) {
  EXPECT_NE(bad("redis://h:1?tls_ca_file=/ca.pem").find("rediss://"), std::string::npos)
      << "TLS settings on a plain URL are a mistake, not ignored";
  EXPECT_NE(bad("rediss://h:1?tls_verify=maybe").find("tls_verify"), std::string::npos);
  EXPECT_NE(bad("rediss://h:1?ca=/x").find("unknown query parameter 'ca'"), std::string::npos);
  EXPECT_NE(bad("rediss://h:1?tls_ca_file=").find("empty"), std::string::npos);
  EXPECT_NE(bad("rediss://h:1?tls_ca_file").find("tls_ca_file=VALUE"), std::string::npos);
  EXPECT_NE(bad("rediss://h:1?tls_cert_file=/c.pem").find("together"), std::string::npos);
  EXPECT_NE(bad("rediss+cluster://h:1").find("single server"), std::string::npos);
  EXPECT_NE(target_bad("rediss+cluster://h:1/2").find("database 0"), std::string::npos);
  EXPECT_NE(target_bad("rediss+sentinel://s1:26379?tls_verify=none").find("master"), std::string::npos);
}

}  // namespace

// --- the slot map of a CLUSTER SLOTS reply ----------------------------------------

namespace {

using fairgate::redis::Reply;
using fairgate::redis::SlotRange;

Reply integer(std::int64_t v) {
  Reply r;
  r.type = Reply::Type::integer;
  r.integer = v;
  return r;
}
Reply text(std::string s) {
  Reply r;
  r.type = Reply::Type::string;
  r.str = std::move(s);
  return r;
}
Reply list(std::vector<Reply> elements) {
  Reply r;
  r.type = Reply::Type::array;
  r.elements = std::move(elements);
  return r;
}
/// One range as Redis 7 sends it: first, last, the master [host, port, id, {}], a replica.
Reply range(std::int64_t first, std::int64_t last, Reply host, std::int64_t port) {
  return list({integer(first), integer(last), list({std::move(host), integer(port), text("id"), list({})}),
               list({text("127.0.0.1"), integer(port + 3), text("id2"), list({})})});
}

}  // namespace

TEST(RedisClusterSlots, RangesOfAReplyAsRedisSendsIt) {
  const Reply reply = list({range(0, 5460, text("10.0.0.1"), 7001), range(5461, 10922, text(""), 7002),
                            range(10923, 16383, text("?"), 7003), range(16383, 16383, Reply{}, 7004)});
  const std::vector<SlotRange> want{{0, 5460, "10.0.0.1", 7001},
                                    {5461, 10922, "seed", 7002},
                                    {10923, 16383, "seed", 7003},
                                    {16383, 16383, "seed", 7004}};
  EXPECT_EQ(fairgate::redis::slot_ranges(reply, "seed"), want)
      << "a master that does not know its address (empty, \"?\", nil) is the node that answered";
}

TEST(RedisClusterSlots, NonsenseGivesNoRange) {
  using fairgate::redis::slot_ranges;
  EXPECT_TRUE(slot_ranges(text("OK"), "seed").empty());
  EXPECT_TRUE(slot_ranges(list({}), "seed").empty());
  const Reply bad = list({
      range(-1, 10, text("h"), 7001),                                    // below slot 0
      range(0, 16384, text("h"), 7001),                                  // past slot 16383
      range(10, 9, text("h"), 7001),                                     // first after last
      range(0, 10, text("h"), 0),                                        // no port
      range(0, 10, text("h"), 65536),                                    // no port either
      range(0, 10, text("bad\r\nhost"), 7001),                           // a control character
      range(0, 10, text("h\xc3\xa9"), 7001),                             // not ASCII
      range(0, 10, integer(7), 7001),                                    // a host of the wrong type
      range(0, 10, list({}), 7001),                                      // nor this
      list({text("0"), integer(10), list({text("h"), integer(1)})}),     // a first slot as a string
      list({integer(0), integer(10)}),                                   // no master
      list({integer(0), integer(10), list({text("h")})}),                // a master without a port
      list({integer(0), integer(10), list({text("h"), text("7001")})}),  // a port as a string
      text("range"),
  });
  EXPECT_TRUE(slot_ranges(bad, "seed").empty()) << "each of these is left out";
  const Reply mixed = list({range(0, 10, text("bad host"), 7001), range(11, 20, text("good"), 7002)});
  EXPECT_EQ(slot_ranges(mixed, "seed"), (std::vector<SlotRange>{{11, 20, "good", 7002}}))
      << "a bad range costs only itself";
}

// --- the level of a Redis backend line (redis/log_level.hpp) -------------------------

// docs/troubleshooting.md: every problem met with Redis is a line at warn; a recovery is
// information. These lines (as connection.cpp and redis_limiter.cpp write them) came out at
// info, so `--log-level warn` showed "degraded" without its cause (a helper, with rediss://
// pointed at a plain port); "left degraded mode" came out at warn.
TEST(RedisLogLevel, EveryProblemIsAWarningAndARecoveryIsInformation) {
  using fairgate::LogLevel;
  using fairgate::redis::level_of;
  for (const std::string_view line :
       {"TLS handshake with 127.0.0.1:6380 timed out after 1000 ms (is it a plain, non-TLS port? then use "
        "redis://)",
        "Redis at 127.0.0.1:6380 closed the connection before any reply (a TLS-only port? then use "
        "rediss://)",
        "Redis at 127.0.0.1:6380 answered with TLS: use rediss://",
        "TLS connection to 127.0.0.1:6380 ended before any reply: stream truncated (does it want a client "
        "certificate: tls_cert_file, tls_key_file?)",
        "limiter chat: no reply from Redis heard for 2.8 s: heartbeats no longer extend this instance's "
        "liveness",
        "limiter chat: degraded: Redis unreachable for 1.2 s"})
    EXPECT_EQ(level_of(line), LogLevel::warn) << line;
  EXPECT_EQ(
      level_of("limiter chat: left degraded mode after 2.6 s: permits and waiters handed back to Redis"),
      LogLevel::info);
  EXPECT_EQ(level_of("limiter chat: two instances share the id x: the cap does not hold"), LogLevel::error);
}
