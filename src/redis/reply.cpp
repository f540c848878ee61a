// redis/reply.cpp — replies from hiredis' reader, their readable form, and
// the check of their shape.
#include "redis/reply.hpp"

#include "core/number.hpp"
#include "core/text.hpp"

#include <hiredis/hiredis.h>

namespace fairgate::redis {

void bound_arrays(redisReader* reader) {
  if (!reader) return;
  // hiredis' own reply functions (every reader starts with them), with its
  // array constructor behind a bound on the announced length; a null object
  // is what hiredis expects of a constructor that cannot make one (it reads
  // as an error, and the connection is reset).
  static const redisReplyObjectFunctions defaults = *reader->fn;
  static redisReplyObjectFunctions bounded = [] {
    redisReplyObjectFunctions f = defaults;
    f.createArray = [](const redisReadTask* task, auto elements) -> void* {
      if (elements < 0 || static_cast<std::size_t>(elements) > kMaxReplyElements) return nullptr;
      return defaults.createArray(task, elements);
    };
    return f;
  }();
  reader->fn = &bounded;
}

redisReader* make_reply_reader() {
  redisReader* reader = redisReaderCreate();
  bound_arrays(reader);
  return reader;
}

Reply reply_of(const redisReply* r) {
  Reply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
      out.type = r->type == REDIS_REPLY_STRING   ? Reply::Type::string
                 : r->type == REDIS_REPLY_STATUS ? Reply::Type::status
                                                 : Reply::Type::error;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = Reply::Type::integer;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = Reply::Type::array;
      out.elements.reserve(r->elements);
      for (std::size_t i = 0; i < r->elements; ++i) out.elements.push_back(reply_of(r->element[i]));
      break;
    default: out.type = Reply::Type::nil; break;
  }
  return out;
}

namespace {

void append_excerpt(const Reply& r, std::string& out, std::size_t max) {
  if (out.size() > max) return;
  const std::size_t room = max - out.size() + 1;
  switch (r.type) {
    case Reply::Type::nil: out += "nil"; return;
    case Reply::Type::integer: out += std::to_string(r.integer); return;
    case Reply::Type::status:
    case Reply::Type::error: out += core::escape_controls(std::string_view(r.str).substr(0, room)); return;
    case Reply::Type::string:
      out += '"';
      out += core::escape_controls(std::string_view(r.str).substr(0, room));
      out += '"';
      return;
    case Reply::Type::array:
      out += '[';
      for (std::size_t i = 0; i < r.elements.size() && out.size() <= max; ++i) {
        if (i) out += ',';
        append_excerpt(r.elements[i], out, max);
      }
      out += ']';
      return;
  }
}

bool is_string(const Reply& r) { return r.type == Reply::Type::string || r.type == Reply::Type::status; }

// Shapes are read where they are matched, without building anything: a reply
// is checked on every call's completion.

/// The length of the token at the front of `shape`: 1 for a letter, the
/// group's length for "[...]"; 0 when the front is not a whole token.
std::size_t token_length(std::string_view shape) {
  if (shape.empty()) return 0;
  if (shape.front() == 'i' || shape.front() == 's') return 1;
  if (shape.front() != '[') return 0;
  std::size_t depth = 0;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == '[') ++depth;
    if (shape[i] == ']' && --depth == 0) return i + 1;
  }
  return 0;  // unbalanced
}

/// Whether `shape` is tokens only, groups not empty and well formed, with at
/// most one '|' (none in a group: `top` false).
bool well_formed(std::string_view shape, bool top) {
  bool bar = false;
  while (!shape.empty()) {
    if (shape.front() == '|') {
      if (!top || bar) return false;
      bar = true;
      shape.remove_prefix(1);
      continue;
    }
    const std::size_t n = token_length(shape);
    if (n == 0 || (n > 1 && (n == 2 || !well_formed(shape.substr(1, n - 2), false)))) return false;
    shape.remove_prefix(n);
  }
  return true;
}

/// Whether `r` has the type of the (well-formed) `token`.
bool matches(const Reply& r, std::string_view token) {
  switch (token.front()) {
    case 'i':
      return r.type == Reply::Type::integer || (is_string(r) && core::parse_number<std::int64_t>(r.str));
    case 's': return is_string(r);
    default: break;  // '['
  }
  if (r.type != Reply::Type::array) return false;
  // The group's tokens, over and over: the length a multiple of their number.
  const std::string_view group = token.substr(1, token.size() - 2);
  std::size_t at = 0;
  for (const Reply& e : r.elements) {
    const std::size_t n = token_length(group.substr(at));
    if (!matches(e, group.substr(at, n))) return false;
    at = at + n == group.size() ? 0 : at + n;
  }
  return at == 0;
}

}  // namespace

std::string Reply::excerpt(std::size_t max) const {
  std::string out;
  append_excerpt(*this, out, max);
  if (out.empty()) return "(empty)";  // an empty status or error
  if (out.size() > max) {
    out.resize(max);
    out += "...";
  }
  return out;
}

bool element_has_shape(const Reply& element, std::string_view token) {
  return !token.empty() && token_length(token) == token.size() && well_formed(token, false) &&
         matches(element, token);
}

bool has_shape(const Reply& reply, std::string_view shape) {
  if (reply.type != Reply::Type::array || !well_formed(shape, true)) return false;
  bool optional = false;  // past the '|': the rest may be absent
  for (const Reply& e : reply.elements) {
    if (!shape.empty() && shape.front() == '|') {
      optional = true;
      shape.remove_prefix(1);
    }
    const std::size_t n = token_length(shape);
    if (n == 0 || !matches(e, shape.substr(0, n))) return false;  // n == 0: more elements than tokens
    shape.remove_prefix(n);
  }
  return optional || shape.empty() || shape.front() == '|';
}

std::int64_t integer_of(const Reply& r) {
  if (r.type == Reply::Type::integer) return r.integer;
  if (is_string(r)) return core::parse_number<std::int64_t>(r.str).value_or(0);
  return 0;
}

}  // namespace fairgate::redis
