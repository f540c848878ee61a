// core/ticket.hpp — the state machine of one request.
//
// Invariants:
//  * A ticket starts PENDING and leaves it exactly once, to GRANTED,
//    TIMED_OUT, CANCELLED or REJECTED. The first event to arrive wins; every
//    later event is answered without changing the state.
//  * Only the event that wins gets Action::deliver: exactly one party tells
//    the caller how the request ended (F4).
//  * A grant that arrives after the ticket ended (the waiter timed out or was
//    cancelled while the grant was in flight, e.g. across the network) gets
//    Action::return_permit: the permit was made for nobody and must be given
//    back, or it would leak.
//  * A cancel or timeout after GRANTED does nothing: the permit belongs to the
//    caller, who releases it (the seed's rule: never release on cancel after
//    grant).
//  * Cleanup (leaving the queue, dropping timers) may be attempted from every
//    path; begin_cleanup() lets exactly one of them do it.
//
// Pure: no I/O, no clock. Thread-safe: resume() is one compare-and-swap.
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

namespace fairgate::core {

enum class TicketState : std::uint8_t { pending, granted, timed_out, cancelled, rejected };

enum class TicketEvent : std::uint8_t {
  grant,    ///< a permit was assigned to this request
  timeout,  ///< its deadline passed
  cancel,   ///< its caller gave up (cancellation, disconnect)
  reject,   ///< the backend refused it (queue full, disabled, shutdown, ...)
};

enum class TicketAction : std::uint8_t {
  none,           ///< nothing to do: the request had already ended this way or another
  deliver,        ///< this event ended the request: deliver its outcome
  return_permit,  ///< a grant reached an ended request: release that permit
};

struct TicketTransition {
  TicketState next;
  TicketAction action;
  friend bool operator==(const TicketTransition&, const TicketTransition&) = default;
};

/// The whole machine as a pure function.
constexpr TicketTransition transition(TicketState state, TicketEvent event) noexcept {
  if (state == TicketState::pending) {
    switch (event) {
      case TicketEvent::grant: return {TicketState::granted, TicketAction::deliver};
      case TicketEvent::timeout: return {TicketState::timed_out, TicketAction::deliver};
      case TicketEvent::cancel: return {TicketState::cancelled, TicketAction::deliver};
      case TicketEvent::reject: return {TicketState::rejected, TicketAction::deliver};
    }
  }
  if (event == TicketEvent::grant && state != TicketState::granted) {
    return {state, TicketAction::return_permit};
  }
  return {state, TicketAction::none};
}

std::string_view to_string(TicketState state) noexcept;
std::string_view to_string(TicketEvent event) noexcept;

class Ticket {
 public:
  Ticket() = default;
  Ticket(const Ticket&) = delete;
  Ticket& operator=(const Ticket&) = delete;

  /// Applies `event` atomically and says what the caller must do.
  TicketAction resume(TicketEvent event) noexcept {
    TicketState current = state_.load(std::memory_order_acquire);
    for (;;) {
      const TicketTransition t = transition(current, event);
      if (t.next == current) return t.action;
      if (state_.compare_exchange_weak(current, t.next, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
        return t.action;
      }
    }
  }

  TicketState state() const noexcept { return state_.load(std::memory_order_acquire); }
  bool pending() const noexcept { return state() == TicketState::pending; }

  /// True for exactly one caller, however many call it.
  bool begin_cleanup() noexcept { return !cleaned_.exchange(true, std::memory_order_acq_rel); }

 private:
  std::atomic<TicketState> state_{TicketState::pending};
  std::atomic<bool> cleaned_{false};
};

}  // namespace fairgate::core
