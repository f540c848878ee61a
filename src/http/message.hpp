// http/message.hpp — the HTTP layer's messages: the request and response
// types every server and client of fairgate uses, and the few ways to build
// an answer (a body with its type, JSON). Knows no limiter and no route.
//
// The namespace also names Beast's status, verb and field, so code above
// this layer writes fairgate::http::status and needs no Beast alias.
#pragma once

#include <boost/beast/http/field.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/verb.hpp>
#include <boost/json/value.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace fairgate::http {

using boost::beast::http::field;
using boost::beast::http::status;
using boost::beast::http::verb;
using Request = boost::beast::http::request<boost::beast::http::string_body>;
using Response = boost::beast::http::response<boost::beast::http::string_body>;

/// An answer to `req` (same HTTP version and keep-alive) with `body` of MIME
/// `type`, `Server: server`, `Cache-Control: no-store` and its length set.
Response make_response(status s, const Request& req, std::string body, std::string_view type,
                       std::string_view server);

/// make_response with `v` serialized as JSON (one line, then a newline).
Response json_response(status s, const Request& req, const boost::json::value& v, std::string_view server);

/// Every value of the field `name` in `req`, in order, joined by ", " (RFC 9110 5.3: a field
/// given on several lines is one list). Empty when it is absent. Beast's `req[name]` reads only
/// the first line, which for X-Forwarded-For is the one a client can write.
std::string field_list(const Request& req, std::string_view name);

/// The elements of a comma-separated header list ("gzip, chunked"), spaces and tabs around
/// each trimmed, empty ones skipped (RFC 9110, 5.6.1).
std::vector<std::string_view> list_elements(std::string_view list);

/// Whether `method` ("GET") is one of the comma-separated `methods` ("GET, PUT").
bool method_listed(std::string_view methods, std::string_view method) noexcept;

}  // namespace fairgate::http
