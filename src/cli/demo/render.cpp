// cli/demo/render.cpp — the text `fairgate demo` prints (see render.hpp).
#include "cli/demo/render.hpp"

#include "cli/duration.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string_view>

namespace fairgate::cli::demo {
namespace {

/// The per-user table, in arrival order, and the blank line after it.
std::string summary_table(const Style& style, const Summary& s) {
  std::string out = style.dim("  asked  user      via  outcome   waited   tokens   held");
  out += "\n";
  for (const Row& row : s.by_arrival) {
    const Seen& u = *row.seen;
    std::string outcome = "waiting?", tokens = "-", held = "-";
    switch (u.phase) {
      case Phase::done:
        outcome = style.green("seat   ");
        tokens = fmt::format("{}", u.streamed);
        held = seconds_text(s.scale.story_seconds(u.ended_at - u.seated_at));
        break;
      case Phase::busy: outcome = style.red("busy   "); break;
      case Phase::other: outcome = style.red("error  "); break;
      default: break;
    }
    out += fmt::format("  {:>5}  {:<8}  {:>3}  {}   {:>6}   {:>6}   {}\n", ordinal(u.arrival_rank), u.name,
                       row.via, outcome, seconds_text(s.scale.story_seconds(u.waited())), tokens, held);
  }
  out += "\n";
  return out;
}

/// The figures: users, time, gateways, orders, FIFO, cap, waits, ends, model, limiter.
std::string summary_figures(const Style& style, const Summary& s) {
  const Verdict& v = s.verdict;
  const Facts& f = s.facts;
  const auto yes_no = [&](bool ok) { return ok ? style.green("yes") : style.red("NO"); };
  std::vector<const Seen*> by_arrival;
  for (const Row& row : s.by_arrival) by_arrival.push_back(row.seen);
  std::string out;
  out += fmt::format("  users:             {} arrived, {} got a seat, {} busy{}\n", f.arrivals, v.granted,
                     v.busy, v.other > 0 ? fmt::format(", {} other", v.other) : "");
  if (s.total) out += fmt::format("  total time:        {}\n", seconds_text(s.scale.story_seconds(*s.total)));
  out += fmt::format("  gateways:          A {} asked by {}, B {} asked by {}\n", s.fronts.at(0).url,
                     s.fronts.at(0).users, s.fronts.at(1).url, s.fronts.at(1).users);
  out += fmt::format("  arrival order:     {}\n", names(by_arrival));
  out += fmt::format("  service order:     {}\n", names(s.by_seat));
  out += fmt::format("  FIFO held:         {} \u2014 {}\n", yes_no(!v.fifo_problem),
                     v.fifo_problem ? *v.fifo_problem : "every seat went to the user waiting longest");
  out += fmt::format(
      "  max concurrent:    {} of {} seats (answers in flight at the model, {} refused) \u2014 {}\n",
      f.model_peak_in_flight, f.seats, f.model_rejected_429,
      v.under_cap ? "never above the cap" : style.red("ABOVE THE CAP"));
  out += fmt::format("  waited for a seat: {}\n", wait_range(waits(s, Phase::done)));
  if (const auto busy = waits(s, Phase::busy); !busy.empty())
    out += fmt::format("  told busy after:   {}\n", wait_range(busy));
  out += fmt::format("  ended once each:   {}\n", yes_no(ended_once_each(s.users)));
  out += fmt::format("  model:             {} requests, {} answers completed, {} refused (429)\n",
                     s.model_requests, f.model_completed, f.model_rejected_429);
  out += fmt::format("  limiter at end:    in use {}, queued {} \u2014 {}\n",
                     f.final_in_use ? fmt::format("{}", *f.final_in_use) : "?",
                     f.final_queued ? fmt::format("{}", *f.final_queued) : "?",
                     v.limiter_empty ? "every seat given back" : style.red("NOT EMPTY"));
  out += "\n";
  return out;
}

/// "All invariants held: ..." or "INVARIANTS VIOLATED:" and the list.
std::string summary_verdict(const Style& style, const Summary& s) {
  std::string out;
  if (s.violations.empty()) {
    out += style.green("All invariants held");
    out += fmt::format(
        ": at most {} of {} seats in use, seats in arrival order, max wait kept, "
        "every request ended exactly once.\n",
        s.facts.model_peak_in_flight, s.facts.seats);
    return out;
  }
  out += style.red("INVARIANTS VIOLATED");
  out += ":\n";
  for (const auto& v : s.violations) {
    out += "  - ";
    out += v;
    out += "\n";
  }
  return out;
}

}  // namespace

long long Scale::story_ms(Clock::duration real) const { return std::llround(story_seconds(real) * 1000.0); }

std::string seconds_text(double s) { return fmt::format("{:.2f}s", s); }

std::string wait_range(std::vector<double> v) {
  if (v.empty()) return std::string("-");
  std::sort(v.begin(), v.end());
  if (seconds_text(v.front()) == seconds_text(v.back())) return seconds_text(v.front());
  return fmt::format("{} .. {} (median {})", seconds_text(v.front()), seconds_text(v.back()),
                     seconds_text(v[v.size() / 2]));
}

std::string names(const std::vector<const Seen*>& list) {
  constexpr std::size_t kShown = 20;
  std::string out;
  for (std::size_t i = 0; i < list.size() && i < kShown; ++i) {
    if (i > 0) out += ' ';
    out += list[i]->name;
  }
  if (list.size() > kShown) out += fmt::format(" ... ({} more)", list.size() - kShown);
  if (list.empty()) out = "(none)";
  return out;
}

std::string bar(const Style& style, std::uint32_t done, std::uint32_t total) {
  constexpr std::uint32_t kWidth = 20;
  const std::uint32_t filled = total == 0 ? kWidth : std::min(done, total) * kWidth / total;
  std::string out = "[";
  out += style.cyan(std::string(filled, '#'));
  out += std::string(kWidth - filled, '-');
  out += ']';
  return out;
}

std::string timeline_line(const Style& style, double story_s, std::size_t number, const std::string& name,
                          std::string_view text) {
  const std::string stamp = fmt::format("{:8.3f}s", story_s);
  return fmt::format("{}  {}  {}\n", style.dim(stamp), style.pick(number - 1, name), text);
}

std::string header_text(const Style& style, const Header& h) {
  const std::string where =
      h.redis.empty() ? std::string("memory backend, one process") : fmt::format("Redis {}", h.redis);
  std::string out =
      fmt::format("{} \u2014 {} users, {} seats, max wait {}  ({}, seed {})\n", style.bold("fairgate demo"),
                  h.users, h.seats, format_duration(h.max_wait), where, h.seed);
  out += fmt::format("A mock model ({}) streams answers and refuses more than {} at once.\n", h.model_url,
                     h.seats);
  if (h.redis.empty()) {
    out += fmt::format(
        "In front of it, two gateways in this process, A ({}) and B ({}),\n"
        "share one limiter \"{}\" of {} seats; users ask A and B in turn.\n",
        h.gateway_urls.at(0), h.gateway_urls.at(1), h.limiter, h.seats);
  } else {
    out += fmt::format(
        "In front of it, two `fairgate serve` processes, A ({}, pid {})\n"
        "and B ({}, pid {}), share one limiter \"{}\" of {} seats through Redis;\n"
        "users ask A and B in turn.\n",
        h.gateway_urls.at(0), h.gateway_pids.at(0), h.gateway_urls.at(1), h.gateway_pids.at(1), h.limiter,
        h.seats);
  }
  out += fmt::format(
      "Each user asks a question at about the same moment; each answer streams {}-{} tokens\n"
      "at {} tokens/s. Only {} answer{} may stream at once: the others wait in one fair FIFO\n"
      "queue, and whoever still waits after {} is told the system is busy.\n",
      h.tokens, 2 * h.tokens, h.tokens_per_second, h.seats, h.seats == 1 ? "" : "s",
      format_duration(h.max_wait));
  if (h.speed != 1.0)
    out += fmt::format("Running {}x faster; all times are shown at story scale.\n", h.speed);
  if (!h.quiet && !h.detail) {
    out +=
        fmt::format("More than {} users: queue moves and streaming progress are not shown.\n", kDetailLimit);
  }
  out += "\n";
  return out;
}

std::vector<double> waits(const Summary& s, Phase phase) {
  std::vector<double> out;
  for (const Seen* u : s.users) {
    if (u->phase == phase) out.push_back(s.scale.story_seconds(u->waited()));
  }
  return out;
}

bool ended_once_each(const std::vector<const Seen*>& users) {
  return std::all_of(users.begin(), users.end(), [](const Seen* u) {
    return u->ends == 1 && (u->phase != Phase::done || u->streamed == u->tokens);
  });
}

std::string summary_text(const Style& style, const Summary& s) {
  std::string out = "\n";
  out += style.bold("Summary");
  out += "\n";
  if (s.table) out += summary_table(style, s);
  out += summary_figures(style, s);
  out += summary_verdict(style, s);
  return out;
}

}  // namespace fairgate::cli::demo
