#include "faults/harness.hpp"
#include "support/holders_key.hpp"

#include <boost/json.hpp>

#include <fmt/format.h>

#include <signal.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <tuple>

namespace fairgate::faults {

namespace json = boost::json;

std::string fairgate_binary() {
  if (const char* bin = std::getenv("FAIRGATE_BIN"); bin && *bin) return bin;
  return FAIRGATE_DEFAULT_BIN;
}

std::size_t max_concurrent(std::vector<std::pair<std::int64_t, std::int64_t>> intervals) {
  std::vector<std::pair<std::int64_t, int>> points;
  points.reserve(intervals.size() * 2);
  for (const auto& [g, r] : intervals) {
    points.emplace_back(g, +1);
    points.emplace_back(r, -1);
  }
  // At equal times the release comes first: a hand-off is not an overlap.
  std::sort(points.begin(), points.end());
  std::size_t now = 0, most = 0;
  for (const auto& [t, d] : points) {
    now = static_cast<std::size_t>(static_cast<long>(now) + d);
    most = std::max(most, now);
  }
  return most;
}

// --- Refusing -------------------------------------------------------------------

namespace {

constexpr const char* kProbe = "fairgate-faults:probe";

const char* answer_of(Refusal kind) {
  switch (kind) {
    case Refusal::oom: return "OOM";
    case Refusal::misconf: return "MISCONF";
    case Refusal::noreplicas: return "NOREPLICAS";
    case Refusal::busy: return "BUSY";
  }
  return "?";
}

void expect_ok(test::RedisServer& redis, const std::vector<std::string>& args) {
  const std::string r = redis.command(args);
  if (r != "OK") throw std::runtime_error(fmt::format("Refusing: {} answered {}", args.front(), r));
}

}  // namespace

test::RedisServer::Options refusal_redis_options() {
  test::RedisServer::Options o;
  o.extra_args = {"--enable-protected-configs", "yes"};
  return o;
}

Refusing::Refusing(Cluster& c, Refusal kind) : c_(c), kind_(kind) {
  auto& redis = c_.redis();
  switch (kind_) {
    case Refusal::oom:
      expect_ok(redis, {"CONFIG", "SET", "maxmemory-policy", "noeviction"});
      expect_ok(redis, {"CONFIG", "SET", "maxmemory", "1"});
      break;
    case Refusal::misconf: {
      const std::string dir = redis.command({"CONFIG", "GET", "dir"});  // "dir\n<path>"
      dir_ = dir.substr(dir.find('\n') + 1);
      expect_ok(redis, {"CONFIG", "SET", "save", "3600 1"});  // MISCONF needs save points
      expect_ok(redis, {"CONFIG", "SET", "dir", "/proc"});    // where no snapshot can be written
      redis.command({"BGSAVE"});
      break;
    }
    case Refusal::noreplicas: expect_ok(redis, {"CONFIG", "SET", "min-replicas-to-write", "1"}); break;
    case Refusal::busy:
      expect_ok(redis, {"CONFIG", "SET", "busy-reply-threshold", "100"});
      runaway_ = std::thread([this] {
        script_end_ = c_.redis().command({"EVAL", "while true do end", "0"}, std::chrono::seconds(60));
      });
      break;
  }
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (redis.command({"SET", kProbe, "x"}).find(answer_of(kind_)) == std::string::npos) {
    if (Clock::now() > until) {
      lift();
      throw std::runtime_error(
          fmt::format("Refusing: writes were not refused with {} within 10 s", answer_of(kind_)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void Refusing::lift() {
  if (ended_) return;
  ended_ = true;
  auto& redis = c_.redis();
  switch (kind_) {
    case Refusal::oom: redis.command({"CONFIG", "SET", "maxmemory", "0"}); break;
    case Refusal::misconf:
      redis.command({"CONFIG", "SET", "dir", dir_});
      redis.command({"SAVE"});  // a snapshot that works: MISCONF over
      redis.command({"CONFIG", "SET", "save", ""});
      break;
    case Refusal::noreplicas: redis.command({"CONFIG", "SET", "min-replicas-to-write", "0"}); break;
    case Refusal::busy:
      redis.command({"SCRIPT", "KILL"});
      if (runaway_.joinable()) runaway_.join();
      break;
  }
}

void Refusing::end() {
  lift();
  if (kind_ == Refusal::busy && script_end_.find("Script killed") == std::string::npos)
    throw std::runtime_error("Refusing: the looping script was not killed: " + script_end_);
  const std::string r = c_.redis().command({"SET", kProbe, "x"});
  if (r != "OK")
    throw std::runtime_error(
        fmt::format("Refusing: {} is over, yet a write answers {}", answer_of(kind_), r));
  c_.redis().command({"DEL", kProbe});
}

Refusing::~Refusing() { lift(); }

// --- Worker ------------------------------------------------------------------

Worker::Worker(const std::string& executable, bench::WorkerOptions options, std::vector<std::string> prefix)
    : options_(std::move(options)) {
  auto argv = bench::worker_argv(executable, options_);
  prefix.insert(prefix.end(), argv.begin(), argv.end());
  // Its stderr (one line per state change) shows in the test's output.
  child_ = std::make_unique<bench::Child>(std::move(prefix));
}

void Worker::kill9() {
  if (kill_ns_) return;
  child_->kill(SIGKILL);
  kill_ns_ = bench::now_ns();
  child_->wait(std::chrono::seconds(10));
  // Everything it wrote before dying (records of requests it ended, grants):
  // read up to the end of its output.
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (!child_->drained() && Clock::now() < deadline) {
    if (auto line = child_->next_line(milliseconds(50))) take(*line);
  }
}

void Worker::take(const std::string& line) {
  if (auto record = bench::request_from_json(line)) {
    records_.push_back(std::move(*record));
    return;
  }
  boost::system::error_code ec;
  json::value v = json::parse(line, ec);
  if (ec || !v.is_object()) return;
  json::object& o = v.get_object();
  const auto* ev = o.if_contains("ev");
  if (!ev || !ev->is_string()) return;
  if (ev->get_string() == "grant" || ev->get_string() == "release") {
    auto& to = ev->get_string() == "grant" ? grants_ : releases_;
    to[static_cast<std::uint64_t>(o.at("i").to_number<std::int64_t>())] = o.at("t").to_number<std::int64_t>();
    return;
  }
  if (ev->get_string() == "done") requests_ = o.at("requests").to_number<std::uint64_t>();
  events_.push_back(std::move(o));
}

void Worker::drain() {
  while (auto line = child_->next_line(milliseconds(0))) take(*line);
}

std::optional<json::object> Worker::wait_event(const std::string& ev, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    for (auto it = events_.begin(); it != events_.end(); ++it) {
      if (it->at("ev").get_string() == ev) {
        json::object found = std::move(*it);
        events_.erase(it);
        return found;
      }
    }
    const auto now = Clock::now();
    if (now >= deadline || child_->drained()) return std::nullopt;
    if (auto line = child_->next_line(std::chrono::duration_cast<milliseconds>(deadline - now))) take(*line);
  }
}

std::optional<json::object> Worker::status(milliseconds timeout) {
  if (killed()) return std::nullopt;
  send("status");
  return wait_event("status", timeout);
}

bool Worker::exit(milliseconds timeout) {
  if (killed()) return true;
  send("exit");
  child_->close_stdin();
  const auto deadline = Clock::now() + timeout;
  while (!child_->drained() && Clock::now() < deadline) {
    if (auto line = child_->next_line(milliseconds(50))) take(*line);
  }
  const bool clean = child_
                         ->wait(std::chrono::duration_cast<milliseconds>(
                             std::max(Clock::duration(0), deadline - Clock::now()) + milliseconds(100)))
                         .has_value();
  drain();
  return clean;
}

// --- Report ------------------------------------------------------------------

std::string Report::summary() const {
  std::string s = fmt::format(
      "{} instances ({} killed), {} requests: {} granted, {} timed out, {} cancelled, {} rejected ({} "
      "unavailable); "
      "most holders at once {} (overshoot {}); requests lost {}; Redis after: {} holders, {} waiters",
      instances, killed, requests, grants, timeouts, cancels, rejections, unavailable, max_holders, overshoot,
      lost, redis_holders, redis_waiters);
  for (const auto& p : problems) s += "\n  problem: " + p;
  return s;
}

// --- Cluster -----------------------------------------------------------------

Cluster::Cluster(RunOptions options, test::RedisServer::Options redis, bool with_netns)
    : options_(std::move(options)) {
  if (redis.bind.empty()) redis.bind = {"127.0.0.1"};
  if (with_netns) {
    netns_ = std::make_unique<test::NetNamespace>();
    redis.bind.push_back(netns_->host_address());
  }
  redis_ = std::make_unique<test::RedisServer>(std::move(redis));
}

Cluster::~Cluster() {
  // Instances first (they would fill their logs with a Redis that goes away).
  workers_.clear();
  proxy_.reset();
  redis_.reset();
  netns_.reset();
}

test::TcpProxy& Cluster::proxy() {
  if (!proxy_) proxy_ = std::make_unique<test::TcpProxy>(redis_->host(), redis_->port());
  return *proxy_;
}

test::NetNamespace& Cluster::netns() {
  if (!netns_) throw std::logic_error("Cluster::netns(): construct the Cluster with a namespace");
  return *netns_;
}

std::string Cluster::key(const std::string& what) const {
  return "faults:{" + options_.limiter + "}:" + what;
}

std::set<std::string> Cluster::permit_ids(const std::string& what) {
  // Members start with the permit id "inst|n" (docs/redis-schema.md).
  std::set<std::string> ids;
  std::istringstream in(redis_->command({"ZRANGE", key(what), "0", "-1"}));
  for (std::string member; std::getline(in, member);) {
    const auto first = member.find('|');
    if (first != std::string::npos) ids.insert(member.substr(0, member.find('|', first + 1)));
  }
  return ids;
}

long Cluster::zcard(const std::string& what) {
  const std::string r = redis_->command(fairgate::test::count_command(key(what)));
  try {
    return std::stol(r);
  } catch (...) {
    return -1;
  }
}

Worker& Cluster::start(Route route, std::optional<RunOptions> override) {
  const RunOptions& o = override ? *override : options_;
  bench::WorkerOptions w;
  w.key_prefix = "faults";
  w.limiter = o.limiter;
  w.instance_id = fmt::format("{}-i{}", o.limiter, ++started_);
  w.max_concurrent = o.cap;
  w.heartbeat_interval = o.heartbeat;
  w.liveness_ttl = o.ttl;
  w.command_timeout = o.command_timeout;
  w.recovery_fence = o.fence;
  w.degrade_after = o.degrade_after;
  w.recover_after = o.recover_after;
  w.on_redis_down = o.policy;
  w.local_share = o.local_share;
  if (o.tenant_per_instance) w.tenant = fmt::format("t{}", started_);
  w.tenant_fairness = o.tenant_fairness;
  w.max_per_tenant = o.max_per_tenant;
  w.clients = o.clients;
  w.closed_loop = o.clients > 0;
  w.duration = o.duration;
  w.hold_min = o.hold_min;
  w.hold_max = o.hold_max;
  w.max_wait = o.max_wait;
  w.seed = 7919 * started_;
  w.announce = true;
  std::vector<std::string> prefix;
  switch (route) {
    case Route::direct: w.redis_url = redis_->url(); break;
    case Route::proxy: w.redis_url = fmt::format("redis://127.0.0.1:{}", proxy().port()); break;
    case Route::netns:
      netns();  // throws without one
      prefix = netns_->exec_prefix();
      w.redis_url = fmt::format("redis://{}:{}", netns_->host_address(), redis_->port());
      break;
  }
  workers_.push_back(std::make_unique<Worker>(fairgate_binary(), w, std::move(prefix)));
  Worker& worker = *workers_.back();
  if (!worker.wait_event("ready", std::chrono::seconds(20)))
    throw std::runtime_error("instance " + worker.id() + " did not get ready (is Redis reachable?)");
  return worker;
}

void Cluster::go() {
  for (auto* w : live()) w->send("go");
}

std::vector<Worker*> Cluster::live() {
  std::vector<Worker*> out;
  for (auto& w : workers_)
    if (!w->killed()) out.push_back(w.get());
  return out;
}

std::vector<Worker*> Cluster::all() {
  std::vector<Worker*> out;
  for (auto& w : workers_) out.push_back(w.get());
  return out;
}

std::optional<milliseconds> Cluster::wait_whole(milliseconds timeout) {
  const auto t0 = Clock::now();
  const auto deadline = t0 + timeout;
  while (Clock::now() < deadline) {
    // Redis must have exactly the permits and waiters of the instances (by id,
    // not merely as many: after a restart from an older snapshot the counts
    // can match while the permits differ).
    bool whole = true;
    std::set<std::string> holders, waiters;
    for (auto* w : live()) {
      const auto st = w->status(milliseconds(2000));
      if (!st || st->at("degraded").as_bool()) {
        whole = false;
        break;
      }
      for (const auto& id : st->at("held").as_array()) holders.insert(std::string(id.as_string()));
      for (const auto& id : st->at("waiting").as_array()) waiters.insert(std::string(id.as_string()));
    }
    const bool tenant_aware = options_.tenant_fairness || options_.max_per_tenant;
    if (whole && permit_ids("holders") == holders && permit_ids("queue") == waiters &&
        (!tenant_aware || unplaced_tenant().empty()))
      return std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
    std::this_thread::sleep_for(milliseconds(20));
  }
  return std::nullopt;
}

std::string Cluster::unplaced_tenant() {
  // A queue member is "inst|n|deadline:arrived|weight|tenant" (docs/redis-schema.md).
  const std::string t = redis().command(
      {"EVAL",
       "for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do "
       "local t = string.match(m, '^[^|]*|[^|]*|[^|]*|[^|]*|(.*)$') or '' "
       "if redis.call('ZSCORE', KEYS[2], t) == false and redis.call('SISMEMBER', KEYS[3], t) == 0 then "
       "return 'tenant ' .. t end end return ''",
       "3", key("queue"), key("tready"), key("tparked")});
  return t.empty() || t == "(nil)" ? std::string() : t;
}

Report Cluster::finish(milliseconds timeout, bool expect_unavailable, bool overshoot_allowed) {
  Report r;
  const auto deadline = Clock::now() + timeout;
  std::optional<std::int64_t> last_kill;
  for (auto& w : workers_) {
    if (w->kill_ns()) last_kill = std::max(last_kill.value_or(0), *w->kill_ns());
  }
  for (auto* w : live()) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (!w->wait_event("done", std::max(left, milliseconds(1))))
      r.problems.push_back(
          fmt::format("{}: no 'done' in time: requests that never ended (stranded)", w->id()));
  }
  // Killed instances are reaped by the live ones' heartbeats: give them
  // the TTL and a few beats after the last kill.
  if (last_kill) {
    const auto reaped_by =
        *last_kill +
        std::chrono::duration_cast<std::chrono::nanoseconds>(options_.ttl + 3 * options_.heartbeat).count();
    while (bench::now_ns() < reaped_by) std::this_thread::sleep_for(milliseconds(20));
  }
  // No fault may look like a second process with an instance's id (RedisLimiter's check).
  for (auto* w : live()) {
    const auto st = w->status(milliseconds(2000));
    const auto shared = st ? st->at("instance_id_shared").to_number<std::int64_t>() : 0;
    if (shared != 0)
      r.problems.push_back(fmt::format(
          "{}: took the fault for another process with its instance id ({} heartbeats)", w->id(), shared));
  }
  for (auto* w : live()) {
    if (!w->exit(std::chrono::seconds(20))) r.problems.push_back(w->id() + ": did not exit cleanly");
  }
  // Redis is empty once everybody left (exits cancel and release; their
  // last commands may still be in flight for a moment).
  const auto empty_by = Clock::now() + std::chrono::seconds(5);
  do {
    r.redis_holders = zcard("holders");
    r.redis_waiters = zcard("queue");
    if (r.redis_holders == 0 && r.redis_waiters == 0) break;
    std::this_thread::sleep_for(milliseconds(20));
  } while (Clock::now() < empty_by);
  if (r.redis_holders != 0 || r.redis_waiters != 0)
    r.problems.push_back(fmt::format("Redis not empty after everyone left: {} holders, {} waiters",
                                     r.redis_holders, r.redis_waiters));

  std::vector<std::pair<std::int64_t, std::int64_t>> intervals;
  std::vector<std::tuple<std::string, std::int64_t, std::int64_t>> labelled;
  for (auto& w : workers_) {
    ++r.instances;
    if (w->killed()) ++r.killed;
    std::map<std::uint64_t, int> ends;
    std::set<std::uint64_t> released;
    for (const auto& rec : w->records()) {
      ++ends[rec.index];
      ++r.requests;
      if (rec.granted()) {
        ++r.grants;
        intervals.emplace_back(rec.grant_ns, rec.release_ns ? rec.release_ns : rec.grant_ns);
        labelled.emplace_back(fmt::format("{}#{}", w->id(), rec.index), intervals.back().first,
                              intervals.back().second);
        released.insert(rec.index);
      } else if (rec.outcome == "timed_out") {
        ++r.timeouts;
      } else if (rec.outcome == "cancelled") {
        ++r.cancels;
      } else {
        ++r.rejections;
        if (rec.reason == "unavailable") ++r.unavailable;
      }
    }
    // A killed instance held what it announced until it announced the
    // release (its record may have died in its output buffer), or until the kill.
    for (const auto& [i, t] : w->grants()) {
      if (released.count(i) || !w->kill_ns()) continue;
      const auto rel = w->releases().find(i);
      const std::int64_t until = rel != w->releases().end() ? rel->second : *w->kill_ns();
      intervals.emplace_back(t, until);
      labelled.emplace_back(fmt::format("{}#{} (killed)", w->id(), i), t, until);
    }
    if (w->killed()) continue;
    for (const auto& [i, n] : ends) {
      if (n != 1) ++r.lost;
    }
    const std::uint64_t started = w->requests().value_or(0);
    for (std::uint64_t i = 0; i < started; ++i) {
      if (!ends.count(i)) ++r.lost;
    }
    if (!w->requests()) r.lost += 1;  // unknown how many: at least one did not end
  }
  r.max_holders = max_concurrent(intervals);
  r.overshoot = r.max_holders > options_.cap ? r.max_holders - options_.cap : 0;
  if (r.overshoot > 0 && !overshoot_allowed) {
    // Who held at the worst moment (ns relative to the earliest grant).
    std::int64_t first = INT64_MAX;
    for (const auto& iv : intervals) first = std::min(first, iv.first);
    // The first moment above the cap, and everyone holding then.
    std::int64_t worst = 0;
    for (const auto& [label, g, rel] : labelled) {
      std::size_t at = 0;
      for (const auto& [g2, r2] : intervals) at += (g2 <= g && g < r2) ? 1 : 0;
      if (at > options_.cap) {
        worst = g;
        break;
      }
    }
    std::string who;
    for (const auto& [label, g, rel] : labelled) {
      if (g <= worst && worst < rel)
        who += fmt::format(" [{} granted {:.1f} ms, released {:.1f} ms]", label, (g - first) / 1e6,
                           (rel - first) / 1e6);
    }
    r.problems.push_back(fmt::format("overshoot: {} holders at once with cap {}; grants above the cap:{}",
                                     r.max_holders, options_.cap, who));
  }
  if (r.lost > 0) r.problems.push_back(fmt::format("{} request(s) did not end exactly once", r.lost));
  if (r.timeouts > 0)
    r.problems.push_back(
        fmt::format("{} request(s) timed out (max wait {} ms)", r.timeouts, options_.max_wait.count()));
  if (r.unavailable > 0 && !expect_unavailable)
    r.problems.push_back(
        fmt::format("{} request(s) rejected 'unavailable': a Redis fault became a rejection", r.unavailable));
  if (r.rejections > r.unavailable)
    r.problems.push_back(
        fmt::format("{} request(s) rejected for another reason", r.rejections - r.unavailable));
  return r;
}

}  // namespace fairgate::faults
