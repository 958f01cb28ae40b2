"""Timers and sampling plans: the harness's one measurement path.

`measure()` warms a callable up by time, calibrates how many calls make one sample, then takes the
samples: its own loop stops as it goes (`StoppingLoop`: once the median's interval is within the
precision, the budget is spent or the rounds run out), an external `Loop` (pytest-benchmark's
`pedantic`) runs a fixed number of rounds sized by the budget. Either way the same clock reads the
time and the same `Stats` (harness.measure.stats) summarise the same samples. The clock is injected,
so tests drive everything with a fake clock and get exact answers.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from harness.measure.contention import CpuProbe, contention
from harness.measure.stats import Drift, Stats, drift
from harness.measure.stopping import (STOP_BUDGET, STOP_CALL_EXCEEDS_BUDGET, STOP_FIRST_CALL, STOP_MAX_ROUNDS, STOP_MIN_ROUNDS,  # noqa: F401 - re-exported
                                      STOP_PRECISION, StoppingLoop)

from harness.measure.stopping import Clock, Loop  # noqa: F401 - re-exported: the clock's types, where callers have read them
# Re-exported: where suite files (suites/*.py) take a budget from.
from harness.suite.budget import CUDA_BUDGET, MAX_BUDGET_S, QUICK_BUDGET, Budget  # noqa: F401
from harness.results.vocabulary import MIN_SAMPLE_TICKS  # noqa: F401 - re-exported



@dataclass(frozen=True)
class Plan:
    """What calibration decided: calls per sample, the samples the budget holds and why that many, and what warm-up cost.

    `rounds` is what an external loop runs; the harness's own loop stops by itself (`StoppingLoop`)
    and takes at least `min(rounds, Budget.min_rounds)` before a budget stop.
    """

    iterations: int
    rounds: int
    warmup_calls: int
    warmup_s: float
    call_s: float
    #: budget, min_rounds (the budget held fewer), call_exceeds_budget (one round costs more than the
    #: budget: `fewest_rounds`), first_call (the first call was the one sample) or max_rounds (it held more).
    stop: str = STOP_BUDGET
    #: With `stop` first_call: that call's seconds, the row's one sample (`rounds` is then 0).
    first_call_s: float | None = None


@dataclass(frozen=True)
class Measurement:
    """A plan, the statistics of the samples it produced, and what may have distorted them.

    `stopped_by`: what ended the samples (STOP_*). `drift`: the last third of the samples against the
    first (harness.measure.stats.drift; None under DRIFT_MIN_SAMPLES samples).

    `clock_resolution_s`: the clock's tick as far as it is known (`tick_bound`); `too_short`: the
    shortest sample lasts under MIN_SAMPLE_TICKS of those ticks.

    `launch_leaked`: samples whose interval may hold host time, because the host took longer to
    reach the timed call than the GPU spin queued before it lasted (device clocks only; None for
    clocks that cannot tell). `contended`: the process' threads waited for a CPU for at least
    CONTENDED_RUN_WAIT of the timed phase's wall time (or, where the kernel does not report run-queue
    waits, were preempted at least CONTENDED_SWITCH_RATE times a second); None when nothing could be
    read. The evidence: `run_queue_wait_ratio` (thread-seconds spent runnable but not running, per
    wall second), `involuntary_switches` (preemptions during the timed phase) and `cpu_wall_ratio`
    (process CPU time over wall time × intra-op threads).
    """

    stats: Stats
    plan: Plan
    clock_resolution_s: float
    too_short: bool = False
    launch_leaked: int | None = None
    contended: bool | None = None
    run_queue_wait_ratio: float | None = None
    involuntary_switches: int | None = None
    cpu_wall_ratio: float | None = None
    #: Host wall seconds of the timed rounds (the loop, between-sample setup included): what the budget paid for samples.
    loop_s: float | None = None
    stopped_by: str = STOP_BUDGET
    drift: Drift | None = None


def clock_resolution(clock: Clock, trials: int = 20) -> float:
    """The clock's tick: its declared `resolution_s` if it has one, else the smallest non-zero difference between successive readings.

    A clock that cannot be read back to back without work in between (the CUDA event clock queues a
    GPU spin per reading, so its successive readings differ by the spin, not by a tick) declares its
    tick instead. 0 for a clock that never moves.
    """
    declared = getattr(clock, "resolution_s", None)
    if declared is not None:
        return float(declared)
    deltas = []
    for _ in range(trials):
        a = clock()
        b = clock()
        while b == a and len(deltas) < trials * 100:
            b = clock()
            deltas.append(0.0)
        if b > a:
            deltas.append(b - a)
    positive = [d for d in deltas if d > 0]
    return min(positive) if positive else 0.0


#: Sample steps below this are float rounding (event times arrive as float32 milliseconds), not a clock tick.
GRID_FLOOR_S = 1e-9


def sample_grid(samples: Sequence[float], iterations: int = 1) -> float | None:
    """The smallest step between distinct sample readings (per-call samples × `iterations`): a bound on the clock's tick.

    A clock that counts ticks of q seconds gives readings that differ by whole ticks, so no step is
    shorter than q: the H200's event samples lie on a 32 ns grid, well under the 0.5 µs CUDA
    documents. None with fewer than two distinct readings.
    """
    ticks = np.unique(np.round(np.asarray(samples, dtype=float) * iterations / GRID_FLOOR_S))
    steps = np.diff(ticks)
    return float(steps.min()) * GRID_FLOOR_S if steps.size else None


def tick_bound(resolution: float, samples: Sequence[float], iterations: int = 1) -> float:
    """The clock's tick as far as it is known: the smaller of its resolution and the samples' own grid (both bound it from above)."""
    grid = sample_grid(samples, iterations)
    return resolution if grid is None or resolution <= 0 else min(resolution, grid)


def too_short(samples: Sequence[float], iterations: int, tick: float) -> bool:
    """Whether the shortest sample lasts under MIN_SAMPLE_TICKS ticks, so quantisation alone may move it by more than 1 %."""
    return tick > 0 and bool(samples) and min(samples) * iterations < MIN_SAMPLE_TICKS * tick


def keep_last(fn: Callable[[], object]) -> tuple[Callable[[], None], list]:
    """`fn` as a call that keeps only its latest result, in the returned one-element list.

    The previous result is released before each call, so no call runs beside its predecessor's
    output (a sample's peak memory is one call's), and the last timed call's output is there to be
    checked afterwards: the harness needs no extra call for it.
    """
    held: list = [None]

    def call() -> None:
        held[0] = None
        held[0] = fn()

    return call, held


def direct_loop(clock: Clock) -> Loop:
    """A plain timing loop over `clock`: setup (untimed), then `iterations` calls between two readings."""

    def loop(fn: Callable[[], object], *, setup: Callable[[], object] | None, rounds: int, iterations: int) -> list[float]:
        samples = []
        for _ in range(rounds):
            if setup is not None:
                setup()
            start = clock()
            for _ in range(iterations):
                fn()
            samples.append((clock() - start) / iterations)
        return samples

    return loop


#: A first call that costs this many times the pair's whole budget (warm-up and samples) is the row's one sample
#: when the budget takes one at the fewest: on an AVX2 CPU a bf16 naive call lasts 0.1-2 s against quick's 0.06 s,
#: and a warm-up call before it would double what those rows cost. A call only cold (a lazy initialisation, a
#: preemption) rarely costs five times a budget that a warm call fits in: at twice, a contended quick run took a
#: 5 ms sdpa-math call's 120 ms first call as its row; quiet, first calls of 0.1 s and more were 0.92-1.33x the
#: next. The row says `first_call` either way.
FIRST_CALL_ONLY_FACTOR = 5.0


def plan(fn: Callable[[], object], clock: Clock, budget: Budget, setup: Callable[[], object] | None = None,
         wall: Clock = time.perf_counter, confirm_dear: bool = False, sample_first_dear: bool = False) -> Plan:
    """Warm up by time, size samples from the fastest warm-up call, and rounds from the budget.

    Rounds are what `measure_s` of wall time holds, a round costing its calls plus what the warm-up
    paid around each call (setup and clock readings, read on `wall`); never more than `max_rounds`,
    never fewer than `min_rounds` unless one round costs more than `measure_s` and `fewest_rounds` is set.
    `confirm_dear`: a first call dearer than that is called once more before the rounds are cut (a
    fixed-rounds loop cannot learn later that the first call was only cold). `sample_first_dear`: a first
    call FIRST_CALL_ONLY_FACTOR times dearer than the whole budget, with `fewest_rounds` 1, is the one sample.
    """
    durations: list[float] = []
    walls: list[float] = []
    began = clock()
    while True:
        around = wall()
        if setup is not None:
            setup()
        start = clock()
        fn()
        end = clock()
        walls.append(wall() - around)
        durations.append(end - start)
        if (sample_first_dear and budget.fewest_rounds == 1 and len(durations) == 1
                and walls[0] >= FIRST_CALL_ONLY_FACTOR * (budget.warmup_s + budget.measure_s)):
            return Plan(iterations=1, rounds=0, warmup_calls=0, warmup_s=0.0, call_s=durations[0], stop=STOP_FIRST_CALL,
                        first_call_s=durations[0])
        unconfirmed = confirm_dear and budget.fewest_rounds is not None and len(durations) == 1 and walls[0] > budget.measure_s
        if end - began >= budget.warmup_s and not unconfirmed:
            break
    warmup_s = clock() - began
    call_s = max(min(durations), 1e-9)
    if setup is not None:
        iterations = 1  # a setup (the L2 flush) must precede every call
    else:
        # The relative slack keeps float error (1e-3 / 9.999e-5) from adding an iteration.
        iterations = min(budget.max_iterations, max(1, math.ceil(budget.min_sample_s / call_s * (1 - 1e-9))))
    round_s = max(call_s * iterations, float(np.median(walls[len(walls) // 2:])) + (iterations - 1) * call_s)
    affordable = round(budget.measure_s / round_s)
    rounds, stop = min(affordable, budget.max_rounds), STOP_BUDGET if affordable <= budget.max_rounds else STOP_MAX_ROUNDS
    if rounds < budget.min_rounds:
        if budget.fewest_rounds is None or round_s <= budget.measure_s:
            rounds, stop = budget.min_rounds, STOP_MIN_ROUNDS
        else:
            rounds, stop = min(budget.min_rounds, budget.fewest_rounds), STOP_CALL_EXCEEDS_BUDGET
    return Plan(iterations=iterations, rounds=rounds, warmup_calls=len(durations), warmup_s=warmup_s, call_s=call_s, stop=stop)


def leaked_samples(leaked_readings: Sequence[int], first: int, last: int, rounds: int) -> int:
    """Samples among readings `first`+1 … `last` whose interval may hold launch time.

    With two readings per round (the Loop contract) only the intervals that end a round are samples;
    otherwise every flagged interval is counted (an upper bound).
    """
    flagged = [r - first for r in leaked_readings if first < r <= last]
    if last - first == 2 * rounds:
        return sum(1 for k in flagged if k % 2 == 0)
    return len(flagged)


def measure(
    fn: Callable[[], object],
    clock: Clock = time.perf_counter,
    budget: Budget = Budget(),
    *,
    setup: Callable[[], object] | None = None,
    loop: Loop | None = None,
    probe: CpuProbe | None = None,
    around: Callable[[Loop], Loop] | None = None,
    wall: Clock = time.perf_counter,
) -> Measurement:
    """Warm up, calibrate and time `fn`.

    Without `loop`, the harness's own `StoppingLoop` takes the samples; with one (pytest-benchmark's
    pedantic), it runs the plan's fixed rounds. `around` wraps whichever loop runs (the GPU-state
    sampler), `probe` reads this process's counters, `wall` is the host clock the budget is spent on.
    """
    probe = probe or CpuProbe()
    resolution = clock_resolution(clock)
    cpu_start = probe.read()
    p = plan(fn, clock, budget, setup, wall=wall, confirm_dear=loop is not None, sample_first_dear=loop is None)
    if p.first_call_s is not None:  # the first call was the one sample: no loop runs
        cpu_after = probe.read()
        samples = [p.first_call_s]
        stats, tick = Stats.from_samples(samples, 1), tick_bound(resolution, samples, 1)
        return Measurement(stats=stats, plan=p, clock_resolution_s=tick, too_short=too_short(samples, 1, tick), launch_leaked=None,
                           loop_s=cpu_after.wall_s - cpu_start.wall_s, stopped_by=STOP_FIRST_CALL, drift=drift(samples),
                           **contention(cpu_start, cpu_after, probe.threads()))
    own = None if loop is not None else StoppingLoop(direct_loop(clock), budget, min(p.rounds, budget.min_rounds), wall)
    rounds = p.rounds if own is None else budget.max_rounds
    runner = loop or own
    if around is not None:
        runner = around(runner)  # type: ignore[arg-type]
    # Counters are read around the timed phase only: per sample, reading /proc would cost more than a short call.
    readings_before = getattr(clock, "readings", None)
    cpu_before = probe.read()
    samples = runner(fn, setup=setup, rounds=rounds, iterations=p.iterations)  # type: ignore[misc]
    cpu_after = probe.read()
    loop_s = cpu_after.wall_s - cpu_before.wall_s
    leaked = None
    if readings_before is not None:
        leaked = leaked_samples(clock.leaked, readings_before, clock.readings, len(samples))  # type: ignore[attr-defined]
    stats = Stats.from_samples(samples, p.iterations)
    tick = tick_bound(resolution, samples, p.iterations)
    stopped_by = own.stopped_by if own is not None and own.stopped_by else p.stop
    return Measurement(stats=stats, plan=p, clock_resolution_s=tick, too_short=too_short(samples, p.iterations, tick), launch_leaked=leaked,
                       loop_s=loop_s, stopped_by=stopped_by, drift=drift(samples), **contention(cpu_before, cpu_after, probe.threads()))
