#!/usr/bin/env bash
# bench/run.sh — regenerates bench/RESULTS.md and bench/results.png.
#
# Every system (fairgate and the peers of bench/peers/) runs the workloads of
# ../shared/spec/bench.md back to back on ONE fresh redis-server started here
# on a free loopback port, through the same driver (`fairgate bench --system`)
# and the same analyzer. The physical floor (redis-benchmark PING and a trivial
# EVALSHA, redis-cli --latency) is measured on the same server in the same run.
#
#   bench/run.sh                 # 3 runs of W1-W4 per system + the scaling runs
#   bench/run.sh --runs 1 --systems "fairgate bottleneck" --duration 5s
#
# Installs what it needs: the build packages (scripts/setup.sh), nodejs/npm and
# gnuplot-nox from apt, the peers' npm packages into bench/peers/node_modules.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=3
systems="fairgate seed bottleneck semaphore bullmq"
duration=10s
scaling="10 100 1000"
out=bench
while (($#)); do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --systems) systems="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --scaling) scaling="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "bench/run.sh: $1: unknown option (see --help)" >&2; exit 2 ;;
  esac
done

sudo=()
[[ $(id -u) -eq 0 ]] || sudo=(sudo)
scripts/setup.sh
need=()
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
command -v gnuplot >/dev/null || need+=(gnuplot-nox)
if ((${#need[@]})); then
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

echo "bench/run.sh: building fairgate (Release)" >&2
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DFAIRGATE_BUILD_TESTS=OFF >/dev/null
cmake --build build/release --target fairgate_cli -- --quiet
fairgate=build/release/fairgate

if [[ " $systems " != " fairgate " ]]; then
  echo "bench/run.sh: installing the peers' npm packages" >&2
  (cd bench/peers && if [[ -f package-lock.json ]]; then npm ci --no-audit --no-fund --loglevel=error; \
    else npm install --no-audit --no-fund --loglevel=error; fi) >&2
fi

# A fresh redis-server on a free loopback port, stopped (by pid) on exit.
work=$(mktemp -d)
redis_pid=""
trap '[[ -n $redis_pid ]] && { kill "$redis_pid" 2>/dev/null; wait "$redis_pid" 2>/dev/null; }; rm -rf "$work"' EXIT
port=""
for candidate in $(shuf -i 20000-40000 -n 20); do
  redis-server --port "$candidate" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" \
    --logfile "$work/redis.log" &
  redis_pid=$!
  for _ in $(seq 100); do
    kill -0 "$redis_pid" 2>/dev/null || break  # it exited: the port was taken
    # Ours answers (not another server already on that port): its process_id is our pid.
    if [[ $(redis-cli -p "$candidate" info server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p') == "$redis_pid" ]]; then
      port=$candidate
      break
    fi
    sleep 0.05
  done
  [[ -n $port ]] && break
  kill "$redis_pid" 2>/dev/null || true
  wait "$redis_pid" 2>/dev/null || true
  redis_pid=""
done
[[ -n $port ]] || { echo "bench/run.sh: could not start redis-server on a free loopback port" >&2; exit 1; }
url="redis://127.0.0.1:$port"
results="$work/results.jsonl"

printf '{"meta":true,"date":"%s","machine":"%s, %s cores, %s GiB","redis":"%s","node":"%s"}\n' \
  "$(date -u +%Y-%m-%dT%H:%MZ)" "$(. /etc/os-release && echo "$PRETTY_NAME")" "$(nproc)" \
  "$(awk '/MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo)" \
  "$(redis-server --version | grep -o 'v=[0-9.]*' | cut -d= -f2)" "$(node --version)" > "$results"

echo "bench/run.sh: the physical floor" >&2
{
  redis-benchmark -p "$port" -t ping -n 100000 -c 1 --csv | awk -F, 'NR>1 {for (i = 1; i <= NF; i++) gsub(/"/, "", $i); print "{\"floor\":\"" $1 "\",\"rps\":" $2 ",\"p50_ms\":" $5 ",\"p99_ms\":" $7 "}"}'
  sha=$(redis-cli -p "$port" SCRIPT LOAD "return 1")
  redis-benchmark -p "$port" -n 100000 -c 1 --csv evalsha "$sha" 0 | awk -F, 'NR>1 {for (i = 1; i <= NF; i++) gsub(/"/, "", $i); print "{\"floor\":\"EVALSHA return 1\",\"rps\":" $2 ",\"p50_ms\":" $5 ",\"p99_ms\":" $7 "}"}'
  timeout 5 redis-cli -p "$port" --latency --raw | awk '{print "{\"floor\":\"redis-cli --latency\",\"min_ms\":" $1 ",\"max_ms\":" $2 ",\"avg_ms\":" $3 "}"}' || true
} >> "$results"

for system in $systems; do
  for run in $(seq "$runs"); do
    for w in W1 W2 W3 W4; do
      echo "bench/run.sh: $system $w (run $run of $runs)" >&2
      "$fairgate" bench --redis "$url" --system "$system" --workload "$w" --duration "$duration" \
        --seed "$run" -q >> "$results" || echo "bench/run.sh: $system $w failed" >&2
    done
  done
  for k in $scaling; do
    echo "bench/run.sh: $system W3 with $k waiting" >&2
    "$fairgate" bench --redis "$url" --system "$system" --workload W3 --waiters "$k" --duration 5s -q \
      | sed 's/"workload":"W3"/"workload":"W3-scaling"/' >> "$results" || echo "bench/run.sh: $system scaling $k failed" >&2
  done
done

cp "$results" "$out/results.jsonl"
node bench/report.js "$out/results.jsonl" "$out" "bench/run.sh --runs $runs --systems \"$systems\" --duration $duration"
gnuplot "$out/results.gp"
echo "bench/run.sh: wrote $out/RESULTS.md, $out/results.png, $out/results.jsonl" >&2
