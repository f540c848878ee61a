// tests/support/netns.hpp — a network namespace a test can partition.
//
// NetNamespace creates a namespace joined to the host by a veth pair with a
// /30 of its own from 10.213.0.0/16: host_address() on the host side,
// ns_address() inside. A child started with exec_prefix() prepended to its
// argv runs inside and reaches the host only through host_address() (e.g. a
// RedisServer bound to it as well as to 127.0.0.1). partition() installs
// nftables rules inside the namespace that drop all TCP to and from the host
// address, so new connections time out and established ones stall, like a
// real partition (no RST, no FIN); heal() removes them and TCP's
// retransmissions get through again.
//
// Needs root, `ip` (iproute2) and `nft` (nftables); check
// unavailable_reason() first. Uses no tc (this machine has no netem).
// Every name is generated from the pid and a counter, so test processes
// running in parallel do not collide, and the destructor removes what the
// constructor made, also after a partial set-up.
#pragma once

// For a GoogleTest test (expanded where gtest is included): skips where
// namespaces cannot work, unless FAIRGATE_REQUIRE_NETNS=1 says they must.
#define REQUIRE_NETNS_OR_SKIP()                                                                   \
  if (const auto why = ::fairgate::test::NetNamespace::unavailable_reason()) {                    \
    const char* required = std::getenv("FAIRGATE_REQUIRE_NETNS");                                 \
    if (required && std::string(required) == "1") FAIL() << "FAIRGATE_REQUIRE_NETNS=1: " << *why; \
    GTEST_SKIP() << "network namespaces unavailable: " << *why;                                   \
  }

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace fairgate::test {

/// What a process printed and how it ended.
struct ProcessResult {
  int exit_code = -1;  // the exit status; 128 + N if killed by signal N
  std::string out;     // stdout
  std::string err;     // stderr
};

/// Runs argv (argv[0] looked up in PATH) without a shell, stdin from
/// /dev/null, and waits for it. Throws std::runtime_error if it cannot start.
ProcessResult run_process(const std::vector<std::string>& argv);
/// run_process(), but throws std::runtime_error with the command line, the
/// exit status and its stderr unless it exits 0. Returns its stdout.
std::string run_checked(const std::vector<std::string>& argv);

class NetNamespace {
 public:
  /// Why NetNamespace cannot work here ("not root", "`nft` not found", what
  /// a trial namespace said, ...), or nullopt if it can. Checked once.
  static std::optional<std::string> unavailable_reason();

  /// Creates the namespace and the veth pair, both ends up, and lo up inside.
  /// Throws std::runtime_error (with the failing command) if it cannot.
  NetNamespace();
  ~NetNamespace();
  NetNamespace(const NetNamespace&) = delete;
  NetNamespace& operator=(const NetNamespace&) = delete;

  /// The namespace's name (as in `ip netns list`), e.g. "fg12345n0".
  const std::string& name() const { return name_; }
  /// The host's end of the veth pair (e.g. "10.213.47.1"), where a server
  /// for the namespace's clients listens.
  const std::string& host_address() const { return host_address_; }
  /// The namespace's end (e.g. "10.213.47.2").
  const std::string& ns_address() const { return ns_address_; }
  /// {"ip", "netns", "exec", name()}: prepend to a child's argv.
  std::vector<std::string> exec_prefix() const;
  /// Runs fn on a new thread inside the namespace and waits (exceptions
  /// propagate). Sockets that thread creates belong to the namespace and
  /// stay there, so an in-process client can be put behind the partition.
  void run_inside(const std::function<void()>& fn) const;

  /// Drops all TCP between the namespace and host_address(), both ways.
  /// Idempotent.
  void partition();
  /// Removes those rules. Idempotent.
  void heal();
  bool partitioned() const { return partitioned_; }

 private:
  void tear_down() noexcept;

  std::string name_;
  std::string host_veth_;
  std::string ns_veth_;
  std::string host_address_;
  std::string ns_address_;
  bool ns_created_ = false;
  bool veth_created_ = false;
  bool partitioned_ = false;
};

}  // namespace fairgate::test
