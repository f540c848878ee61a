#!/usr/bin/env bash
# bench/run.sh — regenerates bench/RESULTS.md and bench/results.png.
#
# Every system (fairgate and the peers of bench/peers/) runs the workloads of
# docs/bench.md back to back on ONE fresh redis-server started here
# on a free loopback port, through the same driver (`fairgate bench --system`)
# and the same analyzer. The physical floor (redis-benchmark PING and a trivial
# EVALSHA, redis-cli --latency) is measured on the same server in the same run.
# Then two probes of `fairgate serve` alone (no Redis): the gateway's overhead
# (bench/ttft.mjs straight to `fairgate mock-llm` and through the gateway,
# interleaved) and the waiters one instance holds (bench/waiters.mjs).
#
#   bench/run.sh                 # 3 runs of W1-W5 and crash per system, the scaling runs, the probes
#   bench/run.sh --runs 1 --systems "fairgate bottleneck" --duration 5s
#   bench/run.sh --runs 1 --systems fairgate --workloads "W5 crash" --scaling "" --probes ""
#
# --workloads LIST (W1 W2 W3 W4 W5 crash), --scaling LIST ("" = none), --probes
# LIST (gateway waiters; "" = none), --waiters-held N (10000), --rounds N (5,
# gateway rounds of 200 requests each way), --crash-bound D (15s: how long crash
# waits after the kill; the seed's lease is 30 s, BullMQ's lock 30 s).
# Installs what it needs: the build packages (scripts/setup.sh), nodejs/npm and
# gnuplot-nox from apt, the peers' npm packages into bench/peers/node_modules.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=3
systems="fairgate seed bottleneck semaphore bullmq"
duration=10s
workloads="W1 W2 W3 W4 W5 crash"
scaling="10 100 1000"
probes="gateway waiters"
crash_bound=15s
waiters_held=10000
rounds=5
out=bench
while (($#)); do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --systems) systems="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --workloads) workloads="$2"; shift 2 ;;
    --scaling) scaling="$2"; shift 2 ;;
    --probes) probes="$2"; shift 2 ;;
    --crash-bound) crash_bound="$2"; shift 2 ;;
    --waiters-held) waiters_held="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
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

# A fresh redis-server on a free loopback port; it and every server started
# below are stopped (by pid) on exit.
work=$(mktemp -d)
redis_pid=""
started=()
stop() {  # stop PID: SIGTERM, then reap
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
cleanup() {
  local pid
  for pid in "${started[@]}"; do stop "$pid"; done
  [[ -n $redis_pid ]] && stop "$redis_pid"
  rm -rf "$work"
}
trap cleanup EXIT
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
    for w in $workloads; do
      echo "bench/run.sh: $system $w (run $run of $runs)" >&2
      "$fairgate" bench --redis "$url" --system "$system" --workload "$w" --duration "$duration" \
        --crash-bound "$crash_bound" --seed "$run" -q >> "$results" || echo "bench/run.sh: $system $w failed" >&2
    done
  done
  for k in $scaling; do
    echo "bench/run.sh: $system W3 with $k waiting" >&2
    "$fairgate" bench --redis "$url" --system "$system" --workload W3 --waiters "$k" --duration 5s -q \
      | sed 's/"workload":"W3"/"workload":"W3-scaling"/' >> "$results" || echo "bench/run.sh: $system scaling $k failed" >&2
  done
done

# Prints the URL of the "...: listening on http://HOST:PORT" line in FILE once
# it is there (bounded: 10 s); fails if process PID exits first.
listening_url() {
  local file=$1 pid=$2 url=""
  for _ in $(seq 200); do
    url=$(grep -o 'listening on http://[^ ]*' "$file" 2>/dev/null | head -1 | cut -d' ' -f3)
    [[ -n $url ]] && { echo "$url"; return 0; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  echo "bench/run.sh: no 'listening on' line in $file:" >&2
  cat "$file" >&2
  return 1
}

# Gateway overhead: TTFT straight to the mock model server and through a
# `fairgate serve` gateway in front of it (memory backend, a cap the load never
# reaches), interleaved round by round (first leg alternating) so that drift of
# the machine hits both alike; report.js takes the medians over rounds.
if [[ " $probes " == *" gateway "* ]]; then
  echo "bench/run.sh: gateway overhead ($rounds rounds x 200 requests each way, concurrency 1)" >&2
  "$fairgate" mock-llm --listen 127.0.0.1:0 --tokens 5 --tokens-per-second 1000 > "$work/mock.log" 2>&1 &
  mock_pid=$!
  started+=("$mock_pid")
  mock_url=$(listening_url "$work/mock.log" "$mock_pid")
  cat > "$work/gateway.toml" <<TOML
[limiters.chat]
max_concurrent = 64

[[route]]
path = "/v1/chat/completions"
upstream = "$mock_url"
limiter = "chat"
TOML
  "$fairgate" serve --config "$work/gateway.toml" --listen 127.0.0.1:0 > "$work/gateway.log" 2>&1 &
  gateway_pid=$!
  started+=("$gateway_pid")
  gateway_url=$(listening_url "$work/gateway.log" "$gateway_pid")
  ttft() {  # ttft LABEL BASE_URL REQUESTS
    node bench/ttft.mjs --url "$2/v1/chat/completions" --requests "$3" --concurrency 1 --label "$1" \
      --timeout 10s --max-duration 2m
  }
  ttft warmup "$mock_url" 20 >/dev/null && ttft warmup "$gateway_url" 20 >/dev/null
  for round in $(seq "$rounds"); do
    legs=("direct $mock_url" "gateway $gateway_url")
    ((round % 2)) || legs=("gateway $gateway_url" "direct $mock_url")
    for leg in "${legs[@]}"; do
      read -r label base <<<"$leg"
      ttft "$label" "$base" 200 | sed "s/^{/{\"probe\":\"gateway\",\"round\":$round,/" >> "$results" \
        || echo "bench/run.sh: gateway round $round ($label) failed" >&2
    done
  done
  stop "$gateway_pid"
  stop "$mock_pid"
fi

# Waiters held: one `fairgate serve` (memory backend), its one permit taken,
# then N SSE acquires queued; bench/waiters.mjs reads its VmRSS and Threads.
if [[ " $probes " == *" waiters "* ]]; then
  echo "bench/run.sh: $waiters_held waiters held by one fairgate serve" >&2
  ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
  cat > "$work/waiters.toml" <<TOML
[server]
max_connections = $((waiters_held * 2))
max_waiters_per_client = $((waiters_held * 2))
TOML
  "$fairgate" serve --config "$work/waiters.toml" --listen 127.0.0.1:0 --limiter hold=1,max_wait=10m \
    > "$work/waiters.log" 2>&1 &
  waiters_pid=$!
  started+=("$waiters_pid")
  waiters_url=$(listening_url "$work/waiters.log" "$waiters_pid")
  node bench/waiters.mjs --url "$waiters_url" --pid "$waiters_pid" --waiters "$waiters_held" --timeout 180s \
    | sed 's/^{/{"probe":"waiters",/' >> "$results" || echo "bench/run.sh: waiters probe failed" >&2
  stop "$waiters_pid"
fi

cp "$results" "$out/results.jsonl"
node bench/report.js "$out/results.jsonl" "$out" "bench/run.sh --runs $runs --systems \"$systems\" --duration $duration"
if [[ -s $out/results-cdf.dat && -n ${scaling// /} ]]; then gnuplot "$out/results.gp"; else echo "bench/run.sh: no W2 or no scaling rows: no plot" >&2; fi
echo "bench/run.sh: wrote $out/RESULTS.md, $out/results.png, $out/results.jsonl" >&2
