// The embedding check's program: the README's example on the memory backend, run to the end
// (io.run() returns once nobody waits), and a Redis backend's options checked without a server
// (the Redis library links). Prints "embed ok" and exits 0, or says what failed and exits 1.
#include <fairgate/fairgate.hpp>
#include <fairgate/redis_backend.hpp>

#include <boost/asio/io_context.hpp>

#include <cstdio>

int main() {
  boost::asio::io_context io;
  auto backend = fairgate::make_memory_backend(io.get_executor());
  fairgate::Limiter chat = backend->open("chat", {.max_concurrent = 1}).value();
  int granted = 0;
  for (int i = 0; i < 3; ++i) {
    fairgate::AcquireOptions options{.max_wait = std::chrono::seconds(20), .tenant = "user-42"};
    chat.async_acquire(options, [&](fairgate::AcquireResult r) {
      if (!r) return;
      fairgate::Permit permit = r.take_permit();  // released at the end of this scope
      ++granted;
    });
  }
  io.run();
  if (granted != 3 || chat.snapshot().in_use != 0) {
    std::printf("granted %d of 3, %zu still held\n", granted, chat.snapshot().in_use);
    return 1;
  }
  if (fairgate::default_instance_id().empty()) {
    std::printf("no instance id\n");
    return 1;
  }
  std::printf("embed ok\n");
  return 0;
}
