"""Every backend with a backward pass gives the reference's gradients on every call of its backward step, not only the first.

A timed backward row is many calls of one step; a step that carries state (gradients accumulated
into leaves, a buffer one call overwrites and the next reads) times something else from its second
call on. Each backend that serves a backward case here is called three times in `bwd` and in
`fwd_bwd`, and each call's dQ, dK, dV are checked against the float64 reference.

The compiled backends run with inductor's caches in a fresh folder, `fwd_bwd` first: that is how a
single-use backward (compiled with donated buffers) lands in the cache before a `bwd` step's
retain_graph backward of the same graph asks for it, the order that broke naive-compiled.
"""

from __future__ import annotations

import pytest
import torch

from harness.backends.registry import load_registry
from harness.checks.gpu_plan import compiles
from harness.execution.execute import build_step
from harness.execution.verdict import check_result
from harness.execution.shared_inputs import InputsCache
from harness.attention.reference import ReferenceCache
from harness.suite.cases import Case

CALLS = 3
#: GQA causal and MHA full: the mask and the head grouping are where a backward goes wrong.
SHAPES = (dict(H=4, H_kv=2, causal=True), dict(H=4, H_kv=4, causal=False))
#: A compiling backend's one shape (each shape is two cold compiles): GQA causal in a sliding window, so one compile
#: carries the mask, the grouping and the window (the compiled window backward had a test of its own, one more compile).
COMPILED_SHAPE = dict(H=4, H_kv=2, causal=True, window=5)
#: The backends that must be covered here (each has a backward on this machine); a new one is found by the loop anyway.
EXPECTED = {"naive", "naive-compiled", "sdpa", "sdpa-math", "sdpa-flash", "mha-layer"}


def _backward_cases(shape: dict) -> list[Case]:
    """`fwd_bwd` before `bwd` of the same shape: the order in which a cached single-use backward reaches a retain_graph one."""
    return [Case(B=2, S_q=32, S_kv=32, d_k=16, d_v=16, dtype="fp32", mode=mode, **shape) for mode in ("fwd_bwd", "bwd")]


def _backward_backends() -> list[str]:
    """Every available backend that computes attention and serves one of the backward cases here."""
    registry = load_registry()
    names = []
    for name in registry.names():
        backend = registry.get(name)
        if backend.available() or not backend.computes_attention:
            continue
        if any(backend.supports(case) is None for shape in SHAPES for case in _backward_cases(shape)):
            names.append(name)
    return names


@pytest.fixture
def fresh_inductor_cache(tmp_path, monkeypatch):
    """Inductor's and AOTAutograd's on-disk caches in an empty folder: what this test caches is all they hold."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def test_the_backends_with_a_backward_here_are_all_covered():
    assert EXPECTED <= set(_backward_backends())


@pytest.mark.e2e
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.compile) if compiles(load_registry().get(name).family) else name
                                  for name in _backward_backends()])
def test_every_call_of_a_backward_step_gives_the_reference_gradients(name, fresh_inductor_cache, one_thread):
    backend = load_registry().get(name)
    references = ReferenceCache()
    checked = 0
    for shape in (COMPILED_SHAPE,) if compiles(backend.family) else SHAPES:
        for case in _backward_cases(shape):
            if backend.supports(case) is not None:
                continue
            inputs, _ = InputsCache().get(case)
            with torch.enable_grad():
                prepared = backend.prepare(case, inputs)
                step = build_step(case, prepared, inputs)
                for call in range(1, CALLS + 1):
                    agreement = check_result(case, prepared, inputs, step(), references)
                    assert agreement.agree, f"{case.id} [{name}], call {call} of {CALLS}: {agreement.check_note}"
            checked += 1
    assert checked >= 2, f"{name} served {checked} backward cases"
