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

void call_script(Connection& connection, const Script& script, const std::vector<std::string>& keys,
                 const std::vector<std::string>& args, Connection::Callback callback) {
  connection.exec(command("EVALSHA", script.sha(), keys, args),
                  [conn = connection.shared_from_this(), &script, keys, args, callback = std::move(callback)](
                      boost::system::error_code ec, Reply reply) mutable {
                    if (!ec && reply.is_error() && reply.str.rfind("NOSCRIPT", 0) == 0) {
                      conn->exec(command("EVAL", script.text(), keys, args), std::move(callback));
                      return;
                    }
                    std::move(callback)(ec, std::move(reply));
                  });
}

}  // namespace fairgate::redis
