#!/usr/bin/env bash
# Sets up, builds and runs every test (warnings are errors).
#   usage: scripts/test.sh [--sanitize address,undefined|thread] [extra ctest args...]
#   e.g.   scripts/test.sh -L unit          scripts/test.sh --sanitize thread
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=""
if [[ "${1:-}" == "--sanitize" ]]; then
  sanitize="${2:?--sanitize needs address,undefined or thread}"
  shift 2
fi

scripts/setup.sh
# The gateway tests drive fairgate with the official openai SDK, from the npm
# registry into tests/gateway/node_modules (ignored by git); a missing SDK is
# then a failure, not a skip.
npm ci --prefix tests/gateway --no-audit --no-fund --loglevel=error >/dev/null
# The Node client's TypeScript types are checked with the typescript package (tests/clients).
npm ci --prefix tests/clients --no-audit --no-fund --loglevel=error >/dev/null
export FAIRGATE_REQUIRE_SDK=1
# The partition tests need root, `ip` and `nft` (scripts/setup.sh installs them):
# missing, they fail instead of skipping.
export FAIRGATE_REQUIRE_NETNS=1
# The browser test needs chromium (scripts/setup.sh installs it): missing, it fails instead of skipping.
export FAIRGATE_REQUIRE_BROWSER=1

case "$sanitize" in
  "") dir=build/test; type=RelWithDebInfo ;;
  address,undefined|address) dir=build/asan; type=Debug ;;
  thread) dir=build/tsan; type=RelWithDebInfo ;;
  *) echo "test: unknown sanitizer '$sanitize' (address,undefined | thread)" >&2; exit 2 ;;
esac

bench=ON
[[ -n "$sanitize" ]] && bench=OFF
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="$type" -DFAIRGATE_WERROR=ON \
  -DFAIRGATE_SANITIZE="$sanitize" -DFAIRGATE_BUILD_BENCH="$bench" >/dev/null
cmake --build "$dir"

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:${TSAN_OPTIONS:-}"
run=()
# ThreadSanitizer cannot map its shadow memory under some kernels' ASLR settings.
if [[ "$sanitize" == thread ]] && command -v setarch >/dev/null; then run=(setarch "$(uname -m)" -R); fi

cd "$dir"
"${run[@]}" ctest --output-on-failure --no-tests=error -j2 "$@"
