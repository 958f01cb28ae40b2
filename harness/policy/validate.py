"""The policy checks itself: on another run of the same device, was its choice the fastest trusted row, or within the rule's noise of it?

A case is judged when the other run has a trusted row for it (harness.analysis.frame.agreeing_rows) and the policy has an
answer for its bucket (through the copyable reader, as a framework would ask it). It is a hit when the chosen backend's row
is the fastest trusted one, or does not differ from the fastest by compare's rule (harness.analysis.difference). Where
either row has no 95 % interval of its median the rule cannot call them equal: such a case is a miss, named with
"noise unknown", never a hit by assumption. Not judged, and counted apart: cases the policy has no answer for, and cases
where the chosen backend's row was flagged (contended, suspect, throttled, kernel_mismatch) and so measures nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from harness.analysis.difference import interval_of, order
from harness.analysis.frame import agreeing_rows, is_core
from harness.errors import UserError
from harness.policy import reader
from harness.policy.build import build_policy, shape_of
from harness.policy.sources import LoadedRun


@dataclass
class Validation:
    """What a policy chose on each case of a run it was not built from, counted and named."""

    #: (run validated on, what it was validated against), e.g. ('run-b', 'policy of run-a').
    folds: list[tuple[str, str]] = field(default_factory=list)
    exact: int = 0
    within_noise: int = 0
    #: "case: chose X (a ms), fastest Y (b ms), 1.23×; why" per miss.
    misses: list[str] = field(default_factory=list)
    no_answer: list[str] = field(default_factory=list)
    not_judged: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def judged(self) -> int:
        """Cases with an answer and a trusted row to judge it by."""
        return self.exact + self.within_noise + len(self.misses)

    @property
    def share(self) -> float | None:
        """Hits over judged cases (None when none was judged)."""
        return (self.exact + self.within_noise) / self.judged if self.judged else None

    def lines(self, misses_shown: int = 20) -> list[str]:
        """The validation's text: the share, how it was measured, and the misses named."""
        folds = "; ".join(f"{run} against {against}" for run, against in self.folds)
        if not self.judged:
            head = f"validation ({folds}): no case could be judged"
        else:
            head = (f"validation ({folds}): the policy chose the fastest trusted row or one within the rule's noise of it in "
                    f"{self.exact + self.within_noise} of {self.judged} judged cases ({100 * self.share:.1f} %): "
                    f"{self.exact} the fastest, {self.within_noise} within noise, {_count(len(self.misses), 'miss', 'misses')}")
        out = [head]
        if self.no_answer:
            out.append(f"{_count(len(self.no_answer), 'case', 'cases')} not judged: the policy has no evidence for their bucket "
                       f"({', '.join(self.no_answer[:5])}{', …' if len(self.no_answer) > 5 else ''})")
        if self.not_judged:
            out.append(f"{_count(len(self.not_judged), 'case', 'cases')} not judged: {'; '.join(self.not_judged[:5])}{'; …' if len(self.not_judged) > 5 else ''}")
        out.extend(self.notes)
        for miss in self.misses[:misses_shown]:
            out.append(f"  miss: {miss}")
        if len(self.misses) > misses_shown:
            out.append(f"  … and {len(self.misses) - misses_shown} more misses")
        return out

    def to_dict(self) -> dict:
        """The JSON form."""
        return {"folds": [list(f) for f in self.folds], "judged": self.judged, "hits": self.exact + self.within_noise, "exact": self.exact,
                "within_noise": self.within_noise, "share": self.share, "misses": self.misses, "no_answer": self.no_answer,
                "not_judged": self.not_judged, "notes": self.notes}


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def check_same_device(policy: dict, run: LoadedRun) -> None:
    """Refuse (UserError) a run of a device the policy holds nothing for."""
    held = sorted(policy["devices"])
    for device in run.devices:
        if device not in policy["devices"]:
            raise UserError(f"--validate {run.run_id} ran on {device!r} but the policy holds {', '.join(map(repr, held)) or 'no device'}: "
                            "validate on a run of the same device")


def judge(policy: dict, run: LoadedRun, into: Validation, cv: float = 0.0) -> Validation:
    """Judge `policy`'s choice on every attention-core case of `run`, adding to `into`."""
    frame = run.frame[is_core(run.frame)]
    for (case, device), sub in frame.groupby(["case_id", "device_model"], sort=True):
        trusted = agreeing_rows(sub)
        if trusted.empty:
            into.not_judged.append(f"{case}: no trusted row in {run.run_id}")
            continue
        choice = reader.choose(policy, device=str(device), **shape_of(sub.iloc[0]))
        if choice is None:
            into.no_answer.append(str(case))
            continue
        fastest = trusted.sort_values("latency_ms_median", kind="stable").iloc[0]
        if fastest["backend"] == choice:
            into.exact += 1
            continue
        chosen = trusted[trusted["backend"] == choice]
        if chosen.empty:
            flagged = agreeing_rows(sub, flagged=True)
            if (flagged["backend"] == choice).any():
                into.not_judged.append(f"{case}: the chosen {choice}'s row in {run.run_id} is flagged")
            else:
                statuses = sub.loc[sub["backend"] == choice, "status"]
                why = f"{choice} {statuses.iloc[0]} here" if len(statuses) else f"{choice} not measured here"
                into.misses.append(f"{case}: chose {choice}, which has no trusted, agreeing row ({why}); fastest {fastest['backend']} "
                                   f"({float(fastest['latency_ms_median']):.4g} ms)")
            continue
        row = chosen.iloc[0]
        ratio = float(row["latency_ms_median"]) / float(fastest["latency_ms_median"])
        said = (f"{case}: chose {choice} ({float(row['latency_ms_median']):.4g} ms), fastest {fastest['backend']} "
                f"({float(fastest['latency_ms_median']):.4g} ms), {ratio:.3f}×")
        if interval_of(row) is None or interval_of(fastest) is None:
            into.misses.append(f"{said}; noise unknown (a row without a 95 % interval)")
        elif order(row, fastest, cv) == 0:
            into.within_noise += 1
        else:
            into.misses.append(f"{said}; slower by the rule")
    return into


def validate(policy: dict, run: LoadedRun, against: str, cv: float = 0.0) -> Validation:
    """The share of `run`'s cases the policy chose well, `run` being of a device the policy holds."""
    check_same_device(policy, run)
    return judge(policy, run, Validation(folds=[(run.run_id, against)]), cv)


def leave_one_run_out(runs: Sequence[LoadedRun], *, interpolate: bool = False, cv: float = 0.0) -> Validation:
    """Each run judged by the policy built from the others (runs of a device no other run measured are named, not judged)."""
    if len(runs) < 2:
        raise UserError("--validate without RUN_B leaves one run out at a time: give two runs or more (or name the run to validate on)")
    out = Validation()
    for i, held_out in enumerate(runs):
        others = [run for j, run in enumerate(runs) if j != i]
        policy = build_policy(others, interpolate=interpolate, cv=cv)
        missing = [d for d in held_out.devices if d not in policy["devices"]]
        if missing:
            out.notes.append(f"{held_out.run_id} not judged: no other run measured {', '.join(missing)}")
            continue
        out.folds.append((held_out.run_id, "the policy of " + ", ".join(run.run_id for run in others)))
        judge(policy, held_out, out, cv)
    return out
