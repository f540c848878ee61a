// cli/demo/render.hpp — the text `fairgate demo` prints: the header, one line
// of the live timeline, the progress bar and the summary at the end. Pure: no
// I/O, no clock (callers pass the times and print the text); every time is
// shown at story scale (real time times --speed). Unit-tested in
// tests/unit/demo_render_test.cpp.
#pragma once

#include "cli/demo/checks.hpp"
#include "cli/style.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fairgate::cli::demo {

/// Above this many users the timeline leaves out position changes and
/// streaming progress, and the summary leaves out the per-user table.
inline constexpr std::size_t kDetailLimit = 30;

/// The limiter and the model run in real time; the story is shown at --speed scale.
struct Scale {
  double speed = 1.0;         ///< story seconds per real second
  Clock::time_point start{};  ///< the story's t = 0

  double story_seconds(Clock::duration real) const {
    return std::chrono::duration<double>(real).count() * speed;
  }
  Clock::duration real_duration(double story_s) const {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(story_s / speed));
  }
  long long story_ms(Clock::duration real) const;
};

/// "1.50s": a story time in seconds.
std::string seconds_text(double s);

/// "-" when empty, "1.00s" when all equal at that precision, else
/// "lo .. hi (median m)" (the median: the upper one of an even count).
std::string wait_range(std::vector<double> seconds);

/// The first 20 names, then " ... (N more)"; "(none)" when empty.
std::string names(const std::vector<const Seen*>& list);

/// "[#####---------------]": `done` of `total` on 20 cells.
std::string bar(const Style& style, std::uint32_t done, std::uint32_t total);

/// One timeline line: "  1.234s  user-03  text\n" (the name in the user's color).
std::string timeline_line(const Style& style, double story_s, std::size_t number, const std::string& name,
                          std::string_view text);

/// What the header says about the run.
struct Header {
  std::uint32_t users = 0, seats = 0, tokens = 0, tokens_per_second = 0;
  std::chrono::milliseconds max_wait{0};
  std::uint64_t seed = 0;
  double speed = 1.0;
  bool quiet = false, detail = false;
  std::string redis;  ///< the Redis URL, redacted; empty: the memory backend in this process
  std::string model_url;
  std::string limiter;                    ///< the limiter's name
  std::vector<std::string> gateway_urls;  ///< A, B
  std::vector<int> gateway_pids;          ///< A, B (--redis only)
};

std::string header_text(const Style& style, const Header& h);

/// One row of the per-user table: a user that asked, and the gateway it asked.
struct Row {
  const Seen* seen = nullptr;
  std::string via;  ///< "A" or "B"
};

/// One gateway front end as the summary shows it.
struct Front {
  std::string url;
  std::size_t users = 0;  ///< users that asked through it
};

/// Everything the summary shows.
struct Summary {
  Scale scale;
  bool table = false;                    ///< the per-user table (at most kDetailLimit users)
  std::vector<const Seen*> users;        ///< every user of the run
  std::vector<Row> by_arrival;           ///< those that asked, in the order they asked
  std::vector<const Seen*> by_seat;      ///< the order the first answer chunks arrived
  std::vector<Front> fronts;             ///< A, B
  std::optional<Clock::duration> total;  ///< start to the last end (real time), when all ended
  Facts facts;
  std::uint64_t model_requests = 0;
  Verdict verdict;
  std::vector<std::string> violations;  ///< the verdict's and the run's own (watchdog)
};

/// The waits of the users that ended in `phase` (done or busy), in story seconds.
std::vector<double> waits(const Summary& s, Phase phase);

/// Every request ended exactly once, and every served one got all its tokens.
bool ended_once_each(const std::vector<const Seen*>& users);

/// The whole summary, from the blank line before "Summary" to the verdict.
std::string summary_text(const Style& style, const Summary& s);

}  // namespace fairgate::cli::demo
