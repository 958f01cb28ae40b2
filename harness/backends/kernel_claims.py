"""What a backend claims must show in the profiler's trace for a case, and whether a trace meets the claim.

A row labelled FP8 that silently ran in bf16, or dequantized its cache first and then ran a bf16 GEMM, measured
another path than its label (FlashInfer #1753 and #3484, SGLang #14816). FlashMLA's own benchmark proves which
kernel ran by matching kernel names in the trace (tests/kernelkit/bench.py); the harness does the same for every
backend that declares, as ClassVars read here with a default (base.py declares none):

    fp8_kernels: tuple[str, ...] = ()        substrings an FP8 case's trace must show (dtype or kv_dtype fp8_e4m3/fp8_e5m2)
    mla_kernels: tuple[str, ...] = ()        substrings an MLA case's trace must show (`case.mla`)
    forbidden_kernels: tuple[str, ...] = ()  substrings no claimed case's trace may show

Substrings are case-insensitive, and one of a group is enough (a library picks among several kernels). A backend
may instead define `kernel_claim(case) -> KernelClaim | None` itself. An FP8 claim also forbids a GEMM operator on
bf16, fp16 or fp32 operands that no claimed operator called (`wide_gemms`): the dequantize-then-GEMM fallback,
told by its operands' dtypes, which torch's profiler records with `record_shapes`. What a trace holds and where it
comes from is harness.profiling.kernel_trace's; the executor's phase is harness.execution.kernel_proof's. Where a
kernel's traced name carries no dtype (FlashInfer's CUDA-core decode), the adapter hands what the library recorded it
planned (Prepared.planned_kernels: the module built for kv_data_type), which the proof searches beside the trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from harness.suite.case_values import FP8_DTYPES

if TYPE_CHECKING:
    from harness.backends.base import Backend
    from harness.suite.cases import Case

#: How many names a mismatch line lists before "…".
SHOWN_NAMES = 6


@dataclass(frozen=True)
class KernelClaim:
    """What must show in a case's trace: per claim its word ("FP8", "MLA") and substrings, one of which some name must hold."""

    needs: tuple[tuple[str, tuple[str, ...]], ...]
    #: Substrings no traced name may hold.
    forbidden: tuple[str, ...] = ()
    #: An FP8 claim: a GEMM on bf16/fp16/fp32 operands outside every claimed operator is a fallback.
    no_wide_gemms: bool = False

    @property
    def substrings(self) -> tuple[str, ...]:
        """Every claimed substring, in the claims' order."""
        return tuple(s for _, group in self.needs for s in group)


def is_fp8_case(case: "Case") -> bool:
    """Whether the case hands its backend FP8 tensors: its dtype or its KV's (`kv_dtype`) is an FP8 format."""
    return case.dtype in FP8_DTYPES or getattr(case, "kv_dtype", None) in FP8_DTYPES


def claimed_kernels(backend: "Backend", case: "Case") -> KernelClaim | None:
    """The backend's claim for `case` (its own `kernel_claim`, else its fp8/mla ClassVars), or None when it claims nothing."""
    own = getattr(backend, "kernel_claim", None)
    if callable(own):
        return own(case)
    needs = []
    fp8 = tuple(getattr(backend, "fp8_kernels", ()) or ())
    if fp8 and is_fp8_case(case):
        needs.append(("FP8", fp8))
    mla = tuple(getattr(backend, "mla_kernels", ()) or ())
    if mla and getattr(case, "mla", False):
        needs.append(("MLA", mla))
    if not needs:
        return None
    return KernelClaim(tuple(needs), tuple(getattr(backend, "forbidden_kernels", ()) or ()), no_wide_gemms=bool(fp8) and is_fp8_case(case))


def matches(name: str, substrings: Sequence[str]) -> bool:
    """Whether `name` holds one of `substrings`, case-insensitive."""
    lowered = name.lower()
    return any(s.lower() in lowered for s in substrings)


def _listed(names: Sequence[str]) -> str:
    shown = list(names[:SHOWN_NAMES])
    return ", ".join(shown + (["…"] if len(names) > SHOWN_NAMES else [])) or "nothing"


def mismatch(claim: KernelClaim, shown: Sequence[str], searched: Sequence[str], wide_gemms: Sequence[str] = ()) -> str | None:
    """None when the trace meets `claim`, else one line saying what it lacks or what ran instead.

    `shown`: the names the row lists (CUDA kernels, or CPU operators), by time; `searched`: every name a claim may
    match (on CUDA the kernels and the host operators that launched them); `wide_gemms`: "aten::bmm(bf16)" for each
    GEMM on wide operands that no claimed operator called.
    """
    missing = [f"claims an {word} kernel ({', '.join(group)}) but the trace shows none: {_listed(shown)}"
               for word, group in claim.needs if not any(matches(name, group) for name in searched)]
    extra = []
    banned = [name for name in searched if claim.forbidden and matches(name, claim.forbidden)]
    if banned:
        extra.append(f"a forbidden kernel ran: {_listed(banned)}")
    if claim.no_wide_gemms and wide_gemms:
        dtypes = sorted({g.rpartition("(")[2].rstrip(")") for g in wide_gemms})
        extra.append(f"a {'/'.join(dtypes)} GEMM ran: {_listed(list(wide_gemms))}")
    if missing:
        return "; ".join(missing) + (" and " + "; ".join(extra) if extra else "")
    if not extra:
        return None
    return (f"claims {_claimed(claim)} but " if claim.needs else "") + "; ".join(extra)


def _claimed(claim: KernelClaim) -> str:
    return " and ".join(f"an {word} kernel ({', '.join(group)})" for word, group in claim.needs)
