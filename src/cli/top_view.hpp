// cli/top_view.hpp — what `fairgate top` shows, apart from where it comes
// from: the server's JSON (GET /v1/limiters, /v1/limiters/{name}, the
// "snapshot" events of /v1/events) parsed into rows, per-second rates from
// the counters, and the screen drawn as plain lines of a given size.
// Pure (no I/O, time is a parameter), so the unit tests check it directly.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fairgate::cli::top {

/// A limiter's counters since its instance started (the "stats" object).
struct Counters {
  std::int64_t grants = 0;
  std::int64_t timeouts = 0;
  std::int64_t rejections = 0;
};

/// Per-second rates of the counters; unset until two samples far enough apart.
struct Rates {
  double grants = 0;
  double timeouts = 0;
  double rejections = 0;
};

/// One limiter, as GET /v1/limiters lists it.
struct LimiterRow {
  std::string name;
  std::int64_t in_use = 0;
  std::int64_t max_concurrent = 0;
  std::int64_t queued = 0;
  std::optional<std::int64_t> estimated_wait_ms;
  bool enabled = true;
  bool degraded = false;
  std::int64_t fence_left_ms = 0;     ///< Redis: grants held back after a data loss
  bool shadow = false;                ///< shadow mode: everything let through (docs/shadow.md)
  std::int64_t shadow_in_flight = 0;  ///< shadow mode: requests let through still running
  Counters counters;
  std::optional<Rates> rates;
};

struct Holder {
  std::string id;
  std::string tenant;
  std::int64_t held_ms = 0;
};

struct Waiter {
  std::string id;
  std::string tenant;
  std::int64_t position = 0;
  std::int64_t waited_ms = 0;
};

/// One limiter's holders and queue (GET /v1/limiters/{name}).
struct Detail {
  std::string name;
  std::vector<Holder> holders;  ///< the page the server listed (every instance's on Redis)
  std::vector<Waiter> queue;
  std::int64_t holders_total = 0;  ///< all holders (holders_total; the list size from older servers)
  std::int64_t queue_total = 0;    ///< all waiters (queue_total)
};

/// Parses `{"limiters":[…]}`. On failure returns nullopt and sets `error`
/// to one line ("not JSON: …", "no \"limiters\" array").
std::optional<std::vector<LimiterRow>> parse_limiters(std::string_view json, std::string& error);

/// Parses one limiter's detail object (holders and queue).
std::optional<Detail> parse_detail(std::string_view json, std::string& error);

/// Per-second rates over a sliding window of recent samples, per limiter.
class RateTracker {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RateTracker(Clock::duration window = std::chrono::seconds(5)) : window_(window) {}

  /// Records the rows' counters seen at `now` and fills each row's rates
  /// (left unset while its samples span less than half a second). A counter
  /// that went down (the instance restarted) restarts that limiter's window.
  void observe(std::vector<LimiterRow>& rows, Clock::time_point now);

 private:
  struct Sample {
    Clock::time_point at;
    Counters counters;
  };
  Clock::duration window_;
  std::map<std::string, std::deque<Sample>, std::less<>> samples_;
};

enum class SortKey { name, in_use, queued, wait };

/// "name", "in_use", "queued", "wait".
std::string_view to_string(SortKey key) noexcept;
std::optional<SortKey> parse_sort_key(std::string_view text) noexcept;
/// The next key in the order the `s` key cycles through.
SortKey next(SortKey key) noexcept;

/// Sorts by `key`: name ascending; the others descending, ties by name.
void sort_rows(std::vector<LimiterRow>& rows, SortKey key);

/// Everything one screen shows.
struct Screen {
  std::string url;
  std::string status;            ///< "live", "connecting…", "disconnected: …"
  std::string clock;             ///< wall-clock time of the data, "14:20:01"
  std::vector<LimiterRow> rows;  ///< sorted
  SortKey sort = SortKey::name;
  std::string selected;  ///< the limiter whose detail is shown
  std::optional<Detail> detail;
  bool interactive = true;  ///< show the key help line
};

/// The screen as at most `height` lines of at most `width` characters
/// (ASCII only, so characters are columns). Lists that do not fit end in a
/// "... N more" line. `width` is at least 40 and `height` at least 10 in effect.
std::vector<std::string> render(const Screen& screen, std::size_t width, std::size_t height);

/// "0.4s", "42s", "12m03s", "2h05m".
std::string duration_text(std::int64_t ms);

}  // namespace fairgate::cli::top
