#!/usr/bin/env bash
# slow_link_train.sh: issue 18's slow-link experiment. MPI ranks in network namespaces joined by
# a switch whose ports tc limits (tools/slow_link.sh); at each rate: fit the link to MPI, plan
# the MLP of mpi_train with that link and this machine's calibration, then train fp32, top-k
# 1 % + EF, QSGD 4-bit and the plan, with the test accuracy measured as training goes.
#
#   tools/slow_link_train.sh BUILD OUT [--ranks 2] [--rates "1gbit 10gbit"] [--epochs 3]
#                            [--train 60000] [--target 83] [--quick]
#
# Writes OUT/{calibration.json, link-RATE.json, plan-RATE.json, cost-RATE.json, plan-RATE.txt
# and plan-RATE-qsgd4.txt (the model's predictions), train-RATE.txt, train-RATE.csv,
# curve-RATE.csv}. --quick (the ctest): one rate, one epoch of 4,000 images, and
# checks that the fitted link is as slow as tc made it and that the report has every column.
# Needs root and network namespaces (`tools/slow_link.sh check`); exits 77 where they are
# missing, which ctest reports as skipped.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$1 out=$2
shift 2
ranks=2 rates="1gbit 10gbit" epochs=3 train=60000 target=83 quick=0 data=/usr/share/datasets/fashion-mnist
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks=$2; shift ;;
    --rates) rates=$2; shift ;;
    --epochs) epochs=$2; shift ;;
    --train) train=$2; shift ;;
    --target) target=$2; shift ;;
    --data) data=$2; shift ;;
    --quick) quick=1; rates=1gbit epochs=1 train=4000 target=50 ;;
    *) echo "slow_link_train: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
"$here/slow_link.sh" check || exit 77
mkdir -p "$out"
out=$(cd "$out" && pwd)
trap '"$here/slow_link.sh" down' EXIT

calibrate=(--threads 1 --out "$out/calibration.json")
[ $quick = 1 ] && calibrate+=(--quick)
"$build/benchmarks/gradzip_calibrate" "${calibrate[@]}" >/dev/null

for rate in $rates; do
  "$here/slow_link.sh" up "$ranks" "$rate"
  "$here/slow_link.sh" mpirun "$build/examples/gradzip_mpi_train" --measure-link "$out/link-$rate.json" >/dev/null
  "$build/benchmarks/gradzip_plan" --model mlp --cpu-only --ranks "$ranks" --samples 32 \
    --calibration "$out/calibration.json" --link "$out/link-$rate.json" \
    --plan-out "$out/plan-$rate.json" --cost-out "$out/cost-$rate.json" >"$out/plan-$rate.txt"
  # The model's prediction for QSGD everywhere too (its "Cupcake" column: one group here).
  "$build/benchmarks/gradzip_plan" --model mlp --cpu-only --ranks "$ranks" --samples 32 --codec qsgd4 \
    --calibration "$out/calibration.json" --link "$out/link-$rate.json" >"$out/plan-$rate-qsgd4.txt"
  "$here/slow_link.sh" mpirun "$build/examples/gradzip_mpi_train" --data "$data" --epochs "$epochs" \
    --train "$train" --codecs fp32,topk-ef,qsgd4,plan --plan "$out/plan-$rate.json" --cost "$out/cost-$rate.json" \
    --evals 4 --target "$target" --csv "$out/train-$rate.csv" --curve "$out/curve-$rate.csv" | tee "$out/train-$rate.txt"
  echo "link $rate, fitted by MPI: $(grep -o '"network":{[^}]*}' "$out/link-$rate.json")"
  "$here/slow_link.sh" down
done

if [ $quick = 1 ]; then
  # tc's 1 Gb/s is 125 MB/s. At 2 ranks an allreduce or allgather of b bytes moves b bytes
  # each way, so MPI's largest timing (4 MiB) cannot beat b / 125 MB/s by more than a bucket;
  # if it does, the traffic went around the link. (The fitted bandwidth itself may exceed the
  # rate a little: small messages pass on tbf's bucket.)
  python3 - "$out/link-1gbit.json" <<'PY' || exit 1
import json, sys
points = json.load(open(sys.argv[1]))["points"]
largest = max(p[1] for p in points)
name, size, seconds = min((p for p in points if p[1] == largest), key=lambda p: p[2])
rate = size / seconds
print(f"slow_link_train: {name} of {size} bytes took {seconds * 1e3:.1f} ms: {rate / 1e6:.1f} MB/s")
if not rate < 1.3e8:
    sys.exit(f"slow_link_train: {rate / 1e6:.1f} MB/s is faster than tc's 1 Gb/s (125 MB/s)")
PY
  grep -q "sync ms per step | time to 50 % |" "$out/train-1gbit.txt" ||
    { echo "slow_link_train: no synchronization or time-to-accuracy column" >&2; exit 1; }
  grep -q "synchronization per step: predicted [0-9.e+-]* ms, measured" "$out/train-1gbit.txt" ||
    { echo "slow_link_train: the plan did not report predicted and measured time" >&2; exit 1; }
  [ "$(grep -c '^fp32,\|^topk-ef,\|^qsgd4,\|^plan,' "$out/curve-1gbit.csv")" -ge 8 ] ||
    { echo "slow_link_train: the accuracy curve lacks points" >&2; exit 1; }
  echo "slow_link_train: the link is as slow as tc made it; the plan and the baselines reported time to accuracy"
fi
