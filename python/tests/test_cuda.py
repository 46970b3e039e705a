"""CUDA tensors through the Python module.

Without a GPU, arrays that *claim* CUDA memory (a DLPack capsule made with ctypes) check the
module's routing: which calls refuse a mix of devices, and that a CUDA call on a machine with no
GPU raises the CUDA runtime's error instead of touching memory. With a GPU (and a module built
with CUDA), CUDA tensors must give the CPU's bytes and outputs.
"""
import ctypes

import numpy as np
import pytest
import torch

import gradzip

CUDA_DEVICE = 2  # DLPack's kDLCUDA


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class ClaimsCuda:
    """A 1-D array of host memory that presents itself through DLPack as on CUDA device `device`:
    only the module's checks may read it (nothing here has a GPU behind it)."""

    def __init__(self, array: np.ndarray, device: int = 0) -> None:
        self.array = np.ascontiguousarray(array)
        self.shape = (ctypes.c_int64 * 1)(self.array.shape[0])
        code = {np.dtype(np.float32): 2, np.dtype(np.uint8): 1}[self.array.dtype]  # kDLFloat, kDLUInt
        self.managed = _DLManagedTensor()
        t = self.managed.dl_tensor
        t.data = self.array.ctypes.data
        t.device = _DLDevice(CUDA_DEVICE, device)
        t.ndim = 1
        t.dtype = _DLDataType(code, self.array.dtype.itemsize * 8, 1)
        t.shape = self.shape
        t.strides = None
        self.device = device

    def __dlpack_device__(self):
        return (CUDA_DEVICE, self.device)

    def __dlpack__(self, stream=None, **kwargs):
        return _capsule_new(ctypes.addressof(self.managed), b"dltensor", None)


def test_the_module_says_whether_it_was_built_for_cuda():
    assert isinstance(gradzip.Codec("fp16").cuda, bool)


def test_a_call_on_two_devices_is_refused_naming_both():
    codec = gradzip.Codec("topk(ratio=0.01)")
    x = np.ones(1000, dtype=np.float32)
    out = np.empty(codec.max_compressed_bytes(1000), dtype=np.uint8)
    with pytest.raises(ValueError, match="out is on the CPU and tensor on cuda:0: a call's arrays must be on one device"):
        codec._c.compress(ClaimsCuda(x), out)
    with pytest.raises(ValueError, match="out is on cuda:1 and tensor on cuda:0"):
        codec._c.compress(ClaimsCuda(x, 0), ClaimsCuda(out, 1))
    payload = codec.compress(x)
    with pytest.raises(ValueError, match="payloads\\[1\\] is on cuda:0 and accum on the CPU"):
        codec._c.decompress_add_all([payload, ClaimsCuda(payload)], np.zeros(1000, dtype=np.float32), 1.0, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_cuda_arrays_without_a_gpu_raise_the_runtimes_error_or_name_the_build():
    codec = gradzip.Codec("fp16")
    x = ClaimsCuda(np.ones(64, dtype=np.float32))
    out = ClaimsCuda(np.empty(codec.max_compressed_bytes(64), dtype=np.uint8))
    if codec.cuda:
        with pytest.raises(RuntimeError, match="cuda"):
            codec._c.compress(x, out)
        with pytest.raises(RuntimeError, match="cuda"):
            gradzip._gradzip.ErrorFeedback(codec._c, 64, 1, 0)
    else:
        with pytest.raises(TypeError, match="built without CUDA"):
            codec._c.compress(x, out)


requires_gpu = pytest.mark.skipif(not (torch.cuda.is_available() and gradzip.Codec("fp16").cuda),
                                  reason="needs a GPU and a module built with CUDA")

SPECS = ["fp16", "qsgd(bits=4,seed=3)", "topk(ratio=0.01)", "threshold(tau=1.5)+automatic", "simhash",
         "hadamard+uniform(bits=8)"]


@requires_gpu
@pytest.mark.parametrize("spec", SPECS)
def test_cuda_tensors_give_the_cpus_bytes_and_outputs(spec):
    codec = gradzip.Codec(spec)
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(5000, generator=gen) for _ in range(3)]
    payloads = []
    for step, x in enumerate(xs):
        want = codec.compress(x, step=step, tensor_id=4)
        got = codec.compress(x.cuda(), step=step, tensor_id=4)
        assert got.is_cuda
        assert torch.equal(got.cpu(), want)
        payloads.append(want)
    start = torch.randn(5000, generator=gen)
    want = start.clone()  # the GPU adds payload by payload, each addition rounded
    for p in payloads:
        codec.decompress_add(p, want, 0.5)
    got = codec.decompress_add_all([p.cuda() for p in payloads], start.cuda(), 0.5)
    assert torch.equal(got.cpu(), want)
    bad = payloads[1].clone()
    bad[4] = 0x7F  # the format version
    accum = start.cuda()
    with pytest.raises(gradzip.FormatError, match="payload 1 of 3: "):
        codec.decompress_add_all([payloads[0].cuda(), bad.cuda(), payloads[2].cuda()], accum)
    assert torch.equal(accum.cpu(), start)


@requires_gpu
def test_cuda_error_feedback_follows_the_cpus_and_saves_alike():
    codec = gradzip.Codec("topk(ratio=0.02)")
    cpu = gradzip.ErrorFeedback(codec, 3000)
    gpu = gradzip.ErrorFeedback(codec, 3000, device="cuda:0")
    assert gpu.device == "cuda:0"
    gen = torch.Generator().manual_seed(2)
    for step in range(4):
        g = torch.randn(3000, generator=gen)
        assert torch.equal(gpu.compress(g.cuda(), step=step).cpu(), cpu.compress(g, step=step))
    assert gpu.save() == cpu.save()
    with pytest.raises(TypeError, match="tensor is on the CPU, this feedback's residual on cuda:0"):
        gpu.compress(torch.zeros(3000))
