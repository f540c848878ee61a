// cli/top_view.cpp — see top_view.hpp.
#include "cli/top_view.hpp"

#include "cli/sse.hpp"

#include <fmt/format.h>
#include <boost/json.hpp>

#include <algorithm>
#include <utility>

namespace fairgate::cli::top {
namespace {

namespace json = boost::json;

std::optional<json::object> parse_object(std::string_view text, std::string& error) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec) {
    error = "not JSON: " + ec.message();
    return std::nullopt;
  }
  if (!v.is_object()) {
    error = "not a JSON object";
    return std::nullopt;
  }
  return std::move(v.as_object());
}

bool bool_field(const json::object& o, std::string_view key, bool fallback) {
  const auto* v = o.if_contains(key);
  return v != nullptr && v->is_bool() ? v->as_bool() : fallback;
}

/// An id the server gives as a number or a string.
std::string id_field(const json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  if (v == nullptr) return "?";
  if (v->is_string()) return std::string(v->as_string());
  if (v->is_number()) return json::serialize(*v);
  return "?";
}

std::optional<LimiterRow> parse_row(const json::object& o) {
  LimiterRow r;
  r.name = string_field(o, "name");
  if (r.name.empty()) return std::nullopt;
  r.in_use = int_field(o, "in_use").value_or(0);
  r.max_concurrent = int_field(o, "max_concurrent").value_or(0);
  r.queued = int_field(o, "queued").value_or(0);
  r.estimated_wait_ms = int_field(o, "estimated_wait_ms");
  r.enabled = bool_field(o, "enabled", true);
  r.degraded = bool_field(o, "degraded", false);
  r.fence_left_ms = int_field(o, "fence_left_ms").value_or(0);
  r.shadow = string_field(o, "mode") == "shadow";
  if (const auto* s = o.if_contains("shadow"); s != nullptr && s->is_object())
    r.shadow_in_flight = int_field(s->as_object(), "in_flight").value_or(0);
  if (const auto* s = o.if_contains("stats"); s != nullptr && s->is_object()) {
    r.counters.grants = int_field(s->as_object(), "grants").value_or(0);
    r.counters.timeouts = int_field(s->as_object(), "timeouts").value_or(0);
    r.counters.rejections = int_field(s->as_object(), "rejections").value_or(0);
  }
  return r;
}

/// `line` with every byte that is not printable ASCII (a tab, an escape, a
/// byte of a UTF-8 name) as '?': one byte, one column, nothing a server sent
/// moves the cursor.
std::string printable_ascii(std::string line) {
  for (char& c : line)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  return line;
}

/// `s` cut or padded to exactly `n` characters (left-aligned).
std::string cell(std::string_view s, std::size_t n) {
  std::string out(s.substr(0, n));
  out.resize(n, ' ');
  return out;
}

std::string fit(std::string line, std::size_t width) {
  if (line.size() > width) line.resize(width);
  return line;
}

std::string rate_text(const std::optional<Rates>& rates, double Rates::*field) {
  if (!rates) return "-";
  return fmt::format("{:.1f}", (*rates).*field);
}

std::string state_text(const LimiterRow& r) {
  if (!r.enabled) return "disabled";
  if (r.fence_left_ms > 0) return "fenced " + duration_text(r.fence_left_ms);
  if (r.degraded) return "degraded";
  if (r.shadow) return fmt::format("shadow {} run", r.shadow_in_flight);
  return "ok";
}

}  // namespace

std::optional<std::vector<LimiterRow>> parse_limiters(std::string_view text, std::string& error) {
  const auto o = parse_object(text, error);
  if (!o) return std::nullopt;
  const auto* list = o->if_contains("limiters");
  if (list == nullptr || !list->is_array()) {
    error = "no \"limiters\" array";
    return std::nullopt;
  }
  std::vector<LimiterRow> rows;
  for (const auto& v : list->as_array()) {
    if (!v.is_object()) continue;
    if (auto r = parse_row(v.as_object())) rows.push_back(std::move(*r));
  }
  return rows;
}

std::optional<Detail> parse_detail(std::string_view text, std::string& error) {
  const auto o = parse_object(text, error);
  if (!o) return std::nullopt;
  Detail d;
  d.name = string_field(*o, "name");
  const auto* holders = o->if_contains("holders");
  const auto* queue = o->if_contains("queue");
  if (d.name.empty() || holders == nullptr || !holders->is_array() || queue == nullptr ||
      !queue->is_array()) {
    error = "not a limiter with holders and queue";
    return std::nullopt;
  }
  for (const auto& v : holders->as_array()) {
    if (!v.is_object()) continue;
    const auto& h = v.as_object();
    d.holders.push_back(
        {id_field(h, "permit"), string_field(h, "tenant"), int_field(h, "held_ms").value_or(0)});
  }
  for (const auto& v : queue->as_array()) {
    if (!v.is_object()) continue;
    const auto& w = v.as_object();
    d.queue.push_back({id_field(w, "ticket"), string_field(w, "tenant"), int_field(w, "position").value_or(0),
                       int_field(w, "waited_ms").value_or(0)});
  }
  d.holders_total = int_field(*o, "holders_total").value_or(static_cast<std::int64_t>(d.holders.size()));
  d.queue_total = int_field(*o, "queue_total").value_or(static_cast<std::int64_t>(d.queue.size()));
  std::sort(d.holders.begin(), d.holders.end(),
            [](const Holder& a, const Holder& b) { return a.held_ms > b.held_ms; });
  std::sort(d.queue.begin(), d.queue.end(),
            [](const Waiter& a, const Waiter& b) { return a.position < b.position; });
  return d;
}

void RateTracker::observe(std::vector<LimiterRow>& rows, Clock::time_point now) {
  for (auto& r : rows) {
    auto& samples = samples_[r.name];
    if (!samples.empty()) {
      const Counters& last = samples.back().counters;
      if (r.counters.grants < last.grants || r.counters.timeouts < last.timeouts ||
          r.counters.rejections < last.rejections)
        samples.clear();  // the counters restarted
    }
    samples.push_back({now, r.counters});
    while (samples.size() > 2 && now - samples[1].at >= window_) samples.pop_front();
    const Sample& first = samples.front();
    const double span = std::chrono::duration<double>(now - first.at).count();
    if (span < 0.5) {
      r.rates.reset();
      continue;
    }
    r.rates = Rates{static_cast<double>(r.counters.grants - first.counters.grants) / span,
                    static_cast<double>(r.counters.timeouts - first.counters.timeouts) / span,
                    static_cast<double>(r.counters.rejections - first.counters.rejections) / span};
  }
}

std::string_view to_string(SortKey key) noexcept {
  switch (key) {
    case SortKey::name: return "name";
    case SortKey::in_use: return "in_use";
    case SortKey::queued: return "queued";
    case SortKey::wait: return "wait";
  }
  return "name";
}

std::optional<SortKey> parse_sort_key(std::string_view text) noexcept {
  for (const SortKey k : {SortKey::name, SortKey::in_use, SortKey::queued, SortKey::wait})
    if (text == to_string(k)) return k;
  return std::nullopt;
}

SortKey next(SortKey key) noexcept {
  switch (key) {
    case SortKey::name: return SortKey::in_use;
    case SortKey::in_use: return SortKey::queued;
    case SortKey::queued: return SortKey::wait;
    case SortKey::wait: return SortKey::name;
  }
  return SortKey::name;
}

void sort_rows(std::vector<LimiterRow>& rows, SortKey key) {
  const auto value = [key](const LimiterRow& r) -> std::int64_t {
    switch (key) {
      case SortKey::in_use: return r.in_use;
      case SortKey::queued: return r.queued;
      case SortKey::wait: return r.estimated_wait_ms.value_or(-1);
      case SortKey::name: return 0;
    }
    return 0;
  };
  std::stable_sort(rows.begin(), rows.end(), [&](const LimiterRow& a, const LimiterRow& b) {
    const auto va = value(a), vb = value(b);
    if (va != vb) return va > vb;
    return a.name < b.name;
  });
}

std::string duration_text(std::int64_t ms) {
  if (ms < 0) ms = 0;
  if (ms < 10'000) return fmt::format("{:.1f}s", static_cast<double>(ms) / 1000.0);
  const std::int64_t s = ms / 1000;
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
}

std::vector<std::string> render(const Screen& sc, std::size_t width, std::size_t height) {
  if (width < 40 || height < 10) {
    // Drawn at 40x10 it would wrap and scroll: one line that says so, cut to the width.
    if (width == 0 || height == 0) return {};
    return {fit(fmt::format("terminal {}x{}: fairgate top needs 40x10", width, height), width)};
  }
  std::vector<std::string> out;
  const auto add = [&](std::string line) {
    if (out.size() < height) out.push_back(fit(printable_ascii(std::move(line)), width));
  };

  add(fmt::format("fairgate top - {} - {}{}", sc.url, sc.status, sc.clock.empty() ? "" : " - " + sc.clock));
  if (sc.interactive) {
    add(fmt::format("q quit  s sort ({})  up/down or j/k pick a limiter", to_string(sc.sort)));
  } else {
    add(fmt::format("sorted by {}", to_string(sc.sort)));
  }
  add("");

  // The limiters: the name takes what the fixed columns leave, STATE 13 ("shadow 12 run",
  // "fenced 10s") at 80 columns; a longer one may run past the edge.
  constexpr std::size_t kFixed = 2 + 9 + 7 + 9 + 8 + 8 + 7 + 2 + 13;
  const std::size_t name_w = std::clamp<std::size_t>(width > kFixed ? width - kFixed : 8, 8, 32);
  add(fmt::format("  {}{:>9}{:>7}{:>9}{:>8}{:>8}{:>7}  {}", cell("LIMITER", name_w), "IN USE", "QUEUED",
                  "EST.WAIT", "GRANT/s", "TMOUT/s", "REJ/s", "STATE"));
  // Leave room for the detail: the limiter list takes at most half the rest.
  const std::size_t room = height > out.size() + 1 ? height - out.size() - 1 : 1;
  const std::size_t max_rows = sc.detail ? std::max<std::size_t>(1, room / 2) : room;
  if (sc.rows.empty()) add("  (no limiters)");
  for (std::size_t i = 0; i < sc.rows.size(); ++i) {
    if (i + 1 == max_rows && sc.rows.size() > max_rows) {
      add(fmt::format("  ... {} more limiters", sc.rows.size() - i));
      break;
    }
    const LimiterRow& r = sc.rows[i];
    add(fmt::format("{} {}{:>9}{:>7}{:>9}{:>8}{:>8}{:>7}  {}", r.name == sc.selected ? '>' : ' ',
                    cell(r.name, name_w), fmt::format("{}/{}", r.in_use, r.max_concurrent), r.queued,
                    r.estimated_wait_ms ? duration_text(*r.estimated_wait_ms) : "-",
                    rate_text(r.rates, &Rates::grants), rate_text(r.rates, &Rates::timeouts),
                    rate_text(r.rates, &Rates::rejections), state_text(r)));
  }
  if (!sc.detail) return out;

  const Detail& d = *sc.detail;
  add("");
  // Totals: the lists are the first page (every instance's on Redis).
  std::string summary =
      fmt::format("{}: {} holding", d.name, std::max<std::int64_t>(d.holders_total, std::ssize(d.holders)));
  if (!d.holders.empty()) summary += ", longest " + duration_text(d.holders.front().held_ms);
  summary += fmt::format("; {} waiting", std::max<std::int64_t>(d.queue_total, std::ssize(d.queue)));
  if (!d.queue.empty()) {
    const auto oldest =
        std::max_element(d.queue.begin(), d.queue.end(),
                         [](const Waiter& a, const Waiter& b) { return a.waited_ms < b.waited_ms; });
    summary += ", longest " + duration_text(oldest->waited_ms);
  }
  add(summary);

  const auto holder_line = [](const Holder& h, std::size_t w) {
    const std::size_t id_w = (w - 8) / 2, tenant_w = w - 8 - id_w;
    return cell(h.id, id_w) + cell(h.tenant.empty() ? "-" : h.tenant, tenant_w) +
           fmt::format("{:>8}", duration_text(h.held_ms));
  };
  const auto waiter_line = [](const Waiter& q, std::size_t w) {
    const std::size_t id_w = (w - 14) / 2, tenant_w = w - 14 - id_w;
    return fmt::format("{:>5} ", q.position) + cell(q.id, id_w) +
           cell(q.tenant.empty() ? "-" : q.tenant, tenant_w) +
           fmt::format("{:>8}", duration_text(q.waited_ms));
  };
  const std::size_t left = height > out.size() + 1 ? height - out.size() - 1 : 0;  // rows under the headers
  if (width >= 70) {
    // Side by side: holders on the left, the queue on the right.
    const std::size_t lw = (width - 2) / 2, rw = width - 2 - lw;
    const std::size_t hid_w = (lw - 2 - 8) / 2, qid_w = (rw - 14) / 2;
    add("  " + cell("HOLDER", hid_w) + cell("TENANT", lw - 2 - 8 - hid_w) + fmt::format("{:>8}", "HELD") +
        "  " + fmt::format("{:>5} ", "POS") + cell("WAITER", qid_w) + cell("TENANT", rw - 14 - qid_w) +
        fmt::format("{:>8}", "WAITED"));
    const std::size_t n = std::max(d.holders.size(), d.queue.size());
    const auto more = [](std::int64_t total, std::size_t listed, std::size_t i) {
      return fmt::format("... {} more", std::max<std::int64_t>(total, static_cast<std::int64_t>(listed)) -
                                            static_cast<std::int64_t>(i));
    };
    bool cut = false;
    for (std::size_t i = 0; i < n; ++i) {
      const bool last_row = i + 1 == left && i + 1 < n;
      std::string l, r;
      if (i < d.holders.size())
        l = last_row ? more(d.holders_total, d.holders.size(), i) : holder_line(d.holders[i], lw - 2);
      if (i < d.queue.size())
        r = last_row ? more(d.queue_total, d.queue.size(), i) : waiter_line(d.queue[i], rw);
      add("  " + cell(l, lw - 2) + "  " + r);
      if (last_row) {
        cut = true;
        break;
      }
    }
    // Every listed row shown, but the server listed only its first page: the rest counted.
    if (!cut) {
      const auto rest = [&](std::int64_t total, std::size_t listed) {
        return total > static_cast<std::int64_t>(listed) ? more(total, listed, listed) : std::string();
      };
      const std::string l = rest(d.holders_total, d.holders.size()), r = rest(d.queue_total, d.queue.size());
      if (!l.empty() || !r.empty()) add("  " + cell(l, lw - 2) + "  " + r);
    }
    return out;
  }
  // Narrow: the holders, then the queue.
  const std::size_t w = width - 2;
  const auto list = [&](auto& items, std::int64_t total, auto& line, std::size_t budget) {
    const std::int64_t all = std::max<std::int64_t>(total, static_cast<std::int64_t>(items.size()));
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i + 1 == budget && i + 1 < items.size()) {
        add(fmt::format("  ... {} more", all - static_cast<std::int64_t>(i)));
        return;
      }
      add("  " + line(items[i], w));
    }
    if (all > static_cast<std::int64_t>(items.size()))
      add(fmt::format("  ... {} more", all - static_cast<std::int64_t>(items.size())));
  };
  add("  HOLDERS");
  list(d.holders, d.holders_total, holder_line, std::max<std::size_t>(1, left / 2));
  add("  QUEUE");
  list(d.queue, d.queue_total, waiter_line,
       std::max<std::size_t>(1, height > out.size() ? height - out.size() : 1));
  return out;
}

}  // namespace fairgate::cli::top
