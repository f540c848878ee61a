// serve/cors.hpp — browser access: which Origin may use the admission API
// (`[server] cors_origins`, docs/serve.md "Browsers and CORS"). Pure, no I/O.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fairgate::serve {

/// "HTTPS://App.Example.com:443" → "https://app.example.com": the form a
/// browser sends in Origin (lowercase, default port omitted). Only http and
/// https origins, no path, user info or wildcard; nullopt and `problem` set
/// otherwise. "*" is not an origin (the caller handles it).
std::optional<std::string> normalize_origin(std::string_view text, std::string& problem);

enum class OriginVerdict {
  none,     ///< no Origin header: not a browser's cross-site request
  allowed,  ///< listed in cors_origins (or cors_origins is ["*"])
  refused,  ///< a foreign page: no CORS headers, and no permit (403 origin_not_allowed)
};

/// Judges a request's Origin against `allowed` (normalized origins, or ["*"]).
/// Browsers send Origin on every cross-site request and on same-site POSTs
/// too, so a page served through this server's own host is judged like any
/// other: it must be listed. (Trusting Host instead would let DNS rebinding in.)
OriginVerdict judge_origin(std::string_view origin, const std::vector<std::string>& allowed);

}  // namespace fairgate::serve
