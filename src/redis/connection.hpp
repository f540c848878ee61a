// redis/connection.hpp — one Redis connection on an Asio executor.
//
// hiredis is used only for what it does well and safely: formatting commands
// (redisFormatCommandArgv) and parsing RESP (redisReader). Sockets, timers,
// pipelining and reconnects are ours, on the caller's event loop.
//
// Invariants:
//  * Every exec() callback is called exactly once, on the connection's strand:
//    with the reply, or with Error::timeout (sent, no reply in time: it may
//    still run) / disconnected (the connection dropped: it may have run) /
//    not_sent (no connection to send it on before its timeout: it never ran)
//    / closed.
//  * Replies are matched to commands in order (RESP2 pipelining). A command
//    that timed out keeps its slot, so the late reply is discarded, never
//    given to the next command. If the oldest command is far overdue the
//    connection is reset (all in-flight commands fail with disconnected).
//  * Commands sent while disconnected wait (up to their timeout) and are
//    written after the reconnect; in-flight commands fail on a disconnect
//    (their outcome is unknown to us; the caller decides).
//  * After each (re)connect: AUTH and SELECT as configured, alone; once SELECT
//    is answered (at once for database 0) CLIENT SETNAME, then the preload
//    commands (SCRIPT LOAD of every script), then whatever waited, then the
//    connect handler (re-SUBSCRIBE there): nothing sent on a connection can
//    run in another database or before its scripts are loaded. A refused
//    SELECT (/99 on a server with 16 databases) goes to options.log
//    ("Redis at HOST:PORT: database 99 cannot be selected: <reason>") and is
//    a failed connect (backoff, retry); connected() is false until SELECT is
//    answered.
//  * Reconnects back off (reconnect_min doubling up to reconnect_max), but
//    never longer than one command timeout while a command waits, and a new
//    command while disconnected brings the next attempt forward at once.
//  * Subscriber mode: arrays starting with "message", "pmessage",
//    "smessage" or "sunsubscribe" (a Cluster node that lost a slot drops its
//    shard channels; we never send SUNSUBSCRIBE) go to the push handler. SUBSCRIBE one channel per command
//    (one confirmation reply per command).
//  * A server that refuses writes for now (OOM, MISCONF, NOREPLICAS, BUSY:
//    refusal() in redis/database_check.hpp): options.log gets refusal_line()
//    (the client sends the command again; redis/client.cpp). With
//    check_eviction, a server that may evict keys is reported once per
//    connect (eviction_risk()).
//  * TLS (endpoint.tls.enabled, rediss://): a new TLS session on every
//    connect, the handshake (certificate and name verified) before the
//    connection counts as up; a failed or timed-out handshake is a failed
//    connect (backoff, retry). Problems that keep a connection from coming up
//    (TLS errors, a TLS port spoken to in plain text) go to options.log once
//    each until the connection works (docs/redis-cluster.md, "TLS").
#pragma once

#include "redis/reply.hpp"
#include "redis/url.hpp"

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

struct redisReader;

namespace boost::asio::ssl {
class context;
}

namespace fairgate::redis {

struct ConnectionOptions {
  Endpoint endpoint;
  std::chrono::milliseconds command_timeout{200};
  std::chrono::milliseconds connect_timeout{1000};
  std::chrono::milliseconds reconnect_min{50};
  std::chrono::milliseconds reconnect_max{2000};
  std::string client_name;  ///< CLIENT SETNAME when not empty
  bool subscriber = false;  ///< route pub/sub messages to the push handler
  /// Where the password goes, for the line a NOAUTH answer is reported with
  /// (empty: "give it in the URL", user:password@).
  std::string auth_hint;
  /// Why a connection cannot come up or do anything (TLS handshake or
  /// verification failed, bad CA file, plain text to a TLS port, a database
  /// the server does not have, AUTH refused, a password the server wants and
  /// was not given), one line per new problem.
  /// Empty: not reported.
  std::function<void(const std::string&)> log;
  /// Asks `INFO memory` once per (re)connect and reports, through `log`, a
  /// server that may evict keys (maxmemory set, a policy other than
  /// noeviction): eviction_risk() in redis/database_check.hpp. For the
  /// connections that carry a limiter's commands (not subscribers, not
  /// sentinels). A server whose ACL denies INFO is not asked again.
  bool check_eviction = false;
};

struct TlsStream;

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using Callback = boost::asio::any_completion_handler<void(boost::system::error_code, Reply)>;
  using PushHandler = std::function<void(Reply)>;
  using ConnectHandler = std::function<void()>;

  static std::shared_ptr<Connection> create(boost::asio::any_io_executor executor, ConnectionOptions options);
  ~Connection();

  /// Handlers run on the strand. Set them before start().
  void set_push_handler(PushHandler handler) { push_handler_ = std::move(handler); }
  void set_connect_handler(ConnectHandler handler) { connect_handler_ = std::move(handler); }
  /// Runs on the strand after every drop of an established or attempted
  /// connection (the Cluster client refreshes its slot map then).
  void set_disconnect_handler(ConnectHandler handler) { disconnect_handler_ = std::move(handler); }
  /// Commands sent first on every (re)connect, replies ignored. Set before start().
  void set_preload(std::vector<std::vector<std::string>> commands) { preload_ = std::move(commands); }

  /// Connects, and reconnects with backoff after every drop, until close().
  void start();
  /// Fails every waiting command with Error::closed and stops. Idempotent.
  void close();
  /// Drops the connection now (in-flight commands fail with disconnected,
  /// whatever was received but not read is discarded) and reconnects.
  void drop(const char* why);

  /// Sends one command (thread-safe). `callback` runs once on the strand.
  /// `asking`: ASKING is sent right before it, in the same write (Cluster ASK
  /// redirection; nothing else can come in between).
  void exec(std::vector<std::string> args, Callback callback,
            std::optional<std::chrono::milliseconds> timeout = std::nullopt, bool asking = false);
  /// The server to use from the next (re)connect on (Sentinel: the master
  /// moved). Thread-safe; drop() to move at once.
  void set_endpoint(Endpoint endpoint);
  /// The endpoint in use (for logs; thread-safe copy).
  Endpoint endpoint() const;

  const boost::asio::strand<boost::asio::any_io_executor>& strand() const noexcept { return strand_; }
  bool connected() const noexcept { return connected_.load(std::memory_order_acquire); }
  /// Commands written to the socket so far (handshakes included).
  std::uint64_t commands_sent() const noexcept { return commands_sent_.load(std::memory_order_relaxed); }
  /// Successful connects so far (1 after the first).
  std::uint64_t connects() const noexcept { return connects_.load(std::memory_order_relaxed); }
  const ConnectionOptions& options() const noexcept { return options_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    Callback callback;  // empty once answered by a timeout
    Clock::time_point deadline;
    std::string wire;  // formatted command (only while queued)
  };

  Connection(boost::asio::any_io_executor executor, ConnectionOptions options);

  void do_exec(std::vector<std::string> args, Callback callback, std::chrono::milliseconds timeout);
  void connect();
  /// Tries the resolved addresses from `next` on, each on a socket opened
  /// close-on-exec (a process the host application starts does not inherit
  /// the connection: docs/redis-cluster.md, "The client").
  void connect_to(boost::asio::ip::tcp::resolver::results_type addresses, std::size_t next,
                  std::uint64_t gen);
  void start_tls(const Endpoint& ep);
  void on_connected();
  /// The database is selected (or is 0): the connection is up.
  void on_selected();
  /// Logs `line` unless it is the problem logged last (cleared once a connection works).
  void report(const std::string& line);
  template <typename F>
  void with_stream(F&& f);
  void write_queued();
  void flush();
  void read();
  /// A read or write failed with `ec` before any reply: says what that
  /// usually means (a TLS-only port; over TLS, a server that wants a client
  /// certificate). Which of the two fails first is a race: both ask.
  void report_early_end(const boost::system::error_code& ec);
  void on_read(std::size_t n);
  void on_reply(Reply reply);
  void reset(const char* why);
  void schedule_reconnect();
  /// A command waits while disconnected: reconnect as soon as reconnect_min allows.
  void hurry_reconnect();
  void arm_deadline_timer(Clock::time_point deadline);
  void on_deadline_timer();
  static void fail(Pending& p, Error e);

  const ConnectionOptions options_;
  boost::asio::strand<boost::asio::any_io_executor> strand_;
  boost::asio::ip::tcp::resolver resolver_;
  boost::asio::ip::tcp::socket socket_;
  boost::asio::steady_timer connect_timer_;
  boost::asio::steady_timer reconnect_timer_;
  boost::asio::steady_timer deadline_timer_;
  Clock::time_point deadline_armed_{Clock::time_point::max()};

  // selecting: connected, AUTH and SELECT sent, nothing else until SELECT is answered.
  enum class State { idle, connecting, selecting, ready, backoff, closed };
  State state_ = State::idle;
  std::uint64_t generation_ = 0;  // bumped on every reset: stale handlers see a mismatch
  std::chrono::milliseconds backoff_{0};
  Clock::time_point last_attempt_{};
  std::vector<std::vector<std::string>> preload_;
  std::shared_ptr<boost::asio::ssl::context> tls_context_;  // TLS: built once from the options
  std::string tls_context_error_;                           // TLS: why there is no context
  std::shared_ptr<TlsStream> tls_;                          // TLS: this connection's session
  bool handshaking_ = false;                                // TLS handshake under way
  bool received_ = false;                                   // bytes came on this connection
  std::string last_problem_;                                // last line report()ed
  bool info_denied_ = false;                                // check_eviction: INFO refused (NOPERM)

  std::deque<Pending> queued_;     // not written yet
  std::deque<Pending> in_flight_;  // written, reply pending, in order
  std::string out_;                // bytes to write after the current write
  std::string writing_;            // bytes of the current write
  bool write_in_progress_ = false;
  std::vector<char> read_buffer_;
  redisReader* reader_ = nullptr;

  PushHandler push_handler_;
  ConnectHandler connect_handler_;
  ConnectHandler disconnect_handler_;
  mutable std::mutex endpoint_mu_;
  Endpoint endpoint_;  // under endpoint_mu_
  std::atomic<bool> connected_{false};
  std::atomic<std::uint64_t> commands_sent_{0};
  std::atomic<std::uint64_t> connects_{0};
};

}  // namespace fairgate::redis
