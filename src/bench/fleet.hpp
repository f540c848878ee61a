// bench/fleet.hpp — a set of bench-worker processes (worker.hpp), driven by
// their line protocol. Used by `fairgate bench` and by the multi-process tests.
#pragma once

#include "bench/process.hpp"
#include "bench/record.hpp"
#include "bench/worker.hpp"

#include <boost/json/object.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fairgate::bench {

/// The command line that starts `options`: `executable bench-worker ...` for
/// fairgate, `node <peers_dir>/worker.js --system <peer> ...` for a peer.
std::vector<std::string> worker_argv(const std::string& executable, const WorkerOptions& options);

/// One event line of a worker ({"ev":"ready"|"holding"|"released"|"queued_all"|"mark"|"done",...}).
struct WorkerEvent {
  std::size_t worker = 0;
  std::string ev;
  boost::json::object body;
  /// body["t"] (monotonic ns), or 0.
  std::int64_t t() const;
  /// body[name] as a count, or 0.
  std::uint64_t count(const char* name) const;
  /// body["commands"], or 0.
  std::uint64_t commands() const { return count("commands"); }
};

class Fleet {
 public:
  using Log = std::function<void(const std::string&)>;
  Fleet(const std::string& executable, const std::vector<WorkerOptions>& workers, Log log = {},
        bool quiet_stderr = false);

  std::size_t size() const { return children_.size(); }
  Child& child(std::size_t w) { return *children_.at(w); }
  void send(std::size_t w, const std::string& line) { children_.at(w)->send(line); }
  void send_all(const std::string& line);

  /// Reads the workers' lines until `count` events named `ev` arrived. Request
  /// records met on the way go to `records`; without `records` they are kept
  /// and handed to the next call that has one (none is ever dropped). Throws
  /// std::runtime_error after `timeout`, when a worker reports an error or
  /// when one exits (workers listed in `may_exit` excepted).
  std::vector<WorkerEvent> wait_for(const std::string& ev, std::size_t count,
                                    std::chrono::milliseconds timeout,
                                    std::vector<RequestRecord>* records = nullptr,
                                    const std::vector<std::size_t>& may_exit = {});
  /// Commands the workers sent to Redis so far (one "mark" round).
  std::uint64_t commands();
  /// "exit" to every worker, then waits for them (SIGKILL after 10 s).
  void exit_all();

 private:
  Log log_;
  std::vector<std::unique_ptr<Child>> children_;
  std::vector<RequestRecord> stash_;
  std::shared_ptr<OutputSignal> output_ = std::make_shared<OutputSignal>();
};

}  // namespace fairgate::bench
