// tests/support/tcp_proxy.hpp — a TCP proxy in the test process, to put
// network faults between a client and Redis.
//
// Listens on a free loopback port and forwards each accepted connection to
// the target (its own upstream connection per client), on Boost.Asio with
// its own io_context thread. The controls change what the network does from
// now on, for the current connections and the next ones:
//
//   set_delay(d)  every chunk read is written on d later (order kept per
//                 direction): a slow link, both ways, so a round trip
//                 costs at least 2d.
//   stall()       nothing is forwarded, either way, but the connections stay
//                 open and what arrives is buffered: a frozen network (the
//                 kernel still completes new handshakes, as it does for any
//                 listener). resume() delivers the backlog, in order.
//   cut()         closes every current connection, both sides, at once (the
//                 client reads EOF, as when the peer closes).
//   refuse(true)  new connections are accepted and closed at once.
//   mangle_replies(p, seed, command)
//                 each reply the target sends to `command` (e.g. "EVALSHA";
//                 empty: any command) is, with probability p, replaced by the
//                 next of a fixed set of replies of the wrong type or shape,
//                 or errors (an integer for an array, nil, "-ERR", "-MOVED"
//                 to nowhere, an unknown verdict, nested arrays, ...) — bad
//                 replies, not well-formed lies (no false "granted"): what the
//                 client makes of a Redis that answers nonsense. 0 stops.
//                 The proxy matches replies with commands by reading both
//                 streams as RESP2 (a reply is forwarded once whole); a
//                 connection that subscribes, or is not RESP2, is passed on
//                 untouched.
//   mangle_replies(p, seed, command, Mangling::inner)
//                 the same, but what is replaced is one element inside a
//                 reply that is an array (at any depth, never a nil): a
//                 number becomes a word, nil or [], a string becomes nil,
//                 [] or [1], an array becomes 7 or a word. The frame stays
//                 right and the rest of the reply true, so this tries the
//                 client's reading of each field, not only of the verdict.
//                 Replies with no such element pass as they are (not
//                 counted).
//
// All controls may be called from any thread, are idempotent, and return
// once they apply on the proxy's thread (after cut(), connections() is 0).
// The buffering has no limit: meant for test-sized traffic.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>

namespace fairgate::test {

/// What mangle_replies() replaces: the whole reply, or one element inside.
enum class Mangling { whole, inner };

class TcpProxy {
 public:
  /// Forwards to target_host (an IP address) : target_port. Throws if it
  /// cannot listen; a target that refuses shows as a client connection that
  /// closes at once.
  TcpProxy(const std::string& target_host, std::uint16_t target_port);
  /// Closes every connection and stops the thread.
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  /// The loopback port clients connect to (127.0.0.1).
  std::uint16_t port() const { return port_; }
  /// Applies to data read from now on (0: forward at once, the default).
  void set_delay(std::chrono::milliseconds delay);
  void stall();
  void resume();
  void cut();
  void refuse(bool on);
  void mangle_replies(double probability, std::uint64_t seed = 1, const std::string& only_command = "",
                      Mangling how = Mangling::whole);

  /// Replies replaced by mangle_replies() so far.
  std::uint64_t replies_mangled() const { return mangled_.load(); }

  /// Client connections open now (accepted and not yet closed).
  std::size_t connections() const { return open_.load(); }
  /// Bytes written on, both directions, since construction.
  std::uint64_t bytes_forwarded() const { return forwarded_.load(); }

 private:
  struct Session;
  void accept();
  void run_here(const std::function<void()>& fn);  // runs fn on the proxy's thread, waits

  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::ip::tcp::endpoint target_;
  std::uint16_t port_ = 0;
  std::set<std::shared_ptr<Session>> sessions_;  // the proxy's thread only
  std::atomic<std::int64_t> delay_ms_{0};
  std::atomic<bool> stalled_{false};
  std::atomic<bool> refusing_{false};
  std::atomic<std::size_t> open_{0};
  std::atomic<std::uint64_t> forwarded_{0};
  double mangle_p_ = 0;                  // the proxy's thread only
  std::mt19937_64 mangle_rng_;           // the proxy's thread only
  std::string mangle_only_;              // the proxy's thread only
  Mangling mangling_ = Mangling::whole;  // the proxy's thread only
  std::atomic<std::uint64_t> mangled_{0};
  std::thread thread_;  // last: starts after everything it uses
};

}  // namespace fairgate::test
