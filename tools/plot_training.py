#!/usr/bin/env python3
"""Plots test accuracy against bytes sent per step (relative to an fp32 allreduce) from the CSV
that `gradzip_mpi_train --csv` writes, for docs/training.md.

    python3 tools/plot_training.py results.csv docs/training.png

Needs matplotlib (pip install matplotlib); the library itself never uses Python.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(source: str, target: str) -> None:
    with open(source, newline="") as f:
        rows = list(csv.DictReader(f))
    baseline = next((float(r["accuracy"]) for r in rows if r["key"] == "fp32"), None)
    markers = "osD^vP*Xh<>"
    fig, (full, zoom) = plt.subplots(1, 2, figsize=(11, 4.6), dpi=120, gridspec_kw={"width_ratios": [1, 1.25]})
    for ax in (full, zoom):
        for i, r in enumerate(rows):
            ax.scatter(float(r["bytes_ratio"]), float(r["accuracy"]), s=55, marker=markers[i % len(markers)],
                       label=r["name"], zorder=3)
        if baseline is not None:
            ax.axhline(baseline, color="gray", linewidth=0.8, linestyle="--")
            ax.axhline(baseline - 2.0, color="gray", linewidth=0.8, linestyle=":")
        ax.set_xscale("log")
        ax.set_xlabel("bytes sent per step / fp32 allreduce (log)")
        ax.grid(True, which="both", linewidth=0.3)
    full.set_ylabel("test accuracy (%)")
    full.set_title("all codecs")
    if baseline is not None:
        zoom.set_ylim(baseline - 5.0, baseline + 1.0)
        zoom.set_title("near fp32 (dashed: fp32, dotted: fp32 - 2 points)")
    zoom.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8)
    fig.suptitle("Fashion-MNIST 784-128-10 MLP, 4 MPI ranks, gradients through gradzip")
    fig.tight_layout()
    fig.savefig(target)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot_training.py results.csv output.png")
    main(sys.argv[1], sys.argv[2])
