"""GPU adapters' control flow on the CPU, with the GPU library's kernel replaced by a stand-in.

The kernels cannot run here; what is checked is how an adapter reacts to what the library does
(a refusal raised only when backward runs), and the CUDA clock's event/spin ordering against a
simulated device timeline.
"""

import pytest
import torch

from harness.suite.cases import Case
from harness.errors import Unsupported
from harness.suite.inputs import make_inputs
from tests.gpu_timeline import Timeline


class _RefusingBackward(torch.autograd.Function):
    """Forward returns its input; backward raises as xFormers does when no backward operator fits."""

    @staticmethod
    def forward(ctx, q):
        return q.clone()

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("No operator found for `memory_efficient_attention_backward` with inputs: BMGHK")


def _fake_xformers(monkeypatch, *, backward_ok: bool):
    import harness.backends.xformers.adapter as xf
    from tests.xformers_real import real_fmha

    fmha = real_fmha()

    class FakeOp:
        NAME = "fake_fw"

    class FakeXops:
        @staticmethod
        def memory_efficient_attention(q, k, v, attn_bias=None, scale=None, op=None):
            out = q * 1.0 if backward_ok else _RefusingBackward.apply(q)
            return out + 0.0 * (k.sum() + v.sum())

    monkeypatch.setattr(xf, "import_xformers", lambda: (FakeXops, None))
    monkeypatch.setattr(fmha.dispatch, "_dispatch_fw", lambda inp, needs_gradient: FakeOp)
    monkeypatch.setattr(fmha.dispatch, "_dispatch_bw", lambda inp, varlen_lse_packed: FakeOp)
    return xf.XformersBackend()


GQA_BWD = Case(B=1, S_q=8, S_kv=8, H=4, H_kv=2, d_k=16, d_v=16, dtype="fp32", mode="bwd", causal=True)


def test_xformers_backward_refusal_is_unsupported_not_an_error(monkeypatch):
    backend = _fake_xformers(monkeypatch, backward_ok=False)
    inputs = make_inputs(GQA_BWD)
    with pytest.raises(Unsupported, match="xformers backward: No operator found"):
        backend.prepare(GQA_BWD, inputs)


def test_xformers_backward_probe_passes_when_backward_runs(monkeypatch):
    backend = _fake_xformers(monkeypatch, backward_ok=True)
    prepared = backend.prepare(GQA_BWD, make_inputs(GQA_BWD))
    assert prepared.notes["op_fw"] == "fake_fw" and all(t.requires_grad for t in prepared.leaves)


@pytest.mark.parametrize("host_s,device_s", [(30e-6, 10e-6), (200e-6, 5e-6), (20e-6, 3e-3)])
def test_cuda_event_clock_keeps_launch_overhead_out_of_device_time(host_s, device_s):
    from harness.measure.cuda_clock import CudaEventClock

    tl = Timeline()
    clock = CudaEventClock(torch_module=tl, host_clock=tl.host_clock)
    measured = []
    for _ in range(6):
        start = clock()
        tl.call(host_s, device_s)
        measured.append(clock() - start)
    # The first sample may still see part of the launch (the spin is sized from host gaps seen so far).
    assert measured[-3:] == pytest.approx([device_s] * 3, rel=1e-9, abs=1e-12)


def test_cuda_event_clock_without_spin_would_count_the_launch():
    # The simulated timeline is what makes the test above meaningful: an event pair around an idle
    # GPU measures host time too.
    tl = Timeline()
    a = tl.cuda.Event()
    a.record()
    a.synchronize()
    tl.call(30e-6, 10e-6)
    b = tl.cuda.Event()
    b.record()
    b.synchronize()
    assert a.elapsed_time(b) / 1e3 == pytest.approx(40e-6)


def test_spin_is_twice_the_longest_recent_host_gap_within_bounds():
    from harness.measure.cuda_clock import SPIN_FIRST_S, SPIN_MAX_S, SPIN_MIN_S, spin_seconds

    assert spin_seconds([]) == SPIN_FIRST_S
    assert spin_seconds([1e-6]) == SPIN_MIN_S
    assert spin_seconds([30e-6, 50e-6]) == pytest.approx(100e-6)
    assert spin_seconds([1.0]) == SPIN_MAX_S


def _fake_pynvml(**functions):
    import types

    mod = types.ModuleType("pynvml")
    mod.NVML_CLOCK_SM, mod.NVML_CLOCK_MEM, mod.NVML_TEMPERATURE_GPU = 0, 2, 0
    mod.nvmlInit = mod.nvmlShutdown = lambda: None
    mod.nvmlDeviceGetCount = lambda: 1
    mod.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    mod.nvmlSystemGetDriverVersion = lambda: b"550.54"
    mod.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    mod.nvmlDeviceGetClockInfo = lambda h, kind: {0: 1980, 2: 2619}[kind]
    for name, fn in functions.items():
        setattr(mod, name, fn)
    return mod


@pytest.mark.parametrize("reasons_name", ["nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"])
def test_gpu_telemetry_reads_either_name_and_survives_missing_functions(monkeypatch, reasons_name):
    import sys

    from harness.telemetry.nvml import gpu_telemetry

    def power(h):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(**{reasons_name: lambda h: 4, "nvmlDeviceGetPowerUsage": power}))
    (gpu,) = gpu_telemetry()
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["driver"] == "550.54"
    assert gpu["sm_clock_mhz"] == 1980 and gpu["mem_clock_mhz"] == 2619
    assert gpu["throttle_reasons"] == 4 and gpu["throttle_reasons_hex"] == "0x4"
    # Absent (max clock, temperature, power limit) or failing (power) functions are None, not a crash.
    assert gpu["max_sm_clock_mhz"] is None and gpu["power_w"] is None and gpu["power_limit_w"] is None


def test_flash_attn2_is_unavailable_when_flash_attn_is_only_fa4s_namespace(monkeypatch):
    import sys
    import types

    from harness.backends.flashattention.adapter import FlashAttn2Backend

    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))  # what flash-attn-4 alone leaves
    reason = FlashAttn2Backend().available()
    assert reason and "flash_attn_func" in reason and "not installed" in reason


def test_gpu_check_holds_single_kernel_pairs_to_their_kernel_time():
    from harness.checks.gpu import Row
    from harness.cli.gpu_check import format_table
    from harness.results.record import Status

    h200 = {"overhead_ms": 0.004}  # the fixed overhead a sample carries between events there
    close = Row("sdpa-cudnn", "c1", Status.OK, True, 0.412, None, kernel_ms=0.4055, kernels=1.0, **h200)
    far = Row("sdpa", "c2", Status.OK, True, 0.0444, None, kernel_ms=0.0125, kernels=1.0, **h200)  # the cold-clock decode of the issue
    many = Row("naive", "c3", Status.OK, True, 1.30, None, kernel_ms=1.0, kernels=4.0, **h200)  # gaps between kernels are real time
    cpu = Row("naive", "c4", Status.OK, True, 4.0, None, kernel_ms=2.0, kernels=1.0, device="cpu")
    assert not close.failed and far.failed and not many.failed and not cpu.failed
    assert far.timer_ratio == pytest.approx(3.552, abs=1e-3) and far.net_ratio == pytest.approx(3.232, abs=1e-3)
    table = format_table([close, far, many])
    assert "1.016" in table and "timer 3.232x the kernel time on c2 after the 4.0 µs fixed overhead" in table


@pytest.mark.slow
def test_gpu_check_cpu_mode_shows_the_profiled_ratio(capsys):
    from harness.cli.main import main

    assert main(["gpu-check", "--cpu", "--backends", "sdpa-math"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("sdpa-math "))
    ratio, net = row.split()[8:10]  # backend ok agree unsup fail case ms kernel-ms ratio net
    assert float(ratio) > 0
    assert net == "-" and "fixed overhead" not in out  # measured on CUDA only: the CPU's profiler costs more than an add
