"""Data-parallel training of Fashion-MNIST under torch.distributed (Gloo, CPU), side by side:
no hook, PyTorch's fp16 and PowerSGD hooks, and gradzip's hooks.

Each run spawns --world processes. The model is the 784-128-10 MLP of examples/mpi_train.cpp.
Every rank reads Debian's dataset-fashion-mnist, takes its share of each global batch in an
order seeded by the epoch, and trains with SGD (momentum 0.9). Rank 0 reports the test accuracy,
the bytes its hook sent per step (after the warm-up steps) and the median step time.

    python python/examples/ddp_fashion_mnist.py --epochs 3 --world 4 --csv out.csv

Runs: none, torch-fp16, torch-powersgd1, torch-powersgd4, gz-fp16, gz-topk1-ef, gz-qsgd4, gz-scaledsign-ef,
gz-powersgd1, gz-powersgd4 (--runs picks a comma-separated subset).
"""
import argparse
import csv
import gzip
import os
import socket
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd
from torch.nn.parallel import DistributedDataParallel as DDP

import gradzip
import gradzip.torch as gzt

DATA = os.environ.get("GRADZIP_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
WARMUP = 10  # PowerSGD's start_powerSGD_iter, for both implementations; bytes are counted after it


def load(kind: str):
    with gzip.open(os.path.join(DATA, f"{kind}-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784).astype(np.float32) / 255.0
    with gzip.open(os.path.join(DATA, f"{kind}-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
    return torch.from_numpy(images), torch.from_numpy(labels)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))


def torch_powersgd_bytes(m: nn.Module, rank: int) -> int:
    """Bytes PyTorch's powerSGD_hook allreduces per step: P and Q of each matrix it compresses
    (its _should_compress rule, min_compression_rate 2), the other tensors as they are."""
    total = 0
    for p in m.parameters():
        rows, cols = (p.shape[0], p.numel() // p.shape[0]) if p.dim() > 1 else (p.numel(), 1)
        r = min(rows, cols, rank)
        compress = p.dim() > 1 and (rows + cols) * r * 2 < rows * cols
        total += 4 * ((rows + cols) * r if compress else p.numel())
    return total


def register(run: str, ddp: DDP):
    """Registers the run's hook; returns a function giving the bytes sent in the last step."""
    n = sum(p.numel() for p in ddp.parameters())
    if run == "none":
        return lambda: 4 * n
    if run == "torch-fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return lambda: 2 * n
    if run.startswith("torch-powersgd"):
        rank = int(run[len("torch-powersgd"):])
        state = torch_powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                             start_powerSGD_iter=WARMUP, random_seed=0)
        ddp.register_comm_hook(state, torch_powersgd.powerSGD_hook)
        steady = torch_powersgd_bytes(ddp.module, rank)
        return lambda: steady
    if run.startswith("gz-powersgd"):
        state = gzt.PowerSGDState(matrix_approximation_rank=int(run[len("gz-powersgd"):]),
                                  start_powerSGD_iter=WARMUP)
        ddp.register_comm_hook(state, gzt.powersgd_hook)
        return lambda: state.counters.step_bytes
    codecs = {"gz-fp16": (gradzip.FP16(), False), "gz-topk1-ef": (gradzip.TopK(ratio=0.01), True), "gz-qsgd4": (gradzip.QSGD(bits=4, seed=1), False),
              "gz-scaledsign-ef": (gradzip.Dense(gradzip.ScaledSign()), True)}
    if run not in codecs:
        raise SystemExit(f"unknown run {run!r}")
    codec, ef = codecs[run]
    state = gzt.GradzipState(codec, error_feedback=ef)
    ddp.register_comm_hook(state, gzt.gradzip_hook)
    return lambda: state.counters.step_bytes


def worker(rank: int, world: int, port: int, run: str, epochs: int, batch: int, out: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    images, labels = load("train")
    ddp = DDP(model())
    sent = register(run, ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    step_times, step_bytes, step = [], [], 0
    for epoch in range(epochs):
        order = torch.randperm(images.shape[0], generator=torch.Generator().manual_seed(epoch))
        for start in range(0, images.shape[0] - world * batch + 1, world * batch):
            idx = order[start + rank * batch: start + (rank + 1) * batch]
            t0 = time.perf_counter()
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(images[idx]), labels[idx]).backward()
            opt.step()
            step_times.append(time.perf_counter() - t0)
            if step >= WARMUP:
                step_bytes.append(sent())
            step += 1
    if rank == 0:
        test_x, test_y = load("t10k")
        with torch.no_grad():
            accuracy = (ddp.module(test_x).argmax(1) == test_y).float().mean().item()
        torch.save({"accuracy": accuracy, "bytes": statistics.mean(step_bytes),
                    "step_ms": 1e3 * statistics.median(step_times), "steps": step}, out)
    dist.barrier()  # no rank leaves while rank 0 evaluates
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="none,torch-fp16,torch-powersgd1,torch-powersgd4,gz-fp16,gz-topk1-ef,gz-qsgd4,"
                                      "gz-scaledsign-ef,gz-powersgd1,gz-powersgd4")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64, help="per rank")
    ap.add_argument("--csv", default="")
    args = ap.parse_args()
    if args.epochs < 1 or args.world < 1 or args.batch < 1:
        raise SystemExit("--epochs, --world and --batch must be >= 1")
    rows = []
    print(f"{'run':<18} {'accuracy':>9} {'bytes/step':>11} {'vs fp32':>8} {'step ms':>8}", flush=True)
    for run in args.runs.split(","):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        out = f"/tmp/gradzip_ddp_{os.getpid()}_{run}.pt"
        mp.spawn(worker, args=(args.world, port, run, args.epochs, args.batch, out), nprocs=args.world, join=True)
        r = torch.load(out)
        os.remove(out)
        dense = 4 * sum(p.numel() for p in model().parameters())
        rows.append({"run": run, "accuracy": r["accuracy"], "bytes_per_step": r["bytes"],
                     "vs_fp32": r["bytes"] / dense, "step_ms": r["step_ms"], "steps": r["steps"]})
        print(f"{run:<18} {100 * r['accuracy']:>8.2f}% {r['bytes']:>11.0f} {r['bytes'] / dense:>8.4f} "
              f"{r['step_ms']:>8.2f}", flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
