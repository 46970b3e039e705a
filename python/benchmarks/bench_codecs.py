"""gradzip's codecs called from Python against the torch operation a PyTorch user would write
for the same job, on the same tensor, one thread each. Median of --repeats timings.

    python python/benchmarks/bench_codecs.py [--n 1048576] [--repeats 21]

Rows: gradzip compress and decompress_add; the torch peer (top-k: torch.topk of |x| plus the
gather of the values; fp16: x.half(); and back: a scatter_add_ or .float() add). Input GB/s is
the float32 input's bytes over the time.
"""
import argparse
import statistics
import time

import torch

import gradzip


def median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--repeats", type=int, default=21)
    args = ap.parse_args()
    if args.n < 100 or args.repeats < 1:
        raise SystemExit("--n must be >= 100 and --repeats >= 1")
    torch.set_num_threads(1)
    n = args.n
    x = torch.randn(n, generator=torch.Generator().manual_seed(1))
    accum = torch.zeros(n)
    k = n // 100

    def torch_topk():
        idx = torch.topk(x.abs(), k, sorted=False).indices
        return idx, x[idx]

    idx, vals = torch_topk()
    peers = {
        "topk(ratio=0.01)": (torch_topk, lambda: accum.scatter_add_(0, idx, vals)),
        "fp16": (lambda: x.half(), lambda: accum.add_(x.half().float())),
        "qsgd(bits=4)": (None, None),
        "scaled_sign": (None, None),
    }
    print(f"n = {n} float32, 1 thread, median of {args.repeats}")
    print(f"| codec | gradzip compress GB/s | torch peer GB/s | speed-up | gradzip decompress_add GB/s | "
          f"torch peer GB/s | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for spec, (peer_c, peer_d) in peers.items():
        codec = gradzip.Codec(spec)
        out = torch.empty(codec.max_compressed_bytes(n), dtype=torch.uint8)
        size = codec.compress_into(x, out)
        payload = out[:size]
        tc = median_seconds(lambda: codec.compress_into(x, out), args.repeats)
        td = median_seconds(lambda: codec.decompress_add(payload, accum), args.repeats)
        gb = 4 * n / 1e9
        row = [spec, f"{gb / tc:.2f}"]
        if peer_c is not None:
            pc, pd = median_seconds(peer_c, args.repeats), median_seconds(peer_d, args.repeats)
            row += [f"{gb / pc:.2f}", f"{pc / tc:.1f}x", f"{gb / td:.2f}", f"{gb / pd:.2f}", f"{pd / td:.1f}x"]
        else:
            row += ["—", "—", f"{gb / td:.2f}", "—", "—"]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
