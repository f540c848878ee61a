// cli/demo/stage.hpp — the set-up `fairgate demo` plays on: a mock model
// (mockllm::Server, at most `seats` answers at once, 429 above that) behind
// two gateway front ends, A and B, that share one limiter "chat" of `seats`
// seats — in this process on the memory backend, or (with a Redis URL) as two
// `fairgate serve` child processes on that Redis, with a config file and keys
// of their own that the stage removes when it ends.
#pragma once

#include "bench/process.hpp"
#include "mockllm/mock_llm.hpp"
#include "serve/server.hpp"

#include <fairgate/fairgate.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fairgate::cli::demo {

inline constexpr std::string_view kLimiterName = "chat";
inline constexpr std::string_view kRoutePath = "/v1/chat/completions";
inline constexpr std::string_view kTenantHeader = "x-user-id";

/// One gateway front end, as the clients see it.
struct Gateway {
  std::string label;  ///< "A" or "B"
  std::string url;    ///< http://127.0.0.1:PORT
  boost::asio::ip::tcp::endpoint endpoint;
  std::size_t users = 0;  ///< users that asked through it
};

struct StageOptions {
  std::uint32_t seats = 3;
  std::uint32_t tokens = 20;              ///< shortest answer (the mock's default length)
  double tokens_per_second = 15;          ///< real time: the story's speed times --speed
  std::chrono::milliseconds max_wait{0};  ///< the limiter's max wait, real time
  std::string redis;                      ///< empty: memory backend, in this process
};

class Stage {
 public:
  /// Bounds on starting a gateway process and on stopping one (real time).
  static constexpr auto kStartTimeout = std::chrono::seconds(10);
  static constexpr auto kStopTimeout = std::chrono::seconds(5);

  Stage(boost::asio::io_context& io, StageOptions options);
  ~Stage();  // removes the config file written for the gateway processes
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;

  /// Starts the model, then the gateways. Throws std::runtime_error, in one
  /// line, when Redis cannot be reached or a gateway does not start.
  void start();

  std::vector<Gateway>& gateways() { return gateways_; }
  const std::vector<Gateway>& gateways() const { return gateways_; }
  mockllm::Stats model_stats() const { return mock_->stats(); }
  const std::string& model_url() const { return model_url_; }
  /// The gateway processes' pids (--redis), in the order of gateways().
  std::vector<int> gateway_pids() const;

  /// Stops the in-process gateways (each lets its streams finish within its
  /// grace), then the model and the backend; `done` runs on the io_context
  /// once they are stopped. Gateway processes are left to stop_processes().
  void stop(std::function<void()> done);

  /// SIGTERM to the gateway processes (SIGKILL after kStopTimeout), then
  /// removes this run's keys from Redis. Blocking; call once the io_context is done.
  void stop_processes();

 private:
  void start_model();
  void start_gateways_here();
  void start_gateway_processes();
  void remove_redis_keys() const;

  boost::asio::io_context& io_;
  const StageOptions options_;
  std::unique_ptr<mockllm::Server> mock_;
  std::string model_url_;
  std::shared_ptr<Backend> backend_;
  std::vector<std::unique_ptr<serve::Server>> servers_;
  std::vector<std::unique_ptr<bench::Child>> children_;
  std::vector<Gateway> gateways_;
  std::string config_file_;  ///< --redis: the gateways' config, removed at the end
  std::string key_prefix_;   ///< --redis: this run's keys
  std::size_t servers_pending_ = 0;
};

}  // namespace fairgate::cli::demo
