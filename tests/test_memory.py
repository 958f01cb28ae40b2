"""Peak memory is measured, not modelled: the naive backend's CPU peak matches its score matrices."""

import pytest

from harness.backends.registry import load_registry
from harness.suite.cases import Case
from harness.suite.inputs import make_inputs
from harness.measure.memory import cpu_peak, cpu_peak_problem, load_libc

pytestmark = pytest.mark.skipif(cpu_peak_problem(load_libc()) is not None, reason=f"{cpu_peak_problem(load_libc())}")


@pytest.mark.slow
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


def test_a_cuda_graph_is_captured_inside_the_peak_memory_window(monkeypatch):
    """A replay allocates nothing: the graph's memory is what its capture puts in the graph pool, so the capture must be metered."""
    from harness.execution import execute
    from harness.execution.execute import Phases, run_pair
    from harness.measure.memory import MemoryPeak
    from harness.measure.timing import QUICK_BUDGET
    from harness.results.record import Status

    events: list[str] = []

    class OrderedMeter:
        def __init__(self, device: str) -> None:
            self.device = device

        def start(self) -> None:
            events.append("meter start")

        def stop(self) -> MemoryPeak:
            events.append("meter stop")
            return MemoryPeak(123, None, method="cuda-allocator")

    def capture(step, case):
        # What the CPU cannot do (graph_replay refuses CPU cases): stand in for torch.cuda.graph's capture.
        events.append("capture")

        def replay():
            if events[-1] != "replay":
                events.append("replay")
            return step()

        return replay

    monkeypatch.setattr(execute, "PeakMeter", OrderedMeter)
    monkeypatch.setattr(execute, "graph_replay", capture)
    case = Case(B=1, S_q=8, S_kv=8, H=2, H_kv=2, d_k=16, d_v=16)
    outcome = run_pair(case, load_registry().get("naive"), Phases(timer="graph", check=True), budget=QUICK_BUDGET)
    assert outcome.status is Status.OK, outcome.reason
    # The replays are all inside the window but one: the call after the timed ones, judged with the last of them.
    assert events == ["meter start", "capture", "replay", "meter stop", "replay"]
    assert outcome.peak.peak_bytes == 123 and outcome.agreement.agree  # the replays' outputs are what was checked
