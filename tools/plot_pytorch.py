#!/usr/bin/env python3
"""Test accuracy against bytes per step for each DDP hook of python/examples/ddp_fashion_mnist.py.

    python3 tools/plot_pytorch.py RUNS.csv OUT.png

RUNS.csv is the example's --csv. PyTorch's own hooks are drawn as squares, gradzip's as circles.
Needs matplotlib.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    with open(sys.argv[1]) as f:
        rows = list(csv.DictReader(f))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        ours = r["run"].startswith("gz-")
        x, y = float(r["bytes_per_step"]), 100 * float(r["accuracy"])
        ax.scatter(x, y, marker="o" if ours else "s", color="tab:blue" if ours else "tab:orange", s=40)
        ax.annotate(r["run"], (x, y), textcoords="offset points", xytext=(5, 4) if ours else (5, -11), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("bytes sent per step by one rank (log)")
    ax.set_ylabel("test accuracy after 3 epochs (%)")
    ax.set_title("Fashion-MNIST MLP, 4 Gloo processes: PyTorch's hooks (squares), gradzip's (circles)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)


if __name__ == "__main__":
    main()
