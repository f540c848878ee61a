// api/limiter_registry.hpp — the named limiters of one backend (F10): the
// bookkeeping every Backend shares, so a backend only says how to make one.
//
// Invariants: a name maps to one limiter for the registry's lifetime; after
// close() no limiter is created. Thread-safe; the factory runs under the
// registry's lock, so it must only construct (start the limiter afterwards).
#pragma once

#include <fairgate/limiter.hpp>
#include <fairgate/settings.hpp>

#include <boost/system/result.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fairgate::detail {

template <typename Impl>
class LimiterRegistry {
 public:
  struct Opened {
    std::shared_ptr<Impl> limiter;
    bool created = false;  ///< true for the call that made it: start it now
  };

  /// The limiter `name`, made by `make(name, settings)` if it does not exist.
  /// Fails with the offending field for an invalid name or settings, or when closed.
  template <typename Make>
  boost::system::result<Opened, SettingsError> open(std::string_view name, const Settings& settings,
                                                    Make&& make) {
    if (auto error = validate_limiter_name(name)) return *error;
    if (auto error = validate(settings)) return *error;
    std::lock_guard lock(mu_);
    if (closed_) return SettingsError{"backend", "has been shut down"};
    if (auto it = limiters_.find(name); it != limiters_.end()) return Opened{it->second, false};
    auto limiter = make(std::string(name), settings);
    limiters_.emplace(std::string(name), limiter);
    return Opened{std::move(limiter), true};
  }

  /// The limiter `name`, or nullptr.
  std::shared_ptr<Impl> get(std::string_view name) const {
    std::lock_guard lock(mu_);
    auto it = limiters_.find(name);
    return it == limiters_.end() ? nullptr : it->second;
  }

  std::optional<Limiter> find(std::string_view name) const {
    if (auto limiter = get(name)) return Limiter(std::move(limiter));
    return std::nullopt;
  }

  /// Every limiter, sorted by name.
  std::vector<std::shared_ptr<Impl>> all() const {
    std::lock_guard lock(mu_);
    std::vector<std::shared_ptr<Impl>> out;
    out.reserve(limiters_.size());
    for (const auto& [name, limiter] : limiters_) out.push_back(limiter);
    return out;
  }

  std::vector<Limiter> handles() const {
    std::vector<Limiter> out;
    for (auto& limiter : all()) out.emplace_back(std::move(limiter));
    return out;
  }

  /// Refuses new limiters from now on. Returns every limiter the first time
  /// (to shut them down), nullopt on later calls.
  std::optional<std::vector<std::shared_ptr<Impl>>> close() {
    {
      std::lock_guard lock(mu_);
      if (closed_) return std::nullopt;
      closed_ = true;
    }
    return all();
  }

 private:
  mutable std::mutex mu_;
  bool closed_ = false;
  std::map<std::string, std::shared_ptr<Impl>, std::less<>> limiters_;
};

}  // namespace fairgate::detail
