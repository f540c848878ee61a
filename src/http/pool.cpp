// http/pool.cpp — the keep-alive pool (http/pool.hpp).
#include "http/pool.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace fairgate::http {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = ConnectionPool::Clock;

bool idle_connection_usable(int fd) noexcept {
  char probe = 0;
  const auto n = ::recv(fd, &probe, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

ConnectionPool::~ConnectionPool() {
  for (const auto& item : idle_) ::close(item.fd);
}

std::optional<tcp::socket> ConnectionPool::take(const net::any_io_executor& executor) {
  for (;;) {
    Idle item{};
    {
      std::lock_guard lock(mu_);
      if (idle_.empty()) return std::nullopt;
      item = idle_.back();  // the most recently used: the least likely to be closed by the upstream
      idle_.pop_back();
    }
    if (Clock::now() - item.since > kMaxIdle) {
      ::close(item.fd);
      continue;
    }
    if (!idle_connection_usable(item.fd)) {
      ::close(item.fd);
      continue;
    }
    tcp::socket socket(executor);
    boost::system::error_code ec;
    socket.assign(item.v6 ? tcp::v6() : tcp::v4(), item.fd, ec);
    if (ec) {
      ::close(item.fd);
      continue;
    }
    return socket;
  }
}

void ConnectionPool::put(tcp::socket socket) {
  boost::system::error_code ec;
  const auto local = socket.local_endpoint(ec);
  if (ec) return;  // closed with the socket
  const int fd = socket.release(ec);
  if (ec) return;
  std::lock_guard lock(mu_);
  if (capacity_ == 0) {
    ::close(fd);
    return;
  }
  if (idle_.size() >= capacity_) {
    ::close(idle_.front().fd);
    idle_.pop_front();
  }
  idle_.push_back(Idle{fd, local.address().is_v6(), Clock::now()});
}

std::size_t ConnectionPool::idle() {
  const auto now = Clock::now();
  std::lock_guard lock(mu_);
  std::erase_if(idle_, [&](const Idle& item) {
    if (now - item.since <= kMaxIdle && idle_connection_usable(item.fd)) return false;
    ::close(item.fd);
    return true;
  });
  return idle_.size();
}

}  // namespace fairgate::http
