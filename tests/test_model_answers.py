"""The answer a user acts on (issue 44): `recommend --model M --tp N` reads only the cases of M's layers, a backend that
ran alone is the only candidate and never a win, a question with no answer says why everywhere, figures ring flagged
points, and every `--json` output is strict JSON."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from harness import analysis
from harness.cli.main import build_parser, main
from harness.suite.cases import Case
from tests.history_runs import run_folder
from tests.synthetic_runs import PEAKS, frame_of, synthetic_record, write_run

#: gpt-oss-20b on one GPU of TP 8 (harness/suite/presets.py): 8 query heads, 1 KV head, d 64; every layer has sinks,
#: the sliding ones a 128-token window. The plain twins (what models-2026 measures beside them) are no layer of it.
SLIDING = Case(B=1, S_q=160, S_kv=160, H=8, H_kv=1, d_k=64, d_v=64, causal=True, window=128, sinks=True)
FULL = SLIDING.replace(window=None)
#: gemma2-9b at TP 1: 16 query heads, 8 KV heads, d 256, every layer softcapped at 50, the sliding ones over 4096 tokens.
GEMMA_GLOBAL = Case(B=1, S_q=160, S_kv=160, H=16, H_kv=8, d_k=256, d_v=256, causal=True, softcap=50.0)


def flagged(record, **flags):
    """`record` with the sample flags a shared machine sets."""
    for name, value in flags.items():
        setattr(record, name, value)
    return record


def models_2026_like_rows() -> list:
    """What a models-2026 CPU run holds for gpt-oss-20b at TP 8 and gemma2-9b at TP 1: the variant cases, which only naive (and flex)
    compute, and their plain twins, where SDPA is far faster."""
    rows = []
    for case in (SLIDING, FULL, GEMMA_GLOBAL):
        rows += [synthetic_record(case, "naive", 6.0), synthetic_record(case, "sdpa", 0, status="unsupported"),
                 synthetic_record(case, "sdpa-flash", 0, status="unsupported")]
        plain = case.replace(sinks=False, softcap=None)
        rows += [synthetic_record(plain, "naive", 6.0), synthetic_record(plain, "sdpa", 1.0), synthetic_record(plain, "sdpa-flash", 0.5)]
    rows.append(synthetic_record(SLIDING, "flex", 3.0))  # the sliding layers have two candidates; the full ones only naive
    return rows


# -- 1: recommend --model M --tp N answers from M's layers only -----------------------------------------------------------------
def test_recommend_for_a_model_at_a_tp_degree_reads_only_its_layers_cases_per_layer_kind(tmp_path, capsys):
    run = write_run(tmp_path / "run", models_2026_like_rows(), peaks=PEAKS)
    assert main(["recommend", str(run), "--model", "gpt-oss-20b", "--tp", "8"]) == 0
    out = capsys.readouterr().out
    head = out.splitlines()[0]
    sliding, full = (line.strip() for line in out.splitlines() if line.startswith(("    sliding (", "    full (")))
    assert head.startswith("gpt-oss-20b at TP 8 (per GPU H 8, H_kv 1, d_k 64")
    # On main the plain twins were ranked too, and the headline named sdpa-flash, which cannot compute sinks.
    assert "sdpa-flash" not in head and "sdpa (" not in out and "-sinks" in out
    assert sliding.startswith("sliding (12 of 24 layers: window 128 + sinks): best for") and ": flex (3 ms)" in sliding
    assert full.startswith("full (12 of 24 layers: sinks): only candidate for") and ": naive (6 ms)" in full
    assert main(["recommend", str(run), "--model", "gpt-oss-20b", "--tp", "8", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["tp"] == 8 and [k["kind"].split()[0] for k in document["layer_kinds"]] == ["sliding", "full"]
    assert {c["case_id"] for c in document["cases"]} == {"B1-Sq160-Skv160-H8-Hkv1-dk64-fp32-causal-win128-sinks", "B1-Sq160-Skv160-H8-Hkv1-dk64-fp32-causal-sinks"}
    # gemma2-9b's global layers: softcap 50; the uncapped twin, where sdpa wins, is no layer of it.
    assert main(["recommend", str(run), "--model", "gemma2-9b", "--tp", "1"]) == 0
    out = capsys.readouterr().out
    assert "only candidate for" in out.splitlines()[0] and "naive" in out.splitlines()[0] and "sdpa-flash (" not in out
    assert "sliding (21 of 42 layers: window 4096 + softcap 50): not measured in this run" in out
    # A degree the run does not hold is named, with the one it does.
    assert main(["recommend", str(run), "--model", "gpt-oss-20b", "--tp", "1"]) == 2
    assert "no case of gpt-oss-20b's attention at TP 1: it holds gpt-oss-20b's cases at TP 8 only: give --tp 8" in capsys.readouterr().err


def test_a_custom_shape_names_its_variant_and_a_variant_is_never_ranked_with_plain_cases(tmp_path, capsys):
    run = write_run(tmp_path / "run", models_2026_like_rows(), peaks=PEAKS)
    shape = ["--seq", "160", "--H", "8", "--H-kv", "1", "--d-k", "64"]
    assert main(["recommend", str(run), *shape]) == 0  # no option: the plain case alone, where sdpa-flash is best
    out = capsys.readouterr().out
    assert out.startswith("best for B1-Sq160-Skv160-H8-Hkv1-dk64-fp32-causal: sdpa-flash") and "sinks" not in out
    assert main(["recommend", str(run), *shape, "--sinks"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("only candidate for B1-Sq160-Skv160-H8-Hkv1-dk64-fp32-causal-sinks: naive") and "win128" not in out
    assert main(["recommend", str(run), *shape, "--sinks", "--window", "128"]) == 0
    assert capsys.readouterr().out.startswith("best for B1-Sq160-Skv160-H8-Hkv1-dk64-fp32-causal-win128-sinks: flex")
    assert main(["recommend", str(run), *shape, "--softcap", "30"]) == 2
    err = capsys.readouterr().err
    assert "no softcap 30 case of that shape, only" in err and "window 128 + sinks (--window 128 --sinks)" in err
    assert main(["recommend", str(run), "--model", "gpt-oss-20b", "--sinks"]) == 2
    assert main(["recommend", str(run), "--seq", "160", "--tp", "8"]) == 2


def test_models_lists_every_preset_with_what_it_runs(capsys):
    from harness.suite.presets import PRESETS

    assert main(["models", "--json"]) == 0
    presets = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert set(presets) == set(PRESETS)
    gpt = presets["gpt-oss-20b"]
    assert [(k["name"], k["layers"], k["window"], k["sinks"]) for k in gpt["layer_kinds"]] == [("sliding", 12, 128, True), ("full", 12, None, True)]
    assert gpt["tp"]["8"] == {"H": 8, "H_kv": 1} and presets["kimi-k2"]["mla"] and presets["kimi-k2"]["d_c"] == 512
    assert presets["gemma2-27b"]["layer_kinds"][0]["softcap"] == 50.0 and presets["gemma2-27b"]["layer_kinds"][0]["scale"] == pytest.approx(144 ** -0.5)
    assert main(["models"]) == 0
    assert "  sliding (12 layers: even layers 0, 2, … (layer_types)): window 128, sinks, scale 1/√d_k" in capsys.readouterr().out


# -- 2: a backend that ran alone is the only candidate, never a win -------------------------------------------------------------
def test_a_case_with_one_candidate_is_never_a_win_in_counts_maps_and_the_model_table():
    from harness.analysis.models import model_winners
    from harness.analysis.winners import wins_per_backend

    frame = frame_of(models_2026_like_rows())
    wins = analysis.winners(frame).set_index("case_id")
    assert bool(wins.loc["B1-Sq160-Skv160-H8-Hkv1-dk64-fp32-causal-sinks", "only_candidate"])
    assert not wins.loc["B1-Sq160-Skv160-H8-Hkv1-dk64-fp32-causal-win128-sinks", "only_candidate"]
    tally = wins_per_backend(wins.reset_index()).set_index("backend")
    assert tally.loc["naive", "cases won"] == 0 and tally.loc["naive", "only candidate"] == 2  # on main: 2 wins
    cells = analysis.winner_map(frame, "H_kv", "fp32", variant="sinks")
    assert list(cells["winner"]) == [None] and list(cells["alone"]) == ["naive"] and list(cells["variant"]) == ["sinks"]
    plain = analysis.winner_map(frame, "H_kv", "fp32")  # plain cases only: never mixed with the sinks and softcap ones
    assert set(plain["variant"]) == {"plain"} and set(plain["winner"]) == {"sdpa-flash"} and list(plain["cases"]) == [1, 1]
    table = model_winners(frame).set_index(["model", "tp", "layer_kind", "phase"])
    full = table.loc[("gpt-oss-20b", 8, "full", "prefill")]
    assert pd.isna(full["winner"]) and full["won"] == 0 and full["only_candidate"] == 1 and "only candidate in 1 case: naive" in full["note"]
    assert table.loc[("gpt-oss-20b", 8, "sliding", "prefill"), "runner_up"] == "naive"


def test_recommend_calls_a_lone_backend_the_only_candidate_and_names_the_faster_row_it_left_out(tmp_path, capsys):
    case = Case(B=1, S_q=256, S_kv=256, H=8, H_kv=8, d_k=64, d_v=64)
    run = write_run(tmp_path / "run", [synthetic_record(case, "naive", 5.0), flagged(synthetic_record(case, "sdpa", 1.0), contended=True)], peaks=PEAKS)
    assert main(["recommend", str(run), "--seq", "256"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    # On main: "best for …: naive (5 ms)".
    assert head.startswith("only candidate for B1-Sq256-Skv256-H8-Hkv8-dk64-fp32: naive (5 ms)") and "not a win" in head
    assert head.endswith("faster but left out: sdpa 1 ms (contended)")


# -- 3: no answer says why, sections keep their place, figures ring flagged points ---------------------------------------------
def test_no_answer_says_which_of_the_three_reasons_it_is():
    from harness.analysis.winners import no_winner_reason

    case = Case(B=1, S_q=256, S_kv=256, H=8, H_kv=8, d_k=64, d_v=64)
    unsupported = frame_of([synthetic_record(case, "sdpa", 0, status="unsupported")])
    wrong = frame_of([synthetic_record(case, "sdpa", 1.0, agree=False)])
    busy = frame_of([flagged(synthetic_record(case, "sdpa", 1.0), contended=True), flagged(synthetic_record(case, "naive", 2.0), suspect=True)])
    assert no_winner_reason(unsupported).startswith("nothing supported: no backend ran it (1 unsupported")
    assert no_winner_reason(wrong).startswith("no row agreed: 1 rows ran and none agrees")
    assert no_winner_reason(busy).startswith("rows agreed but were contended or suspect: all 2 rows that ran and agreed carry that flag")


def test_a_report_of_an_all_contended_run_says_why_keeps_its_sections_and_rings_flagged_points(tmp_path, monkeypatch):
    from harness.report import build_report, figures

    drawn = []
    monkeypatch.setattr(figures, "to_data_uri", lambda fig: drawn.append(fig) or "data:image/png;base64,")
    rows = [flagged(r, contended=True) if r.status == "ok" else r for r in models_2026_like_rows()]
    run = write_run(tmp_path / "run", rows, peaks=PEAKS)
    page = build_report([run], out_root=tmp_path / "reports").read_text()
    choose = page.split('<section id="choose">')[1].split("</section>")[0]
    assert "No measured row agrees with the reference" not in page  # main's headline, false here: every row agreed
    assert "No winner in any case: rows agreed but were contended: all 13 rows that ran and agreed carry that flag" in choose
    variants = page.split('<section id="variants">')[1].split("</section>")[0]  # on main the section vanished
    assert "rows agreed but were contended" in variants
    assert "rows agreed but were contended" in page.split('<section id="models">')[1].split("</section>")[0]
    legends = [t.get_text() for fig in drawn for legend in fig.legends for t in legend.get_texts()]
    assert "hollow: contended or suspect, not a speed" in legends


def test_latency_figures_ring_flagged_points_with_a_legend_entry_and_leave_quiet_ones_plain(monkeypatch):
    from harness.report import figures

    drawn = []
    monkeypatch.setattr(figures, "to_data_uri", lambda fig: drawn.append(fig) or "data:image/png;base64,")
    rows = [synthetic_record(Case(B=1, S_q=s, S_kv=s, H=8, H_kv=8, d_k=64, d_v=64), "sdpa", s / 100) for s in (128, 256, 512)]
    rows[1].contended = True
    frame = frame_of(rows)
    figures.latency_figures(frame, figures.backend_colors(frame["backend"]))
    (fig,) = drawn
    rings = [c for ax in fig.axes for c in ax.collections if c.get_label() == figures.FLAGGED_RINGS]
    assert len(rings) == 1 and [tuple(p) for p in rings[0].get_offsets()] == [(256.0, 2.56)]  # the contended point alone
    assert "hollow: contended or suspect, not a speed" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_the_site_says_why_a_case_has_no_winner():
    from harness.history.site import _winners

    rows = pd.DataFrame([{"case_id": "c", "backend": b, "status": "ok", "agree": True, "contended": True, "suspect": False,
                          "latency_ms_median": ms, "created_utc": "2026-12-01", "run_uuid": "u", "run_id": "r"} for b, ms in (("sdpa", 1.0), ("naive", 2.0))])
    (row,) = _winners(pd.DataFrame(), rows)
    assert row[1].startswith("no winner: rows agreed but were contended: all 2 rows that ran and agreed")


# -- strict JSON from every command that takes --json ---------------------------------------------------------------------------
def _strict(text: str):
    """Parse `text` as strict JSON: NaN and Infinity refused, as jq and JSON.parse refuse them."""
    def refuse(constant):
        raise AssertionError(f"not strict JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def _json_commands() -> set[str]:
    """Every subcommand (with its parent, 'db list') whose parser takes --json."""
    found = set()

    def walk(parser, prefix):
        for action in parser._actions:
            if hasattr(action, "choices") and isinstance(action.choices, dict):
                for name, child in action.choices.items():
                    walk(child, f"{prefix} {name}".strip())
            elif "--json" in getattr(action, "option_strings", ()):
                found.add(prefix)
    walk(build_parser(), "")
    return found


@pytest.mark.usefixtures("one_thread")
def test_every_json_output_is_strict_json(tmp_path, capsys):
    case = Case(B=1, S_q=256, S_kv=256, H=8, H_kv=8, d_k=64, d_v=64)
    # An unsupported row beside ok ones: its reason makes the column text, so the ok rows' reasons load as NaN.
    records = [synthetic_record(case, "sdpa", 1.0), synthetic_record(case, "naive", 2.0), synthetic_record(case, "flex", 0, status="unsupported")]
    run = write_run(tmp_path / "run", records, peaks=PEAKS)
    suite = tmp_path / "tiny.toml"
    suite.write_text('name = "tiny"\ndevice = "cpu"\n[[grid]]\nB = [1]\nS = [8]\nH = [2]\nH_kv = [2]\nd_k = [8]\ndtype = ["fp32"]\n')
    db = tmp_path / "db.sqlite"
    assert main(["db", "add", str(run_folder(tmp_path / "stored", "a", "2026-12-01T00:00:00+00:00")), "--db", str(db)]) == 0
    capsys.readouterr()
    commands = {
        "backends": ["backends", "--json"],
        "check": ["check", "--suite", str(suite), "--backends", "naive", "--json"],
        "compare": ["compare", str(run), str(run), "--json", "--out", str(tmp_path / "c.csv")],
        "recommend": ["recommend", str(run), "--seq", "256", "--json"],
        "db list": ["db", "list", "--db", str(db), "--json"],
        "models": ["models", "--json"],
    }
    for name, argv in commands.items():
        main(argv)
        out = capsys.readouterr().out
        document = _strict(out[: out.rindex("]") + 1] if name == "check" else out)
        assert document, name
    # On main, recommend --json printed "reason": NaN for every ok row.
    main(commands["recommend"])
    rows = _strict(capsys.readouterr().out)["cases"][0]["rows"]
    assert {r["backend"]: r["reason"] for r in rows} == {"sdpa": None, "naive": None, "flex": "synthetic failure"}
    assert set(commands) == _json_commands(), "a command that takes --json is not covered here"
