"""Peak memory is measured, not modelled: the naive backend's CPU peak matches its score matrices."""

import pytest

from harness.backends.registry import load_registry
from harness.suite.cases import Case
from harness.suite.inputs import make_inputs
from harness.measure.memory import cpu_peak, cpu_peak_supported

pytestmark = pytest.mark.skipif(cpu_peak_supported() is not None, reason=f"{cpu_peak_supported()}")


def test_naive_peak_is_its_two_score_matrices():
    # At S = 2048 the two fp32 [B, H, S, S] tensors (scores, weights) are 256 MiB; Q·scale and
    # the output add 8 MiB (3 %), inside the ±10 % the model is held to.
    case = Case(B=1, S_q=2048, S_kv=2048, H=8, H_kv=8, d_k=64, d_v=64, dtype="fp32")
    prepared = load_registry().get("naive").prepare(case, make_inputs(case))
    model = 2 * case.B * case.H * case.S_q * case.S_kv * 4
    peaks = [cpu_peak(prepared.fn).peak_bytes for _ in range(3)]
    assert all(p == pytest.approx(model, rel=0.10) for p in peaks), peaks


def test_a_known_allocation_is_seen():
    import torch

    nbytes = 64 * 2**20
    peak = cpu_peak(lambda: torch.ones(nbytes // 4, dtype=torch.float32))
    assert peak.peak_bytes == pytest.approx(nbytes, rel=0.05)


def test_nothing_allocated_reads_near_zero():
    peak = cpu_peak(lambda: None)
    assert peak.peak_bytes < 2 * 2**20
