#!/usr/bin/env python3
"""PowerSGD side by side: gradzip against PyTorch's powerSGD_hook math, on the same matrices.

For each matrix and rank 1, 2 and 4, on one process (no collective: the math alone):
- relative error |P Q^T - M| / |M| after one step from a random Q;
- the same after 10 steps with warm start on the same M (the power iteration converging);
- the median time of a training step with error feedback and warm start:
  M += e; P = M Q; orthogonalize P; Q = M^T P; approx = P Q^T; e = M - approx.

PyTorch's side calls the hook's own `_orthogonalize` (Gram-Schmidt at rank <= 2, QR above) and
`torch.matmul` into preallocated outputs, as `powerSGD_hook` does. gradzip's side is
build/benchmarks/gradzip_powersgd_compare. Both run with the same thread count.

    python3 benchmarks/powersgd_vs_torch.py --compare build/benchmarks/gradzip_powersgd_compare \
        [--threads 1] [--repeats 20]

Prints a markdown table (docs/lowrank.md holds the one measured on this project's machine).
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

import numpy as np
import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

# rows x cols as PyTorch views each weight: ResNet-50's 3x3 conv of 512 channels (512 x 4608),
# a transformer MLP weight (1024 x 4096), the MLP of examples/mpi_train (128 x 784).
SHAPES = [(512, 4608), (1024, 4096), (128, 784)]
RANKS = [1, 2, 4]


def gradient_like(rows, cols, seed):
    """A matrix with a decaying spectrum, as gradients have: singular values 1 / (1 + k)^1.5 over
    random orthonormal factors, plus 1 % dense noise."""
    rng = np.random.default_rng(seed)
    k = min(rows, cols, 64)
    u, _ = np.linalg.qr(rng.standard_normal((rows, k)))
    v, _ = np.linalg.qr(rng.standard_normal((cols, k)))
    s = 1.0 / (1.0 + np.arange(k)) ** 1.5
    m = (u * s) @ v.T
    m += 0.01 * np.linalg.norm(m) / np.sqrt(m.size) * rng.standard_normal((rows, cols))
    return m.astype(np.float32)


def torch_step(m, q, p, approx, error, eps):
    """One step of powerSGD_hook's math on one matrix (batch of one, as the hook's bmm)."""
    m.add_(error)
    _orthogonalize(q.unsqueeze(0), eps)
    torch.matmul(m, q, out=p)
    _orthogonalize(p.unsqueeze(0), eps)
    torch.matmul(m.t(), p, out=q)
    torch.matmul(p, q.t(), out=approx)
    torch.sub(m, approx, out=error)


def torch_errors(m, rank, warm_steps, eps=0.0):
    gen = torch.Generator().manual_seed(0)
    rows, cols = m.shape

    def run(steps):
        q = torch.randn(cols, rank, generator=gen)
        p = torch.empty(rows, rank)
        approx = torch.empty(rows, cols)
        for _ in range(steps):  # no error feedback: M stays the same
            _orthogonalize(q.unsqueeze(0), eps)
            torch.matmul(m, q, out=p)
            _orthogonalize(p.unsqueeze(0), eps)
            torch.matmul(m.t(), p, out=q)
            torch.matmul(p, q.t(), out=approx)
        return (torch.linalg.vector_norm(approx - m) / torch.linalg.vector_norm(m)).item()

    return run(1), run(warm_steps)


def torch_time(m0, rank, repeats):
    rows, cols = m0.shape
    q = torch.randn(cols, rank)
    p = torch.empty(rows, rank)
    approx = torch.empty(rows, cols)
    error = torch.zeros(rows, cols)
    times = []
    for s in range(repeats + 2):
        m = m0.clone()  # the hook's input buffer: fresh gradients each step (the clone is not timed)
        start = time.perf_counter()
        torch_step(m, q, p, approx, error, 0.0)
        if s >= 2:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", required=True, help="path of gradzip_powersgd_compare")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warm-steps", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), median of {args.repeats} steps; "
          f"errors after 1 step and after {args.warm_steps} warm-start steps\n")
    print("| matrix | rank | error, 1 step: gradzip / torch | error, warm: gradzip / torch "
          "| step ms: gradzip / torch | speed-up |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (rows, cols) in enumerate(SHAPES):
            m = gradient_like(rows, cols, seed=i)
            path = os.path.join(tmp, f"m{i}.f32")
            m.tofile(path)
            mt = torch.from_numpy(m)
            for rank in RANKS:
                out = subprocess.run([args.compare, path, str(rows), str(cols), str(rank), str(args.threads),
                                      str(args.repeats), str(args.warm_steps)],
                                     check=True, capture_output=True, text=True).stdout
                g = json.loads(out)
                t_one, t_warm = torch_errors(mt, rank, args.warm_steps)
                t_ms = torch_time(mt, rank, args.repeats)
                print(f"| {rows} x {cols} | {rank} | {g['error_one_step']:.4f} / {t_one:.4f} "
                      f"| {g['error_warm']:.4f} / {t_warm:.4f} | {g['median_ms']:.3f} / {t_ms:.3f} "
                      f"| {t_ms / g['median_ms']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
