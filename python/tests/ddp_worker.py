"""Scenarios run inside each process of a Gloo group (spawned by test_ddp.py). Each returns
plain values that rank 0 writes for the test to check."""
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradzip
import gradzip.torch as gzt


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10))


def _batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)


def _train(model: nn.Module, state, hook, steps: int, first_step: int = 0, opt=None):
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for s in range(first_step, first_step + steps):
        x, y = _batch(dist.get_rank(), s)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return opt


def _params(model: nn.Module):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _local_grads(rank: int, seed: int, step: int) -> torch.Tensor:
    """This rank's flat gradient at the model's initial weights, in DDP's bucket order (one bucket: the parameters in order)."""
    model = _mlp(seed)
    x, y = _batch(rank, step)
    nn.functional.cross_entropy(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def average_matches_decoded_payloads(world: int):
    """One step with top-k (no error feedback): every rank's gradient is the mean of the decoded
    payloads of all ranks, as computed locally from each rank's gradient."""
    spec = "topk(ratio=0.05)"
    model = DDP(_mlp(1))
    state = gzt.GradzipState(spec, error_feedback=False, min_compression_rate=0)
    model.register_comm_hook(state, gzt.gradzip_hook)
    x, y = _batch(dist.get_rank(), 0)
    nn.functional.cross_entropy(model(x), y).backward()
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    codec = gradzip.Codec(spec)
    expected = codec.decompress_all([codec.compress(_local_grads(r, 1, 0), tensor_id=0) for r in range(world)],
                                    torch.empty_like(got)).div_(world)
    return {"max_abs_diff": float((got - expected).abs().max()), "bytes": state.counters.step_bytes,
            "nonzero": int((got != 0).sum()), "n": got.numel()}


def lossless_and_summable_match_plain_ddp(world: int):
    """The dense (lossless) codec through the gather path and fp16 through the allreduce path give
    DDP's own average (fp16: to fp16's precision)."""
    out = {}
    reference = DDP(_mlp(2))
    x, y = _batch(dist.get_rank(), 0)
    nn.functional.cross_entropy(reference(x), y).backward()
    ref = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
    for spec in ("dense", "fp16", "randomk(ratio=0.5,seed=3,scaled=0)"):
        model = DDP(_mlp(2))
        model.register_comm_hook(gzt.GradzipState(spec, error_feedback=False, min_compression_rate=0), gzt.gradzip_hook)
        nn.functional.cross_entropy(model(x), y).backward()
        got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        if spec.startswith("randomk"):
            kept = got != 0
            out[spec] = float((got[kept] - ref[kept]).abs().max() / ref.abs().max())
            out[spec + " kept"] = float(kept.float().mean())
        else:
            out[spec] = float((got - ref).abs().max() / ref.abs().max())
    return out


def powersgd_matches_a_local_simulation(world: int):
    """One PowerSGD step through the hook equals the same step simulated in this process with a
    compressor per rank (P and Q summed here in rank order)."""
    model = DDP(_mlp(3))
    state = gzt.PowerSGDState(matrix_approximation_rank=2, min_compression_rate=0, random_seed=5)
    model.register_comm_hook(state, gzt.powersgd_hook)
    x, y = _batch(dist.get_rank(), 0)
    nn.functional.cross_entropy(model(x), y).backward()
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])

    shapes = [list(p.shape) for p in model.parameters()]
    sims = [gradzip.PowerSGDCompressor(shapes, rank=2, min_compression_rate=0, seed=5) for _ in range(world)]
    grads = [_local_grads(r, 3, 0) for r in range(world)]
    p_bytes, q_bytes = sims[0].payload_bytes(0), sims[0].payload_bytes(1)
    ps = [torch.empty(p_bytes, dtype=torch.uint8) for _ in range(world)]
    qs = [torch.empty(q_bytes, dtype=torch.uint8) for _ in range(world)]
    for r in range(world):
        sims[r].compress_p(grads[r], ps[r], 0, 0)
    (po, pn), (qo, qn) = sims[0].factors_section(0), sims[0].factors_section(1)
    p_sum = sum(p[po:po + 4 * pn].view(torch.float32) for p in ps)
    for r in range(world):
        ps[r][po:po + 4 * pn].view(torch.float32).copy_(p_sum)
        sims[r].compress_q(ps[r], qs[r])
    q_sum = sum(q[qo:qo + 4 * qn].view(torch.float32) for q in qs)
    qs[0][qo:qo + 4 * qn].view(torch.float32).copy_(q_sum)
    expected = grads[dist.get_rank()].clone()
    sims[dist.get_rank()].decompress(qs[0], world, expected)
    # the biases went dense: their plain average
    for o, n in sims[0].dense_ranges():
        expected[o:o + n] = sum(g[o:o + n] for g in grads) / world
    return {"max_rel_diff": float((got - expected).abs().max() / expected.abs().max()),
            "compressed_bytes": state.counters.step_bytes, "n": got.numel()}


def _checkpoint_run(make_state, hook):
    """6 steps straight, against 3 steps, a checkpoint, a fresh DDP model restored from it, 3 steps."""
    model = DDP(_mlp(4))
    state = make_state()
    model.register_comm_hook(state, hook)
    opt = _train(model, state, hook, 6)
    straight = _params(model)

    model = DDP(_mlp(4))
    state = make_state()
    model.register_comm_hook(state, hook)
    opt = _train(model, state, hook, 3)
    path = os.path.join(tempfile.gettempdir(), f"gradzip_ckpt_{os.getpid()}.pt")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}, path)
    ckpt = torch.load(path, weights_only=False)
    os.remove(path)

    resumed = DDP(_mlp(99))  # other weights: everything must come from the checkpoint
    resumed.load_state_dict(ckpt["model"])
    opt = torch.optim.SGD(resumed.parameters(), lr=0.1, momentum=0.9)
    opt.load_state_dict(ckpt["opt"])
    state = make_state()
    state.load_state_dict(ckpt["hook"])
    resumed.register_comm_hook(state, hook)
    _train(resumed, state, hook, 3, first_step=3, opt=opt)
    return bool(torch.equal(straight, _params(resumed)))


def checkpoint_resume_is_bit_identical(world: int):
    return {
        "topk+ef": _checkpoint_run(lambda: gzt.GradzipState("topk(ratio=0.05)", min_compression_rate=0),
                                   gzt.gradzip_hook),
        "qsgd": _checkpoint_run(lambda: gzt.GradzipState(gradzip.QSGD(bits=4, seed=7), error_feedback=False,
                                                         start_iter=1), gzt.gradzip_hook),
        "powersgd": _checkpoint_run(lambda: gzt.PowerSGDState(matrix_approximation_rank=2, min_compression_rate=0),
                                    gzt.powersgd_hook),
    }


def corrupted_payload_names_its_rank(world: int):
    """Rank 1 sends a payload with an index past n: every rank's backward fails naming rank 1,
    and the gradients stay as they were."""
    model = DDP(_mlp(5))
    state = gzt.GradzipState("topk(ratio=0.05)", error_feedback=False, min_compression_rate=0)
    if dist.get_rank() == 1:
        real = state.codec.compress_into

        def corrupting(tensor, out, step=0, tensor_id=0):
            size = real(tensor, out, step, tensor_id)
            # COO's index section: the selected indices, ascending, as u32. Find it and write an
            # index past n over its last entry.
            chosen = (state.codec.decompress(out[:size], torch.empty(tensor.numel())) != 0).nonzero().reshape(-1)
            words = out[:size - size % 4].view(torch.int32)
            start = next(i for i in range(words.numel()) if torch.equal(words[i:i + 2], chosen[:2].int()))
            words[start + chosen.numel() - 1] = -1  # 4294967295
            return size

        state.codec.compress_into = corrupting
    model.register_comm_hook(state, gzt.gradzip_hook)
    x, y = _batch(dist.get_rank(), 0)
    try:
        nn.functional.cross_entropy(model(x), y).backward()
        return {"raised": ""}
    except Exception as e:  # DDP surfaces the hook's error from backward
        return {"raised": str(e)}


SCENARIOS = {
    "average": average_matches_decoded_payloads,
    "lossless": lossless_and_summable_match_plain_ddp,
    "powersgd": powersgd_matches_a_local_simulation,
    "checkpoint": checkpoint_resume_is_bit_identical,
    "corrupt": corrupted_payload_names_its_rank,
}


def run(rank: int, world: int, port: int, names, out_path: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {}
    for name in names:
        results[name] = SCENARIOS[name](world)
        dist.barrier()
    if rank == 0 or "corrupt" in names:
        torch.save(results, f"{out_path}.{rank}")
    dist.barrier()
    dist.destroy_process_group()
