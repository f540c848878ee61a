// memory/memory_backend.cpp — the set of named in-process limiters.
#include "memory/memory_limiter.hpp"

#include <fairgate/backend.hpp>

#include <map>
#include <mutex>

namespace fairgate {

namespace {

class MemoryBackend final : public Backend {
 public:
  explicit MemoryBackend(boost::asio::any_io_executor executor) : executor_(std::move(executor)) {}
  ~MemoryBackend() override { shutdown(); }

  std::string_view kind() const noexcept override { return "memory"; }

  boost::system::result<Limiter, SettingsError> open(std::string_view name,
                                                     const Settings& settings) override {
    if (auto error = validate_limiter_name(name)) return *error;
    if (auto error = validate(settings)) return *error;
    std::lock_guard lock(mu_);
    if (shut_down_) return SettingsError{"backend", "has been shut down"};
    auto it = limiters_.find(name);
    if (it == limiters_.end()) {
      it = limiters_
               .emplace(std::string(name),
                        std::make_shared<memory::MemoryLimiter>(std::string(name), settings, executor_))
               .first;
    }
    return Limiter(it->second);
  }

  std::optional<Limiter> find(std::string_view name) const override {
    std::lock_guard lock(mu_);
    auto it = limiters_.find(name);
    if (it == limiters_.end()) return std::nullopt;
    return Limiter(it->second);
  }

  std::vector<Limiter> limiters() const override {
    std::lock_guard lock(mu_);
    std::vector<Limiter> out;
    out.reserve(limiters_.size());
    for (const auto& [name, impl] : limiters_) out.emplace_back(impl);
    return out;
  }

  void shutdown() override {
    std::lock_guard lock(mu_);
    shut_down_ = true;
    for (const auto& [name, impl] : limiters_) impl->shutdown();
  }

 private:
  const boost::asio::any_io_executor executor_;
  mutable std::mutex mu_;
  bool shut_down_ = false;
  std::map<std::string, std::shared_ptr<memory::MemoryLimiter>, std::less<>> limiters_;
};

}  // namespace

std::shared_ptr<Backend> make_memory_backend(boost::asio::any_io_executor executor) {
  return std::make_shared<MemoryBackend>(std::move(executor));
}

}  // namespace fairgate
