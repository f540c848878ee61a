// serve/server.hpp — `fairgate serve`: the HTTP admission API (api.md) on
// Boost.Beast, asynchronous throughout (S3): every connection is a coroutine
// on its own strand; a few I/O threads carry thousands of waiting clients.
#pragma once

#include "serve/config.hpp"

#include <cstdio>

namespace fairgate::serve {

/// Opens the backend and the limiters of `config`, listens, and serves until
/// SIGTERM or SIGINT. Then it stops accepting, ends every waiting request,
/// releases every permit this instance holds, and returns 0.
///
/// Prints one line to `out` once listening:
///   "fairgate serve: listening on http://HOST:PORT (...)"
/// (with the real port when config.listen_port is 0), and one when stopped.
/// Throws ConfigError when a limiter cannot be opened with its settings and
/// std::runtime_error when it cannot listen.
int run_server(const ServeConfig& config, std::FILE* out);

}  // namespace fairgate::serve
