// serve/dashboard.hpp — the live page of GET /dashboard (docs/dashboard.md):
// src/serve/dashboard/dashboard.html, embedded at build time (cmake/embed_text.cmake).
#pragma once

#include <string_view>

namespace fairgate::serve::dashboard {

/// The whole page: HTML with its styles and script inline (no external fetch).
extern const std::string_view kHtml;

}  // namespace fairgate::serve::dashboard
