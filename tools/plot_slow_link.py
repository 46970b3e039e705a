#!/usr/bin/env python3
"""Test accuracy against training time on a slow link, one panel per link rate.

    python3 tools/plot_slow_link.py OUT.png RATE=CURVE.csv [RATE=CURVE.csv ...]

Each CURVE.csv is gradzip_mpi_train's --curve (key,epochs,seconds,accuracy), as
tools/slow_link_train.sh writes it (curve-1gbit.csv, ...). Needs matplotlib.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {
    "fp32": "fp32 allreduce",
    "topk-ef": "top-k 1 % + EF (compress everything)",
    "qsgd4": "QSGD 4-bit (compress everything)",
    "plan": "the planner's plan",
}


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    panels = [arg.split("=", 1) for arg in sys.argv[2:]]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, (rate, path) in zip(axes[0], panels):
        with open(path) as f:
            rows = list(csv.DictReader(f))
        for key in dict.fromkeys(r["key"] for r in rows):
            points = [(float(r["seconds"]), float(r["accuracy"])) for r in rows if r["key"] == key]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3,
                    label=LABELS.get(key, key))
        ax.set_xlabel("training time (s), evaluation excluded")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"Fashion-MNIST MLP, 2 MPI ranks, tc link {rate}", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=120)


if __name__ == "__main__":
    main()
