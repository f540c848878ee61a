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
struct ConfigureResult;
struct SettingsUpdate;
struct StatusQuery;
struct StatusResult;

namespace detail {

class LimiterImpl;

/// A one-shot completion handler for a result of type R. complete() must be
/// called at most once; it never runs the handler inline, it posts it to the
/// handler's executor.
template <typename R>
class BasicCompletion {
 public:
  virtual ~BasicCompletion() = default;
  virtual void complete(R result) = 0;
};
using Completion = BasicCompletion<AcquireResult>;
using ConfigureCompletion = BasicCompletion<ConfigureResult>;
using StatusCompletion = BasicCompletion<StatusResult>;

/// Wraps an Asio completion handler. While pending it keeps the handler's
/// executor busy (work guard), so a use_future caller or an io_context::run()
/// does not return early.
template <typename Handler, typename R = AcquireResult>
class CompletionBox final : public BasicCompletion<R> {
 public:
  CompletionBox(Handler handler, const boost::asio::any_io_executor& fallback)
      : handler_(std::move(handler)),
        work_(boost::asio::make_work_guard(boost::asio::get_associated_executor(handler_, fallback))) {}

  // Defined in limiter.hpp, where the result types are complete.
  void complete(R result) override;

 private:
  Handler handler_;
  boost::asio::executor_work_guard<boost::asio::associated_executor_t<Handler, boost::asio::any_io_executor>>
      work_;
};

template <typename R = AcquireResult, typename Handler>
std::unique_ptr<BasicCompletion<R>> make_completion(Handler handler,
                                                    const boost::asio::any_io_executor& fallback) {
  return std::make_unique<CompletionBox<Handler, R>>(std::move(handler), fallback);
}

/// Non-template entry points implemented in the library.
boost::asio::any_io_executor executor_of(const LimiterImpl& impl);
void start_acquire(LimiterImpl& impl, AcquireOptions options, std::unique_ptr<Completion> completion,
                   boost::asio::cancellation_slot slot);
void start_configure(LimiterImpl& impl, const SettingsUpdate& update,
                     std::unique_ptr<ConfigureCompletion> completion);
void start_status(LimiterImpl& impl, StatusQuery query, std::unique_ptr<StatusCompletion> completion);

}  // namespace detail
}  // namespace fairgate
