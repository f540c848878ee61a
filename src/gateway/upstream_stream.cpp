// gateway/upstream_stream.cpp — the executor of upstream connections and the
// pool of idle TLS ones (gateway/upstream_stream.hpp, gateway/gateway.hpp).
#include "gateway/upstream_stream.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>

#include <openssl/ssl.h>

namespace fairgate::serve {

net::any_io_executor connection_executor(const net::any_io_executor& session) {
  if (const auto* strand = session.target<net::strand<net::io_context::executor_type>>())
    return strand->get_inner_executor();
  return session;
}

TlsUpstreamPool::TlsUpstreamPool(std::size_t capacity) : capacity_(capacity) {}

// Too old, closed by the upstream, or with bytes waiting (its close_notify): dropped with the
// TCP connection (no close_notify of ours: the upstream does not wait for one).
bool TlsUpstreamPool::usable(const Idle& item, std::chrono::steady_clock::time_point now) {
  return now - item.since <= UpstreamPool::kMaxIdle &&
         fairgate::http::idle_connection_usable(item.conn->plain().socket().native_handle());
}

TlsUpstreamPool::~TlsUpstreamPool() = default;

std::unique_ptr<UpstreamStream> TlsUpstreamPool::take() {
  for (;;) {
    Idle item;
    {
      std::lock_guard lock(mu_);
      if (idle_.empty()) return nullptr;
      item =
          std::move(idle_.back());  // the most recently used: the least likely to be closed by the upstream
      idle_.pop_back();
    }
    if (!usable(item, std::chrono::steady_clock::now())) continue;
    return std::move(item.conn);
  }
}

void TlsUpstreamPool::put(std::unique_ptr<UpstreamStream> conn) {
  if (!conn || !conn->tls() || !conn->plain().socket().is_open()) return;
  std::lock_guard lock(mu_);
  if (capacity_ == 0) return;
  if (idle_.size() >= capacity_) idle_.pop_front();
  idle_.push_back(Idle{std::move(conn), std::chrono::steady_clock::now()});
}

std::size_t TlsUpstreamPool::idle() {
  const auto now = std::chrono::steady_clock::now();
  std::deque<Idle> dropped;  // freed outside the lock
  std::lock_guard lock(mu_);
  for (auto it = idle_.begin(); it != idle_.end();) {
    if (usable(*it, now)) {
      ++it;
    } else {
      dropped.push_back(std::move(*it));
      it = idle_.erase(it);
    }
  }
  return idle_.size();
}

void TlsUpstreamPool::remember_session(ssl_st* ssl) {
  const SSL_SESSION* got = SSL_get0_session(ssl);
  if (got == nullptr || SSL_SESSION_is_resumable(got) != 1) return;
  // A copy: OpenSSL marks a connection's own session not resumable when the
  // connection is freed without a TLS shutdown (as a pooled one is dropped).
  std::shared_ptr<SSL_SESSION> session(SSL_SESSION_dup(got), SSL_SESSION_free);
  if (!session) return;
  std::lock_guard lock(mu_);
  session_ = std::move(session);
}

void TlsUpstreamPool::offer_session(ssl_st* ssl) const {
  std::shared_ptr<SSL_SESSION> session;
  {
    std::lock_guard lock(mu_);
    session = session_;
  }
  // SSL_set_session takes its own reference; a session it cannot use is ignored.
  if (session) SSL_set_session(ssl, session.get());
}

}  // namespace fairgate::serve
