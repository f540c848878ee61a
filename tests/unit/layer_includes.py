#!/usr/bin/env python3
"""Every `#include "LAYER/..."` (or <LAYER/...>) in src/ and include/ against
the layer table below (docs/design.md, "Layers"): a layer includes its own
files, the public API (<fairgate/...>) where the table says so, and of the
other layers only what the table lists: a whole layer ("http/") or one file
("redis/url.hpp"). Every folder of src/ must have a row.

    layer_includes.py SOURCE_DIR    (ctest -L unit: unit.layer_includes)

Exits 1 with one line per include the table does not allow.
"""
import os
import re
import sys

# layer: (other layers' headers it may include, may it include <fairgate/...>)
LAYERS = {
    "include": ([], True),                  # the public API: nothing of src/
    "core": ([], True),                     # pure rules: no I/O, nothing else of ours
    "api": (["core/"], True),               # the backend interface over core
    "memory": (["api/", "core/"], True),    # a backend
    "redis": (["api/", "core/", "tls/"], True),  # a backend and its Redis client
    "tls": ([], False),                     # client TLS (OpenSSL): for Redis and the gateway's upstreams
    "http": (["core/text.hpp"], False),     # knows no limiter (text.hpp: header-only)
    "mockllm": (["http/"], False),          # a server on http only
    # the URL's redacted form, nothing of the client; the gateway's entry point
    # (only from the server's files, not from serve_base's: see below)
    "serve": (["http/", "redis/url.hpp", "gateway/gateway.hpp", "core/settings_table.hpp", "core/number.hpp",
              "core/text.hpp", "tls/"], True),
    # on fairgate_serve_base (its headers only: SERVE_BASE below), never the server's
    "gateway": (["serve_base", "http/", "tls/"], True),
    "bench": (["redis/"], True),
    "cli": (["bench/", "gateway/", "http/", "mockllm/", "serve/", "redis/url.hpp",
             "redis/database_check.hpp", "core/settings_table.hpp", "core/text.hpp"], True),
}

# The gateway builds on fairgate_serve_base, and the server (fairgate_serve)
# on the gateway: serve_base's files may not include gateway/, and the gateway
# may include serve/ headers of serve_base only. Its sources are read from
# CMakeLists.txt (add_library(fairgate_serve_base ...)), so this cannot drift.
def serve_base_headers(root):
    with open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"add_library\(fairgate_serve_base STATIC([^)]*)\)", f.read())
    if not m:
        return None
    stems = re.findall(r"src/serve/([A-Za-z0-9_]+)\.cpp", m.group(1))
    return {f"serve/{stem}.hpp" for stem in stems}


INCLUDE = re.compile(r'^\s*#\s*include\s*["<]([A-Za-z0-9_]+)/([^">]+)[">]')
SOURCE = (".hpp", ".cpp", ".h", ".cc", ".ipp")


def layer_of(root, path):
    rel = os.path.relpath(path, root).split(os.sep)
    if rel[0] == "include":
        return "include"
    return rel[1]


def check(root):
    problems = []
    ours = set(LAYERS) - {"include"}
    serve_base = serve_base_headers(root)
    if serve_base is None:
        return ["CMakeLists.txt: no add_library(fairgate_serve_base STATIC ...) to read serve_base's files from"]
    for top in ("src", "include"):
        base = os.path.join(root, top)
        if top == "src":
            for d in sorted(os.listdir(base)):
                if os.path.isdir(os.path.join(base, d)) and d not in LAYERS:
                    problems.append(f"src/{d}: a layer the table in tests/unit/layer_includes.py does not know "
                                    "(add its row there and in docs/design.md)")
        for dirpath, _, files in os.walk(base):
            for name in sorted(files):
                if not name.endswith(SOURCE):
                    continue
                path = os.path.join(dirpath, name)
                layer = layer_of(root, path)
                if layer not in LAYERS:
                    continue
                allowed, public = LAYERS[layer]
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target, rest = m.group(1), m.group(2)
                        header = f"{target}/{rest}"
                        where = f"{os.path.relpath(path, root)}:{number}"
                        if target == "fairgate":
                            if not public:
                                problems.append(f"{where}: {layer} may not include the public API <{header}>")
                            continue
                        rel = os.path.relpath(path, root)
                        in_base = layer == "serve" and re.sub(r"\.(c|h)pp$", ".hpp", rel[len("src/"):]) in serve_base
                        if in_base and target == "gateway":
                            problems.append(f"{where}: serve_base may not include \"{header}\" "
                                            "(the gateway builds on serve_base; only the server's files may)")
                            continue
                        if target not in ours or target == layer:
                            continue
                        ok = any(header == a or (a.endswith("/") and header.startswith(a)) for a in allowed)
                        if "serve_base" in allowed and header in serve_base:
                            ok = True
                        if not ok:
                            problems.append(f"{where}: {layer} may not include \"{header}\" "
                                            f"(allowed: {', '.join(allowed) or 'nothing of other layers'})")
    return problems


def main():
    if len(sys.argv) != 2:
        print("usage: layer_includes.py SOURCE_DIR", file=sys.stderr)
        return 2
    problems = check(sys.argv[1])
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        return 1
    print("layer includes: every include is one the table allows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
