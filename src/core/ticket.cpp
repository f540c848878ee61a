#include "core/ticket.hpp"

namespace fairgate::core {

std::string_view to_string(TicketState state) noexcept {
  switch (state) {
    case TicketState::pending: return "PENDING";
    case TicketState::granted: return "GRANTED";
    case TicketState::timed_out: return "TIMED_OUT";
    case TicketState::cancelled: return "CANCELLED";
    case TicketState::rejected: return "REJECTED";
  }
  return "?";
}

std::string_view to_string(TicketEvent event) noexcept {
  switch (event) {
    case TicketEvent::grant: return "grant";
    case TicketEvent::timeout: return "timeout";
    case TicketEvent::cancel: return "cancel";
    case TicketEvent::reject: return "reject";
  }
  return "?";
}

}  // namespace fairgate::core
