#!/usr/bin/env bash
# Sets up, builds and runs `fairgate demo` (the embedded memory backend).
#   usage: scripts/demo.sh [demo flags...]    e.g. scripts/demo.sh --users 20 --seats 4
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DFAIRGATE_BUILD_TESTS=OFF -DFAIRGATE_BUILD_BENCH=OFF >/dev/null
cmake --build build/release --target fairgate_cli -- --quiet
exec build/release/fairgate demo "$@"
