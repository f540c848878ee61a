// redis/client.cpp — the standalone, Sentinel and Cluster clients behind
// redis::Client (client.hpp says what each keeps).
#include "redis/client.hpp"

#include "core/text.hpp"
#include "redis/database_check.hpp"
#include "redis/log_level.hpp"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>

namespace fairgate::redis {

namespace asio = boost::asio;
using boost::system::error_code;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// --- hash slots ----------------------------------------------------------------

namespace {

// CRC16-CCITT (XMODEM: polynomial 0x1021, initial 0), as Redis Cluster uses.
constexpr std::array<std::uint16_t, 256> make_crc_table() {
  std::array<std::uint16_t, 256> t{};
  for (unsigned i = 0; i < 256; ++i) {
    std::uint16_t crc = static_cast<std::uint16_t>(i << 8);
    for (int b = 0; b < 8; ++b)
      crc = static_cast<std::uint16_t>((crc & 0x8000) ? (crc << 1) ^ 0x1021 : crc << 1);
    t[i] = crc;
  }
  return t;
}
constexpr auto kCrcTable = make_crc_table();

std::uint16_t crc16(std::string_view s) {
  std::uint16_t crc = 0;
  for (const unsigned char c : s)
    crc = static_cast<std::uint16_t>((crc << 8) ^ kCrcTable[((crc >> 8) ^ c) & 0xff]);
  return crc;
}

}  // namespace

unsigned key_slot(std::string_view key) {
  // Only the part between the first '{' and the next '}' is hashed, if non-empty.
  if (const auto open = key.find('{'); open != std::string_view::npos) {
    const auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return crc16(key) & 16383u;
}

std::optional<std::pair<std::string, std::uint16_t>> master_address(const Reply& reply) {
  if (!has_shape(reply, "si") || reply.elements[0].str.empty()) return std::nullopt;
  const auto& p = reply.elements[1].str;
  unsigned port = 0;
  if (std::from_chars(p.data(), p.data() + p.size(), port).ec != std::errc{} || port == 0 || port > 65535)
    return std::nullopt;
  return std::make_pair(reply.elements[0].str, static_cast<std::uint16_t>(port));
}

std::vector<SlotRange> slot_ranges(const Reply& reply, const std::string& answered_by) {
  std::vector<SlotRange> out;
  if (reply.type != Reply::Type::array) return out;
  const auto visible = [](const std::string& h) {
    return std::all_of(h.begin(), h.end(), [](char c) { return c > ' ' && c < 0x7f; });
  };
  for (const auto& range : reply.elements) {
    if (range.type != Reply::Type::array || range.elements.size() < 3) continue;
    const auto first = range.elements[0].as_integer();
    const auto last = range.elements[1].as_integer();
    const auto& master = range.elements[2];
    if (!first || !last || *first < 0 || *last > 16383 || *first > *last ||
        master.type != Reply::Type::array || master.elements.size() < 2)
      continue;
    const auto port = master.elements[1].as_integer();
    if (!port || *port <= 0 || *port > 65535) continue;
    const Reply& host = master.elements[0];
    const bool text = host.type == Reply::Type::string;
    const bool unknown = host.type == Reply::Type::nil || (text && (host.str.empty() || host.str == "?"));
    if (!unknown && (!text || !visible(host.str))) continue;
    out.push_back(SlotRange{static_cast<unsigned>(*first), static_cast<unsigned>(*last),
                            unknown ? answered_by : host.str, static_cast<std::uint16_t>(*port)});
  }
  return out;
}

namespace {

bool starts_with(const std::string& s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; }

/// A reply that says the command did not run and may run if tried again a
/// little later: a failover, a migration, a server loading its data, or one
/// that refuses writes for now (refusal() in redis/database_check.hpp: out of
/// memory, a failed snapshot, too few replicas, another client's script
/// running; ClientOptions::retry_refusals). A script is refused those only at
/// its first write, so a refused script changed nothing.
bool retry_later(const Reply& r, const ClientOptions& o) {
  return r.is_error() && (starts_with(r.str, "TRYAGAIN") || starts_with(r.str, "CLUSTERDOWN") ||
                          starts_with(r.str, "LOADING") || starts_with(r.str, "MASTERDOWN") ||
                          starts_with(r.str, "READONLY") || (o.retry_refusals && refusal(r.str)));
}

/// One command (or script call) on its way, across redirections and retries.
struct Op {
  /// Sends it on `c` with this timeout (ASKING first if `asking`).
  std::function<void(Connection& c, milliseconds timeout, bool asking, Connection::Callback done)> run;
  // (optional: Boost 1.81's any_completion_handler move-assignment recurses forever)
  std::optional<Connection::Callback> done;
  Clock::time_point deadline;
  std::string key;      // routing key (Cluster)
  bool on_sub = false;  // runs on the Pub/Sub connection (SSUBSCRIBE)
  int redirects = 0;    // MOVED/ASK followed
  int retries = 0;      // TRYAGAIN/CLUSTERDOWN/... waited for
  std::shared_ptr<asio::steady_timer> timer;

  void finish(error_code ec, Reply r) {
    if (!done) return;
    Connection::Callback cb(std::move(*done));
    done.reset();
    std::move(cb)(ec, std::move(r));
  }
  milliseconds left() const {
    const auto now = Clock::now();
    return deadline > now ? std::chrono::duration_cast<milliseconds>(deadline - now) : milliseconds(0);
  }
};
using OpPtr = std::shared_ptr<Op>;

milliseconds backoff(int retries) {
  return std::min(milliseconds(10) * (1 << std::min(retries, 4)), milliseconds(100));
}

void log_line(const ClientOptions& o, const std::string& line);

/// The connections' problem log (TLS failures, ...): to the client's log,
/// each line at most once per 30 s across all of one client's connections (a
/// Cluster has two per node, Sentinel opens one per question) — also when
/// several alternate, as an ACL's refusals of keys (the command connection)
/// and of channels (the subscriber) do.
std::function<void(const std::string&)> connection_log(const ClientOptions& o) {
  struct Told {
    std::mutex mu;
    std::map<std::string, Clock::time_point> at;  ///< lines told within the last 30 s
  };
  static constexpr auto kQuiet = std::chrono::seconds(30);
  static constexpr std::size_t kMost = 64;  // distinct lines kept (they name a node and a reason)
  auto told = std::make_shared<Told>();
  return [o, told](const std::string& line) {
    {
      std::lock_guard lock(told->mu);
      const auto now = Clock::now();
      std::erase_if(told->at, [&](const auto& e) { return now - e.second >= kQuiet; });
      if (told->at.contains(line)) return;
      if (told->at.size() < kMost) told->at.emplace(line, now);
    }
    log_line(o, line);
  };
}

ConnectionOptions connection_options(const ClientOptions& o, const Endpoint& ep, bool subscriber) {
  ConnectionOptions c;
  c.log = o.connection_log;
  const char* tls = ep.tls.enabled ? "s" : "";
  if (o.target.kind == Target::Kind::sentinel)
    c.auth_hint = std::string("give the data nodes' password in the URL, redis") + tls +
                  "+sentinel://:PASSWORD@HOST:PORT,.../MASTER_NAME (or USER:PASSWORD@)";
  if (o.target.kind == Target::Kind::cluster)
    c.auth_hint = std::string("give it in the URL, redis") + tls +
                  "+cluster://:PASSWORD@HOST:PORT,... (or USER:PASSWORD@)";
  c.endpoint = ep;
  c.command_timeout = o.command_timeout;
  c.client_name = subscriber ? o.client_name + "-sub" : o.client_name;
  if (subscriber && starts_with(o.client_name, "fairgate:"))
    c.client_name = "fairgate-sub:" + o.client_name.substr(9);
  c.subscriber = subscriber;
  c.check_eviction = !subscriber;
  return c;
}

void log_line(const ClientOptions& o, const std::string& line) {
  if (o.log) {
    o.log(line);
  } else {
    fairgate::log(level_of(line), line);
  }
}

// --- standalone and Sentinel ------------------------------------------------------

class SingleClient : public Client, public std::enable_shared_from_this<SingleClient> {
 public:
  SingleClient(asio::any_io_executor executor, ClientOptions options, Endpoint endpoint)
      : executor_(std::move(executor)), options_(std::move(options)) {
    commands_ = Connection::create(executor_, connection_options(options_, endpoint, false));
    commands_->set_preload(scripts::preload_commands());
    subscriber_ = Connection::create(executor_, connection_options(options_, endpoint, true));
  }

  void set_push_handler(Connection::PushHandler handler) override {
    subscriber_->set_push_handler(std::move(handler));
  }
  void set_resubscribe_handler(std::function<void()> handler) override {
    subscriber_->set_connect_handler(std::move(handler));
  }
  void start() override {
    commands_->start();
    subscriber_->start();
  }
  void close_subscriber() override { subscriber_->close(); }
  void close_after_pending() override {
    // The callback must not own the connection: while it waits (e.g. for a
    // connection that never comes up) it is stored in that connection.
    commands_->exec({"PING"}, [w = std::weak_ptr<Connection>(commands_)](error_code, Reply) {
      if (auto c = w.lock()) c->close();
    });
  }
  void exec(const std::string&, std::vector<std::string> args, Callback callback) override {
    auto op = std::make_shared<Op>();
    op->run = [args = std::move(args)](Connection& c, milliseconds t, bool, Callback done) {
      c.exec(args, std::move(done), t);
    };
    submit(std::move(op), std::move(callback));
  }
  void call_script(const Script& script, const std::vector<std::string>& keys,
                   const std::vector<std::string>& args, Callback callback,
                   std::function<bool()> still_wanted) override {
    auto op = std::make_shared<Op>();
    op->run = [&script, keys, args, still_wanted = std::move(still_wanted)](Connection& c, milliseconds t,
                                                                            bool, Callback done) {
      redis::call_script(c, script, keys, args, std::move(done), still_wanted, t);
    };
    submit(std::move(op), std::move(callback));
  }
  void subscribe(const std::string& channel, Callback callback) override {
    subscriber_->exec({"SSUBSCRIBE", channel}, [self = shared_from_this(), callback = std::move(callback)](
                                                   error_code ec, Reply r) mutable {
      // Without its wake channel a limiter hears of a free seat only at its
      // next heartbeat: said (the ACL, or a server older than 7.0).
      if (!ec && r.is_error()) {
        if (auto line = setup_problem(self->subscriber_->endpoint(), r.str))
          self->options_.connection_log(*line);
        if (denied(r.str)) return std::move(callback)(make_error_code(Error::denied), std::move(r));
      }
      std::move(callback)(ec, std::move(r));
    });
  }
  void drop_subscriber(const std::string&, const char* why) override { subscriber_->drop(why); }
  bool connected(const std::string&) const override { return commands_->connected(); }
  bool all_connected() const override { return commands_->connected() && subscriber_->connected(); }
  std::uint64_t commands_sent() const override {
    return commands_->commands_sent() + subscriber_->commands_sent();
  }
  std::string_view kind() const noexcept override { return "redis"; }

 protected:
  /// A reply saying the server is not (yet) a writable master: the
  /// Sentinel client looks for the master again.
  virtual void on_not_master() {}

  void submit(OpPtr op, Callback callback) {
    op->done.emplace(std::move(callback));
    op->deadline = Clock::now() + options_.command_timeout;
    attempt(std::move(op));
  }

  void attempt(OpPtr op) {
    const auto t = std::max(op->left(), milliseconds(1));
    op->run(*commands_, t, false, [self = shared_from_this(), op](error_code ec, Reply r) {
      if (!ec && retry_later(r, self->options_)) {
        // READONLY (a demoted master), LOADING, MASTERDOWN: it did not run.
        if (starts_with(r.str, "READONLY") || starts_with(r.str, "MASTERDOWN")) self->on_not_master();
        const auto wait = backoff(op->retries++);
        if (op->left() <= wait) return op->finish(make_error_code(Error::not_sent), Reply{});
        op->timer = std::make_shared<asio::steady_timer>(self->executor_, wait);
        op->timer->async_wait([self, op](error_code) { self->attempt(op); });
        return;
      }
      if (!ec && r.is_error() && denied(r.str)) {
        self->options_.connection_log(denied_line(self->commands_->endpoint(), r.str));
        return op->finish(make_error_code(Error::denied), std::move(r));
      }
      op->finish(ec, std::move(r));
    });
  }

  asio::any_io_executor executor_;
  ClientOptions options_;
  std::shared_ptr<Connection> commands_;
  std::shared_ptr<Connection> subscriber_;
};

/// The master a set of Sentinels names: asked at start, after a drop of the
/// command connection and after a READONLY; moved at once on +switch-master.
class SentinelClient final : public SingleClient {
 public:
  SentinelClient(asio::any_io_executor executor, ClientOptions options)
      : SingleClient(executor, options, options.target.nodes.front()),
        strand_(asio::make_strand(executor)),
        retry_timer_(strand_) {}
  ~SentinelClient() override {
    if (events_) events_->close();
  }

  void start() override {
    // Until the sentinels answer, the connections have nowhere to go: they are
    // started by the first discovery (commands wait up to their timeout).
    commands_->set_disconnect_handler([w = weak()] {
      if (auto s = w.lock()) s->discover();
    });
    discover();
  }
  void close_subscriber() override {
    SingleClient::close_subscriber();
    // On the strand, where discovery reads closed_ and sets events_ (the
    // caller is whatever thread shuts the backend down).
    asio::dispatch(strand_, [w = weak()] {
      auto s = w.lock();
      if (!s) return;  // gone: its destructor closed events_
      s->closed_ = true;
      s->retry_timer_.cancel();
      if (s->events_) s->events_->close();
    });
  }
  std::string_view kind() const noexcept override { return "redis-sentinel"; }

 private:
  std::weak_ptr<SentinelClient> weak() {
    return std::static_pointer_cast<SentinelClient>(shared_from_this());
  }
  void on_not_master() override { discover(); }

  void discover() {
    asio::post(strand_, [w = weak()] {
      auto s = w.lock();
      if (!s || s->discovering_ || s->closed_) return;
      s->discovering_ = true;
      s->ask(0);
    });
  }

  /// A connection to sentinel `i`: the sentinels' own credentials (?sentinel_user=,
  /// ?sentinel_password=), never the data node's, and database 0.
  ConnectionOptions sentinel_options(std::size_t i) const {
    ConnectionOptions o;
    o.endpoint = options_.target.sentinel(i);
    o.command_timeout = std::max(options_.command_timeout, milliseconds(200));
    o.connect_timeout = o.command_timeout;
    o.client_name = options_.client_name + "-sentinel";
    o.auth_hint =
        "the sentinels want one of their own: add ?sentinel_password=PASSWORD (and &sentinel_user=USER "
        "for an ACL user) to the redis+sentinel:// URL (docs/redis-cluster.md)";
    return o;
  }

  /// Asks sentinel `i` (then the next ones) for the master's address; when
  /// none names it, says why (each sentinel's answer) and asks again.
  void ask(std::size_t i) {
    if (closed_) return;
    const auto& sentinels = options_.target.nodes;
    if (i == 0) reasons_.clear();
    if (i >= sentinels.size()) {
      std::string line = "Sentinel: no sentinel named master '" + options_.target.master_name + "' (";
      for (std::size_t k = 0; k < reasons_.size(); ++k) {
        if (k) line.append("; ");
        line.append(sentinels[k].host + ":" + std::to_string(sentinels[k].port) + ": " + reasons_[k]);
      }
      line.append("); asking again");
      // Once, and again when the answers change, at most every 30 s (a
      // sentinel that times out one round and refuses the next is no news).
      const auto now = Clock::now();
      if (told_.empty() || (line != told_ && now - told_at_ >= std::chrono::seconds(30))) {
        log_line(options_, line);
        told_ = line;
        told_at_ = now;
      }
      retry_timer_.expires_after(milliseconds(200));
      retry_timer_.async_wait([w = weak()](error_code ec) {
        auto s = w.lock();
        if (ec || !s) return;
        s->ask(0);
      });
      return;
    }
    ConnectionOptions o = sentinel_options(i);
    // What the connection would report (AUTH refused, a password wanted, TLS)
    // becomes this sentinel's reason, told once in the line above.
    auto problem = std::make_shared<std::string>();
    o.log = [problem](const std::string& line) { *problem = line; };
    auto conn = Connection::create(strand_, o);
    conn->start();
    conn->exec({"SENTINEL", "get-master-addr-by-name", options_.target.master_name},
               [w = weak(), conn, i, problem](error_code ec, Reply r) {
                 conn->close();
                 auto s = w.lock();
                 if (!s) return;
                 asio::post(s->strand_, [s, ec, r = std::move(r), i, problem] {
                   // {host, port}; nil (no such master), an error or anything else: the next sentinel.
                   if (const auto address = ec ? std::nullopt : master_address(r))
                     return s->found(i, address->first, address->second);
                   // (NOAUTH, a refused AUTH, TLS: the connection's own line, with the hint.)
                   std::string why;
                   if (!problem->empty()) {
                     why = *problem;
                   } else if (ec) {
                     why = ec.message();
                   } else if (r.is_error()) {
                     why = core::escape_controls(r.str);
                   } else if (r.type == Reply::Type::nil) {
                     why = "does not monitor it";
                   } else {
                     why = "an answer that is not [host, port]";
                   }
                   s->reasons_.push_back(std::move(why));
                   s->ask(i + 1);
                 });
               });
  }

  void found(std::size_t sentinel, const std::string& host, std::uint16_t port) {
    discovering_ = false;
    told_.clear();
    Endpoint ep = options_.target.nodes.front();  // credentials and db of the data node
    ep.host = host;
    ep.port = port;
    const bool moved = !master_ || master_->host != host || master_->port != port;
    const bool first = !master_;
    master_ = ep;
    if (moved) {
      if (!first)
        log_line(options_, "Sentinel: master '" + options_.target.master_name + "' is now " + ep.redacted());
      commands_->set_endpoint(ep);
      subscriber_->set_endpoint(ep);
      if (first) {
        commands_->start();
        subscriber_->start();
      } else {
        commands_->drop("the master moved");
        subscriber_->drop("the master moved");
      }
    }
    if (!events_ && !closed_) watch(sentinel);  // (closed: no more failovers to follow)
  }

  /// SUBSCRIBE +switch-master on one sentinel: a failover moves us at once.
  void watch(std::size_t sentinel) {
    ConnectionOptions o = sentinel_options(sentinel);
    o.subscriber = true;
    o.log = options_.connection_log;
    events_ = Connection::create(strand_, o);
    events_->set_push_handler([w = weak()](Reply m) {
      // ["message", "+switch-master", "<name> <old-ip> <old-port> <new-ip> <new-port>"]
      auto s = w.lock();
      if (!s || m.elements.size() < 3 || m.elements[1].str != "+switch-master") return;
      const std::string& text = m.elements[2].str;
      if (text.rfind(s->options_.target.master_name + " ", 0) != 0) return;
      s->discover();  // asks again: the message says where, the sentinels agree
    });
    const std::string where = o.endpoint.host + ":" + std::to_string(o.endpoint.port);
    events_->set_connect_handler([c = std::weak_ptr<Connection>(events_), w = weak(), where] {
      if (auto conn = c.lock())
        conn->exec({"SUBSCRIBE", "+switch-master"}, [w, where](error_code ec, Reply r) {
          // Refused (an ACL without the channel): a failover is then noticed
          // only when the master stops answering or answers READONLY.
          auto s = w.lock();
          if (!s || ec || !r.is_error()) return;
          s->options_.connection_log("Sentinel at " + where +
                                     " refused SUBSCRIBE +switch-master: " + core::escape_controls(r.str) +
                                     " (a failover is noticed later, when the old master fails; "
                                     "docs/redis-acl.md)");
        });
      if (auto s = w.lock()) s->discover();  // a switch may have been missed meanwhile
    });
    events_->start();
  }

  asio::strand<asio::any_io_executor> strand_;
  asio::steady_timer retry_timer_;
  std::shared_ptr<Connection> events_;
  std::optional<Endpoint> master_;
  bool discovering_ = false;
  std::vector<std::string> reasons_;  ///< why each sentinel asked so far did not name the master
  std::string told_;                  ///< the last "no sentinel named" line logged (empty: none yet)
  Clock::time_point told_at_{};       ///< when
  bool closed_ = false;
};

// --- Cluster ---------------------------------------------------------------------

class ClusterClient final : public Client, public std::enable_shared_from_this<ClusterClient> {
 public:
  static constexpr milliseconds kRefreshEvery{5000};
  static constexpr int kMaxRedirects = 8;

  ClusterClient(asio::any_io_executor executor, ClientOptions options)
      : executor_(executor),
        options_(std::move(options)),
        strand_(asio::make_strand(executor)),
        refresh_timer_(strand_),
        slots_(16384) {}

  ~ClusterClient() override {
    for (auto& [addr, node] : nodes_) {
      node->cmd->close();
      if (node->sub) node->sub->close();
    }
  }

  void set_push_handler(Connection::PushHandler handler) override { push_handler_ = std::move(handler); }
  void set_resubscribe_handler(std::function<void()> handler) override {
    resubscribe_handler_ = std::move(handler);
  }

  void start() override {
    {
      std::lock_guard lock(mu_);
      for (const auto& ep : options_.target.nodes) node_locked(ep);
    }
    refresh();
    schedule_periodic_refresh();
  }

  void close_subscriber() override {
    std::lock_guard lock(mu_);
    subs_closed_ = true;
    for (auto& [addr, node] : nodes_)
      if (node->sub) node->sub->close();
  }

  void close_after_pending() override {
    std::vector<std::shared_ptr<Connection>> conns;
    {
      std::lock_guard lock(mu_);
      closed_ = true;
      for (auto& [addr, node] : nodes_) conns.push_back(node->cmd);
    }
    refresh_timer_.cancel();
    for (auto& c : conns)
      c->exec({"PING"}, [w = std::weak_ptr<Connection>(c)](error_code, Reply) {
        if (auto conn = w.lock()) conn->close();
      });
  }

  void exec(const std::string& key, std::vector<std::string> args, Callback callback) override {
    auto op = std::make_shared<Op>();
    op->key = key;
    op->run = [args = std::move(args)](Connection& c, milliseconds t, bool asking, Callback done) {
      c.exec(args, std::move(done), t, asking);
    };
    submit(std::move(op), std::move(callback));
  }

  void call_script(const Script& script, const std::vector<std::string>& keys,
                   const std::vector<std::string>& args, Callback callback,
                   std::function<bool()> still_wanted) override {
    auto op = std::make_shared<Op>();
    op->key = keys.empty() ? std::string() : keys.front();
    op->run = [&script, keys, args, still_wanted = std::move(still_wanted)](Connection& c, milliseconds t,
                                                                            bool asking, Callback done) {
      redis::call_script(c, script, keys, args, std::move(done), still_wanted, t, asking);
    };
    submit(std::move(op), std::move(callback));
  }

  void subscribe(const std::string& channel, Callback callback) override {
    auto op = std::make_shared<Op>();
    op->key = channel;
    op->on_sub = true;
    op->run = [channel](Connection& c, milliseconds t, bool, Callback done) {
      c.exec({"SSUBSCRIBE", channel}, std::move(done), t);
    };
    {
      std::lock_guard lock(mu_);
      channels_.insert(channel);
    }
    // A subscription that failed (no map yet, a node down, a moved slot) is
    // tried again after the next map refresh: no reconnect would bring it back.
    submit(std::move(op),
           [w = weak_from_this(), callback = std::move(callback)](error_code ec, Reply r) mutable {
             if (ec || r.is_error()) {
               if (auto s = w.lock(); s && ec != make_error_code(Error::closed)) {
                 s->resubscribe_after_refresh_ = true;
                 s->refresh_soon();
               }
             }
             std::move(callback)(ec, std::move(r));
           });
  }

  void drop_subscriber(const std::string& channel, const char* why) override {
    std::shared_ptr<Connection> sub;
    {
      std::lock_guard lock(mu_);
      if (auto node = slots_[key_slot(channel)]) sub = node->sub;
    }
    if (sub) sub->drop(why);
  }

  bool connected(const std::string& key) const override {
    std::lock_guard lock(mu_);
    auto node = slots_[key_slot(key)];
    return node && node->cmd->connected();
  }

  bool all_connected() const override {
    std::lock_guard lock(mu_);
    if (!mapped_) return false;
    std::set<const Node*> owners;
    for (const auto& n : slots_)
      if (n) owners.insert(n.get());
    for (const Node* n : owners) {
      if (!n->cmd->connected() || (n->sub && !n->sub->connected())) return false;
    }
    return true;
  }

  std::uint64_t commands_sent() const override {
    std::lock_guard lock(mu_);
    std::uint64_t n = 0;
    for (const auto& [addr, node] : nodes_) {
      n += node->cmd->commands_sent();
      if (node->sub) n += node->sub->commands_sent();
    }
    return n;
  }

  std::string_view kind() const noexcept override { return "redis-cluster"; }

 private:
  struct Node {
    Endpoint endpoint;
    std::string addr;
    std::shared_ptr<Connection> cmd;
    std::shared_ptr<Connection> sub;  // created by the first SSUBSCRIBE routed here
  };
  using NodePtr = std::shared_ptr<Node>;

  static std::string addr_of(const Endpoint& ep) { return ep.host + ":" + std::to_string(ep.port); }

  NodePtr node_locked(const Endpoint& where) {
    Endpoint ep = options_.target.nodes.front();  // the URL's credentials on every node
    ep.host = where.host;
    ep.port = where.port;
    ep.db = 0;
    const std::string addr = addr_of(ep);
    auto& slot = nodes_[addr];
    if (slot) return slot;
    slot = std::make_shared<Node>();
    slot->endpoint = ep;
    slot->addr = addr;
    slot->cmd = Connection::create(executor_, connection_options(options_, ep, false));
    slot->cmd->set_preload(scripts::preload_commands());
    slot->cmd->set_disconnect_handler([w = weak_from_this()] {
      if (auto s = w.lock()) s->refresh();
    });
    slot->cmd->start();
    return slot;
  }

  /// The node's Pub/Sub connection (mu_ held).
  std::shared_ptr<Connection> sub_locked(const NodePtr& node) {
    if (node->sub) return node->sub;
    node->sub = Connection::create(executor_, connection_options(options_, node->endpoint, true));
    auto w = weak_from_this();
    node->sub->set_push_handler([w](Reply m) {
      auto s = w.lock();
      if (!s) return;
      if (!m.elements.empty() && m.elements[0].str == "sunsubscribe") {
        // The node lost the channel's slot: find where it went, subscribe there.
        s->resubscribe_after_refresh_ = true;
        s->refresh();
        return;
      }
      if (s->push_handler_) s->push_handler_(std::move(m));
    });
    node->sub->set_connect_handler([w, first = std::make_shared<bool>(true)] {
      if (*first) {
        *first = false;  // the first SSUBSCRIBE was queued on it already
        return;
      }
      if (auto s = w.lock()) s->resubscribe();
    });
    if (subs_closed_) {
      node->sub->close();
    } else {
      node->sub->start();
    }
    return node->sub;
  }

  void resubscribe() {
    if (resubscribe_handler_) resubscribe_handler_();
  }

  void submit(OpPtr op, Callback callback) {
    op->done.emplace(std::move(callback));
    op->deadline = Clock::now() + options_.command_timeout;
    attempt(std::move(op));
  }

  /// Sends `op` to the owner of its slot (or `to`, after ASK), or waits for the map.
  void attempt(OpPtr op, NodePtr to = nullptr, bool asking = false) {
    std::shared_ptr<Connection> conn;
    {
      std::lock_guard lock(mu_);
      NodePtr node = to ? to : slots_[key_slot(op->key)];
      if (!node) {
        // No map yet (or the slot is not covered): wait for a refresh.
        waiting_.push_back(op);
        arm_expiry_locked(op);
      } else {
        conn = op->on_sub ? sub_locked(node) : node->cmd;
      }
    }
    if (!conn) {
      refresh();
      return;
    }
    const auto t = std::max(op->left(), milliseconds(1));
    op->run(*conn, t, asking,
            [self = shared_from_this(), op, from = std::weak_ptr<Connection>(conn)](error_code ec, Reply r) {
              self->on_reply(op, from, ec, std::move(r));
            });
  }

  void on_reply(const OpPtr& op, const std::weak_ptr<Connection>& from, error_code ec, Reply r) {
    if (ec) {
      // Lost connection or none: the map may have changed (failover).
      if (ec != make_error_code(Error::timeout) && ec != make_error_code(Error::closed)) refresh();
      return op->finish(ec, std::move(r));
    }
    if (!r.is_error()) return op->finish(ec, std::move(r));
    const bool moved = starts_with(r.str, "MOVED ");
    const bool ask = starts_with(r.str, "ASK ");
    if ((moved || ask) && op->redirects < kMaxRedirects) {
      // "MOVED <slot> <host>:<port>"
      const auto sp1 = r.str.find(' ');
      const auto sp2 = r.str.find(' ', sp1 + 1);
      const std::string where = sp2 == std::string::npos ? std::string() : r.str.substr(sp2 + 1);
      const auto colon = where.rfind(':');
      unsigned port = 0;
      const std::string p = colon == std::string::npos ? std::string() : where.substr(colon + 1);
      if (colon != std::string::npos &&
          std::from_chars(p.data(), p.data() + p.size(), port).ec == std::errc{} && port > 0 &&
          port <= 65535) {
        Endpoint ep;
        ep.host = where.substr(0, colon);
        if (ep.host.empty()) ep.host = options_.target.nodes.front().host;
        ep.port = static_cast<std::uint16_t>(port);
        ++op->redirects;
        NodePtr node;
        {
          std::lock_guard lock(mu_);
          node = node_locked(ep);
          if (moved) slots_[key_slot(op->key)] = node;
        }
        if (moved) {
          refresh();
          if (op->on_sub) resubscribe_after_refresh_ = true;
        }
        if (op->left().count() <= 0) return op->finish(make_error_code(Error::not_sent), Reply{});
        return attempt(op, node, ask);
      }
    }
    if (retry_later(r, options_) || moved || ask) {
      // TRYAGAIN (a multi-key call while its slot migrates), CLUSTERDOWN (a
      // failover in progress), LOADING...: it did not run. Again, a little later.
      if (starts_with(r.str, "CLUSTERDOWN") || starts_with(r.str, "READONLY")) refresh();
      const auto wait = backoff(op->retries++);
      if (op->left() <= wait) return op->finish(make_error_code(Error::not_sent), Reply{});
      op->timer = std::make_shared<asio::steady_timer>(executor_, wait);
      op->timer->async_wait([self = shared_from_this(), op](error_code) { self->attempt(op); });
      return;
    }
    // The ACL (any call), or a server older than 7.0 (the wake subscription):
    // said with the node (its endpoint is copied only here, off the path of
    // the calls Redis answers).
    if (denied(r.str) || op->on_sub) {
      if (const auto c = from.lock())  // (the reply came on it: it is there)
        if (auto line = setup_problem(c->endpoint(), r.str)) options_.connection_log(*line);
      if (denied(r.str)) return op->finish(make_error_code(Error::denied), std::move(r));
    }
    op->finish(ec, std::move(r));
  }

  /// Ops waiting for the map leave with not_sent at their deadline.
  void arm_expiry_locked(const OpPtr& op) {
    op->timer = std::make_shared<asio::steady_timer>(executor_, op->deadline);
    op->timer->async_wait([w = weak_from_this(), op](error_code ec) {
      if (ec) return;
      auto s = w.lock();
      if (!s) return;
      {
        std::lock_guard lock(s->mu_);
        auto it = std::find(s->waiting_.begin(), s->waiting_.end(), op);
        if (it == s->waiting_.end()) return;
        s->waiting_.erase(it);
      }
      op->finish(make_error_code(Error::not_sent), Reply{});
    });
  }

  void schedule_periodic_refresh() {
    refresh_timer_.expires_after(kRefreshEvery);
    refresh_timer_.async_wait([w = weak_from_this()](error_code ec) {
      if (ec) return;
      if (auto s = w.lock()) {
        s->refresh();
        s->schedule_periodic_refresh();
      }
    });
  }

  /// A refresh in a little while (not at once: a failing node is not asked in a loop).
  void refresh_soon() {
    auto t = std::make_shared<asio::steady_timer>(strand_, milliseconds(100));
    t->async_wait([w = weak_from_this(), t](error_code) {
      if (auto s = w.lock()) s->refresh();
    });
  }

  /// CLUSTER SLOTS from one node after the other until one answers.
  void refresh() {
    asio::post(strand_, [w = weak_from_this()] {
      auto s = w.lock();
      if (!s) return;
      if (s->refreshing_) {
        s->refresh_again_ = true;
        return;
      }
      s->refreshing_ = true;
      std::vector<NodePtr> candidates;
      {
        std::lock_guard lock(s->mu_);
        if (s->closed_) {
          s->refreshing_ = false;
          return;
        }
        // Connected nodes first, then the rest (seeds included).
        for (auto& [addr, n] : s->nodes_)
          if (n->cmd->connected()) candidates.push_back(n);
        for (auto& [addr, n] : s->nodes_)
          if (!n->cmd->connected()) candidates.push_back(n);
      }
      s->ask_slots(std::move(candidates), 0);
    });
  }

  void ask_slots(std::vector<NodePtr> candidates, std::size_t i) {
    if (i >= candidates.size()) {
      if (!warned_) log_line(options_, "Redis Cluster: no node answered CLUSTER SLOTS; trying again");
      warned_ = true;
      refreshing_ = false;
      // Try again soon while commands wait for a map.
      bool waiting = false;
      {
        std::lock_guard lock(mu_);
        waiting = !waiting_.empty() || !mapped_;
      }
      if (waiting || resubscribe_after_refresh_) refresh_soon();
      return;
    }
    auto node = candidates[i];
    node->cmd->exec(
        {"CLUSTER", "SLOTS"},
        [w = weak_from_this(), candidates = std::move(candidates), i, node](error_code ec, Reply r) mutable {
          auto s = w.lock();
          if (!s) return;
          asio::post(s->strand_, [s, candidates = std::move(candidates), i, node, ec,
                                  r = std::move(r)]() mutable {
            if (ec || r.type != Reply::Type::array || r.elements.empty()) {
              if (!ec && r.is_error() && !s->told_not_cluster_) {
                s->told_not_cluster_ = true;
                const bool denied = starts_with(r.str, "NOPERM");
                log_line(s->options_, "Redis Cluster: " + node->endpoint.redacted() +
                                          " answered CLUSTER SLOTS with: " + r.excerpt() +
                                          (denied ? " (the user needs +cluster|slots: docs/redis-acl.md)"
                                                  : " (is it a cluster node? redis+cluster:// needs one)"));
              }
              return s->ask_slots(std::move(candidates), i + 1);
            }
            s->apply_slots(node, r);
          });
        },
        std::max(options_.command_timeout, milliseconds(200)));
  }

  /// [[start, end, [host, port, id, ...], replicas...], ...]
  void apply_slots(const NodePtr& from, const Reply& r) {
    std::vector<OpPtr> retry;
    bool moved_subs = false;
    {
      std::lock_guard lock(mu_);
      std::vector<NodePtr> next(16384);
      for (const auto& range : slot_ranges(r, from->endpoint.host)) {
        Endpoint ep;
        ep.host = range.host;
        ep.port = range.port;
        auto node = node_locked(ep);
        for (auto s = range.first; s <= range.last; ++s) next[s] = node;
      }
      for (std::size_t s = 0; s < next.size(); ++s) {
        if (next[s] != slots_[s] && next[s]) {
          // A subscribed channel's slot changed owner: subscribe there.
          if (!moved_subs && slots_[s]) {
            for (const auto& ch : channels_) {
              if (key_slot(ch) == s) {
                moved_subs = true;
                break;
              }
            }
          }
          slots_[s] = next[s];
        }
      }
      mapped_ = true;
      retry.swap(waiting_);
    }
    warned_ = false;
    refreshing_ = false;
    for (auto& op : retry) {
      if (op->timer) op->timer->cancel();
      attempt(op);
    }
    if (moved_subs || resubscribe_after_refresh_.exchange(false)) resubscribe();
    if (refresh_again_) {
      refresh_again_ = false;
      refresh();
    }
  }

  asio::any_io_executor executor_;
  const ClientOptions options_;
  asio::strand<asio::any_io_executor> strand_;  // refreshes
  asio::steady_timer refresh_timer_;
  Connection::PushHandler push_handler_;
  std::function<void()> resubscribe_handler_;

  mutable std::mutex mu_;
  std::map<std::string, NodePtr> nodes_;
  std::vector<NodePtr> slots_;
  std::vector<OpPtr> waiting_;
  std::set<std::string> channels_;
  bool mapped_ = false;
  bool closed_ = false;
  bool subs_closed_ = false;

  // On strand_:
  bool refreshing_ = false;
  bool refresh_again_ = false;
  bool warned_ = false;
  bool told_not_cluster_ = false;
  std::atomic<bool> resubscribe_after_refresh_{false};
};

}  // namespace

std::shared_ptr<Client> make_client(asio::any_io_executor executor, ClientOptions options) {
  options.connection_log = connection_log(options);
  switch (options.target.kind) {
    case Target::Kind::cluster:
      return std::make_shared<ClusterClient>(std::move(executor), std::move(options));
    case Target::Kind::sentinel:
      return std::make_shared<SentinelClient>(std::move(executor), std::move(options));
    case Target::Kind::standalone: break;
  }
  const Endpoint ep = options.target.nodes.front();
  return std::make_shared<SingleClient>(std::move(executor), std::move(options), ep);
}

}  // namespace fairgate::redis
