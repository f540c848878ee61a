// fairgate/detail/completion.hpp — type erasure between the templated
// Limiter::async_acquire and the non-template backends. Not public API.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>

#include <memory>
#include <utility>

namespace fairgate {

class AcquireResult;
struct AcquireOptions;

namespace detail {

class LimiterImpl;

/// A one-shot completion handler. complete() must be called at most once; it
/// never runs the handler inline, it posts it to the handler's executor.
class Completion {
 public:
  virtual ~Completion() = default;
  virtual void complete(AcquireResult result) = 0;
};

/// Wraps an Asio completion handler. While pending it keeps the handler's
/// executor busy (work guard), so a use_future caller or an io_context::run()
/// does not return early.
template <typename Handler>
class CompletionBox final : public Completion {
 public:
  CompletionBox(Handler handler, const boost::asio::any_io_executor& fallback)
      : handler_(std::move(handler)),
        work_(boost::asio::make_work_guard(boost::asio::get_associated_executor(handler_, fallback))) {}

  // Defined in limiter.hpp, where AcquireResult is complete.
  void complete(AcquireResult result) override;

 private:
  Handler handler_;
  boost::asio::executor_work_guard<boost::asio::associated_executor_t<Handler, boost::asio::any_io_executor>>
      work_;
};

template <typename Handler>
std::unique_ptr<Completion> make_completion(Handler handler, const boost::asio::any_io_executor& fallback) {
  return std::make_unique<CompletionBox<Handler>>(std::move(handler), fallback);
}

/// Non-template entry points implemented in the library.
boost::asio::any_io_executor executor_of(const LimiterImpl& impl);
void start_acquire(LimiterImpl& impl, AcquireOptions options, std::unique_ptr<Completion> completion,
                   boost::asio::cancellation_slot slot);

}  // namespace detail
}  // namespace fairgate
