"""PyTorch's own CUDA operations that gradzip_bench_cuda's kernels replace, timed the same way.

For a GPU machine: CUDA events, the L2 flushed (a write of twice its size) before each run, the
median of 60 runs after a warm-up, fp32 inputs of 2^20, 2^24 and 2^28 elements drawn from a
Student's t with 3 degrees of freedom (heavy-tailed like gradzip's synthetic gradient):

  copy      y.copy_(x), the roofline the gradzip benchmarks report beside themselves;
  fp16      x.half() (the peer of cast_fp16's compress);
  bf16      x.bfloat16() (cast_bf16);
  topk1     torch.topk(x.abs(), n // 100) (exact top-k at 1 %, sorted=False).

    python3 benchmarks/peer_torch_cuda.py [--out peer.json]

Prints one line per operation and size: median microseconds and input GB/s.
"""
import argparse
import json
import statistics

import torch


def time_median(fn, flush, runs=60):
    fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(runs):
        flush.zero_()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    flush = torch.empty(2 * props.L2_cache_size // 4 + 1, device="cuda")
    t3 = torch.distributions.StudentT(torch.tensor(3.0, device="cuda"))
    rows = []
    for log2 in (20, 24, 28):
        n = 1 << log2
        x = (t3.sample((n,)) * 1e-3).float()
        y = torch.empty_like(x)
        ops = {
            "copy": lambda: y.copy_(x),
            "fp16": lambda: x.half(),
            "bf16": lambda: x.bfloat16(),
            "topk1": lambda: torch.topk(x.abs(), n // 100, sorted=False),
        }
        for name, fn in ops.items():
            seconds = time_median(fn, flush)
            rows.append({"name": f"torch_{name}/{n}", "median_us": seconds * 1e6, "input_GBps": 4 * n / seconds / 1e9})
            print(f"{rows[-1]['name']:24s} {rows[-1]['median_us']:10.1f} us {rows[-1]['input_GBps']:8.1f} GB/s", flush=True)
        del x, y
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": props.name, "torch": torch.__version__, "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
