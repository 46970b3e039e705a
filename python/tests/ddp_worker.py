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


def _simulated_step(sims, grads, step: int, tensor_id: int) -> torch.Tensor:
    """One PowerSGD step of every rank, here: compressor r on grads[r], P and Q summed in rank
    order; this rank's result (the tensors left dense: their plain average)."""
    world, me = len(sims), dist.get_rank()
    ps = [torch.empty(sims[0].payload_bytes(0), dtype=torch.uint8) for _ in range(world)]
    qs = [torch.empty(sims[0].payload_bytes(1), dtype=torch.uint8) for _ in range(world)]
    for r in range(world):
        sims[r].compress_p(grads[r], ps[r], step, tensor_id)
    (po, pn), (qo, qn) = sims[0].factors_section(0), sims[0].factors_section(1)
    p_sum = sum(p[po:po + 4 * pn].view(torch.float32) for p in ps)
    for r in range(world):
        ps[r][po:po + 4 * pn].view(torch.float32).copy_(p_sum)
        sims[r].compress_q(ps[r], qs[r])
    q_sum = sum(q[qo:qo + 4 * qn].view(torch.float32) for q in qs)
    qs[me][qo:qo + 4 * qn].view(torch.float32).copy_(q_sum)
    x = grads[me].clone()
    sims[me].decompress(qs[me], world, x)
    for o, n in sims[0].dense_ranges():
        x[o:o + n] = sum(g[o:o + n] for g in grads) / world
    return x


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
    expected = _simulated_step(sims, grads, 0, 0)
    return {"max_rel_diff": float((got - expected).abs().max() / expected.abs().max()),
            "compressed_bytes": state.counters.step_bytes, "n": got.numel()}


def _deep(seed: int) -> nn.Module:
    """Six 64x64 layers (25 KB each): several DDP buckets at bucket_cap_mb=0.06."""
    torch.manual_seed(seed)
    layers = [nn.Linear(64, 64) for _ in range(6)]
    return nn.Sequential(*layers[:3], nn.ReLU(), *layers[3:], nn.Linear(64, 10))


def _ddp(make_model, seed: int, cap: float) -> DDP:
    return DDP(make_model(seed), bucket_cap_mb=cap) if cap else DDP(make_model(seed))


def _checkpoint_run(make_state, hook, make_model=_mlp, cap: float = 0.0):
    """6 steps straight, against 3 steps, a checkpoint, a fresh DDP model restored from it, 3 steps."""
    model = _ddp(make_model, 4, cap)
    state = make_state()
    model.register_comm_hook(state, hook)
    opt = _train(model, state, hook, 6)
    straight = _params(model)

    model = _ddp(make_model, 4, cap)
    state = make_state()
    model.register_comm_hook(state, hook)
    opt = _train(model, state, hook, 3)
    path = os.path.join(tempfile.gettempdir(), f"gradzip_ckpt_{os.getpid()}.pt")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}, path)
    ckpt = torch.load(path, weights_only=False)
    os.remove(path)

    resumed = _ddp(make_model, 99, cap)  # other weights: everything must come from the checkpoint
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


def multibucket_checkpoint_resumes_bit_identically(world: int):
    """Several buckets, regrouped by DDP after the first step: the units keep the payloads'
    groupings across the resume."""
    return {
        "topk+ef": _checkpoint_run(lambda: gzt.GradzipState("topk(ratio=0.05)", min_compression_rate=0),
                                   gzt.gradzip_hook, _deep, 0.06),
        "threshold": _checkpoint_run(lambda: gzt.GradzipState("threshold(tau=0.01)", min_compression_rate=0),
                                     gzt.gradzip_hook, _deep, 0.06),
        "powersgd": _checkpoint_run(lambda: gzt.PowerSGDState(matrix_approximation_rank=2, min_compression_rate=0),
                                    gzt.powersgd_hook, _deep, 0.06),
    }


def multibucket_matches_plain_ddp(world: int):
    """Several buckets in flight: lossless codecs through every path (fixed-size gather,
    variable-size gather, allreduce) give plain DDP's average, step after step, and PowerSGD at
    full rank follows it (Gram-Schmidt in float on these nearly rank-deficient matrices loses
    some accuracy) without a collective out of order."""
    out = {}
    for spec in ("dense", "threshold(tau=0)", "fp16", "powersgd"):
        reference, model = _ddp(_deep, 6, 0.06), _ddp(_deep, 6, 0.06)
        if spec == "powersgd":
            state = gzt.PowerSGDState(matrix_approximation_rank=64, min_compression_rate=0,
                                      use_error_feedback=False, warm_start=False)
            model.register_comm_hook(state, gzt.powersgd_hook)
        else:
            state = gzt.GradzipState(spec, error_feedback=False, min_compression_rate=0)
            model.register_comm_hook(state, gzt.gradzip_hook)
        worst, cosine = 0.0, 1.0
        for step in range(4):
            x, y = _batch(dist.get_rank(), step)
            for m in (reference, model):
                m.zero_grad()
                nn.functional.cross_entropy(m(x), y).backward()
            ref = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
            got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            worst = max(worst, float((got - ref).abs().max() / ref.abs().max()))
            cosine = min(cosine, float(torch.nn.functional.cosine_similarity(got, ref, dim=0)))
        out[spec] = {"rel_err": worst, "cosine": cosine, "units": len(state.units)}
        if spec == "powersgd":
            out[spec]["sim_rel_err"] = _simulate_powersgd_units(state, got, world, step)
    return out


def _simulate_powersgd_units(state, got: torch.Tensor, world: int, step: int) -> float:
    """The hook's last step, simulated here unit by unit with a compressor per rank: parameter
    number k is model.parameters()[k] (DDP's first layout lists them in order)."""
    params = list(_deep(6).parameters())
    grads = []
    for r in range(world):
        model = _deep(6)
        x, y = _batch(r, step)
        nn.functional.cross_entropy(model(x), y).backward()
        grads.append([p.grad.reshape(-1) for p in model.parameters()])
    offsets = [0]
    for p in params:
        offsets.append(offsets[-1] + p.numel())
    expected = got.clone()
    for unit in state.units:
        shapes = [list(params[k].shape) for k in unit]
        sims = [gradzip.PowerSGDCompressor(shapes, rank=64, min_compression_rate=0, warm_start=False,
                                           error_feedback=False) for _ in range(world)]
        xs = [torch.cat([grads[r][k] for k in unit]) for r in range(world)]
        x = _simulated_step(sims, xs, step, unit[0])
        at = 0
        for k in unit:
            expected[offsets[k]:offsets[k + 1]] = x[at:at + params[k].numel()]
            at += params[k].numel()
    return float((got - expected).abs().max() / expected.abs().max())


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
    "multibucket": multibucket_matches_plain_ddp,
    "multibucket_checkpoint": multibucket_checkpoint_resumes_bit_identically,
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
