#include "support/tcp_proxy.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <deque>
#include <future>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fairgate::test {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

namespace {

/// The length of the whole RESP2 reply at the start of `b`: 0 when it is not
/// all there yet, -1 when `b` is not RESP2.
std::ptrdiff_t resp_reply_length(std::string_view b, int depth = 0) {
  if (b.empty()) return 0;
  if (depth > 32) return -1;
  const auto crlf = b.find("\r\n");
  if (crlf == std::string_view::npos) return b.size() > 64 * 1024 ? -1 : 0;
  const auto line = static_cast<std::ptrdiff_t>(crlf + 2);
  const std::string_view head = b.substr(1, crlf - 1);
  switch (b.front()) {
    case '+':
    case '-':
    case ':': return line;
    case '$': {
      const long long n = std::strtoll(std::string(head).c_str(), nullptr, 10);
      if (n < 0) return line;
      const auto total = line + static_cast<std::ptrdiff_t>(n) + 2;
      return static_cast<std::ptrdiff_t>(b.size()) >= total ? total : 0;
    }
    case '*': {
      const long long n = std::strtoll(std::string(head).c_str(), nullptr, 10);
      std::ptrdiff_t at = line;
      for (long long k = 0; k < n; ++k) {
        const auto e = resp_reply_length(b.substr(static_cast<std::size_t>(at)), depth + 1);
        if (e <= 0) return e;
        at += e;
      }
      return at;
    }
    default: return -1;
  }
}

/// The name of the command `b` (a whole RESP2 array of bulk strings),
/// upper-case; empty when it is not one.
std::string command_name(std::string_view b) {
  const auto first = b.find("\r\n");
  if (b.empty() || b.front() != '*' || first == std::string_view::npos) return {};
  std::string_view rest = b.substr(first + 2);
  const auto crlf = rest.find("\r\n");
  if (rest.empty() || rest.front() != '$' || crlf == std::string_view::npos) return {};
  const long long n = std::strtoll(std::string(rest.substr(1, crlf - 1)).c_str(), nullptr, 10);
  if (n < 0 || rest.size() < crlf + 2 + static_cast<std::size_t>(n)) return {};
  std::string name(rest.substr(crlf + 2, static_cast<std::size_t>(n)));
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

/// What a mangled reply becomes: wrong types and shapes, errors — never a
/// well-formed verdict that could be true ("granted", "queued").
constexpr std::string_view kBadReplies[] = {
    ":7\r\n",
    ":-9223372036854775808\r\n",
    "$-1\r\n",
    "*-1\r\n",
    "*0\r\n",
    "+OK\r\n",
    "$5\r\nhello\r\n",
    "-ERR mangled by the test proxy\r\n",
    "-NOSCRIPT No matching script (mangled)\r\n",
    "-MOVED 1 127.0.0.1:1\r\n",
    "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
    "*2\r\n*1\r\n:1\r\n*0\r\n",
    "*1\r\n$9\r\nnonsense!\r\n",
    "*2\r\n$8\r\nrejected\r\n:42\r\n",
    "*3\r\n:1\r\n$-1\r\n*1\r\n+x\r\n",
    "*5\r\n$0\r\n\r\n$0\r\n\r\n:0\r\n:0\r\n:0\r\n",
};

/// The elements of the RESP2 reply at `at` in `b` (whole, well-formed) below
/// `depth` 0, as (offset, length) of their bytes, nils left out, in the order
/// they start; returns the reply's length (read once, element by element).
std::size_t inner_elements(std::string_view b, std::size_t at, int depth,
                           std::vector<std::pair<std::size_t, std::size_t>>& out) {
  const bool nil = b.substr(at, 3) == "$-1" || b.substr(at, 3) == "*-1";
  if (b[at] != '*' || nil) {
    const auto len = static_cast<std::size_t>(resp_reply_length(b.substr(at)));
    if (depth > 0 && !nil) out.emplace_back(at, len);
    return len;
  }
  const std::size_t slot = out.size();
  if (depth > 0) out.emplace_back(at, 0);  // its length once its elements are read
  const auto crlf = b.find("\r\n", at);
  const long long n = std::strtoll(std::string(b.substr(at + 1, crlf - at - 1)).c_str(), nullptr, 10);
  std::size_t next = crlf + 2;
  for (long long k = 0; k < n; ++k) next += inner_elements(b, next, depth + 1, out);
  if (depth > 0) out[slot].second = next - at;
  return next - at;
}

/// `reply` with one element inside replaced by one of another type (see
/// Mangling::inner), picked with `rng`; empty when it has no such element.
std::string mangle_inner(std::string_view reply, std::mt19937_64& rng) {
  std::vector<std::pair<std::size_t, std::size_t>> elements;
  inner_elements(reply, 0, 0, elements);
  if (elements.empty()) return {};
  const auto [at, len] = elements[std::uniform_int_distribution<std::size_t>(0, elements.size() - 1)(rng)];
  static constexpr std::string_view kForNumber[] = {"$7\r\nmangled\r\n", "$-1\r\n", "*0\r\n"};
  static constexpr std::string_view kForString[] = {"$-1\r\n", "*0\r\n", "*1\r\n:1\r\n"};
  static constexpr std::string_view kForArray[] = {":7\r\n", "$7\r\nmangled\r\n"};
  const auto pick = [&](const auto& options) {
    return options[std::uniform_int_distribution<std::size_t>(0, std::size(options) - 1)(rng)];
  };
  const char type = reply[at];
  const std::string_view with = type == ':'   ? pick(kForNumber)
                                : type == '*' ? pick(kForArray)
                                              : pick(kForString);
  std::string out(reply.substr(0, at));
  out += with;
  out += reply.substr(at + len);
  return out;
}

}  // namespace

// One client connection and its upstream connection, with a pump per
// direction. Lives on the proxy's thread only; every handler holds a
// shared_ptr to it, and after close() none starts another operation.
struct TcpProxy::Session : std::enable_shared_from_this<Session> {
  // Reads `from` and writes `to` what it read, in order, each chunk not
  // before its due time and not while the proxy is stalled.
  struct Pump {
    Pump(tcp::socket& f, tcp::socket& t, asio::io_context& io) : from(f), to(t), timer(io) {}
    tcp::socket& from;
    tcp::socket& to;
    std::array<char, 16 * 1024> buf{};
    std::deque<std::pair<Clock::time_point, std::string>> queue;  // due time, bytes
    asio::steady_timer timer;  // waits for the front chunk's due time, or (stalled) for resume()
    bool busy = false;         // a timer wait or a write is outstanding
    bool eof = false;          // `from` has closed: shut `to` down once the queue is written
    bool done = false;         // ... and that shutdown is done
  };

  Session(TcpProxy& p, tcp::socket c)
      : proxy(p),
        client(std::move(c)),
        upstream(p.io_),
        pumps{{client, upstream, p.io_}, {upstream, client, p.io_}} {}

  void start() {
    upstream.async_connect(proxy.target_, [self = shared_from_this()](error_code ec) {
      if (self->closed) return;
      if (ec) return self->close();  // the target refuses: so does the proxy
      self->read(0);
      self->read(1);
    });
  }

  void read(int i) {
    Pump& p = pumps[i];
    p.from.async_read_some(asio::buffer(p.buf), [self = shared_from_this(), i](error_code ec, std::size_t n) {
      if (self->closed) return;
      Pump& pump = self->pumps[i];
      if (ec == asio::error::eof) {
        pump.eof = true;  // pass the half-close on, after what is still queued
        return self->kick(i);
      }
      if (ec) return self->close();
      std::string bytes(pump.buf.data(), n);
      if (!self->raw) {
        if (i == 0) {
          self->track(bytes);
        } else {
          bytes = self->mangle(std::move(bytes));
        }
      }
      pump.queue.emplace_back(Clock::now() + std::chrono::milliseconds(self->proxy.delay_ms_.load()),
                              std::move(bytes));
      self->kick(i);
      self->read(i);
    });
  }

  // Starts the next step of pump i's writer unless one is outstanding.
  void kick(int i) {
    Pump& p = pumps[i];
    if (closed || p.busy) return;
    if (p.queue.empty()) {
      if (p.eof && !p.done) {
        p.done = true;
        error_code ignored;
        p.to.shutdown(tcp::socket::shutdown_send, ignored);
        if (pumps[0].done && pumps[1].done) close();
      }
      return;
    }
    p.busy = true;
    const bool stalled = proxy.stalled_.load();
    if (stalled || Clock::now() < p.queue.front().first) {
      p.timer.expires_at(stalled ? Clock::time_point::max() : p.queue.front().first);
      p.timer.async_wait([self = shared_from_this(), i](error_code) {
        self->pumps[i].busy = false;
        self->kick(i);  // due, or woken by resume(): look again
      });
      return;
    }
    asio::async_write(p.to, asio::buffer(p.queue.front().second),
                      [self = shared_from_this(), i](error_code ec, std::size_t n) {
                        Pump& pump = self->pumps[i];
                        pump.busy = false;
                        if (self->closed) return;
                        if (ec) return self->close();
                        self->proxy.forwarded_ += n;
                        pump.queue.pop_front();
                        self->kick(i);
                      });
  }

  // Notes the name of each whole command the client sent (bytes go on as
  // they are), so each reply can be matched with its command. A connection
  // that subscribes gets pushes, not one reply per command: raw from then on.
  void track(const std::string& bytes) {
    sent_partial += bytes;
    std::string_view rest = sent_partial;
    for (;;) {
      const auto len = resp_reply_length(rest);
      if (len < 0) return go_raw();
      if (len == 0) break;
      std::string name = command_name(rest.substr(0, static_cast<std::size_t>(len)));
      if (name.empty() || name == "SUBSCRIBE" || name == "SSUBSCRIBE" || name == "PSUBSCRIBE" ||
          name == "MONITOR")
        return go_raw();
      commands.push_back(std::move(name));
      rest.remove_prefix(static_cast<std::size_t>(len));
    }
    sent_partial = std::string(rest);
  }

  // The whole replies of partial + bytes, each (a reply to a command that
  // mangle_replies() names) replaced with the proxy's probability; a reply
  // cut short stays in partial.
  std::string mangle(std::string bytes) {
    partial += bytes;
    std::string out;
    std::string_view rest = partial;
    for (;;) {
      const auto len = resp_reply_length(rest);
      if (len == 0) break;
      if (len < 0 || commands.empty()) {  // not RESP2, or not a reply to a command: pass it all on
        out += rest;
        go_raw();
        return out;
      }
      const bool named = proxy.mangle_only_.empty() || commands.front() == proxy.mangle_only_;
      commands.pop_front();
      const std::string_view reply = rest.substr(0, static_cast<std::size_t>(len));
      std::string inner;
      if (!named || proxy.mangle_p_ <= 0 ||
          !std::bernoulli_distribution(proxy.mangle_p_)(proxy.mangle_rng_)) {
        out += reply;
      } else if (proxy.mangling_ == Mangling::whole) {
        out += kBadReplies[proxy.mangled_++ % std::size(kBadReplies)];  // each kind in turn
      } else if (inner = mangle_inner(reply, proxy.mangle_rng_); !inner.empty()) {
        out += inner;
        ++proxy.mangled_;
      } else {
        out += reply;
      }
      rest.remove_prefix(static_cast<std::size_t>(len));
    }
    partial = std::string(rest);
    return out;
  }

  void go_raw() {
    raw = true;
    partial.clear();
    sent_partial.clear();
    commands.clear();
  }

  // Ends any wait, so each writer looks at the proxy's settings again.
  void wake() {
    for (Pump& p : pumps) p.timer.cancel();
  }

  void close() {
    if (closed) return;
    closed = true;
    error_code ignored;
    client.close(ignored);
    upstream.close(ignored);
    wake();
    proxy.sessions_.erase(shared_from_this());
    --proxy.open_;
  }

  TcpProxy& proxy;
  tcp::socket client;
  tcp::socket upstream;
  Pump pumps[2];  // [0]: client -> upstream, [1]: upstream -> client
  bool closed = false;
  // Matching replies with commands (for mangle_replies): the start of a
  // command and of a reply not yet whole, and the commands not yet answered.
  std::string sent_partial;
  std::string partial;
  std::deque<std::string> commands;
  bool raw = false;  // not RESP2, or a subscriber: passed on as it is, never mangled
};

TcpProxy::TcpProxy(const std::string& target_host, std::uint16_t target_port)
    : work_(io_.get_executor()), acceptor_(io_), target_(asio::ip::make_address(target_host), target_port) {
  const tcp::endpoint listen_on(asio::ip::address_v4::loopback(), 0);
  acceptor_.open(listen_on.protocol());
  acceptor_.set_option(tcp::acceptor::reuse_address(true));
  acceptor_.bind(listen_on);
  acceptor_.listen();
  port_ = acceptor_.local_endpoint().port();
  accept();
  thread_ = std::thread([this] { io_.run(); });
}

TcpProxy::~TcpProxy() {
  run_here([this] {
    error_code ignored;
    acceptor_.close(ignored);
    for (const auto& s : std::set(sessions_)) s->close();  // a copy: close() erases
  });
  // Every outstanding operation was cancelled; run() returns once their
  // handlers have run (none starts another).
  work_.reset();
  thread_.join();
}

void TcpProxy::accept() {
  acceptor_.async_accept([this](error_code ec, tcp::socket socket) {
    if (!acceptor_.is_open()) return;  // closing
    if (!ec) {
      if (refusing_.load()) {
        socket.close(ec);
      } else {
        auto session = std::make_shared<Session>(*this, std::move(socket));
        sessions_.insert(session);
        ++open_;
        session->start();
      }
    }
    accept();
  });
}

void TcpProxy::run_here(const std::function<void()>& fn) {
  if (std::this_thread::get_id() == thread_.get_id()) return fn();
  std::promise<void> done;
  asio::post(io_, [&] {
    fn();
    done.set_value();
  });
  done.get_future().wait();
}

void TcpProxy::set_delay(std::chrono::milliseconds delay) {
  run_here([&] { delay_ms_ = delay.count(); });
}

void TcpProxy::stall() {
  run_here([this] { stalled_ = true; });
}

void TcpProxy::resume() {
  run_here([this] {
    stalled_ = false;
    for (const auto& s : sessions_) s->wake();
  });
}

void TcpProxy::cut() {
  run_here([this] {
    for (const auto& s : std::set(sessions_)) s->close();
  });
}

void TcpProxy::refuse(bool on) {
  run_here([&] { refusing_ = on; });
}

void TcpProxy::mangle_replies(double probability, std::uint64_t seed, const std::string& only_command,
                              Mangling how) {
  run_here([&] {
    mangling_ = how;
    mangle_p_ = std::clamp(probability, 0.0, 1.0);
    mangle_rng_.seed(seed);
    mangle_only_ = only_command;
    for (char& c : mangle_only_) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  });
}

}  // namespace fairgate::test
