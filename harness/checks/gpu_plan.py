"""gpu-check's schedule: which backend's child runs when, for how long, and which cannot be given enough time.

A pure function of the backends, their estimated seconds and the total budget, so the schedule is
tested with the H200's real numbers (`gpu-check-run1.txt`: flex reached last with 82 s left, too
little for 8 cases that each compile). Each backend is promised its estimate: a child may use the
time earlier children left unused, never the estimates of the backends still to run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from harness.suite.cases import Case

#: Families whose cases compile first (torch.compile, FlexAttention): seconds a case, not milliseconds.
COMPILING_FAMILIES = ("flex", "compiled")
#: The longest one child may run, whatever is left.
CHILD_TIMEOUT_S = 180.0
#: A child is not started with less than this (python, torch and CUDA start-up take about 6 s).
MIN_CHILD_S = 10.0

# The cost model, from the H200 (2026-11-29). run1: a child whose 8 cases were all unsupported took
# 6–7 s; naive ran its 8 in 14 s. probe2: flex compiled a forward case in 3.5 s, a backward one in
# 4.4 s, the first case of a process in 10.2 s (3.5 s of compiling, the rest inductor's start-up).
# naive-compiled's 8 cases took 45 s, one compile each (6 + 8 + 6.5 + 29.8 = 50 s estimated), while
# flex's 8 outran 82 s, which only two compiles a case account for (80 s estimated).
CHILD_START_S = 6.0
CASE_S = 1.0
COMPILE_S = {"fwd": 3.5, "bwd": 4.4, "fwd_bwd": 4.4}
FIRST_COMPILE_S = 6.5
COMPILES_PER_CASE = {"flex": 2, "compiled": 1}


def compiles(family: str) -> bool:
    """Whether a backend of `family` compiles each case (and so runs the shorter case list)."""
    return family in COMPILING_FAMILIES


def estimate_s(family: str, cases: Sequence[Case]) -> float:
    """Seconds a child of `family` needs for `cases`: start-up, a second a case, and the compiles of a compiling family."""
    seconds = CHILD_START_S + CASE_S * len(cases)
    if compiles(family) and cases:
        seconds += FIRST_COMPILE_S + COMPILES_PER_CASE.get(family, 1) * sum(COMPILE_S[c.mode] for c in cases)
    return seconds


@dataclass(frozen=True)
class Slot:
    """One backend's place in the schedule and the seconds promised to it."""

    name: str
    reserve_s: float


@dataclass(frozen=True)
class Schedule:
    """Children in the order they run, and the backends left out with why."""

    slots: tuple[Slot, ...]
    skipped: tuple[tuple[str, str], ...]
    total_s: float

    def timeout_s(self, index: int, elapsed_s: float) -> float:
        """Seconds slot `index`'s child may run when started `elapsed_s` in: what is left less the later slots' reserves."""
        later = sum(slot.reserve_s for slot in self.slots[index + 1:])
        return min(CHILD_TIMEOUT_S, self.total_s - elapsed_s - later)


def plan_schedule(backends: Sequence[tuple[str, str, float]], total_s: float) -> Schedule:
    """(name, family, estimated seconds) → the schedule: compiling backends first, every backend its estimate.

    Compiling backends go first because their cost is seconds a case and least certain: they get
    the slack of a budget not yet spent, and the fast backends after them are bounded by what is
    left. When the estimates do not fit, the largest are left out (the most backends get a
    verdict), each with a reason that says what it needed and how to check it alone.
    """
    ordered = sorted(backends, key=lambda b: not compiles(b[1]))  # stable: registry order within each group
    kept = list(ordered)
    skipped: list[tuple[str, str]] = []
    while kept and sum(max(b[2], MIN_CHILD_S) for b in kept) > total_s:
        largest = max(kept, key=lambda b: b[2])
        kept.remove(largest)
        others = sum(max(b[2], MIN_CHILD_S) for b in kept)
        skipped.append((largest[0], f"not run: needs ~{largest[2]:.0f} s, the others hold {others:.0f} of the {total_s:.0f} s budget; "
                                    f"check it alone with --backends {largest[0]}"))
    slots = tuple(Slot(name, max(seconds, MIN_CHILD_S)) for name, _, seconds in kept)
    return Schedule(slots, tuple(skipped), total_s)
