#!/usr/bin/env python3
"""Markdown tables from a GPU run's results (tools/gpu_checks.sh writes them; the first run's are
in benchmarks/results/h100-2026-11-25/).

    python3 tools/gpu_tables.py DIR

Columns: the median time of 60 runs (L2 flushed before each), input GB/s, total IO GB/s (input
read + payload or output written, where the benchmark counts it), and the fraction of the SM copy
kernel measured in the same run (total IO over copy IO for the quantizers, input rate over the
copy's input rate for the rest: the benchmark's own `roofline` counter).
"""
import glob
import json
import os
import re
import sys


def load(directory):
    runs = {}
    for path in sorted(glob.glob(os.path.join(directory, "bench_*.json"))):
        if path.endswith("_repeat.json"):
            continue
        try:
            benchmarks = json.load(open(path))["benchmarks"]
        except (ValueError, KeyError) as e:  # a run cut off by its time limit leaves half a file
            print(f"{path}: unreadable ({e}), left out", file=sys.stderr)
            continue
        for r in benchmarks:
            if "median_us" not in r:  # skipped or failed (no GPU, a timeout): nothing to show
                continue
            runs[r["name"].split("/iterations")[0].replace("/manual_time", "")] = r
    return runs


def size_label(n):
    return f"2^{n.bit_length() - 1}"


def table(runs, prefixes, sizes=(1 << 20, 1 << 24, 1 << 28)):
    """One row per benchmark whose name starts with one of prefixes, in the order run."""
    names = []
    for k in runs:
        base = k.rsplit("/", 1)[0]
        if (k.rsplit("/", 1)[-1].isdigit() and base.startswith(prefixes) and "_phases" not in base
                and "_start<" not in base and base not in names):
            names.append(base)
    head = "| benchmark | " + " | ".join(f"{size_label(n)} µs" for n in sizes)
    head += f" | {size_label(sizes[-1])} input GB/s | total IO GB/s | of copy |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name in names:
        cells = [f"{runs[f'{name}/{n}']['median_us']:.1f}" if f"{name}/{n}" in runs else "" for n in sizes]
        last = runs.get(f"{name}/{sizes[-1]}")
        if last is None:  # a run cut short
            lines.append(f"| {name} | " + " | ".join(cells) + " | - | - | - |")
            continue
        io = last.get("total_IO_GBps")
        lines.append(f"| {name} | " + " | ".join(cells) +
                     f" | {last['input_GBps']:.0f} | {f'{io:.0f}' if io else '-'} | {last['roofline']:.2f} |")
    return "\n".join(lines)


def topk_start(runs):
    """BM_cuda_topk_start: the whole select with its start forced, no events between launches."""
    sizes = sorted({int(k.rsplit("/", 1)[-1]) for k in runs if k.startswith("BM_cuda_topk_start<")})
    lines = ["| n | radix only µs | sampled always µs | sampled / radix |", "|---|---|---|---|"]
    for n in sizes:
        a = runs.get(f"BM_cuda_topk_start<topk_start::radix>/{n}")
        b = runs.get(f"BM_cuda_topk_start<topk_start::sampled>/{n}")
        if a and b:
            lines.append(f"| {n:,} | {a['median_us']:.1f} | {b['median_us']:.1f} | "
                         f"{b['median_us'] / a['median_us']:.3f} |")
    return "\n".join(lines)


def fusion(runs):
    """cuda_fusion: mode 0 one call per tensor, 1 per fusion group, 2 one call for the model."""
    lines = ["| codec | call | per tensor µs (calls) | per group µs (calls) | fused µs (calls) | per tensor / fused |",
             "|---|---|---|---|---|---|"]
    for call in ("compress", "decompress_add"):
        for codec in ("topk1", "qsgd4", "fp16"):
            m = [runs.get(f"cuda_fusion_{call}/{codec}/mode:{i}") for i in range(3)]
            if all(m):
                lines.append(f"| {codec} | {call} | " + " | ".join(f"{r['median_us']:.1f} ({r['calls']:.0f})" for r in m) +
                             f" | {m[0]['median_us'] / m[2]['median_us']:.1f}x |")
    return "\n".join(lines)


# In launch order; the selects were launches of their own before 2026-11-26.
TOPK_LAUNCHES = ("init0", "sample0", "compact_sampled0", "histogram0", "select0", "compact0", "select1",
                 "histogram_sampled0", "histogram1", "select2", "emit0")


def topk_phases(runs, sizes=(1 << 20, 1 << 24, 1 << 28)):
    """BM_cuda_topk_phases: each launch's median µs, under each way of counting digits."""
    found = [(k, r) for k, r in runs.items() if k.startswith("BM_cuda_topk_phases") and "median_us" in r and
             k.rsplit("/", 1)[-1].isdigit() and int(k.rsplit("/", 1)[-1]) in sizes]
    timed = {c[:-3] for _, r in found for c in r if c.endswith("_us")} - {"median"}
    launches = [c for c in TOPK_LAUNCHES if c in timed] + sorted(timed - set(TOPK_LAUNCHES))
    lines = ["| counting | input | n | " + " | ".join(launches) + " | total µs |", "|" + "---|" * (len(launches) + 4)]
    for k, r in found:
        counting = re.search(r"topk_counting::(\w+)", k).group(1)
        start = ", radix only" if "topk_start::radix" in k else ", sampled always" if "topk_start::sampled" in k else ""
        data = ("one binade" if "one_binade" in k else "synthetic") + start
        cells = [f"{r[f'{c}_us']:.1f}" if f"{c}_us" in r else "" for c in launches]
        lines.append(f"| {counting} | {data} | {size_label(int(k.rsplit('/', 1)[-1]))} | " + " | ".join(cells) +
                     f" | {r['median_us']:.1f} |")
    return "\n".join(lines)


def sparse_sync(runs):
    lines = ["| n | nonzeros | µs per step |", "|---|---|---|"]
    for k, r in runs.items():
        if k.startswith("BM_cuda_sparse_sync/"):
            n = int(k.split("/")[1])
            lines.append(f"| {size_label(n)} | {r['nonzeros']:.0f} | {r['median_us']:.1f} |")
    return "\n".join(lines)


def peers(directory, runs):
    path = os.path.join(directory, "peer_torch.json")
    if not os.path.exists(path):
        return ""
    torch = {r["name"]: r for r in json.load(open(path))["runs"]}
    pairs = [("torch_topk1", "BM_cuda_topk<float>", "exact top-k 1 %, fp32"),
             ("torch_fp16", "cuda_compress/cast_fp16/f32", "fp32 to fp16"),
             ("torch_bf16", "cuda_compress/cast_bf16/f32", "fp32 to bf16")]
    lines = ["| operation | n | torch µs | gradzip µs | gradzip / torch time |", "|---|---|---|---|---|"]
    for t, g, label in pairs:
        for n in (1 << 20, 1 << 24, 1 << 28):
            a, b = torch.get(f"{t}/{n}"), runs.get(f"{g}/{n}")
            if a and b:
                lines.append(f"| {label} | {size_label(n)} | {a['median_us']:.1f} | {b['median_us']:.1f} | "
                             f"{b['median_us'] / a['median_us']:.2f} |")
    return "\n".join(lines)


def main():
    directory = sys.argv[1]
    runs = load(directory)
    for title, prefixes in [("Quantizers: compress", ("cuda_compress",)),
                            ("Quantizers: decompress_add", ("cuda_decompress_add",)),
                            ("Sparsifiers", ("BM_cuda_topk", "BM_cub_device_topk", "BM_cuda_sampled",
                                             "BM_cuda_threshold")),
                            ("Sketches, hashing, partition", ("BM_cuda_count", "BM_cuda_fetchsgd", "BM_cuda_simhash",
                                                              "BM_cuda_hashed", "BM_cuda_partition"))]:
        print(f"\n### {title}\n\n{table(runs, prefixes)}")
    print(f"\n### Exact top-k, kernel by kernel (1 %, fp32)\n\n{topk_phases(runs)}")
    print(f"\n### Exact top-k by its start (1 %, fp32, no events between launches)\n\n{topk_start(runs)}")
    print(f"\n### Fusion groups\n\n{fusion(runs)}")
    print(f"\n### Zen sparse_sync, one step on one rank, 1 % nonzeros\n\n{sparse_sync(runs)}")
    print(f"\n### PyTorch beside gradzip\n\n{peers(directory, runs)}")


if __name__ == "__main__":
    main()
