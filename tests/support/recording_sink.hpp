// tests/support/recording_sink.hpp — a core::DispatchSink that records every
// decision LimiterState takes, and can refuse grants (a ticket that already
// ended, e.g. cancelled while the grant was in flight).
#pragma once

#include "core/limiter_state.hpp"

#include <algorithm>
#include <functional>
#include <set>
#include <vector>

namespace fairgate::test {

class RecordingSink final : public core::DispatchSink {
 public:
  struct Drop {
    core::RequestId id;
    RejectReason reason;
    friend bool operator==(const Drop&, const Drop&) = default;
  };

  /// Ids for which try_grant() answers false (the request already ended).
  std::set<core::RequestId> refuse;
  /// Called before each try_grant answer; lets tests check the state at that moment.
  std::function<void(core::RequestId)> on_try_grant;

  std::vector<core::RequestId> offered;  ///< every try_grant call, in order
  std::vector<core::RequestId> granted;  ///< try_grant calls answered true
  std::vector<Drop> dropped;             ///< every drop call, in order

  bool try_grant(core::RequestId id) override {
    if (on_try_grant) on_try_grant(id);
    offered.push_back(id);
    if (refuse.contains(id)) return false;
    granted.push_back(id);
    return true;
  }
  void drop(core::RequestId id, RejectReason reason) override { dropped.push_back({id, reason}); }

  void clear() {
    offered.clear();
    granted.clear();
    dropped.clear();
  }
};

}  // namespace fairgate::test
