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
    "redis": (["api/", "core/"], True),     # a backend and its Redis client
    "http": ([], False),                    # knows no limiter
    "mockllm": (["http/"], False),          # a server on http only
    "serve": (["http/", "redis/url.hpp"], True),  # the URL's redacted form, nothing of the client
    "gateway": (["serve/", "http/", "core/"], True),
    "bench": (["redis/"], True),
    "cli": (["bench/", "gateway/", "http/", "mockllm/", "serve/", "redis/url.hpp",
             "redis/database_check.hpp"], True),
}

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
                        if target not in ours or target == layer:
                            continue
                        if not any(header == a or (a.endswith("/") and header.startswith(a)) for a in allowed):
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
