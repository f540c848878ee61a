#include "redis/connection.hpp"

#include "redis/database_check.hpp"
#include "redis/tls.hpp"

#include <hiredis/hiredis.h>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include <fcntl.h>

#include <algorithm>

namespace fairgate::redis {

namespace asio = boost::asio;
using boost::system::error_code;

namespace {

constexpr std::size_t kReadChunk = 64 * 1024;

bool is_push(const Reply& r) {
  if (r.type != Reply::Type::array || r.elements.empty()) return false;
  const std::string& kind = r.elements.front().str;
  return kind == "message" || kind == "pmessage" || kind == "smessage" || kind == "sunsubscribe";
}

class ErrorCategory final : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "fairgate.redis"; }
  std::string message(int ev) const override {
    switch (static_cast<Error>(ev)) {
      case Error::timeout: return "Redis command timed out";
      case Error::disconnected: return "Redis connection lost";
      case Error::not_sent: return "no connection to Redis (the command was not sent)";
      case Error::closed: return "Redis client closed";
      case Error::protocol: return "Redis protocol error";
      case Error::no_script: return "Redis lost the script cache (NOSCRIPT); the call did not run";
      case Error::denied: return "Redis does not let this user make the call (an ACL: docs/redis-acl.md)";
    }
    return "Redis error";
  }
};

}  // namespace

const boost::system::error_category& error_category() noexcept {
  static const ErrorCategory category;
  return category;
}

error_code make_error_code(Error e) noexcept { return {static_cast<int>(e), error_category()}; }

std::shared_ptr<Connection> Connection::create(asio::any_io_executor executor, ConnectionOptions options) {
  return std::shared_ptr<Connection>(new Connection(std::move(executor), std::move(options)));
}

Connection::Connection(asio::any_io_executor executor, ConnectionOptions options)
    : options_(std::move(options)),
      strand_(asio::make_strand(executor)),
      resolver_(strand_),
      socket_(strand_),
      connect_timer_(strand_),
      reconnect_timer_(strand_),
      deadline_timer_(strand_),
      read_buffer_(kReadChunk),
      endpoint_(options_.endpoint) {
  if (options_.endpoint.tls.enabled) {
    auto made = make_tls_context(options_.endpoint.tls);
    if (auto* ctx = std::get_if<std::shared_ptr<asio::ssl::context>>(&made)) {
      tls_context_ = std::move(*ctx);
    } else {
      tls_context_error_ = std::get<std::string>(made);
    }
  }
}

template <typename F>
void Connection::with_stream(F&& f) {
  if (tls_) {
    f(tls_->stream);
  } else {
    f(socket_);
  }
}

void Connection::report(const std::string& line) {
  if (line == last_problem_) return;
  last_problem_ = line;
  if (options_.log) options_.log(line);
}

void Connection::set_endpoint(Endpoint endpoint) {
  std::lock_guard lock(endpoint_mu_);
  endpoint_ = std::move(endpoint);
}

Endpoint Connection::endpoint() const {
  std::lock_guard lock(endpoint_mu_);
  return endpoint_;
}

Connection::~Connection() {
  if (reader_) redisReaderFree(reader_);
}

void Connection::start() {
  asio::dispatch(strand_, [self = shared_from_this()] {
    if (self->state_ == State::idle) self->connect();
  });
}

void Connection::close() {
  asio::dispatch(strand_, [self = shared_from_this()] {
    if (self->state_ == State::closed) return;
    self->state_ = State::closed;
    ++self->generation_;
    self->connected_.store(false, std::memory_order_release);
    error_code ignored;
    self->socket_.close(ignored);
    self->tls_.reset();
    self->resolver_.cancel();
    self->connect_timer_.cancel();
    self->reconnect_timer_.cancel();
    self->deadline_timer_.cancel();
    // Moved out first: a callback may call exec() (inline on this strand).
    auto in_flight = std::move(self->in_flight_);
    auto queued = std::move(self->queued_);
    self->in_flight_.clear();
    self->queued_.clear();
    for (auto& p : in_flight) fail(p, Error::closed);
    for (auto& p : queued) fail(p, Error::closed);
  });
}

void Connection::drop(const char* why) {
  asio::dispatch(strand_, [self = shared_from_this(), why] {
    if (self->state_ == State::ready || self->state_ == State::connecting || self->state_ == State::selecting)
      self->reset(why);
  });
}

void Connection::fail(Pending& p, Error e) {
  if (!p.callback) return;
  Callback callback(std::move(p.callback));  // leaves p.callback empty: the slot stays, answered
  std::move(callback)(make_error_code(e), Reply{});
}

void Connection::exec(std::vector<std::string> args, Callback callback,
                      std::optional<std::chrono::milliseconds> timeout, bool asking) {
  asio::dispatch(strand_, [self = shared_from_this(), args = std::move(args), callback = std::move(callback),
                           t = timeout.value_or(options_.command_timeout), asking]() mutable {
    if (asking && self->state_ != State::closed)
      self->do_exec({"ASKING"}, Callback([](error_code, Reply) {}), t);
    self->do_exec(std::move(args), std::move(callback), t);
  });
}

void Connection::do_exec(std::vector<std::string> args, Callback callback,
                         std::chrono::milliseconds timeout) {
  if (state_ == State::closed) {
    std::move(callback)(make_error_code(Error::closed), Reply{});
    return;
  }
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  argv.reserve(args.size());
  lens.reserve(args.size());
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  char* formatted = nullptr;
  const int len = redisFormatCommandArgv(&formatted, static_cast<int>(argv.size()), argv.data(), lens.data());
  if (len < 0 || !formatted) {
    std::move(callback)(make_error_code(Error::protocol), Reply{});
    return;
  }
  Pending p{std::move(callback), Clock::now() + timeout,
            std::string(formatted, static_cast<std::size_t>(len))};
  redisFreeCommand(formatted);
  const auto deadline = p.deadline;
  queued_.push_back(std::move(p));
  if (state_ == State::ready) write_queued();
  if (state_ == State::backoff) hurry_reconnect();
  arm_deadline_timer(deadline);
}

void Connection::write_queued() {
  while (!queued_.empty()) {
    Pending p = std::move(queued_.front());
    queued_.pop_front();
    out_ += p.wire;
    p.wire.clear();
    p.wire.shrink_to_fit();
    in_flight_.push_back(std::move(p));
    commands_sent_.fetch_add(1, std::memory_order_relaxed);
  }
  flush();
}

void Connection::flush() {
  // Selecting: only the handshake (AUTH, SELECT) is in out_.
  if (write_in_progress_ || out_.empty() || (state_ != State::ready && state_ != State::selecting)) return;
  write_in_progress_ = true;
  writing_.swap(out_);
  out_.clear();
  with_stream([&](auto& stream) {
    asio::async_write(
        stream, asio::buffer(writing_),
        [self = shared_from_this(), gen = generation_, keep = tls_](error_code ec, std::size_t) {
          if (gen != self->generation_) return;
          self->write_in_progress_ = false;
          self->writing_.clear();
          if (ec) {
            self->report_early_end(ec);
            return self->reset("write failed");
          }
          self->flush();
        });
  });
}

void Connection::connect() {
  state_ = State::connecting;
  last_attempt_ = Clock::now();
  const auto gen = generation_;
  connect_timer_.expires_after(options_.connect_timeout);
  connect_timer_.async_wait([self = shared_from_this(), gen](error_code ec) {
    if (ec || gen != self->generation_ || self->state_ != State::connecting) return;
    if (self->handshaking_) {
      const Endpoint ep = self->endpoint();
      self->report("TLS handshake with " + ep.host + ":" + std::to_string(ep.port) + " timed out after " +
                   std::to_string(self->options_.connect_timeout.count()) +
                   " ms (is it a plain, non-TLS port? then use redis://)");
    }
    self->reset("connect timed out");
  });
  if (options_.endpoint.tls.enabled && !tls_context_) {
    // A bad CA file: nothing to connect with (the backend's validate() says so at startup).
    report(tls_context_error_);
    return reset("no TLS context");
  }
  const Endpoint ep = endpoint();
  resolver_.async_resolve(
      ep.host, std::to_string(ep.port),
      [self = shared_from_this(), gen](error_code ec, asio::ip::tcp::resolver::results_type results) {
        if (gen != self->generation_) return;
        if (ec) return self->reset("resolve failed");
        self->connect_to(std::move(results), 0, gen);
      });
}

void Connection::connect_to(asio::ip::tcp::resolver::results_type addresses, std::size_t next,
                            std::uint64_t gen) {
  if (next >= addresses.size()) return reset("connect failed");
  const auto address = std::next(addresses.begin(), static_cast<std::ptrdiff_t>(next))->endpoint();
  error_code ec;
  socket_.close(ec);
  socket_.open(address.protocol(), ec);
  if (ec) return connect_to(std::move(addresses), next + 1, gen);
  // Asio opens sockets without FD_CLOEXEC: a program that runs another
  // (fork and exec) would hand it this connection, which then outlives our
  // close of it.
  const int fd = socket_.native_handle();
  if (const int flags = ::fcntl(fd, F_GETFD); flags >= 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  socket_.async_connect(address, [self = shared_from_this(), gen, addresses = std::move(addresses),
                                  next](error_code ec2) mutable {
    if (gen != self->generation_) return;
    if (ec2) return self->connect_to(std::move(addresses), next + 1, gen);
    if (self->tls_context_) return self->start_tls(self->endpoint());
    self->on_connected();
  });
}

void Connection::start_tls(const Endpoint& ep) {
  tls_ = std::make_shared<TlsStream>(socket_, *tls_context_);
  if (auto problem = prepare_tls_stream(*tls_, ep); !problem.empty()) {
    report(problem);
    return reset("TLS setup failed");
  }
  handshaking_ = true;
  tls_->stream.async_handshake(asio::ssl::stream_base::client, [self = shared_from_this(), gen = generation_,
                                                                keep = tls_, ep](error_code ec) {
    if (gen != self->generation_) return;
    self->handshaking_ = false;
    if (ec) {
      self->report(describe_handshake_failure(*keep, ep, ec));
      return self->reset("TLS handshake failed");
    }
    self->on_connected();
  });
}

void Connection::on_connected() {
  connect_timer_.cancel();
  error_code ignored;
  socket_.set_option(asio::ip::tcp::no_delay(true), ignored);
  if (reader_) redisReaderFree(reader_);
  reader_ = make_reply_reader();
  received_ = false;
  read();

  // AUTH and SELECT go first, alone: whatever waited stays queued until both
  // are answered. On a database the server does not have (/99 on a server
  // with 16) Redis would run it in database 0; after a refused AUTH it would
  // run it as the default user (on a server where that user needs no
  // password), so nothing follows a refused AUTH on the same connection.
  state_ = State::selecting;
  std::deque<Pending> waiting;
  waiting.swap(queued_);
  const Endpoint ep = endpoint();
  if (!ep.password.empty()) {
    // The callback holds the connection weakly: a pending command must not
    // keep its own connection alive (a cycle through in_flight_).
    do_exec(auth_command(ep),
            Callback([weak = weak_from_this(), gen = generation_, ep](error_code ec, Reply r) {
              auto self = weak.lock();
              if (!self || gen != self->generation_) return;
              if (ec) return self->reset("AUTH unanswered");
              if (r.is_error()) {
                self->report(auth_refused(ep, r.str));
                return self->reset("AUTH rejected");
              }
              if (ep.db == 0) self->on_selected();  // else SELECT's answer does it
            }),
            options_.command_timeout);
  }
  if (ep.db != 0) {
    do_exec({"SELECT", std::to_string(ep.db)},
            Callback([weak = weak_from_this(), gen = generation_, ep](error_code ec, Reply r) {
              auto self = weak.lock();
              if (!self || gen != self->generation_) return;  // dropped or closed meanwhile
              if (ec) return self->reset("SELECT unanswered");
              if (r.is_error()) {
                self->report(database_refused(ep, r.str));
                return self->reset("SELECT rejected");
              }
              self->on_selected();
            }),
            options_.command_timeout);
  }
  write_queued();  // the handshake only: queued_ holds nothing else yet
  for (auto& p : waiting) queued_.push_back(std::move(p));
  if (ep.db == 0 && ep.password.empty()) on_selected();
}

void Connection::on_selected() {
  // What came while SELECT was on its way waits behind what waited before.
  std::deque<Pending> waiting;
  waiting.swap(queued_);
  state_ = State::ready;
  backoff_ = std::chrono::milliseconds(0);
  if (received_) last_problem_.clear();  // it works: report the next problem again
  connects_.fetch_add(1, std::memory_order_relaxed);
  connected_.store(true, std::memory_order_release);
  auto ignore = [] { return Callback([](error_code, Reply) {}); };
  if (!options_.client_name.empty()) {
    do_exec({"CLIENT", "SETNAME", options_.client_name}, ignore(), options_.command_timeout);
  }
  // The scripts, before anything that may call them (Redis may have restarted
  // with an empty script cache).
  // A user that may not load them, or a server without scripts, is said
  // here: the calls then fail with NOSCRIPT, which does not say why.
  for (const auto& command : preload_) {
    do_exec(command, Callback([weak = weak_from_this(), gen = generation_](error_code ec, Reply r) {
              auto self = weak.lock();
              if (!self || gen != self->generation_ || ec || !r.is_error() || !self->options_.log) return;
              if (auto line = setup_problem(self->endpoint(), r.str)) self->options_.log(*line);
            }),
            options_.command_timeout);
  }
  if (options_.check_eviction && !info_denied_) {
    do_exec({"INFO", "memory"},
            Callback([weak = weak_from_this(), gen = generation_](error_code ec, Reply r) {
              auto self = weak.lock();
              if (!self || gen != self->generation_ || ec) return;
              if (r.is_error()) {
                // NOPERM (an ACL without INFO): recovery rule 14 says so already.
                if (r.str.starts_with("NOPERM")) self->info_denied_ = true;
                return;
              }
              if (r.type != Reply::Type::string) return;
              if (auto line = eviction_risk(self->endpoint(), r.str)) self->report(*line);
            }),
            options_.command_timeout);
  }
  for (auto& p : waiting) queued_.push_back(std::move(p));
  write_queued();
  if (connect_handler_) connect_handler_();
}

void Connection::read() {
  with_stream([&](auto& stream) {
    stream.async_read_some(asio::buffer(read_buffer_), [self = shared_from_this(), gen = generation_,
                                                        keep = tls_](error_code ec, std::size_t n) {
      if (gen != self->generation_) return;
      if (ec) {
        self->report_early_end(ec);
        return self->reset("read failed");
      }
      if (!self->tls_ && !self->received_ && n > 0 &&
          (self->read_buffer_[0] == 0x15 || self->read_buffer_[0] == 0x16)) {
        const Endpoint ep = self->endpoint();
        self->report("Redis at " + ep.host + ":" + std::to_string(ep.port) +
                     " answered with TLS: use rediss://");
        return self->reset("TLS port");
      }
      if (n > 0 && !self->received_) {
        self->received_ = true;
        // It works (once the database is selected): report the next problem again.
        if (self->state_ == State::ready) self->last_problem_.clear();
      }
      self->on_read(n);
    });
  });
}

void Connection::report_early_end(const error_code& ec) {
  if (received_ || ec == asio::error::operation_aborted) return;
  const Endpoint ep = endpoint();
  const std::string where = ep.host + ":" + std::to_string(ep.port);
  if (!tls_ &&
      (ec == asio::error::connection_reset || ec == asio::error::eof || ec == asio::error::broken_pipe)) {
    report("Redis at " + where +
           " closed the connection before any reply (a TLS-only port? then use rediss://)");
  } else if (tls_) {
    // TLS 1.3: a server that refuses our client certificate (or its absence)
    // says so after our side of the handshake has ended: the read gets its
    // alert, or the PING written meanwhile fails.
    report("TLS connection to " + where + " ended before any reply: " + ec.message() +
           " (does it want a client certificate: tls_cert_file, tls_key_file?)");
  }
}

void Connection::on_read(std::size_t n) {
  const auto gen = generation_;
  if (redisReaderFeed(reader_, read_buffer_.data(), n) != REDIS_OK) return reset("protocol error");
  for (;;) {
    void* raw = nullptr;
    if (redisReaderGetReply(reader_, &raw) != REDIS_OK) return reset("protocol error");
    if (!raw) break;
    Reply reply = reply_of(static_cast<const redisReply*>(raw));
    freeReplyObject(raw);
    on_reply(std::move(reply));
    if (gen != generation_) return;  // a handler reset or closed the connection
  }
  read();
}

void Connection::on_reply(Reply reply) {
  // Redis at maxclients, or in protected mode for a client not on loopback,
  // writes this on a new connection and closes it: say so (once, until a
  // connection works) rather than "refused AUTH" or nothing.
  if (reply.is_error()) {
    if (auto line = turned_away(endpoint(), reply.str)) {
      report(*line);
      return reset("turned away");
    }
  }
  if ((options_.subscriber && is_push(reply)) || in_flight_.empty()) {
    if (push_handler_) push_handler_(std::move(reply));
    return;
  }
  Pending p = std::move(in_flight_.front());
  in_flight_.pop_front();
  // A server that wants a password answers every command so; say why once.
  if (reply.is_error() && reply.str.starts_with("NOAUTH"))
    report(password_missing(endpoint(), reply.str, options_.auth_hint));
  // A server that refuses writes for now (out of memory, ...): said every
  // time (the client's log keeps one line per 30 s), not once per
  // connection: it comes and goes while the connection stays.
  if (reply.is_error() && options_.log && refusal(reply.str))
    options_.log(*refusal_line(endpoint(), reply.str));
  if (p.callback) std::move(p.callback)(error_code{}, std::move(reply));
}

void Connection::reset(const char* /*why*/) {
  if (state_ == State::closed) return;
  ++generation_;
  // Not ready any more before any callback runs: a command a callback sends
  // must wait for the reconnect, not be written to the closed socket.
  state_ = State::backoff;
  connected_.store(false, std::memory_order_release);
  error_code ignored;
  socket_.close(ignored);
  tls_.reset();  // pending operations keep their session alive until they end
  handshaking_ = false;
  connect_timer_.cancel();
  write_in_progress_ = false;
  out_.clear();
  writing_.clear();
  // Their outcome is unknown: the caller decides what to do.
  auto failed = std::move(in_flight_);
  in_flight_.clear();
  for (auto& p : failed) fail(p, Error::disconnected);
  schedule_reconnect();
  if (disconnect_handler_) disconnect_handler_();
}

void Connection::schedule_reconnect() {
  if (state_ == State::closed) return;
  state_ = State::backoff;
  backoff_ = std::clamp(backoff_ * 2, options_.reconnect_min, options_.reconnect_max);
  // Work waits: never back off longer than it may wait.
  if (!queued_.empty())
    backoff_ = std::min(backoff_, std::max(options_.reconnect_min, options_.command_timeout));
  reconnect_timer_.expires_after(backoff_);
  reconnect_timer_.async_wait([self = shared_from_this(), gen = generation_](error_code ec) {
    if (ec || gen != self->generation_ || self->state_ != State::backoff) return;
    self->connect();
  });
}

void Connection::hurry_reconnect() {
  const auto at = std::max(Clock::now(), last_attempt_ + options_.reconnect_min);
  if (reconnect_timer_.expiry() <= at) return;
  reconnect_timer_.expires_at(at);
  reconnect_timer_.async_wait([self = shared_from_this(), gen = generation_](error_code ec) {
    if (ec || gen != self->generation_ || self->state_ != State::backoff) return;
    self->connect();
  });
}

void Connection::arm_deadline_timer(Clock::time_point deadline) {
  if (deadline >= deadline_armed_) return;
  deadline_armed_ = deadline;
  deadline_timer_.expires_at(deadline);
  deadline_timer_.async_wait([self = shared_from_this()](error_code ec) {
    if (ec == asio::error::operation_aborted) return;
    self->on_deadline_timer();
  });
}

void Connection::on_deadline_timer() {
  deadline_armed_ = Clock::time_point::max();
  if (state_ == State::closed) return;
  const auto now = Clock::now();
  auto next = Clock::time_point::max();
  // Expired callbacks are collected and called at the end: a callback may
  // call exec() (inline on this strand), which must not touch the deques
  // while they are being walked.
  std::vector<Pending> expired;
  std::vector<Pending> unsent;  // expired without a connection to send them on
  // Never-sent commands that expired simply leave.
  for (auto it = queued_.begin(); it != queued_.end();) {
    if (it->deadline <= now) {
      (state_ == State::ready ? expired : unsent).push_back(std::move(*it));
      it = queued_.erase(it);
    } else {
      next = std::min(next, it->deadline);
      ++it;
    }
  }
  // Sent ones keep their slot so a late reply is matched and discarded.
  for (auto& p : in_flight_) {
    if (!p.callback) continue;
    if (p.deadline <= now) {
      // Moving leaves p.callback empty: answered, the slot stays for the late reply.
      expired.push_back(Pending{std::move(p.callback), p.deadline, {}});
    } else {
      next = std::min(next, p.deadline);
    }
  }
  // A reply overdue by far more than a timeout: the connection is stuck.
  bool stuck = false;
  if (!in_flight_.empty()) {
    const auto stall = std::max(options_.command_timeout * 4, std::chrono::milliseconds(1000));
    const auto oldest = in_flight_.front().deadline;
    if (now - oldest >= stall) {
      stuck = true;
    } else {
      next = std::min(next, oldest + stall);
    }
  }
  if (stuck) {
    reset("reply overdue");
  } else if (next != Clock::time_point::max()) {
    arm_deadline_timer(next);
  }
  for (auto& p : expired) fail(p, Error::timeout);
  for (auto& p : unsent) fail(p, Error::not_sent);
}

}  // namespace fairgate::redis
