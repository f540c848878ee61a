// tests/fuzz/fuzz_config.cpp — `fairgate serve`'s config file
// (src/serve/config.cpp, docs/api.md): any TOML text gives either a config
// whose limiters and rules pass validate(), or a ConfigError whose message
// names the problem — never another exception, a crash or a hang.
//
// Input: the file's text. It is read from a memfd through /proc/self/fd, as
// load_config() reads any file.
#include "fuzz/check.hpp"

#include "serve/config.hpp"

#include <fairgate/rate_rule.hpp>
#include <fairgate/settings.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>

using namespace fairgate;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const int fd = ::memfd_create("fairgate-fuzz-config", MFD_CLOEXEC);
  if (fd < 0) return 0;
  std::size_t done = 0;
  while (done < size) {
    const auto n = ::write(fd, data + done, size - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  serve::ServeFlags flags;
  flags.config_file = "/proc/self/fd/" + std::to_string(fd);
  try {
    const serve::ServeConfig cfg = serve::load_config(flags, nullptr);
    for (const auto& l : cfg.limiters) FUZZ_CHECK(!validate(l.settings), l.name);
    for (const auto& r : cfg.rate_rules) FUZZ_CHECK(!validate(r.rule), r.name);
    for (const auto& route : cfg.routes)
      FUZZ_CHECK(!route.path.empty() && route.path.front() == '/', route.path);
  } catch (const serve::ConfigError& e) {
    // One line, naming the field; the file name comes first.
    FUZZ_CHECK(fuzz::is_clear_message(e.what()), e.what());
  }
  ::close(fd);
  return 0;
}
