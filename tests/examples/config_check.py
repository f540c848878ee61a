"""Checks that a running `fairgate serve` serves what its config file says
(examples_test.cpp starts the server with the file).

    python3 config_check.py URL --limiters chat,document-upload [--redis up] [--route PATH]

--route PATH: the gateway route answers (its upstream is not running here, so
a request must get the gateway's 502 `upstream_unreachable`, never a 404).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request


def get(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--limiters", required=True)
    ap.add_argument("--redis", default="none")
    ap.add_argument("--route")
    a = ap.parse_args()
    failures = []
    names = sorted(l["name"] for l in get(f"{a.url}/v1/limiters")["limiters"])
    want = sorted(a.limiters.split(","))
    if names != want:
        failures.append(f"limiters {names}, the config has {want}")
    health = get(f"{a.url}/healthz")
    if health.get("redis") != a.redis:
        failures.append(f"healthz {health}, expected redis {a.redis}")
    if a.route:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
        req = urllib.request.Request(a.url + a.route, body, {"Content-Type": "application/json"}, method="POST")
        try:
            urllib.request.urlopen(req, timeout=10)
            failures.append(f"{a.route}: answered 2xx without an upstream")
        except urllib.error.HTTPError as e:
            err = json.loads(e.read() or b"{}").get("error", {})
            if e.code != 502 or err.get("code") != "upstream_unreachable":
                failures.append(f"{a.route}: {e.code} {err}, expected 502 upstream_unreachable")
    for f in failures:
        print(f"FAIL: {f}")
    print(f"config_check: limiters {names}, health {health}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
