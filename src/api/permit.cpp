#include <fairgate/detail/limiter_impl.hpp>
#include <fairgate/permit.hpp>

namespace fairgate {

Permit::Permit(std::shared_ptr<detail::LimiterImpl> owner, std::string id,
               std::chrono::milliseconds waited) noexcept
    : owner_(std::move(owner)), id_(std::move(id)), waited_(waited) {}

Permit::Permit(Permit&& other) noexcept
    : owner_(std::move(other.owner_)), id_(std::move(other.id_)), waited_(other.waited_) {
  other.owner_.reset();
  other.id_.clear();
}

Permit& Permit::operator=(Permit&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = std::move(other.owner_);
    id_ = std::move(other.id_);
    waited_ = other.waited_;
    other.owner_.reset();
    other.id_.clear();
  }
  return *this;
}

Permit::~Permit() { release(); }

void Permit::release() noexcept {
  // Clear our state first: whatever release() does, this object never
  // returns the permit a second time.
  auto owner = std::move(owner_);
  owner_.reset();
  if (owner) detail::release_permit(*owner, id_);
  id_.clear();
}

}  // namespace fairgate
