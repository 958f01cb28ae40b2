"""The features a case may ask for and a backend may declare: one table, read by every refusal, the matrix and its docs.

Each `Feature` says how a case asks for it (`asked`: the value it wants, None when it uses none), what a backend
declares it serves (`declared`: the values, read from the backend's declaration), and the words of the refusal
(`words`, given the backend's own why from `Backend.feature_reasons`, keyed "dtype:fp8_e4m3" or "softcap", where
it has one). A backend refused by a case hears every feature it lacks, in the table's order, not only the first.
`example` gives the matrix the Case fields that ask for one value, so `attnbench backends --matrix` can ask each
backend about each feature without a GPU.

Adding a feature (a new score variant, say) is one entry here, its name in the declaration of each backend that
computes it (`score_variants` for a variant) and the arguments that hand it to each library: no list elsewhere.
A library's limits that are not a feature a case asks for (FlashAttention's head dims per GPU, FlashMLA's page size)
stay in the backend's `own_refusals`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping

from harness.suite.case_layout import LAYOUTS
from harness.suite.case_values import DEVICES, DTYPES, FP8_DTYPES

if TYPE_CHECKING:
    from harness.suite.cases import Case

#: A harness.backends.base.Backend: base imports this table, so it is not imported back, even for type checking.
Backend = Any

#: How a refusal names each layout: "naive does not take paged batches".
LAYOUT_WORDS = {"dense": "dense (rectangular) batches", "padded": "padded batches", "packed": "packed (varlen) batches",
                "paged": "paged batches (a KV cache in pages behind a block table)"}
#: Why a backend lacks a deterministic backward when it does not say.
NO_DETERMINISTIC_BACKWARD = "its adapter has no deterministic backward"
#: Why a backend lacks a score variant when it does not say.
VARIANT_NOT_PASSED = "its adapter does not pass it to the kernel"
#: A softcap, ALiBi and scale the matrix's examples ask for (any value serves: what is asked is whether it is computed).
EXAMPLE_SOFTCAP, EXAMPLE_SCALE = 30.0, 0.1


@dataclass(frozen=True)
class Feature:
    """One thing a case may ask of a backend: how a case asks, what a backend declares, and the words of a refusal."""

    #: The feature's name, and the key of a backend's own why in `Backend.feature_reasons` ("softcap", "dtype").
    name: str
    #: Its values as the matrix lists them (a dtype's names; ("softcap",) for a feature that is on or off).
    values: tuple[str, ...]
    #: The value a case asks for, or None when the case does not use the feature.
    asked: Callable[[Case], str | None]
    #: The values a backend serves, from its declaration.
    declared: Callable[[Backend], Collection[str]]
    #: The refusal: (backend, case, the value asked, the backend's own why or None) → one line.
    words: Callable[[Backend, Case, str, str | None], str]
    #: The Case fields that ask for one value (the matrix's examples); None: the matrix has no row for it.
    example: Callable[[str], Mapping[str, Any]] | None = None
    #: A heading for the matrix ("score variant", "layout").
    group: str = ""

    def refusal(self, backend: Backend, case: Case) -> str | None:
        """Why `backend` cannot serve what `case` asks of this feature, or None (not asked, or declared)."""
        value = self.asked(case)
        if value is None or value in self.declared(backend):
            return None
        reasons = getattr(backend, "feature_reasons", None) or {}
        why = reasons.get(f"{self.name}:{value}") or reasons.get(self.name)
        return self.words(backend, case, value, why)


def declared_in(attribute: str) -> Callable[[Backend], Collection[str]]:
    """A declaration read from one attribute of the backend: a collection of names, or a bool meaning the feature's own."""
    def read(backend: Backend) -> Collection[str]:
        return tuple(getattr(backend, attribute, ()) or ())
    return read


def _on_off(attribute: str, name: str) -> Callable[[Backend], Collection[str]]:
    """A declaration that is a bool attribute: True serves `name`."""
    return lambda backend: (name,) if getattr(backend, attribute, False) else ()


def _dtype_words(backend: Backend, case: Case, dtype: str, why: str | None) -> str:
    if why:
        return f"{backend.name} does not compute {dtype} here ({why})"
    kind = "FP8 kernel" if dtype in FP8_DTYPES else f"{dtype} kernel"
    return f"{backend.name} has no {kind} (it computes in {', '.join(sorted(backend.dtypes))})"


def _layout_words(backend: Backend, case: Case, layout: str, why: str | None) -> str:
    takes = ", ".join(name for name in LAYOUTS if name in backend.layouts)
    return f"{backend.name} does not take {LAYOUT_WORDS.get(layout, layout)} (it takes: {takes})" + (f": {why}" if why else "")


def _ragged_backward_words(backend: Backend, case: Case, layout: str, why: str | None) -> str:
    if layout == "paged":
        return f"a paged KV cache serves decoding and has no {case.mode} pass: train on packed or padded batches"
    return (f"{backend.name}'s adapter does not differentiate {LAYOUT_WORDS[layout]} (its {layout} batches are forward only)"
            + (f": {why}" if why else ""))


def score_variant(name: str, field_value: Any) -> Feature:
    """A score variant (harness.attention.variants) as a feature: asked when the case uses it, declared in `score_variants`."""
    from harness.attention.variants import variants_of

    return Feature(name, (name,), lambda case: name if name in variants_of(case) else None, declared_in("score_variants"),
                   lambda backend, case, value, why: f"{backend.name} does not support {value} ({why or VARIANT_NOT_PASSED})",
                   lambda value: {name: field_value}, "score variant")


def _ragged_layout_example(layout: str) -> dict[str, Any]:
    return {"layout": layout}


#: Every feature, in the order a refusal lists them. Appending a Feature here is all the harness needs to refuse it.
FEATURES: list[Feature] = [
    Feature("device", DEVICES, lambda case: case.device, declared_in("devices"),
            lambda backend, case, device, why: f"{backend.name} has no {device.upper()} kernel (runs on: {', '.join(backend.devices)})",
            None, "device"),
    Feature("backward", ("backward",), lambda case: "backward" if case.mode != "fwd" else None, _on_off("supports_backward", "backward"),
            lambda backend, case, value, why: f"{backend.name} has no backward pass" + (f" ({why})" if why else ""),
            lambda value: {"mode": "fwd_bwd"}, "pass"),
    Feature("deterministic", ("deterministic",), lambda case: "deterministic" if case.deterministic else None,
            _on_off("deterministic_backward", "deterministic"),
            lambda backend, case, value, why: f"{backend.name} has no deterministic backward ({why or NO_DETERMINISTIC_BACKWARD})",
            lambda value: {"mode": "fwd_bwd", "deterministic": True}, "pass"),
    Feature("dtype", tuple(DTYPES), lambda case: case.dtype, declared_in("dtypes"), _dtype_words, None, "dtype"),
    # An FP8 KV cache is no backend's limit but the case's: inference reads it, nothing differentiates it.
    Feature("kv cache backward", ("kv cache backward",),
            lambda case: "kv cache backward" if case.kv_dtype is not None and case.mode != "fwd" else None, lambda backend: (),
            lambda backend, case, value, why: (f"an FP8 KV cache ({case.kv_dtype}) is read by inference, never differentiated: "
                                               f"it has no {case.mode} pass")),
    Feature("kv_dtype", FP8_DTYPES, lambda case: case.kv_dtype, declared_in("kv_dtypes"),
            lambda backend, case, kv, why: (f"{backend.name}'s adapter does not read an FP8 KV cache ({kv}): "
                                            + (why or "it hands K and V over in the queries' dtype")),
            lambda value: {"kv_dtype": value}, "FP8 KV cache"),
    # Sorted by name, the order the refusals of several variants have always been listed in.
    score_variant("alibi", True),
    score_variant("scale", EXAMPLE_SCALE),
    score_variant("sinks", True),
    score_variant("softcap", EXAMPLE_SOFTCAP),
    Feature("layout", LAYOUTS, lambda case: case.layout, declared_in("layouts"), _layout_words, _ragged_layout_example, "layout"),
    Feature("ragged backward", LAYOUTS[1:], lambda case: case.layout if case.layout != "dense" and case.mode != "fwd" else None,
            declared_in("ragged_backward"), _ragged_backward_words, lambda layout: {"layout": layout, "mode": "fwd_bwd"},
            "training batch"),
]


def feature_refusals(backend: Backend, case: Case, features: list[Feature] | None = None) -> list[str]:
    """Every reason `backend` cannot serve `case` by its declarations, one per feature it lacks, in the table's order."""
    reasons = [feature.refusal(backend, case) for feature in (FEATURES if features is None else features)]
    return [reason for reason in reasons if reason is not None]


def joined(reasons: list[str]) -> str | None:
    """Several reasons as one line (a row's `reason`), or None when there are none."""
    return "; ".join(reasons) if reasons else None


def refusal(backend: Backend, case: Case) -> str | None:
    """Why the harness will not run `backend` on `case`, every reason in one line, or None.

    A built-in's `supports` already lists its declared features' refusals; a plugin's `supports` may not, so any
    declared refusal it left out is added before its own words.
    """
    declared = feature_refusals(backend, case)
    try:
        own = backend.supports(case)
    except Exception:
        if declared:  # refused already: a plugin's own probe is never made to read what it declares it cannot
            return joined(declared)
        raise
    own = str(own) if own else None  # a plugin's reason of another type is still its words, as text; a falsy one serves
    return joined([reason for reason in declared if not own or reason not in own] + ([own] if own else []))
