// cli/top.cpp — `fairgate top`: a live terminal view of a `fairgate serve`
// instance (docs/top.md). It follows GET /v1/events (the limiters' counts,
// pushed every [server] events_interval_ms) and polls GET /v1/limiters/{name}
// once a second for the picked limiter's holders and queue; top_view.cpp
// draws the screen. Plain ANSI (alternate screen, cursor home, clear to end
// of line), so it works over any SSH terminal; `--once` prints one snapshot
// as text for scripts.
#include "cli/command.hpp"
#include "cli/sse.hpp"
#include "cli/top_view.hpp"
#include "http/client.hpp"
#include "serve/config.hpp"

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace fairgate::cli {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;
using namespace std::chrono_literals;
constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

/// A bound on one HTTP exchange, and on the silence of the event stream
/// (the server sends a snapshot every events_interval_ms, 1 s by default).
constexpr auto kRequestTimeout = 5s;
constexpr auto kEventSilence = 15s;
constexpr std::uint64_t kBodyLimit = 16 * 1024 * 1024;

struct TopArgs {
  std::string url = "http://127.0.0.1:8080";
  bool once = false;
  std::string limiter;
  std::string sort = "name";
};

/// Where the server is: "http://HOST[:PORT][/]".
struct Target {
  std::string host;
  std::string port;
  std::string url;  ///< as shown
};

/// The shared http:// URL rules (serve::parse_upstream, as for gateway upstreams), without a path.
Target parse_target(std::string_view url) {
  serve::RouteConfig parsed;
  try {
    serve::parse_upstream(url, "--url", parsed);
  } catch (const serve::ConfigError& e) {
    throw UsageError(e.what());
  }
  if (parsed.upstream_tls)  // the gateway's rules allow https://; top speaks plain HTTP only
    throw UsageError(fmt::format("--url: \"{}\": fairgate top speaks plain http:// only (docs/top.md)", url));
  if (!parsed.upstream_base.empty())
    throw UsageError(fmt::format("--url: \"{}\" must be http://HOST[:PORT] (no path)", url));
  const bool v6 = parsed.upstream_host.find(':') != std::string::npos;
  const std::string host = v6 ? "[" + parsed.upstream_host + "]" : parsed.upstream_host;
  const std::string authority = fmt::format("{}:{}", host, parsed.upstream_port);
  return Target{parsed.upstream_host, std::to_string(parsed.upstream_port), "http://" + authority};
}

using HttpResult = fairgate::http::Fetched;

/// Connects to the target within kRequestTimeout.
asio::awaitable<std::string> connect(beast::tcp_stream& stream, const Target& t) {
  return fairgate::http::connect(stream, t.host, t.port, kRequestTimeout, t.url);
}

fairgate::http::Request get_request(const Target& t, std::string target, bool events) {
  fairgate::http::Request req{http::verb::get, std::move(target), 11};
  req.set(http::field::host, t.host);
  req.set(http::field::user_agent, "fairgate-top");
  req.set(http::field::accept, events ? "text/event-stream" : "application/json");
  return req;
}

/// One GET on a new connection.
asio::awaitable<HttpResult> http_get(const Target& t, std::string target) {
  beast::tcp_stream stream(co_await asio::this_coro::executor);
  if (auto error = co_await connect(stream, t); !error.empty()) co_return HttpResult{0, {}, std::move(error)};
  auto req = get_request(t, std::move(target), false);
  req.keep_alive(false);
  HttpResult out = co_await fairgate::http::fetch(stream, req, kBodyLimit, kRequestTimeout);
  if (!out.error.empty()) out.error = fmt::format("{}: {}", t.url, out.error);
  co_return out;
}

std::string path_segment(std::string_view name) {
  std::string out;
  for (const unsigned char c : name) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~')
      out += static_cast<char>(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

std::string wall_clock() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::array<char, 16> buf{};
  std::strftime(buf.data(), buf.size(), "%H:%M:%S", &tm);
  return buf.data();
}

/// One snapshot as text (`--once`): the limiters, then the picked limiter's holders and queue.
int run_once(const Target& target, top::SortKey sort, const std::string& limiter) {
  asio::io_context io(1);
  std::string text, problem;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        const auto list = co_await http_get(target, "/v1/limiters");
        if (!list.error.empty()) {
          problem = list.error;
          co_return;
        }
        if (list.status != 200) {
          problem = fmt::format("GET {}/v1/limiters answered {}", target.url, list.status);
          co_return;
        }
        std::string error;
        auto rows = top::parse_limiters(list.body, error);
        if (!rows) {
          problem = fmt::format("GET {}/v1/limiters: {}", target.url, error);
          co_return;
        }
        top::Screen sc;
        sc.url = target.url;
        sc.status = "snapshot";
        sc.clock = wall_clock();
        sc.interactive = false;
        sc.sort = sort;
        sc.rows = std::move(*rows);
        top::sort_rows(sc.rows, sort);
        sc.selected = !limiter.empty() ? limiter : sc.rows.empty() ? "" : sc.rows.front().name;
        if (!sc.selected.empty()) {
          const auto detail = co_await http_get(target, "/v1/limiters/" + path_segment(sc.selected));
          if (detail.status == 404) {
            problem = fmt::format("--limiter: no limiter named \"{}\" at {}", sc.selected, target.url);
            co_return;
          }
          if (detail.error.empty() && detail.status == 200) sc.detail = top::parse_detail(detail.body, error);
        }
        for (const auto& line : top::render(sc, 100, 10'000)) text += line + "\n";
      },
      asio::detached);
  io.run();
  if (!problem.empty()) throw std::runtime_error(problem);
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
  return kExitOk;
}

/// The terminal in "keys without Enter" mode with the alternate screen, restored on destruction.
class Terminal {
 public:
  Terminal() {
    if (::tcgetattr(STDIN_FILENO, &saved_) != 0) throw std::runtime_error("cannot read the terminal's mode");
    termios raw = saved_;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);  // keep ISIG: Ctrl-C still quits
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    ::tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    write("\x1b[?1049h\x1b[?25l");
  }
  ~Terminal() {
    write("\x1b[?25h\x1b[?1049l");
    ::tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  Terminal(const Terminal&) = delete;
  Terminal& operator=(const Terminal&) = delete;

  static std::pair<std::size_t, std::size_t> size() {
    winsize ws{};
    if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0)
      return {ws.ws_col, ws.ws_row};
    return {80, 24};
  }

  static void draw(const std::vector<std::string>& lines) {
    std::string out = "\x1b[H";
    for (std::size_t i = 0; i < lines.size(); ++i) {
      out += lines[i];
      out += "\x1b[K";
      if (i + 1 < lines.size()) out += "\r\n";
    }
    out += "\x1b[J";
    write(out);
  }

 private:
  static void write(std::string_view s) {
    while (!s.empty()) {
      const ssize_t n = ::write(STDOUT_FILENO, s.data(), s.size());
      if (n <= 0) return;
      s.remove_prefix(static_cast<std::size_t>(n));
    }
  }
  termios saved_{};
};

/// The live view: event stream, detail poll, keys, and redraws.
class Live {
 public:
  Live(asio::io_context& io, Target target, top::SortKey sort, std::string limiter)
      : io_(io), target_(std::move(target)), input_(io, ::dup(STDIN_FILENO)), signals_(io) {
    screen_.url = target_.url;
    screen_.status = "connecting";
    screen_.sort = sort;
    screen_.selected = std::move(limiter);
  }

  void start() {
    signals_.add(SIGINT);
    signals_.add(SIGTERM);
    signals_.add(SIGHUP);
    signals_.add(SIGWINCH);
    wait_signal();
    asio::co_spawn(io_, follow_events(), asio::detached);
    asio::co_spawn(io_, poll_detail(), asio::detached);
    read_keys();
    draw();
  }

 private:
  void quit() {
    stopped_ = true;
    io_.stop();
  }

  void wait_signal() {
    signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      if (sig == SIGWINCH) {
        draw();
        wait_signal();
        return;
      }
      quit();
    });
  }

  void read_keys() {
    input_.async_read_some(asio::buffer(keys_), [this](const boost::system::error_code& ec, std::size_t n) {
      if (ec) return quit();  // stdin closed
      for (std::size_t i = 0; i < n; ++i) on_key(keys_[i]);
      if (!stopped_) read_keys();
    });
  }

  void on_key(char c) {
    // Arrow keys arrive as ESC [ A / ESC [ B.
    if (escape_ == 1) {
      escape_ = c == '[' ? 2 : 0;
      return;
    }
    if (escape_ == 2) {
      escape_ = 0;
      if (c == 'A') move(-1);
      if (c == 'B') move(+1);
      return;
    }
    switch (c) {
      case '\x1b': escape_ = 1; return;
      case 'q':
      case 'Q': quit(); return;
      case 's':
      case 'S':
        screen_.sort = top::next(screen_.sort);
        top::sort_rows(screen_.rows, screen_.sort);
        draw();
        return;
      case 'k': move(-1); return;
      case 'j': move(+1); return;
      default: return;
    }
  }

  void move(int step) {
    const auto& rows = screen_.rows;
    if (rows.empty()) return;
    std::size_t i = 0;
    while (i < rows.size() && rows[i].name != screen_.selected) ++i;
    if (i == rows.size())
      i = 0;
    else if (step < 0)
      i = i == 0 ? 0 : i - 1;
    else
      i = std::min(rows.size() - 1, i + 1);
    if (rows[i].name != screen_.selected) {
      screen_.selected = rows[i].name;
      screen_.detail.reset();
      detail_wake_.cancel();
    }
    draw();
  }

  void draw() {
    if (stopped_) return;
    const auto [w, h] = Terminal::size();
    Terminal::draw(top::render(screen_, w, h));
  }

  void on_rows(std::vector<top::LimiterRow> rows) {
    rates_.observe(rows, std::chrono::steady_clock::now());
    top::sort_rows(rows, screen_.sort);
    screen_.rows = std::move(rows);
    screen_.clock = wall_clock();
    screen_.status = "live";
    const auto listed = [&](const std::string& name) {
      return std::any_of(screen_.rows.begin(), screen_.rows.end(),
                         [&](const auto& r) { return r.name == name; });
    };
    if (!screen_.rows.empty() && (screen_.selected.empty() || !listed(screen_.selected))) {
      // None picked yet, or the picked one is not (or no longer) there: the first, and say so.
      if (!screen_.selected.empty())
        screen_.status = fmt::format("live - no limiter \"{}\"", screen_.selected);
      screen_.selected = screen_.rows.front().name;
      detail_wake_.cancel();
    }
    draw();
  }

  asio::awaitable<void> follow_events() {
    auto backoff = 500ms;
    while (!stopped_) {
      const std::string problem = co_await read_events();
      if (stopped_) co_return;
      screen_.status = fmt::format("disconnected, retrying: {}", problem);
      draw();
      asio::steady_timer timer(io_, backoff);
      co_await timer.async_wait(kTuple);
      backoff = std::min<std::chrono::milliseconds>(backoff * 2, 5s);
    }
  }

  /// Reads /v1/events until it fails; returns why.
  asio::awaitable<std::string> read_events() {
    beast::tcp_stream stream(io_);
    if (auto error = co_await connect(stream, target_); !error.empty()) co_return error;
    fairgate::http::StreamedResponse res;
    if (auto ec = co_await res.start(stream, get_request(target_, "/v1/events", true), kRequestTimeout))
      co_return ec.message();
    if (res.status() != 200) co_return fmt::format("/v1/events answered {}", res.status());
    SseReader reader;
    while (!res.done() && !stopped_) {
      std::string_view piece;
      const auto ec = co_await res.next(stream, kEventSilence, piece);
      std::string bad;
      reader.feed(piece, [&](const SseEvent& e) {
        if (e.name != "snapshot") return;
        std::string error;
        if (auto rows = top::parse_limiters(e.data, error))
          on_rows(std::move(*rows));
        else
          bad = error;
      });
      if (!bad.empty()) co_return "a snapshot was " + bad;
      if (reader.overflowed()) co_return "an event was too large";
      if (ec) co_return ec == beast::error::timeout ? std::string("no event for 15 s") : ec.message();
    }
    co_return std::string("the server ended the stream");
  }

  asio::awaitable<void> poll_detail() {
    while (!stopped_) {
      if (!screen_.selected.empty()) {
        const std::string name = screen_.selected;
        const auto r = co_await http_get(target_, "/v1/limiters/" + path_segment(name));
        if (stopped_) co_return;
        if (name == screen_.selected) {
          std::string error;
          if (r.error.empty() && r.status == 200)
            screen_.detail = top::parse_detail(r.body, error);
          else
            screen_.detail.reset();
          draw();
        }
      }
      detail_wake_.expires_after(1s);
      co_await detail_wake_.async_wait(kTuple);
    }
  }

  asio::io_context& io_;
  Target target_;
  asio::posix::stream_descriptor input_;
  asio::signal_set signals_;
  asio::steady_timer detail_wake_{io_};
  std::array<char, 64> keys_{};
  int escape_ = 0;
  bool stopped_ = false;
  top::Screen screen_;
  top::RateTracker rates_;
};

int run_top(const TopArgs& a) {
  const Target target = parse_target(a.url);
  const auto sort = top::parse_sort_key(a.sort);
  if (!sort) throw UsageError(fmt::format("--sort: \"{}\" is not one of name, in_use, queued, wait", a.sort));
  if (a.once) return run_once(target, *sort, a.limiter);
  if (::isatty(STDIN_FILENO) != 1 || ::isatty(STDOUT_FILENO) != 1)
    throw UsageError("not a terminal: the live view needs one; use --once for a text snapshot");
  asio::io_context io(1);
  Terminal terminal;
  Live live(io, target, *sort, a.limiter);
  live.start();
  io.run();
  return kExitOk;
}

}  // namespace

Command add_top_command(CLI::App& root) {
  auto args = std::make_shared<TopArgs>();
  CLI::App* app = root.add_subcommand("top", "A live terminal view of a fairgate serve instance");
  app->footer(
      "Shows every limiter (in use / cap, queued, estimated wait, grants, timeouts and rejections\n"
      "per second, state) from GET /v1/events, and the picked limiter's holders and queue from\n"
      "GET /v1/limiters/{name}. Keys: q quit, s change the sort, up/down (or k/j) pick a limiter.\n"
      "--once prints one snapshot as text and exits (for scripts). See docs/top.md.");
  app->add_option("--url", args->url, "The server's address")->type_name("URL")->default_str(args->url);
  app->add_flag("--once", args->once, "Print one snapshot as text and exit");
  app->add_option("--limiter", args->limiter,
                  "The limiter whose holders and queue are shown (default: the first)")
      ->type_name("NAME");
  app->add_option("--sort", args->sort, "Sort limiters by name, in_use, queued or wait")
      ->type_name("KEY")
      ->default_str("name");
  return Command{app, [args] { return run_top(*args); }};
}

}  // namespace fairgate::cli
