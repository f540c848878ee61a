#!/usr/bin/env bash
# bench/ratelimit.sh — fairgate's RateLimiter (bench/rate_bench.cpp) beside
# rate-limiter-flexible (bench/ratelimit/rlf.js, RateLimiterRedis: a fixed
# window) on the same fresh redis-server, in one run. Each side runs 4
# instances (one Redis connection each) with 16 request loops per instance.
#
# Phases (the rule is a fixed window for both):
#   throughput  10,000 keys, a limit never reached: decisions/s, p50/p99
#               latency, client commands (round trips) and Redis-side
#               commands (INFO commandstats) per decision
#   accuracy    one key, 200 per 1000 ms: admitted vs exact under concurrency
#   flood       one key, 10 per 1000 ms: Redis commands per refused request,
#               without and with the first layer (fairgate's local layer,
#               rate-limiter-flexible's inMemoryBlockOnConsumed)
#
# Installs what it needs (nodejs/npm/gnuplot from apt, the npm packages into
# bench/ratelimit/node_modules, ignored by git). Writes bench/ratelimit.jsonl,
# bench/ratelimit.png, and the table (Markdown) to stdout and bench/ratelimit.md.
# Usage: bench/ratelimit.sh [--seconds N]   (throughput phase length, default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=5
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "bench/ratelimit.sh: $1: unknown option (see --help)" >&2; exit 2 ;;
  esac
done

sudo=()
[[ $(id -u) -eq 0 ]] || sudo=(sudo)
need=()
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
command -v gnuplot >/dev/null || need+=(gnuplot-nox)
command -v redis-server >/dev/null || need+=(redis-server)
if ((${#need[@]})); then
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

echo "bench/ratelimit.sh: building fairgate_rate_bench (Release)" >&2
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DFAIRGATE_BUILD_TESTS=OFF -DFAIRGATE_BUILD_BENCH=ON >/dev/null
cmake --build build/release --target fairgate_rate_bench -- --quiet
bench=build/release/bench/fairgate_rate_bench

echo "bench/ratelimit.sh: installing rate-limiter-flexible" >&2
(cd bench/ratelimit && if [[ -f package-lock.json ]]; then npm ci --no-audit --no-fund --loglevel=error; \
  else npm install --no-audit --no-fund --loglevel=error; fi) >&2

work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
redis_pid=$!
cleanup() { kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done

out=bench/ratelimit.jsonl
: >"$out"
# run SYSTEM PHASE SECONDS RATE PERIOD KEYS LOCAL
run() {
  local system=$1 phase=$2 secs=$3 rate=$4 period=$5 keys=$6 local=$7 line
  redis-cli -p "$port" flushall >/dev/null
  redis-cli -p "$port" config resetstat >/dev/null
  if [[ $system == fairgate ]]; then
    line=$("$bench" "$port" "$phase" "$secs" 16 "$rate" "$period" "$keys" "$local" fg)
  else
    line=$(node bench/ratelimit/rlf.js "$port" "$phase" "$secs" 16 "$rate" "$period" "$keys" "$local" rlf)
  fi
  # Redis-side commands, scripted ones included, without our own INFO/CONFIG/FLUSHALL.
  local cmds
  cmds=$(redis-cli -p "$port" info commandstats | tr -d '\r' |
    awk -F'[:=,]' '/^cmdstat_/ && $1 !~ /^cmdstat_(info|config|flushall|ping|client|hello|select|script)/ {s += $3} END {print s + 0}')
  echo "${line%\}},\"redis_commands\":$cmds}" | tee -a "$out" >&2
}

for system in fairgate rlf; do
  run "$system" throughput "$seconds" 1000000000 1000 10000 0
  run "$system" accuracy 3 200 1000 1 0
  run "$system" flood 3 10 1000 1 0
  run "$system" flood 3 10 1000 1 1
done

python3 - "$out" <<'PY' | tee bench/ratelimit.md
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def f(x, d=1): return f"{x:,.{d}f}"
print("| system | phase | decisions/s | p50 µs | p99 µs | client cmds / decision | Redis cmds / decision | admitted | exact | max in a window | Redis cmds / refused |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    n = max(r["decisions"], 1)
    exact = r["exact"] if r["phase"] != "throughput" else None
    refused = r["refused"]
    print("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
        r["system"], r["phase"], f(r["per_second"], 0), f(r["p50_us"], 0), f(r["p99_us"], 0),
        f(r["client_commands"] / n, 4 if r["phase"] == "flood" else 2),
        f(r["redis_commands"] / n, 4 if r["phase"] == "flood" else 2),
        f(r["allowed"], 0) if exact is not None else "—", f(exact, 0) if exact is not None else "—",
        f(r["max_window"], 0) if exact is not None else "—",
        f(r["redis_commands"] / refused, 4) if r["phase"] == "flood" and refused else "—"))
PY

# Plot: decisions/s (throughput) and Redis commands per refused request (flood).
python3 - "$out" "$work/plot.dat" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def short(s):
    return {"fairgate": "fairgate", "fairgate + local layer": "fairgate\\n+ local layer",
            "rate-limiter-flexible": "rlf", "rate-limiter-flexible + inMemoryBlockOnConsumed": "rlf\\n+ inMemoryBlock"}[s]
with open(sys.argv[2], "w") as f:
    for r in rows:
        if r["phase"] == "flood":
            label = short(r["system"])
            f.write('"{}" {} {}\n'.format(label, r["redis_commands"] / max(r["refused"], 1), r["per_second"]))
PY
python3 - "$out" "$work/tput.dat" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2], "w") as f:
    for r in rows:
        if r["phase"] == "throughput":
            f.write('"{}" {} {} {}\n'.format(r["system"].replace("rate-limiter-flexible", "rlf"), r["per_second"], r["p50_us"], r["p99_us"]))
PY
gnuplot <<GP
set terminal pngcairo size 1100,480 font ",10"
set bmargin 4
set output "bench/ratelimit.png"
set multiplot layout 1,2 title "fairgate RateLimiter vs rate-limiter-flexible, one redis-server, 4 instances x 16 loops"
set style data histograms
set style fill solid 0.7 border -1
set boxwidth 0.8
set grid ytics
set yrange [0:*]
set title "throughput phase: decisions/s (10,000 keys)"
plot "$work/tput.dat" using 2:xtic(1) notitle lc rgb "#4472c4"
set title "flood on one key: Redis commands per refused request"
set logscale y
set yrange [0.0001:*]
plot "$work/plot.dat" using 2:xtic(1) notitle lc rgb "#c0504d"
unset multiplot
GP
echo "bench/ratelimit.sh: wrote $out and bench/ratelimit.png" >&2
