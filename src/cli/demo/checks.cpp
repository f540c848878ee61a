// cli/demo/checks.cpp — the end-of-run invariants of `fairgate demo` (checks.hpp).
#include "cli/demo/checks.hpp"

#include <fmt/format.h>

namespace fairgate::cli::demo {

namespace {
using std::chrono::milliseconds;

long long ms(Clock::duration d) { return std::chrono::duration_cast<milliseconds>(d).count(); }
}  // namespace

bool ended(Phase p) { return p == Phase::done || p == Phase::busy || p == Phase::other; }

std::string ordinal(std::size_t n) {
  const char* suffix = "th";
  if (n % 100 < 11 || n % 100 > 13) {
    if (n % 10 == 1) suffix = "st";
    if (n % 10 == 2) suffix = "nd";
    if (n % 10 == 3) suffix = "rd";
  }
  return fmt::format("{}{}", n, suffix);
}

Clock::time_point Seen::seat_seen_at() const {
  return admitted_at != Clock::time_point{} ? admitted_at : seated_at;
}

Clock::duration Seen::waited() const {
  if (phase == Phase::done || phase == Phase::streaming) return seated_at - arrived_at;
  if (ended(phase)) return ended_at - arrived_at;
  return {};
}

Verdict check(const std::vector<const Seen*>& users, const std::vector<const Seen*>& by_arrival,
              const Facts& facts) {
  Verdict v;
  auto& out = v.violations;
  // F4 and F3, user by user.
  for (const Seen* u : users) {
    if (u->ends != 1)
      out.push_back(fmt::format("{} ended {} times (must be exactly once)", u->name, u->ends));
    if (u->phase == Phase::done) {
      ++v.granted;
      if (u->streamed != u->tokens)
        out.push_back(fmt::format("{} got {} of its {} tokens", u->name, u->streamed, u->tokens));
      // The limiter's grant time when the gateway said it (a slow model or a
      // slow machine delays the first token, not the grant), else the client's.
      const auto seat_wait = u->admitted_after ? Clock::duration(*u->admitted_after) : u->waited();
      if (seat_wait > facts.real_max_wait + kSeatSlack) {
        out.push_back(fmt::format("{} got a seat after {} ms (real time), past the max wait of {} ms",
                                  u->name, ms(seat_wait), facts.real_max_wait.count()));
      }
    } else if (u->phase == Phase::busy) {
      ++v.busy;
      if (u->waited() < facts.real_max_wait)
        out.push_back(
            fmt::format("{} was told busy after {} ms, before the max wait", u->name, ms(u->waited())));
    } else if (u->phase == Phase::other) {
      ++v.other;
      out.push_back(fmt::format("{}: {}", u->name, u->message));
    }
  }

  // F2: a user gets a seat only after everyone who asked before has ended
  // its wait (got a seat, or was told busy). A seat is seen at the
  // "admitted" event when the user queued (the gateway sends it at the
  // grant), else at the first chunk; two grants a moment apart may still be
  // read in either order, hence kOrderSlack.
  const Seen* latest = nullptr;  // among earlier arrivals, the one whose wait ended last
  const auto wait_end = [](const Seen* u) {
    return u->phase == Phase::done ? u->seat_seen_at() : u->ended_at;
  };
  for (const Seen* u : by_arrival) {
    if (latest != nullptr && u->phase == Phase::done && wait_end(latest) > u->seat_seen_at() + kOrderSlack &&
        !v.fifo_problem) {
      v.fifo_problem = fmt::format("{} (asked {}) got a seat while {} (asked {}) was still waiting", u->name,
                                   ordinal(u->arrival_rank), latest->name, ordinal(latest->arrival_rank));
    }
    if (ended(u->phase) && (latest == nullptr || wait_end(u) > wait_end(latest))) latest = u;
  }
  if (v.fifo_problem) out.push_back("FIFO: " + *v.fifo_problem);

  // F1, counted where it is exact: at the model. The model runs behind the
  // gateways: an answer is in flight there from its request to its last
  // byte, inside the time its seat is held (the gateway asks the model after
  // the grant and releases after relaying the last byte), so more than
  // `seats` in flight there means more than `seats` seats granted, and the
  // model's own ceiling also answers 429. The clients cannot count it
  // themselves: the demo reads every stream on one thread, so one user's
  // [DONE] can be read after the next user's first chunk although it was
  // written before the seat was given back (that count, with a 20 ms
  // tolerance, failed on a loaded machine with the cap held).
  if (facts.model_peak_in_flight > facts.seats)
    out.push_back(fmt::format("the model had {} answers in flight with {} seats", facts.model_peak_in_flight,
                              facts.seats));
  if (facts.model_rejected_429 > 0)
    out.push_back(fmt::format("the model refused {} requests (429): the gateway let too many through",
                              facts.model_rejected_429));
  v.under_cap = facts.model_peak_in_flight <= facts.seats && facts.model_rejected_429 == 0;
  if (facts.model_completed != v.granted)
    out.push_back(fmt::format("the model completed {} answers, the users received {}", facts.model_completed,
                              v.granted));

  v.limiter_empty = facts.final_in_use == 0 && facts.final_queued == 0;
  if (!v.limiter_empty) {
    out.push_back(facts.final_in_use ? fmt::format("at the end the limiter still had {} in use and {} queued",
                                                   *facts.final_in_use, facts.final_queued.value_or(-1))
                                     : std::string("could not read the limiter's state at the end"));
  }
  if (facts.arrivals != users.size())
    out.push_back(fmt::format("only {} of {} users asked", facts.arrivals, users.size()));
  return v;
}

}  // namespace fairgate::cli::demo
