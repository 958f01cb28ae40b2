"""One untimed call under torch.profiler, read for which kernels ran and on what operand dtypes its GEMMs ran.

What a kernel claim is checked against (harness.backends.kernel_claims): the names of what ran (CUDA kernels,
memcpys and memsets on CUDA; host operators on the CPU), by the time each took, and every host GEMM operator that
did a GEMM's work (the innermost of `aten::matmul` → `aten::bmm`) with its tensor operands' dtypes and the
operators it ran inside. The dtypes come from `record_shapes=True`: torch 2.13's `FunctionEvent.input_dtypes`
("c10::BFloat16", "float", "c10::Float8_e4m3fn"), and on a torch whose FunctionEvent lacks it (2.11) the raw Kineto
events' `dtypes()`, matched by name and start time. Host operators are recorded on CUDA too, so the same reading
finds a bf16 `aten::bmm` that launched a cuBLAS kernel, whatever that kernel is named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from harness.profiling.categories import categorize
from harness.profiling.kineto_log import quiet_kineto
from harness.profiling.profiler_events import DEVICE_WORK, HOST_OPERATOR, event_kind

#: The profiler's names of operand dtypes, in the harness's words; FP8 ones keep torch's name (float8_e4m3fn).
_DTYPE_WORDS = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "double": "fp64"}
#: Operand dtypes whose GEMM is no FP8 GEMM: what a dequantize-first fallback multiplies in.
WIDE_DTYPES = frozenset(("bf16", "fp16", "fp32", "fp64"))


@dataclass(frozen=True)
class TracedGemm:
    """One host GEMM operator that did the work (no GEMM ran below it): its name, tensor operand dtypes, and the operators above it."""

    name: str
    dtypes: tuple[str, ...]
    ancestors: tuple[str, ...]

    @property
    def label(self) -> str:
        """`aten::bmm(bf16)`: the name and its operands' distinct dtypes ('?' where the profiler gave none)."""
        return f"{self.name}({'/'.join(dict.fromkeys(self.dtypes)) or '?'})"


@dataclass(frozen=True)
class KernelTrace:
    """What one profiled call ran: names by time, every host operator's name, and its GEMMs with their dtypes."""

    device: str
    #: Distinct names by summed time, longest first: CUDA kernels (and copies) on CUDA, host operators on the CPU.
    shown: tuple[str, ...]
    #: Distinct host operator names, in order of first appearance (on CUDA what launched the kernels).
    operators: tuple[str, ...]
    gemms: tuple[TracedGemm, ...]
    #: False when GEMMs ran but the profiler gave none of their operand dtypes (then none can be called wide).
    dtypes_known: bool

    @property
    def searched(self) -> tuple[str, ...]:
        """Every name a claim may match: the shown names, then the host operators not among them."""
        return self.shown + tuple(n for n in self.operators if n not in set(self.shown))

    def wide_gemms(self, claimed: Callable[[str], bool]) -> tuple[str, ...]:
        """Labels of the GEMMs on wide operands (bf16, fp16, fp32) that ran inside no operator `claimed` accepts."""
        out = [g.label for g in self.gemms
               if any(d in WIDE_DTYPES for d in g.dtypes) and not any(claimed(a) for a in g.ancestors) and not claimed(g.name)]
        return tuple(dict.fromkeys(out))


def trace_kernels(step: Callable[[], object], device: str) -> KernelTrace:
    """Run `step` once under torch.profiler (operand shapes and dtypes recorded) and read what ran."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = str(device).startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    sync()  # earlier calls' kernels end before the profiler starts: what it sees is this call's
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with quiet_kineto(), profile(activities=activities, record_shapes=True) as prof:
        step()  # the result is dropped at once
        sync()
    return read_trace(prof, device)


def read_trace(prof: Any, device: str) -> KernelTrace:
    """The KernelTrace of a finished `torch.profiler.profile` (reads `prof.events()`, and the raw events for dtypes where needed)."""
    cuda = str(device).startswith("cuda")
    events = list(prof.events())
    kinds = [event_kind(e) for e in events]
    ops = [e for e, kind in zip(events, kinds) if kind == HOST_OPERATOR]
    if cuda:
        work = [(e.name, e.time_range.end - e.time_range.start) for e, kind in zip(events, kinds) if kind == DEVICE_WORK]
    else:
        work = [(e.name, e.self_cpu_time_total) for e in ops]
    seconds: dict[str, float] = {}
    for name, t in work:
        seconds[name] = seconds.get(name, 0.0) + t
    shown = tuple(sorted(seconds, key=lambda n: (-seconds[n], n)))
    raw = None if ops and getattr(ops[0], "input_dtypes", None) is not None else _raw_dtypes(prof)
    gemms = []
    for e in ops:
        if categorize(e.name) != "matmul" or any(categorize(c.name) == "matmul" for c in _below(e)):
            continue  # a GEMM that called another GEMM only dispatched: the one below did the work
        given = getattr(e, "input_dtypes", None)
        if given is None and raw is not None:
            given = raw.get((e.name, round(e.time_range.start, 3)))
        gemms.append(TracedGemm(e.name, tuple(_DTYPE_WORDS.get(d, d.removeprefix("c10::").lower()) for d in given or () if _is_tensor(d)),
                                tuple(_above(e))))
    known = not gemms or any(g.dtypes for g in gemms)
    return KernelTrace(str(device), shown, tuple(dict.fromkeys(e.name for e in ops)), tuple(gemms), known)


def _is_tensor(dtype: str) -> bool:
    """Whether an `input_dtypes` entry is a tensor's dtype (not 'Scalar', 'ScalarList', 'TensorList' or '' for a None)."""
    return bool(dtype) and dtype not in ("Scalar", "ScalarList", "TensorList", "GenericList")


def _below(e: Any) -> list[Any]:
    """Every operator under `e` (its children, theirs, …)."""
    out, todo = [], list(getattr(e, "cpu_children", None) or ())
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(getattr(child, "cpu_children", None) or ())
    return out


def _above(e: Any) -> list[str]:
    """The names of the operators `e` ran inside, innermost first."""
    out, parent = [], getattr(e, "cpu_parent", None)
    while parent is not None:
        out.append(parent.name)
        parent = getattr(parent, "cpu_parent", None)
    return out


def _raw_dtypes(prof: Any) -> dict[tuple[str, float], list[str]] | None:
    """Operand dtypes of each host event by (name, start µs), from the raw Kineto events; None where this torch exposes none."""
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if results is None:
        return None
    origin = results.trace_start_ns()
    try:
        return {(r.name(), round((r.start_ns() - origin) / 1e3, 3)): list(r.dtypes()) for r in results.events()}
    except (AttributeError, TypeError):  # a Kineto event without dtypes(): no dtypes, not a failed proof
        return None
