"""DDP communication hooks that send gradzip payloads through ``torch.distributed``.

::

    import gradzip, gradzip.torch
    state = gradzip.torch.GradzipState(codec=gradzip.TopK(ratio=0.01), error_feedback=True)
    ddp_model.register_comm_hook(state, gradzip.torch.gradzip_hook)

``gradzip_hook`` compresses each bucket once (with error feedback when asked), then:

* a summable codec (fp16, bf16, random-k with a shared seed) allreduces its values section;
* any other codec allgathers the payloads (sizes first, unless the codec's payloads all have
  the same size) and decodes them all in one validated pass: a bad payload raises :class:`gradzip.FormatError` naming the rank that sent it, and the
  bucket is left as it was.

``powersgd_hook`` runs gradzip's PowerSGD (three allreduces a step, like PyTorch's
``powerSGD_hook``). The output is the average over ranks, as DDP expects.

**Checkpoints continue bit for bit.** DDP lays its buckets out once in parameter order, then,
after the first backward, again in the order gradients became ready; a model restored from a
checkpoint starts over with the first layout. A codec's payload depends on the order of its input
(top-k's indices, a quantizer's buckets), so the hooks compress every bucket in one *canonical*
order: its parameters sorted by the order in which the state first saw them (the same in every
run, since DDP's first layout is). Error-feedback residuals are kept per parameter in that order.
``state_dict`` / ``load_state_dict`` then resume bit-identically whenever DDP groups the same
parameters into each bucket (always with one bucket; with several, when the rebuilt buckets hold
the same parameters as the first ones). A bucket in another layout costs one gather and one
scatter of its gradients a step.
"""

import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import Codec, FormatError, PowerSGDCompressor, SpecLike

__all__ = ["GradzipState", "gradzip_hook", "PowerSGDState", "powersgd_hook"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _allreduce_average(group: Any, world: int, buf: torch.Tensor) -> torch.futures.Future:
    fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(world))


class _Counters:
    """Bytes this rank sent: in the last step and in total (the hooks' own accounting)."""

    def __init__(self) -> None:
        self.sent_bytes = 0
        self.step_bytes = 0

    def add(self, n: int) -> None:
        self.sent_bytes += n
        self.step_bytes += n


class _Layout:
    """A bucket's tensors in canonical order: `keys` (canonical parameter numbers, ascending),
    their sizes, and where each sits in DDP's buffer now."""

    def __init__(self, keys: List[int], sizes: List[int], offsets: List[int]) -> None:
        self.keys, self.sizes, self.offsets = keys, sizes, offsets
        self.identity = offsets == [sum(sizes[:i]) for i in range(len(sizes))]

    def gather(self, buf: torch.Tensor) -> torch.Tensor:
        """The bucket in canonical order: `buf` itself when it already is."""
        if self.identity:
            return buf
        return torch.cat([buf[o:o + n] for o, n in zip(self.offsets, self.sizes)])

    def scatter(self, canonical: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        if canonical.data_ptr() != buf.data_ptr():
            at = 0
            for o, n in zip(self.offsets, self.sizes):
                buf[o:o + n].copy_(canonical[at:at + n])
                at += n
        return buf


class _HookState:
    """What both hooks share: the group, the step counter, the canonical parameter numbering."""

    def __init__(self, process_group: Optional[Any], start_iter: int, threads: int) -> None:
        if start_iter < 0:
            raise ValueError(f"{type(self).__name__}: start_iter must be >= 0, got {start_iter}")
        if threads < 0:
            raise ValueError(f"{type(self).__name__}: threads must be >= 0, got {threads}")
        self.process_group = process_group
        self.start_iter = start_iter
        self.threads = threads
        self.iter = 0
        self.counters = _Counters()
        self._numbers: Dict[int, int] = {}  # id(parameter) -> canonical number

    def _begin(self, bucket: dist.GradBucket, name: str) -> Tuple[Any, int, torch.Tensor, int, _Layout]:
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        buf = bucket.buffer()
        if buf.dtype != torch.float32 or buf.device.type != "cpu":
            raise TypeError(f"{name}: bucket {bucket.index()} is {buf.dtype} on {buf.device}; this gradzip build "
                            "compresses float32 CPU buckets (docs/python.md)")
        step = self.iter
        if bucket.index() == 0:
            self.counters.step_bytes = 0
        if bucket.is_last():
            self.iter += 1
        # Numbered on every step, uncompressed ones included, so that the numbering comes from
        # DDP's first layout in every run.
        return group, dist.get_world_size(group), buf, step, self._layout(bucket)

    def _layout(self, bucket: dist.GradBucket) -> _Layout:
        params = bucket.parameters()
        base = bucket.buffer().data_ptr()
        entries = []
        for p, g in zip(params, bucket.gradients()):
            number = self._numbers.setdefault(id(p), len(self._numbers))
            entries.append((number, p.numel(), (g.data_ptr() - base) // 4))
        entries.sort()
        return _Layout([e[0] for e in entries], [e[1] for e in entries], [e[2] for e in entries])


class GradzipState(_HookState):
    """State of :func:`gradzip_hook`.

    Args:
        codec: a spec string or spec object (``gradzip.TopK(ratio=0.01)``).
        process_group: the group to reduce over (the default group when None).
        error_feedback: keep what compression drops, per parameter, and add it to the next step.
        start_iter: steps (from 0) that allreduce uncompressed first, like PowerSGD's
            ``start_powerSGD_iter``.
        min_compression_rate: a bucket whose payload would not be this many times smaller than
            its fp32 bytes is allreduced uncompressed (small buckets of biases and norms). 1.5
            by default, so that the 16-bit casts (2x less a header) are compressed.
        threads: host threads per codec call.
    """

    def __init__(self, codec: SpecLike, process_group: Optional[Any] = None, error_feedback: bool = True,
                 start_iter: int = 0, min_compression_rate: float = 1.5, threads: int = 1) -> None:
        super().__init__(process_group, start_iter, threads)
        if not min_compression_rate >= 0:
            raise ValueError(f"GradzipState: min_compression_rate must be >= 0, got {min_compression_rate}")
        self.codec = codec if isinstance(codec, Codec) else Codec(codec, threads)
        self.error_feedback = error_feedback
        self.min_compression_rate = min_compression_rate
        self._residuals: Dict[int, torch.Tensor] = {}  # canonical number -> that parameter's residual
        self._payloads: Dict[int, torch.Tensor] = {}

    def state_dict(self) -> Dict[str, Any]:
        """The codec, the step counter and each parameter's residual."""
        return {"spec": self.codec.spec, "iter": self.iter,
                "residuals": {k: v.clone() for k, v in self._residuals.items()}}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if state.get("spec") != self.codec.spec:
            raise ValueError(f"GradzipState.load_state_dict: the checkpoint is for codec {state.get('spec')!r}, "
                             f"this state's is {self.codec.spec!r}")
        residuals = state["residuals"]
        for k, v in residuals.items():
            if not (isinstance(v, torch.Tensor) and v.dtype == torch.float32 and v.dim() == 1):
                raise ValueError(f"GradzipState.load_state_dict: residual {k} is not a 1-D float32 tensor")
        self.iter = int(state["iter"])
        self._residuals = {int(k): v.clone() for k, v in residuals.items()}

    def _residual(self, layout: _Layout) -> torch.Tensor:
        parts = []
        for key, n in zip(layout.keys, layout.sizes):
            r = self._residuals.get(key)
            if r is not None and r.numel() != n:
                raise ValueError(f"gradzip_hook: the residual of parameter {key} has {r.numel()} elements, "
                                 f"the parameter {n}: a checkpoint of another model?")
            parts.append(r if r is not None else torch.zeros(n))
        return torch.cat(parts)

    def _keep_residual(self, layout: _Layout, residual: torch.Tensor) -> None:
        at = 0
        for key, n in zip(layout.keys, layout.sizes):
            self._residuals[key] = residual[at:at + n]
            at += n

    def _payload_buffer(self, index: int, size: int) -> torch.Tensor:
        buf = self._payloads.get(index)
        if buf is None or buf.numel() < size:
            buf = torch.empty(size, dtype=torch.uint8)
            self._payloads[index] = buf
        return buf

    def _compresses(self, step: int, n: int) -> bool:
        return step >= self.start_iter and 4 * n >= self.min_compression_rate * self.codec.max_compressed_bytes(n)


def _bad_rank(codec: Codec, payloads: List[torch.Tensor], n: int) -> int:
    """The first rank whose payload fails validation on its own."""
    scratch = torch.zeros(n, dtype=torch.float32)
    for r, p in enumerate(payloads):
        try:
            codec.decompress_add(p, scratch)
        except FormatError:
            return r
    return -1


def gradzip_hook(state: GradzipState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: gradzip-compressed averaging of a bucket (see the module doc)."""
    group, world, buf, step, layout = state._begin(bucket, "gradzip_hook")
    index, n = bucket.index(), buf.numel()
    if not state._compresses(step, n):
        state.counters.add(4 * n)
        return _allreduce_average(group, world, buf)

    codec = state.codec
    x = layout.gather(buf)
    payload = state._payload_buffer(index, codec.max_compressed_bytes(n))
    ctx = (step & 0xFFFFFFFF, layout.keys[0])  # keyed by the bucket's first parameter: layout-free
    if state.error_feedback:
        x = x + state._residual(layout)  # g + e
        size = codec.compress_into(x, payload, *ctx)
        state._keep_residual(layout, x - codec.decompress(payload[:size], torch.empty_like(x)))
    else:
        size = codec.compress_into(x, payload, *ctx)
    out = buf if layout.identity else torch.empty_like(buf)

    section = codec.summable_section(n)
    if section is not None:
        offset, nbytes, dtype = section
        values = payload[offset:offset + nbytes].view(_DTYPES[dtype])
        state.counters.add(nbytes)

        def decode_sum(fut: torch.futures.Future) -> torch.Tensor:
            fut.wait()
            codec.decompress_add(payload[:size], out.zero_(), 1.0 / world)
            return layout.scatter(out, buf)

        return dist.all_reduce(values, group=group, async_op=True).get_future().then(decode_sum)

    if codec.fixed_size:  # every rank's payload has `size` bytes: one all_gather, no size exchange
        state.counters.add(size)
        received = [torch.empty(size, dtype=torch.uint8) for _ in range(world)]
        fut = dist.all_gather(received, payload[:size], group=group, async_op=True).get_future()
        return fut.then(lambda f: _decode_gathered(codec, index, f, received, out, world, layout, buf))

    mine = torch.tensor([size], dtype=torch.int64)
    sizes = [torch.empty(1, dtype=torch.int64) for _ in range(world)]
    state.counters.add(size + 8)

    def gather(fut: torch.futures.Future) -> torch.Tensor:
        fut.wait()
        announced = [int(s.item()) for s in sizes]
        bound = codec.max_compressed_bytes(n)
        for r, s in enumerate(announced):
            if s > bound:
                raise FormatError(f"gradzip_hook: bucket {index}: rank {r} announced a {s}-byte payload, "
                                  f"the bound for {n} elements is {bound}")
        most = max(announced)
        received = [torch.empty(most, dtype=torch.uint8) for _ in range(world)]
        dist.all_gather(received, payload[:most], group=group)
        payloads = [received[r][:announced[r]] for r in range(world)]
        return _decode_gathered(codec, index, None, payloads, out, world, layout, buf)

    return dist.all_gather(sizes, mine, group=group, async_op=True).get_future().then(gather)


def _decode_gathered(codec: Codec, index: int, fut: Optional[torch.futures.Future], payloads: List[torch.Tensor],
                     out: torch.Tensor, world: int, layout: _Layout, buf: torch.Tensor) -> torch.Tensor:
    """buf <- the average of the ranks' decoded payloads; a bad payload names its rank."""
    if fut is not None:
        fut.wait()
    try:
        codec.decompress_all(payloads, out)  # every payload validated before `out` changes
    except FormatError as e:
        raise FormatError(f"gradzip_hook: bucket {index}: payload from rank "
                          f"{_bad_rank(codec, payloads, out.numel())}: {e}") from None
    return layout.scatter(out.div_(world), buf)


class PowerSGDState(_HookState):
    """State of :func:`powersgd_hook`: gradzip's PowerSGD per bucket. The arguments are PyTorch's
    ``PowerSGDState``'s (``matrix_approximation_rank``, ``start_powerSGD_iter``,
    ``min_compression_rate``, ``use_error_feedback``, ``warm_start``, ``orthogonalization_epsilon``,
    ``random_seed``); docs/lowrank.md says where gradzip's PowerSGD differs from PyTorch's."""

    def __init__(self, process_group: Optional[Any] = None, matrix_approximation_rank: int = 1,
                 start_powerSGD_iter: int = 0, min_compression_rate: float = 2.0, use_error_feedback: bool = True,
                 warm_start: bool = True, orthogonalization_epsilon: float = 0.0, random_seed: int = 0,
                 threads: int = 1) -> None:
        super().__init__(process_group, start_powerSGD_iter, threads)
        if matrix_approximation_rank < 1:
            raise ValueError(f"PowerSGDState: matrix_approximation_rank must be >= 1, got {matrix_approximation_rank}")
        self.rank = matrix_approximation_rank
        self.min_compression_rate = min_compression_rate
        self.error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.epsilon = orthogonalization_epsilon
        self.seed = random_seed
        self._buckets: Dict[Tuple[int, ...], Any] = {}  # canonical numbers -> (compressor, P, Q)
        self._pending: Dict[Tuple[int, ...], bytes] = {}

    def state_dict(self) -> Dict[str, Any]:
        """The step counter and, per group of parameters, PowerSGD's residual and warm-start Q."""
        saved = {k: b[0].save() for k, b in self._buckets.items()}
        saved.update({k: s for k, s in self._pending.items() if k not in saved})
        return {"iter": self.iter, "rank": self.rank, "buckets": saved}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if int(state["rank"]) != self.rank:
            raise ValueError(f"PowerSGDState.load_state_dict: the checkpoint is for rank {state['rank']}, "
                             f"this state's is {self.rank}")
        self.iter = int(state["iter"])
        self._buckets.clear()
        self._pending = {tuple(int(i) for i in k): bytes(b) for k, b in state["buckets"].items()}

    def _compressor(self, layout: _Layout, shapes: List[List[int]]) -> Any:
        key = tuple(layout.keys)
        entry = self._buckets.get(key)
        if entry is None:
            ps = PowerSGDCompressor(shapes, self.rank, self.min_compression_rate, self.epsilon, self.warm_start,
                                    self.error_feedback, self.seed, self.threads)
            pending = self._pending.pop(key, None)
            if pending is not None:
                ps.restore(pending)
            entry = (ps, torch.empty(ps.payload_bytes(0), dtype=torch.uint8),
                     torch.empty(ps.payload_bytes(1), dtype=torch.uint8))
            self._buckets[key] = entry
        return entry


def powersgd_hook(state: PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: gradzip's PowerSGD on each bucket (three allreduces: the tensors
    too small to compress, the P factors, the Q factors)."""
    group, world, buf, step, layout = state._begin(bucket, "powersgd_hook")
    if step < state.start_iter:
        state.counters.add(4 * buf.numel())
        return _allreduce_average(group, world, buf)
    params = {id(p): p for p in bucket.parameters()}
    by_number = {state._numbers[i]: p for i, p in params.items()}
    shapes = [list(by_number[k].shape) for k in layout.keys]
    ps, p_payload, q_payload = state._compressor(layout, shapes)
    x = layout.gather(buf)
    ps.compress_p(x, p_payload, step & 0xFFFFFFFF, layout.keys[0])
    dense_ranges = ps.dense_ranges()
    dense = torch.cat([x[o:o + n] for o, n in dense_ranges]) if dense_ranges else None
    p_offset, p_count = ps.factors_section(PowerSGDCompressor.P)
    q_offset, q_count = ps.factors_section(PowerSGDCompressor.Q)
    p_factors = p_payload[p_offset:p_offset + 4 * p_count].view(torch.float32)
    q_factors = q_payload[q_offset:q_offset + 4 * q_count].view(torch.float32)
    state.counters.add(4 * (p_count + q_count) + (4 * dense.numel() if dense is not None else 0))
    dense_work = dist.all_reduce(dense, group=group, async_op=True) if dense is not None else None

    def after_p(fut: Optional[torch.futures.Future]) -> torch.Tensor:
        if fut is not None:
            fut.wait()
        if dense_work is not None:
            dense_work.wait()
            dense.div_(world)
            at = 0
            for o, n in dense_ranges:
                x[o:o + n].copy_(dense[at:at + n])
                at += n
        ps.compress_q(p_payload, q_payload)
        if q_count:
            dist.all_reduce(q_factors, group=group)
        ps.decompress(q_payload, world, x)
        return layout.scatter(x, buf)

    if p_count == 0:  # nothing compressed: only the dense allreduce
        result: torch.futures.Future = torch.futures.Future()
        result.set_result(after_p(None))
        return result
    return dist.all_reduce(p_factors, group=group, async_op=True).get_future().then(after_p)
