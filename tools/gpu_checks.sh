#!/bin/bash
# gradzip's GPU checks from prebuilt binaries, for a lent GPU machine with little time: the device
# tests (what `ctest -L gpu` runs), the NCCL smoke test, the CUDA quick start, PyTorch's peers
# (benchmarks/peer_torch_cuda.py), then as asked gradzip_bench_cuda family by family (each under
# its own time limit, so one slow family cannot cost the others) and gradzip_calibrate_cuda
# --quick, and the device tests under compute-sanitizer's memcheck, racecheck, synccheck and
# initcheck.
#
#   tools/gpu_checks.sh BIN OUT SECONDS [bench] [sanitize] [family REGEX]...
#
# BIN holds the binaries (gradzip_device_tests, gradzip_nccl_tests, gradzip_quickstart_cuda,
# gradzip_bench_cuda, gradzip_calibrate_cuda) and lib/ any shared library they need that the
# machine lacks (libbenchmark). `family REGEX` benchmarks only those families. SECONDS bounds the
# whole script: each step's own limit is cut to what is left of it, and the logs are packed into
# OUT/results.tgz at the end (a lent machine returns only a few files). A summary is printed last,
# the benchmarks' by tools/gpu_tables.py.
#
# On the first H100 (2026-11-25) the device tests took 4 s, memcheck 9 s and synccheck 5 s, but
# racecheck reached test case 38 of 42 in 150 s and initcheck 14: those two run case by case.
set -u
BIN=$(realpath "$1")
OUT=$2
DEADLINE=$((SECONDS + $3 - 15))
shift 3
BENCH= SANITIZE= FAMILIES=()
while [ $# -gt 0 ]; do
  case $1 in
    bench) BENCH=1 ;;
    sanitize) SANITIZE=1 ;;
    family) BENCH=1; FAMILIES+=("$2"); shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
[ ${#FAMILIES[@]} -eq 0 ] && FAMILIES=('BM_cuda_(topk|sampled|threshold)' 'cuda_compress' 'cuda_decompress_add'
  'BM_cuda_(count|fetchsgd|hashed|simhash|partition)' 'cuda_fusion' 'BM_cuda_sparse_sync')
HERE=$(dirname "$(realpath "$0")")
LOGS=$(mktemp -d)
mkdir -p "$OUT"
nccl=$(find /opt /usr -name 'libnccl.so.2' 2>/dev/null | head -1)
export LD_LIBRARY_PATH="$BIN/lib${nccl:+:$(dirname "$nccl")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

step() {  # step NAME SECONDS COMMAND...: runs COMMAND under a time limit, logs to OUT/NAME.log
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  [ $((DEADLINE - SECONDS)) -lt "$limit" ] && limit=$((DEADLINE - SECONDS))
  if [ "$limit" -le 5 ]; then echo "$name: skipped, no time left" | tee -a "$OUT/steps.txt"; return; fi
  timeout --signal=INT --kill-after=10 "$limit" stdbuf -oL -eL "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $((SECONDS - start)) s" | tee -a "$OUT/steps.txt"
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem,temperature.gpu \
  --format=csv | tee "$OUT/steps.txt"
echo "libnccl: ${nccl:-none}" | tee -a "$OUT/steps.txt"

step device_tests 150 "$BIN/gradzip_device_tests" --durations yes
step nccl_tests 60 "$BIN/gradzip_nccl_tests" --durations yes
step quickstart 30 "$BIN/gradzip_quickstart_cuda"
step peer_torch 90 python3 "$HERE/../benchmarks/peer_torch_cuda.py" --out "$LOGS/peer_torch.json"
if [ -n "$BENCH" ]; then
  for family in "${FAMILIES[@]}"; do
    name=bench_$(echo "$family" | tr 'A-Z' 'a-z' | tr -c 'a-z0-9\n' '_' | sed 's/__*/_/g; s/_$//; s/^bm_//')
    step "$name" 120 "$BIN/gradzip_bench_cuda" --benchmark_filter="$family" \
      --benchmark_out="$LOGS/$name.json" --benchmark_out_format=json
  done
  step calibrate 90 "$BIN/gradzip_calibrate_cuda" --quick --out "$LOGS/device_calibration.json"
fi
if [ -n "$SANITIZE" ]; then
  for tool in memcheck synccheck; do  # seconds for the whole binary
    step "$tool" 150 compute-sanitizer --tool "$tool" --error-exitcode 3 "$BIN/gradzip_device_tests"
  done
  # racecheck and initcheck: minutes for the whole binary, so one test case at a time (a name cut
  # at its first comma and ended with '*', as Catch's test specs need), each under its own limit:
  # a slow case costs only itself, and tool_cases.txt says how each one ended.
  "$BIN/gradzip_device_tests" --list-test-names-only | sed -E 's/,.*/*/' | grep -v '^$' >"$LOGS/cases.txt"
  for tool in racecheck initcheck; do
    while read -r case; do
      [ $((DEADLINE - SECONDS)) -lt 10 ] && { echo "$tool: out of time before: $case" >>"$LOGS/${tool}_cases.txt"; break; }
      limit=$((DEADLINE - SECONDS < 40 ? DEADLINE - SECONDS : 40))
      timeout --signal=INT --kill-after=5 "$limit" compute-sanitizer --tool "$tool" --print-limit 5 --error-exitcode 3 \
        "$BIN/gradzip_device_tests" "$case" >>"$LOGS/$tool.log" 2>&1 </dev/null
      echo "rc=$? $case" >>"$LOGS/${tool}_cases.txt"
    done <"$LOGS/cases.txt"
    echo "$tool: $(grep -c '^rc=0 ' "$LOGS/${tool}_cases.txt") of $(wc -l <"$LOGS/cases.txt") cases clean" | tee -a "$OUT/steps.txt"
  done
fi

echo "== steps"; cat "$OUT/steps.txt"
echo "== device tests"; grep -B3 -A10 -E "FAILED|CUDA error|what\(\)" "$LOGS/device_tests.log" | head -80
grep -E "^test cases|^assertions|GRADZIP_NO_GPU" "$LOGS/device_tests.log" | tail -3
echo "== nccl tests"; tail -3 "$LOGS/nccl_tests.log"
echo "== quickstart"; tail -5 "$LOGS/quickstart.log"
grep -h "NaN bits differ" "$LOGS/device_tests.log"
echo "== peers"; cat "$LOGS/peer_torch.log"
if [ -n "$SANITIZE" ]; then
  for tool in memcheck racecheck synccheck initcheck; do
    echo "== $tool"; grep -E "ERROR SUMMARY|^=+ (Invalid|Race|Barrier|Uninitialized|Error)|^test cases" "$LOGS/$tool.log" | sort | uniq -c | head -12
    [ -f "$LOGS/${tool}_cases.txt" ] && grep -v '^rc=0 ' "$LOGS/${tool}_cases.txt" | head -12
  done
fi
echo "== bench"; python3 "$HERE/gpu_tables.py" "$LOGS"
cp "$OUT/steps.txt" "$LOGS/" && tar czf "$OUT/results.tgz" -C "$LOGS" .
