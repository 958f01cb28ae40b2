"""The private torch and xFormers APIs the harness relies on, pinned: each test fails the day one moves.

Each API has a checker in the harness (`*_problem`), shared by these tests and the run-time path:
the first test of each pair calls the API on the CPU the way the harness does and asserts the
checker finds nothing; the second removes or changes the API and asserts the checker says so in
one line, naming the API and the version; the third runs the harness's own path without the API
(run_pair, a backend's prepare, or the function that calls the API) and asserts its one-line outcome. Where the API only annotates a row (the kernel
SDPA or xFormers picked), the row is still measured and says why the kernel has no name; where the
harness cannot measure without it (`torch.cuda._sleep` under the CUDA clock), the pair is
`unsupported` with that reason.
"""

import inspect
import json
import subprocess
import sys

import pytest
import torch
import torch._functorch.config as functorch_config

import harness.execution.execute as execute
from harness.backends.pytorch.compiled import NaiveCompiledBackend
from harness.backends.pytorch.sdpa import (
    FUSED_SDP_CHOICE_ARGUMENTS, SdpaBackend, causal_bias_materialize_problem, dispatched_kernel, fused_sdp_choice_problem,
)
from harness.errors import Unsupported
from harness.measure.cuda_clock import CudaEventClock, spin_problem
from harness.measure.timers import device_clock
from harness.measure.timing import Budget
from harness.results.record import Status
from harness.suite.cases import Case
from harness.suite.inputs import make_inputs, visible_mask
from tests.cli_runs import ROOT

TINY = Budget(warmup_s=0.0, measure_s=0.001, min_sample_s=0.0, min_rounds=1, max_rounds=2)
SQUARE = Case(B=1, S_q=8, S_kv=8, H=2, H_kv=2, d_k=16, d_v=16)
#: Lower-right causal with S_q ≠ S_kv: SDPA gets a CausalBias, which the CPU serves through its materialised mask.
LOWER_RIGHT = Case(B=1, S_q=3, S_kv=5, H=2, H_kv=2, d_k=16, d_v=16, causal=True)


def _one_line_naming(text: str | None, api: str, version: str) -> None:
    assert text and "\n" not in text and api in text and version in text, text


# -- torch._fused_sdp_choice: names the kernel `sdpa` dispatched to ---------------------------------


def test_fused_sdp_choice_returns_an_sdp_backend_that_serves_the_call():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    assert fused_sdp_choice_problem() is None
    q, k, v = (make_inputs(SQUARE).q,) * 3
    index = torch._fused_sdp_choice(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True, enable_gqa=False)
    assert isinstance(index, int)
    chosen = SDPBackend(index)
    with sdpa_kernel(chosen):  # the kernel named is one torch runs for these arguments
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert dispatched_kernel(q, k, v, {"is_causal": True}) == (chosen.name, None)


@pytest.mark.e2e
def test_naming_the_kernel_of_a_call_without_a_causal_bias_leaves_torch_dynamo_unimported():
    """A worker that runs no compiled backend and no lower-right mask never pays torch._dynamo's import (1.5 CPU-s): the
    kernel is named all the same, and a CausalBias, which only its own module makes, is still recognised (test above)."""
    script = ("import json, sys, torch\n"
              "from harness.backends.pytorch.sdpa import dispatched_kernel\n"
              "q = torch.randn(1, 2, 8, 16)\n"
              "names = [dispatched_kernel(q, q, q, kwargs) for kwargs in ({}, {'is_causal': True})]\n"
              "print(json.dumps({'names': names, 'dynamo': 'torch._dynamo' in sys.modules}))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert all(name is not None and why is None for name, why in seen["names"]), seen
    assert seen["dynamo"] is False, "naming an SDPA kernel imported torch._dynamo"


def test_fused_sdp_choice_problem_names_a_missing_or_changed_function(monkeypatch):
    with monkeypatch.context() as m:
        m.delattr(torch, "_fused_sdp_choice")
        _one_line_naming(fused_sdp_choice_problem(), "torch._fused_sdp_choice", torch.__version__)
    # A schema without an argument the harness passes (as if torch renamed one).
    monkeypatch.setattr("harness.backends.pytorch.sdpa.FUSED_SDP_CHOICE_ARGUMENTS", (*FUSED_SDP_CHOICE_ARGUMENTS, "window_size"))
    _one_line_naming(fused_sdp_choice_problem(), "torch._fused_sdp_choice", torch.__version__)


def test_sdpa_row_is_measured_and_says_why_its_kernel_is_unnamed_without_fused_sdp_choice(monkeypatch):
    monkeypatch.delattr(torch, "_fused_sdp_choice")
    outcome = execute.run_pair(SQUARE, SdpaBackend(), budget=TINY)
    assert outcome.status is Status.OK and outcome.measurement is not None
    assert outcome.notes["sdpa_kernel"] is None  # never a made-up name in the kernel column
    _one_line_naming(outcome.notes["sdpa_kernel_unknown"], "torch._fused_sdp_choice", torch.__version__)


# -- CausalBias._materialize: the lower-right mask SDPA falls back to -------------------------------


def test_causal_bias_materializes_the_bottom_right_mask_the_harness_means():
    from torch.nn.attention.bias import causal_lower_right

    assert causal_bias_materialize_problem() is None
    mask = causal_lower_right(LOWER_RIGHT.S_q, LOWER_RIGHT.S_kv)._materialize(torch.device("cpu"))
    assert torch.equal(mask, visible_mask(LOWER_RIGHT)[0, 0])


def test_causal_bias_materialize_problem_names_a_missing_or_changed_method(monkeypatch):
    from torch.nn.attention.bias import CausalBias

    with monkeypatch.context() as m:
        m.delattr(CausalBias, "_materialize")
        _one_line_naming(causal_bias_materialize_problem(), "CausalBias._materialize", torch.__version__)
    monkeypatch.setattr(CausalBias, "_materialize", lambda self: None)  # no device argument any more
    _one_line_naming(causal_bias_materialize_problem(), "CausalBias._materialize", torch.__version__)


def test_lower_right_kernel_is_unnamed_with_the_reason_without_materialize(monkeypatch):
    # torch's own CPU dispatch of a CausalBias calls _materialize too, so without it the SDPA call
    # itself fails (an `error` row with torch's AttributeError); what the harness owns is the name.
    from torch.nn.attention.bias import CausalBias, causal_lower_right

    inputs = make_inputs(LOWER_RIGHT)
    bias = causal_lower_right(LOWER_RIGHT.S_q, LOWER_RIGHT.S_kv)
    assert dispatched_kernel(inputs.q, inputs.k, inputs.v, {"attn_mask": bias})[0] is not None
    monkeypatch.delattr(CausalBias, "_materialize")
    kernel, unnamed = dispatched_kernel(inputs.q, inputs.k, inputs.v, {"attn_mask": bias})
    assert kernel is None
    _one_line_naming(unnamed, "CausalBias._materialize", torch.__version__)


# -- torch.cuda._sleep: the spin under every CUDA sample --------------------------------------------


def test_cuda_sleep_takes_a_cycle_count():
    assert spin_problem(torch) is None
    assert list(inspect.signature(torch.cuda._sleep).parameters) == ["cycles"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.cuda._sleep spins a GPU: CUDA only")
def test_cuda_sleep_spins_the_device_for_longer_the_more_cycles():
    def spun_ms(cycles: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    spun_ms(1_000_000)  # the first launch pays for the module load
    assert spun_ms(10_000_000) > 3 * spun_ms(1_000_000) > 0


def test_spin_problem_names_a_missing_or_changed_sleep(monkeypatch):
    with monkeypatch.context() as m:
        m.delattr(torch.cuda, "_sleep")
        _one_line_naming(spin_problem(torch), "torch.cuda._sleep", torch.__version__)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda: None)  # no cycle count any more
    _one_line_naming(spin_problem(torch), "torch.cuda._sleep", torch.__version__)


def test_cuda_pairs_are_unsupported_with_the_reason_when_sleep_is_missing(monkeypatch):
    monkeypatch.delattr(torch.cuda, "_sleep")
    with pytest.raises(Unsupported, match=r"torch\.cuda\._sleep") as refused:
        CudaEventClock()
    _one_line_naming(str(refused.value), "torch.cuda._sleep", torch.__version__)
    # Through run_pair, with the pair's clock the CUDA one (the CPU case's tensors are all this machine has).
    monkeypatch.setattr(execute, "device_clock", lambda device, flush: device_clock("cuda", flush))
    outcome = execute.run_pair(SQUARE, SdpaBackend(), budget=TINY)
    assert outcome.status is Status.UNSUPPORTED
    _one_line_naming(outcome.reason, "torch.cuda._sleep", torch.__version__)


# -- torch._functorch.config.donated_buffer: never changed; compiled bwd steps compile their backward for retain_graph --


@pytest.mark.compile
@pytest.mark.parametrize("mode", ["bwd", "fwd_bwd"])
def test_compiled_backward_pairs_leave_donated_buffer_as_they_found_it(mode, one_thread):
    # bwd differentiates one saved forward many times, which donated buffers forbid: its backward is
    # compiled for that use, and the flag stays the process's own throughout
    # (set on here, torch's default, so that no earlier test's leftover can make this pass).
    own = functorch_config.donated_buffer
    functorch_config.donated_buffer = True
    try:
        case = Case(B=1, S_q=8, S_kv=8, H=2, H_kv=2, d_k=16, d_v=16, mode=mode)
        outcome = execute.run_pair(case, NaiveCompiledBackend(), budget=TINY)
        after = functorch_config.donated_buffer
    finally:
        functorch_config.donated_buffer = own
    assert outcome.status is Status.OK, outcome.reason
    assert after is True


# -- xFormers' fmha.dispatch._dispatch_fw: names the forward operator, and refuses as the call would --


def _fmha():
    from tests.xformers_real import real_fmha  # imports xformers.ops even beside flash-attn-4 alone

    return real_fmha()


def test_dispatch_fw_takes_inputs_and_refuses_what_no_operator_serves():
    from harness.backends.xformers.adapter import dispatch_fw_problem

    fmha = _fmha()
    assert dispatch_fw_problem(fmha) is None
    q = torch.zeros(1, 8, 2, 16)  # CPU float32: no xFormers operator serves it
    with pytest.raises(NotImplementedError, match="No operator found for `memory_efficient_attention_forward`"):
        fmha.dispatch._dispatch_fw(fmha.Inputs(query=q, key=q, value=q, attn_bias=None, scale=0.25), False)
    assert isinstance(fmha.cutlass.FwOp.NAME, str) and isinstance(fmha.flash.FwOp.NAME, str)  # what the notes read


def test_dispatch_fw_problem_names_a_missing_or_changed_function(monkeypatch):
    from harness.backends.xformers.adapter import dispatch_fw_problem, xformers_version

    fmha = _fmha()
    with monkeypatch.context() as m:
        m.delattr(fmha.dispatch, "_dispatch_fw")
        _one_line_naming(dispatch_fw_problem(fmha), "_dispatch_fw", xformers_version())
    monkeypatch.setattr(fmha.dispatch, "_dispatch_fw", lambda inp: None)  # no needs_gradient any more
    _one_line_naming(dispatch_fw_problem(fmha), "_dispatch_fw", xformers_version())


def _xformers_without_dispatcher(monkeypatch, forward):
    import harness.backends.xformers.adapter as xf

    fmha = _fmha()

    class FakeXops:
        memory_efficient_attention = staticmethod(forward)

    monkeypatch.setattr(xf, "import_xformers", lambda: (FakeXops, None))
    monkeypatch.delattr(fmha.dispatch, "_dispatch_fw")
    return xf.XformersBackend()


def test_xformers_row_says_why_its_operator_is_unnamed_without_dispatch_fw(monkeypatch):
    from harness.backends.xformers.adapter import xformers_version

    backend = _xformers_without_dispatcher(monkeypatch, lambda q, k, v, attn_bias=None, scale=None, op=None: q * 1.0)
    prepared = backend.prepare(SQUARE, make_inputs(SQUARE))
    assert prepared.notes["op_fw"] is None
    _one_line_naming(prepared.notes["op_fw_unknown"], "_dispatch_fw", xformers_version())


def test_xformers_forward_refusal_is_unsupported_without_dispatch_fw(monkeypatch):
    def refuse(q, k, v, attn_bias=None, scale=None, op=None):
        raise NotImplementedError("No operator found for `memory_efficient_attention_forward` with inputs: cpu")

    backend = _xformers_without_dispatcher(monkeypatch, refuse)
    with pytest.raises(Unsupported, match="xformers: No operator found"):
        backend.prepare(SQUARE, make_inputs(SQUARE))


# -- xformers._cpp_lib: why xFormers' extensions did not load; had it moved, xFormers is still there ---------


def test_xformers_without_cpp_lib_is_not_reported_as_missing(monkeypatch):
    import sys

    import xformers

    from harness.backends.xformers.adapter import import_xformers

    _fmha()
    monkeypatch.delattr(xformers, "_cpp_lib")
    monkeypatch.setitem(sys.modules, "xformers._cpp_lib", None)  # importing it now raises ImportError
    xops, broken = import_xformers()
    assert broken is None and hasattr(xops, "memory_efficient_attention")
