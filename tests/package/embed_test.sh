#!/bin/bash
# package.embed_add_subdirectory: a project embeds the source tree with add_subdirectory, as
# README.md ("Use it from C++") says, builds the library only (FAIRGATE_LIBRARY_ONLY is on when
# fairgate is not the top-level project: no CLI11, spdlog, toml++ needed) and runs a program on
# it. Usage: embed_test.sh BUILD_DIR SOURCE_DIR CXX_COMPILER GENERATOR
set -euo pipefail
build=$1/embed-check
src=$2
rm -rf "$build"
cmake -S "$src/tests/package/embed" -B "$build" -G "$4" -DCMAKE_CXX_COMPILER="$3" \
  -DFAIRGATE_SOURCE_DIR="$src" -DCMAKE_BUILD_TYPE=Release >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
# Only the library's targets exist in the embedded tree: no command, no server, no tests.
for t in fairgate_cli fairgate_serve serve_test; do
  if cmake --build "$build" --target "$t" >/dev/null 2>&1; then
    echo "target $t exists in an embedded build"; exit 1
  fi
done
cmake --build "$build" >"$build.build.log" 2>&1 || { tail -n 40 "$build.build.log"; exit 1; }
"$build/embed_check"
