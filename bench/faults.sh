#!/usr/bin/env bash
# bench/faults.sh — the engine-faults figures (docs/faults.md): every fault of
# the fault-injection suite (tests/faults/, `ctest -L faults`) repeated many
# times on one long run of real instances (`fairgate bench-worker`) against a
# real redis-server started by the program, judged from the clients' own
# timestamps. Prints one JSON line per fault kind (and a table), also written
# to bench/faults.jsonl.
#   usage: bench/faults.sh [--cycles N (20)] [--kill-cycles N (100)] [--kind K[,K...]]
# Kinds: kill9 restart aof flushall script_flush sigstop oom misconf noreplicas busy
# debug_sleep client_kill partition bad_replies bad_fields snapshot delete_key
# delete_tenant_key (all by default).
# Needs root for the partition (a network namespace with nftables); takes
# about 17 minutes with the defaults on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
dir=build/bench
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFAIRGATE_BUILD_BENCH=OFF >/dev/null
cmake --build "$dir" --target fault_cycles fairgate_cli >/dev/null
out=bench/faults.jsonl
"$dir/tests/faults/fault_cycles" "$@" | tee "$out"
node -e '
const rows = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse);
console.log("\n| fault | cycles survived | requests | max overshoot | lost | timeouts | unavailable | back to whole p50 / max ms | fence ms |");
console.log("|---|---|---|---|---|---|---|---|---|");
for (const r of rows)
  console.log(`| ${r.fault} | ${r.survived}/${r.cycles} | ${r.requests} | ${r.max_overshoot} | ${r.lost} | ${r.timeouts} | ${r.unavailable} | ${r.back_to_whole_ms.p50.toFixed(0)} / ${r.back_to_whole_ms.max.toFixed(0)} | ${r.fence_ms.toFixed(0)} |`);
for (const r of rows) for (const p of r.problems) console.log(`problem (${r.fault}): ${p}`);
' "$out"
