// tests/support/redis_server.hpp — a real redis-server for integration tests.
//
// Starts `redis-server` (Debian's package, Redis 7) on a free loopback port in
// a temporary directory, waits until it answers PING, and stops it (by pid)
// on destruction. With FAIRGATE_TEST_REDIS=host:port set, shared() reuses that
// server instead of starting one.
//
// Fault controls (kill_hard, restart, stop_process, ...) act on the process
// this object started, by its pid, and on nothing else; they throw
// std::logic_error on a reused (FAIRGATE_TEST_REDIS) server. A server keeps
// its port and its directory across restarts, so with Options::appendonly the
// data written before a kill -9 is there again after it.
//
// Not thread-safe: call the controls from one thread, one that outlives the
// server (the child gets PR_SET_PDEATHSIG, which fires when the thread that
// forked it ends, not only the process). command() may run on several
// threads at once (each call opens its own connection).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fairgate::test {

/// A loopback TCP port that was free a moment ago (bound to port 0, then
/// closed): for a server a test starts, or for a port nothing listens on.
std::uint16_t free_loopback_port();

/// A free loopback port P (as above) whose cluster bus port P + 10000 is
/// free too and exists: redis-server with --cluster-enabled refuses a port
/// above 55535, and one whose bus port is taken fails to start.
std::uint16_t free_loopback_cluster_port();

class RedisServer {
 public:
  /// A TLS-only server: --port 0 --tls-port <free port> with these files
  /// (tests/support/test_pki.hpp makes them). The helper's own connections
  /// (startup PING, command()) speak TLS too, without verification, and show
  /// client_cert/client_key when the server asks for one.
  struct Tls {
    std::string cert_file;
    std::string key_file;
    std::string ca_file;
    std::string auth_clients = "no";  ///< --tls-auth-clients: no, yes, optional
    bool cluster = false;             ///< --tls-cluster yes (the cluster bus over TLS)
    bool replication = false;         ///< --tls-replication yes (replicas and sentinels to masters)
    std::string client_cert;          ///< the helper's client certificate (auth_clients yes)
    std::string client_key;
  };

  struct Options {
    /// Appended after ours, so they override them (e.g. {"--requirepass", "x"}).
    std::vector<std::string> extra_args;
    /// --appendonly yes --appendfsync always: every acknowledged write survives
    /// kill_hard()/restart(). Off: the data is gone after a restart.
    bool appendonly = false;
    /// --enable-debug-command yes (DEBUG SLEEP, DEBUG SET-ACTIVE-EXPIRE, ...),
    /// from any address; off: "no".
    bool debug_command = true;
    /// Addresses to listen on; host() is the first. Add a NetNamespace's
    /// host_address() to be reachable from inside the namespace (the address
    /// must exist before the server starts); with any address not on
    /// loopback, protected mode is off (else it answers DENIED there).
    std::vector<std::string> bind = {"127.0.0.1"};
    /// A configuration file, given first on the command line (Sentinel needs
    /// one it can rewrite: pass {"--sentinel"} in extra_args too).
    std::string config_file;
    /// Set: TLS only (no plain-text port).
    std::optional<Tls> tls;
    /// --cluster-enabled in extra_args: the port is chosen with
    /// free_loopback_cluster_port(), so its cluster bus port is free too.
    bool cluster = false;
    /// Set: started with --requirepass <password>, and command() sends AUTH
    /// <password> first. Plain text only.
    std::string password;
  };

  /// Starts a server with these extra arguments (e.g. {"--requirepass", "x"}),
  /// on 127.0.0.1, without persistence, DEBUG allowed from loopback.
  explicit RedisServer(std::vector<std::string> extra_args = {});
  explicit RedisServer(Options options);
  /// Stops the server in whatever state it is (stopped: SIGCONT first) and
  /// removes its directory.
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  /// One server for the whole test binary, started on first use.
  static RedisServer& shared();

  const std::string& host() const { return host_; }
  std::uint16_t port() const { return port_; }
  /// redis://host:port, or with TLS rediss://host:port?tls_ca_file=<ca_file>
  std::string url() const;
  /// The TLS settings (nullopt: plain text).
  const std::optional<Tls>& tls() const { return options_.tls; }
  /// The data directory (redis.log, appendonlydir/); empty for a reused server.
  const std::string& dir() const { return dir_; }

  /// Runs one command synchronously on a fresh connection (test helper);
  /// returns the reply as text ("(error) ..." for errors). Never waits longer
  /// than about `timeout` for the connect and again for the reply: a server
  /// that is stopped, killed or unreachable gives "(error) ..." text, too.
  std::string command(const std::vector<std::string>& args,
                      std::chrono::milliseconds timeout = std::chrono::seconds(5)) const;

  // --- Fault controls (the process this object started, by its pid).

  /// The server's pid; -1 after kill_hard() or for a reused server.
  pid_t pid() const { return pid_; }
  /// True while the process this object started exists (stopped or not).
  bool running() const;
  /// SIGKILL, then reaps it: like a crash or an OOM kill. No-op if not running.
  void kill_hard();
  /// Starts the server again after kill_hard(), on the same port and in the
  /// same directory; returns once it answers PING (with appendonly: once the
  /// AOF is loaded). Retries for a few seconds if the port is still busy.
  void start_again();
  /// kill_hard() if running, then start_again().
  void restart();
  /// SIGSTOP: the process freezes; the kernel still accepts connections on
  /// its port, but nothing answers. Returns once it is stopped. Idempotent.
  void stop_process();
  /// SIGCONT: it answers again (what queued meanwhile included). Idempotent.
  void continue_process();

 private:
  RedisServer(std::string host, std::uint16_t port)
      : host_(std::move(host)), port_(port) {}  // reuse, not owned
  void start();
  bool spawn_and_wait();                 // false: the process exited before it answered (port taken?)
  void wait_state(int waitpid_options);  // WUNTRACED: stopped, WCONTINUED: continued, 0: ended
  void reap_hard();
  void stop();
  void require_owned(const char* what) const;

  Options options_;
  const char* debug_mode_ = "yes";  // "local" for the plain constructor (as before Options)
  std::string host_ = "127.0.0.1";
  std::uint16_t port_ = 0;
  pid_t pid_ = -1;
  bool stopped_ = false;  // SIGSTOPped by stop_process()
  bool owned_ = false;    // started (and so controlled) by this object
  std::string dir_;
};

}  // namespace fairgate::test
