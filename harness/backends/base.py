"""The one interface every attention backend implements."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch

from harness.backends.capabilities import CAPABILITIES, CAPABILITY_DEFAULTS  # noqa: F401 - CAPABILITIES: its old home
from harness.backends.features import feature_refusals, joined

from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


@dataclass
class Prepared:
    """What a backend hands the harness after its untimed preparation.

    `fn` is the zero-argument callable that is timed; it returns the output in the backend's
    own layout. `to_bhsd` turns that output (or a gradient of a leaf) back into `[B, H, S, d]`
    for checking, outside the timed region; `from_bhsd` is its inverse (for the upstream gradient
    of backward modes). `leaves` are the tensors, in the backend's layout,
    that backward modes differentiate with respect to (q, k, v). `notes` go into the record
    (for example `kv_expanded` or the operator a library dispatched to).

    For a ragged case (layout padded, packed or paged) `prepare` gets a `harness.suite.ragged.RaggedInputs`
    and `to_bhsd` (the name kept for compatibility) must return the packed `[T_q, H, d_v]` output of
    RaggedInputs' layout instead: a padded backend drops its padded rows there, outside the timed call.
    `plan_s`: seconds of untimed per-batch set-up the adapter measured around it (FlashInfer's plan(),
    a BlockMask, scheduler metadata), a server's cost once per step: the row's `plan_ms`.
    """

    fn: Callable[[], torch.Tensor]
    leaves: tuple[torch.Tensor, ...] = ()
    to_bhsd: Callable[[torch.Tensor], torch.Tensor] = _identity
    from_bhsd: Callable[[torch.Tensor], torch.Tensor] = _identity
    notes: dict[str, Any] = field(default_factory=dict)
    #: Seconds `prepare` spent compiling (torch.compile's first calls): recorded in its own column, never in latency.
    compile_s: float | None = None
    #: For a backend whose result is not the core's `[B, H, S_q, d_v]` output (the whole layer, with its
    #: projections): its own agreement check of one step's result (the output, or the leaves' gradients),
    #: returning a `harness.attention.numerics.Agreement`. None: the runner compares with the attention reference.
    check: Callable[[Any], Any] | None = None
    plan_s: float | None = None
    #: A ragged batch's backward: the leaves' gradients (in the backend's layout) as the packed dQ `[T_q, H, d_k]`, dK
    #: `[T_kv, H_kv, d_k]` and dV `[T_kv, H_kv, d_v]` the check compares, outside the timed call. None: they are packed already.
    grads_to_packed: Callable[[Any], list[torch.Tensor]] | None = None
    #: A padded batch's backward: the largest |value| its gradients hold in the padding rows (which no reference judges), or None.
    padding_gradients: Callable[[Any], float] | None = None
    #: What the library says it planned for this call, read from it after its plan (FlashInfer's decode module, built for
    #: kv_data_type): searched by the kernel proof beside the trace, for a kernel whose traced name carries no dtype.
    planned_kernels: tuple[str, ...] = ()


class NotPrepared(TypeError):
    """A backend's `prepare` returned neither a Prepared nor a zero-argument callable: an error row naming the backend and the type."""


def as_prepared(backend: "Backend", case: Case, inputs: AttentionInputs, returned: Any) -> Prepared:
    """What `prepare` returned, as a Prepared: a plain zero-argument callable is wrapped; anything else is NotPrepared.

    A plain callable's output must be in the case's `[B, H, S_q, d_v]` layout (a ragged batch's packed `[T_q, H, d_v]`):
    it has no `to_bhsd`. In backward modes its leaves are the inputs' q, k, v, which the harness made require grad.
    """
    fn = returned.fn if isinstance(returned, Prepared) else returned
    what = f"a value of type {type(fn).__name__} ({' '.join(repr(fn).split())[:60]})"
    if fn is not returned:
        what = f"a Prepared whose fn is {what}"
    if not callable(fn):
        raise NotPrepared(f"{backend.name}: prepare() returned {what}, expected a zero-argument callable or a harness.backends.Prepared")
    try:
        inspect.signature(fn).bind()
    except TypeError:  # the timed call passes nothing: say so now rather than as a TypeError from inside the warm-up
        raise NotPrepared(f"{backend.name}: prepare() returned a callable that needs arguments {inspect.signature(fn)}; "
                          "the timed call takes none") from None
    except ValueError:  # no signature to read (some builtins): its first call will tell
        pass
    if isinstance(returned, Prepared):
        return returned
    return Prepared(fn=returned, leaves=(inputs.q, inputs.k, inputs.v) if case.mode != "fwd" else ())


def prepare_pair(backend: "Backend", case: Case, inputs: AttentionInputs) -> Prepared:
    """`backend.prepare(case, inputs)` as a Prepared (see `as_prepared`): the one way the harness calls prepare."""
    return as_prepared(backend, case, inputs, backend.prepare(case, inputs))


class Backend:
    """Base class: subclasses set `name` and `family`, declare what they serve, and override `prepare` (often `own_refusals`).

    `available()` says whether the backend can run at all on this machine (package installed,
    device present); `supports(case)` whether it can serve one case. Both return None for yes and
    a one-line reason for no: `supports` joins every reason, the declared features' (devices, dtypes, layouts,
    score_variants …: harness.backends.features) and the backend's `own_refusals`. Optional packages are imported
    inside these methods, never at import.
    """

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: Devices the backend has kernels for.
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    #: Whether H_kv < H is served without copying K/V to H heads.
    native_gqa: ClassVar[bool] = False
    #: Whether `prepare` accepts backward modes.
    supports_backward: ClassVar[bool] = True
    #: False for a backend that times part of the layer other than attention (the projections):
    #: there is no attention output to check, so the runner records `agree` None with a note,
    #: and takes the row's FLOPs and bytes from `costs` instead of the attention formulas.
    computes_attention: ClassVar[bool] = CAPABILITY_DEFAULTS["computes_attention"]
    #: False for a backend that times something other than the case's attention core (the whole
    #: layer, MLA's latent form, the projections): never ranked against the cores, never a crossover curve.
    attention_core: ClassVar[bool] = CAPABILITY_DEFAULTS["attention_core"]
    #: True when one call materialises the `[B, H, S_q, S_kv]` scores and weights (the memory model
    #: is then 2·B·H·S_q·S_kv elements instead of the output).
    materializes_scores: ClassVar[bool] = CAPABILITY_DEFAULTS["materializes_scores"]
    #: True for the backend that speed-ups are quoted against by default.
    baseline: ClassVar[bool] = CAPABILITY_DEFAULTS["baseline"]
    #: True when `weights(case, inputs)` returns (output, attention weights) for `attnbench check`.
    returns_weights: ClassVar[bool] = CAPABILITY_DEFAULTS["returns_weights"]
    # What the backend serves of each feature a case may ask for (harness.backends.features reads these declarations:
    # a case asking for anything else is refused in the feature's words, every such feature listed).
    #: Whether the backward, under torch's deterministic algorithms, is bitwise repeatable (harness.backends.determinism):
    #: a claim the executor measures on every deterministic case, never trusts.
    deterministic_backward: ClassVar[bool] = False
    #: The dtypes `prepare` computes in: FP8 ones only where the backend runs an FP8 kernel (harness.attention.fp8), never a
    #: dequantize-then-bf16 path called FP8. `kv_dtypes`: the FP8 KV-cache formats it reads beside fp16/bf16 queries.
    dtypes: ClassVar[frozenset[str]] = frozenset({"fp64", "fp32", "fp16", "bf16"})
    kv_dtypes: ClassVar[frozenset[str]] = frozenset()
    #: The batch layouts (harness.suite.ragged) `prepare` accepts: "dense" (today's rectangle), "padded"
    #: (a ragged batch padded to its longest sequence and masked), "packed" (tokens concatenated with
    #: cumulative offsets) and "paged" (the KV cache in scattered fixed-size pages behind a block table).
    layouts: ClassVar[frozenset[str]] = frozenset({"dense"})
    #: The score variants (harness.attention.variants: softcap, sinks, alibi, scale) `prepare` computes exactly;
    #: a case using any other is refused, never approximated.
    score_variants: ClassVar[frozenset[str]] = frozenset()
    #: The ragged layouts whose backward `prepare` differentiates (packed and padded training batches); a paged cache has none.
    ragged_backward: ClassVar[frozenset[str]] = frozenset()
    #: Why the backend lacks a feature, in a user's words, where it is the library's limit rather than the adapter's:
    #: keyed by feature ("softcap", "deterministic") or feature and value ("dtype:fp8_e4m3").
    feature_reasons: ClassVar[dict[str, str]] = {}

    def costs(self, case: Case) -> tuple[int, int] | None:
        """(FLOPs, bytes) of one call when they are not the attention's (theory.flops, min_bytes); None otherwise."""
        return None

    def version(self) -> str:
        """The version of what the backend wraps (torch's by default)."""
        return torch.__version__

    def available(self) -> str | None:
        """None if the backend can run here at all, else why not."""
        return None

    def supports(self, case: Case) -> str | None:
        """None if this backend can serve `case`, else every reason it cannot, in one line (`refusals`)."""
        return joined(self.refusals(case))

    def refusals(self, case: Case) -> list[str]:
        """Every reason this backend cannot serve `case`: each declared feature it lacks (backends/features.py), then its own limits."""
        return feature_refusals(self, case) + self.own_refusals(case)

    def own_refusals(self, case: Case) -> list[str]:
        """The library's or adapter's limits for `case` beyond the declared features (head dims, GPU, page size), each a reason."""
        return []

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared | Callable[[], torch.Tensor]:
        """Lay out inputs and build the callable to time (plain, or in a Prepared); raise Unsupported if the case turns out unservable."""
        raise NotImplementedError

    def weights(self, case: Case, inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """The output and the attention weights `[B, H, S_q, S_kv]` (only where `returns_weights`)."""
        raise NotImplementedError(f"{self.name} does not expose its attention weights")

    def capabilities(self) -> dict[str, bool]:
        """The declared capabilities, as stored in a run's manifest and read by the analysis."""
        return {name: bool(getattr(self, name)) for name in CAPABILITIES}

    def __repr__(self) -> str:
        return f"<backend {self.name} ({self.family})>"


def expand_kv(t: torch.Tensor, group_size: int) -> torch.Tensor:
    """Repeat each K/V head `group_size` times along dim 1 (`[B, H_kv, S, d]` → `[B, H, S, d]`).

    Query head h uses K/V head h // group_size: `repeat_interleave`, not `repeat`, which would
    pair heads in the wrong order.
    """
    return t if group_size == 1 else t.repeat_interleave(group_size, dim=1)
