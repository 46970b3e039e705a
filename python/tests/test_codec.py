"""The Python codecs against gradzip's C++ results (the golden payloads that
tests/host/test_golden.cpp pins), round trips, and errors."""
import numpy as np
import pytest
import torch

import gradzip

M64 = (1 << 64) - 1


def hash64(seed: int, i: int) -> int:
    """gradzip::hash64 (SplitMix64's finalizer), as tests/host/test_golden.cpp's inputs use it."""
    z = (i + (seed + 1) * 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def golden_input(n: int, seed: int) -> torch.Tensor:
    """test_golden.cpp's golden_input<float>: exact in float32."""
    return torch.tensor([((hash64(seed, i) >> 40) - (1 << 23)) / (1 << 20) for i in range(n)], dtype=torch.float32)


# (golden file, spec, n, input seed, (step, tensor id)): the C++ test's codecs with default stage
# parameters, so their spec strings name exactly the same codec.
GOLDEN = [
    ("topk1pct_f32_n4096.grdz", "topk(ratio=0.01)", 4096, 9, (0, 0)),
    ("dense_bf16_f32_n33.grdz", "bf16", 33, 6, (0, 0)),
    ("topk7_fp16_f32_n200.grdz", "topk(k=7)+fp16", 200, 7, (0, 0)),
    ("dense_uniform4_f32_n1000.grdz", "uniform(bits=4)", 1000, 9, (0, 0)),
    ("dense_qsgd7_f32_n300.grdz", gradzip.QSGD(bits=4, seed=5), 300, 10, (1, 2)),
    ("dense_scaled_sign_f32_n600.grdz", gradzip.ScaledSign(), 600, 11, (0, 0)),
    ("dense_onebit_f32_n700.grdz", "onebit", 700, 13, (0, 0)),
    ("dense_fp8_e4m3_f32_n77.grdz", gradzip.FP8("e4m3"), 77, 14, (0, 0)),
    ("topk40_bitmap_f32_n300.grdz", gradzip.TopK(k=40, encoding="bitmap"), 300, 16, (0, 0)),
    ("topk2500_delta_varint_f32_n9000.grdz", "topk(k=2500)+delta_varint", 9000, 17, (0, 0)),
    ("topk60_automatic_f32_n5000.grdz", gradzip.TopK(k=60, encoding="automatic"), 5000, 18, (0, 0)),
    ("sampled_topk_ratio5pct_f32_n4000.grdz", gradzip.SampledTopK(ratio=0.05), 4000, 19, (0, 0)),
    ("simhash_b64_m16_f32_n300.grdz", gradzip.SimHash(block=64, bits=16, seed=9), 300, 21, (3, 1)),
    ("rotated_uniform4_b256_f32_n700.grdz", gradzip.Hadamard(gradzip.Uniform(bits=4), block=256, seed=5), 700, 23,
     (0, 0)),
]


@pytest.mark.parametrize("name,spec,n,seed,ctx", GOLDEN, ids=[g[0] for g in GOLDEN])
def test_payload_equals_cpp_golden(golden_dir, name, spec, n, seed, ctx):
    expected = (golden_dir / name).read_bytes()
    codec = gradzip.Codec(spec)
    payload = codec.compress(golden_input(n, seed), step=ctx[0], tensor_id=ctx[1])
    assert payload.dtype == torch.uint8
    assert bytes(payload.numpy()) == expected


def test_topk3_decodes_to_cpp_result(golden_dir):
    out = torch.empty(10)
    gradzip.Codec("topk(k=3)").decompress((golden_dir / "topk3_f32_n10.grdz").read_bytes(), out)
    assert out.tolist() == [0, -9, 0, 8, 0, 7, 0, 0, 0, 0]


def test_error_feedback_state_equals_cpp_golden(golden_dir):
    ef = gradzip.ErrorFeedback("topk(k=2)", 8)
    ef.compress(golden_input(8, 5))
    assert ef.save() == (golden_dir / "error_feedback_state_f32_n8.grdz").read_bytes()


def test_powersgd_factors_equal_cpp_golden(golden_dir):
    ps = gradzip.PowerSGDCompressor([[12, 20], [12]], rank=2, seed=21)
    p = torch.empty(ps.payload_bytes(ps.P), dtype=torch.uint8)
    q = torch.empty(ps.payload_bytes(ps.Q), dtype=torch.uint8)
    ps.compress_p(golden_input(252, 6), p, 3, 1)
    assert bytes(p.numpy()) == (golden_dir / "powersgd_p_r2_f32_12x20.grdz").read_bytes()
    ps.compress_q(p, q)
    assert bytes(q.numpy()) == (golden_dir / "powersgd_q_r2_f32_12x20.grdz").read_bytes()


EVERY_DEMO_CODEC = [
    "dense", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "uniform(bits=8)", "uniform(bits=4)",
    "uniform(bits=2,stochastic=1,seed=3)", "qsgd(bits=4,seed=1)", "qsgd(bits=8,seed=1)", "terngrad(seed=1)",
    "terngrad(clip=1,seed=1)", "sign", "scaled_sign", "onebit", "natural(bits=8,seed=1)", "natural(bits=9,seed=1)",
    "hadamard(block=1024,seed=1)+uniform(bits=4)", "hadamard+qsgd(bits=4,seed=1)",
    "topk(ratio=0.01)", "topk(ratio=0.01)+bitmap", "topk(ratio=0.01)+delta_varint", "topk(ratio=0.01)+automatic",
    "topk(ratio=0.01)+qsgd(bits=4)", "topk(ratio=0.01)+scaled_sign", "topk(ratio=0.01)+natural(bits=8)",
    "sampled_topk(ratio=0.01)", "sampled_topk(ratio=0.01)+automatic", "threshold(tau=1.5)+coo",
    "threshold(tau=1.5)+uniform(bits=8)", "blockwise_topk(block=1024,k=10)+delta_varint",
    "hashed_topk(ratio=0.01,slots=0.03)+automatic", "simhash(block=1024,bits=128,seed=1)",
    "randomk(ratio=0.01,seed=1)", "randomk(ratio=0.01,seed=1)+bf16",
]


@pytest.mark.parametrize("spec", EVERY_DEMO_CODEC)
def test_round_trip_numpy_and_torch_agree(spec):
    codec = gradzip.Codec(spec)
    g = torch.randn(5000, generator=torch.Generator().manual_seed(1))
    p_torch = codec.compress(g, step=2, tensor_id=1)
    p_numpy = codec.compress(g.numpy(), step=2, tensor_id=1)
    assert isinstance(p_numpy, np.ndarray) and p_numpy.dtype == np.uint8
    assert bytes(p_torch.numpy()) == bytes(p_numpy)
    assert p_torch.numel() <= codec.max_compressed_bytes(g.numel())
    if codec.fixed_size:
        assert p_torch.numel() == codec.max_compressed_bytes(g.numel())
    dense = codec.decompress(p_torch, torch.full_like(g, 7.0))
    accum = codec.decompress_add(p_torch, torch.ones_like(g), alpha=2.0)
    assert torch.equal(accum, 1 + 2 * dense)
    # decompress_all of the same payload twice is twice its decode.
    assert torch.allclose(codec.decompress_all([p_torch, p_torch], torch.empty_like(g)), 2 * dense)


def test_shapes_are_flattened_and_lossless_codecs_are_exact():
    g = torch.randn(3, 4, 5)
    codec = gradzip.Codec(gradzip.Dense())
    out = codec.decompress(codec.compress(g), torch.empty(3, 4, 5))
    assert torch.equal(out, g)
    out16 = gradzip.Codec(gradzip.FP16()).decompress(gradzip.Codec("fp16").compress(g), torch.empty(60))
    assert torch.equal(out16, g.reshape(-1).half().float())


def test_fixed_size_is_known_from_the_stages():
    assert gradzip.Codec("topk(ratio=0.01)").fixed_size and gradzip.Codec("qsgd").fixed_size
    assert not gradzip.Codec("topk(ratio=0.01)+delta_varint").fixed_size  # size depends on the gaps
    assert not gradzip.Codec("threshold(tau=1)").fixed_size  # count depends on the data
    assert not gradzip.Codec("simhash").fixed_size


def test_summable_sections():
    assert gradzip.Codec("topk(ratio=0.1)").summable_section(1000) is None
    off, nbytes, dtype = gradzip.Codec("fp16").summable_section(1000)
    assert (nbytes, dtype) == (2000, "float16")
    off, nbytes, dtype = gradzip.Codec(gradzip.RandomK(ratio=0.1, seed=4)).summable_section(1000)
    assert (nbytes, dtype) == (400, "float32")


@pytest.mark.parametrize("spec,message", [
    ("topk", "topk needs exactly one of ratio= and k="),
    ("topk(ratio=2)", "ratio must be in (0, 1], got 2"),
    ("qsgd(bits=3)", "qsgd bits must be 4 or 8, got 3"),
    ("foo(x=1)", "unknown stage 'foo'"),
    ("topk(ratio=0.1,x=1)", "stage 'topk' has no parameter 'x'"),
    ("fp16+topk(k=1)", "is out of order"),
    ("randomk(k=5)+coo", "randomk sends no indices"),
    ("topk(k=5)+qsgd+bitmap", "sends its values as they are"),
    ("uniform(bits=8", "lacks its closing ')'"),
    ("blockwise_topk(block=0,k=1)", "block"),
])
def test_bad_parameters_raise_value_error_naming_them(spec, message):
    with pytest.raises(ValueError, match=None) as e:
        gradzip.Codec(spec)
    assert message in str(e.value)


def test_python_classes_check_their_arguments():
    with pytest.raises(ValueError, match="exactly one of ratio= and k="):
        gradzip.TopK(ratio=0.1, k=3).spec
    with pytest.raises(TypeError, match="spec string"):
        gradzip.Codec(3.5)


def test_bad_arrays_are_refused_by_name():
    codec = gradzip.Codec("topk(k=3)")
    with pytest.raises(TypeError, match="tensor must be float32"):
        codec.compress(torch.zeros(10, dtype=torch.float64))
    with pytest.raises(TypeError, match="must be a uint8 array"):
        codec.decompress(torch.zeros(10), torch.zeros(10))
    with pytest.raises(ValueError, match="not contiguous"):
        codec.decompress_add(codec.compress(torch.randn(20)), torch.zeros(20, 2)[:, 0])


def test_bad_payloads_raise_format_error_and_change_nothing():
    codec = gradzip.Codec("topk(ratio=0.1)")
    g = torch.randn(1000)
    payload = codec.compress(g).clone()
    accum = torch.randn(1000)
    before = accum.clone()
    with pytest.raises(gradzip.FormatError, match="truncated"):
        codec.decompress_add(payload[:20], accum)
    corrupt = payload.clone()
    last_index = payload.numel() - 4 * 100 - 4  # COO: 100 u32 indices, then 100 float values
    corrupt[last_index:last_index + 4] = 0xFF
    with pytest.raises(gradzip.FormatError, match=r"index\[99\] = 4294967295 >= n = 1000"):
        codec.decompress_add(corrupt, accum)
    with pytest.raises(gradzip.FormatError):
        codec.decompress_add(payload[:-4], accum)
    with pytest.raises(gradzip.FormatError, match="payload 1 of 2"):
        codec.decompress_add_all([payload, payload[:-4]], accum)
    assert torch.equal(accum, before)
    with pytest.raises(gradzip.FormatError):  # another codec's payload
        gradzip.Codec("fp16").decompress_add(payload, torch.zeros(1000))
    assert issubclass(gradzip.FormatError, ValueError)


def test_error_feedback_keeps_what_is_dropped_and_restores():
    g = torch.randn(4096, generator=torch.Generator().manual_seed(3))
    ef = gradzip.ErrorFeedback(gradzip.TopK(ratio=0.01), g.numel())
    sent = torch.zeros_like(g)
    for step in range(3):
        ef.codec.decompress_add(ef.compress(g, step=step), sent)
    state = ef.save()
    # residual = 3 g - what was sent, carried into the next step
    twin = gradzip.ErrorFeedback(gradzip.TopK(ratio=0.01), g.numel())
    twin.restore(state)
    assert bytes(twin.compress(g, step=3).numpy()) == bytes(ef.compress(g, step=3).numpy())
    with pytest.raises(gradzip.FormatError):
        gradzip.ErrorFeedback("topk(ratio=0.01)", 100).restore(state)


def test_spec_numbers_round_trip_exactly():
    # numpy scalars print as numbers; integers keep all 64 bits (seeds above 2^53 differ).
    assert gradzip.TopK(ratio=np.float64(0.01), k=None).spec == "topk(ratio=0.01)"
    assert gradzip.RandomK(k=np.int64(5), seed=3).spec.startswith("randomk(k=5,seed=3")
    g = torch.randn(2048, generator=torch.Generator().manual_seed(4))
    a = gradzip.Codec(gradzip.QSGD(seed=2**60)).compress(g)
    b = gradzip.Codec(gradzip.QSGD(seed=2**60 + 1)).compress(g)
    assert not torch.equal(a, b)
    assert gradzip.Codec("qsgd(seed=18446744073709551615)").spec.endswith("551615)")
    with pytest.raises(ValueError, match="seed must be a non-negative integer below 2\\^64, got 18446744073709551616"):
        gradzip.Codec("qsgd(seed=18446744073709551616)")
    with pytest.raises(ValueError, match="seed must be a non-negative integer below 2\\^64, got 1.5"):
        gradzip.Codec("qsgd(seed=1.5)")


def test_default_spec_objects_build():
    for spec in (gradzip.Hadamard(), gradzip.HashedTopK(ratio=0.01, values=gradzip.FP16()),
                 gradzip.HashedTopK(ratio=0.01, slots=0.03, encoding="automatic")):
        gradzip.Codec(spec).compress(torch.randn(4096))
    import copy
    ps = copy.copy(gradzip.PowerSGDCompressor([[4, 4]]))  # no recursion through __getattr__
    with pytest.raises(ValueError, match="factor must be 0 \\(P\\) or 1 \\(Q\\), got 7"):
        gradzip.PowerSGDCompressor([[4, 4]]).payload_bytes(7)
