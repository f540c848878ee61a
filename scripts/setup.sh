#!/usr/bin/env bash
# Installs what fairgate needs to build, test and demo, from Debian 12's
# packages. Does nothing when everything is already installed.
#   usage: scripts/setup.sh [--with-dev-tools]   (adds clang, clang-format, clang-tidy and
#          clang's runtimes: libFuzzer and the sanitizers, for scripts/fuzz.sh)
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libboost1.81-dev libboost-json1.81-dev libtomlplusplus-dev libcli11-dev libfmt-dev libspdlog-dev libhiredis-dev libssl-dev openssl redis-server redis-tools
  libgtest-dev libgmock-dev libbenchmark-dev
  iproute2 nftables  # the fault-injection tests partition an instance in a network namespace
  # The Python client and its tests run on Debian's python3 (venv: the offline pip install test;
  # yaml + jsonschema: the OpenAPI document check; yaml also builds: docs/openapi.yaml → the JSON in the binary).
  python3 python3-venv python3-yaml python3-jsonschema
  # The .deb: the man page from --help, dpkg-shlibdeps (dpkg-dev), `systemd-analyze verify`.
  help2man dpkg-dev file systemd
  # The browser test (ctest -L browser): examples/browser in a headless Chromium.
  chromium
  # The `fairgate top` test runs it in a real terminal.
  tmux
  # The gateway test's https:// model server: socat terminates TLS in front of the mock.
  socat
)
if [[ "${1:-}" == "--with-dev-tools" ]]; then
  packages+=(clang clang-format clang-tidy libclang-rt-dev)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node runs the HTTP/SSE test clients and the benchmark's peers. Any node/npm
# on the PATH will do (e.g. NodeSource's, which bundles npm and conflicts with
# Debian's npm package); else Debian's.
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
((${#missing[@]} == 0)) && exit 0

sudo=()
if [[ "$(id -u)" -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
echo "setup: installing ${missing[*]}" >&2
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
