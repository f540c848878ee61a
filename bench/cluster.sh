#!/usr/bin/env bash
# bench/cluster.sh — the Redis Cluster scaling figures (docs/redis-cluster.md):
# 3, then 12 busy limiters on ONE standalone redis-server vs the same limiters
# spread over a 3-master Redis Cluster, in the same run (both started by the
# program on loopback ports; tests/cluster/cluster_scaling.cpp). Each limiter is
# one `fairgate bench-worker` process with 4 closed-loop clients (cap 3, holds
# 0..1 ms). Writes bench/cluster.jsonl and bench/cluster.png, prints a table.
#   usage: bench/cluster.sh [--limiters "3 12"] [--duration-ms 5000] [--clients 4] [--cap 3]
# On a machine with fewer cores than masters + workers, the masters and the
# workers share the cores: the figures then say what the client costs, not
# what the masters could do (see docs/redis-cluster.md).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -n "${FAIRGATE_BUILD_DIR:-}" ]] || scripts/setup.sh
command -v gnuplot >/dev/null || { apt-get update -qq && apt-get install -y -qq gnuplot-nox >/dev/null; }
dir=${FAIRGATE_BUILD_DIR:-build/bench}  # an existing RelWithDebInfo build dir may be given
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFAIRGATE_BUILD_BENCH=OFF >/dev/null
cmake --build "$dir" --target cluster_scaling fairgate_cli >/dev/null
out=bench/cluster.jsonl
"$dir/tests/cluster_scaling" "$@" 2>/dev/null | tee "$out"
node -e '
const rows = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse);
console.log("\n| limiters | target | grants/s | Redis commands per grant | client round trips per grant | max holders per limiter | overshoot |");
console.log("|---|---|---|---|---|---|---|");
for (const r of rows)
  console.log(`| ${r.limiters} | ${r.target} (${r.masters} master${r.masters > 1 ? "s" : ""}) | ${r.grants_per_s.toFixed(0)} | ${r.redis_cmds_per_grant.toFixed(2)} | ${r.client_round_trips_per_grant.toFixed(2)} | ${r.max_holders_per_limiter}/${r.cap} | ${r.overshoot} |`);
const dat = rows.filter(r => r.target === "standalone").map(s => {
  const c = rows.find(r => r.target === "cluster" && r.limiters === s.limiters);
  return `"${s.limiters} limiters" ${s.grants_per_s.toFixed(0)} ${c ? c.grants_per_s.toFixed(0) : 0}`;
}).join("\n");
require("fs").writeFileSync("bench/cluster.dat", dat + "\n");
' "$out"
gnuplot <<'GP'
set terminal pngcairo size 800,480 font 'sans,11'
set output 'bench/cluster.png'
set title 'Busy limiters: one standalone Redis vs a 3-master Redis Cluster (same run)'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel 'grants per second (all limiters)'
set yrange [0:*]
set key top left
set grid ytics
plot 'bench/cluster.dat' using 2:xtic(1) title 'standalone (1 redis-server)', '' using 3 title 'Cluster (3 masters)'
GP
rm -f bench/cluster.dat
echo "wrote $out and bench/cluster.png"
