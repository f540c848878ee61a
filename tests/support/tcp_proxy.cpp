#include "support/tcp_proxy.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include <array>
#include <deque>
#include <future>
#include <string>
#include <utility>

namespace fairgate::test {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

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
      pump.queue.emplace_back(Clock::now() + std::chrono::milliseconds(self->proxy.delay_ms_.load()),
                              std::string(pump.buf.data(), n));
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

}  // namespace fairgate::test
