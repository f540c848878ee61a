// fairgate/fairgate.hpp — everything a C++ user of libfairgate needs.
//
//   boost::asio::io_context io;
//   auto backend = fairgate::make_memory_backend(io.get_executor());
//   auto chat = backend->open("chat", {.max_concurrent = 3}).value();
//   chat.async_acquire({.max_wait = 20s}, [](fairgate::AcquireResult r) {
//     if (r) { /* work while r.permit() is held */ } else { /* r.reason() */ }
//   });
#pragma once

#include <fairgate/backend.hpp>
#include <fairgate/error.hpp>
#include <fairgate/limiter.hpp>
#include <fairgate/log.hpp>
#include <fairgate/permit.hpp>
#include <fairgate/run.hpp>
#include <fairgate/settings.hpp>
#include <fairgate/version.hpp>
