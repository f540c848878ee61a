// tests/fuzz/fuzz_redis_reply.cpp — what fairgate makes of the bytes a Redis
// server sends: hiredis' reader, the conversion to a Reply
// (src/redis/reply.cpp, reply_of) and the check of a reply's shape
// (has_shape, the shapes of src/redis/scripts.hpp) that decides whether any
// field of it is read (docs/faults.md, "Bad replies").
//
// Checks: the replies read do not depend on how the bytes were cut into
// reads; a reply written back as RESP reads back the same; what a message
// quotes of it (excerpt) is one clear line within its bound; a reply that has
// one of the scripts' shapes has the element count and types that shape
// says; a shape with a letter it does not know matches nothing; the slot map
// read from a reply taken for CLUSTER SLOTS (slot_ranges, src/redis/client.hpp)
// has only ranges inside 0..16383, real ports and hosts of visible ASCII
// (never a control character into a connection or a log line), and reads
// back the same once written as a CLUSTER SLOTS reply; a string reply taken
// for INFO memory (eviction_risk, src/redis/database_check.hpp) gives at most
// one clear line, and only for a limit above 0 and a policy other than
// noeviction; an error reply the ACL sent (denied) gives one clear, bounded
// line that names the fix.
//
// Input: a shape to try (up to the first '\n'), split points, then the bytes.
#include "fuzz/check.hpp"

#include "core/number.hpp"
#include "redis/client.hpp"
#include "redis/database_check.hpp"
#include "redis/reply.hpp"
#include "redis/scripts.hpp"

#include <hiredis/hiredis.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

using fairgate::redis::Reply;

namespace {

/// The replies in `bytes`, fed in pieces cut at `cuts`; stops at a protocol
/// error (reported in `error`), a bounded number of replies.
std::vector<Reply> read_all(std::string_view bytes, const std::vector<std::size_t>& cuts, bool& error) {
  std::vector<Reply> out;
  redisReader* reader = fairgate::redis::make_reply_reader();
  error = false;
  std::size_t at = 0;
  const auto drain = [&] {
    for (;;) {
      void* raw = nullptr;
      if (redisReaderGetReply(reader, &raw) != REDIS_OK) {
        error = true;
        return;
      }
      if (!raw) return;
      out.push_back(fairgate::redis::reply_of(static_cast<const redisReply*>(raw)));
      freeReplyObject(raw);
    }
  };
  const auto feed = [&](std::size_t n) {
    if (error || n == 0) return;
    if (redisReaderFeed(reader, bytes.data() + at, n) != REDIS_OK) error = true;
    at += n;
    if (!error) drain();
  };
  for (const std::size_t c : cuts) feed(std::min(c, bytes.size() - at));
  feed(bytes.size() - at);
  redisReaderFree(reader);
  return out;
}

/// `r` as RESP2 (nil as a nil bulk string, as Redis sends it).
void write(const Reply& r, std::string& out) {
  switch (r.type) {
    case Reply::Type::nil: out += "$-1\r\n"; return;
    case Reply::Type::status: out += "+" + r.str + "\r\n"; return;
    case Reply::Type::error: out += "-" + r.str + "\r\n"; return;
    case Reply::Type::integer: out += ":" + std::to_string(r.integer) + "\r\n"; return;
    case Reply::Type::string: out += "$" + std::to_string(r.str.size()) + "\r\n" + r.str + "\r\n"; return;
    case Reply::Type::array:
      out += "*" + std::to_string(r.elements.size()) + "\r\n";
      for (const auto& e : r.elements) write(e, out);
      return;
  }
}

bool is_string(const Reply& r) { return r.type == Reply::Type::string || r.type == Reply::Type::status; }

/// `ranges` as the reply of CLUSTER SLOTS (no replicas, no node id).
std::string cluster_slots(const std::vector<fairgate::redis::SlotRange>& ranges) {
  std::string out = "*" + std::to_string(ranges.size()) + "\r\n";
  for (const auto& r : ranges)
    out += "*3\r\n:" + std::to_string(r.first) + "\r\n:" + std::to_string(r.last) + "\r\n*2\r\n$" +
           std::to_string(r.host.size()) + "\r\n" + r.host + "\r\n:" + std::to_string(r.port) + "\r\n";
  return out;
}

/// The value of the first "field:value" line of INFO text (lines end in
/// "\r\n" or "\n"), or "" when there is none: the oracle for eviction_risk.
std::string info_value(std::string_view info, std::string_view field) {
  std::size_t at = 0;
  while (at <= info.size()) {
    auto end = info.find('\n', at);
    if (end == std::string_view::npos) end = info.size();
    std::string_view line = info.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.size() > field.size() && line.substr(0, field.size()) == field && line[field.size()] == ':')
      return std::string(line.substr(field.size() + 1));
    at = end + 1;
  }
  return {};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fairgate::fuzz::Input in(data, size);
  const std::string shape(in.line());
  std::vector<std::size_t> cuts;
  for (unsigned n = in.byte() % 8; n > 0; --n) cuts.push_back(in.byte());
  const std::string_view bytes = in.rest();

  bool error_whole = false, error_cut = false;
  const auto whole = read_all(bytes, {}, error_whole);
  const auto cut = read_all(bytes, cuts, error_cut);
  FUZZ_CHECK(error_whole == error_cut, "a protocol error does not depend on how the bytes were cut");
  FUZZ_CHECK(whole.size() == cut.size(), "the same replies, however the bytes were cut");
  for (std::size_t i = 0; i < whole.size(); ++i)
    FUZZ_CHECK(whole[i] == cut[i], "the same replies, however cut");

  const auto scripts_shapes = {fairgate::redis::shapes::kVerdict,    fairgate::redis::shapes::kQueued,
                               fairgate::redis::shapes::kRejected,   fairgate::redis::shapes::kReleased,
                               fairgate::redis::shapes::kConfigured, fairgate::redis::shapes::kHeartbeat,
                               fairgate::redis::shapes::kRestored,   fairgate::redis::shapes::kSnapshot};
  const bool unknown_letter = shape.find_first_not_of("is[]|") != std::string::npos;
  for (const Reply& r : whole) {
    // Written back as RESP and read again: the same reply.
    std::string resp;
    write(r, resp);
    bool error = false;
    const auto again = read_all(resp, {}, error);
    FUZZ_CHECK(!error && again.size() == 1 && again[0] == r, "a reply written back reads back the same");

    // What messages and logs quote of a reply: one clear line, bounded.
    const std::string excerpt = r.excerpt(60);
    FUZZ_CHECK(fairgate::fuzz::is_clear_message(excerpt), excerpt);
    FUZZ_CHECK(excerpt.size() <= 63, "an excerpt is cut at its bound");

    // Taken for a CLUSTER SLOTS reply.
    const auto ranges = fairgate::redis::slot_ranges(r, "answered.by");
    FUZZ_CHECK(r.type == Reply::Type::array || ranges.empty(), "only an array has ranges");
    FUZZ_CHECK(ranges.size() <= r.elements.size(), "at most one range per element");
    for (const auto& range : ranges) {
      FUZZ_CHECK(range.first <= range.last && range.last <= 16383, "a range inside 0..16383");
      FUZZ_CHECK(range.port > 0, "a real port");
      FUZZ_CHECK(!range.host.empty(), "a host");
      for (const char c : range.host) FUZZ_CHECK(c > ' ' && c < 0x7f, "a host of visible ASCII");
    }
    if (!ranges.empty()) {
      bool slots_error = false;
      const auto map_again = read_all(cluster_slots(ranges), {}, slots_error);
      FUZZ_CHECK(!slots_error && map_again.size() == 1 &&
                     fairgate::redis::slot_ranges(map_again[0], "other.host") == ranges,
                 "a slot map written as CLUSTER SLOTS reads back the same");
    }

    // Taken for INFO memory: a warning only for a limit and an evicting policy.
    if (is_string(r)) {
      fairgate::redis::Endpoint ep;
      ep.host = "h";
      ep.port = 1;
      if (const auto line = fairgate::redis::eviction_risk(ep, r.str)) {
        FUZZ_CHECK(fairgate::fuzz::is_clear_message(*line), *line);
        FUZZ_CHECK(line->size() < 600, "a bounded line");
        FUZZ_CHECK(r.str.find("maxmemory:") != std::string::npos, "a limit was given");
        // Judged on the INFO text itself (the first "field:value" line of
        // each), not on the line: the server's policy text is quoted in it
        // and may hold anything (found inputs held "maxmemory-policy
        // noeviction)" and "noeviction)").
        FUZZ_CHECK(info_value(r.str, "maxmemory") != "0", "no warning without a limit");
        FUZZ_CHECK(info_value(r.str, "maxmemory_policy") != "noeviction", "noeviction evicts nothing");
      }
    }

    // An error reply the ACL sent: one clear, bounded line (Redis' words
    // escaped), with the fix.
    if (r.is_error() && fairgate::redis::denied(r.str)) {
      fairgate::redis::Endpoint ep;
      ep.host = "h";
      ep.port = 1;
      const std::string line = fairgate::redis::denied_line(ep, r.str);
      FUZZ_CHECK(fairgate::fuzz::is_clear_message(line), line);
      FUZZ_CHECK(line.size() < 1400, "a bounded line");
      FUZZ_CHECK(line.ends_with("docs/redis-acl.md"), "the fix is named");
    }

    const bool matched = fairgate::redis::has_shape(r, shape);
    if (unknown_letter) FUZZ_CHECK(!matched, "a shape with an unknown letter matches nothing");
    if (matched) FUZZ_CHECK(r.type == Reply::Type::array, "only an array has a shape");

    for (const std::string_view s : scripts_shapes) {
      if (!fairgate::redis::has_shape(r, s)) continue;
      // The top-level letters: every 'i' an integer, every 's' a string, every '[' an array.
      std::size_t k = 0, depth = 0;
      for (const char c : s) {
        if (c == '|') continue;
        if (c == ']') {
          --depth;
          continue;
        }
        if (depth == 0) {
          if (k >= r.elements.size()) break;  // the optional tail is absent
          const Reply& e = r.elements[k++];
          if (c == 'i') FUZZ_CHECK(e.type == Reply::Type::integer || is_string(e), "an 'i' is a number");
          if (c == 'i' && is_string(e))
            FUZZ_CHECK(fairgate::core::parse_number<std::int64_t>(e.str), "an 'i' string holds a number");
          if (c == 's') FUZZ_CHECK(is_string(e), "an 's' is a string");
          if (c == '[') FUZZ_CHECK(e.type == Reply::Type::array, "a '[' is a list");
        }
        if (c == '[') ++depth;
      }
      FUZZ_CHECK(k == r.elements.size(), "no element beyond the shape");
    }
  }
  return 0;
}
