// `fairgate top` against a real `fairgate serve`: the live view runs in a
// real terminal (a tmux server of its own, 80x24), the test drives load with
// SSE acquires over raw sockets and reads the screen with capture-pane; keys
// go in with send-keys. `--once` is checked as plain output.
#include "harness.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <memory>
#include <regex>
#include <string>
#include <vector>

namespace {

using namespace fairgate::test;

const char* kConfig = R"(
[server]
events_interval_ms = 200

[limiters.chat]
max_concurrent = 2
max_wait_ms = 60000

[limiters.export]
max_concurrent = 1
max_wait_ms = 60000
)";

/// Runs `command` through the shell; its stdout, and its exit status in `status`.
std::string shell(const std::string& command, int* status = nullptr) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return out;
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int rc = ::pclose(p);
  if (status != nullptr) *status = rc;
  return out;
}

/// A tmux server of this test's own (its own socket name), one 80x24 window
/// running `command`; the window stays after the command ends, with a line
/// saying how it ended. Killed (only this server) on destruction.
class Tmux {
 public:
  explicit Tmux(const std::string& command) : socket_("fairgate-top-test-" + std::to_string(::getpid())) {
    int status = 0;
    shell(tmux() + " -f /dev/null new-session -d -x 80 -y 24 -s top \"sh -c '" + command +
              "; echo top exited \\$?; sleep 600'\" 2>&1",
          &status);
    started_ = status == 0;
  }
  ~Tmux() { shell(tmux() + " kill-server 2>/dev/null"); }
  Tmux(const Tmux&) = delete;
  Tmux& operator=(const Tmux&) = delete;

  bool started() const { return started_; }
  std::string screen() const { return shell(tmux() + " capture-pane -p -t top"); }
  void keys(const std::string& keys) const { shell(tmux() + " send-keys -t top " + keys); }

  /// Waits up to `limit` until the screen matches `pattern`; the last screen seen.
  bool wait_for(const std::regex& pattern, std::chrono::milliseconds limit, std::string& last) const {
    const auto deadline = Clock::now() + limit;
    for (;;) {
      last = screen();
      if (std::regex_search(last, pattern)) return true;
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(100ms);
    }
  }

 private:
  std::string tmux() const { return "tmux -L " + socket_; }
  std::string socket_;
  bool started_ = false;
};

constexpr auto kBound = kSanitized ? 60s : 20s;

TEST(Top, LiveViewFollowsTheLoadAndTheKeys) {
  Serve server(kConfig, {});
  Tmux tmux(std::string(FAIRGATE_BIN) + " top --url " + server.url());
  ASSERT_TRUE(tmux.started()) << "tmux could not start";
  std::string screen;

  // Idle: both limiters, nothing in use; chat (first by name) is picked.
  ASSERT_TRUE(tmux.wait_for(std::regex(R"(> chat +0/2 +0 )"), kBound, screen)) << screen;
  EXPECT_TRUE(std::regex_search(screen, std::regex(R"(  export +0/1 +0 )"))) << screen;
  EXPECT_TRUE(std::regex_search(screen, std::regex("fairgate top - http://127.0.0.1:[0-9]+ - live")))
      << screen;

  // Two hold chat's two seats, three wait behind them.
  std::vector<std::unique_ptr<RawSse>> streams;
  for (int i = 0; i < 5; ++i) {
    streams.push_back(std::make_unique<RawSse>(server.url(), "chat"));
    // One at a time, so the queue order is the order of this loop.
    ASSERT_TRUE(streams.back()->wait_for(i < 2 ? "event: granted" : "event: queued", kBound)) << i;
  }
  ASSERT_TRUE(tmux.wait_for(std::regex(R"(> chat +2/2 +3 )"), kBound, screen)) << screen;
  // The picked limiter's detail: two holders and the three waiters at positions 1..3.
  ASSERT_TRUE(tmux.wait_for(std::regex(R"(chat: 2 holding, longest [0-9.]+s; 3 waiting)"), kBound, screen))
      << screen;
  for (const char* pos : {" 1 ", " 2 ", " 3 "})
    EXPECT_NE(screen.find(std::string("     ") + pos), std::string::npos) << screen;
  // The screen fits the terminal: 24 lines of at most 80 columns.
  std::size_t lines = 0, widest = 0, start = 0;
  for (std::size_t nl; (nl = screen.find('\n', start)) != std::string::npos; start = nl + 1, ++lines)
    widest = std::max(widest, nl - start);
  EXPECT_LE(lines, 24u);
  EXPECT_LE(widest, 80u);

  // Everyone leaves: the holders' seats come back, the queue empties.
  streams.clear();
  ASSERT_TRUE(tmux.wait_for(std::regex(R"(> chat +0/2 +0 )"), kBound, screen)) << screen;

  // Keys: s changes the sort, j picks the next limiter, q quits with exit 0.
  tmux.keys("s");
  ASSERT_TRUE(tmux.wait_for(std::regex(R"(s sort \(in_use\))"), kBound, screen)) << screen;
  tmux.keys("j");
  ASSERT_TRUE(tmux.wait_for(std::regex(R"(> export +0/1 )"), kBound, screen)) << screen;
  ASSERT_TRUE(tmux.wait_for(std::regex(R"(export: 0 holding; 0 waiting)"), kBound, screen)) << screen;
  tmux.keys("q");
  ASSERT_TRUE(tmux.wait_for(std::regex("top exited 0"), kBound, screen)) << screen;
}

TEST(Top, ServerGoneIsShownWithoutExiting) {
  // A view of a server that stops says so and keeps trying, without exiting.
  auto server = std::make_unique<Serve>(kConfig, std::vector<std::string>{});
  Tmux tmux(std::string(FAIRGATE_BIN) + " top --url " + server->url());
  ASSERT_TRUE(tmux.started());
  std::string screen;
  ASSERT_TRUE(tmux.wait_for(std::regex(R"(> chat +0/2 )"), kBound, screen)) << screen;
  EXPECT_EQ(server->terminate(), 0);
  ASSERT_TRUE(tmux.wait_for(std::regex(R"(disconnected, retrying: )"), kBound, screen)) << screen;
  EXPECT_EQ(screen.find("top exited"), std::string::npos) << screen;
  tmux.keys("q");
  ASSERT_TRUE(tmux.wait_for(std::regex("top exited 0"), kBound, screen)) << screen;
}

TEST(Top, APickedLimiterThatIsNotThereIsSaidAndTheFirstShown) {
  // Live, --limiter with a name the server lacks showed no '>' row, no detail and no word.
  Serve server(kConfig, {});
  Tmux tmux(std::string(FAIRGATE_BIN) + " top --limiter nope --url " + server.url());
  ASSERT_TRUE(tmux.started());
  std::string screen;
  ASSERT_TRUE(tmux.wait_for(std::regex(R"(no limiter "nope")"), kBound, screen)) << screen;
  ASSERT_TRUE(tmux.wait_for(std::regex(R"(\n> )"), kBound, screen)) << screen;
  tmux.keys("q");
  ASSERT_TRUE(tmux.wait_for(std::regex("top exited 0"), kBound, screen)) << screen;
}

TEST(Top, OncePrintsOneSnapshot) {
  Serve server(kConfig, {});
  RawSse holder(server.url(), "export");
  ASSERT_TRUE(holder.wait_for("event: granted", kBound));
  RawSse waiter(server.url(), "export");
  ASSERT_TRUE(waiter.wait_for("event: queued", kBound));

  int status = -1;
  const std::string out =
      shell(std::string(FAIRGATE_BIN) + " top --once --sort queued --url " + server.url() + " 2>&1", &status);
  EXPECT_EQ(status, 0) << out;
  // Sorted by queue length: export (1 waiting) first, so it is the one detailed.
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(sorted by queued\n)"))) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(> export +1/1 +1 [^\n]*\n  chat +0/2 +0 )"))) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(export: 1 holding, longest [0-9.]+s; 1 waiting)"))) << out;

  // --limiter picks another; an unknown one is an error naming it.
  const std::string chat =
      shell(std::string(FAIRGATE_BIN) + " top --once --limiter chat --url " + server.url());
  EXPECT_NE(chat.find("chat: 0 holding; 0 waiting"), std::string::npos) << chat;
  const std::string unknown = shell(
      std::string(FAIRGATE_BIN) + " top --once --limiter nope --url " + server.url() + " 2>&1", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(unknown.find("no limiter named \"nope\""), std::string::npos) << unknown;
}

}  // namespace
