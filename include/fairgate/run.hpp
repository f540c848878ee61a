// fairgate/run.hpp — wrap a piece of work in acquire → run → release, the way
// the seed's @ChatQueueLimit annotation does. A rejection is surfaced to the
// caller as an error_code of reject_category() (compare with RejectReason).
#pragma once

#include <fairgate/limiter.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/system/result.hpp>

#include <functional>
#include <type_traits>
#include <utility>

namespace fairgate {

namespace detail {
template <typename T>
struct is_awaitable : std::false_type {};
template <typename T, typename E>
struct is_awaitable<boost::asio::awaitable<T, E>> : std::true_type {
  using value_type = T;
};
}  // namespace detail

/// Blocks the calling thread until a permit is granted (or the request ends),
/// runs `fn()` while holding it, and releases it afterwards — also when `fn`
/// throws. Must not be called from a thread that runs the limiter's executor.
template <typename Fn>
auto run(Limiter& limiter, Fn&& fn, AcquireOptions options = {})
    -> boost::system::result<std::invoke_result_t<Fn&>> {
  using R = std::invoke_result_t<Fn&>;
  AcquireResult acquired = limiter.async_acquire(std::move(options), boost::asio::use_future).get();
  if (!acquired.granted()) return acquired.error();
  Permit permit = acquired.take_permit();
  if constexpr (std::is_void_v<R>) {
    std::invoke(fn);
    return {};
  } else {
    return std::invoke(fn);
  }
}

/// The coroutine form: acquires, then `co_await`s `fn()` if it returns an
/// awaitable (or calls it if it returns a plain value), then releases.
/// Cancelling the calling coroutine while it waits ends the request as cancelled.
template <typename Fn>
auto co_run(Limiter& limiter, Fn fn, AcquireOptions options = {}) {
  using Raw = std::invoke_result_t<Fn&>;
  if constexpr (detail::is_awaitable<Raw>::value) {
    using R = typename detail::is_awaitable<Raw>::value_type;
    return [](Limiter& lim, Fn f, AcquireOptions opts) -> boost::asio::awaitable<boost::system::result<R>> {
      AcquireResult acquired = co_await lim.async_acquire(std::move(opts), boost::asio::use_awaitable);
      if (!acquired.granted()) co_return acquired.error();
      Permit permit = acquired.take_permit();
      if constexpr (std::is_void_v<R>) {
        co_await std::invoke(f);
        co_return boost::system::result<void>{};
      } else {
        co_return co_await std::invoke(f);
      }
    }(limiter, std::move(fn), std::move(options));
  } else {
    return [](Limiter& lim, Fn f, AcquireOptions opts) -> boost::asio::awaitable<boost::system::result<Raw>> {
      AcquireResult acquired = co_await lim.async_acquire(std::move(opts), boost::asio::use_awaitable);
      if (!acquired.granted()) co_return acquired.error();
      Permit permit = acquired.take_permit();
      if constexpr (std::is_void_v<Raw>) {
        std::invoke(f);
        co_return boost::system::result<void>{};
      } else {
        co_return std::invoke(f);
      }
    }(limiter, std::move(fn), std::move(options));
  }
}

}  // namespace fairgate
