"""The kernel-proof phase: for a backend that claims a kernel for its case, one untimed profiled call shows what ran.

Runs after the check (never inside a timed sample), on the pair's plain step: with `--timer graph` the replay is
not profiled, since a graph launch shows no host operators and so no operand dtypes. The claim is the backend's
(harness.backends.kernel_claims), the trace harness.profiling.kernel_trace's. The row gets `kernels` (the distinct
names, the claimed ones first, then by time, capped) and, where the trace does not meet the claim, the reason, which
makes the row `kernel_mismatch`: an untrusted flag (harness.results.vocabulary), since a row that claims FP8 and ran
a bf16 GEMM measured another path, so its latency must not rank as that kernel's. A profiler that fails costs the
proof, not the row: it is noted as `kernel_proof_failed`, as the profile phase notes its own failure.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from harness.backends.base import Backend
from harness.backends.kernel_claims import claimed_kernels, matches, mismatch
from harness.errors import described, is_sticky_cuda_error
from harness.execution.outcome import PairOutcome
from harness.profiling.kernel_trace import trace_kernels
from harness.suite.cases import Case

#: The most distinct names the `kernels` column lists, and the most characters of each (CUDA template names run long).
MAX_KERNELS = 20
MAX_NAME_CHARS = 160


def prove_kernels(case: Case, backend: Backend, step: Callable[[], Any], outcome: PairOutcome, planned: Sequence[str] = ()) -> None:
    """Profile one call of `step` and record in `outcome` what ran and whether it meets the backend's claim (if it claims one).

    `planned`: what the library recorded it planned (Prepared.planned_kernels), searched beside the trace's names: a kernel
    whose traced name holds no dtype (FlashInfer's CUDA-core decode) is proved FP8 by the module its plan built."""
    claim = claimed_kernels(backend, case)
    if claim is None:
        return
    try:
        trace = trace_kernels(step, case.device)
    except Exception as exc:  # noqa: BLE001 - the proof is diagnosis; the measured row stands without it
        if is_sticky_cuda_error(exc):
            raise
        outcome.notes = {**outcome.notes, "kernel_proof_failed": described(exc)}
        return

    def claimed(name: str) -> bool:
        return matches(name, claim.substrings)

    outcome.kernels = kernels_column([*planned, *trace.shown], claimed)
    outcome.kernel_mismatch = mismatch(claim, trace.shown, [*trace.searched, *planned], trace.wide_gemms(claimed))
    if claim.no_wide_gemms and not trace.dtypes_known:
        outcome.notes = {**outcome.notes,
                         "kernel_proof_dtypes": "the profiler gave no operand dtypes: a bf16 GEMM fallback could not be told"}


def kernels_column(names: Sequence[str], claimed: Callable[[str], bool]) -> str:
    """The `kernels` column: distinct names, the claimed ones first, then by time, ';'-joined, at most MAX_KERNELS, each cut short."""
    ordered = [n for n in names if claimed(n)] + [n for n in names if not claimed(n)]
    shown = [n if len(n) <= MAX_NAME_CHARS else n[:MAX_NAME_CHARS - 1] + "…" for n in ordered[:MAX_KERNELS]]
    if len(ordered) > MAX_KERNELS:
        shown.append(f"+{len(ordered) - MAX_KERNELS} more")
    return ";".join(shown)
