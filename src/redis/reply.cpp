// redis/reply.cpp — a reply's readable form, and the check of its shape.
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
      out.type = Reply::Type::string;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = Reply::Type::status;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = Reply::Type::error;
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

std::string Reply::debug_string() const {
  switch (type) {
    case Type::nil: return "nil";
    case Type::string: return "\"" + str + "\"";
    case Type::status: return str;
    case Type::error: return "(error) " + str;
    case Type::integer: return std::to_string(integer);
    case Type::array: {
      std::string s = "[";
      for (std::size_t i = 0; i < elements.size(); ++i) s += (i ? "," : "") + elements[i].debug_string();
      return s + "]";
    }
  }
  return "?";
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

/// A shape as its element tokens ("i", "s", "[...]"), and how many are required.
struct Pattern {
  std::vector<std::string_view> tokens;
  std::size_t required = 0;
  bool ok = false;
};

Pattern parse(std::string_view shape) {
  Pattern p;
  bool optional = false;
  std::size_t at = 0;
  while (at < shape.size()) {
    const char c = shape[at];
    if (c == ' ') {
      ++at;
    } else if (c == '|') {
      if (optional) return p;
      optional = true;
      p.required = p.tokens.size();
      ++at;
    } else if (c == 'i' || c == 's') {
      p.tokens.push_back(shape.substr(at++, 1));
    } else if (c == '[') {
      std::size_t end = at, depth = 0;
      for (; end < shape.size(); ++end) {
        if (shape[end] == '[') ++depth;
        if (shape[end] == ']' && --depth == 0) break;
      }
      if (end == shape.size()) return p;  // unbalanced
      p.tokens.push_back(shape.substr(at, end - at + 1));
      at = end + 1;
    } else {
      return p;
    }
  }
  if (!optional) p.required = p.tokens.size();
  p.ok = true;
  return p;
}

bool matches(const Reply& r, std::string_view token) {
  switch (token.front()) {
    case 'i':
      return r.type == Reply::Type::integer || (is_string(r) && core::parse_number<std::int64_t>(r.str));
    case 's': return is_string(r);
    default: break;  // '['
  }
  if (r.type != Reply::Type::array) return false;
  const Pattern p = parse(token.substr(1, token.size() - 2));
  if (!p.ok || p.tokens.empty() || p.required != p.tokens.size()) return false;
  if (r.elements.size() % p.tokens.size() != 0) return false;
  for (std::size_t i = 0; i < r.elements.size(); ++i) {
    if (!matches(r.elements[i], p.tokens[i % p.tokens.size()])) return false;
  }
  return true;
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
  const Pattern p = parse(token);
  return p.ok && p.tokens.size() == 1 && p.required == 1 && matches(element, p.tokens.front());
}

bool has_shape(const Reply& reply, std::string_view shape) {
  if (reply.type != Reply::Type::array) return false;
  const Pattern p = parse(shape);
  if (!p.ok || reply.elements.size() < p.required || reply.elements.size() > p.tokens.size()) return false;
  for (std::size_t i = 0; i < reply.elements.size(); ++i) {
    if (!matches(reply.elements[i], p.tokens[i])) return false;
  }
  return true;
}

std::int64_t integer_of(const Reply& r) {
  if (r.type == Reply::Type::integer) return r.integer;
  if (is_string(r)) return core::parse_number<std::int64_t>(r.str).value_or(0);
  return 0;
}

}  // namespace fairgate::redis
