"""gradzip: gradient compression codecs for Python (float32), and a DDP communication hook.

A codec turns a float32 tensor into one self-describing ``uint8`` payload and back, with the same
bytes as gradzip's C++ ``codec<...>::compress``. CPU tensors run on the host executor; CUDA
tensors (in a module built with CUDA: ``gradzip.Codec(...).cuda``) run on ``gradzip::cuda``,
ordered with torch's current stream, and the payload stays on the GPU. Choose a codec with a spec string or
the small classes below::

    import torch, gradzip
    codec = gradzip.Codec(gradzip.TopK(ratio=0.01))          # or gradzip.Codec("topk(ratio=0.01)")
    grad = torch.randn(1 << 20)
    payload = codec.compress(grad)                             # torch.uint8, about 1 % of the size
    accum = torch.zeros_like(grad)
    codec.decompress_add(payload, accum)                       # validated, then accum += decode

Bad parameters raise ``ValueError`` and bad payloads :class:`FormatError` (a ``ValueError``), with
gradzip's message. ``gradzip.torch`` has the DDP communication hooks. docs/pytorch.md has more.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import sys
from typing import Any, Optional, Sequence, Union

from ._gradzip import Codec as _Codec
from ._gradzip import ErrorFeedback as _ErrorFeedback
from ._gradzip import FormatError
from ._gradzip import PowerSGD as _PowerSGD

__all__ = [
    "Codec", "ErrorFeedback", "FormatError", "PowerSGDCompressor", "spec_of",
    "Dense", "TopK", "RandomK", "Threshold", "SampledTopK", "BlockwiseTopK", "HashedTopK", "SimHash", "Hadamard",
    "FP16", "BF16", "FP8", "Uniform", "QSGD", "TernGrad", "Sign", "ScaledSign", "OneBit", "Natural",
]


def _number(v: Any) -> str:
    """A spec argument: integers as integers (bools as 0/1), anything else as a Python float."""
    if isinstance(v, bool):
        return str(int(v))
    if hasattr(v, "__index__"):  # int, numpy integers
        return str(v.__index__())
    return repr(float(v))  # float, numpy floats: Python's shortest round-trip form


def _args(**kw: Any) -> str:
    parts = [f"{k}={_number(v)}" for k, v in kw.items() if v is not None]
    return "(" + ",".join(parts) + ")" if parts else ""


# ---- values stages -------------------------------------------------------------------------
class _Values:
    name = ""

    @property
    def spec(self) -> str:
        return self.name + _args(**self._params())

    def _params(self) -> dict:
        return {}


class FP16(_Values):
    """IEEE half precision, round to nearest even (summable: payloads can be allreduced)."""
    name = "fp16"


class BF16(_Values):
    """bfloat16, round to nearest even (summable)."""
    name = "bf16"


@dataclass
class FP8(_Values):
    """8-bit float, ``format`` "e4m3" or "e5m2"."""
    format: str = "e4m3"

    @property
    def spec(self) -> str:
        return "fp8_" + self.format


@dataclass
class Uniform(_Values):
    """Uniform ``bits``-bit quantization per bucket of 512 (min/max scale); stochastic rounding is unbiased."""
    bits: int = 8
    stochastic: bool = False
    seed: int = 0
    name = "uniform"

    def _params(self) -> dict:
        return {"bits": self.bits, "stochastic": self.stochastic, "seed": self.seed}


@dataclass
class QSGD(_Values):
    """QSGD (Alistarh et al. 2017): ``bits`` 4 (7 levels) or 8 (127 levels), buckets of 128, unbiased."""
    bits: int = 4
    seed: int = 0
    name = "qsgd"

    def _params(self) -> dict:
        return {"bits": self.bits, "seed": self.seed}


@dataclass
class TernGrad(_Values):
    """TernGrad (Wen et al. 2017): {-s, 0, s} per bucket, unbiased; ``clip`` at 2.5 sigma."""
    clip: bool = False
    seed: int = 0
    name = "terngrad"

    def _params(self) -> dict:
        return {"clip": self.clip, "seed": self.seed}


class Sign(_Values):
    """signSGD: one bit per element."""
    name = "sign"


class ScaledSign(_Values):
    """EF-SignSGD: sign times the bucket's mean magnitude (use with error feedback)."""
    name = "scaled_sign"


class OneBit(_Values):
    """1-bit SGD (Seide et al. 2014): each sign sent as its bucket's mean of that sign."""
    name = "onebit"


@dataclass
class Natural(_Values):
    """Natural compression (Horvath et al. 2019): unbiased rounding to powers of two, 8 or 9 bits."""
    bits: int = 8
    seed: int = 0
    name = "natural"

    def _params(self) -> dict:
        return {"bits": self.bits, "seed": self.seed}


# ---- structures (whole codecs) ---------------------------------------------------------------
class _Structure:
    name = ""
    values: Optional[_Values] = None
    encoding: Optional[str] = None

    @property
    def spec(self) -> str:
        s = self.name + _args(**self._params())
        if self.values is not None:
            s += "+" + self.values.spec
        if self.encoding is not None:
            s += "+" + self.encoding
        return s

    def _params(self) -> dict:
        return {}


def _ratio_or_k(name: str, ratio: Optional[float], k: Optional[int]) -> dict:
    if (ratio is None) == (k is None):
        raise ValueError(f"{name}: give exactly one of ratio= and k=, got ratio={ratio!r}, k={k!r}")
    return {"ratio": ratio, "k": k}


@dataclass
class Dense(_Structure):
    """Every element, through a values stage (``Dense(FP16())`` is the fp16 cast)."""
    values: Optional[_Values] = None
    name = "dense"


@dataclass
class TopK(_Structure):
    """Exact top-k by magnitude (``ratio`` of the elements, or ``k``); encoding coo, bitmap, delta_varint or automatic."""
    ratio: Optional[float] = None
    k: Optional[int] = None
    values: Optional[_Values] = None
    encoding: Optional[str] = None
    name = "topk"

    def _params(self) -> dict:
        return _ratio_or_k("TopK", self.ratio, self.k)


@dataclass
class RandomK(_Structure):
    """Random-k: the same ``seed`` on every rank picks the same indices, so none are sent (summable)."""
    ratio: Optional[float] = None
    k: Optional[int] = None
    seed: int = 0
    scaled: bool = True
    values: Optional[_Values] = None
    name = "randomk"

    def _params(self) -> dict:
        return {**_ratio_or_k("RandomK", self.ratio, self.k), "seed": self.seed, "scaled": self.scaled}


@dataclass
class Threshold(_Structure):
    """Every element with |x| >= tau."""
    tau: float = 0.0
    values: Optional[_Values] = None
    encoding: Optional[str] = None
    name = "threshold"

    def _params(self) -> dict:
        return {"tau": self.tau}


@dataclass
class SampledTopK(_Structure):
    """DGC's sampled top-k: the threshold is estimated from a ``sample_rate`` sample."""
    ratio: Optional[float] = None
    k: Optional[int] = None
    sample_rate: Optional[float] = None
    seed: Optional[int] = None
    values: Optional[_Values] = None
    encoding: Optional[str] = None
    name = "sampled_topk"

    def _params(self) -> dict:
        return {**_ratio_or_k("SampledTopK", self.ratio, self.k), "sample_rate": self.sample_rate, "seed": self.seed}


@dataclass
class BlockwiseTopK(_Structure):
    """The top ``k`` of every ``block`` elements."""
    k: int = 1
    block: int = 1024
    values: Optional[_Values] = None
    encoding: Optional[str] = None
    name = "blockwise_topk"

    def _params(self) -> dict:
        return {"block": self.block, "k": self.k}


@dataclass
class HashedTopK(_Structure):
    """Top-k hashed into ``slots`` x n slots (DRAGONN-style); COO indices unless ``encoding``."""
    ratio: float = 0.01
    slots: Optional[float] = None
    sample_rate: Optional[float] = None
    seed: Optional[int] = None
    values: Optional[_Values] = None
    encoding: Optional[str] = None
    name = "hashed_topk"

    def _params(self) -> dict:
        return {"ratio": self.ratio, "slots": self.slots, "sample_rate": self.sample_rate, "seed": self.seed}


@dataclass
class SimHash(_Structure):
    """SimHash sketch: ``bits`` random-projection sign bits per ``block`` elements, plus the block's norm."""
    block: int = 1024
    bits: int = 128
    seed: int = 0
    name = "simhash"

    def _params(self) -> dict:
        return {"block": self.block, "bits": self.bits, "seed": self.seed}


@dataclass
class Hadamard(_Structure):
    """A randomized Hadamard rotation in blocks, then a dense uniform (4-bit by default) or QSGD quantizer."""
    values: Optional[_Values] = field(default_factory=lambda: Uniform(bits=4))
    block: int = 1024
    seed: Optional[int] = None
    name = "hadamard"

    def _params(self) -> dict:
        return {"block": self.block, "seed": self.seed}


SpecLike = Union[str, _Structure, _Values]


def spec_of(codec: SpecLike) -> str:
    """The spec string of a spec object (a values stage alone means ``Dense(values)``)."""
    if isinstance(codec, str):
        return codec
    if isinstance(codec, (_Structure, _Values)):
        return codec.spec
    raise TypeError(f"a codec is a spec string or a gradzip spec object, got {type(codec).__name__}")


# ---- arrays --------------------------------------------------------------------------------
def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _flat(x: Any) -> Any:
    """x as a contiguous 1-D view (a copy only when x is not contiguous)."""
    if _is_torch(x):
        return x.detach().reshape(-1)
    import numpy as np
    return np.ascontiguousarray(x).reshape(-1)


def _bytes_like(x: Any, n: int) -> Any:
    if _is_torch(x):
        import torch
        return torch.empty(n, dtype=torch.uint8, device=x.device)
    import numpy as np
    return np.empty(n, dtype=np.uint8)


def _as_payload(p: Any) -> Any:
    if isinstance(p, (bytes, bytearray, memoryview)):
        import numpy as np
        return np.frombuffer(p, dtype=np.uint8)
    return p


def _stream(x: Any) -> int:
    """torch's current stream on x's CUDA device (as an integer), 0 for anything else: the stream
    a CUDA call is ordered with (it starts after what torch queued there, and what torch queues
    there next starts after it)."""
    if _is_torch(x) and x.is_cuda:
        import torch
        return torch.cuda.current_stream(x.device).cuda_stream
    return 0


def _device_index(device: Any) -> int:
    """-1 for the CPU, else the CUDA device's index ("cuda" alone: the current device)."""
    if device is None:
        return -1
    import torch
    d = torch.device(device)
    if d.type == "cpu":
        return -1
    if d.type != "cuda":
        raise ValueError(f"device must be a CPU or CUDA device, got {device!r}")
    return d.index if d.index is not None else torch.cuda.current_device()


class Codec:
    """A gradzip codec on float32 tensors or arrays (any shape, contiguous).

    CPU tensors and numpy arrays run on the host; CUDA tensors on their GPU, ordered with torch's
    current stream there (every array of a call on one device; see :attr:`cuda`). A CUDA decode checks the
    payload on the GPU and then waits for its stream, so that a bad payload raises from the call.

    ``threads``: OpenMP threads per host call (1 by default: DDP runs a process per core or per GPU).
    """

    def __init__(self, codec: SpecLike, threads: int = 1) -> None:
        self._c = _Codec(spec_of(codec), threads)

    @property
    def spec(self) -> str:
        return self._c.spec

    def __repr__(self) -> str:
        return f"gradzip.Codec({self.spec!r})"

    def max_compressed_bytes(self, n: int) -> int:
        """The largest payload for n elements."""
        return self._c.max_compressed_bytes(n)

    @property
    def cuda(self) -> bool:
        """Whether this module was built for CUDA tensors (``GRADZIP_PYTHON_CUDA``)."""
        return self._c.cuda

    @property
    def fixed_size(self) -> bool:
        """Whether every payload for n elements has exactly max_compressed_bytes(n) bytes."""
        return self._c.fixed_size

    def summable_section(self, n: int):
        """(offset, bytes, dtype name) of the values section an allreduce may sum, or None (gather)."""
        return self._c.summable_section(n)

    def compress(self, tensor: Any, step: int = 0, tensor_id: int = 0) -> Any:
        """The payload of ``tensor`` (a uint8 tensor or array, a view of its own buffer).

        ``step`` and ``tensor_id`` key stochastic stages' randomness (with the stage's seed).
        """
        flat = _flat(tensor)
        out = _bytes_like(flat, self._c.max_compressed_bytes(flat.shape[0]))
        return out[: self._c.compress(flat, out, step, tensor_id, _stream(flat))]

    def compress_into(self, tensor: Any, out: Any, step: int = 0, tensor_id: int = 0) -> int:
        """Writes the payload into ``out`` (max_compressed_bytes(n) bytes) and returns its size."""
        flat = _flat(tensor)
        return self._c.compress(flat, out, step, tensor_id, _stream(flat))

    def decompress(self, payload: Any, out: Any) -> Any:
        """out <- decode(payload), every element written. Returns out."""
        self._c.decompress(_as_payload(payload), out, _stream(out))
        return out

    def decompress_add(self, payload: Any, accum: Any, alpha: float = 1.0) -> Any:
        """accum <- accum + alpha * decode(payload); a bad payload changes nothing. Returns accum."""
        self._c.decompress_add(_as_payload(payload), accum, alpha, _stream(accum))
        return accum

    def decompress_all(self, payloads: Sequence[Any], out: Any) -> Any:
        """out <- the sum of every payload's decode; all are validated before out changes."""
        self._c.decompress_all([_as_payload(p) for p in payloads], out, _stream(out))
        return out

    def decompress_add_all(self, payloads: Sequence[Any], accum: Any, alpha: float = 1.0) -> Any:
        """accum <- accum + alpha * the sum of every payload's decode, all validated first (CPU:
        summed in one pass; CUDA: added payload by payload, each addition rounded)."""
        self._c.decompress_add_all([_as_payload(p) for p in payloads], accum, alpha, _stream(accum))
        return accum


class ErrorFeedback:
    """Error feedback (Seide et al. 2014; Karimireddy et al. 2019) for one tensor of n elements:
    compresses g + e and keeps e <- g + e - decode(payload).

    ``device``: where the residual e lives, the CPU (None) or a CUDA device (``"cuda:0"``); the
    tensors given to :meth:`compress` must be there. A saved state restores on either.
    """

    def __init__(self, codec: Union[Codec, SpecLike], n: int, threads: int = 1, device: Any = None) -> None:
        self.codec = codec if isinstance(codec, Codec) else Codec(codec, threads)
        self._index = _device_index(device)
        self._f = _ErrorFeedback(self.codec._c, n, threads, self._index)

    @property
    def size(self) -> int:
        return self._f.size

    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:i"``: where the residual lives."""
        return "cpu" if self._f.device < 0 else f"cuda:{self._f.device}"

    def compress(self, tensor: Any, step: int = 0, tensor_id: int = 0) -> Any:
        flat = _flat(tensor)
        out = _bytes_like(flat, self._f.max_compressed_bytes())
        return out[: self._f.compress(flat, out, step, tensor_id, _stream(flat))]

    def compress_into(self, tensor: Any, out: Any, step: int = 0, tensor_id: int = 0) -> int:
        flat = _flat(tensor)
        return self._f.compress(flat, out, step, tensor_id, _stream(flat))

    def max_compressed_bytes(self) -> int:
        return self._f.max_compressed_bytes()

    def save(self) -> bytes:
        """The residual, as a validated gradzip payload (host bytes wherever it lives)."""
        return self._f.save(self._current_stream())

    def restore(self, state: bytes) -> None:
        self._f.restore(bytes(state), self._current_stream())

    def _current_stream(self) -> int:
        """torch's current stream on the residual's device (0 for the CPU)."""
        if self._index < 0:
            return 0
        import torch
        return torch.cuda.current_stream(self._index).cuda_stream


class PowerSGDCompressor:
    """gradzip's PowerSGD (Vogels et al. 2019) on one bucket of tensors with the given shapes:
    compress_p, a sum of the P factors over ranks, compress_q, a sum of the Q factors, decompress.
    ``gradzip.torch.powersgd_hook`` runs the whole step over torch.distributed."""

    P, Q = 0, 1

    def __init__(self, shapes: Sequence[Sequence[int]], rank: int = 1, min_compression_rate: float = 2.0,
                 epsilon: float = 0.0, warm_start: bool = True, error_feedback: bool = True, seed: int = 0,
                 threads: int = 1) -> None:
        self._p = _PowerSGD([list(map(int, s)) for s in shapes], rank, min_compression_rate, epsilon, warm_start,
                            error_feedback, seed, threads)

    def __getattr__(self, name: str) -> Any:
        if name == "_p":  # not built (copy, unpickling): no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self._p, name)


