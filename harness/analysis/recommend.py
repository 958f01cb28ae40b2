"""`attnbench recommend`: the backend (and, for a serving batch, the layout) to choose for a shape, from measured rows only.

The query names a shape (a model preset's heads, S, B, a batch …; `matching_rows`, below); every measured case
that matches it is a candidate. With `--model M --tp N`, only the cases that compute M's layers as one GPU of TP N
runs them (`recommend_model`), and one answer per layer kind beside the overall one. The answer comes first: for one
problem (one case, or one batch in several layouts) the fastest backend and layout; for several, the option with the
lowest geometric mean of its time over each problem's fastest, among the options that ran them all. One answer per
case follows. Only rows that ran, agreed with the float64 reference and carry no contended or suspect flag decide
(`harness.analysis.trust`); those left out are counted, and those faster than the answer named. A problem one option
alone ran makes it the only candidate, never a winner; with no answer, `no_winner_reason` says why. Two options are
told apart by `harness.analysis.difference`'s rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import pandas as pd

from harness.analysis.difference import differ, interval_of
from harness.analysis.frame import agreeing_rows, case_key, case_labels, is_core, num
from harness.analysis.trust import LeftOut, flags_of, left_out, untrusted
from harness.analysis.variants import holds_value, variant_label
from harness.analysis.winners import faster_left_out, no_winner_reason
from harness.errors import UserError
from harness.suite.cases import CASE_FIELDS

#: The case fields that say how a batch is laid out, not which problem it is: a padded and a packed row of one batch compete.
LAYOUT_FIELDS = ("layout", "page_size", "padding")


def model_shape(name: str) -> dict[str, Any]:
    """H, H_kv, d_k and window of a published model's preset (`harness.suite.presets`)."""
    from harness.suite.presets import get_preset

    preset = get_preset(name.strip().lower())
    return {"H": preset.H, "H_kv": preset.H_kv, "d_k": preset.d_k, "window": preset.window}


def option_of(row: Mapping[str, Any]) -> str:
    """What a user chooses from one row: the backend, with its layout where the row is a serving batch ("flash (packed)")."""
    layout = row.get("layout")
    if not isinstance(layout, str) or layout in ("", "dense"):
        return str(row["backend"])
    page = num(row.get("page_size"))
    return f"{row['backend']} ({layout}" + (f", page {int(page)})" if layout == "paged" and page else ")")


def times(ratio: float) -> str:
    """A ratio of times as a user reads it: '5.2× the time' (never a percentage 'faster' above 100 %)."""
    return f"{ratio:.2f}× the time"


@dataclass
class Recommendation:
    """The answer for one measured case: the winner, the runner-up, the rows it is based on and the rows it left out."""

    case_id: str
    winner: str | None
    winner_ms: float | None
    runner_up: str | None
    runner_up_ms: float | None
    rows: pd.DataFrame
    #: True when the winner and the runner-up do not differ by `harness.analysis.difference`'s rule: the order may be noise.
    within_noise: bool = False
    left_out: LeftOut = field(default_factory=LeftOut)
    #: The flagged agreeing rows faster than the winner, named beside it ('sdpa 0.5 ms (contended)'); '' when none is.
    faster_left_out: str = ""

    @property
    def only_candidate(self) -> bool:
        """True when one backend alone ran and agreed: the answer is the only candidate, never a win."""
        return self.winner is not None and self.runner_up is None

    @property
    def reason(self) -> str:
        """Why the case has no answer (`no_winner_reason`), '' when it has one."""
        return "" if self.winner is not None else no_winner_reason(self.rows)

    @property
    def ratio(self) -> float | None:
        """The runner-up's time over the winner's (None without a runner-up)."""
        return self.runner_up_ms / self.winner_ms if self.runner_up_ms and self.winner_ms else None

    def head(self) -> str:
        """The one-line answer for this case."""
        if self.winner is None:
            return f"{self.case_id}: no answer: {self.reason}"
        faster = f"; faster but left out: {self.faster_left_out}" if self.faster_left_out else ""
        if self.runner_up is None:
            return (f"{self.case_id}: only candidate: {self.winner} ({self.winner_ms:.4g} ms), the one backend that ran, agreed and carries "
                    f"no flag: not a win over anything{faster}")
        head = f"{self.case_id}: {self.winner} ({self.winner_ms:.4g} ms); the runner-up {self.runner_up} takes {times(self.ratio)} ({self.runner_up_ms:.4g} ms)"
        return head + ("; within noise (their 95 % intervals overlap): either is a fair choice" if self.within_noise else "") + faster

    def lines(self) -> list[str]:
        """The head, then one line per row it used or left out."""
        out = [self.head(), "  based on these rows:"]
        width = max([16, *(len(option_of(r)) for _, r in self.rows.iterrows())])
        for _, r in self.rows.sort_values("latency_ms_median", na_position="last").iterrows():
            if r["status"] != "ok":
                out.append(f"    {option_of(r):<{width}} {r['status']}: {r['reason']}")
                continue
            flags = flags_of(r)
            agree = "agrees" if r["agree_ok"] else ("not checked" if r["agree"] is None else "DISAGREES (excluded)")
            if flags and r["agree_ok"]:
                agree += f", {' and '.join(flags)} (left out)"
            interval = interval_of(r)
            spread = f"95 % interval {interval[0]:.4g}–{interval[1]:.4g}" if interval else "no 95 % interval (under 6 samples)"
            out.append(f"    {option_of(r):<{width}} {r['latency_ms_median']:>10.4g} ms  {spread}  {agree}")
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of this case's answer and the rows it read."""
        rows = [{"backend": r["backend"], "option": option_of(r), "status": r["status"], "latency_ms_median": num(r["latency_ms_median"]),
                 "agree": r["agree"] if isinstance(r["agree"], bool) else None, "flags": flags_of(r), "reason": r.get("reason")}
                for _, r in self.rows.iterrows()]
        return {"case_id": self.case_id, "winner": self.winner, "winner_ms": self.winner_ms, "runner_up": self.runner_up,
                "runner_up_ms": self.runner_up_ms, "runner_up_ratio": self.ratio, "within_noise": self.within_noise,
                "only_candidate": self.only_candidate, "faster_left_out": self.faster_left_out, "no_answer_reason": self.reason or None,
                "left_out": self.left_out.to_dict(), "rows": rows}


@dataclass
class Answer:
    """What `recommend` says: the one answer over every matching case first, then each case's."""

    best: str | None
    summary: str
    cases: list[Recommendation]
    left_out: LeftOut = field(default_factory=LeftOut)
    #: The options ranked over every problem: option → geometric mean of its time over each problem's fastest.
    ranking: dict[str, float] = field(default_factory=dict)
    #: True when `best` is the one option that ran, agreed and carries no flag: the only candidate, not a win.
    only_candidate: bool = False
    #: For a model whose layers differ: one (layer kind's label, its answer) per kind, in the preset's order.
    kinds: list[tuple[str, "Answer | None"]] = field(default_factory=list)

    def lines(self, label: str = "") -> list[str]:
        """The overall answer, each layer kind's, what was left out, then each case's lines."""
        out = [label + self.summary]
        if self.kinds:
            out.append("  per layer kind:")
            out.extend(f"    {kind}: {answer.summary if answer else 'not measured in this run'}" for kind, answer in self.kinds)
        if self.left_out:
            out.append("  " + self.left_out.sentence("this answer"))
        if len(self.cases) == 1:  # the summary is this case's answer: its rows follow
            return out + self.cases[0].lines()[1:]
        out.append(f"per case ({len(self.cases)}):")
        for case in self.cases:
            out.extend(case.lines())
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON document `recommend --json` prints."""
        document = {"best": self.best, "only_candidate": self.only_candidate, "summary": self.summary, "ranking": self.ranking,
                    "left_out": self.left_out.to_dict(), "cases": [c.to_dict() for c in self.cases]}
        if self.kinds:
            document["layer_kinds"] = [{"kind": kind, "best": a.best if a else None, "only_candidate": a.only_candidate if a else False,
                                        "summary": a.summary if a else "not measured in this run",
                                        "cases": [c.case_id for c in a.cases] if a else []} for kind, a in self.kinds]
        return document


def _case_answer(case_id: str, sub: pd.DataFrame, cv: float) -> Recommendation:
    """One case's winner and runner-up among its trusted agreeing rows."""
    good = agreeing_rows(sub).sort_values("latency_ms_median")
    best = good.iloc[0] if len(good) else None
    second = good.iloc[1] if len(good) > 1 else None
    candidates = agreeing_rows(sub, flagged=True)
    flagged = [r for _, r in candidates[untrusted(candidates)].iterrows()]
    return Recommendation(
        case_id, best["backend"] if best is not None else None, float(best["latency_ms_median"]) if best is not None else None,
        second["backend"] if second is not None else None, float(second["latency_ms_median"]) if second is not None else None,
        sub, second is not None and not differ(best, second, cv), left_out(candidates),
        faster_left_out(flagged, float(best["latency_ms_median"])) if best is not None else "",
    )


def _problem_columns(rows: pd.DataFrame) -> list[str]:
    """The columns naming one problem: the case's fields but its layout (and the device model)."""
    return [c for c in (*CASE_FIELDS, "device_model") if c in rows.columns and c not in LAYOUT_FIELDS]


def _faster_flagged(rows: pd.DataFrame, best: Mapping[str, Any]) -> str:
    """The flagged agreeing rows of `best`'s problem faster than it, named ('sdpa 0.5 ms (contended)'); '' when none is."""
    candidates = agreeing_rows(rows, flagged=True)
    candidates = candidates[untrusted(candidates)]
    columns = _problem_columns(candidates)
    same = [r for _, r in candidates.iterrows() if repr(tuple(r[c] for c in columns)) == best["_problem"]]
    return faster_left_out(same, float(best["latency_ms_median"]))


def _overall(rows: pd.DataFrame, cases: list[Recommendation], cv: float) -> tuple[str | None, str, dict[str, float], bool]:
    """The one answer over every matching case: (best option, its sentence, the ranking of the options that ran every problem, only candidate).

    A problem that one option alone ran is that option's only-candidate problem, never a win; flagged rows faster than
    the answer are named beside it.
    """
    good = agreeing_rows(rows)
    if good.empty:
        return None, f"no answer: {no_winner_reason(rows)}", {}, False
    good = good.assign(option=[option_of(r) for _, r in good.iterrows()])
    columns = _problem_columns(good)
    # Lengths are lists (unhashable): a problem is named by the text of its fields.
    good = good.assign(_problem=[repr(tuple(r[c] for c in columns)) for _, r in good.iterrows()])
    problems = list(good.groupby("_problem", sort=False))
    if len(problems) == 1:
        ranked = good.sort_values("latency_ms_median")
        best, second = ranked.iloc[0], ranked.iloc[1] if len(ranked) > 1 else None
        label = best.get("case", best["case_id"])
        where = label if best["option"] == best["backend"] or len(ranked["case_id"].unique()) == 1 else f"the batch {best.get('length_dist') or label}"
        faster = _faster_flagged(rows, best)
        faster = f"; faster but left out: {faster}" if faster else ""
        ranking = {str(o): float(t) / float(best["latency_ms_median"]) for o, t in ranked.groupby("option", sort=False)["latency_ms_median"].min().items()}
        if second is None:
            return (str(best["option"]), f"only candidate for {where}: {best['option']} ({best['latency_ms_median']:.4g} ms), the one option that ran, "
                    f"agreed and carries no flag: not a win over anything{faster}", ranking, True)
        text = f"best for {where}: {best['option']} ({best['latency_ms_median']:.4g} ms)"
        ratio = float(second["latency_ms_median"]) / float(best["latency_ms_median"])
        text += f"; the runner-up {second['option']} takes {times(ratio)}"
        if not differ(best, second, cv):
            text += "; within noise (their 95 % intervals overlap): either is a fair choice"
        return str(best["option"]), text + faster, ranking, False
    fastest = {i: float(sub["latency_ms_median"].min()) for i, (_, sub) in enumerate(problems)}
    ratios: dict[str, list[float]] = {}
    wins: dict[str, int] = {}
    contested = 0
    for i, (_, sub) in enumerate(problems):
        per_option = sub.groupby("option", sort=False)["latency_ms_median"].min()
        for option, ms in per_option.items():
            ratios.setdefault(str(option), []).append(float(ms) / fastest[i])
        if len(per_option) > 1:  # a problem one option alone ran is nobody's win
            contested += 1
            wins[str(per_option.idxmin())] = wins.get(str(per_option.idxmin()), 0) + 1
    everywhere = {o: math.exp(sum(map(math.log, r)) / len(r)) for o, r in ratios.items() if len(r) == len(problems)}
    if not everywhere:
        return None, (f"no overall answer: no backend ran all {len(problems)} matching problems, agreed and carries no flag; "
                      "see each case's answer below"), {}, False
    ranking = dict(sorted(everywhere.items(), key=lambda kv: kv[1]))
    best = next(iter(ranking))
    flagged = sorted({f"{r['backend']} ({' and '.join(flags_of(r))})" for c in cases if c.faster_left_out
                      for _, r in c.rows.iterrows() if flags_of(r) and r["agree_ok"] and r["status"] == "ok"
                      and c.winner_ms is not None and float(r["latency_ms_median"]) < c.winner_ms})
    faster = f"; faster in some problem but left out: {', '.join(flagged)}" if flagged else ""
    partial = sorted(o for o, r in ratios.items() if len(r) < len(problems))
    partial_text = f"; not ranked overall (ran only some problems): {', '.join(partial)}" if partial else ""
    if len(ratios) == 1:
        return best, (f"only candidate over the {len(problems)} matching problems: {best}, the one option that ran, agreed and carries "
                      f"no flag in each: not a win over anything{faster}"), ranking, True
    alone = len(problems) - contested
    text = (f"best over the {len(problems)} matching problems: {best} (geometric mean {ranking[best]:.2f}× the fastest time per problem; "
            f"fastest in {wins.get(best, 0)} of the {contested} problems another option ran too"
            + (f"; only candidate in {alone}" if alone else "") + ")")
    others = [f"{o} {g:.2f}×" for o, g in list(ranking.items())[1:3]]
    if others:
        text += f"; then {', '.join(others)}"
    return best, text + partial_text + faster, ranking, len(ranking) == 1 and contested == 0


def recommend(frame: pd.DataFrame, query: Mapping[str, Any], cv: float = 0.0) -> Answer:
    """Answer from measured rows for the cases matching `query` (fields: B, S, H, H_kv, d_k, dtype, causal, window, batch, variant).

    Winner and runner-up are judged by `harness.analysis.difference`'s rule, widened by the run-to-run variation `cv`.
    Unspecified fields match anything; `S` means S_q = S_kv = S; `batch` is a batch description, matched
    against the rows' `length_dist`; `variant` (`PLAIN`'s fields) what the scores compute. Raises UserError naming
    the measured values when the run holds no case of that shape: it never interpolates or guesses.
    """
    return _answer(matching_rows(frame, query), cv)


def _answer(rows: pd.DataFrame, cv: float) -> Answer:
    """The overall answer and each case's over `rows` (attention-core rows of the matching cases)."""
    cases = [_case_answer(case_labels(sub).iloc[0], sub, cv) for _, sub in rows.groupby(case_key(rows), sort=True)]
    best, summary, ranking, alone = _overall(rows, cases, cv)
    return Answer(best, summary, cases, left_out(agreeing_rows(rows, flagged=True)), ranking, alone)


def kind_label(kind: Any, layers: int | None) -> str:
    """A layer kind as the answer names it: 'sliding (12 of 24 layers: window 128 + sinks)'."""
    count = f"{kind.layers} of {layers} layers" if kind.layers and layers else "every layer"
    return f"{kind.name} ({count}: {variant_label(kind.case_fields())})"


def model_label(name: str, tp: int) -> str:
    """What the answer for a model at a TP degree starts with: its per-GPU heads and its layer kinds."""
    from harness.suite.presets import get_preset, tp_heads

    preset = get_preset(name)
    H, H_kv = tp_heads(preset, tp)
    mla = f", MLA latent {preset.d_c}+{preset.d_rope}" if preset.mla else ""
    kinds = ("; ".join(kind_label(k, preset.layers) for k in preset.kinds) if len(preset.kinds) > 1
             else f"every layer: {variant_label(preset.kinds[0].case_fields())}")
    return f"{preset.name} at TP {tp} (per GPU H {H}, H_kv {H_kv}, d_k {preset.d_k}, d_v {preset.d_v}{mla}; {kinds}): "


def recommend_model(frame: pd.DataFrame, name: str, tp: int, query: Mapping[str, Any], cv: float = 0.0) -> Answer:
    """Answer for model `name` as it runs on one GPU of `tp`: only from the cases that compute its layers' attention.

    A case counts when its shape (heads at that TP, head dims, window, softcap, sinks, scale, MLA) is one of the
    model's layer kinds (`harness.analysis.models.layer_shapes`, the mapping `run --model … --tp` runs); `query`
    narrows further (S, B, dtype, batch). A model whose layers differ gets one answer per layer kind beside the
    overall one. UserError when the run holds none of its cases at that TP, naming the degrees it holds.
    """
    from harness.analysis.models import TP_DEGREES, layer_shapes, shape_of
    from harness.suite.presets import get_preset

    preset = get_preset(name)
    shapes = layer_shapes(preset, tp)
    core = frame[is_core(frame)]
    row_shapes = pd.Series([shape_of(r) for _, r in core.iterrows()], index=core.index, dtype=object)
    kind_of = row_shapes.map(lambda shape: shapes[shape].name if shape in shapes else None)
    if not kind_of.notna().any():
        measured = []
        for other in TP_DEGREES:
            try:
                if other != tp and row_shapes.isin(list(layer_shapes(preset, other))).any():
                    measured.append(str(other))
            except UserError:
                continue
        where = (f"it holds {preset.name}'s cases at TP {', '.join(measured)} only: give --tp {measured[0]}" if measured
                 else f"run `attnbench run --model {preset.name} --tp {tp}` (or the models-2026 suite) first")
        raise UserError(f"the run measured no case of {preset.name}'s attention at TP {tp}: {where}")
    rows = matching_rows(core[kind_of.notna()], {k: v for k, v in query.items() if k != "variant"})
    answer = _answer(rows, cv)
    if len(preset.kinds) > 1:
        kinds = kind_of.loc[rows.index]
        answer.kinds = [(kind_label(kind, preset.layers), _answer(rows[kinds == kind.name], cv) if (kinds == kind.name).any() else None)
                        for kind in preset.kinds]
    return answer


# -- which measured rows a question names: a shape, a serving batch, what its scores compute. A variant is never ranked
# with another: a custom shape without variant options reads the plain cases only, and a question the run cannot answer
# is refused naming what it holds.

def batch_key(text: Any) -> str | None:
    """A batch description in the one spelling rows are matched by (harness.suite.batch's canonical text); None for none.

    A file is named, not read: rows carry its name. Text the grammar does not read is matched as written, spaces removed.
    """
    from harness.suite.batch import parse_batch

    if not isinstance(text, str) or not text.strip():
        return None
    try:
        text = parse_batch(text, read=False).text
    except UserError:
        pass
    return "".join(text.split())


def _batch_rows(rows: pd.DataFrame, batch: str) -> pd.Series:
    """Which rows measured the batch `batch` (their `length_dist`); UserError listing the run's batches when none did."""
    from harness.suite.batch import parse_batch

    recorded = rows["length_dist"] if "length_dist" in rows.columns else pd.Series([None] * len(rows), index=rows.index)
    parse_batch(batch, read=False)  # a query the grammar cannot read is the user's mistake, said in one line
    match = recorded.map(batch_key) == batch_key(batch)
    if not match.any():
        seen = sorted({str(d) for d in recorded if batch_key(d)})
        measured = f"its batches are {'; '.join(seen)}" if seen else "it has no serving batches (no row has a length_dist)"
        raise UserError(f"the run measured no batch {batch!r}: {measured}; run a suite with that batch first")
    return match


#: What a custom shape's query computes when it names no variant: plain attention (no window, softcap, sinks, ALiBi or scale).
PLAIN = {"window": None, "softcap": None, "sinks": False, "alibi": False, "scale": None}


def _same_variant(value: Any, wanted: Any) -> bool:
    """Whether a row's variant column computes what the query asks (None/False: without it; a number: that value)."""
    if wanted is None or wanted is False:
        return not holds_value(value)
    if wanted is True:
        return holds_value(value)
    return holds_value(value) and math.isclose(float(value), float(wanted), rel_tol=1e-6)


def variant_options(row: Mapping[str, Any]) -> str:
    """The recommend options that select a row's variant ('--window 128 --sinks'), or 'no variant option' for a plain case."""
    words = []
    for name in PLAIN:
        value = row.get(name)
        if holds_value(value) and name != "alibi":
            words.append(f"--{name}" if name == "sinks" else f"--{name} {float(value):g}")
        elif holds_value(value):
            words.append("alibi (no option: recommend does not select ALiBi cases)")
    return " ".join(words) or "no variant option"


def _variant_rows(rows: pd.DataFrame, variant: Mapping[str, Any]) -> pd.DataFrame:
    """The rows that compute `variant` (window, softcap, sinks, ALiBi, scale); UserError naming the variants measured when none does."""
    match = pd.Series(True, index=rows.index)
    for name, wanted in variant.items():
        if name in rows.columns:
            match &= rows[name].map(lambda v, w=wanted: _same_variant(v, w))
        elif wanted not in (None, False):
            match &= False
    if not match.any():
        seen = {variant_label(r): variant_options(r) for _, r in rows.iterrows()}
        listed = "; ".join(f"{label} ({options})" for label, options in sorted(seen.items()))
        raise UserError(f"the run measured no {variant_label(variant)} case of that shape, only {listed}: "
                        "give the options of the attention you run (a variant is never ranked with another)")
    return rows[match]


def matching_rows(frame: pd.DataFrame, query: Mapping[str, Any]) -> pd.DataFrame:
    """The attention-core rows of the cases `query` names; UserError naming the measured values when none matches.

    `query["variant"]` (the fields of `PLAIN`) selects what the cases compute; without it, any variant matches (a model's
    rows, already narrowed to its layers).
    """
    rows = frame[is_core(frame)]
    for name, value in query.items():
        if value is None or name == "variant":
            continue
        if name == "batch":
            match = _batch_rows(rows, value)
        elif name == "S":
            match = (rows["S_q"] == value) & (rows["S_kv"] == value)
        elif name == "window":
            match = rows["window"].map(lambda w: w is not None and w == w and int(w) == int(value))
        else:
            match = rows[name] == value
        if not match.any():
            column = rows["S_kv"] if name == "S" else rows[name]
            seen = [str(v) for v in sorted(column.dropna().unique(), key=lambda v: (not isinstance(v, (int, np.integer)), v if isinstance(v, (int, np.integer)) else str(v)))]
            given = ", ".join(f"{k}={v}" for k, v in query.items() if v is not None)
            raise UserError(f"the run measured no case with {given}: {name} was measured at {', '.join(seen) or 'nothing'} only; run a suite with that shape first")
        rows = rows[match]
    if query.get("variant") is not None:
        rows = _variant_rows(rows, query["variant"])
    return rows
