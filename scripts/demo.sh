#!/usr/bin/env bash
# Sets up, builds and runs `fairgate demo` (a mock model behind two gateways on the
# embedded memory backend; with --redis URL, two `fairgate serve` processes on that Redis).
#   usage: scripts/demo.sh [demo flags...]    e.g. scripts/demo.sh --users 20 --seats 4
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DFAIRGATE_BUILD_TESTS=OFF -DFAIRGATE_BUILD_BENCH=OFF >/dev/null
cmake --build build/release --target fairgate_cli -- --quiet
exec build/release/fairgate demo "$@"
