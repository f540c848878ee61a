#!/usr/bin/env bash
# Fuzzes the parsers that read outside input (tests/fuzz, docs/fuzzing.md) with
# libFuzzer under AddressSanitizer + UBSan, for a bounded time, and prints what
# each target did. Not part of scripts/test.sh: that replays the committed
# corpus (ctest -L fuzz) in every build instead.
#   usage: scripts/fuzz.sh [--seconds N] [--jobs J] [TARGET...]
#          scripts/fuzz.sh --replay [TARGET...]   (build with clang, run the committed corpus once: CI)
#   e.g.   scripts/fuzz.sh --seconds 30          scripts/fuzz.sh --seconds 600 fuzz_config
# Exit status 1 when a target found a crash or a failed check; its input is
# left in build/fuzz/artifacts/TARGET/ (reproduce: build/fuzz/tests/fuzz/TARGET FILE).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
replay=0
jobs=$(( $(nproc) < 2 ? 1 : 2 ))
targets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds="${2:?--seconds needs a number}"; shift 2 ;;
    --jobs) jobs="${2:?--jobs needs a number}"; shift 2 ;;
    --replay) replay=1; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -ge 1 ]] || { echo "fuzz: --seconds must be a whole number >= 1" >&2; exit 2; }
[[ "$jobs" =~ ^[0-9]+$ && "$jobs" -ge 1 ]] || { echo "fuzz: --jobs must be a whole number >= 1" >&2; exit 2; }
all=()
for d in tests/fuzz/corpus/*/; do all+=("$(basename "$d")"); done
[[ ${#targets[@]} -gt 0 ]] || targets=("${all[@]}")
for t in "${targets[@]}"; do
  [[ -d "tests/fuzz/corpus/$t" ]] || { echo "fuzz: unknown target $t (one of: ${all[*]})" >&2; exit 2; }
done

scripts/setup.sh --with-dev-tools  # clang
dir=build/fuzz
CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFAIRGATE_WERROR=ON \
  -DFAIRGATE_FUZZ=ON -DFAIRGATE_SANITIZE=address,undefined -DFAIRGATE_BUILD_BENCH=OFF >/dev/null
cmake --build "$dir" --target "${targets[@]}"

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
if [[ $replay -eq 1 ]]; then
  # Deterministic: each committed input once, through the libFuzzer build.
  for t in "${targets[@]}"; do
    n=$(find "tests/fuzz/corpus/$t" -type f | wc -l)
    "$dir/tests/fuzz/$t" -runs=0 "tests/fuzz/corpus/$t" >"$dir/replay-$t.log" 2>&1 ||
      { echo "fuzz: $t failed on its corpus:" >&2; tail -20 "$dir/replay-$t.log" >&2; exit 1; }
    echo "$t: $n inputs ok"
  done
  exit 0
fi
run_one() {
  local t=$1 work="$dir/corpus/$1" art="$dir/artifacts/$1/" log="$dir/logs/$1.log"
  mkdir -p "$work" "$art" "$(dirname "$log")"
  # New inputs go to the work corpus (the first directory); the committed one only seeds it.
  if "$dir/tests/fuzz/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
      -print_final_stats=1 -artifact_prefix="$art" "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1; then
    echo "ok" >"$log.status"
  else
    echo "FAILED" >"$log.status"
  fi
}
echo "fuzzing ${#targets[@]} targets for ${seconds} s each, $jobs at a time"
running=0
for t in "${targets[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if [[ $running -ge $jobs ]]; then wait -n; running=$((running - 1)); fi
done
wait

failed=0
printf '%-16s %8s %12s %10s %6s %8s  %s\n' target result runs "runs/s" cov corpus "artifacts"
for t in "${targets[@]}"; do
  log="$dir/logs/$t.log"
  status=$(cat "$log.status")
  # (A target that failed on its first input printed no figures.)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1 || true)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1 || true)
  cov=$( (grep -o 'cov: [0-9]*' "$log" || true) | tail -1 | cut -d' ' -f2)
  corpus=$(find "$dir/corpus/$t" -type f | wc -l)
  arts=$(find "$dir/artifacts/$t" -type f | wc -l)
  printf '%-16s %8s %12s %10s %6s %8s  %s\n' "$t" "$status" "${runs:-?}" "${rate:-?}" "${cov:-?}" "$corpus" "$arts"
  if [[ "$status" != ok ]]; then
    failed=1
    echo "--- $t: the end of $log" >&2
    grep -E 'ERROR|fuzz check failed|runtime error|SUMMARY|Test unit written' "$log" | head -8 >&2 || true
  fi
done
exit $failed
