// redis/reply.hpp — one RESP2 reply as a plain value, and the Redis client's
// error codes.
#pragma once

#include <boost/system/error_code.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

struct redisReply;
struct redisReader;

namespace fairgate::redis {

struct Reply {
  enum class Type : std::uint8_t { nil, string, status, error, integer, array };
  Type type = Type::nil;
  std::string str;              ///< string, status and error replies
  std::int64_t integer = 0;     ///< integer replies
  std::vector<Reply> elements;  ///< array replies

  bool is_error() const noexcept { return type == Type::error; }
  bool is_nil() const noexcept { return type == Type::nil; }
  /// The integer value, or nullopt when the reply is not an integer.
  std::optional<std::int64_t> as_integer() const noexcept {
    if (type == Type::integer) return integer;
    return std::nullopt;
  }
  /// For a message, a log line or a test failure: a readable form, e.g.
  /// ["message","ch",7] (an error reply: its text), with control characters
  /// escaped, cut at about `max` bytes ("..." then) without building the rest.
  std::string excerpt(std::size_t max = 200) const;

  bool operator==(const Reply&) const = default;
};

/// Whether `reply` is an array whose elements have, one by one, the types
/// `shape` names — so that no field of a malformed reply is ever read as a
/// plausible value (a word as 0, nil as an empty list). One letter per element:
///   i   an integer, or a string holding one (Lua hands numbers both ways)
///   s   a string (bulk or status; never nil)
///   [p] an array of elements matching p, repeated: [s] a list of strings,
///       [si] pairs of a string and an integer (the length a multiple of 2)
/// Elements after a '|' may be absent; none may follow the last. E.g.
/// "sii|i": a string and two integers, then maybe a third.
/// A malformed shape matches nothing.
bool has_shape(const Reply& reply, std::string_view shape);

/// Whether one element has the type one letter of a shape names ("i", "s",
/// "[si]"; see has_shape).
bool element_has_shape(const Reply& element, std::string_view token);

/// The integer of an `i` element (see has_shape); 0 for anything else.
std::int64_t integer_of(const Reply& r);

/// The most elements an array reply may announce: more than any reply
/// fairgate asks for (a heartbeat lists this instance's holders, at most
/// max_concurrent: 10^6). A longer header is a protocol error, not an
/// allocation of its size (hiredis allocates the array when it reads the
/// header: "*2000000000" would be 16 GB).
inline constexpr std::size_t kMaxReplyElements = 4 * 1024 * 1024;

/// A hiredis reader (RESP2) that refuses arrays longer than
/// kMaxReplyElements; free it with redisReaderFree.
redisReader* make_reply_reader();
/// Makes `reader` (e.g. a redisContext's) refuse arrays longer than kMaxReplyElements.
void bound_arrays(redisReader* reader);

/// What hiredis' reader made of the bytes, as a Reply. RESP3 types (never
/// asked for: the connections speak RESP2) become nil.
Reply reply_of(const redisReply* r);

/// Failures of the client (a Redis error reply is not one of these: it is a
/// Reply of Type::error).
enum class Error : int {
  timeout = 1,   ///< sent, but no reply within the command timeout (it may still run)
  disconnected,  ///< the connection dropped before the reply came (it may have run)
  not_sent,      ///< no connection to send it on before its timeout: it never reached Redis
  closed,        ///< the client was closed
  protocol,      ///< the server sent bytes that are not RESP
  no_script,     ///< Redis did not have the script (NOSCRIPT) and the call was not repeated
  denied,  ///< the ACL refused the call (NOPERM), or a command inside the script (it may have run in part)
};

const boost::system::error_category& error_category() noexcept;
boost::system::error_code make_error_code(Error e) noexcept;

}  // namespace fairgate::redis

template <>
struct boost::system::is_error_code_enum<fairgate::redis::Error> : std::true_type {};
