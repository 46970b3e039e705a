#!/usr/bin/env python3
"""Simulated iteration time against link speed, for each strategy and model.

    python3 tools/plot_scheduling.py OUT.png RESNET.csv BERT.csv

Each CSV is gradzip_plan's --csv (model, gbps, strategy, iteration_ms, groups, payload_MB).
Needs matplotlib.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

NAMES = {"fp32": "no compression (fp32, DDP buckets)", "layerwise": "compress everything, layer-wise",
         "cupcake": "Cupcake fusion", "plan": "Espresso plan"}


def main():
    out_path, inputs = sys.argv[1], sys.argv[2:]
    fig, axes = plt.subplots(1, len(inputs), figsize=(6 * len(inputs), 4.2))
    if len(inputs) == 1:
        axes = [axes]
    for ax, path in zip(axes, inputs):
        lines, model = {}, ""
        with open(path) as f:
            for row in csv.DictReader(f):
                model = row["model"]
                lines.setdefault(row["strategy"], []).append((float(row["gbps"]), float(row["iteration_ms"])))
        for strategy, points in lines.items():
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=NAMES.get(strategy, strategy))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("link speed (Gb/s)")
        ax.set_ylabel("simulated iteration time (ms)")
        ax.set_title(model)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)


if __name__ == "__main__":
    main()
