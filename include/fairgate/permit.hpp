// fairgate/permit.hpp — the RAII permit a granted acquire hands out.
#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace fairgate {

namespace detail {
class LimiterImpl;
}

/// One unit of a limiter's capacity, held by the caller (F1, F4).
///
/// Move-only. The permit is returned to its limiter exactly once: on release()
/// or on destruction, whichever comes first; later calls do nothing. A
/// moved-from or default-constructed Permit holds nothing.
///
/// Thread-safety: distinct Permit objects may be used from any threads; one
/// Permit object must not be used from two threads at once.
class Permit {
 public:
  Permit() noexcept = default;
  /// For backends: a permit `id` of `owner`, granted after waiting `waited`.
  Permit(std::shared_ptr<detail::LimiterImpl> owner, std::string id,
         std::chrono::milliseconds waited) noexcept;
  Permit(Permit&& other) noexcept;
  Permit& operator=(Permit&& other) noexcept;
  Permit(const Permit&) = delete;
  Permit& operator=(const Permit&) = delete;
  ~Permit();

  /// Returns the permit to the limiter now. Idempotent; never throws.
  void release() noexcept;

  /// True while this object holds a permit.
  bool held() const noexcept { return owner_ != nullptr; }
  explicit operator bool() const noexcept { return held(); }

  /// The permit's id (unique within its limiter); empty when not held.
  const std::string& id() const noexcept { return id_; }
  /// How long the request waited before it was granted.
  std::chrono::milliseconds waited() const noexcept { return waited_; }

 private:
  std::shared_ptr<detail::LimiterImpl> owner_;
  std::string id_;
  std::chrono::milliseconds waited_{0};
};

}  // namespace fairgate
