"""The one executor of a (case, backend) pair: inputs → prepare → warm-up and timed samples (peak memory read over them) → check.

`run_pair` runs the phases a caller switches on (`Phases`) and returns one typed `PairOutcome`;
`outcome.to_record` turns it into the run's `Record`. Suites, `attnbench check`, `gpu-check` and
`stability` all go through it, so a pair is prepared, checked and flagged the same way everywhere.
Whatever happens becomes data: `unsupported` with the backend's reason, `oom`, `error` with the
exception and where it was raised, `crashed` for a sticky CUDA error (the worker then exits).
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from harness.backends.base import Backend, NotPrepared, Prepared, prepare_pair
from harness.backends.features import refusal
from harness.backends.determinism import NOT_REPEATABLE, bitwise_equal, deterministic_algorithms, detached
from harness.errors import Unsupported
from harness.telemetry import gpu_state
from harness.telemetry.energy import ENERGY_NOT_ASKED, EnergyResult, pair_energy
from harness.measure.memory import PeakMeter, measure_peak
from harness.profiling.profile import profile_step
from harness.attention.numerics import Agreement, weights_violations
from harness.execution.outcome import PairOutcome, to_record
from harness.execution.resources import PairResources
from harness.attention.reference import ReferenceCache
from harness.errors import one_line
from harness.errors import STICKY_PREFIX, described, is_oom, is_sticky_cuda_error
from harness.execution.kernel_proof import prove_kernels
from harness.execution.shared_inputs import InputsCache, modified_inputs
from harness.results.vocabulary import STOP_FIRST_CALL
from harness.execution.verdict import TIMED_CALLS, UNTIMED_CALLS, agreement_of, both_calls
from harness.measure.timers import between_sample_setup, device_clock, graph_replay, kernel_measurement, timer_name
from harness.measure.timing import QUICK_BUDGET, Budget, Clock, Loop, keep_last, measure
from harness.results.record import Record, Status
from harness.results.run_options import RunOptions
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, make_inputs


@dataclass(frozen=True)
class Phases:
    """Which phases of a pair run. Inputs and prepare always do; the rest are switched by the caller."""

    #: Compare a call's output with the float64 reference: the last timed call's, or with `time` off each of two calls.
    check: bool = True
    #: Also check the attention weights of a backend that exposes them (`attnbench check`).
    weights: bool = False
    #: Timed samples.
    time: bool = True
    #: Peak memory: read over the warm-up and timed samples, or with `time` off around one more call.
    memory: bool = True
    #: What a sample is: `events` (device time between events; perf_counter on the CPU), `kernels`
    #: (the profiler's kernel time per call) or `graph` (a CUDA graph replay): harness.measure.timers.
    timer: str = "events"
    #: With `time`: energy per call, calls back to back after the check, where the device has an energy counter
    #: (`run --energy`: off by default, since on a GPU the phase costs 0.3-1 s a pair, several times the timed samples).
    energy: bool = False
    #: A few steps under torch.profiler after everything else (never inside a timed sample).
    profile: bool = False
    #: Profiled steps, and the folder a Chrome trace of each pair goes to (None: no trace file).
    profile_steps: int = 5
    traces: Path | None = None

    @classmethod
    def of_run(cls, options: RunOptions, traces: Path | None = None) -> "Phases":
        """The phases every pair of a run with `options` runs (the traces into the folder `traces`, and only with profile)."""
        return cls(check=options.check, timer=options.timer, energy=options.energy, profile=options.profile,
                   traces=traces if options.profile and options.traces else None)


#: What `attnbench check` runs: agreement alone, untimed.
CHECK_ONLY = Phases(check=True, weights=True, time=False, memory=False)


class _Stopwatch:
    """Accumulates host seconds per phase into a dict: `with watch("check"): ...`."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - started


@dataclass
class PairRunner:
    """What the loop over pairs owns and hands to each pair: budget, caches and how rounds are driven.

    `references` keeps the last float64 reference, which the next backend on the same case reuses
    (so loops run cases outer, backends inner). `loop_factory` turns the device's clock into the
    loop that runs the timed rounds (pytest-benchmark's pedantic in the suites); None is a plain loop.
    """

    budget: Budget = QUICK_BUDGET
    phases: Phases = Phases()
    references: ReferenceCache | None = field(default_factory=ReferenceCache)
    loop_factory: Callable[[Clock], Loop] | None = None
    inputs: InputsCache | None = field(default_factory=InputsCache)
    #: NVML, the RAPL counter and the L2 flush buffer, opened once for this runner's pairs (its owner may close() them).
    resources: PairResources = field(default_factory=PairResources)

    def run(self, case: Case, backend: Backend) -> PairOutcome:
        """Run one pair with this runner's phases, budget and caches."""
        return run_pair(case, backend, self.phases, budget=self.budget, references=self.references, loop_factory=self.loop_factory,
                        inputs=self.inputs, resources=self.resources)


def build_step(case: Case, prepared: Prepared, inputs: AttentionInputs) -> Callable[[], Any]:
    """The callable to time for the case's mode.

    fwd: the backend's call. bwd: backward alone from one saved forward, each iteration a fresh
    `autograd.grad` (nothing accumulates between iterations). fwd_bwd: both, per iteration.
    """
    if case.mode == "fwd":
        return prepared.fn
    wanted = 3 if prepared.check is None else len(prepared.leaves)  # a backend with its own check names its own leaves
    if not prepared.leaves or len(prepared.leaves) != wanted or not all(t.requires_grad for t in prepared.leaves):
        raise Unsupported("backend did not return differentiable q, k, v leaves")
    leaves = prepared.leaves
    grad_out = prepared.from_bhsd(inputs.grad_out)
    if case.mode == "bwd":
        with torch.enable_grad():
            out = prepared.fn()
        return lambda: torch.autograd.grad(out, leaves, grad_out, retain_graph=True)

    def forward_backward():
        with torch.enable_grad():
            out = prepared.fn()
        return torch.autograd.grad(out, leaves, grad_out)

    return forward_backward


def _failure(exc: BaseException) -> PairOutcome:
    if isinstance(exc, NotPrepared):  # the backend's mistake, said whole: where the harness noticed it would mislead
        return PairOutcome(Status.ERROR, str(exc))
    if is_oom(exc):
        return PairOutcome(Status.OOM, " ".join(str(exc).split())[:300])
    if is_sticky_cuda_error(exc):
        return PairOutcome(Status.CRASHED, STICKY_PREFIX + " ".join(str(exc).split())[:300])
    return PairOutcome(Status.ERROR, described(exc))


def _release_memory(device: str) -> None:
    gc.collect()
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()


def missing_device(case: Case) -> str | None:
    """Why `case` cannot run on this machine because its device is not here (a CUDA case without CUDA), or None."""
    if case.device.startswith("cuda") and not torch.cuda.is_available():
        return (f"the case is on {case.device}, and this machine has no CUDA device (torch {torch.__version__} sees none): "
                "it runs on a CUDA GPU only (a built-in suite with a CPU grid runs that grid on a CPU)")
    return None


def run_pair(case: Case, backend: Backend, phases: Phases = Phases(), *, budget: Budget = QUICK_BUDGET,
             references: ReferenceCache | None = None, loop_factory: Callable[[Clock], Loop] | None = None,
             inputs: InputsCache | None = None, resources: PairResources | None = None) -> PairOutcome:
    """Run one pair's phases and return its outcome; never raises for a backend's failure."""
    if resources is None:
        with PairResources() as own:  # a pair run on its own holds what it opens for its length
            return run_pair(case, backend, phases, budget=budget, references=references, loop_factory=loop_factory,
                            inputs=inputs, resources=own)
    try:
        # Every reason, the declared features' included: a backend whose `supports` does not ask its base class is still
        # refused a batch it cannot read (harness.backends.features.refusal).
        reason = missing_device(case) or backend.available() or refusal(backend, case)
    except Exception as exc:  # noqa: BLE001 - a probe that crashes cannot vouch for the backend
        return PairOutcome(Status.ERROR, f"availability check failed: {one_line(exc)}")
    if reason:
        return PairOutcome(Status.UNSUPPORTED, reason)
    failed: BaseException | None = None
    started = time.perf_counter()
    seconds: dict[str, float] = {}
    try:
        outcome = _run_phases(case, backend, phases, budget, references, loop_factory, _Stopwatch(seconds), inputs or InputsCache(),
                              resources)
    except Unsupported as exc:
        outcome = PairOutcome(Status.UNSUPPORTED, str(exc))
    except Exception as exc:  # noqa: BLE001 - every failure becomes data
        failed = exc
    if failed is not None:
        # Built outside the except block: the exception's frames hold the case's tensors.
        outcome = _failure(failed)
        failed = None
    if inputs is not None and (outcome.status is not Status.OK or (outcome.agreement is not None and outcome.agreement.agree is False)):
        inputs.drop()  # a pair that failed or disagreed may have left its inputs in any state: the next one draws afresh
    _release_memory(case.device)
    outcome.seconds = {**seconds, "pair": time.perf_counter() - started}
    return outcome


def _time_phases(case: Case, step: Callable[[], Any], phases: Phases, budget: Budget, loop_factory: Callable[[Clock], Loop] | None,
                 watch: _Stopwatch, outcome: PairOutcome, resources: PairResources) -> tuple[Any, Callable[[], Any]]:
    """Warm-up and timed samples (peak memory read over them) into `outcome`.

    Returns the last timed call's result and the step that was timed (with --timer graph the replay,
    which the profile pass then runs too).
    """
    clock, setup, events_name = device_clock(case.device, resources.flush)
    outcome.timer = timer_name(phases.timer, case.device, events_name)
    loop = loop_factory(clock) if loop_factory else None
    # The peak of one call, read over warm-up and samples (calls run one after another and free
    # their temporaries): no call of its own. Started before the warm-up, whose first call pays
    # the page faults (or cudaMalloc), so the samples do not.
    meter = PeakMeter(case.device) if phases.memory else None
    with watch("memory"):
        if meter is not None:
            meter.start()
    if phases.timer == "graph":
        with watch("prepare"):
            # Captured inside the window: a replay allocates nothing, its memory is the graph pool the capture fills.
            step = graph_replay(step, case)
    timed, held = keep_last(step)
    sampler = gpu_state.StateSampler(resources.telemetry.telemetry(case.device))  # reads the GPU while the timed rounds run, not the warm-up
    with watch("warmup"):
        outcome.measurement = measure(timed, clock, budget, setup=setup, loop=loop, around=sampler.around)
    outcome.state = sampler.summary
    with watch("memory"):
        if meter is not None:
            outcome.peak = meter.stop()
    # measure() knows how long its timed rounds took; the rest of it was warm-up and calibration.
    watch.seconds["timed"] = outcome.measurement.loop_s or 0.0
    watch.seconds["warmup"] -= watch.seconds["timed"]
    if phases.timer == "kernels":
        with watch("timed"):
            outcome.measurement = kernel_measurement(outcome.measurement, step, case.device, setup)
    return held[0], step


def _profile_phase(case: Case, backend: Backend, step: Callable[[], Any], phases: Phases, outcome: PairOutcome,
                   resources: PairResources) -> None:
    """Profile a few steps into `outcome.profile`; a profiler that fails costs the profile columns, not the row's timing.

    The profile is diagnosis run after the measurement: its failure (a torch whose profiler moved, a
    trace folder that filled up) is noted as `profile_failed` on a row whose latency stands. A sticky
    CUDA error is the exception: the process cannot go on, so it still ends the pair as `crashed`.
    """
    trace = phases.traces / f"{case.id}-{backend.name}.trace.json.gz" if phases.traces is not None else None
    try:
        outcome.profile = profile_step(step, case.device, steps=phases.profile_steps, trace_path=trace,
                                       setup=between_sample_setup(case.device, resources.flush))  # flushed as the timed samples were
    except Exception as exc:  # noqa: BLE001 - the profile is diagnosis; the measured row stands without it
        if is_sticky_cuda_error(exc):
            raise
        outcome.notes = {**outcome.notes, "profile_failed": described(exc)}


def _weights_problems(case: Case, backend: Backend) -> list[str]:
    """Row sums and masked zeros of the weights a backend exposes, on fresh inputs."""
    with torch.no_grad():
        _, weights = backend.weights(case, make_inputs(case))
    return weights_violations(case, weights)


def _run_phases(case: Case, backend: Backend, phases: Phases, budget: Budget, references: ReferenceCache | None,
                loop_factory: Callable[[Clock], Loop] | None, watch: _Stopwatch, cache: InputsCache, resources: PairResources) -> PairOutcome:
    with watch("inputs"):
        inputs, kept = cache.get(case)
    outcome = PairOutcome(Status.OK)
    first: Agreement | None = None
    # A deterministic case's prepare, timing and check all run under torch's deterministic algorithms.
    with torch.set_grad_enabled(case.mode != "fwd"), deterministic_algorithms(case):
        with watch("prepare"):
            prepared = prepare_pair(backend, case, inputs)  # a plain callable too, as the README's plugin returns
            outcome.compile_s, outcome.plan_s, outcome.notes = prepared.compile_s, prepared.plan_s, prepared.notes
            step = build_step(case, prepared, inputs)
        calls = UNTIMED_CALLS
        if phases.time:
            # The pair's first call is the warm-up's; the output checked is the last timed call's, and
            # with --timer graph what is timed, checked and profiled is the replay.
            result, step = _time_phases(case, step, phases, budget, loop_factory, watch, outcome, resources)
            if phases.check and backend.computes_attention and outcome.measurement.stopped_by != STOP_FIRST_CALL:
                # Then one more call, untimed, outside the memory window, judged with it: two calls in a row, so a
                # backend wrong on alternate calls shows in one (a row whose one call was its sample was judged whole).
                with watch("check"):
                    first = modified_inputs(kept, inputs, " over its timed calls") or agreement_of(
                        case, backend, prepared, inputs, result, phases.check, references)
                    repeated = detached(result)
                    del result
                    result = step()
                    outcome.bitwise_repeatable = bitwise_equal(repeated, result)
                    del repeated  # freed before the memory phase reads its peak
                calls = TIMED_CALLS
        else:
            with watch("check"):
                result = step()
                if phases.check:  # a second call: a backend right only on its first (state carried across calls) is caught
                    first = modified_inputs(kept, inputs, " in its first call") or agreement_of(
                        case, backend, prepared, inputs, result, phases.check, references)
                    repeated = detached(result)
                    del result
                    result = step()
                    outcome.bitwise_repeatable = bitwise_equal(repeated, result)
                    del repeated  # freed before the memory phase reads its peak
            if phases.memory:
                with watch("memory"):
                    outcome.peak = measure_peak(step, case.device)
        with watch("check"):
            agreement = modified_inputs(kept, inputs) or agreement_of(case, backend, prepared, inputs, result, phases.check, references)
            del result
            if first is not None:
                agreement = both_calls(first, agreement, calls)
            if case.deterministic and outcome.bitwise_repeatable is False:  # the claim measured, and failed
                agreement = agreement.disagreeing(NOT_REPEATABLE)
            if phases.check:  # the backend's kernel claim, proved by one untimed profiled call of the plain step (kernel_proof)
                prove_kernels(case, backend, build_step(case, prepared, inputs) if phases.timer == "graph" else step, outcome,
                              prepared.planned_kernels)
        if phases.time and phases.energy:
            with watch("energy"):
                outcome.energy = pair_energy(step, case.device, outcome.measurement.stats.median,
                                             resources.telemetry.energy_counter(case.device))
        elif phases.time:
            outcome.energy = EnergyResult(reason=ENERGY_NOT_ASKED)
        if phases.profile:
            with watch("profile"):
                _profile_phase(case, backend, step, phases, outcome, resources)
    if phases.weights and backend.returns_weights and case.mode == "fwd" and not case.ragged:
        problems = _weights_problems(case, backend)
        if problems:
            agreement = agreement.disagreeing("weights: " + "; ".join(problems))
    outcome.agreement = agreement
    outcome.reason = agreement.check_note
    return outcome


def execute(case: Case, backend: Backend, runner: PairRunner | None = None, run_id: str = "", worker: str = "0") -> Record:
    """Run one pair through `runner` (default: every phase, the quick budget) and return its record."""
    if runner is None:
        with PairResources() as own:  # a runner made for one pair gives back what it opened
            return to_record(case, backend, PairRunner(resources=own).run(case, backend), run_id, worker)
    return to_record(case, backend, runner.run(case, backend), run_id, worker)
