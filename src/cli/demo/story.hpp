// cli/demo/story.hpp — the run of `fairgate demo`: sets up the stage, lets the
// users ask in a seeded, shuffled order (each only after the previous one got
// its first event, so the arrival order at the limiter is exactly the
// demo's), waits for every request to end (bounded by a watchdog), reads the
// limiter's and the model's state, tears the stage down, then prints the
// summary and checks the invariants (checks.hpp). The limiter and the model
// run in real time; the story is shown at --speed scale.
#pragma once

#include "cli/demo/client.hpp"
#include "cli/demo/render.hpp"
#include "cli/demo/stage.hpp"
#include "cli/style.hpp"

#include "mockllm/mock_llm.hpp"
#include "redis/url.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/json/object.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fairgate::cli::demo {

/// The flags, validated (cli/demo/demo.cpp).
struct DemoConfig {
  std::uint32_t users = 10;
  std::uint32_t seats = 3;
  std::chrono::milliseconds max_wait{4000};
  std::uint32_t tokens = 20;  ///< shortest answer; the longest is twice this
  std::uint32_t tokens_per_second = 15;
  std::uint64_t seed = 148;
  double speed = 1.0;
  std::string redis;  ///< empty: the memory backend in this process
  std::optional<redis::Target> redis_target;
  bool color = false;
  bool quiet = false;
};

class Demo final : Story {
 public:
  Demo(boost::asio::io_context& io, DemoConfig config);
  Demo(const Demo&) = delete;
  Demo& operator=(const Demo&) = delete;

  /// Plays the story; returns the exit code (128 + signal when interrupted).
  int run();

 private:
  void make_users();
  double max_answer_seconds() const;
  double now_story() const;

  void schedule_arrival(std::size_t index);
  void arrive(User& u);
  void first_event(User& u) override;
  void finished() override;

  boost::asio::awaitable<void> wrap_up();
  boost::asio::awaitable<std::optional<boost::json::object>> get_limiter(const Gateway& gw);
  void tear_down();
  void arm_watchdog();
  void stop_all();

  void print_header();
  int summarize();

  boost::asio::io_context& io_;
  const DemoConfig config_;
  const Style style_;
  const bool detail_;
  std::chrono::milliseconds real_max_wait_{0};
  Scale scale_;  ///< start: set when the first user may ask

  std::unique_ptr<Stage> stage_;    ///< the model and the two gateways
  std::unique_ptr<Client> client_;  ///< the users' HTTP clients

  std::vector<std::unique_ptr<User>> users_;
  std::vector<User*> planned_;              ///< planned arrival order
  std::vector<const User*> arrival_order_;  ///< order the requests were sent

  std::size_t arrivals_ = 0;
  std::size_t finished_ = 0;
  Clock::time_point finished_at_{};
  mockllm::Stats model_stats_;
  std::optional<std::int64_t> final_in_use_;
  std::optional<std::int64_t> final_queued_;
  std::vector<std::string> violations_;

  boost::asio::steady_timer arrival_timer_;
  boost::asio::steady_timer watchdog_;
  boost::asio::steady_timer stop_timer_;
  double watchdog_story_s_ = 0;
  boost::asio::signal_set signals_;
  int interrupted_ = 0;
  bool stopping_ = false;
  bool tearing_down_ = false;
  bool torn_down_ = false;
};

}  // namespace fairgate::cli::demo
