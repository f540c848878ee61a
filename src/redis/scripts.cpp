#include "redis/scripts.hpp"

#include <boost/uuid/detail/sha1.hpp>

#include <cstdio>

namespace fairgate::redis {

namespace {

std::string sha1_hex(std::string_view text) {
  boost::uuids::detail::sha1 sha;
  sha.process_bytes(text.data(), text.size());
  unsigned int digest[5];  // Boost 1.81: five 32-bit words, big-endian order
  sha.get_digest(digest);
  char hex[41];
  for (int i = 0; i < 5; ++i) std::snprintf(hex + i * 8, 9, "%08x", digest[i]);
  return std::string(hex, 40);
}

std::vector<std::string> command(std::string_view verb, std::string_view script_or_sha,
                                 const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  std::vector<std::string> argv;
  argv.reserve(3 + keys.size() + args.size());
  argv.emplace_back(verb);
  argv.emplace_back(script_or_sha);
  argv.push_back(std::to_string(keys.size()));
  argv.insert(argv.end(), keys.begin(), keys.end());
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

}  // namespace

Script::Script(std::string_view name, std::string_view text)
    : name_(name), text_(text), sha_(sha1_hex(text)) {}

namespace scripts {
std::vector<std::vector<std::string>> preload_commands() {
  std::vector<std::vector<std::string>> out;
  for (const Script* s :
       {&kAcquire, &kRelease, &kCancel, &kHeartbeat, &kRestore, &kConfigure, &kSnapshot, &kLeave})
    out.push_back({"SCRIPT", "LOAD", std::string(s->text())});
  return out;
}
}  // namespace scripts

std::vector<std::string> limiter_keys(const std::string& base) {
  std::vector<std::string> keys;
  for (const char* k : {"cfg", "holders", "queue", "seq", "instances", "byinst", "ptenant", "tready",
                        "tparked", "tholders", "tcredit", "trot"})
    keys.push_back(base + k);
  return keys;
}

void call_script(Connection& connection, const Script& script, const std::vector<std::string>& keys,
                 const std::vector<std::string>& args, Connection::Callback callback,
                 std::function<bool()> still_wanted, std::optional<std::chrono::milliseconds> timeout,
                 bool asking) {
  auto argv = command("EVALSHA", script.sha(), keys, args);
  connection.exec(
      std::move(argv),
      [conn = connection.shared_from_this(), &script, keys, args, callback = std::move(callback),
       still_wanted = std::move(still_wanted), timeout,
       asking](boost::system::error_code ec, Reply reply) mutable {
        if (ec || !reply.is_error() || reply.str.rfind("NOSCRIPT", 0) != 0) {
          std::move(callback)(ec, std::move(reply));
          return;
        }
        if (still_wanted && !still_wanted()) {
          conn->exec(
              {"SCRIPT", "LOAD", std::string(script.text())}, [](boost::system::error_code, Reply) {},
              timeout);
          std::move(callback)(make_error_code(Error::no_script), Reply{});
          return;
        }
        // Loaded and called again in one pipeline: nothing of ours can run in between.
        conn->exec(
            {"SCRIPT", "LOAD", std::string(script.text())}, [](boost::system::error_code, Reply) {}, timeout,
            asking);
        conn->exec(
            command("EVALSHA", script.sha(), keys, args),
            [callback = std::move(callback)](boost::system::error_code ec2, Reply r2) mutable {
              if (!ec2 && r2.is_error() && r2.str.rfind("NOSCRIPT", 0) == 0)
                return std::move(callback)(make_error_code(Error::no_script), Reply{});
              std::move(callback)(ec2, std::move(r2));
            },
            timeout, asking);
      },
      timeout, asking);
}

std::vector<std::string_view> shapes::of(const Script& script) {
  if (&script == &scripts::kAcquire) return {kVerdict, kQueued, kRejected};
  if (&script == &scripts::kRelease) return {kReleased};
  if (&script == &scripts::kCancel) return {kVerdict};
  if (&script == &scripts::kHeartbeat) return {kHeartbeat};
  if (&script == &scripts::kRestore) return {kVerdict, kRestored};
  if (&script == &scripts::kConfigure) return {kVerdict, kConfigured};
  if (&script == &scripts::kSnapshot) return {kVerdict, kSnapshot};
  if (&script == &scripts::kLeave) return {kLeft};
  return {};
}

}  // namespace fairgate::redis
