"""DDP communication hooks that send gradzip payloads through ``torch.distributed``.

::

    import gradzip, gradzip.torch
    state = gradzip.torch.GradzipState(codec=gradzip.TopK(ratio=0.01), error_feedback=True)
    ddp_model.register_comm_hook(state, gradzip.torch.gradzip_hook)

``gradzip_hook`` compresses each bucket (with error feedback when asked), then:

* a summable codec (fp16, bf16, random-k with a shared seed) allreduces its values section,
  compressed from the gradient divided by the rank count (as PyTorch's fp16 hook does, so that
  the 16-bit sum cannot overflow where the average would not);
* any other codec allgathers the payloads (sizes first, unless all its payloads have one size)
  and decodes them all in one validated pass: a bad payload raises
  :class:`gradzip.FormatError` naming the rank that sent it.

``powersgd_hook`` runs gradzip's PowerSGD (three allreduces a step, like PyTorch's
``powerSGD_hook``). The output is the average over ranks, as DDP expects.

**Devices.** ``gradzip_hook`` takes float32 buckets on the CPU (Gloo) and, in a module built
with CUDA (``gradzip.Codec(...).cuda``), on a GPU (NCCL): payloads, residuals and the collectives'
buffers then stay on the bucket's device, and each codec call is ordered with torch's current
stream there. ``powersgd_hook`` takes CPU buckets.

**Collectives are issued from the hook, in bucket order,** never from a future's callback: with
several buckets in flight, every rank then issues the same collectives in the same order.
Callbacks only decode (codec calls hold a lock, so the autograd thread and Gloo's threads never
share an executor at once).

**Compression units, and checkpoints that resume bit for bit.** A payload depends on which
tensors it covers and in which order (top-k's indices, a quantizer's buckets), and DDP changes
both: its first step runs one layout of buckets, and after it DDP rebuilds them in the order
gradients became ready. A model restored from a checkpoint starts over with the first layout. So
the hooks compress *units*, not DDP's buckets:

* every parameter gets a number, in the order the state first sees it (DDP's first layout, the
  same in every run), and a unit is a set of parameters compressed together, in number order;
* a bucket that holds exactly a known unit compresses it; a bucket that is the union of known
  units compresses each of them separately; any other bucket becomes a new unit and replaces
  the units it overlaps;
* the units are saved with the state. After a resume, DDP's first layout is split into the
  units the interrupted run used, and the run continues bit for bit.

Error-feedback residuals are kept per parameter, so they survive any regrouping. PowerSGD's
state (residual and warm-start Q) is kept per unit and starts afresh when its unit is replaced,
as PyTorch's does when a bucket changes.
"""

import atexit
import gc
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import torch
import torch.distributed as dist

from . import Codec, FormatError, PowerSGDCompressor, SpecLike

__all__ = ["GradzipState", "gradzip_hook", "PowerSGDState", "powersgd_hook"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}

Unit = Tuple[int, ...]


class _Callback:
    """A hook's future callback, counted until torch lets it go.

    Torch frees a ``then`` callback on the thread that completed its future (one of Gloo's, for a
    CPU collective), taking the GIL in a destructor to do so. If the interpreter has begun to exit
    by then, Python stops that thread inside the destructor and the process aborts ("terminate
    called without an active exception"). DDP keeps its process group, and so Gloo's threads,
    alive past ``destroy_process_group``, so the last step's callbacks race the script's exit on a
    busy machine (PyTorch's own hooks too). :func:`_wait_for_callbacks` runs at exit, before the
    interpreter finalizes, and waits until torch has let every callback go (and 50 ms more, for
    what torch frees beside it)."""

    held: Set[int] = set()
    last_release = 0.0  # time.monotonic() when torch last let one go

    def __init__(self, fn: Callable[[torch.futures.Future], Any]) -> None:
        self.fn = fn
        type(self).held.add(id(self))

    def __call__(self, fut: torch.futures.Future) -> Any:
        return self.fn(fut)

    def __del__(self) -> None:
        cls = type(self)
        cls.held.discard(id(self))
        cls.last_release = time.monotonic()


# How long the exit waits for torch to let go of callbacks: a future that never completes (a
# collective left in flight by an error) must not hold the exit for longer.
_EXIT_WAIT_S = 5.0
# After the last callback goes, Gloo's thread still frees what the callback's `then` captured
# beside it (the child future, whose value is a Python object: the GIL again), microseconds later
# on an idle machine. The exit waits until no callback has gone for this long.
_EXIT_GRACE_S = 0.05


def _wait_for_callbacks() -> None:
    deadline = time.monotonic() + _EXIT_WAIT_S
    if _Callback.held:
        gc.collect()  # a callback kept by a reference cycle (an exception's traceback) goes here
    while time.monotonic() < deadline and (
            _Callback.held or time.monotonic() - _Callback.last_release < _EXIT_GRACE_S):
        time.sleep(0.001)  # releases the GIL, which Gloo's thread needs to let its callback go


atexit.register(_wait_for_callbacks)
if hasattr(os, "register_at_fork"):  # a child does not inherit its parent's collectives
    os.register_at_fork(after_in_child=_Callback.held.clear)


def _then(fut: torch.futures.Future, fn: Callable[[torch.futures.Future], Any]) -> torch.futures.Future:
    """``fut.then(fn)``, with the exit waiting until torch has let ``fn`` go (see :class:`_Callback`)."""
    return fut.then(_Callback(fn))


def _allreduce_average(group: Any, world: int, buf: torch.Tensor) -> torch.futures.Future:
    fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
    return _then(fut, lambda f: f.value()[0].div_(world))


class _Counters:
    """Bytes this rank sent: in the last step and in total (the hooks' own accounting)."""

    def __init__(self) -> None:
        self.sent_bytes = 0
        self.step_bytes = 0

    def add(self, n: int) -> None:
        self.sent_bytes += n
        self.step_bytes += n


class _Bucket:
    """Where each parameter of a DDP bucket sits in its buffer: number -> (offset, size, parameter)."""

    def __init__(self, buf: torch.Tensor, entries: Dict[int, Tuple[int, int, torch.nn.Parameter]]) -> None:
        self.buf, self.entries = buf, entries

    def unit_range(self, unit: Unit) -> Optional[Tuple[int, int]]:
        """(offset, size) when the unit's parameters lie back to back in number order, else None."""
        start = self.entries[unit[0]][0]
        at = start
        for key in unit:
            offset, size, _ = self.entries[key]
            if offset != at:
                return None
            at += size
        return start, at - start

    def gather(self, unit: Unit) -> torch.Tensor:
        """The unit's gradients in number order: a view of the buffer when they already are."""
        r = self.unit_range(unit)
        if r is not None:
            return self.buf[r[0]:r[0] + r[1]]
        return torch.cat([self.buf[o:o + n] for o, n, _ in (self.entries[k] for k in unit)])

    def finished(self) -> torch.Tensor:
        """The bucket, once a unit's callback has written its part. On a GPU the callback's work
        (the division, the scatter) is queued on the callback's stream, and the future DDP waits
        for carries no CUDA events when a bucket has several units (``collect_all``): the host
        waits for that stream here, so that DDP and the optimizer read finished gradients, and the
        callback's temporaries are not reused while it runs."""
        if self.buf.is_cuda:
            torch.cuda.current_stream(self.buf.device).synchronize()
        return self.buf

    def scatter(self, unit: Unit, values: torch.Tensor) -> None:
        at = 0
        for key in unit:
            offset, size, _ = self.entries[key]
            target = self.buf[offset:offset + size]
            if target.data_ptr() != values[at:at + size].data_ptr():
                target.copy_(values[at:at + size])
            at += size


class _HookState:
    """What both hooks share: the group, the step counter, parameter numbers and units."""

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
        self.units: List[Unit] = []
        self._numbers: Dict[int, int] = {}  # id(parameter) -> number

    def _begin(self, bucket: dist.GradBucket, name: str, cuda: bool) -> Tuple[Any, int, int, _Bucket]:
        """``cuda``: whether this hook takes buckets on a GPU."""
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        buf = bucket.buffer()
        if buf.dtype != torch.float32 or buf.device.type not in (("cpu", "cuda") if cuda else ("cpu",)):
            where = "float32 CPU and CUDA" if cuda else "float32 CPU"
            raise TypeError(f"{name}: bucket {bucket.index()} is {buf.dtype} on {buf.device}; this hook with this "
                            f"gradzip build compresses {where} buckets (docs/pytorch.md)")
        step = self.iter
        if bucket.index() == 0:
            self.counters.step_bytes = 0
        if bucket.is_last():
            self.iter += 1
        # Numbered on every step, uncompressed ones included, so that numbers come from DDP's
        # first layout in every run.
        base = buf.data_ptr()
        entries = {}
        for p, g in zip(bucket.parameters(), bucket.gradients()):
            number = self._numbers.setdefault(id(p), len(self._numbers))
            entries[number] = ((g.data_ptr() - base) // buf.element_size(), g.numel(), p)
        return group, dist.get_world_size(group), step, _Bucket(buf, entries)

    def _units_of(self, keys: Sequence[int]) -> List[Unit]:
        """The units a bucket holding `keys` compresses (see the module doc)."""
        mine = tuple(sorted(keys))
        if mine in self.units:
            return [mine]
        members = set(mine)
        inside = [u for u in self.units if set(u) <= members]
        if len(inside) >= 2 and sum(len(u) for u in inside) == len(mine):
            return sorted(inside)
        dropped = [u for u in self.units if members & set(u)]
        for u in dropped:
            self._drop_unit(u)
        self.units = [u for u in self.units if not (members & set(u))] + [mine]
        return [mine]

    def _drop_unit(self, unit: Unit) -> None:
        pass

    def _load_units(self, units: Sequence[Sequence[int]]) -> None:
        self.units = [tuple(int(k) for k in u) for u in units]
        seen: set = set()
        for u in self.units:
            if list(u) != sorted(set(u)) or seen & set(u):
                raise ValueError(f"{type(self).__name__}.load_state_dict: unit {u} is not sorted, or overlaps another")
            seen |= set(u)


def _collect(futures: List[torch.futures.Future], finish: Callable[[], torch.Tensor]) -> torch.futures.Future:
    """A future of finish(), once every future in the list has completed (their errors raised)."""
    def done(fut: torch.futures.Future) -> torch.Tensor:
        for f in fut.value():
            f.wait()  # raises a callback's error
        return finish()
    return _then(torch.futures.collect_all(futures), done)


class GradzipState(_HookState):
    """State of :func:`gradzip_hook`.

    Args:
        codec: a spec string, spec object or :class:`gradzip.Codec` (whose own thread count
            then applies).
        process_group: the group to reduce over (the default group when None).
        error_feedback: keep what compression drops, per parameter, and add it to the next step.
        start_iter: steps (from 0) that allreduce uncompressed first, like PowerSGD's
            ``start_powerSGD_iter``.
        min_compression_rate: a unit whose payload would not be this many times smaller than
            its fp32 bytes is allreduced uncompressed (small units of biases and norms). 1.5 by
            default, so that the 16-bit casts (2x less a header) are compressed.
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
        self._residuals: Dict[int, torch.Tensor] = {}  # parameter number -> its residual
        self._payloads: Dict[Unit, torch.Tensor] = {}

    def state_dict(self) -> Dict[str, Any]:
        """The codec, the step counter, the units and each parameter's residual."""
        return {"spec": self.codec.spec, "iter": self.iter, "units": [list(u) for u in self.units],
                "residuals": {k: v.clone() for k, v in self._residuals.items()}}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if state.get("spec") != self.codec.spec:
            raise ValueError(f"GradzipState.load_state_dict: the checkpoint is for codec {state.get('spec')!r}, "
                             f"this state's is {self.codec.spec!r}")
        residuals = state["residuals"]
        for k, v in residuals.items():
            if not (isinstance(v, torch.Tensor) and v.dtype == torch.float32 and v.dim() == 1):
                raise ValueError(f"GradzipState.load_state_dict: residual {k} is not a 1-D float32 tensor")
        self._load_units(state.get("units", []))
        self.iter = int(state["iter"])
        self._residuals = {int(k): v.clone() for k, v in residuals.items()}
        self._payloads.clear()

    def _drop_unit(self, unit: Unit) -> None:
        self._payloads.pop(unit, None)

    def _residual(self, unit: Unit, b: _Bucket) -> torch.Tensor:
        parts = []
        for key in unit:
            n = b.entries[key][1]
            r = self._residuals.get(key)
            if r is not None and r.numel() != n:
                raise ValueError(f"gradzip_hook: the residual of parameter {key} has {r.numel()} elements, "
                                 f"the parameter {n}: a checkpoint of another model?")
            # A residual restored from a checkpoint moves to the bucket's device once.
            parts.append(r.to(b.buf.device) if r is not None else torch.zeros(n, device=b.buf.device))
        return torch.cat(parts)

    def _keep_residual(self, unit: Unit, b: _Bucket, residual: torch.Tensor) -> None:
        at = 0
        for key in unit:
            n = b.entries[key][1]
            self._residuals[key] = residual[at:at + n]
            at += n

    def _payload_buffer(self, unit: Unit, size: int, device: torch.device) -> torch.Tensor:
        buf = self._payloads.get(unit)
        if buf is None or buf.numel() < size or buf.device != device:
            buf = torch.empty(size, dtype=torch.uint8, device=device)
            self._payloads[unit] = buf
        return buf


def _bad_rank(codec: Codec, payloads: List[torch.Tensor], n: int) -> str:
    """Which rank's payload fails validation on its own."""
    scratch = torch.zeros(n, dtype=torch.float32, device=payloads[0].device)
    for r, p in enumerate(payloads):
        try:
            codec.decompress_add(p, scratch)
        except FormatError:
            return f"rank {r}"
    return "one rank (each payload is valid alone; together they are not)"


def _compress_unit(state: GradzipState, unit: Unit, b: _Bucket, step: int, group: Any, world: int,
                   out: torch.Tensor) -> torch.futures.Future:
    """Compresses one unit and issues its collective. The future's callback decodes into `out`,
    scatters it into the unit's place in the bucket, and gives the bucket (one callback a unit:
    on an oversubscribed machine each hop between threads can wait a scheduler slice)."""
    codec = state.codec
    x = b.gather(unit)
    n = x.numel()
    if state.error_feedback:
        x = x + state._residual(unit, b)  # g + e
    section = codec.summable_section(n)
    # A summed 16-bit payload could overflow where the average does not: compress x / world.
    inp = x.mul(1.0 / world) if section is not None else x
    device = x.device
    payload = state._payload_buffer(unit, codec.max_compressed_bytes(n), device)
    size = codec.compress_into(inp, payload, step & 0xFFFFFFFF, unit[0])  # keyed by the unit: layout-free
    if state.error_feedback:
        sent = codec.decompress(payload[:size], torch.empty_like(x))
        state._keep_residual(unit, b, x - (sent.mul_(world) if section is not None else sent))

    if section is not None:
        offset, nbytes, dtype = section
        state.counters.add(nbytes)
        values = payload[offset:offset + nbytes].view(_DTYPES[dtype])
        def decode_sum(f: torch.futures.Future) -> torch.Tensor:
            f.wait()  # raises the allreduce's error
            codec.decompress(payload[:size], out)  # the sum of x / world: the average
            b.scatter(unit, out)
            return b.finished()

        return _then(dist.all_reduce(values, group=group, async_op=True).get_future(), decode_sum)

    if codec.fixed_size:  # every rank's payload has `size` bytes: one all_gather
        received = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(world)]
        sizes = [size] * world
        state.counters.add(size)
    else:  # the sizes first, waited for here, so that the payloads' all_gather is issued from the hook
        announced = [torch.empty(1, dtype=torch.int64, device=device) for _ in range(world)]
        dist.all_gather(announced, torch.tensor([size], dtype=torch.int64, device=device), group=group)
        sizes = [int(s.item()) for s in announced]
        bound = codec.max_compressed_bytes(n)
        for r, s in enumerate(sizes):
            if s > bound:
                raise FormatError(f"gradzip_hook: unit {unit[0]}: rank {r} announced a {s}-byte payload, "
                                  f"the bound for {n} elements is {bound}")
        received = [torch.empty(max(sizes), dtype=torch.uint8, device=device) for _ in range(world)]
        state.counters.add(8 + max(sizes))
    fut = dist.all_gather(received, payload[:received[0].numel()], group=group, async_op=True).get_future()

    def decode(f: torch.futures.Future) -> torch.Tensor:
        f.wait()
        payloads = [received[r][:sizes[r]] for r in range(world)]
        try:
            codec.decompress_all(payloads, out)  # every payload validated before `out` changes
        except FormatError as e:
            raise FormatError(f"gradzip_hook: unit {unit[0]}: payload from {_bad_rank(codec, payloads, n)}: "
                              f"{e}") from None
        b.scatter(unit, out.div_(world))
        return b.finished()

    return _then(fut, decode)


def gradzip_hook(state: GradzipState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: gradzip-compressed averaging of a bucket (see the module doc)."""
    group, world, step, b = state._begin(bucket, "gradzip_hook", cuda=state.codec.cuda)
    if step < state.start_iter:
        state.counters.add(4 * b.buf.numel())
        return _allreduce_average(group, world, b.buf)
    futures = []
    for unit in state._units_of(list(b.entries)):
        n = sum(b.entries[k][1] for k in unit)
        r = b.unit_range(unit)
        if 4 * n < state.min_compression_rate * state.codec.max_compressed_bytes(n):
            futures.append(_allreduce_unit(state, unit, b, group, world))
            continue
        out = b.buf[r[0]:r[0] + r[1]] if r is not None else torch.empty(n, device=b.buf.device)
        futures.append(_compress_unit(state, unit, b, step, group, world, out))
    return _bucket_future(futures, b)


def _allreduce_unit(state: _HookState, unit: Unit, b: _Bucket, group: Any, world: int) -> torch.futures.Future:
    """A unit too small to gain from compression: its fp32 average, scattered into the bucket."""
    x = b.gather(unit)
    state.counters.add(4 * x.numel())

    def average(f: torch.futures.Future) -> torch.Tensor:
        f.wait()
        b.scatter(unit, x.div_(world))
        return b.finished()

    return _then(dist.all_reduce(x, group=group, async_op=True).get_future(), average)


def _bucket_future(futures: List[torch.futures.Future], b: _Bucket) -> torch.futures.Future:
    """The bucket, once every unit's future (each scatters its unit) has completed."""
    if len(futures) == 1:
        return futures[0]
    return _collect(futures, lambda: b.buf)


class PowerSGDState(_HookState):
    """State of :func:`powersgd_hook`: gradzip's PowerSGD per unit. The arguments are PyTorch's
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
        self._compressors: Dict[Unit, Any] = {}  # unit -> (compressor, P payload, Q payload)
        self._pending: Dict[Unit, bytes] = {}

    def state_dict(self) -> Dict[str, Any]:
        """The step counter, the units and, per unit, PowerSGD's residual and warm-start Q."""
        saved = {u: c[0].save() for u, c in self._compressors.items() if u in self.units}
        saved.update({u: s for u, s in self._pending.items() if u not in saved and u in self.units})
        return {"iter": self.iter, "rank": self.rank, "units": [list(u) for u in self.units], "states": saved}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if int(state["rank"]) != self.rank:
            raise ValueError(f"PowerSGDState.load_state_dict: the checkpoint is for rank {state['rank']}, "
                             f"this state's is {self.rank}")
        self._load_units(state["units"])
        self.iter = int(state["iter"])
        self._compressors.clear()
        self._pending = {tuple(int(i) for i in k): bytes(v) for k, v in state["states"].items()}

    def _drop_unit(self, unit: Unit) -> None:
        self._compressors.pop(unit, None)
        self._pending.pop(unit, None)

    def _compressor(self, unit: Unit, b: _Bucket) -> Any:
        entry = self._compressors.get(unit)
        if entry is None:
            shapes = [list(b.entries[k][2].shape) for k in unit]
            ps = PowerSGDCompressor(shapes, self.rank, self.min_compression_rate, self.epsilon, self.warm_start,
                                    self.error_feedback, self.seed, self.threads)
            pending = self._pending.pop(unit, None)
            if pending is not None:
                ps.restore(pending)
            entry = (ps, torch.empty(ps.payload_bytes(0), dtype=torch.uint8),
                     torch.empty(ps.payload_bytes(1), dtype=torch.uint8))
            self._compressors[unit] = entry
        return entry


def _powersgd_unit(state: PowerSGDState, unit: Unit, b: _Bucket, step: int, group: Any,
                   world: int) -> torch.futures.Future:
    """One unit's step: the dense and P allreduces and compress_q here (P waited for), the Q
    allreduce in flight; the future's callback decompresses and scatters into the bucket."""
    ps, p_payload, q_payload = state._compressor(unit, b)
    x = b.gather(unit)  # a view of the bucket, or a gathered copy that finish() scatters back
    ps.compress_p(x, p_payload, step & 0xFFFFFFFF, unit[0])
    dense_ranges = ps.dense_ranges()
    dense = torch.cat([x[o:o + n] for o, n in dense_ranges]) if dense_ranges else None
    p_offset, p_count = ps.factors_section(PowerSGDCompressor.P)
    q_offset, q_count = ps.factors_section(PowerSGDCompressor.Q)
    state.counters.add(4 * (p_count + q_count) + (4 * dense.numel() if dense is not None else 0))
    dense_work = dist.all_reduce(dense, group=group, async_op=True) if dense is not None else None
    if p_count:
        dist.all_reduce(p_payload[p_offset:p_offset + 4 * p_count].view(torch.float32), group=group)
    ps.compress_q(p_payload, q_payload)
    futures = []
    if q_count:
        q_factors = q_payload[q_offset:q_offset + 4 * q_count].view(torch.float32)
        futures.append(dist.all_reduce(q_factors, group=group, async_op=True).get_future())

    def finish() -> torch.Tensor:
        if dense_work is not None:
            dense_work.wait()
            dense.div_(world)
            at = 0
            for o, n in dense_ranges:
                x[o:o + n].copy_(dense[at:at + n])
                at += n
        ps.decompress(q_payload, world, x)
        b.scatter(unit, x)
        return b.buf

    if not futures:
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(finish())
        return done
    def after_q(f: torch.futures.Future) -> torch.Tensor:
        f.wait()
        return finish()

    return _then(futures[0], after_q)


def powersgd_hook(state: PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: gradzip's PowerSGD on each unit (three allreduces: the tensors too
    small to compress, the P factors, the Q factors)."""
    group, world, step, b = state._begin(bucket, "powersgd_hook", cuda=False)
    if step < state.start_iter:
        state.counters.add(4 * b.buf.numel())
        return _allreduce_average(group, world, b.buf)
    futures = [_powersgd_unit(state, unit, b, step, group, world) for unit in state._units_of(list(b.entries))]
    return _bucket_future(futures, b)
