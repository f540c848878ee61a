#!/usr/bin/env bash
# `pip install ./clients/python` into a fresh venv, offline (PyPI is never
# reached: the build backend is in the package, with no build requirements),
# then one acquire from the installed copy against a running server.
#   usage: pip_install_check.sh PYTHON REPO URL LIMITER
set -euo pipefail
python=$1 repo=$2 url=$3 limiter=$4
tmp=$(mktemp -d /tmp/fairgate-pip-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
"$python" -m venv "$tmp/venv"
# No index at all: proves nothing is downloaded (a plain `pip install` does the same offline).
cd "$repo"
PIP_NO_INDEX=1 "$tmp/venv/bin/pip" install --disable-pip-version-check --no-input -q ./clients/python
"$tmp/venv/bin/pip" show fairgate | grep -E '^(Name|Version|Location):'
cd "$tmp"
"$tmp/venv/bin/python" - "$url" "$limiter" <<'PY'
import sys, fairgate
url, limiter = sys.argv[1:]
assert "site-packages" in fairgate.__file__, f"imported from {fairgate.__file__}, not the venv"
assert fairgate.__version__ == "0.1.0"
client = fairgate.Client(url)
with client.acquire(limiter, max_wait=5) as permit:
    assert client.limiter(limiter)["in_use"] == 1
# The release closes the stream; the server sees it a moment later (bounded wait).
import time
deadline = time.monotonic() + 10
while client.limiter(limiter)["in_use"] != 0 and time.monotonic() < deadline:
    time.sleep(0.02)
assert client.limiter(limiter)["in_use"] == 0, "the permit was not released"
import importlib.resources
assert importlib.resources.files("fairgate").joinpath("py.typed").is_file(), "py.typed missing: type checkers would ignore the hints"
print(f"pip install: ok ({fairgate.__file__}, permit {permit.id})")
PY
