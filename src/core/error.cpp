#include <fairgate/error.hpp>

#include <string>

namespace fairgate {

std::string_view to_string(RejectReason reason) noexcept {
  switch (reason) {
    case RejectReason::timeout: return "timeout";
    case RejectReason::cancelled: return "cancelled";
    case RejectReason::queue_full: return "queue_full";
    case RejectReason::disabled: return "disabled";
    case RejectReason::unavailable: return "unavailable";
    case RejectReason::invalid_argument: return "invalid_argument";
    case RejectReason::shutdown: return "shutdown";
    case RejectReason::would_time_out: return "would_time_out";
  }
  return "unknown";
}

namespace {

class RejectCategory final : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "fairgate.reject"; }
  std::string message(int ev) const override {
    switch (static_cast<RejectReason>(ev)) {
      case RejectReason::timeout: return "no permit became free before the deadline";
      case RejectReason::cancelled: return "the request was cancelled while waiting";
      case RejectReason::queue_full: return "the queue is full";
      case RejectReason::disabled: return "the limiter is disabled";
      case RejectReason::unavailable: return "the limiter is unavailable";
      case RejectReason::invalid_argument: return "an argument is invalid (the result's message names it)";
      case RejectReason::shutdown: return "the limiter is shutting down";
      case RejectReason::would_time_out: return "the estimated wait exceeds the maximum wait";
    }
    return "unknown rejection";
  }
};

class ErrorCategory final : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "fairgate"; }
  std::string message(int ev) const override {
    switch (static_cast<Errc>(ev)) {
      case Errc::unknown_limiter: return "unknown limiter";
      case Errc::invalid_name: return "invalid limiter name";
      case Errc::invalid_settings: return "invalid settings";
      case Errc::shut_down: return "the backend has been shut down";
      case Errc::unavailable: return "the shared state did not confirm the change";
      case Errc::unknown_rule: return "unknown rate-limit rule";
    }
    return "unknown error";
  }
};

}  // namespace

const boost::system::error_category& reject_category() noexcept {
  static const RejectCategory category;
  return category;
}

const boost::system::error_category& error_category() noexcept {
  static const ErrorCategory category;
  return category;
}

boost::system::error_code make_error_code(RejectReason reason) noexcept {
  return {static_cast<int>(reason), reject_category()};
}

boost::system::error_code make_error_code(Errc code) noexcept {
  return {static_cast<int>(code), error_category()};
}

}  // namespace fairgate
