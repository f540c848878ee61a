// serve/openapi.hpp — docs/openapi.yaml, embedded at build time
// (cmake/embed_openapi.py) and served at GET /openapi.yaml and /openapi.json.
#pragma once

#include <string_view>

namespace fairgate::serve::openapi {

extern const std::string_view kYaml;  ///< docs/openapi.yaml as written
extern const std::string_view kJson;  ///< the same document as JSON

}  // namespace fairgate::serve::openapi
