"""Features as data (harness.backends.features): one table entry is all a new feature needs to be refused, in its own
words, by every backend that does not declare it; and a backend answers with every reason it cannot run a case."""

from __future__ import annotations

from harness.backends import features
from harness.backends.base import Backend
from harness.backends.features import Feature, declared_in, refusal
from harness.backends.matrix import capability_matrix
from harness.backends.pytorch.naive import NaiveBackend
from harness.backends.registry import Registry, load_registry
from harness.checks.correctness import check_pair
from harness.suite.cases import Case

BASE = dict(B=1, S_q=16, S_kv=16, H=2, H_kv=2, d_k=8, d_v=8, dtype="fp32", device="cpu")
#: The seed that stands, in these tests, for a case asking for the new feature (no Case field exists for it yet).
ASKING_SEED = 7


def dropout_feature() -> Feature:
    """A feature no backend knows: asked by a case of seed 7, declared in a `dropouts` attribute, refused in its own words."""
    return Feature("dropout", ("dropout",), lambda case: "dropout" if case.seed == ASKING_SEED else None, declared_in("dropouts"),
                   lambda backend, case, value, why: f"{backend.name} has no attention dropout ({why or 'not passed to its kernel'})",
                   lambda value: {"seed": ASKING_SEED}, "regularisation")


class DropoutNaive(NaiveBackend):
    """naive, declaring the new feature."""

    name = "naive-dropout"
    dropouts = frozenset({"dropout"})


def test_a_feature_added_to_the_table_alone_is_refused_in_its_words_by_a_backend_that_does_not_declare_it(monkeypatch):
    monkeypatch.setattr(features, "FEATURES", [*features.FEATURES, dropout_feature()])
    asking, plain = Case(**BASE, seed=ASKING_SEED), Case(**BASE)

    assert NaiveBackend().refusals(asking) == ["naive has no attention dropout (not passed to its kernel)"]
    assert NaiveBackend().refusals(plain) == []
    assert DropoutNaive().refusals(asking) == []
    # Through the executor: an unsupported row with the feature's words, and the declaring backend runs and agrees.
    result = check_pair(asking, NaiveBackend())
    assert (result.status, result.reason) == ("unsupported", "naive has no attention dropout (not passed to its kernel)")
    assert check_pair(asking, DropoutNaive()).verdict == "agree"

    class WhyNaive(NaiveBackend):
        name = "naive-why"
        feature_reasons = {"dropout": "its softmax is followed by nothing"}

    assert WhyNaive().supports(asking) == "naive-why has no attention dropout (its softmax is followed by nothing)"
    # And the matrix has its row: refused by naive with those words, served by the backend declaring it.
    registry = Registry()
    registry.add(NaiveBackend())
    registry.add(DropoutNaive())
    naive, declaring = capability_matrix(registry, availability=False)
    cells = {(c.device, c.dtype): c for c in naive.cells if c.feature == "dropout"}
    assert cells[("cpu", "fp32")].status == "no"
    assert cells[("cpu", "fp32")].reasons == ("naive has no attention dropout (not passed to its kernel)",)
    assert {c.status for c in declaring.cells if c.feature == "dropout" and c.dtype in ("fp32", "bf16")} == {"yes"}


def test_a_backend_answers_with_every_reason_it_cannot_run_a_case_not_the_first():
    flash2 = load_registry(plugins=False).get("flash-attn2")
    case = Case(**BASE, sinks=True)
    expected = ["flash-attn2 has no CPU kernel (runs on: cuda)",
                "flash-attn2 has no fp32 kernel (it computes in bf16, fp16)",
                "flash-attn2 does not support sinks (flash_attn_func has no attention-sink parameter (it takes softcap and alibi_slopes))"]
    assert flash2.refusals(case) == expected
    assert flash2.supports(case) == "; ".join(expected)
    assert refusal(flash2, case) == "; ".join(expected)
    # A case that meets every declaration but the library's own limits hears those: FA2's d_v = d_k and its 256 cap.
    wide = Case(**{**BASE, "d_k": 320, "d_v": 64, "dtype": "bf16", "device": "cuda"})
    assert flash2.refusals(wide) == ["flash-attn2 needs d_v = d_k (flash_api.cpp checks v's head_size against q's); case has d_k=320, d_v=64"]


def test_a_plugin_whose_supports_skips_the_base_class_still_hears_the_declared_refusals_first():
    class OwnWords(Backend):
        name, family = "own-words", "plugin"

        def supports(self, case: Case) -> str | None:
            return "own-words takes no fp32"

        def prepare(self, case, inputs):
            raise AssertionError("never prepared: refused")

    fp64_cuda = Case(**{**BASE, "dtype": "fp64", "device": "cuda", "sinks": True})
    assert refusal(OwnWords(), fp64_cuda) == "own-words does not support sinks (its adapter does not pass it to the kernel); own-words takes no fp32"
    # A reason its supports already gives is not repeated.
    class Repeating(OwnWords):
        name = "repeating"

        def supports(self, case: Case) -> str | None:
            return "; ".join(self.refusals(case) + ["and its own"])

    assert refusal(Repeating(), fp64_cuda) == "repeating does not support sinks (its adapter does not pass it to the kernel); and its own"
