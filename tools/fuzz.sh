#!/usr/bin/env bash
# The decoder fuzz targets (tests/fuzz/fuzz_targets.cpp), run long: each is built with clang++-14
# (libFuzzer, ASan, UBSan) and run for RUNS executions (default 10^7) from the valid payloads it
# writes plus the golden ones, with the CI caps: 512 MiB per allocation, 2 GiB RSS, 10 s per input.
# Findings (crash-*, leak-*, oom-*, timeout-*) land in the target's directory; the corpus grows there.
# Usage: tools/fuzz.sh [work-dir (default build-fuzz)] [target ...]   e.g. tools/fuzz.sh build-fuzz sketch states
#        RUNS=100000 JOBS=2 tools/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(realpath -m "${1:-build-fuzz}")
shift || true
all=(sparse dense randomk sketch hashing states partition lowrank)
targets=("${@:-${all[@]}}")
runs=${RUNS:-10000000}
jobs=${JOBS:-1}
clang=$(command -v clang++-14 || command -v clang++)

for name in "${targets[@]}"; do
  index=-1
  for i in "${!all[@]}"; do [[ ${all[$i]} == "$name" ]] && index=$((i + 1)); done
  [[ $index -gt 0 ]] || { echo "unknown target $name (targets: ${all[*]})" >&2; exit 2; }
  dir=$work/$name
  mkdir -p "$dir/corpus"
  cp tests/golden/*.grdz "$dir/corpus/"
  "$clang" -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -DGRADZIP_FUZZ_TARGET=$index -Iinclude tests/fuzz/fuzz_targets.cpp -o "$dir/fuzz_$name"
  echo "== $name: $runs executions"
  (cd "$dir" && GRADZIP_FUZZ_SEEDS=corpus ./"fuzz_$name" -runs="$runs" -jobs="$jobs" -workers="$jobs" \
    -max_len=8192 -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 -print_final_stats=1 corpus \
    2>&1 | tee "$dir/run.log" | grep -E "^#[0-9]+ +(DONE|pulse)|stat::|ERROR|SUMMARY" || true)
  if ls "$dir"/crash-* "$dir"/leak-* "$dir"/oom-* "$dir"/timeout-* >/dev/null 2>&1; then
    echo "== $name: findings in $dir" >&2
    exit 1
  fi
done
