#!/usr/bin/env python3
"""Every file a sanitizer build compiles carries that sanitizer's flag.

    sanitizer_flags.py BUILD_DIR SANITIZERS   (ctest -L unit: unit.sanitizer_flags)

Reads BUILD_DIR/compile_commands.json. A target created before the
sanitizer options were added (CMake's add_compile_options applies only to
targets created after it) would compile without them: its code then runs
uninstrumented, ThreadSanitizer cannot see its synchronisation and reports
races that are not there, and AddressSanitizer misses its errors. Exits 1
with the files that lack the flag.
"""
import json
import os
import sys


def main():
    build_dir, sanitizers = sys.argv[1], sys.argv[2]
    flag = "-fsanitize=" + sanitizers
    with open(os.path.join(build_dir, "compile_commands.json")) as f:
        commands = json.load(f)
    if not commands:
        print("sanitizer_flags: compile_commands.json lists no file")
        return 1
    missing = [c["file"] for c in commands if flag not in c.get("command", " ".join(c.get("arguments", [])))]
    for path in missing:
        print(f"sanitizer_flags: {path} is compiled without {flag}")
    print(f"sanitizer_flags: {len(commands) - len(missing)} of {len(commands)} files compiled with {flag}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
