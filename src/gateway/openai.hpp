// gateway/openai.hpp — how the gateway's own answers read to an OpenAI
// client (docs/gateway.md, "Errors, in the OpenAI shape"): the error body,
// the status and type of each rejection, the error event inside a stream and
// the seeds' rejection. Every error the gateway itself answers is built here.
#pragma once

#include "serve/session.hpp"

#include <fairgate/error.hpp>
#include <fairgate/limiter.hpp>

#include <chrono>
#include <string>
#include <string_view>

namespace fairgate::serve {

/// What a rejected streaming request of a `seed` route is told (REJECT's delta).
inline constexpr std::string_view kBusyText = "The system is busy, please try again later";

/// {"error":{"message","type","param":null,"code"}} — the OpenAI error shape.
std::string openai_error(std::string_view message, std::string_view type, std::string_view code);

/// How a rejection reads to an OpenAI client.
struct OpenAiReject {
  http::status status;
  std::string_view type;
  std::string_view code;
};

OpenAiReject openai_reject(RejectReason reason);

/// The message of a request that got no permit within `max_wait`, the max
/// wait it was given (the route's, else the limiter's; never the time measured).
std::string timeout_message(std::chrono::milliseconds max_wait);

/// The message of a request that ended without a permit after being given
/// `max_wait`: timeout_message(max_wait) for a timeout, else the limiter's.
std::string rejection_message(const AcquireResult& result, std::chrono::milliseconds max_wait);

/// A JSON answer with `body` (an openai_error) and a final newline.
Response openai_response(http::status status, const Request& req, std::string body);

/// openai_response of openai_error(message, type, code).
Response openai_error_response(http::status status, const Request& req, std::string_view message,
                               std::string_view type, std::string_view code);

/// An error inside an event stream: "data: {"error":{…}}" (what the OpenAI SDKs raise from a stream).
std::string stream_error(std::string_view error_json);

/// The seeds' rejection of the request with `ticket` and `body`: META / REJECT / FINISH / DONE.
std::string seed_rejection(const std::string& ticket, std::string_view body);

}  // namespace fairgate::serve
