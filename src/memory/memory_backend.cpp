// memory/memory_backend.cpp — the set of named in-process limiters.
#include "api/limiter_registry.hpp"
#include "memory/memory_limiter.hpp"

#include <fairgate/backend.hpp>

namespace fairgate {

namespace {

class MemoryBackend final : public Backend {
 public:
  explicit MemoryBackend(boost::asio::any_io_executor executor) : executor_(std::move(executor)) {}
  ~MemoryBackend() override { shutdown(); }

  std::string_view kind() const noexcept override { return "memory"; }

  boost::system::result<Limiter, SettingsError> open(std::string_view name,
                                                     const Settings& settings) override {
    auto opened = registry_.open(name, settings, [this](std::string n, const Settings& s) {
      return std::make_shared<memory::MemoryLimiter>(std::move(n), s, executor_);
    });
    if (!opened) return opened.error();
    return Limiter(opened->limiter);
  }

  std::optional<Limiter> find(std::string_view name) const override { return registry_.find(name); }

  std::vector<Limiter> limiters() const override { return registry_.handles(); }

  void shutdown() override {
    if (auto all = registry_.close()) {
      for (const auto& limiter : *all) limiter->shutdown();
    }
  }

 private:
  const boost::asio::any_io_executor executor_;
  detail::LimiterRegistry<memory::MemoryLimiter> registry_;
};

}  // namespace

std::shared_ptr<Backend> make_memory_backend(boost::asio::any_io_executor executor) {
  return std::make_shared<MemoryBackend>(std::move(executor));
}

}  // namespace fairgate
