// A log callback's lines, kept for a test:
//
//   LogLines log;
//   options.log = log.sink();   // RedisBackendOptions::log, ConnectionOptions::log
//   ...
//   EXPECT_EQ(log.with("refused").size(), 1u) << log.all();
//
// The sink shares the lines with every copy of the LogLines, and outlives it
// safely (a connection may log until it is closed, after the test's locals).
#pragma once

#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace fairgate::test {

class LogLines {
 public:
  /// Callable as void(std::string_view) and void(const std::string&).
  auto sink() const {
    return [s = state_](std::string_view line) {
      std::lock_guard lock(s->mu);
      s->lines.emplace_back(line);
    };
  }
  std::vector<std::string> lines() const { return with_all({}); }
  /// The lines that contain `text`.
  std::vector<std::string> with(std::string_view text) const { return with_all({text}); }
  /// The lines that contain every one of `texts`.
  std::vector<std::string> with_all(std::initializer_list<std::string_view> texts) const {
    std::lock_guard lock(state_->mu);
    std::vector<std::string> out;
    for (const auto& l : state_->lines) {
      bool all = true;
      for (const auto t : texts) all = all && l.find(t) != std::string::npos;
      if (all) out.push_back(l);
    }
    return out;
  }
  /// Every line, one per line (for failure messages).
  std::string all() const {
    std::string out;
    for (const auto& l : lines()) out += l + "\n";
    return out;
  }

 private:
  struct State {
    std::mutex mu;
    std::vector<std::string> lines;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace fairgate::test
