#!/usr/bin/env python3
"""Bytes received per rank against the rank count, for each way of synchronizing sparse gradients.

    python3 tools/plot_sparse_sync.py MODEL.csv OUT.png MEASURED.csv [MEASURED.csv ...]

MODEL.csv is gradzip_zen_embedding's --model-csv (the cost model, extrapolated); each MEASURED.csv
its --csv at one rank count. Lines: the model; points: the measurements. Needs matplotlib.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

NAMES = {"dense": "dense allreduce", "allgather": "sparse allgather", "zen": "Zen Balanced Parallelism",
         "hierarchy": "Zen Hierarchical Centralization"}


def main():
    model_path, out_path, measured_paths = sys.argv[1], sys.argv[2], sys.argv[3:]
    model = {}
    with open(model_path) as f:
        for row in csv.DictReader(f):
            model.setdefault(row["scheme"], []).append((int(row["ranks"]), float(row["received_bytes"])))
    measured = {}
    for path in measured_paths:
        with open(path) as f:
            for row in csv.DictReader(f):
                measured.setdefault(row["scheme"], []).append((int(row["ranks"]), float(row["received"])))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (key, name) in enumerate(NAMES.items()):
        color = f"C{i}"
        if key in model:
            xs, ys = zip(*sorted(model[key]))
            ax.plot(xs, ys, color=color, label=f"{name} (model)")
        if key in measured:
            xs, ys = zip(*sorted(measured[key]))
            ax.plot(xs, ys, "o", color=color, label=f"{name} (measured)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks P")
    ax.set_ylabel("bytes received per rank per step")
    ax.set_title("Hashed-feature embedding on Fashion-MNIST (n = 8.4 M, 1.4 % per rank)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)


if __name__ == "__main__":
    main()
