"""The hook states refuse bad arguments and foreign checkpoints by name (no process group needed)."""
import pytest
import torch

import gradzip
import gradzip.torch as gzt


@pytest.mark.parametrize("kwargs,message", [
    ({"start_iter": -1}, "start_iter must be >= 0, got -1"),
    ({"min_compression_rate": -2.0}, "min_compression_rate must be >= 0, got -2.0"),
    ({"min_compression_rate": float("nan")}, "min_compression_rate must be >= 0, got nan"),
    ({"threads": -1}, "threads must be >= 0, got -1"),
])
def test_gradzip_state_arguments(kwargs, message):
    with pytest.raises(ValueError) as e:
        gzt.GradzipState("topk(ratio=0.01)", **kwargs)
    assert message in str(e.value)


def test_gradzip_state_codec_errors_carry_gradzip_message():
    with pytest.raises(ValueError, match="qsgd bits must be 4 or 8, got 5"):
        gzt.GradzipState("qsgd(bits=5)")


def test_powersgd_state_arguments():
    with pytest.raises(ValueError, match="matrix_approximation_rank must be >= 1, got 0"):
        gzt.PowerSGDState(matrix_approximation_rank=0)
    with pytest.raises(ValueError, match="start_iter must be >= 0, got -3"):
        gzt.PowerSGDState(start_powerSGD_iter=-3)


def test_checkpoints_of_another_codec_or_rank_are_refused():
    saved = gzt.GradzipState("topk(ratio=0.01)").state_dict()
    with pytest.raises(ValueError, match="the checkpoint is for codec 'topk\\(ratio=0.01\\)'"):
        gzt.GradzipState(gradzip.QSGD()).load_state_dict(saved)
    bad = dict(saved, residuals={0: torch.zeros(3, 2)})
    with pytest.raises(ValueError, match="residual 0 is not a 1-D float32 tensor"):
        gzt.GradzipState("topk(ratio=0.01)").load_state_dict(bad)
    ps = gzt.PowerSGDState(matrix_approximation_rank=2).state_dict()
    with pytest.raises(ValueError, match="the checkpoint is for rank 2, this state's is 4"):
        gzt.PowerSGDState(matrix_approximation_rank=4).load_state_dict(ps)


def test_powersgd_compressor_errors_name_the_call():
    ps = gradzip.PowerSGDCompressor([[12, 20], [12]], rank=2)
    with pytest.raises(ValueError, match="gradient has 10 elements, the bucket 252"):
        ps.compress_p(torch.zeros(10), torch.empty(ps.payload_bytes(ps.P), dtype=torch.uint8))
    with pytest.raises(ValueError, match="powersgd: rank must be >= 1, got 0"):
        gradzip.PowerSGDCompressor([[4, 4]], rank=0)
