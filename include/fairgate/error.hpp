// fairgate/error.hpp — reasons an acquire ends without a permit, and failures.
//
// A rejection is a decision, not a failure: it comes back as a value inside
// AcquireResult. Each reason also maps to a boost::system::error_code of the
// "fairgate.reject" category so it can travel through error-code based APIs
// (see run.hpp). Failures of the library itself (unknown limiter, invalid
// settings) use the "fairgate" category.
#pragma once

#include <boost/system/error_code.hpp>

#include <string_view>
#include <type_traits>

namespace fairgate {

/// Why an acquire ended without a permit. Exactly one reason per ended request.
enum class RejectReason : int {
  timeout = 1,       ///< max_wait passed before a permit was free (TIMED_OUT)
  cancelled,         ///< the caller cancelled while waiting (CANCELLED)
  queue_full,        ///< max_queue waiters were already waiting (REJECTED)
  disabled,          ///< the limiter is disabled in reject mode (REJECTED)
  unavailable,       ///< the backend cannot decide right now (REJECTED)
  invalid_argument,  ///< the acquire options were invalid (REJECTED)
  shutdown,          ///< the backend shut down while the request waited (REJECTED)
  /// reject_early: the wait estimate for it already exceeded its max_wait by
  /// the margin (docs/eta.md), so it was turned away at arrival (REJECTED)
  would_time_out,
};

/// Stable lower-case name of a reason, as used on the wire: "timeout", "queue_full", ...
std::string_view to_string(RejectReason reason) noexcept;

/// Failures of library calls (not decisions about a request).
enum class Errc : int {
  unknown_limiter = 1,  ///< no limiter with that name exists
  invalid_name,         ///< a limiter name breaks the naming rule
  invalid_settings,     ///< settings failed validation
  shut_down,            ///< the backend has been shut down
  unavailable,          ///< the shared state (Redis) did not confirm the change
  unknown_rule,         ///< no rate-limit rule with that name exists
};

const boost::system::error_category& reject_category() noexcept;
const boost::system::error_category& error_category() noexcept;

boost::system::error_code make_error_code(RejectReason reason) noexcept;
boost::system::error_code make_error_code(Errc code) noexcept;

}  // namespace fairgate

template <>
struct boost::system::is_error_code_enum<fairgate::RejectReason> : std::true_type {};
template <>
struct boost::system::is_error_code_enum<fairgate::Errc> : std::true_type {};
